"""`orchid synth` and `orchid bench` (src/model/synth.c, src/app/cmd_synth.c, cmd_bench.c).

synth:
* the tiny and small synthetic checkpoints have exactly the tensor names, dtypes
  and shapes, index metadata (total_size, total_parameters) and config.json of
  tools/make_test_model.py's output for the same config (mlx-lm's own writer);
  shards are model-0000i-of-0000n.safetensors with {"format": "mlx"} metadata,
  the index agrees with the shard headers, the data regions are contiguous;
* both load in `orchid info` and in mlx-lm (tools/reference_logits.py uses
  mlx_lm.utils.load_model), and orchid's CPU path agrees with mlx-lm on them:
  identical greedy continuations and teacher-forced logits within the same 1e-4
  relative tolerance as test_parity_cpu.py (same reasoning: bit-identical
  weights, float32 on both sides);
* routing spreads: over the prompt, mlx-lm's router picks many distinct experts.

bench:
* valid JSON in the documented schema on the tiny model; the digest is FNV-1a 64
  over the decode ids as u32 little-endian bytes, stable across rounds and runs;
  the prompt / first token / decode ids are exactly what `orchid generate` gives
  for the u32 golden-ratio prompt;
* `--synth tiny` gives the same digest as `--model` on a written synth tiny;
* bad flags exit 2 with one stderr line (synth and bench).
"""

import json
import re
import struct
import subprocess

import numpy as np
import pytest

import models
from models import ORCHID, ORCHID_ASAN, logits_format

pytestmark = pytest.mark.skipif(not ORCHID.exists(), reason=f"{ORCHID} not built (run make)")

PROMPT_LEN = 24
STEPS = 12
TOL = 1e-4
VOCAB = 248320


