#!/usr/bin/env python3
"""Write a JSON fixture of MLX affine quantization cases for orchid's C tests.

    tools/quant_fixture.py OUT.json [--seed N]

Every case is quantized by `mx.quantize` (the CPU kernel mlx-lm's convert
uses) from bfloat16 weights, exactly as a checkpoint is made, and decoded by
`mx.dequantize` / `mx.quantized_matmul`. JSON layout:

  {"generator": ..., "mlx_version": ..., "cases": [case, ...]}
  case = {
    "name": str, "bits": 4|8, "group_size": 64, "rows": R, "cols": C,
    "w":        R*C float32  the bf16 input weights (as exact float values)
    "wq":       R*(C*bits/32) uint32 words (LSB-first packing), row-major
    "codes":    R*C ints, the unpacked codes (for debugging a packing bug)
    "scales":   R*(C/64) uint16 bf16 bit patterns (may be negative)
    "biases":   R*(C/64) uint16 bf16 bit patterns
    "dequant":  R*C float32 = mx.dequantize with the scales/biases cast to
                float32, i.e. s*q + b evaluated in float32 (what a float32
                dequantizer must produce; compare with a few-ulp tolerance,
                MLX may or may not fuse the multiply-add)
    "dequant_bf16": R*C float32 values of mx.dequantize in bf16 (the
                checkpoint-dtype result, for information)
    "x":        C float32 input vector
    "y":        R float32 = mx.quantized_matmul(x, wq, scales_f32, biases_f32,
                transpose=True) on the CPU (y = x . W^T; float32 accumulation,
                so compare with a relative tolerance ~1e-5 of sum|x||w|)
  }
All floats are finite; every float32 prints exactly as a JSON number.
"""

import argparse
import json
import sys

import numpy as np


def bf16_bits(a):
    import mlx.core as mx

    return np.array(a.astype(mx.bfloat16).view(mx.uint16)).reshape(-1).astype(int).tolist()


def unpack(wq, bits, cols):
    """LSB-first unpack of uint32 words -> integer codes [rows, cols]."""
    wq = np.asarray(wq, dtype=np.uint32)
    per = 32 // bits
    mask = (1 << bits) - 1
    shifts = np.arange(per, dtype=np.uint32) * bits
    codes = (wq[..., None] >> shifts) & mask
    return codes.reshape(wq.shape[0], -1)[:, :cols].astype(np.int64)


def f32list(a):
    return [float(v) for v in np.asarray(a, dtype=np.float32).reshape(-1)]


def make_case(name, w, bits, rng, group_size=64):
    import mlx.core as mx

    w = np.asarray(w, dtype=np.float32)
    rows, cols = w.shape
    wb = mx.array(w).astype(mx.bfloat16)  # checkpoints quantize from bf16
    wq, scales, biases = mx.quantize(wb, group_size=group_size, bits=bits)
    s32, b32 = scales.astype(mx.float32), biases.astype(mx.float32)
    deq32 = mx.dequantize(wq, s32, b32, group_size=group_size, bits=bits)
    deq16 = mx.dequantize(wq, scales, biases, group_size=group_size, bits=bits)
    x = rng.standard_normal(cols).astype(np.float32)
    y = mx.quantized_matmul(
        mx.array(x)[None], wq, s32, b32, transpose=True, group_size=group_size, bits=bits
    )[0]
    mx.eval(wq, deq32, deq16, y)

    codes = unpack(np.array(wq), bits, cols)
    # Self-check of the documented layout: s*q + b per group reproduces MLX.
    s_np = np.repeat(np.array(s32), group_size, axis=1)
    b_np = np.repeat(np.array(b32), group_size, axis=1)
    mine = (s_np * codes.astype(np.float32) + b_np).astype(np.float32)
    ref = np.array(deq32)
    tol = 4 * np.spacing(np.maximum(np.abs(ref), np.abs(mine)).astype(np.float32))
    assert np.all(np.abs(mine - ref) <= tol + 1e-45), f"{name}: layout self-check failed"
    assert np.all(np.isfinite(ref)) and np.all(np.isfinite(np.array(y))), name

    return {
        "name": name,
        "bits": bits,
        "group_size": group_size,
        "rows": rows,
        "cols": cols,
        "w": f32list(np.array(wb.astype(mx.float32))),
        "wq": np.array(wq).reshape(-1).astype(int).tolist(),
        "codes": codes.reshape(-1).tolist(),
        "scales": bf16_bits(scales),
        "biases": bf16_bits(biases),
        "dequant": f32list(ref),
        "dequant_bf16": f32list(np.array(deq16.astype(mx.float32))),
        "x": f32list(x),
        "y": f32list(np.array(y)),
    }


def cases(seed=0):
    rng = np.random.default_rng(seed)
    n = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    out = []
    for bits in (4, 8):
        out.append(make_case(f"normal_b{bits}", 0.05 * n(4, 256), bits, rng))
        # one group per row with a single sign: all-positive rows give a
        # negative scale (edge = max), all-negative rows a positive one
        signs = np.stack([
            rng.uniform(0.1, 1.0, 128),
            -rng.uniform(0.1, 1.0, 128),
            np.concatenate([rng.uniform(0.0, 1.0, 64), -rng.uniform(0.0, 1.0, 64)]),
            np.concatenate([rng.uniform(-0.2, 1.0, 64), rng.uniform(-1.0, 0.2, 64)]),
        ]).astype(np.float32)
        out.append(make_case(f"sign_mix_b{bits}", signs, bits, rng))
        mags = np.stack([
            1e-8 * n(128)[0:128],   # range below the 1e-7 scale floor
            1e-30 * n(128),         # tiny, far below the floor
            1e-3 * n(128),
            1e30 * n(128),          # huge
            1e37 * np.clip(n(128), -1, 1),  # near the limit (range/n must stay finite)
            1e4 * n(128),
        ]).astype(np.float32)
        out.append(make_case(f"magnitudes_b{bits}", mags, bits, rng))
        consts = np.stack([
            np.full(128, 0.5), np.zeros(128), np.full(128, -3.0), np.full(128, 1e-9),
            np.concatenate([np.full(64, 7.0), np.full(64, -7.0)]),
        ]).astype(np.float32)
        out.append(make_case(f"constant_b{bits}", consts, bits, rng))
        levels = (1 << bits) - 1
        ramps = np.stack([
            np.tile(np.linspace(-1.0, 1.0, 64), 2),
            np.tile(np.arange(64) % (levels + 1), 2).astype(np.float32),  # exact codes
            np.tile(np.linspace(0.0, 2.0, 64), 2),
            np.tile(np.linspace(-2.0, 0.0, 64), 2),
            np.tile(np.linspace(-0.3, 5.0, 64), 2),  # zero near one edge
        ]).astype(np.float32)
        out.append(make_case(f"ramps_b{bits}", ramps, bits, rng))
        out.append(make_case(f"gemv_b{bits}", 0.02 * n(16, 512), bits, rng))
    return out


def main():
    import mlx.core as mx

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    doc = {
        "generator": "tools/quant_fixture.py",
        "mlx_version": mx.__version__,
        "seed": a.seed,
        "cases": cases(a.seed),
    }
    with open(a.out, "w") as f:
        json.dump(doc, f, allow_nan=False)
    print(f"[quant_fixture] {len(doc['cases'])} cases -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
