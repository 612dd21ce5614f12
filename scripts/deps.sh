#!/usr/bin/env bash
# Installs what building and testing Tempo9 needs on a fresh Debian/Ubuntu
# machine: cmake and libclang (ggml's build and bindgen), and Chromium (the
# status page's browser test, tests/e2e/test_status_page.py). Idempotent; quiet
# when done.
set -euo pipefail
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v clang >/dev/null || need+=(clang)
ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || need+=(libclang-dev)
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || need+=(chromium)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  echo "installing: ${need[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
