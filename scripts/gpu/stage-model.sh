#!/usr/bin/env bash
# Here: stage a real GGUF file that is too large for one `run` call (64 MiB with the
# working tree) as xz-compressed parts, one folder per call:
#   .gpu-model/0/ .gpu-model/1/ ...  each holds one part (<= PART_MIB), the file's
#                                    name, sha256 and part count.
# Carry `.gpu-model/0` in one call and `.gpu-model/1` in the next (each running
# `run-h200.sh stash`, which keeps the part in /dev/shm while the machine stays
# warm); the call that then runs `run-h200.sh build real` reassembles and checks it.
# Usage: scripts/gpu/stage-model.sh FILE.gguf [PART_MIB]   (default 48)
set -euo pipefail
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
file=$1
part_mib=${2:-48}
dst="$root/.gpu-model"
rm -rf "$dst"
mkdir -p "$dst/tmp"
xz -T0 -6 -c "$file" | split -b "${part_mib}M" -d - "$dst/tmp/part"
n=$(ls "$dst/tmp" | wc -l)
sum=$(sha256sum "$file" | cut -d' ' -f1)
i=0
for p in "$dst"/tmp/part*; do
    mkdir -p "$dst/$i"
    mv "$p" "$dst/$i/"
    printf '%s %s %s\n' "$(basename "$file")" "$sum" "$n" >"$dst/$i/MANIFEST"
    i=$((i + 1))
done
rmdir "$dst/tmp"
du -sh "$dst"/*
