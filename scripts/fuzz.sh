#!/usr/bin/env bash
# scripts/fuzz.sh BIN... — runs each libFuzzer target for $FUZZ_SECONDS seconds on its
# corpus (build/fuzz/corpus/<target>, seeded from the project's real inputs by
# tools/fuzz_seeds.py) and fails on any crash, leak, timeout (> 1 s per input) or OOM.
# Findings are kept under build/fuzz/findings/<target>/ for a regression test.
# Logs go to ${FUZZ_LOGS:-build/fuzz}/<target>.log (long runs set their own so a make test smoke
# meanwhile does not overwrite them). Prints one "N passed, N failed" line (one per target).
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-60}
.venv/bin/python tools/fuzz_seeds.py build/fuzz/corpus >/dev/null || { echo "fuzz: seeding failed"; echo "0 passed, 1 failed"; exit 1; }
passed=0; failed=0
for bin in "$@"; do
  name=$(basename "$bin"); target=${name#fuzz_}
  corpus=build/fuzz/corpus/$target; findings=build/fuzz/findings/$target
  mkdir -p "$corpus" "$findings"
  dict=""; [ -f "tests/fuzz/$target.dict" ] && dict="-dict=tests/fuzz/$target.dict"
  log=${FUZZ_LOGS:-build/fuzz}/$target.log; mkdir -p "$(dirname "$log")"
  # Regression inputs are replayed first, on their own (-runs=0 runs each once): kept out of
  # the mutation corpus, a large one would not slow every later mutation down.
  # shellcheck disable=SC2086
  if ASAN_OPTIONS=detect_leaks=1 "$bin" -runs=0 -timeout=1 -rss_limit_mb=2048 -max_len=1048576 \
       -artifact_prefix="$findings/" tests/fuzz/regressions/$target >"$log" 2>&1 &&
     ASAN_OPTIONS=detect_leaks=1 "$bin" -max_total_time="$secs" -timeout=1 -rss_limit_mb=2048 -max_len=1048576 \
       -artifact_prefix="$findings/" -print_final_stats=1 $dict "$corpus" >>"$log" 2>&1; then
    execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$')
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1)
    echo "fuzz: $target ok (${secs}s, ${execs:-?} executions, ${cov:-cov ?})"
    passed=$((passed + 1))
  else
    echo "fuzz: $target FAILED — see $log and $findings/"; tail -30 "$log"
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
