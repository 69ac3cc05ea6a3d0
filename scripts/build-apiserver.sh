#!/usr/bin/env bash
# Builds a real, CRD-only Kubernetes API server (`apiextensions-apiserver`) once per machine and
# installs Debian 12's etcd, so oka-store's Kubernetes backend is tested against the real thing
# (crates/store/tests/kube_apiserver.rs). Prints the binary's path on stdout; everything else
# goes to stderr.
#
# Why this way: no Debian release ships kube-apiserver, k3s or envtest binaries, and kind needs
# container images from a registry. Debian sid does ship the Go sources of
# k8s.io/apiextensions-apiserver (a complete API server for CustomResourceDefinitions and custom
# resources, without the core API) and a Go toolchain, so we build it in a throwaway sid chroot.
# See runtime-feasibility.md §9.
#
# What this script does (Debian 12 "bookworm"; building needs root, CI runs it from scripts/test.sh):
#   - when $CACHE_DIR holds a binary whose checksum matches its stamp: only makes sure etcd is
#     installed, prints the path and exits (well under a second);
#   - otherwise (as root, under a lock so concurrent runs build once):
#       1. debootstrap --variant=minbase sid into $CACHE_DIR/build.*, from this machine's own
#          Debian archive URI (read from its apt sources, as install-criu.sh does);
#       2. in the chroot, apt-get install --no-install-recommends golang-go
#          golang-k8s-apiextensions-apiserver-dev (about 350 packages, 2 GB of Go sources), with
#          -o Acquire::Check-Valid-Until=false because mirrors and snapshots may serve sid with an
#          expired Release file;
#       3. GO111MODULE=off GOPATH=/usr/share/gocode CGO_ENABLED=0 go build k8s.io/apiextensions-apiserver
#          (a static binary, so it runs on the bookworm host);
#       4. copies the binary to $CACHE_DIR, writes $CACHE_DIR/stamp (package versions, Go version,
#          checksum), and deletes the chroot (only the ~80 MB binary is kept).
#     About 5 minutes on 2 cores, 3 GB of disk while it runs;
#   - installs Debian 12's `etcd-server` with apt-get when `etcd` is missing.
#
# Environment:
#   FORCE=1                     rebuild even when the cached binary is good
#   OKA_APISERVER_CACHE=DIR     where the binary and its stamp live (default /var/cache/oka/apiserver)
#   APISERVER_SRC_URI=URI       Debian archive URI for the chroot (default: this machine's own)
#   APISERVER_SUITE=S           suite to build from (default: sid)
#
# On another distribution: build apiextensions-apiserver from the k8s.io/apiextensions-apiserver
# module (`go build k8s.io/apiextensions-apiserver` at a tag matching your Go toolchain), install
# etcd >= 3.4, and point the tests at them with OKA_APISERVER=/path/to/apiextensions-apiserver and
# OKA_ETCD=/path/to/etcd.
set -euo pipefail

CACHE_DIR=${OKA_APISERVER_CACHE:-/var/cache/oka/apiserver}
BIN=$CACHE_DIR/apiextensions-apiserver
STAMP=$CACHE_DIR/stamp
SUITE=${APISERVER_SUITE:-sid}
FORCE=${FORCE:-0}
PACKAGES=(golang-go golang-k8s-apiextensions-apiserver-dev)

say() { printf 'build-apiserver: %s\n' "$*" >&2; }
die() { printf 'build-apiserver: error: %s\n' "$*" >&2; exit 1; }

# Whether the cached binary is there and is the one its stamp describes.
cached() {
  [[ -x $BIN && -f $STAMP ]] || return 1
  local want have
  want=$(sed -n 's/^sha256=//p' "$STAMP")
  have=$(sha256sum "$BIN" | cut -d' ' -f1)
  [[ -n $want && $want == "$have" ]]
}

# Makes sure an etcd binary is installed (Debian 12's etcd-server, 3.4).
ensure_etcd() {
  if command -v etcd >/dev/null || [[ -x /usr/bin/etcd ]]; then
    return 0
  fi
  [[ $(id -u) == 0 ]] || die "etcd is not installed; as root: apt-get install etcd-server (or set OKA_ETCD)"
  say "installing etcd-server (Debian's etcd, for the API server's storage)"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends etcd-server >&2; then
    say "apt-get install failed; running apt-get update and retrying"
    apt-get update -q >&2 || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends etcd-server >&2 \
      || die "could not install etcd-server"
  fi
  # The package's service is not wanted: the tests start their own etcd on a free port.
  if command -v systemctl >/dev/null && systemctl is-system-running >/dev/null 2>&1; then
    systemctl disable --now etcd >&2 2>/dev/null || true
  fi
  [[ -x /usr/bin/etcd ]] || die "etcd-server installed no /usr/bin/etcd"
}

if [[ $FORCE != 1 ]] && cached; then
  ensure_etcd
  say "cached: $(sed -n 's/^versions=//p' "$STAMP")"
  printf '%s\n' "$BIN"
  exit 0
fi

