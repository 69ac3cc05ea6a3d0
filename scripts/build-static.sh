#!/usr/bin/env bash
# Builds oka's binaries as static executables (glibc's static library,
# `-C target-feature=+crt-static`): oka-init and oka-envd, which run inside sandboxes, and with
# --with-oka the `oka` binary itself, for the `FROM scratch` images of deploy/images.
#
# A sandbox whose root has no C library compatible with the host's (an Alpine or `scratch`-style
# root given as an absolute `image` path) needs static oka-init and oka-envd: dynamically linked
# builds run with the root's own loader and libc. A static `oka` runs in an image that holds
# nothing else: glibc 2.34 and newer resolve host names from /etc/hosts and DNS without loading
# NSS modules, and kube-rs and rustls need no system library (TLS roots come from the API
# server's CA, or /etc/ssl/certs, which the image carries).
#
#   scripts/build-static.sh              release build; prints OKA_INIT and OKA_ENVD to export
#   scripts/build-static.sh --debug      debug build (the test suite's)
#   scripts/build-static.sh --with-oka   also `oka`; prints OKA_BIN too
#
# `oka serve` picks oka-init and oka-envd up from those two environment variables. Cargo cannot
# build a static executable beside proc-macros without `--target`, so they go to
# target/<host triple>/<profile>.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
args=(--release)
packages=(-p oka-runtime --bin oka-init -p oka-envd --bin oka-envd)
with_oka=false
for arg in "$@"; do
  case "$arg" in
    --debug) profile=debug; args=() ;;
    --with-oka) with_oka=true; packages+=(-p oka --bin oka) ;;
    *) echo "usage: $0 [--debug] [--with-oka]" >&2; exit 2 ;;
  esac
done
triple=$(rustc -vV | sed -n 's/^host: //p')
RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build "${args[@]}" --locked --target "$triple" "${packages[@]}" >&2
dir="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)/$triple/$profile"
echo "OKA_INIT=$dir/oka-init"
echo "OKA_ENVD=$dir/oka-envd"
if $with_oka; then
  echo "OKA_BIN=$dir/oka"
fi
