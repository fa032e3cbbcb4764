"""Parity of orchid's CPU path with mlx-lm on the tiny and small test models.

For each config: a 64-token deterministic pseudo-random prompt is run
teacher-forced by both, then 32 greedy tokens are generated.

* Teacher-forced logits: per position relative error ||a - b|| / ||b||
  <= 1e-4 (and so the maximum over positions too). Justification: both sides
  compute in float32 from bit-identical weights (the reference casts the bf16
  scales/biases/norms to float32, an exact conversion), so the only
  differences are float32 summation order and the transcendental functions'
  last bits; measured, they are ~1e-6 (median) to ~1e-5 (worst decode step
  of tiny). Any real mistake (an eps form, RoPE pairing, head grouping, gate,
  a missed bf16 rounding) moves the logits by >= 1e-3, so 1e-4 separates the
  two with a 10x margin on each side.
* The 32-token greedy continuation must be identical, and orchid's decode
  records (one per generated token fed back) must match the reference's
  records at the same positions to the same tolerance.
"""

import subprocess

import numpy as np
import pytest

import models
from models import ORCHID, ORCHID_ASAN, logits_format, model_dir

PROMPT_LEN = 64
STEPS = 32
TOL = 1e-4

pytestmark = pytest.mark.skipif(
    not ORCHID.exists(), reason=f"{ORCHID} not built (run make)"
)


def run_orchid(d, ids, steps, dump, binary=ORCHID):
    cmd = [str(binary), "generate", "--model", str(d), "--prompt-ids",
           ",".join(map(str, ids)), "--max-tokens", str(steps), "--ignore-eos",
           "--dump-logits", str(dump)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                       env=models.sanitizer_env())
    assert "Sanitizer" not in r.stderr and "runtime error:" not in r.stderr, r.stderr[-3000:]
    assert r.returncode == 0, f"{' '.join(cmd[:4])} ... failed ({r.returncode}): {r.stderr[-2000:]}"
    lines = [l for l in r.stdout.splitlines() if l.strip()]
    assert lines and lines[-1].startswith("#"), r.stdout[-500:]
    ids_out = [int(l) for l in lines if not l.startswith("#")]
    return ids_out, logits_format.read(dump), lines[-1]


@pytest.fixture(scope="module", params=models.CONFIGS)
def parity(request, tmp_path_factory):
    config = request.param
    d = model_dir(config)
    ids = models.prompt_ids(PROMPT_LEN)
    ref, ref_greedy = models.reference(config, ids, STEPS)
    dump = tmp_path_factory.mktemp(config) / "orchid.bin"
    got_greedy, got, summary = run_orchid(d, ids, STEPS, dump)
    return dict(config=config, ids=ids, ref=ref, ref_greedy=ref_greedy,
                got=got, got_greedy=got_greedy, summary=summary)


def _rel(a, b):
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b.astype(np.float64)))


def test_teacher_forced_logits(parity):
    ref, got, ids = parity["ref"], parity["got"], parity["ids"]
    assert len(got) >= PROMPT_LEN
    rels = []
    for p in range(PROMPT_LEN):
        a, b = got[p], ref[p]
        assert (a.position, a.token) == (p, ids[p])
        assert a.logits.shape == b.logits.shape
        assert np.all(np.isfinite(a.logits)), f"non-finite logits at position {p}"
        rels.append(_rel(a.logits, b.logits))
    rels = np.array(rels)
    worst = int(rels.argmax())
    print(f"{parity['config']}: teacher-forced rel err median {np.median(rels):.2e} "
          f"max {rels.max():.2e} (position {worst})")
    assert rels.max() <= TOL, (
        f"{parity['config']}: relative error {rels.max():.3e} at position {worst} "
        f"(median {np.median(rels):.2e}); {int((rels > TOL).sum())} positions over {TOL}")


def test_greedy_continuation(parity):
    got, want = parity["got_greedy"], parity["ref_greedy"]
    assert len(got) == STEPS, parity["summary"]
    if got != want:
        i = next(k for k in range(STEPS) if got[k] != want[k])
        lg = parity["ref"][PROMPT_LEN - 1 + i].logits
        top = np.sort(lg)[-2:]
        pytest.fail(f"{parity['config']}: greedy differs at step {i}: orchid {got[i]} "
                    f"mlx-lm {want[i]} (reference top-2 gap {top[1] - top[0]:.3e})")


def test_decode_step_logits(parity):
    ref = {r.position: r for r in parity["ref"]}
    dec = [r for r in parity["got"][PROMPT_LEN:]]
    # orchid feeds back every generated token but the last: STEPS - 1 records
    assert len(dec) >= STEPS - 1, f"only {len(dec)} decode records"
    rels = []
    for r in dec:
        b = ref[r.position]
        assert r.token == b.token, f"position {r.position}: fed {r.token}, reference fed {b.token}"
        rels.append(_rel(r.logits, b.logits))
    print(f"{parity['config']}: decode rel err max {max(rels):.2e}")
    assert max(rels) <= TOL, f"{parity['config']}: decode relative error {max(rels):.3e}"


@pytest.mark.skipif(not ORCHID_ASAN.exists(), reason=f"{ORCHID_ASAN} not built (make asan)")
def test_asan_build_generate_tiny(tmp_path):
    """The ASan/UBSan build runs prefill + decode cleanly and agrees too."""
    ids = models.prompt_ids(PROMPT_LEN)[:8]
    got_greedy, got, _ = run_orchid(model_dir("tiny"), ids, 3, tmp_path / "a.bin", ORCHID_ASAN)
    short, short_greedy = models.reference("tiny", ids, 3)
    assert got_greedy == short_greedy
    for a, b in zip(got, short):
        assert (a.position, a.token) == (b.position, b.token)
        assert _rel(a.logits, b.logits) <= TOL
