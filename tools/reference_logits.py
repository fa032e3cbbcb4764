#!/usr/bin/env python3
"""Dump what mlx-lm computes for a prompt: the oracle of orchid's CPU path.

    tools/reference_logits.py --model DIR --prompt-ids 1,2,3 [--steps N] --out FILE

1. Loads the checkpoint with `mlx_lm.utils.load_model` (the mlx-lm loader:
   sanitize drops vision_tower.*, the quantization block picks 4/8 bits).
2. Casts every floating parameter (quantization scales and biases, RMSNorm
   gains, conv1d taps, dt_bias; A_log is already float32) to float32. bf16 ->
   f32 is exact, so the weights are bit-for-bit the checkpoint's; only the
   arithmetic changes: with float32 scales every op mlx-lm runs
   (quantized_matmul, gather_qmm, QuantizedEmbedding's dequantize, rms_norm,
   Conv1d, the gated-delta loop, SDPA, softmax) runs in float32 on the CPU.
   There is no place in this model where MLX's CPU path refuses float32; the
   gated-delta recurrent state is float32 in mlx-lm anyway.
3. Runs the prompt teacher-forced in ONE forward call with a fresh cache and
   records the logits of every prompt position; then N greedy decode steps,
   one token per call through the same KV / conv / recurrent cache.

Output: the dump format of tools/logits_format.py: P records (position p,
token prompt[p]) then N records (position P+i, token g_i), where g_0 is the
argmax of the last prompt position and g_{i+1} the argmax after feeding g_i.
So the file holds logits for N+1 greedy choices, of which the first N
(g_0..g_{N-1}) are printed on stdout as "greedy: id,id,...". Ties in argmax
go to the lowest token id (numpy argmax).
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import logits_format  # noqa: E402


def load_fp32(model_dir):
    """mlx-lm model with every floating parameter cast to float32."""
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_lm.utils import load_model

    model, config = load_model(Path(model_dir))

    def to_f32(v):
        if isinstance(v, mx.array) and mx.issubdtype(v.dtype, mx.floating):
            return v.astype(mx.float32)
        return v

    model.update(tree_map(to_f32, model.parameters()))
    mx.eval(model.parameters())
    return model, config


def run(model, prompt_ids, steps):
    """Teacher-forced prompt + `steps` cached greedy steps.

    Returns (records, greedy_ids) with records as logits_format.Record."""
    import mlx.core as mx

    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("empty prompt")
    cache = model.make_cache()
    logits = model(mx.array([prompt], dtype=mx.int32), cache=cache)
    assert logits.dtype == mx.float32, logits.dtype
    lg = np.array(logits[0].astype(mx.float32))
    records = [logits_format.Record(p, t, lg[p]) for p, t in enumerate(prompt)]
    greedy = []
    tok = int(np.argmax(lg[-1]))
    for i in range(steps):
        greedy.append(tok)
        logits = model(mx.array([[tok]], dtype=mx.int32), cache=cache)
        row = np.array(logits[0, -1].astype(mx.float32))
        records.append(logits_format.Record(len(prompt) + i, tok, row))
        tok = int(np.argmax(row))
    return records, greedy


def teacher_forced(model, ids):
    """Logits of every position of `ids` in one uncached forward call."""
    import mlx.core as mx

    logits = model(mx.array([list(ids)], dtype=mx.int32))
    return np.array(logits[0].astype(mx.float32))


def parse_ids(s):
    return [int(x) for x in s.replace(" ", "").split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--steps", type=int, default=0, help="greedy decode steps")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    model, _ = load_fp32(a.model)
    records, greedy = run(model, parse_ids(a.prompt_ids), a.steps)
    logits_format.write(a.out, records)
    print("greedy: " + ",".join(str(t) for t in greedy))


if __name__ == "__main__":
    main()
