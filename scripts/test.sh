#!/usr/bin/env bash
# The whole test suite, on a fresh machine: installs what the tests need, then checks
# formatting, lints and runs every test. CI (.ci/run) calls exactly this.
#
#   scripts/test.sh            everything
#   scripts/test.sh -p oka-store   extra arguments go to `cargo nextest run`
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*" >&2; }

# --- what the tests need ---------------------------------------------------------------
# The Rust toolchain (cargo, rustfmt, clippy) is the machine's own; Python 3 with venv for the
# E2B SDKs that the agent runtime's tests drive, and Node.js >= 20.18.1 with npm for the JavaScript
# SDK (setup-e2b-sdk.sh installs them with apt when missing, as root). CRIU >= 4.2 (for
# hibernation) is built from Debian's source package when missing or too old; the script does
# nothing when a good one is installed. A real Kubernetes API server (apiextensions-apiserver, for
# oka-store's Kubernetes backend) is built once per machine from Debian sid's Go sources and
# cached under /var/cache/oka/apiserver, with Debian's etcd beside it. Runtime tests need root, as
# CI runs them.
command -v cargo >/dev/null || { echo "error: cargo not found; install Rust (rust-version in Cargo.toml)" >&2; exit 1; }
if [ "$(id -u)" -eq 0 ]; then
  step "CRIU >= 4.2"
  scripts/install-criu.sh
  step "apiextensions-apiserver and etcd (oka-store against a real API server; ~5 min once, then cached)"
  OKA_APISERVER=$(scripts/build-apiserver.sh)
  export OKA_APISERVER
  if ! command -v debootstrap >/dev/null; then
    step "installing debootstrap (the default templates' roots: oka templates build, oka serve's first start)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap
  fi
  if ! command -v nft >/dev/null || ! command -v ip >/dev/null; then
    step "installing nftables and iproute2 (outbound sandbox networking)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables iproute2
  fi
  if ! command -v kubectl >/dev/null; then
    step "installing kubectl (Debian's kubernetes-client: the real client of oka serve's Kubernetes API)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q kubernetes-client
  fi
  if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
    step "installing prometheus (promtool and a real server for oka serve's /metrics test)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus
    # The package starts its own server on :9090; the tests start their own.
    systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
  if ! command -v buildah >/dev/null; then
    step "installing buildah (builds the FROM scratch images of deploy/images, no daemon or registry)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q buildah
  fi
  if ! command -v redis-server >/dev/null; then
    step "installing redis-server (the API-key quota's shared backend, started by its tests)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends redis-server
  fi
  if ! command -v docker-registry >/dev/null || ! command -v htpasswd >/dev/null; then
    step "installing docker-registry and apache2-utils (oka-image's tests: a real registry on loopback, htpasswd -B)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends docker-registry apache2-utils
    # The package starts its own registry on :5000; the tests start their own.
    systemctl disable --now docker-registry >/dev/null 2>&1 \
      || /etc/init.d/docker-registry stop >/dev/null 2>&1 || true
  fi
  if ! /usr/bin/python3 -c 'import ipykernel' 2>/dev/null; then
    step "installing python3-ipykernel (a real Jupyter kernel for oka-interpreter's tests)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-ipykernel
  fi
else
  echo "warning: not root: skipping the CRIU install; sandbox runtime tests will be skipped" >&2
fi
step "E2B SDKs in .venv/ (Python: newest and newest 2.8.x; JavaScript: newest)"
bash scripts/setup-e2b-sdk.sh
if [ "$(id -u)" -eq 0 ]; then
  # After the SDKs: Deno comes from the npm registry, with the npm installed above.
  step "Jupyter kernels of the code-interpreter template (python with matplotlib, pandas and e2b-charts; JavaScript and TypeScript on Deno; bash; R; Java)"
  scripts/install-kernels.sh
fi
step "schemathesis in .venv/ (the API conformance test, crates/oka/tests/conformance.rs)"
bash scripts/setup-schemathesis.sh
step "helm and the Kubernetes schemas in .venv/kube-tools (the deployment and Pod runtime tests)"
bash scripts/setup-kube-tools.sh
if ! cargo nextest --version >/dev/null 2>&1; then
  step "installing cargo-nextest"
  cargo install --locked cargo-nextest
fi

# --- checks ---
# (clippy --all-targets also type-checks the benchmarks, so they cannot rot unnoticed.)
step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
# With the fuzz targets' entry points (the `fuzzing` features), which only fuzz/ turns on.
cargo clippy --workspace --all-targets --locked \
  --features oka-gateway/fuzzing,oka-envd/fuzzing,oka-manager/fuzzing -- -D warnings

step "static oka-init, oka-envd and oka (a sandbox root without a C library; the FROM scratch images)"
static_env=$(scripts/build-static.sh --debug --with-oka)
OKA_TEST_STATIC_DIR=$(dirname "$(printf '%s\n' "$static_env" | sed -n 's/^OKA_INIT=//p')")
export OKA_TEST_STATIC_DIR

if [ "$(id -u)" -eq 0 ]; then
  # The roots oka serve's default pools run on (Debian with sudo, Python, Node.js, git, build
  # tools; code-interpreter-v1 adds the Jupyter kernels), named by their definition's hash: built
  # once per definition (~5 min each), then a second run finds them and costs a second. The tests
  # point oka serve's templates.dir here (crates/oka/tests/support).
  step "the default templates' roots in /var/cache/oka/templates (built once per definition, then cached)"
  "$(printf '%s\n' "$static_env" | sed -n 's/^OKA_BIN=//p')" templates build --dir /var/cache/oka/templates
fi

step "tests"
cargo nextest run --workspace --locked --no-fail-fast "$@"

step "doc tests"
cargo test --workspace --locked --doc

# The parsers, coverage-guided, 10 s per target (docs/testing.md); OKA_FUZZ_TEST=0 skips it.
if [ "${OKA_FUZZ_TEST:-1}" != 0 ]; then
  step "fuzzing the parsers (scripts/fuzz.sh)"
  scripts/fuzz.sh
fi

echo "all tests passed" >&2
