"""Shared helpers of the Python tests: test models, mlx-lm references, binaries.

    from models import model_dir, prompt_ids, reference, ORCHID, ORCHID_ASAN

model_dir(config, seed=0) returns .cache/models/<config>-<seed>, building it
with tools/make_test_model.py when it is missing or was made by a different
version of the generator (a stamp file records a hash of the generator and
the mlx / mlx-lm versions). Builds go to a temporary directory first and are
renamed into place, under a file lock, so an interrupted or concurrent build
never leaves a half-written model behind.

reference(config, ids, steps) returns (records, greedy) from
tools/reference_logits.py for that model and prompt, cached in .cache/ref/.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools"
CACHE = REPO / ".cache"
MODELS = CACHE / "models"
REFS = CACHE / "ref"
# The binaries under test; ORCHID_BIN / ORCHID_ASAN_BIN override the paths.
ORCHID = Path(os.environ.get("ORCHID_BIN", REPO / "build" / "orchid"))
ORCHID_ASAN = Path(os.environ.get("ORCHID_ASAN_BIN", REPO / "build" / "asan" / "orchid"))
STAMP = ".orchid-test-model.json"

if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

import logits_format  # noqa: E402
import make_test_model  # noqa: E402

VOCAB = make_test_model.VOCAB
CONFIGS = tuple(make_test_model.CONFIGS)


def _versions():
    import mlx.core as mx
    import mlx_lm

    return {"mlx": mx.__version__, "mlx_lm": mlx_lm.__version__}


def _stamp(config, seed):
    src = (TOOLS / "make_test_model.py").read_bytes()
    return {
        "config": config,
        "seed": seed,
        "generator_sha256": hashlib.sha256(src).hexdigest(),
        **_versions(),
    }


@contextlib.contextmanager
def _lock(name):
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _sync_tokenizer(d):
    """Copy tokenizer files made after the model was built (no network)."""
    tok = CACHE / "tokenizer"
    if (tok / "tokenizer.json").exists() and not (d / "tokenizer.json").exists():
        for p in tok.iterdir():
            if p.is_file() and (p.name.startswith("tokenizer") or p.name == "chat_template.jinja"):
                shutil.copy(p, d / p.name)


def model_dir(config, seed=0):
    """Path of the cached test model `config` (tiny|small), built if needed."""
    if config not in make_test_model.CONFIGS:
        raise ValueError(f"unknown test model config {config!r}")
    d = MODELS / f"{config}-{seed}"
    want = _stamp(config, seed)
    with _lock("models"):
        try:
            have = json.loads((d / STAMP).read_text())
        except (OSError, ValueError):
            have = None
        if have != want:
            MODELS.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{config}-{seed}.", dir=MODELS))
            try:
                with contextlib.redirect_stdout(sys.stderr):
                    make_test_model.build(config, tmp, seed)
                (tmp / STAMP).write_text(json.dumps(want))
                if d.exists():
                    shutil.rmtree(d)
                os.rename(tmp, d)
                # references of the previous build are stale now
                shutil.rmtree(REFS / f"{config}-{seed}", ignore_errors=True)
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
        _sync_tokenizer(d)
    return d


def sanitizer_env():
    """Environment for running a binary: sanitizer reports fail loudly."""
    env = dict(os.environ)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    return env


def copy_model(config, dst, seed=0):
    """A private, writable copy of a test model (for corrupting it)."""
    src = model_dir(config, seed)
    shutil.copytree(src, dst)
    return Path(dst)


def prompt_ids(n, seed=0):
    """n deterministic pseudo-random token ids in the base vocabulary."""
    rng = np.random.default_rng(1000 + seed)
    return [int(t) for t in rng.integers(0, 248044, size=n)]


def reference(config, ids, steps, seed=0):
    """mlx-lm's (records, greedy) for the model, prompt and decode steps.

    Cached in .cache/ref/<config>-<seed>/ keyed by the model stamp, prompt and
    steps; the directory is emptied whenever the model is rebuilt."""
    d = model_dir(config, seed)
    key = hashlib.sha256(
        json.dumps([(d / STAMP).read_text(), list(map(int, ids)), int(steps)]).encode()
    ).hexdigest()[:24]
    rd = REFS / f"{config}-{seed}"
    rd.mkdir(parents=True, exist_ok=True)
    dump, meta = rd / f"{key}.bin", rd / f"{key}.json"
    with _lock("ref"):
        if dump.exists() and meta.exists():
            return logits_format.read(dump), json.loads(meta.read_text())["greedy"]
        import reference_logits

        model, _ = reference_logits.load_fp32(d)
        records, greedy = reference_logits.run(model, ids, steps)
        tmp = dump.with_suffix(".tmp")
        logits_format.write(tmp, records)
        os.replace(tmp, dump)
        meta.write_text(json.dumps({"greedy": greedy, "prompt": list(ids), "steps": steps}))
        return records, greedy


def read_safetensors_header(path):
    """(header dict without __metadata__, metadata dict, data offset)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    meta = h.pop("__metadata__", {})
    return h, meta, 8 + n


def checkpoint_tensors(d):
    """{tensor name: (shard file name, dtype, shape)} over every shard of d."""
    d = Path(d)
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    out = {}
    for shard in sorted(set(idx["weight_map"].values())):
        h, _, _ = read_safetensors_header(d / shard)
        for k, v in h.items():
            out[k] = (shard, v["dtype"], tuple(v["shape"]))
    return out
