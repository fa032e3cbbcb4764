#!/usr/bin/env bash
# scripts/run_tests.sh — runs the C unit tests (normal and ASan/UBSan builds) and the
# Python tests (tests/python, pytest in .venv), then prints one closing line
# "N passed, N failed" summing them all. Exit status is non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
passed=0; failed=0
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

run_unit() {
  local bin=$1 out rc line p f
  out=$("$bin" 2>&1); rc=$?
  line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -1)
  if [ -z "$line" ] || [ $rc -ne 0 ]; then
    printf '%s\n' "$out" | tail -40
    echo "unit: $bin FAILED (rc=$rc)"
  fi
  p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/'); f=$(echo "$line" | sed -E 's/.*, ([0-9]+) failed.*/\1/')
  [ -z "$line" ] && { p=0; f=1; }
  [ $rc -ne 0 ] && [ "${f:-0}" = 0 ] && f=1
  passed=$((passed + p)); failed=$((failed + f))
  echo "unit: $(basename "$bin") ($(dirname "$bin")): $p passed, $f failed"
}

if [ "$mode" != "--python-only" ]; then
  # MLX-made fixtures the C unit tests compare against (made once, then cached).
  mkdir -p .cache
  [ -s .cache/quant_fixture.json ] || .venv/bin/python tools/quant_fixture.py .cache/quant_fixture.json >/dev/null
  # The tiny mlx-lm test model the engine tests load (tests/python/models.py caches it).
  export ORCHID_TEST_MODEL=$(.venv/bin/python -c 'import sys; sys.path.insert(0, "tests/python"); import models; print(models.model_dir("tiny"))')
  for b in build/tests/test_* build/asan/tests/test_*; do
    [ -x "$b" ] && [ "${b%.d}" = "$b" ] && run_unit "$b"
  done
fi

# A short smoke of every fuzz target (make fuzz runs them for FUZZ_SECONDS each).
fuzz_bins=()
for f in build/fuzz/fuzz_*; do [ -x "$f" ] && [ "${f%.d}" = "$f" ] && fuzz_bins+=("$f"); done
if [ "$mode" = all ] && [ ${#fuzz_bins[@]} -gt 0 ]; then
  out=$(FUZZ_SECONDS=3 scripts/fuzz.sh "${fuzz_bins[@]}" 2>&1)
  printf '%s\n' "$out" | grep -E '^fuzz:' 
  line=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -1)
  p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/'); f=$(echo "$line" | sed -E 's/.*, ([0-9]+) failed.*/\1/')
  [ -z "$line" ] && { p=0; f=1; }
  passed=$((passed + p)); failed=$((failed + f))
fi

if [ "$mode" != "--unit-only" ] && [ -d tests/python ]; then
  out=$(.venv/bin/python -m pytest -q tests/python 2>&1); rc=$?
  printf '%s\n' "$out" | tail -60
  line=$(printf '%s\n' "$out" | tail -1)
  p=$(echo "$line" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || echo 0)
  f=$(echo "$line" | grep -oE '[0-9]+ (failed|error|errors)' | awk '{s+=$1} END {print s+0}')
  [ -z "$p" ] && p=0; [ -z "$f" ] && f=0
  if [ $rc -ne 0 ] && [ $rc -ne 5 ] && [ "$f" = 0 ]; then f=1; fi
  passed=$((passed + p)); failed=$((failed + f))
fi

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
