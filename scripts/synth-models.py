#!/usr/bin/env python3
"""Writes the synthetic test models that the llama.cpp fixtures were recorded on.

Each greedy fixture of a synthetic model (tests/fixtures/<model>/greedy/*.json, and
the MTP-draft fixtures tests/fixtures/<model>/mtp/*.json) names
the `tempo9 synth-gguf` command that made its file and the file's sha256. This runs
those commands with the given tempo9 binary into $TEMPO9_MODELS (default
~/.cache/tempo9/models), next to the real test models, and checks every file's
sha256; a file already there with the right sum is kept. The vocabularies and
templates come from scripts/fetch-models.sh vocab ($TEMPO9_VOCAB, default
~/.cache/tempo9/vocab).

Usage: scripts/synth-models.py path/to/tempo9
"""
import glob
import hashlib
import json
import os
import subprocess
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
home = os.path.expanduser("~")
models = os.environ.get("TEMPO9_MODELS", os.path.join(home, ".cache/tempo9/models"))
vocab = os.environ.get("TEMPO9_VOCAB", os.path.join(home, ".cache/tempo9/vocab"))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    tempo9 = sys.argv[1]
    os.makedirs(models, exist_ok=True)
    wanted = {}
    fixtures = glob.glob(os.path.join(root, "tests/fixtures/*/greedy/*.json"))
    # The MTP-draft fixtures' files (scripts/fixtures/mtp_drafts.py).
    fixtures += glob.glob(os.path.join(root, "tests/fixtures/*/mtp/*.json"))
    # The Gemma 4 vision fixtures (scripts/fixtures/vision_fixtures_gemma4.py).
    fixtures += glob.glob(os.path.join(root, "tests/fixtures/*/vision/greedy/*.json"))
    for fx in sorted(fixtures):
        d = json.load(open(fx))
        if "synth" in d:
            wanted.setdefault(d["model"], d["synth"])
        # The vision fixtures' projector (scripts/fixtures/vision_fixtures*.py).
        if "mmproj_synth" in d:
            wanted.setdefault(d["mmproj_synth"]["model"], d["mmproj_synth"])
    failed = False
    for name, synth in sorted(wanted.items()):
        out = os.path.join(models, name)
        if os.path.exists(out) and sha256(out) == synth["sha256"]:
            continue
        args = [a.replace("{vocab}", vocab).replace("{out}", out + ".part") for a in synth["args"]]
        subprocess.run([tempo9] + args[1:], check=True)
        got = sha256(out + ".part")
        if got != synth["sha256"]:
            print(f"{name}: sha256 {got}, the fixtures were recorded on {synth['sha256']}", file=sys.stderr)
            failed = True
            continue
        os.replace(out + ".part", out)
    if failed:
        sys.exit(1)
    print(f"synthetic models in {models}: {', '.join(sorted(wanted))}", file=sys.stderr)


main()
