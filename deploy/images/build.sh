#!/usr/bin/env bash
# Builds oka's container images from the static binaries of scripts/build-static.sh:
#   oka        oka controller, manager and gateway (FROM scratch)
#   oka-envd   the agent runtime the Pod runtime adds to sandbox Pods (FROM scratch)
#   oka-node   the node agent and its sandboxes' userland (FROM debian:bookworm-slim)
#
#   deploy/images/build.sh [--debug] [--tag TAG] [--prefix REGISTRY/] [IMAGE...]
#
# With buildah when installed (no daemon, no registry needed for the scratch images), else
# podman or docker. Prints each image reference built.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"

profile=()
tag=$(sed -n 's/^appVersion: "\(.*\)"/\1/p' deploy/helm/oka/Chart.yaml)
prefix=""
images=()
while [ $# -gt 0 ]; do
  case "$1" in
    --debug) profile=(--debug) ;;
    --tag) tag=$2; shift ;;
    --prefix) prefix=$2; shift ;;
    *) images+=("$1") ;;
  esac
  shift
done
[ ${#images[@]} -gt 0 ] || images=(oka oka-envd oka-node)

static_env=$(scripts/build-static.sh "${profile[@]}" --with-oka)
dir=$(dirname "$(printf '%s\n' "$static_env" | sed -n 's/^OKA_INIT=//p')")
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp "$dir/oka" "$dir/oka-init" "$dir/oka-envd" "$context/"
cp /etc/ssl/certs/ca-certificates.crt "$context/"

if command -v buildah >/dev/null; then
  build() { buildah bud --quiet --isolation chroot -f "$1" -t "$2" "$context" >&2; }
elif command -v podman >/dev/null; then
  build() { podman build --quiet -f "$1" -t "$2" "$context" >&2; }
else
  build() { docker build --quiet -f "$1" -t "$2" "$context" >&2; }
fi
for image in "${images[@]}"; do
  file=deploy/images/Containerfile.${image#oka-}
  [ "$image" = oka ] && file=deploy/images/Containerfile.oka
  build "$file" "$prefix$image:$tag"
  echo "$prefix$image:$tag"
done
