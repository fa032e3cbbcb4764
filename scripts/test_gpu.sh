#!/usr/bin/env bash
# scripts/test_gpu.sh — `make test-gpu`: the CUDA backend against the CPU reference
# (tests/gpu/test_cuda_ops.c: every op on fresh random inputs with per-op tolerances;
# tests/gpu/test_cuda_model.c: end to end on the tiny mlx-lm checkpoint and the synthetic
# small shape, greedy decode >= 31/32 tokens identical; decode batch invariance on the
# synthetic mini shape: sequences decoded together and alone give bitwise equal logits;
# the one-token forward graph; state transfer), then tests/gpu/test_cuda_sample.c (the
# device sampler against its host reference, bitwise).
# Needs an NVIDIA GPU; ends with "N passed, N failed" (the three programs' sums). bench/serve_same.py checks the same through the server.
#   BUILD=dir          where the binaries are (default build)
#   ORCHID_GPU_TINY    tiny checkpoint directory (default .cache/gpu_models/tiny; made
#                      with tools/make_test_model.py when .venv has mlx-lm)
#   ORCHID_GPU_FULL=1  also the full-shape synthetic check (top-1 >= 99 % of 256 positions)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
for bin in $BUILD/tests/gpu/test_cuda_ops $BUILD/tests/gpu/test_cuda_model $BUILD/tests/gpu/test_cuda_sample; do
  if [ ! -x "$bin" ]; then
    echo "$bin is missing (make gpu-tests builds it; it needs nvcc)"
    echo "0 passed, 1 failed"
    exit 1
  fi
done
tiny=${ORCHID_GPU_TINY:-.cache/gpu_models/tiny}
if [ ! -f "$tiny/config.json" ] && [ -x .venv/bin/python ]; then
  .venv/bin/python tools/make_test_model.py --config tiny --out "$tiny" >/dev/null 2>&1 || true
fi
passed=0 failed=0 rc=0
for bin in $BUILD/tests/gpu/test_cuda_ops $BUILD/tests/gpu/test_cuda_model $BUILD/tests/gpu/test_cuda_sample; do
  log=$(mktemp)
  ORCHID_GPU_TINY=$tiny "$bin" | tee "$log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -1)
  rm -f "$log"
  if [ -z "$line" ]; then failed=$((failed + 1)); rc=1; continue; fi
  passed=$((passed + ${line%% passed*}))
  f=${line#*passed, }
  failed=$((failed + ${f%% failed}))
done
echo "$passed passed, $failed failed"
exit $rc
