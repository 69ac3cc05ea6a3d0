#!/usr/bin/env bash
# Installs schemathesis (property-based testing of an API from its OpenAPI description) into
# .venv/schemathesis, for crates/oka/tests/conformance.rs. Pinned, so a run generates the same
# requests from the same seed. Idempotent: an environment that holds the pinned version is left
# alone.
#
# Environment:
#   VENV_ROOT=DIR   where the environment goes (default: <repo>/.venv)
#   PYTHON=EXE      the interpreter to build it from (default: python3; schemathesis needs >= 3.10)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV_ROOT=${VENV_ROOT:-$repo/.venv}
PYTHON=${PYTHON:-python3}
VERSION=4.32.5
dir=$VENV_ROOT/schemathesis

say() { printf 'setup-schemathesis: %s\n' "$*" >&2; }

have=$("$dir/bin/python" -c 'import importlib.metadata as m; print(m.version("schemathesis"))' 2>/dev/null || true)
if [[ $have == "$VERSION" ]]; then
  say "schemathesis $have already installed"
  exit 0
fi
say "installing schemathesis==$VERSION into $dir"
rm -rf "$dir"
mkdir -p "$VENV_ROOT"
"$PYTHON" -m venv "$dir"
"$dir/bin/python" -m pip install -q --disable-pip-version-check "schemathesis==$VERSION"
say "schemathesis $("$dir/bin/schemathesis" --version) ready"
