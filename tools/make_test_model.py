#!/usr/bin/env python3
"""Write a small random Qwen3.6-MoE checkpoint in the exact mlx-community layout.

    tools/make_test_model.py --config tiny|small --out DIR [--seed N]

The checkpoint is produced by mlx-lm itself, the way `mlx_lm.convert` produces
mlx-community/Qwen3.6-35B-A3B-4bit:

1. build `mlx_lm.models.qwen3_5_moe.Model` from a config.json-style dict (the
   multimodal wrapper: top-level model_type qwen3_5_moe + "text_config");
2. give every parameter random values with realistic magnitudes (numpy RNG
   seeded by --seed, so the output is byte-identical for a given seed);
3. cast floating parameters to bfloat16 except A_log (the model's
   cast_predicate, as convert does with the config's dtype);
4. `mlx_lm.utils.quantize_model(model, config, 64, 4)` with the model's own
   quant_predicate (8-bit for `mlp.gate` and `mlp.shared_expert_gate`);
5. save like `mlx_lm.utils.save_model` / `save_config`: sharded safetensors
   (metadata {"format": "mlx"}, names model-0000i-of-0000n.safetensors), a
   model.safetensors.index.json, and config.json with the quantization block
   under both "quantization" and "quantization_config". The shard size limit is
   chosen so that even these small models are split into >= 2 shards.

On top of that a few unquantized bf16 `vision_tower.*` tensors are written
(mlx-vlm conversions keep the vision tower; orchid and mlx-lm must skip them),
and the tokenizer files from .cache/tokenizer/ are copied in when present.

The magnitudes are chosen so that activations stay O(1) and routing spreads
over the experts: every projection that reads the residual stream is
N(0, 1/fan_in), the embedding is N(0, 1), RMSNorm weights are 1 + N(0, 0.1)
(MLX checkpoints store 1 + w), the GDN output norm is 1 + N(0, 0.1),
A_log = log U(1, 16) in float32, and dt_bias spreads over [-5, 1] so the decays
alpha = exp(-exp(A_log) softplus(a + dt_bias)) cover both fast-forgetting and
long-memory heads (dt_bias == 1 everywhere would make every alpha < 0.3 and the
recurrence would barely be exercised).

On top of that, three pieces of the structure a trained model has, without which
a random model is chaotic at the level of bf16 rounding (docs/PERFORMANCE.md,
"Test models"; src/model/synth.c uses the same constants):
- the residual branch outputs (GDN out_proj, routed and shared down_proj:
  N(0, 1/fan_in); attention o_proj: 2.5/sqrt(fan_in), as averaging over
  positions and the sigmoid gate shrink its output) are scaled by
  RESID_GAIN / sqrt(2 n_layers) (GPT-2's depth scaling);
- the router (mlp.gate) is N(0, ROUTER_GAIN^2 / fan_in): logits of std ~3, so
  the experts at the top-k boundary carry little weight;
- lm_head (logits of std ~2) holds a direct path: row j has cos
  a = min(1, KAPPA / sqrt(H)) with embedding row tie_perm(j), so after token t the
  token tie_perm^-1(t) stands ~8 standard deviations above the vocabulary (the
  bigram term of a trained model), clear of the other 248k logits.
"""

import argparse
import copy
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent

VOCAB = 248320
EOS_TEXT = 248046
EOS_TOP = [248046, 248044]

# name -> text_config overrides. Every quantized input dim is a multiple of 64.
CONFIGS = {
    # 4 layers (3 GDN + 1 attention at index 3), real vocabulary.
    "tiny": dict(
        num_hidden_layers=4,
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
    ),
    # 8 layers (attention at 3 and 7), real vocabulary, real head dims and
    # head counts (16 q / 2 kv heads of 256, 16 key / 32 value GDN heads of
    # 128), 16 experts top-8.
    "small": dict(
        num_hidden_layers=8,
        hidden_size=256,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        num_experts=16,
        num_experts_per_tok=8,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
    ),
}

GROUP_SIZE = 64
BITS = 4


def make_config(name):
    """The full config.json dict (before quantization) for a named config."""
    tc = dict(CONFIGS[name])
    n = tc["num_hidden_layers"]
    text_config = {
        "model_type": "qwen3_5_moe_text",
        "vocab_size": VOCAB,
        **tc,
        "linear_conv_kernel_dim": 4,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 262144,
        "full_attention_interval": 4,
        "layer_types": [
            "full_attention" if (i + 1) % 4 == 0 else "linear_attention"
            for i in range(n)
        ],
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.25,
            "mrope_section": [11, 11, 10],
            "mrope_interleaved": True,
        },
        "attn_output_gate": True,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "mamba_ssm_dtype": "float32",
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "router_aux_loss_coef": 0.001,
        "output_router_logits": False,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": "bfloat16",
        "bos_token_id": 248044,
        "eos_token_id": EOS_TEXT,
        "pad_token_id": None,
    }
    return {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
        "model_type": "qwen3_5_moe",
        "text_config": text_config,
        "tie_word_embeddings": False,
        "eos_token_id": list(EOS_TOP),
        "image_token_id": 248056,
        "video_token_id": 248057,
        "vision_start_token_id": 248053,
        "vision_end_token_id": 248054,
        "transformers_version": "5.2.0",
    }


