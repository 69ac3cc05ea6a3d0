#!/usr/bin/env bash
# Coverage-guided fuzzing of oka's parsers (fuzz/, docs/testing.md): libFuzzer through cargo-fuzz,
# on the stable toolchain (no sanitizer: `-s none`; the instrumentation is `-C passes=sancov-module`).
# Builds every target and lints the harnesses (the crates' `fuzzing` entry points are linted by
# scripts/test.sh's workspace clippy), then runs each target from its committed seeds (fuzz/corpus/<target>) and the corpus it grew on earlier runs.
# Any crash, hang (a 10 s input) or runaway memory fails the run, printing the input.
#
#   scripts/fuzz.sh                  every target, 10 s each (what scripts/test.sh runs)
#   scripts/fuzz.sh --long           every target, 10 min each
#   scripts/fuzz.sh 120 kube_patch   one target, 120 s
#
# Built under /var/cache/oka/fuzz-target (OKA_FUZZ_CACHE), from a copy of the sources there: a
# clean clone only rebuilds the oka crates it changed. Targets run as many at a time as there
# are CPUs (OKA_FUZZ_JOBS).
# fuzz/Cargo.lock is checked by clippy's --locked (cargo fuzz build passes no --locked).
set -euo pipefail
export LC_ALL=C
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

# --- the sources, at one path -----------------------------------------------------------------
# Cargo rebuilds a local crate whose path changed (a clone elsewhere) or whose files are newer
# than its last build (every file of a fresh clone). So the build runs on a copy at a fixed path
# in the cache, where only the files whose content changed are written: a clean clone rebuilds
# only the crates it changed. One run at a time uses the cache.
exec 9>"$cache/lock"
flock 9
stage=$cache/src
mkdir -p "$stage"
if git rev-parse --git-dir >/dev/null 2>&1; then
  git ls-files --cached --others --exclude-standard -- crates fuzz Cargo.toml rustfmt.toml clippy.toml
else
  find crates fuzz Cargo.toml rustfmt.toml clippy.toml -name target -prune -o -type f -print
fi | while IFS= read -r path; do
  if [ -f "$path" ]; then printf '%s\n' "$path"; fi
done | sort > "$cache/sources.list"
while IFS= read -r path; do
  if ! cmp -s "$path" "$stage/$path"; then
    mkdir -p "$stage/$(dirname "$path")"
    cp "$path" "$stage/$path"
  fi
done < "$cache/sources.list"
(cd "$stage" && find . -type f | sed 's|^\./||' | sort) \
  | comm -23 - "$cache/sources.list" \
  | while IFS= read -r gone; do rm -f "$stage/$gone"; done

# --- lints -----------------------------------------------------------------------------------
step "cargo fmt --check (fuzz/)"
cargo fmt --manifest-path fuzz/Cargo.toml -- --check

# The crates' `fuzzing` modules are linted by scripts/test.sh's workspace clippy.
step "cargo clippy (fuzz/) -- -D warnings"
CARGO_TARGET_DIR=$cache/clippy cargo clippy --manifest-path "$stage/fuzz/Cargo.toml" --locked --bins \
  -- -D warnings

# --- build -----------------------------------------------------------------------------------
step "cargo fuzz build (release, debug assertions, sancov on stable)"
(cd "$stage/fuzz" && cargo fuzz build -O --debug-assertions -s none --codegen-units 16 \
  --target-dir "$cache")
bin_dir=$cache/$(rustc -vV | sed -n 's/^host: //p')/release

# --- run ---------------------------------------------------------------------------------------
mapfile -t targets < <(if [ $# -gt 0 ]; then printf '%s\n' "$@"; else cargo fuzz list --fuzz-dir fuzz; fi)
run_dir=$(mktemp -d)
trap 'rm -rf "$run_dir"' EXIT
step "fuzzing ${#targets[@]} targets, ${seconds} s each, ${jobs} at a time"

run_one() {
  local target=$1 grown=$cache/corpus/$target
  mkdir -p "$grown" "$run_dir/$target"
  # A grown corpus past 6000 inputs is minimized first (the inputs that keep its coverage), so
  # loading it does not eat the run's time.
  if [ "$(find "$grown" -type f | wc -l)" -gt 6000 ]; then
    rm -rf "$grown.min" && mkdir -p "$grown.min"
    if "$bin_dir/$target" -merge=1 -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
      -max_len=65536 "$grown.min" "$grown" >"$run_dir/$target.merge.log" 2>&1; then
      rm -rf "$grown" && mv "$grown.min" "$grown"
    fi
  fi
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
