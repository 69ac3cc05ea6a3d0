#!/usr/bin/env bash
# Installs the official `e2b` Python SDK into two virtual environments, for the envd compatibility tests
# (crates/envd/tests/sdk_python.rs):
#
#   .venv/e2b-latest   the newest `e2b` release on the Python package index
#   .venv/e2b-2.8      the newest 2.8.x release (the older SDK line, vendored Connect client on httpx)
#
# Idempotent: a venv that already holds the right version is left alone. For `e2b-latest` the "right
# version" is the newest release the index reports; when the index cannot be reached, an existing venv is
# kept (with a warning) so that offline re-runs still work.
#
# Environment:
#   VENV_ROOT=DIR   where the venvs go (default: <repo>/.venv)
#   PYTHON=EXE      the Python interpreter to build the venvs from (default: python3; needs >= 3.9 and venv)
#   FORCE=1         recreate both venvs
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV_ROOT=${VENV_ROOT:-$repo/.venv}
PYTHON=${PYTHON:-python3}
FORCE=${FORCE:-0}

say() { printf 'setup-e2b-sdk: %s\n' "$*" >&2; }
die() { printf 'setup-e2b-sdk: error: %s\n' "$*" >&2; exit 1; }

command -v "$PYTHON" >/dev/null || die "$PYTHON not found; install python3 and python3-venv"
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || die "$PYTHON lacks venv/ensurepip; install python3-venv"

installed_version() { # venv -> version of e2b installed there, or nothing
  [[ -x $1/bin/python ]] || return 0
  "$1/bin/python" -c 'import importlib.metadata as m; print(m.version("e2b"))' 2>/dev/null || true
}

newest_version() { # spec -> newest version matching it on the index, or nothing when unreachable
  local py=$1 spec=$2
  "$py" -m pip download --no-deps --no-binary :none: -q -d "$tmp/dl" "e2b$spec" >/dev/null 2>&1 || return 0
  ls "$tmp/dl" | sed -n 's/^e2b-\([0-9][^-]*\)-.*\.whl$/\1/p; s/^e2b-\([0-9][^-]*\)\.tar\.gz$/\1/p' | sort -V | tail -n1
  rm -rf "$tmp/dl"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ensure() { # name spec
  local name=$1 spec=$2 dir=$VENV_ROOT/$1
  if [[ $FORCE == 1 ]]; then rm -rf "$dir"; fi
  local have; have=$(installed_version "$dir")
  local want; want=$(newest_version "$PYTHON" "$spec")
  if [[ -n $have && ( -z $want || $have == "$want" ) ]]; then
    [[ -z $want ]] && say "$name: index unreachable, keeping installed e2b $have"
    say "$name: e2b $have already installed"
    return 0
  fi
  [[ -n $want ]] || die "$name: cannot reach the package index to find e2b$spec"
  say "$name: installing e2b==$want into $dir"
  rm -rf "$dir"
  "$PYTHON" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --disable-pip-version-check "e2b==$want"
  have=$(installed_version "$dir")
  [[ $have == "$want" ]] || die "$name: expected e2b $want, found '${have}'"
  say "$name: e2b $have ready"
}

mkdir -p "$VENV_ROOT"
ensure e2b-latest ""
ensure e2b-2.8 ">=2.8,<2.9"
