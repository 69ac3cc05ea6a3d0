#!/usr/bin/env bash
# Builds the two binaries that run inside sandboxes, oka-init and oka-envd, as static
# executables (glibc's static library, `-C target-feature=+crt-static`). A sandbox whose root has
# no C library compatible with the host's (an Alpine or `scratch`-style root given as an absolute
# `image` path) needs them: dynamically linked builds run with the root's own loader and libc.
#
#   scripts/build-static.sh           release build; prints the OKA_INIT and OKA_ENVD to export
#   scripts/build-static.sh --debug   debug build (the test suite's)
#
# `oka serve` picks them up from those two environment variables. Cargo cannot build a static
# executable beside proc-macros without `--target`, so they go to target/<host triple>/<profile>.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
args=(--release)
if [ "${1:-}" = "--debug" ]; then
  profile=debug
  args=()
fi
triple=$(rustc -vV | sed -n 's/^host: //p')
RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build "${args[@]}" --locked --target "$triple" \
  -p oka-runtime --bin oka-init -p oka-envd --bin oka-envd >&2
dir="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/$triple/$profile"
echo "OKA_INIT=$dir/oka-init"
echo "OKA_ENVD=$dir/oka-envd"
