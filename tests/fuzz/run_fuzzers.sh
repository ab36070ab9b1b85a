#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, AddressSanitizer, UndefinedBehaviorSanitizer) and
# runs each for a while, starting from its checked-in corpus (tests/fuzz/corpus/<target>/),
# which it never changes: new inputs go to a scratch folder, crashes to the output folder.
# Prints a JSON line per target (executions, coverage, crashes) and exits 1 when any
# target crashed, leaked, timed out or ran out of memory.
#
#   tests/fuzz/run_fuzzers.sh [--seconds N] [--jobs J] [--build DIR] [--out DIR]
#                             [--opt LEVEL] [--keep_corpus] [--build_only] [TARGET...]
#
#   --seconds N     each target's run (default 60)
#   --jobs J        targets run at once (default 1)
#   --build DIR     the fuzz build (default build-fuzz/ in the checkout); configured and
#                   built when missing or stale
#   --out DIR       crash reproducers and logs (default DIR/findings of the build)
#   --opt LEVEL     the compiler's -O level (default 1; 0 builds twice as fast, runs slower)
#   --keep_corpus   merge what each run found into corpus/<target>/ (minimized), to check in
#   --build_only    configure and build, run nothing
#   TARGET...       some targets (default: every one in tests/fuzz/CMakeLists.txt)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fuzz_dir="$repo/tests/fuzz"
seconds=60
jobs=1
build="$repo/build-fuzz"
out=""
keep=0
build_only=0
opt=1
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --opt) opt="$2"; shift 2 ;;
    --keep_corpus) keep=1; shift ;;
    --build_only) build_only=1; shift ;;
    -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run_fuzzers.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
known=($(sed -n '/^set(stratum_fuzz_targets/,/)/p' "$fuzz_dir/CMakeLists.txt" |
         sed 's/set(stratum_fuzz_targets//; s/)//'))
[ ${#targets[@]} -eq 0 ] && targets=("${known[@]}")
for target in "${targets[@]}"; do
  if [[ ! " ${known[*]} " == *" $target "* ]]; then
    echo "run_fuzzers.sh: no fuzz target '$target'; there are: ${known[*]}" >&2
    exit 2
  fi
done
for tool in clang++ cmake ninja; do
  command -v "$tool" >/dev/null ||
    { echo "run_fuzzers.sh: $tool is missing: run deploy/setup.sh (it installs clang)" >&2; exit 2; }
done
[ -n "$out" ] || out="$build/findings"
mkdir -p "$out" "$build"
build="$(cd "$build" && pwd)"
out="$(cd "$out" && pwd)"

CC=clang CXX=clang++ cmake -S "$repo" -B "$build" -G Ninja -DSTRATUM_FUZZ=ON \
  -DCMAKE_BUILD_TYPE=Fuzz -DCMAKE_CXX_FLAGS_FUZZ="-O$opt" >"$out/configure.log" 2>&1 ||
  { cat "$out/configure.log" >&2; echo "run_fuzzers.sh: configuring the fuzz build failed" >&2; exit 1; }
cmake --build "$build" --target "${targets[@]/%/_fuzz}" >"$out/build.log" 2>&1 ||
  { tail -n 40 "$out/build.log" >&2; echo "run_fuzzers.sh: building the fuzz targets failed" >&2; exit 1; }
[ "$build_only" = 1 ] && { echo "run_fuzzers.sh: built ${targets[*]} into $build/bin"; exit 0; }

# One target: its run, then its summary line. libFuzzer's own limits: an input that runs
# over 10 s is a hang, over 2 GiB of memory (or one allocation over it) a leak of bounds.
run_one() {
  local target="$1"
  local scratch="$out/$target.corpus" log="$out/$target.log"
  rm -rf "$scratch" "$out/$target.crashes" && mkdir -p "$scratch" "$out/$target.crashes"
  local rc=0
  (cd "$out" && "$build/bin/${target}_fuzz" "$scratch" "$fuzz_dir/corpus/$target" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
    -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$out/$target.crashes/" >"$log" 2>&1) || rc=$?
  local execs cov features crashes
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
  features=$(grep -o 'ft: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
  crashes=$(find "$out/$target.crashes" -type f | wc -l)
  if [ "$keep" = 1 ] && [ "$rc" = 0 ]; then
    "$build/bin/${target}_fuzz" -merge=1 "$fuzz_dir/corpus/$target" "$scratch" >>"$log" 2>&1 || true
  fi
  printf '{"fuzz_target":"%s","seconds":%s,"executions":%s,"coverage_edges":%s,"features":%s,"crashes":%s,"exit":%s,"log":"%s"}\n' \
    "$target" "$seconds" "${execs:-0}" "${cov:-0}" "${features:-0}" "$crashes" "$rc" "$log"
  if [ "$rc" != 0 ]; then
    echo "--- $target failed (exit $rc); the end of $log:" >&2
    grep -A 30 -m 1 'ERROR:\|==ERROR\|runtime error\|deadly signal\|out-of-memory\|timeout' "$log" >&2 ||
      tail -n 30 "$log" >&2
    return 1
  fi
}
export -f run_one
export out build fuzz_dir seconds keep

failed=0
printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one {}' || failed=1
exit "$failed"
