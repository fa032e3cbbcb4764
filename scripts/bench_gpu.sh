#!/usr/bin/env bash
# scripts/bench_gpu.sh — `make bench-gpu`: orchid's benchmark contract (`orchid bench`,
# Lily's contract: docs/PERFORMANCE.md) on a full-shape synthetic Qwen3.6-35B-A3B built in
# memory (no 19 GB download), one fresh process per context, then the HF transformers
# baseline (bf16, same prompts, same GPU; bench/hf_baseline.py) when python3 has torch and
# transformers, then a markdown table of everything (paste it into docs/PERFORMANCE.md).
#   CONTEXTS="256 512 4096 32768 131072"   HF_CONTEXTS="512,4096"   BUILD=build   OUT_DIR=bench/out
#   BENCH_GPU_HARNESS=1: the per-op CUDA harness tests/gpu/bench_cuda.c instead.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
CONTEXTS=${CONTEXTS:-256 512 4096 32768 131072}
HF_CONTEXTS=${HF_CONTEXTS:-512,4096}
OUT_DIR=${OUT_DIR:-bench/out}
mkdir -p "$OUT_DIR"
if [ "${BENCH_GPU_HARNESS:-0}" = 1 ]; then
  bin=$BUILD/tests/gpu/bench_cuda
  [ -x "$bin" ] || { echo "$bin is missing (make gpu-tests builds it; it needs nvcc)"; exit 1; }
  exec "$bin" --contexts "$(echo $CONTEXTS | tr ' ' ',')" --json "$OUT_DIR/cuda_harness.json" --profile 1
fi
rc=0
for n in $CONTEXTS; do
  "$BUILD/orchid" bench --synth 35b-a3b --backend cuda --prompt-len "$n" --decode-steps 64 \
    --json-out "$OUT_DIR/cuda_$n.json" || rc=1
done
if python3 -c 'import torch, transformers' 2>/dev/null; then
  python3 bench/hf_baseline.py --contexts "$HF_CONTEXTS" --out "$OUT_DIR/hf.json" || rc=1
fi
python3 - "$OUT_DIR" <<'PY'
import glob, json, os, sys
d = sys.argv[1]
print("| context | engine | prefill tok/s | TTFT s | decode tok/s | digest |")
print("|---:|---|---:|---:|---:|---|")
rows = []
for f in glob.glob(os.path.join(d, "cuda_*.json")):
    j = json.load(open(f)); r = j["results"]
    rows.append((j["workload"]["prompt_len"], "orchid cuda", r["prefill"]["tok_s"], r["prefill"]["wall_secs"], r["decode"]["tok_s"], r["decode"]["token_digest"]))
hf = os.path.join(d, "hf.json")
if os.path.exists(hf):
    for r in json.load(open(hf)):
        rows.append((r["prompt_len"], "HF transformers bf16", r["prefill_tok_s"], r["prefill_secs"], r["decode_tok_s"], "-"))
for n, e, p, t, dd, dg in sorted(rows):
    print(f"| {n:,} | {e} | {p:,.0f} | {t:.3f} | {dd:.1f} | {dg} |")
PY
exit $rc
