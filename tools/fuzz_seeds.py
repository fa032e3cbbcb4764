#!/usr/bin/env python3
"""Seed corpora for the libFuzzer targets in tests/fuzz/, made from the project's real inputs.

    tools/fuzz_seeds.py OUT_DIR

Writes OUT_DIR/<target>/seed-* (existing files are kept, so the corpus grows across
runs). Sources: the tiny and small test models (made by mlx-lm, cached in .cache/models),
their shard headers and config.json, small valid shards written here, and — for the text
and server targets — the real tokenizer files, chat requests and model-output samples
when those targets exist.
"""
import json
import struct
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))


def put(d: Path, name: str, data: bytes):
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"seed-{name}"
    if not p.exists():
        p.write_bytes(data)


def shard(tensors):
    """A safetensors shard image from [(name, dtype, shape, payload bytes)]."""
    header, off, blobs = {"__metadata__": {"format": "mlx"}}, 0, []
    for name, dt, shape, payload in tensors:
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(payload)]}
        off += len(payload)
        blobs.append(payload)
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def seed_safetensors(out: Path, models):
    d = out / "safetensors"
    put(d, "small-valid", shard([("a.weight", "U32", [2, 4], bytes(32)), ("a.scales", "BF16", [2, 1], bytes(4)),
                                 ("a.biases", "BF16", [2, 1], bytes(4)), ("n", "F32", [3], bytes(12))]))
    put(d, "empty", shard([]))
    for m in models:
        for f in sorted(m.glob("*.safetensors")):
            raw = f.read_bytes()
            (n,) = struct.unpack("<Q", raw[:8])
            put(d, f"{m.name}-{f.stem}-head", raw[: 8 + n + 256])  # header + a little data
            hdr = json.loads(raw[8 : 8 + n])
            # a complete, valid shard holding only the smallest tensors of this header
            small = [(k, v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0] : 8 + n + v["data_offsets"][1]])
                     for k, v in hdr.items() if k != "__metadata__" and v["data_offsets"][1] - v["data_offsets"][0] <= 512][:6]
            put(d, f"{m.name}-{f.stem}-small", shard(small))


def seed_config(out: Path, models):
    d = out / "config"
    for m in models:
        cfg = (m / "config.json").read_bytes()
        put(d, f"{m.name}", cfg)
        c = json.loads(cfg)
        tc = c["text_config"]
        tc.update(hidden_size=2048, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2, head_dim=256,
                  linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                  num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512)
        tc.pop("layer_types", None)
        put(d, "production", json.dumps(c).encode())
        break


def main():
    out = Path(sys.argv[1])
    import models as test_models  # builds the test models on demand
    dirs = [Path(test_models.model_dir("tiny")), Path(test_models.model_dir("small"))]
    seed_safetensors(out, dirs)
    seed_config(out, dirs)
    hook = REPO / "tests" / "fuzz" / "seeds_text.py"  # text/server targets add their own seeds
    if hook.exists():
        import runpy
        runpy.run_path(str(hook))["seed"](out, dirs)
    print(f"seeds in {out}")


if __name__ == "__main__":
    main()
