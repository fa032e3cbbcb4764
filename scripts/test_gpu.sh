#!/usr/bin/env bash
# scripts/test_gpu.sh — `make test-gpu`: the CUDA backend against the CPU reference
# (tests/gpu/test_cuda_ops.c: every op on fresh random inputs with per-op tolerances,
# then end to end on the tiny mlx-lm checkpoint and the synthetic small shape, greedy
# decode >= 31/32 tokens identical; decode batch invariance on the synthetic mini shape:
# sequences decoded together and alone give bitwise equal logits). Needs an NVIDIA GPU;
# ends with "N passed, N failed". bench/serve_same.py checks the same through the server.
#   BUILD=dir          where the binaries are (default build)
#   ORCHID_GPU_TINY    tiny checkpoint directory (default .cache/gpu_models/tiny; made
#                      with tools/make_test_model.py when .venv has mlx-lm)
#   ORCHID_GPU_FULL=1  also the full-shape synthetic check (top-1 >= 99 % of 256 positions)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
bin=$BUILD/tests/gpu/test_cuda_ops
if [ ! -x "$bin" ]; then
  echo "$bin is missing (make gpu-tests builds it; it needs nvcc)"
  echo "0 passed, 1 failed"
  exit 1
fi
tiny=${ORCHID_GPU_TINY:-.cache/gpu_models/tiny}
if [ ! -f "$tiny/config.json" ] && [ -x .venv/bin/python ]; then
  .venv/bin/python tools/make_test_model.py --config tiny --out "$tiny" >/dev/null 2>&1 || true
fi
ORCHID_GPU_TINY=$tiny "$bin"
