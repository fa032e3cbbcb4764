"""Strict, fail-closed loading: broken copies of the tiny test model.

Each case corrupts a private copy of .cache/models/tiny-0 one way and runs
`orchid info --model DIR` (and the ASan/UBSan build, build/asan/orchid, when
it exists). Expected: a non-zero exit status that is not a signal, exactly one
non-empty line on stderr naming the offending file and (where there is one)
tensor, and no sanitizer report. The intact copy must load (exit 0).
"""

import json
import shutil
import struct
import subprocess

import numpy as np
import pytest

import models
from models import ORCHID, ORCHID_ASAN

BINARIES = [pytest.param(b, id=label)
            for label, b in (("orchid", ORCHID), ("asan", ORCHID_ASAN)) if b.exists()]
SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "UndefinedBehaviorSanitizer",
                   "runtime error:", "SUMMARY:")

pytestmark = pytest.mark.skipif(not ORCHID.exists(), reason=f"{ORCHID} not built (run make)")

LN0 = "language_model.model.layers.0.input_layernorm.weight"
UP0 = "language_model.model.layers.0.mlp.shared_expert.up_proj"
GATE0 = "language_model.model.layers.0.mlp.gate"


# --- helpers to edit a checkpoint ---------------------------------------------------

def shard_of(d, tensor):
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    return idx["weight_map"][tensor]


def read_st(path):
    raw = path.read_bytes()
    (n,) = struct.unpack_from("<Q", raw, 0)
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(path, header, data):
    """Re-serialise a safetensors file (header padded to 8 bytes like MLX)."""
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + data)


def edit_header(path, fn):
    h, data = read_st(path)
    fn(h)
    write_st(path, h, data)


def edit_config(d, fn):
    cfg = json.loads((d / "config.json").read_text())
    fn(cfg)
    (d / "config.json").write_text(json.dumps(cfg, indent=4))


def add_tensor(path, name, dtype, shape, payload):
    """Add (or re-point) `name` at new bytes appended to the file."""
    h, data = read_st(path)
    b = len(data)
    h[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [b, b + len(payload)]}
    write_st(path, h, data + payload)


def index_add(d, name, shard):
    p = d / "model.safetensors.index.json"
    idx = json.loads(p.read_text())
    idx["weight_map"][name] = shard
    p.write_text(json.dumps(idx, indent=4))


# --- the cases: each returns (file named in the message, tensor or None) ------------

def missing_config(d):
    (d / "config.json").unlink()
    return "config.json", None


def missing_shard(d):
    s = shard_of(d, LN0)
    (d / s).unlink()
    return s, None