# --- preconditions ----------------------------------------------------------------------------
[[ $(id -u) == 0 ]] || die "$BIN is not built yet; building needs root (debootstrap, chroot): sudo $0"
command -v debootstrap >/dev/null || {
  say "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >&2 || die "could not install debootstrap"
}
command -v flock >/dev/null || die "flock not found (util-linux)"

mkdir -p "$CACHE_DIR"
exec 9>"$CACHE_DIR/.lock"
if ! flock -n 9; then
  say "another build is running; waiting for it"
  flock 9
fi
# Another run may have built it while we waited.
if [[ $FORCE != 1 ]] && cached; then
  ensure_etcd
  printf '%s\n' "$BIN"
  exit 0
fi

# --- the machine's own Debian archive ------------------------------------------------------------
# shellcheck source=lib/debian-archive.sh
. "$(dirname "$0")/lib/debian-archive.sh"
src_uri=${APISERVER_SRC_URI:-}
src_signed=""
if [[ -z $src_uri ]]; then
  pick=$(debian_archive_uri) \
    || die "found no enabled 'deb' source in /etc/apt/sources.list or /etc/apt/sources.list.d/; set APISERVER_SRC_URI"
  IFS=$'\t' read -r src_uri src_signed <<<"$pick"
fi
say "reusing this machine's apt source URI: $src_uri${src_signed:+ (Signed-By: $src_signed)}"

# --- a throwaway chroot ---------------------------------------------------------------------------
root=$(mktemp -d "$CACHE_DIR/build.XXXXXX")
log=$CACHE_DIR/build.log
: >"$log"
mounts=()
cleanup() {
  local rc=$? i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" 2>/dev/null || true
  done
  # Never delete through a mount point that is still there.
  if findmnt -rn -o TARGET | grep -q "^$root/"; then
    say "warning: something is still mounted under $root; not deleting it"
  else
    rm -rf --one-file-system "$root"
  fi
  if ((rc != 0)); then
    tail -n 40 "$log" >&2 || true
    say "failed (exit $rc); the last lines of $log are above; the chroot was removed"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Runs a command in the chroot with a clean environment, its output to the log.
in_root() {
  chroot "$root" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin HOME=/root \
    LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@" >>"$log" 2>&1
}

total_start=$(date +%s)
step_start=$total_start
lap() { local now; now=$(date +%s); say "$1 ($((now - step_start)) s)"; step_start=$now; }

say "debootstrap --variant=minbase $SUITE into $root (log: $log)"
debootstrap --variant=minbase ${src_signed:+--keyring="$src_signed"} "$SUITE" "$root" "$src_uri" >>"$log" 2>&1 \
  || die "debootstrap $SUITE from $src_uri failed"
lap "chroot ready"

mount -t proc proc "$root/proc" || die "cannot mount /proc in the chroot"
mounts+=("$root/proc")
if [[ ! -c $root/dev/null ]]; then
  mount --bind /dev "$root/dev" || die "cannot bind /dev into the chroot"
  mounts+=("$root/dev")
fi
[[ -s $root/etc/resolv.conf ]] || cp /etc/resolv.conf "$root/etc/resolv.conf"

apt_opts=(-o Acquire::Check-Valid-Until=false -o APT::Install-Recommends=false -q)
say "apt-get install ${PACKAGES[*]} in the chroot"
in_root apt-get "${apt_opts[@]}" update || die "apt-get update in the $SUITE chroot failed"
in_root apt-get "${apt_opts[@]}" install -y "${PACKAGES[@]}" \
  || die "apt-get install ${PACKAGES[*]} in the $SUITE chroot failed"
# The downloaded .debs are not needed any more: free their space before the build.
in_root apt-get clean || true
lap "packages installed"

versions=$(chroot "$root" dpkg-query -W -f='${Package} ${Version}; ' "${PACKAGES[@]}")
go_version=$(chroot "$root" /usr/bin/env -i PATH=/usr/bin:/bin go version 2>/dev/null || echo "go unknown")
say "building k8s.io/apiextensions-apiserver ($versions$go_version)"
in_root /usr/bin/env GO111MODULE=off GOPATH=/usr/share/gocode CGO_ENABLED=0 GOFLAGS=-trimpath \
  nice go build -ldflags='-s -w' -o /apiextensions-apiserver k8s.io/apiextensions-apiserver \
  || die "go build k8s.io/apiextensions-apiserver failed"
lap "built"

# --- keep the binary, drop the chroot --------------------------------------------------------------
install -m 0755 "$root/apiextensions-apiserver" "$BIN.new"
"$BIN.new" --help >/dev/null 2>&1 || die "the built binary does not run on this machine"
mv -f "$BIN.new" "$BIN"
{
  echo "suite=$SUITE"
  echo "versions=$versions$go_version"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "sha256=$(sha256sum "$BIN" | cut -d' ' -f1)"
} >"$STAMP"
say "installed $BIN ($(du -h "$BIN" | cut -f1)) in $(($(date +%s) - total_start)) s"

ensure_etcd
printf '%s\n' "$BIN"
