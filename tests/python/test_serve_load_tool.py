"""bench/serve_load.py, the load test behind issue 6's numbers: its summary of a level
(the all-decoding span and rate, the first tokens' spread) on hand-made timelines, and a
whole small sweep against the mock server, whose step time is fixed (ORCHID_MOCK_STEP_MS),
so the scheduler's step split that the sweep reads from /metrics can be checked."""

import importlib.util
import json
import math
import subprocess
import sys

from serverproc import REPO, Server

spec = importlib.util.spec_from_file_location("serve_load", REPO / "bench" / "serve_load.py")
serve_load = importlib.util.module_from_spec(spec)
spec.loader.exec_module(serve_load)


def req(chunks, tokens=None, t_send=0.0):
    return {"t_send": t_send, "chunks": chunks, "completion_tokens": tokens if tokens is not None else len(chunks),
            "error": None, "finish_reason": "length", "t_end": chunks[-1]}


def test_summary_spans():
    # two requests: one streams at 1.0 .. 1.9, the other starts later (its prompt was still
    # being prefilled) and streams at 1.5 .. 2.4; both decode in (1.5, 1.9]
    a = req([1.0 + 0.1 * i for i in range(10)])
    b = req([1.5 + 0.1 * i for i in range(10)])
    s = serve_load.summarize([a, b], wall=2.5)
    assert s["completion_tokens"] == 20
    assert math.isclose(s["agg_decode_tok_s"], 20 / 1.4)
    assert math.isclose(s["first_token_spread_s"], 0.5)
    assert math.isclose(s["all_decoding_s"], 0.4)
    # in (1.5, 1.9]: a's 1.6, 1.7, 1.8, 1.9 and b's 1.6 .. 1.9 (b's first token at 1.5 is the span's start)
    assert math.isclose(s["all_decoding_tok_s"], 8 / 0.4)
    assert math.isclose(s["itl_mean_ms"], 100.0) and math.isclose(s["itl_max_ms"], 100.0)
    # chunks that carry two tokens each count twice
    s2 = serve_load.summarize([req(a["chunks"], 20), req(b["chunks"], 20)], wall=2.5)
    assert math.isclose(s2["all_decoding_tok_s"], 16 / 0.4)
    assert math.isclose(s2["itl_mean_ms"], 50.0)
    # no span in which both decode: no rate, not a negative one
    c = req([3.0, 3.1])
    s3 = serve_load.summarize([a, c], wall=3.2)
    assert s3["all_decoding_s"] < 0 and math.isnan(s3["all_decoding_tok_s"])


def test_sched_delta():
    k = serve_load.SCHED
    before = {k[0]: 10, k[1]: 1.0, k[2]: 0.5}
    after = {k[0]: 30, k[1]: 1.2, k[2]: 0.52}
    d = serve_load.sched_delta(before, after)
    assert d["sched_steps"] == 20
    assert math.isclose(d["sched_forward_ms"], 10.0) and math.isclose(d["sched_host_ms"], 1.0)
    assert math.isclose(d["sched_step_ms"], 11.0)
    assert serve_load.sched_delta({}, after) == {} and serve_load.sched_delta(after, after) == {}


def test_sweep_on_mock(tmp_path):
    # fixed 20 ms forwards: 4 streams of 24-token prompts (one prefill step: the mock's
    # prompt budget is the server's --prefill-chunk) and 12 tokens each
    with Server(mock=True, env={"ORCHID_MOCK_STEP_MS": "20"}, args=["--parallel", "4", "--quiet"]) as srv:
        out = tmp_path / "load.json"
        r = subprocess.run([sys.executable, str(REPO / "bench" / "serve_load.py"), "--url", srv.url, "--levels", "1,4",
                            "--prompt-tokens", "24", "--gen-tokens", "12", "--vocab-lo", "0", "--vocab-hi", "250",
                            "--skip", "replay,serial", "--json", str(out)],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        got = json.loads(out.read_text())["batched"]
    for n in ("1", "4"):
        lv = got[n]
        assert lv["n_errors"] == 0 and lv["completion_tokens"] == 12 * int(n), lv
        # a step a token (the first with the prompt), each one forward of >= 20 ms plus the
        # host's share; the sweep reads /metrics 0.1 s after the level, when every step is counted
        assert 12 <= lv["sched_steps"] <= 12 * int(n), lv
        assert lv["sched_forward_ms"] >= 20.0 and 0.0 <= lv["sched_host_ms"] < lv["sched_forward_ms"], lv
        assert math.isclose(lv["sched_step_ms"], lv["sched_forward_ms"] + lv["sched_host_ms"])
        # no level outruns its steps: a token a stream a >= 20 ms step
        assert lv["all_decoding_tok_s"] <= int(n) / 0.020 * 1.05, lv
    assert "| 4 |" in r.stdout


def test_fanout_part_on_mock(tmp_path):
    # the mock has no prefix cache: every request of the fan-out prefills (cached 0); the
    # part's shape is what is checked here (the cache's effect: test_prefix_cache_server.py)
    with Server(mock=True, args=["--parallel", "4", "--quiet"]) as srv:
        out = tmp_path / "fanout.json"
        r = subprocess.run([sys.executable, str(REPO / "bench" / "serve_load.py"), "--url", srv.url, "--fanout", "3",
                            "--system-tokens", "64", "--turn-gen", "4", "--skip", "sweep,serial,replay,nocache",
                            "--json", str(out)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
    fo = json.loads(out.read_text())["fanout"]
    assert fo["requests"] == 3 and fo["ok"] == 3 and fo["errors"] == [], fo
    assert fo["cached"] == [0, 0, 0] and fo["prompt_tokens"] > 64
    assert 0 < fo["ttft_p50_s"] <= fo["ttft_max_s"] <= fo["wall_s"], fo
    assert "| 3 |" in r.stdout
