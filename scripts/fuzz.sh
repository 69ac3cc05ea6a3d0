#!/usr/bin/env bash
# Coverage-guided fuzzing of oka's parsers (fuzz/, docs/testing.md): libFuzzer through cargo-fuzz,
# on the stable toolchain (no sanitizer: `-s none`; the instrumentation is `-C passes=sancov-module`).
# Builds every target, lints the harnesses and the crates' `fuzzing` entry points, then runs each
# target from its committed seeds (fuzz/corpus/<target>) and the corpus it grew on earlier runs.
# Any crash, hang (a 10 s input) or runaway memory fails the run, printing the input.
#
#   scripts/fuzz.sh                  every target, 10 s each (what scripts/test.sh runs)
#   scripts/fuzz.sh --long           every target, 10 min each
#   scripts/fuzz.sh 120 kube_patch   one target, 120 s
#
# Built under /var/cache/oka/fuzz-target (OKA_FUZZ_CACHE): a clean clone only rebuilds the oka
# crates it changed. Targets run two at a time (OKA_FUZZ_JOBS, default: the number of CPUs).
# fuzz/Cargo.lock is checked by clippy's --locked (cargo fuzz build passes no --locked).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*" >&2; }

seconds=10
if [ "${1:-}" = "--long" ]; then
  seconds=600
  shift
elif [[ "${1:-}" =~ ^[0-9]+$ ]]; then
  seconds=$1
  shift
fi
cache=${OKA_FUZZ_CACHE:-/var/cache/oka/fuzz-target}
jobs=${OKA_FUZZ_JOBS:-$(nproc)}
mkdir -p "$cache"

# --- the tools ---------------------------------------------------------------------------
# cargo-fuzz builds libFuzzer (C++, bundled in libfuzzer-sys) with the machine's C++ compiler.
if ! command -v c++ >/dev/null; then
  step "installing g++ (libFuzzer is C++)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends g++
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  step "installing cargo-fuzz"
  cargo install --locked cargo-fuzz --version 0.13.2
fi

# --- a clean clone's sources keep their build -----------------------------------------------
# Cargo rebuilds a local crate whose files are newer than its last build, and a fresh clone's
# files are all new. A file newer than the last successful build whose content (git's blob hash)
# is what that build compiled gets an old time back, so only what changed is rebuilt. The record
# is removed while building: after a failed build, everything local is rebuilt.
manifest=$cache/sources.manifest
sources=(crates fuzz Cargo.toml)
# "<blob hash of the file as it is> <path>" of every tracked source file.
source_hashes() {
  git ls-files -- "${sources[@]}" | while IFS= read -r path; do
    if [ -f "$path" ]; then printf '%s\n' "$path"; fi
  done > "$cache/sources.list"
  paste -d ' ' <(git hash-object --stdin-paths < "$cache/sources.list") "$cache/sources.list"
}
in_git=$(git rev-parse --git-dir >/dev/null 2>&1 && echo yes || echo no)
if [ "$in_git" = yes ] && [ -f "$manifest" ]; then
  source_hashes \
    | awk 'NR == FNR { built[$0] = 1; next } ($0 in built) { sub(/^[^ ]* /, ""); print }' \
      "$manifest" - \
    | while IFS= read -r path; do
        if [ "$path" -nt "$manifest" ]; then printf '%s\0' "$path"; fi
      done \
    | xargs -0 -r touch -m -d '2000-01-01 00:00:00 UTC'
fi
rm -f "$manifest"

# --- lints -----------------------------------------------------------------------------------
step "cargo fmt --check (fuzz/)"
cargo fmt --manifest-path fuzz/Cargo.toml -- --check

# The crates' `fuzzing` modules are linted by scripts/test.sh's workspace clippy.
step "cargo clippy (fuzz/) -- -D warnings"
CARGO_TARGET_DIR=$cache/clippy cargo clippy --manifest-path fuzz/Cargo.toml --locked --bins \
  -- -D warnings

# --- build -----------------------------------------------------------------------------------
step "cargo fuzz build (release, debug assertions, sancov on stable)"
(cd fuzz && cargo fuzz build -O --debug-assertions -s none --codegen-units 16 \
  --target-dir "$cache")
if [ "$in_git" = yes ]; then
  source_hashes > "$manifest.new"
  mv "$manifest.new" "$manifest"
fi
bin_dir=$cache/$(rustc -vV | sed -n 's/^host: //p')/release

# --- run ---------------------------------------------------------------------------------------
mapfile -t targets < <(if [ $# -gt 0 ]; then printf '%s\n' "$@"; else cargo fuzz list --fuzz-dir fuzz; fi)
run_dir=$(mktemp -d)
trap 'rm -rf "$run_dir"' EXIT
step "fuzzing ${#targets[@]} targets, ${seconds} s each, ${jobs} at a time"

run_one() {
  local target=$1 grown=$cache/corpus/$target
  mkdir -p "$grown" "$run_dir/$target"
  # -timeout: an input that takes 10 s is a hang; -rss_limit_mb/-malloc_limit_mb: memory bounds.
  "$bin_dir/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=1024 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$run_dir/$target/" "$grown" "fuzz/corpus/$target" \
    >"$run_dir/$target.log" 2>&1
}

failed=()
report() {
  local target=$1 status=$2
  local stats
  stats=$(grep -E '^stat::number_of_executed_units' "$run_dir/$target.log" | awk '{print $2}')
  if [ "$status" -eq 0 ]; then
    printf '  %-24s ok (%s runs)\n' "$target" "${stats:-?}" >&2
    return
  fi
  failed+=("$target")
  printf '\n  %-24s FAILED (exit %s)\n' "$target" "$status" >&2
  tail -n 40 "$run_dir/$target.log" >&2
  for input in "$run_dir/$target"/*; do
    [ -f "$input" ] || continue
    printf -- '--- input %s (%s bytes), base64:\n' "$(basename "$input")" "$(stat -c %s "$input")" >&2
    base64 -w 100 "$input" >&2
    printf -- '--- as text:\n' >&2
    head -c 2000 "$input" | od -An -c | head -n 40 >&2
    mkdir -p "$cache/crashes/$target"
    cp "$input" "$cache/crashes/$target/"
    printf -- '--- kept as %s\n' "$cache/crashes/$target/$(basename "$input")" >&2
  done
}

declare -A pids=()
for target in "${targets[@]}"; do
  while [ "${#pids[@]}" -ge "$jobs" ]; do
    if wait -n -p done_pid "${pids[@]}"; then status=0; else status=$?; fi
    for t in "${!pids[@]}"; do
      if [ "${pids[$t]}" = "$done_pid" ]; then
        unset 'pids[$t]'
        report "$t" "$status"
      fi
    done
  done
  run_one "$target" &
  pids[$target]=$!
done
for t in "${!pids[@]}"; do
  wait "${pids[$t]}" && status=0 || status=$?
  report "$t" "$status"
done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzzing failed: ${failed[*]} (reproduce: $bin_dir/<target> <input>)" >&2
  exit 1
fi
echo "fuzzing: no crash in ${#targets[@]} targets" >&2
