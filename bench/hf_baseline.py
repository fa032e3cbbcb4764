#!/usr/bin/env python3
"""HF transformers baseline for `make bench-gpu`: the same workload as `orchid bench`
(Lily's contract) on a full-shape Qwen3.6-35B-A3B with random bf16 weights, on one GPU.

    bench/hf_baseline.py --contexts 512,4096 --out hf.json [--decode-steps 64]

Prompt token i = ((i * 2654435761) mod 2^32) mod vocab. One warm-up at the exact shape,
then one measured prefill (time to first token: forward + argmax) and `decode-steps`
greedy steps through the model's own cache, timed with CUDA synchronisation. transformers
runs its pure-PyTorch fallbacks for the Gated DeltaNet (no fla / causal-conv1d kernels on
the GPU machine) and its eager MoE loop; that is the baseline as a user would get it.
Weights: HF's own initialisation (normal, std 0.02) in bf16, made directly on the GPU.
"""
import argparse
import json
import time

import torch


def prompt(n, vocab):
    return [((i * 2654435761) % (1 << 32)) % vocab for i in range(n)]


def run(model, ids, steps):
    dev = "cuda"
    x = torch.tensor([ids], device=dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model(input_ids=x, use_cache=True)
    tok = int(out.logits[0, -1].float().argmax())
    torch.cuda.synchronize()
    t_prefill = time.perf_counter() - t0
    past = out.past_key_values
    toks = []
    t1 = time.perf_counter()
    for _ in range(steps):
        out = model(input_ids=torch.tensor([[tok]], device=dev), past_key_values=past, use_cache=True)
        past = out.past_key_values
        tok = int(out.logits[0, -1].float().argmax())
        toks.append(tok)
    torch.cuda.synchronize()
    t_decode = time.perf_counter() - t1
    return t_prefill, t_decode, toks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="512,4096")
    ap.add_argument("--decode-steps", type=int, default=64)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import transformers
    from transformers import Qwen3_5MoeTextConfig
    from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeForCausalLM

    cfg = Qwen3_5MoeTextConfig(
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
        max_position_embeddings=262144,
    )
    t0 = time.perf_counter()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3_5MoeForCausalLM(cfg)
    model.eval()
    torch.cuda.synchronize()
    print(f"hf: model built in {time.perf_counter() - t0:.1f} s, transformers {transformers.__version__}, "
          f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
    results = []
    with torch.inference_mode():
        for n in [int(c) for c in a.contexts.split(",")]:
            ids = prompt(n, cfg.vocab_size)
            run(model, ids, 2)  # warm-up at the exact shape
            tp, td, toks = run(model, ids, a.decode_steps)
            r = {"prompt_len": n, "prefill_tok_s": n / tp, "prefill_secs": tp, "decode_tok_s": a.decode_steps / td,
                 "decode_secs": td, "engine": "hf-transformers-bf16", "transformers": transformers.__version__,
                 "torch": torch.__version__}
            results.append(r)
            print(f"| {n} | hf bf16 | prefill {r['prefill_tok_s']:.0f} tok/s | decode {r['decode_tok_s']:.2f} tok/s |", flush=True)
            with open(a.out, "w") as f:
                json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