def run(args, timeout=300, binary=ORCHID):
    return subprocess.run([str(binary)] + [str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, env=models.sanitizer_env())


def golden_prompt(n, vocab=VOCAB):
    return [((i * 2654435761) % (1 << 32)) % vocab for i in range(n)]


def fnv1a64_u32(ids):
    h = 0xCBF29CE484222325
    for t in ids:
        for b in struct.pack("<I", t):
            h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


@pytest.fixture(scope="module")
def synth_dirs(tmp_path_factory):
    out = {}
    for config in models.CONFIGS:
        d = tmp_path_factory.mktemp(f"synth-{config}")
        r = run(["synth", "--out", d, "--shape", config, "--seed", 3])
        assert r.returncode == 0, r.stderr
        assert "tensors in" in r.stdout
        out[config] = d
    return out


def shard_headers(d):
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    files = sorted(set(idx["weight_map"].values()))
    heads = {}
    for f in files:
        h, meta, data_off = models.read_safetensors_header(d / f)
        heads[f] = (h, meta, data_off)
    return idx, heads


@pytest.mark.parametrize("config", models.CONFIGS)
def test_structure_matches_make_test_model(config, synth_dirs):
    d, ref = synth_dirs[config], models.model_dir(config)
    got, want = models.checkpoint_tensors(d), models.checkpoint_tensors(ref)
    assert set(got) == set(want), sorted(set(got) ^ set(want))[:20]
    bad = [k for k in got if got[k][1:] != want[k][1:]]
    assert not bad, [(k, got[k], want[k]) for k in bad[:10]]

    idx, heads = shard_headers(d)
    ref_idx = json.loads((ref / "model.safetensors.index.json").read_text())
    assert idx["metadata"] == ref_idx["metadata"]
    n = len(heads)
    assert n >= 2
    assert sorted(heads) == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    for f, (h, meta, data_off) in heads.items():
        assert meta == {"format": "mlx"}
        assert data_off % 8 == 0
        spans = sorted(v["data_offsets"] for v in h.values())
        assert spans[0][0] == 0
        for a, b in zip(spans, spans[1:]):
            assert a[1] == b[0], f"{f}: hole or overlap at {a} {b}"
        assert data_off + spans[-1][1] == (d / f).stat().st_size
        for k in h:
            assert idx["weight_map"][k] == f
    assert sum(len(h) for h, _, _ in heads.values()) == len(idx["weight_map"])

    cfg, ref_cfg = json.loads((d / "config.json").read_text()), json.loads((ref / "config.json").read_text())
    cfg.pop("orchid_synth")
    ref_cfg.pop("orchid_test_model", None)
    assert cfg == ref_cfg
    assert cfg["quantization"] == cfg["quantization_config"]
    assert cfg["eos_token_id"] == [248046, 248044]
    if (models.CACHE / "tokenizer" / "tokenizer.json").exists():
        assert (d / "tokenizer.json").read_bytes() == (models.CACHE / "tokenizer" / "tokenizer.json").read_bytes()


def test_same_seed_same_bytes(tmp_path, synth_dirs):
    r = run(["synth", "--out", tmp_path, "--shape", "tiny", "--seed", 3, "--threads", 1, "--quiet"])
    assert r.returncode == 0, r.stderr
    for f in sorted(synth_dirs["tiny"].glob("model-*.safetensors")):
        assert (tmp_path / f.name).read_bytes() == f.read_bytes(), f.name


@pytest.mark.parametrize("config", models.CONFIGS)
def test_orchid_info_loads(config, synth_dirs):
    r = run(["info", "--model", synth_dirs[config]])
    assert r.returncode == 0, r.stderr
    m = re.search(r"tensors:\s+(\d+) in the checkpoint, (\d+) bound, (\d+) skipped", r.stdout)
    assert m and int(m.group(3)) == 8, r.stdout


@pytest.fixture(scope="module", params=models.CONFIGS)
def parity(request, synth_dirs, tmp_path_factory):
    import reference_logits

    config = request.param
    d = synth_dirs[config]
    ids = models.prompt_ids(PROMPT_LEN)
    model, _ = reference_logits.load_fp32(d)  # mlx_lm.utils.load_model
    ref, ref_greedy = reference_logits.run(model, ids, STEPS)
    experts = router_choices(model, ids)
    dump = tmp_path_factory.mktemp(f"dump-{config}") / "orchid.bin"
    r = run(["generate", "--model", d, "--prompt-ids", ",".join(map(str, ids)), "--max-tokens", STEPS,
             "--ignore-eos", "--dump-logits", dump])
    assert r.returncode == 0, r.stderr
    got_greedy = [int(l) for l in r.stdout.splitlines() if l.strip() and not l.startswith("#")]
    return dict(config=config, ref=ref, ref_greedy=ref_greedy, got=logits_format.read(dump),
                got_greedy=got_greedy, experts=experts, model=model)


def router_choices(model, ids):
    """Distinct experts layer 0's router picks over the prompt (mlx-lm, embeddings in)."""
    import mlx.core as mx

    lm = model.language_model.model
    x = lm.embed_tokens(mx.array([ids]))
    layer = lm.layers[0]
    h = layer.input_layernorm(x)
    moe = layer.mlp
    logits = moe.gate(h)
    k = moe.top_k
    top = np.array(mx.argpartition(-logits, kth=k - 1, axis=-1)[..., :k])
    return set(top.reshape(-1).tolist())


def test_greedy_agrees_with_mlx(parity):
    assert parity["got_greedy"] == parity["ref_greedy"], parity["config"]


def test_logits_agree_with_mlx(parity):
    ref, got = parity["ref"], parity["got"]
    n = min(len(ref), len(got))
    assert n >= PROMPT_LEN
    worst = 0.0
    for a, b in zip(got[:n], ref[:n]):
        assert a.position == b.position and a.token == b.token
        assert np.all(np.isfinite(a.logits))
        worst = max(worst, float(np.linalg.norm(a.logits - b.logits) / np.linalg.norm(b.logits)))
    assert worst <= TOL, f"{parity['config']}: worst relative logit error {worst:.2e}"
    # logits are not degenerate: a real spread, std of a few units
    s = float(np.std(ref[PROMPT_LEN - 1].logits))
    assert 0.3 < s < 20, s


def test_routing_spreads(parity):
    n_exp = {"tiny": 8, "small": 16}[parity["config"]]
    assert len(parity["experts"]) >= n_exp * 3 // 4, (parity["config"], sorted(parity["experts"]))


# --------------------------------------------------------------------------- bench


def bench(model_args, tmp_path, name, extra=()):
    out = tmp_path / f"{name}.json"
    r = run(["bench", *model_args, "--prompt-len", PROMPT_LEN, "--decode-steps", STEPS, "--rounds", 2,
             "--json-out", out, "--copy-mib", 16, "--threads", 2, *extra])
    assert r.returncode == 0, r.stderr
    rows = [l for l in r.stdout.splitlines() if l.strip()]
    assert len(rows) == 1 and rows[0].startswith("| ") and rows[0].endswith(" |"), r.stdout
    return json.loads(out.read_text()), rows[0]


def test_bench_json(tmp_path, synth_dirs):
    d = synth_dirs["tiny"]
    j, row = bench(["--model", d], tmp_path, "a")
    assert j["schema_version"] == 1
    m = j["meta"]
    assert m["engine"] == "orchid" and m["backend"] == "cpu" and m["version"] and m["device"]
    assert "git_sha" in m
    w = j["workload"]
    assert w == {**w, "prompt_len": PROMPT_LEN, "prompt_kind": "u32_golden_ratio_hash_mod_vocab",
                 "decode_steps": STEPS, "rounds": 2}
    res = j["results"]
    p, dec = res["prefill"], res["decode"]
    assert p["wall_secs"] > 0 and p["tok_s"] == pytest.approx(PROMPT_LEN / p["wall_secs"])
    assert dec["wall_secs"] > 0 and dec["tok_s"] == pytest.approx(STEPS / dec["wall_secs"])
    assert len(dec["step_wall_secs"]) == STEPS and all(s > 0 for s in dec["step_wall_secs"])
    steps_round = res["rounds"][dec["steps_from_round"]]
    assert sum(dec["step_wall_secs"]) <= steps_round["decode_wall_secs"] + 1e-6
    assert sum(dec["step_wall_secs"]) >= 0.9 * steps_round["decode_wall_secs"]
    assert len(dec["token_ids"]) == STEPS
    assert re.fullmatch(r"[0-9a-f]{16}", dec["token_digest"])
    assert dec["token_digest"] == fnv1a64_u32(dec["token_ids"])
    assert res["bytes_per_token"] > 0 and res["achieved_gbs"] > 0 and res["copy_gbs"] > 0
    assert res["achieved_gbs"] == pytest.approx(res["bytes_per_token"] * dec["tok_s"] / 1e9)
    assert res["digest_stable"] is True
    assert [r["token_digest"] for r in res["rounds"]] == [dec["token_digest"]] * 2
    assert row.split("|")[1].strip() == str(PROMPT_LEN) and dec["token_digest"] in row

    # the contract's prompt and token stream are exactly orchid generate's
    prompt = golden_prompt(PROMPT_LEN)
    r = run(["generate", "--model", d, "--prompt-ids", ",".join(map(str, prompt)),
             "--max-tokens", STEPS + 1, "--ignore-eos"])
    assert r.returncode == 0, r.stderr
    gen = [int(l) for l in r.stdout.splitlines() if l.strip() and not l.startswith("#")]
    assert gen == [p["first_token_id"]] + dec["token_ids"]

    # a second process: the same digest
    j2, _ = bench(["--model", d], tmp_path, "b")
    assert j2["results"]["decode"]["token_digest"] == dec["token_digest"]


def expected_bytes_per_token(tc, ctx):
    """The documented sum (cmd_bench.c header) from a text_config."""
    H, V, L = tc["hidden_size"], tc["vocab_size"], tc["num_hidden_layers"]
    qd, kvd = tc["num_attention_heads"] * tc["head_dim"], tc["num_key_value_heads"] * tc["head_dim"]
    hv, dk, dv = tc["linear_num_value_heads"], tc["linear_key_head_dim"], tc["linear_value_head_dim"]
    kd, vd = tc["linear_num_key_heads"] * dk, hv * dv
    cd, E, I, Is, k = 2 * kd + vd, tc["num_experts"], tc["moe_intermediate_size"], tc["shared_expert_intermediate_size"], tc["num_experts_per_tok"]

    def q(rows, cols, bits=4):
        return rows * (cols * bits / 8 + cols / 64 * 4)

    w = q(1, H) + q(V, H)
    state = kv = 0.0
    for l in range(L):
        if (l + 1) % 4 == 0:
            w += q(2 * qd, H) + 2 * q(kvd, H) + q(H, qd)
            kv += (ctx + 1) * 2 * kvd * 2
        else:
            w += q(cd, H) + q(vd, H) + 2 * q(hv, H) + q(H, vd)
            state += 2 * 4 * hv * dk * dv + 2 * 4 * 3 * cd
        w += q(E, H, 8) + k * (2 * q(I, H) + q(H, I)) + 2 * q(Is, H) + q(H, Is) + q(1, H, 8)
    return w, state, kv


def test_bench_bytes_per_token(tmp_path, synth_dirs):
    d = synth_dirs["tiny"]
    j, _ = bench(["--model", d], tmp_path, "bpt")
    det = j["results"]["bytes_per_token_detail"]
    ctx = PROMPT_LEN + 1 + (STEPS - 1) / 2
    assert det["mean_context"] == pytest.approx(ctx)
    w, state, kv = expected_bytes_per_token(json.loads((d / "config.json").read_text())["text_config"], ctx)
    assert det["weights"] == pytest.approx(w) and det["gdn_state"] == pytest.approx(state)
    assert det["kv_cache"] == pytest.approx(kv)
    assert j["results"]["bytes_per_token"] == pytest.approx(w + state + kv)
    # the production shape: ~1.66 GB of weights per token, 60 MiB of GDN state (DESIGN.md §1)
    full = {"hidden_size": 2048, "vocab_size": 248320, "num_hidden_layers": 40, "num_attention_heads": 16,
            "head_dim": 256, "num_key_value_heads": 2, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_num_key_heads": 16, "num_experts": 256,
            "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8}
    w, state, _ = expected_bytes_per_token(full, 0)
    assert 1.6e9 < w < 1.75e9, w
    assert state == pytest.approx(2 * 60 * 2**20 + 2 * 4 * 3 * 8192 * 30)  # + the f32 conv state


def test_bench_synth_in_process(tmp_path, synth_dirs):
    # seed 3 written by synth_dirs vs the same seed built by bench itself
    a, _ = bench(["--model", synth_dirs["tiny"]], tmp_path, "m")
    b, _ = bench(["--synth", "tiny", "--seed", 3], tmp_path, "s")
    assert b["meta"]["model"].startswith("synth:tiny")
    assert a["results"]["decode"]["token_digest"] == b["results"]["decode"]["token_digest"]
    assert a["results"]["prefill"]["first_token_id"] == b["results"]["prefill"]["first_token_id"]


@pytest.mark.parametrize("args", [
    ["synth"],
    ["synth", "--out", "/tmp/x-orchid-never"],
    ["synth", "--out", "/tmp/x-orchid-never", "--shape", "huge"],
    ["synth", "--out", "/tmp/x-orchid-never", "--shape", "tiny", "--seed", "-1"],
    ["synth", "--out", "/tmp/x-orchid-never", "--shape", "tiny", "--bogus"],
    ["synth", "--out"],
    ["synth", "--out", "/tmp/x-orchid-never", "--shape", "tiny", "--tokenizer", "/proc/self"],
    ["bench"],
    ["bench", "--model", "/nonexistent-dir", "--prompt-len", "8", "--json-out", "/tmp/x-orchid-never.json"],
    ["bench", "--synth", "tiny", "--json-out", "/tmp/x-orchid-never.json"],
    ["bench", "--synth", "tiny", "--prompt-len", "0", "--json-out", "/tmp/x-orchid-never.json"],
    ["bench", "--synth", "tiny", "--prompt-len", "8"],
    ["bench", "--synth", "tiny", "--prompt-len", "8", "--json-out", "/tmp/x.json", "--rounds", "0"],
    ["bench", "--synth", "tiny", "--prompt-len", "8", "--json-out", "/tmp/x.json", "--backend", "tpu"],
    ["bench", "--synth", "huge", "--prompt-len", "8", "--json-out", "/tmp/x.json"],
    ["bench", "--synth", "tiny", "--model", "/tmp", "--prompt-len", "8", "--json-out", "/tmp/x.json"],
    ["bench", "--synth", "tiny", "--prompt-len", "8", "--json-out", "/tmp/x.json", "--decode-steps", "abc"],
    ["bench", "--synth", "tiny", "--prompt-len", "8", "--json-out", "/tmp/x.json", "--frobnicate", "1"],
])
def test_bad_flags_exit_2(args):
    r = run(args)
    assert r.returncode == 2, (args, r.returncode, r.stderr)
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"orchid {args[0]}: "), r.stderr


@pytest.mark.skipif(not ORCHID_ASAN.exists(), reason="ASan build missing (make asan)")
def test_asan_synth_and_bench(tmp_path, synth_dirs):
    """The ASan/UBSan build writes the same bytes and benches cleanly (in-memory --synth too)."""
    r = run(["synth", "--out", tmp_path / "m", "--shape", "tiny", "--seed", 3, "--quiet"], binary=ORCHID_ASAN)
    assert r.returncode == 0 and "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr
    for f in sorted(synth_dirs["tiny"].glob("model-*.safetensors")):
        assert (tmp_path / "m" / f.name).read_bytes() == f.read_bytes(), f.name
    out = tmp_path / "a.json"
    r = run(["bench", "--synth", "tiny", "--seed", 3, "--prompt-len", 6, "--decode-steps", 3, "--rounds", 2,
             "--json-out", out, "--copy-mib", 8], binary=ORCHID_ASAN)
    assert r.returncode == 0 and "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr
    assert json.loads(out.read_text())["results"]["digest_stable"] is True
