#!/usr/bin/env bash
# Installs CRIU >= 4.2, which oka's local runtime uses to hibernate (checkpoint) and restore sandboxes.
#
# Why: on kernels >= 6.16, CRIU older than 4.2 cannot checkpoint any process holding an INET socket
# (`sockets: Can't get 1:16 opt: Operation not supported`), and Debian 12's criu 3.17 does not even pass
# `criu check` on a 6.18 kernel (vDSO layout). See runtime-feasibility.md §4.
#
# What this script does (Debian 12 "bookworm", run as root; CI runs it from scripts/test.sh):
#   - nothing at all when `criu --version` already reports 4.2 or newer;
#   - otherwise: reads this machine's own apt sources (deb822 `*.sources` or one-line `sources.list`
#     format) to reuse the same archive URI, writes a temporary `deb-src` entry for `sid` into a private
#     apt configuration (a temporary directory; the machine's /etc/apt and /var/lib/apt/lists are not
#     touched, so nothing needs cleaning afterwards), downloads CRIU's upstream source tarball from
#     Debian's own source package, installs the bookworm `-dev` build dependencies, builds the `criu`
#     binary and installs it to $PREFIX/sbin (default /usr/local/sbin), then runs `criu check`.
#   Build takes about 30 s on 2 cores, plus the build dependencies.
#
# Environment:
#   FORCE=1           build even if a new enough criu is already installed
#   PREFIX=DIR        install to DIR/sbin/criu (default /usr/local)
#   CRIU_SRC_URI=URI  Debian archive URI to fetch the source package from (default: this machine's own)
#   CRIU_SRC_SUITE=S  suite to take the source package from (default: sid)
#   JOBS=N            parallel make jobs (default 2)
#
# On another distribution, you need:
#   - CRIU 4.2 or newer, built with nftables support (libnftables), so that
#     `criu check --feature network_lock_nftables` succeeds; use your distribution's package if it is new
#     enough (e.g. Debian 13+/sid, Fedora, Arch), otherwise build it from https://criu.org's release tarball
#     with `make criu` and put the binary on root's PATH (or point OKA_CRIU at it);
#   - a kernel with CONFIG_CHECKPOINT_RESTORE=y (and the usual namespace options); `criu check` must say
#     "Looks good.";
#   - root (CRIU needs CAP_SYS_ADMIN and friends to dump and restore namespaced sandboxes).
set -euo pipefail

MIN_MAJOR=4
MIN_MINOR=2
PREFIX=${PREFIX:-/usr/local}
FORCE=${FORCE:-0}
JOBS=${JOBS:-2}
CRIU_SRC_SUITE=${CRIU_SRC_SUITE:-sid}
BUILD_DEPS=(
  gcc libc6-dev make pkg-config xz-utils
  libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler python3-protobuf
  libnl-3-dev libnet1-dev libcap-dev libbsd-dev libgnutls28-dev libnftables-dev libaio-dev uuid-dev
  libdrm-dev
)

say() { printf 'install-criu: %s\n' "$*" >&2; }
die() { printf 'install-criu: error: %s\n' "$*" >&2; exit 1; }

# Prints "MAJOR MINOR" of the criu binary $1, or nothing if it does not run.
criu_version_of() {
  local out
  out=$("$1" --version 2>/dev/null) || return 0
  sed -n 's/^Version: *\([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1 \2/p' <<<"$out" | head -n1
}

new_enough() { # MAJOR MINOR
  [[ -n ${1:-} ]] && { (($1 > MIN_MAJOR)) || { (($1 == MIN_MAJOR)) && (($2 >= MIN_MINOR)); }; }
}

# --- already there? -------------------------------------------------------------------------
if [[ $FORCE != 1 ]]; then
  seen=""
  for c in "$(command -v criu || true)" "$PREFIX/sbin/criu"; do
    [[ -n $c && -x $c && $c != "$seen" ]] || continue
    seen=$c
    read -r major minor _ <<<"$(criu_version_of "$c")" || true
    if new_enough "${major:-}" "${minor:-}"; then
      say "$c is version $major.$minor (>= $MIN_MAJOR.$MIN_MINOR); nothing to do"
      [[ $(command -v criu || true) == "$c" ]] || say "note: $c is not the first criu on PATH"
      exit 0
    fi
    say "$c is version ${major:-unknown}.${minor:-} (< $MIN_MAJOR.$MIN_MINOR); building a newer one"
  done
fi

# --- preconditions ----------------------------------------------------------------------------
[[ $(id -u) == 0 ]] || die "must run as root (installs packages and $PREFIX/sbin/criu)"
command -v apt-get >/dev/null || die "apt-get not found: this script only knows Debian; see the comments at its top for what another distribution needs"
# shellcheck disable=SC1091
. /etc/os-release
[[ ${ID:-} == debian ]] || [[ -n ${CRIU_SRC_URI:-} ]] \
  || die "this is ${PRETTY_NAME:-not Debian}; set CRIU_SRC_URI to a Debian archive URI, or install CRIU >= $MIN_MAJOR.$MIN_MINOR yourself (see the comments at the top of this script)"

# --- find the machine's own Debian archive URI ---------------------------------------------------
# shellcheck source=lib/debian-archive.sh
. "$(dirname "$0")/lib/debian-archive.sh"
src_uri=${CRIU_SRC_URI:-}
src_signed=""
if [[ -z $src_uri ]]; then
  pick=$(debian_archive_uri) \
    || die "found no enabled 'deb' source in /etc/apt/sources.list or /etc/apt/sources.list.d/; set CRIU_SRC_URI"
  IFS=$'\t' read -r src_uri src_signed <<<"$pick"
  say "reusing this machine's apt source URI: $src_uri${src_signed:+ (Signed-By: $src_signed)}"