def truncated_shard(d):
    s = shard_of(d, LN0)
    p = d / s
    with open(p, "r+b") as f:
        f.truncate(p.stat().st_size // 2)
    return s, None


def header_past_eof(d):
    s = shard_of(d, LN0)
    p = d / s
    with open(p, "r+b") as f:
        f.write(struct.pack("<Q", p.stat().st_size + 4096))
    return s, None


def header_invalid_json(d):
    s = shard_of(d, LN0)
    p = d / s
    raw = bytearray(p.read_bytes())
    raw[8] = ord("x")  # the header's opening '{'
    p.write_bytes(bytes(raw))
    return s, None


def wrong_dtype(d):
    s = shard_of(d, LN0)
    edit_header(d / s, lambda h: h[LN0].update(dtype="F16"))  # same size, wrong type
    return s, LN0


def wrong_shape(d):
    s = shard_of(d, LN0)
    edit_header(d / s, lambda h: h[LN0].update(shape=[h[LN0]["shape"][0] // 2, 2]))
    return s, LN0


def wrong_shape_quantized(d):
    name = UP0 + ".weight"
    s = shard_of(d, name)

    def f(h):
        o, i = h[name]["shape"]
        h[name]["shape"] = [o // 2, i * 2]  # same bytes, wrong [out, in]
    edit_header(d / s, f)
    return s, name


def unknown_tensor(d):
    name = "language_model.model.layers.0.mlp.bogus.weight"
    s = shard_of(d, LN0)
    add_tensor(d / s, name, "BF16", (128,), b"\0" * 256)
    index_add(d, name, s)
    return s, name


def missing_tensor(d):
    s = shard_of(d, LN0)
    edit_header(d / s, lambda h: h.pop(LN0))
    p = d / "model.safetensors.index.json"
    idx = json.loads(p.read_text())
    idx["weight_map"].pop(LN0)
    p.write_text(json.dumps(idx, indent=4))
    return None, LN0


def unsupported_bits(d):
    """shared_expert.up_proj re-quantized at 2 bits, recorded in the config the
    way mlx-lm records a per-module override: a well-formed MLX checkpoint
    that orchid does not support."""
    import mlx.core as mx

    s = shard_of(d, UP0 + ".weight")
    h, _ = read_st(d / s)
    out_dim, in_dim = h[UP0 + ".scales"]["shape"][0], h[UP0 + ".scales"]["shape"][1] * 64
    w = mx.array(np.random.default_rng(0).standard_normal((out_dim, in_dim)).astype(np.float32) * 0.05)
    wq, sc, bi = mx.quantize(w.astype(mx.bfloat16), group_size=64, bits=2)
    for suffix, arr, dt in ((".weight", wq, "U32"), (".scales", sc, "BF16"), (".biases", bi, "BF16")):
        a = np.array(arr.view(mx.uint16) if dt == "BF16" else arr)
        add_tensor(d / s, UP0 + suffix, dt, a.shape, a.tobytes())

    def f(cfg):
        for k in ("quantization", "quantization_config"):
            cfg[k][UP0] = {"group_size": 64, "bits": 2}
    edit_config(d, f)
    return None, UP0


def config_bits_mismatch(d):
    """The config claims 3 bits for the router; the tensors are 8-bit."""
    def f(cfg):
        for k in ("quantization", "quantization_config"):
            cfg[k][GATE0] = {"group_size": 64, "bits": 3}
    edit_config(d, f)
    return None, GATE0


def quantization_block_missing(d):
    edit_config(d, lambda cfg: [cfg.pop("quantization"), cfg.pop("quantization_config")])
    return "config.json", None


def offsets_past_end(d):
    s = shard_of(d, LN0)

    def f(h):
        b, e = h[LN0]["data_offsets"]
        size = e - b
        h[LN0]["data_offsets"] = [b + (1 << 40), b + (1 << 40) + size]
    edit_header(d / s, f)
    return s, LN0


def index_names_wrong_shard(d):
    p = d / "model.safetensors.index.json"
    idx = json.loads(p.read_text())
    wrong = next(s for s in sorted(set(idx["weight_map"].values())) if s != idx["weight_map"][LN0])
    idx["weight_map"][LN0] = wrong
    p.write_text(json.dumps(idx, indent=4))
    return "model.safetensors.index.json", LN0


def duplicate_tensor(d):
    s = shard_of(d, LN0)
    other = next(x for x in sorted(p.name for p in d.glob("*.safetensors")) if x != s)
    h, data = read_st(d / s)
    b, e = h[LN0]["data_offsets"]
    add_tensor(d / other, LN0, h[LN0]["dtype"], h[LN0]["shape"], data[b:e])
    return other, LN0


def index_missing(d):
    (d / "model.safetensors.index.json").unlink()
    return "model.safetensors.index.json", None


CASES = [missing_config, missing_shard, truncated_shard, header_past_eof,
         header_invalid_json, wrong_dtype, wrong_shape, wrong_shape_quantized,
         unknown_tensor, missing_tensor, unsupported_bits, config_bits_mismatch,
         quantization_block_missing, offsets_past_end, index_names_wrong_shard,
         duplicate_tensor, index_missing]


@pytest.fixture(scope="module")
def tiny():
    return models.model_dir("tiny")


def run_info(binary, d):
    return subprocess.run([str(binary), "info", "--model", str(d)],
                          capture_output=True, text=True, timeout=120, env=models.sanitizer_env())


@pytest.mark.parametrize("binary", BINARIES)
def test_intact_copy_loads(binary, tiny, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(tiny, d)
    r = run_info(binary, d)
    assert r.returncode == 0, r.stderr
    assert not any(m in r.stderr for m in SANITIZER_MARKS), r.stderr


@pytest.mark.parametrize("binary", BINARIES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.__name__)
def test_broken_checkpoint_fails_cleanly(case, binary, tiny, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(tiny, d)
    file, tensor = case(d)
    r = run_info(binary, d)
    err = r.stderr
    assert not any(m in err for m in SANITIZER_MARKS), f"sanitizer report:\n{err[-3000:]}"
    assert r.returncode > 0, f"exit {r.returncode} (negative = signal); stderr:\n{err[-2000:]}"
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, f"want one stderr line, got {len(lines)}:\n{err[-2000:]}"
    if file is not None:
        assert file in lines[0], f"message does not name {file}: {lines[0]}"
    if tensor is not None:
        assert tensor in lines[0], f"message does not name {tensor}: {lines[0]}"
