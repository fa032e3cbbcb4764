"""Tests of the Python side of correctness (no orchid C code needed):
the mlx-lm-written test checkpoints, the mlx-lm reference dumps, the logits
dump format and the quantization fixture."""

import io
import json
import struct
import subprocess
import sys

import numpy as np
import pytest

import models
from models import CONFIGS, TOOLS, checkpoint_tensors, model_dir

import logits_format


def expected_tensors(tc):
    """{name: (dtype, shape)} MODEL.md §2.3 predicts for a text_config."""
    H, V = tc["hidden_size"], tc["vocab_size"]
    nh, nkv, hd = tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]
    nk, nv = tc["linear_num_key_heads"], tc["linear_num_value_heads"]
    dk, dv = tc["linear_key_head_dim"], tc["linear_value_head_dim"]
    E, I, Is = tc["num_experts"], tc["moe_intermediate_size"], tc["shared_expert_intermediate_size"]
    K = tc["linear_conv_kernel_dim"]
    g = 64
    out = {}

    def q(name, shape, bits=4):
        *lead, o, i = shape
        assert i % g == 0, name
        out[name + ".weight"] = ("U32", (*lead, o, i * bits // 32))
        out[name + ".scales"] = ("BF16", (*lead, o, i // g))
        out[name + ".biases"] = ("BF16", (*lead, o, i // g))

    def f(name, shape, dtype="BF16"):
        out[name] = (dtype, tuple(shape))

    p = "language_model.model"
    q(f"{p}.embed_tokens", (V, H))
    q("language_model.lm_head", (V, H))
    f(f"{p}.norm.weight", (H,))
    for l in range(tc["num_hidden_layers"]):
        L = f"{p}.layers.{l}"
        f(f"{L}.input_layernorm.weight", (H,))
        f(f"{L}.post_attention_layernorm.weight", (H,))
        if (l + 1) % tc["full_attention_interval"] == 0:
            a = f"{L}.self_attn"
            q(f"{a}.q_proj", (2 * nh * hd, H))
            q(f"{a}.k_proj", (nkv * hd, H))
            q(f"{a}.v_proj", (nkv * hd, H))
            q(f"{a}.o_proj", (H, nh * hd))
            f(f"{a}.q_norm.weight", (hd,))
            f(f"{a}.k_norm.weight", (hd,))
        else:
            a = f"{L}.linear_attn"
            q(f"{a}.in_proj_qkv", (2 * nk * dk + nv * dv, H))
            q(f"{a}.in_proj_z", (nv * dv, H))
            q(f"{a}.in_proj_b", (nv, H))
            q(f"{a}.in_proj_a", (nv, H))
            q(f"{a}.out_proj", (H, nv * dv))
            f(f"{a}.conv1d.weight", (2 * nk * dk + nv * dv, K, 1))
            f(f"{a}.A_log", (nv,), "F32")
            f(f"{a}.dt_bias", (nv,))
            f(f"{a}.norm.weight", (dv,))
        m = f"{L}.mlp"
        q(f"{m}.gate", (E, H), bits=8)
        q(f"{m}.shared_expert_gate", (1, H), bits=8)
        q(f"{m}.shared_expert.gate_proj", (Is, H))
        q(f"{m}.shared_expert.up_proj", (Is, H))
        q(f"{m}.shared_expert.down_proj", (H, Is))
        q(f"{m}.switch_mlp.gate_proj", (E, I, H))
        q(f"{m}.switch_mlp.up_proj", (E, I, H))
        q(f"{m}.switch_mlp.down_proj", (E, H, I))
    return out


def _config(d):
    return json.loads((d / "config.json").read_text())


def test_expected_shapes_reproduce_model_md_table():
    """The shape rule above gives MODEL.md §2.3's table for the real model."""
    real = dict(
        hidden_size=2048, vocab_size=248320, num_hidden_layers=40,
        num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=32,
        linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel_dim=4, num_experts=256, moe_intermediate_size=512,
        shared_expert_intermediate_size=512, full_attention_interval=4,
    )
    e = expected_tensors(real)
    p = "language_model.model.layers"
    table = {
        "language_model.model.embed_tokens": ((248320, 256), (248320, 32)),
        "language_model.lm_head": ((248320, 256), (248320, 32)),
        f"{p}.0.linear_attn.in_proj_qkv": ((8192, 256), (8192, 32)),
        f"{p}.0.linear_attn.in_proj_z": ((4096, 256), (4096, 32)),
        f"{p}.0.linear_attn.in_proj_b": ((32, 256), (32, 32)),
        f"{p}.0.linear_attn.out_proj": ((2048, 512), (2048, 64)),
        f"{p}.3.self_attn.q_proj": ((8192, 256), (8192, 32)),
        f"{p}.3.self_attn.k_proj": ((512, 256), (512, 32)),
        f"{p}.3.self_attn.o_proj": ((2048, 512), (2048, 64)),
        f"{p}.0.mlp.gate": ((256, 512), (256, 32)),
        f"{p}.0.mlp.shared_expert_gate": ((1, 512), (1, 32)),
        f"{p}.0.mlp.shared_expert.up_proj": ((512, 256), (512, 32)),
        f"{p}.0.mlp.shared_expert.down_proj": ((2048, 64), (2048, 8)),
        f"{p}.0.mlp.switch_mlp.gate_proj": ((256, 512, 256), (256, 512, 32)),
        f"{p}.0.mlp.switch_mlp.down_proj": ((256, 2048, 64), (256, 2048, 8)),
    }
    for name, (w, s) in table.items():
        assert e[name + ".weight"] == ("U32", w), name
        assert e[name + ".scales"] == ("BF16", s), name
    assert e[f"{p}.0.linear_attn.conv1d.weight"] == ("BF16", (8192, 4, 1))
    assert e[f"{p}.0.linear_attn.A_log"] == ("F32", (32,))
    # 30 GDN layers x 45 + 10 attention layers x 40 + 7 (MODEL.md §2.3)
    assert len(e) == 30 * 45 + 10 * 40 + 7 == 1757


@pytest.mark.parametrize("config", CONFIGS)
def test_checkpoint_tensors_match_model_md(config):
    d = model_dir(config)
    tc = _config(d)["text_config"]
    have = checkpoint_tensors(d)
    text = {k: (dt, sh) for k, (_, dt, sh) in have.items() if not k.startswith("vision_tower.")}
    want = expected_tensors(tc)
    assert sorted(set(text) - set(want)) == []
    assert sorted(set(want) - set(text)) == []
    for k in want:
        assert text[k] == want[k], k


@pytest.mark.parametrize("config", CONFIGS)
def test_eight_bit_exactly_router_and_shared_gate(config):
    d = model_dir(config)
    cfg = _config(d)
    q = cfg["quantization"]
    assert cfg["quantization_config"] == q
    assert (q["group_size"], q["bits"], q["mode"]) == (64, 4, "affine")
    overrides = {k: v for k, v in q.items() if isinstance(v, dict)}
    n = cfg["text_config"]["num_hidden_layers"]
    want = {}
    for l in range(n):
        for m in ("mlp.gate", "mlp.shared_expert_gate"):
            want[f"language_model.model.layers.{l}.{m}"] = {"group_size": 64, "bits": 8}
    assert overrides == want
    # bits inferred from shapes agree with the block, for every quantized tensor
    have = checkpoint_tensors(d)
    for k, (_, dt, sh) in have.items():
        if not k.endswith(".scales"):
            continue
        mod = k[: -len(".scales")]
        w = have[mod + ".weight"][2]
        in_dim = sh[-1] * 64
        bits = w[-1] * 32 // in_dim
        assert bits == (8 if mod in want else 4), mod


@pytest.mark.parametrize("config", CONFIGS)
def test_index_covers_all_shards(config):
    d = model_dir(config)
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    wm = idx["weight_map"]
    shards = sorted(p.name for p in d.glob("*.safetensors"))
    assert len(shards) >= 2
    assert sorted(set(wm.values())) == shards
    n = len(shards)
    assert shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    total = 0
    seen = {}
    for s in shards:
        h, meta, off = models.read_safetensors_header(d / s)
        assert meta == {"format": "mlx"}
        for k, v in h.items():
            assert wm.get(k) == s, k
            seen[k] = s
            b, e = v["data_offsets"]
            total += e - b
        assert max(v["data_offsets"][1] for v in h.values()) + off == (d / s).stat().st_size
    assert set(seen) == set(wm)
    assert idx["metadata"]["total_size"] == total
    assert list(wm) == sorted(wm)


@pytest.mark.parametrize("config", CONFIGS)
def test_vision_tensors_present_and_ignored_by_mlx_lm(config):
    d = model_dir(config)
    have = checkpoint_tensors(d)
    vis = {k: v for k, v in have.items() if k.startswith("vision_tower.")}
    assert "vision_tower.patch_embed.proj.weight" in vis
    assert "vision_tower.blocks.0.norm1.weight" in vis
    assert all(dt == "BF16" for _, dt, _ in vis.values())

    from mlx.utils import tree_flatten
    from mlx_lm.utils import load_model

    model, _ = load_model(d)
    names = [k for k, _ in tree_flatten(model.parameters())]
    assert not any("vision" in k for k in names)
    assert len(names) == len(have) - len(vis)


@pytest.mark.parametrize("config", CONFIGS)
def test_config_matches_real_layout(config):
    cfg = _config(model_dir(config))
    assert cfg["model_type"] == "qwen3_5_moe"
    assert cfg["eos_token_id"] == [248046, 248044]
    tc = cfg["text_config"]
    assert tc["eos_token_id"] == 248046
    assert tc["vocab_size"] == 248320
    assert tc["tie_word_embeddings"] is False and tc["attn_output_gate"] is True
    assert tc["rms_norm_eps"] == 1e-6 and tc["full_attention_interval"] == 4
    assert tc["rope_parameters"] == {
        "rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
        "mrope_section": [11, 11, 10], "mrope_interleaved": True,
    }
    n = tc["num_hidden_layers"]
    assert tc["layer_types"] == [
        "full_attention" if i % 4 == 3 else "linear_attention" for i in range(n)
    ]
    if config == "small":
        assert (tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"]) == (16, 2, 256)
        assert (tc["linear_key_head_dim"], tc["linear_value_head_dim"]) == (128, 128)
        assert (tc["num_experts"], tc["num_experts_per_tok"], n) == (16, 8, 8)


@pytest.mark.parametrize("config", CONFIGS)
def test_mlx_lm_runs_the_model_in_float32(config):
    """Teacher-forced and cached decode agree; logits finite and not flat."""
    import reference_logits

    model, _ = reference_logits.load_fp32(model_dir(config))
    ids = models.prompt_ids(6)
    records, greedy = reference_logits.run(model, ids, 3)
    assert [r.position for r in records] == list(range(9))
    assert [r.token for r in records] == ids + greedy
    full = reference_logits.teacher_forced(model, ids + greedy)
    for r in records:
        a = r.logits
        assert a.shape == (248320,) and np.all(np.isfinite(a)) and a.std() > 0.5
        rel = np.linalg.norm(a - full[r.position]) / np.linalg.norm(full[r.position])
        assert rel < 1e-5, (r.position, rel)
    assert greedy == [int(np.argmax(records[i].logits)) for i in range(5, 8)]


def test_generation_is_deterministic(tmp_path):
    import make_test_model

    d = model_dir("tiny")
    make_test_model.build("tiny", tmp_path / "m", seed=0)
    for p in sorted(d.glob("*.safetensors")) + [d / "config.json", d / "model.safetensors.index.json"]:
        assert (tmp_path / "m" / p.name).read_bytes() == p.read_bytes(), p.name


def test_dump_format_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    recs = [logits_format.Record(p, int(t), rng.standard_normal(v).astype(np.float32))
            for p, t, v in [(0, 5, 7), (1, 248319, 7), (2, 0, 3)]]
    path = tmp_path / "d.bin"
    logits_format.write(path, recs)
    raw = path.read_bytes()
    assert len(raw) == 3 * 12 + 4 * 17
    assert struct.unpack_from("<iii", raw, 0) == (0, 5, 7)
    assert np.frombuffer(raw[12:40], "<f4").tolist() == recs[0].logits.tolist()
    back = logits_format.read(path)
    assert [(r.position, r.token) for r in back] == [(0, 5), (1, 248319), (2, 0)]
    for a, b in zip(back, recs):
        assert a.logits.dtype == np.float32 and np.array_equal(a.logits, b.logits)
    with pytest.raises(ValueError):
        list(logits_format.iter_records(io.BytesIO(raw[:-1])))


def test_reference_logits_cli(tmp_path):
    d = model_dir("tiny")
    out = tmp_path / "ref.bin"
    r = subprocess.run(
        [sys.executable, str(TOOLS / "reference_logits.py"), "--model", str(d),
         "--prompt-ids", "1,2,3,4", "--steps", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 0, r.stderr
    greedy = [int(t) for t in r.stdout.strip().splitlines()[-1].split(":")[1].split(",")]
    recs = logits_format.read(out)
    assert [(x.position, x.token) for x in recs] == [(0, 1), (1, 2), (2, 3), (3, 4),
                                                      (4, greedy[0]), (5, greedy[1])]
    assert greedy[1] == int(np.argmax(recs[4].logits))


def _bf16(bits):
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def test_quant_fixture(tmp_path):
    out = tmp_path / "q.json"
    r = subprocess.run([sys.executable, str(TOOLS / "quant_fixture.py"), str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    names = [c["name"] for c in doc["cases"]]
    for b in (4, 8):
        for n in ("normal", "sign_mix", "magnitudes", "constant", "ramps", "gemv"):
            assert f"{n}_b{b}" in names
    neg = 0
    for c in doc["cases"]:
        R, C, bits, g = c["rows"], c["cols"], c["bits"], c["group_size"]
        wq = np.array(c["wq"], dtype=np.uint64).astype(np.uint32).reshape(R, C * bits // 32)
        s = _bf16(c["scales"]).reshape(R, C // g)
        b = _bf16(c["biases"]).reshape(R, C // g)
        neg += int((s < 0).sum())
        # independent LSB-first unpack + s*q+b in float32
        per = 32 // bits
        codes = np.stack([(wq >> np.uint32(bits * k)) & np.uint32((1 << bits) - 1)
                          for k in range(per)], axis=-1).reshape(R, C)
        assert codes.reshape(-1).tolist() == c["codes"]
        deq = np.repeat(s, g, 1) * codes.astype(np.float32) + np.repeat(b, g, 1)
        want = np.array(c["dequant"], dtype=np.float32).reshape(R, C)
        assert np.allclose(deq, want, rtol=1e-6, atol=0), c["name"]
        y = deq.astype(np.float64) @ np.array(c["x"], dtype=np.float64)
        scale = np.abs(deq).astype(np.float64) @ np.abs(np.array(c["x"], dtype=np.float64))
        assert np.all(np.abs(y - np.array(c["y"])) <= 1e-5 * scale + 1e-30), c["name"]
    assert neg > 0