fi

# --- build dependencies (bookworm's own -dev packages) -----------------------------------------
missing=()
for p in "${BUILD_DEPS[@]}"; do
  dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if ((${#missing[@]})); then
  say "installing build dependencies: ${missing[*]}"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; then
    say "apt-get install failed; running apt-get update and retrying"
    apt-get update -q >&2 || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
      || die "could not install the build dependencies: ${missing[*]}"
  fi
else
  say "build dependencies already installed"
fi

# --- temporary deb-src entry in a private apt configuration --------------------------------------
work=$(mktemp -d /tmp/install-criu.XXXXXX)
cleanup() {
  local rc=$?
  rm -rf "$work"
  ((rc == 0)) || say "failed (exit $rc); temporary files removed"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$work/etc/sources.list.d" "$work/lists/partial" "$work/cache/archives/partial" "$work/src"
# apt downloads as the unprivileged `_apt` user when it exists: let it write where we download to.
if id _apt >/dev/null 2>&1; then
  chmod 0755 "$work"
  chown _apt "$work/lists/partial" "$work/cache/archives/partial" "$work/src"
fi
{
  echo "Types: deb-src"
  echo "URIs: $src_uri"
  echo "Suites: $CRIU_SRC_SUITE"
  echo "Components: main"
  [[ -z $src_signed ]] || echo "Signed-By: $src_signed"
} >"$work/etc/sources.list.d/criu-src.sources"
say "temporary apt entry ($work/etc/sources.list.d/criu-src.sources):"
sed 's/^/    /' "$work/etc/sources.list.d/criu-src.sources" >&2

apt_private=(
  -o "Dir::Etc::SourceList=/dev/null"
  -o "Dir::Etc::SourceParts=$work/etc/sources.list.d"
  -o "Dir::State::Lists=$work/lists"
  -o "Dir::Cache=$work/cache"
  -o "Dir::Cache::pkgcache="
  -o "Dir::Cache::srcpkgcache="
  -o "APT::Get::List-Cleanup=false"
)
say "apt-get update (private lists: only the $CRIU_SRC_SUITE source index)"
apt-get "${apt_private[@]}" update -q >&2 || die "apt-get update of the temporary $CRIU_SRC_SUITE deb-src entry failed"

say "apt-get source --download-only criu (only the upstream .orig tarball is needed)"
# The command may exit non-zero when the .debian.tar.* is missing on the mirror; judge by the tarball.
(cd "$work/src" && apt-get "${apt_private[@]}" source --download-only -q criu >&2) \
  || say "apt-get source exited non-zero; checking for the orig tarball anyway"
shopt -s nullglob
tarballs=("$work"/src/criu_*.orig.tar.*)
shopt -u nullglob
((${#tarballs[@]})) || die "apt-get source did not fetch criu's orig tarball from $src_uri ($CRIU_SRC_SUITE)"
tarball=${tarballs[0]}
version=$(basename "$tarball" | sed -n 's/^criu_\([0-9][0-9.]*\)\.orig\.tar\..*/\1/p')
read -r major minor _ <<<"$(tr '.' ' ' <<<"$version")" || true
new_enough "${major:-}" "${minor:-}" \
  || die "$CRIU_SRC_SUITE has criu ${version:-unknown}, older than $MIN_MAJOR.$MIN_MINOR"
say "got $(basename "$tarball") (criu $version)"

# --- build --------------------------------------------------------------------------------------
tar -xf "$tarball" -C "$work/src"
srcdir=$(find "$work/src" -mindepth 1 -maxdepth 1 -type d -name 'criu-*' | head -n1)
[[ -n $srcdir ]] || die "unexpected layout of $tarball"
say "building criu $version in $srcdir (make -j$JOBS criu)"
start=$(date +%s)
nice make -C "$srcdir" -j"$JOBS" criu >"$work/build.log" 2>&1 || {
  tail -n 40 "$work/build.log" >&2
  die "make criu failed (last lines above)"
}
say "built in $(($(date +%s) - start)) s"
[[ -x $srcdir/criu/criu ]] || die "build produced no criu/criu binary"

install -d "$PREFIX/sbin"
install -m 0755 "$srcdir/criu/criu" "$PREFIX/sbin/criu"
say "installed $PREFIX/sbin/criu: $("$PREFIX/sbin/criu" --version | head -n1)"

# --- verify -------------------------------------------------------------------------------------
if ! out=$("$PREFIX/sbin/criu" check 2>&1); then
  printf '%s\n' "$out" >&2
  die "criu check failed: this kernel lacks something CRIU needs"
fi
say "criu check: $(tail -n1 <<<"$out")"
if "$PREFIX/sbin/criu" check --feature network_lock_nftables >/dev/null 2>&1; then
  say "criu check --feature network_lock_nftables: supported"
else
  say "warning: network_lock_nftables not supported; the runtime falls back to --network-lock skip"
fi
found=$(command -v criu || true)
[[ $found == "$PREFIX/sbin/criu" ]] \
  || say "note: first criu on PATH is ${found:-none}, not $PREFIX/sbin/criu; set OKA_CRIU=$PREFIX/sbin/criu or fix PATH"
say "done"