# ---------------------------------------------------------------------------
# Random parameter values


# Structure on top of "unit gain everywhere" (docs/PERFORMANCE.md, "Test models"):
# residual branches scaled by RESID_GAIN / sqrt(2 n_layers) (GPT-2), router logits of std
# ROUTER_GAIN, and the direct path: lm_head row j correlates (cos = min(1, KAPPA/sqrt(H)))
# with the embedding row of tie_perm(j), so the token the current one "predicts" stands
# out of the 248k-token bulk. src/model/synth.c uses the same constants.
RESID_GAIN = 2.0
ROUTER_GAIN = 3.0
KAPPA = 12.0


def tie_perm(n):
    """The bijection of range(n) tying lm_head rows to embedding rows: j -> (A j + n//3) mod n."""
    a = (0x9E3779B1 % n) | 1
    while math.gcd(a, n) != 1:
        a += 2
    return (a * np.arange(n, dtype=np.int64) + n // 3) % n


def random_value(path, shape, rng, n_layers):
    """float32 numpy values for the parameter at `path` (MLX module path)."""

    def normal(std):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(
            np.float32
        )

    fan_in = shape[-1] if len(shape) >= 2 else 1
    leaf = path.rsplit(".", 1)[-1]
    module = path.rsplit(".", 1)[0]
    resid = RESID_GAIN / math.sqrt(2 * n_layers)

    if path.endswith("embed_tokens.weight"):
        return normal(1.0)
    if path.endswith("lm_head.weight"):
        # logits with std ~2 (the direct path is mixed in by tie_lm_head)
        return normal(2.0 / math.sqrt(fan_in))
    if leaf == "A_log":
        return np.log(rng.uniform(1.0, 16.0, size=shape)).astype(np.float32)
    if leaf == "dt_bias":
        return rng.uniform(-5.0, 1.0, size=shape).astype(np.float32)
    if module.endswith("conv1d"):
        # MLX Conv1d layout [C, K, 1]; 4 taps of ~0.5 keep the output O(1)
        return normal(0.5)
    if len(shape) == 1:
        # every RMSNorm gain (decoder norms, q/k norms, final norm already hold
        # 1 + w in MLX checkpoints; the GDN gated norm is a plain gain ~1)
        return (1.0 + normal(0.1)).astype(np.float32)
    if module.endswith("o_proj"):
        return normal(2.5 * resid / math.sqrt(fan_in))
    if module.endswith("out_proj") or module.endswith("down_proj"):
        # the other residual branch outputs: GDN out_proj, routed and shared down_proj
        return normal(resid / math.sqrt(fan_in))
    if module.endswith("mlp.gate"):
        return normal(ROUTER_GAIN / math.sqrt(fan_in))
    # q/k/v, in_proj_{qkv,z,a,b}, shared_expert_gate, gate/up projections
    return normal(1.0 / math.sqrt(fan_in))


def tie_lm_head(lm_head, embed):
    """lm_head row j := sigma (a e_perm(j) + sqrt(1 - a^2) r_j): cos a with that embedding row."""
    hidden = embed.shape[-1]
    a = min(1.0, KAPPA / math.sqrt(hidden))
    sigma = 2.0 / math.sqrt(hidden)
    e = embed[tie_perm(embed.shape[0])] / np.float32(np.sqrt(np.mean(embed * embed)))
    return (sigma * a * e + math.sqrt(1.0 - a * a) * lm_head).astype(np.float32)


def vision_tensors(rng, hidden, vdim=64):
    """A few bf16 vision-tower tensors as mlx-vlm conversions carry them."""
    shapes = {
        "vision_tower.patch_embed.proj.weight": (vdim, 2, 16, 16, 3),
        "vision_tower.patch_embed.proj.bias": (vdim,),
        "vision_tower.pos_embed.weight": (16, vdim),
        "vision_tower.blocks.0.norm1.weight": (vdim,),
        "vision_tower.blocks.0.norm1.bias": (vdim,),
        "vision_tower.blocks.0.attn.qkv.weight": (3 * vdim, vdim),
        "vision_tower.blocks.0.attn.qkv.bias": (3 * vdim,),
        "vision_tower.merger.linear_fc2.weight": (hidden, 4 * vdim),
    }
    return {
        k: (rng.standard_normal(s, dtype=np.float32) * np.float32(0.02))
        for k, s in shapes.items()
    }


# ---------------------------------------------------------------------------
# Saving (mirrors mlx_lm.utils.save_model / save_config, with a byte shard limit)


def make_shards(weights, max_bytes):
    """mlx_lm.utils.make_shards with a byte limit instead of whole gigabytes."""
    shards, size = [], 0
    for k, v in weights.items():
        if not shards or size + v.nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += v.nbytes
    return shards


def save_weights(out, weights, total_parameters, min_shards=2):
    import mlx.core as mx

    total = sum(v.nbytes for v in weights.values())
    max_bytes = max(1, total // (min_shards + 1))
    shards = make_shards(weights, max_bytes)
    if len(shards) < 2:
        raise RuntimeError("expected at least two shards")
    n = len(shards)
    fmt = "model-{:05d}-of-{:05d}.safetensors"
    index = {
        "metadata": {"total_size": total, "total_parameters": total_parameters},
        "weight_map": {},
    }
    for i, shard in enumerate(shards):
        name = fmt.format(i + 1, n)
        mx.save_safetensors(str(out / name), shard, metadata={"format": "mlx"})
        for k in shard:
            index["weight_map"][k] = name
    index["weight_map"] = {k: index["weight_map"][k] for k in sorted(index["weight_map"])}
    with open(out / "model.safetensors.index.json", "w") as f:
        json.dump(index, f, indent=4)
    return n


def copy_tokenizer(out):
    """Copy .cache/tokenizer/* into the model dir when available; never fail."""
    tok_dir = REPO / ".cache" / "tokenizer"
    fetch = REPO / "tools" / "fetch_tokenizer.py"
    if not (tok_dir / "tokenizer.json").exists() and fetch.exists():
        try:
            subprocess.run(
                [sys.executable, str(fetch)],
                cwd=REPO,
                check=False,
                timeout=300,
                stdout=subprocess.DEVNULL,
            )
        except Exception as e:  # the model is still useful without a tokenizer
            print(f"[make_test_model] fetch_tokenizer failed: {e}", file=sys.stderr)
    if not (tok_dir / "tokenizer.json").exists():
        print("[make_test_model] no .cache/tokenizer/tokenizer.json; "
              "model written without tokenizer files", file=sys.stderr)
        return []
    copied = []
    for p in sorted(tok_dir.iterdir()):
        if p.is_file() and (
            p.name.startswith("tokenizer")
            or p.name in ("chat_template.jinja", "special_tokens_map.json",
                          "vocab.json", "merges.txt", "generation_config.json")
        ):
            shutil.copy(p, out / p.name)
            copied.append(p.name)
    return copied


# ---------------------------------------------------------------------------


def build(name, out, seed=0, quiet=False):
    """Write the checkpoint for config `name` into directory `out`."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_map_with_path, tree_unflatten
    from mlx_lm.models import qwen3_5_moe
    from mlx_lm.utils import get_total_parameters, quantize_model, save_config

    t0 = time.time()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # a previous build with a different shard count must not leave stale shards
    # (mlx-lm's loader globs model*.safetensors)
    for p in out.glob("model*.safetensors*"):
        p.unlink()
    config = make_config(name)
    rng = np.random.default_rng(seed)
    mx.random.seed(seed)  # module constructors draw from MLX's RNG too

    # deepcopy: TextModelArgs.__post_init__ rewrites rope_parameters in place
    args = qwen3_5_moe.ModelArgs.from_dict(copy.deepcopy(config))
    model = qwen3_5_moe.Model(args)

    # Random values in a fixed (sorted) order, so the bytes depend only on seed.
    params = dict(tree_flatten(model.parameters()))
    n_layers = config["text_config"]["num_hidden_layers"]
    new = {}
    for path in sorted(params):
        v = params[path]
        new[path] = random_value(path, tuple(v.shape), rng, n_layers)
    lm, emb = "language_model.lm_head.weight", "language_model.model.embed_tokens.weight"
    new[lm] = tie_lm_head(new[lm], new[emb])
    model.update(tree_unflatten([(k, mx.array(v)) for k, v in new.items()]))

    # convert: cast to the checkpoint dtype except where cast_predicate says no
    cast_predicate = model.cast_predicate

    def set_dtype(k, v):
        if cast_predicate(k) and mx.issubdtype(v.dtype, mx.floating):
            return v.astype(mx.bfloat16)
        return v

    model.update(tree_map_with_path(set_dtype, model.parameters()))

    # convert: quantize with the model's quant_predicate (8-bit router gates)
    model, qconfig = quantize_model(
        model, config, GROUP_SIZE, BITS, quant_predicate=model.quant_predicate
    )
    mx.eval(model.parameters())

    weights = dict(tree_flatten(model.parameters()))
    for k, v in vision_tensors(rng, config["text_config"]["hidden_size"]).items():
        weights[k] = mx.array(v).astype(mx.bfloat16)
    n_shards = save_weights(out, weights, get_total_parameters(model))
    save_config(qconfig, config_path=out / "config.json")
    tok = copy_tokenizer(out)
    if not quiet:
        print(
            f"[make_test_model] {name} seed {seed}: {len(weights)} tensors in "
            f"{n_shards} shards, tokenizer files {tok or 'none'}, "
            f"{time.time() - t0:.1f} s -> {out}"
        )
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, choices=sorted(CONFIGS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    build(a.config, a.out, a.seed)


if __name__ == "__main__":
    main()
