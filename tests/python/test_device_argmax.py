"""The scheduler's argmax-only rows (issue 6): a plain greedy request (temperature 0 or
top_k 1; no logprobs, no penalties) takes the model's argmax and no logits row is
copied to the host; every other request samples its row as before. The tokens must be
the ones the host sampler picks: outputs are identical with the path on and forced off
(ORCHID_NO_DEVICE_ARGMAX=1), also when greedy, logprobs, penalised and seeded sampling
requests share a batch, and orchid_argmax_only_tokens_total counts exactly the plain
greedy requests' tokens. The mock model first (exact, ties included: its noise logits
repeat values), then the tiny real model on the CPU engine, where the same requests sent
all at once (sharing batches) must also give what each gave alone.
"""


from models import model_dir
from serverproc import MODEL, Server, run_together

NOTHINK = {"chat_template_kwargs": {"enable_thinking": False}}
METRIC = "orchid_argmax_only_tokens_total"

# name -> (prompt, request fields, takes the argmax-only path)
MIX = {
    "noise": ("tell me something", dict(temperature=0, max_tokens=40), True),
    "noise_lp": ("tell me something", dict(temperature=0, max_tokens=40, logprobs=True, top_logprobs=3), False),
    "script": ("SCRIPT:the quick brown fox", dict(temperature=0, max_tokens=64), True),
    "topk1": ("another prompt", dict(temperature=0.9, top_k=1, max_tokens=30), True),
    "penalty": ("tell me something", dict(temperature=0, presence_penalty=1.5, max_tokens=40), False),
    "sampled": ("tell me something", dict(temperature=0.8, seed=5, max_tokens=40), False),
    "noise2": ("a third prompt", dict(temperature=0, max_tokens=25), True),
}


def ask(client, prompt, fields):
    kw = dict(fields)
    extra = dict(NOTHINK)
    if "top_k" in kw:
        extra["top_k"] = kw.pop("top_k")
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                          extra_body=extra, **kw)


def run_concurrently(srv, names):
    """All requests at once (one batch while they overlap); name -> response."""
    return run_together({n: (lambda n=n: ask(srv.client(timeout=120), MIX[n][0], MIX[n][1])) for n in names})


def check_logprobs(r):
    ch = r.choices[0]
    assert ch.logprobs and ch.logprobs.content, "logprobs missing"
    assert len(ch.logprobs.content) >= r.usage.completion_tokens - 1
    for e in ch.logprobs.content:
        assert len(e.top_logprobs) == 3
        # greedy: the chosen token is the most likely one
        assert e.top_logprobs[0].logprob == e.logprob


def lp_values(r):
    return [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in r.choices[0].logprobs.content]


def summary(out):
    return {n: (r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens)
            for n, r in out.items()}


def test_mock_mixed_batch_identical_on_and_off():
    results, counted = {}, {}
    for mode, env in (("on", {}), ("off", {"ORCHID_NO_DEVICE_ARGMAX": "1"})):
        env = dict(env, ORCHID_MOCK_STEP_MS="10")
        with Server(mock=True, args=["--parallel", "8", "--quiet"], env=env) as srv:
            out = run_concurrently(srv, list(MIX))
            counted[mode] = srv.metric(METRIC)
            if mode == "off":
                assert "ORCHID_NO_DEVICE_ARGMAX" in srv.log()
        check_logprobs(out["noise_lp"])
        # within one run: the argmax-only request and the host-sampled greedy one agree
        assert out["noise"].choices[0].message.content == out["noise_lp"].choices[0].message.content
        assert out["script"].choices[0].message.content == "the quick brown fox"
        results[mode] = summary(out)
    assert results["on"] == results["off"]
    want = sum(results["on"][n][2] for n, (_, _, fast) in MIX.items() if fast)
    assert counted["on"] == want > 0
    assert counted["off"] == 0


def test_mock_streaming_greedy_uses_argmax():
    with Server(mock=True, args=["--parallel", "2", "--quiet"]) as srv:
        client = srv.client()
        chunks = list(client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "SCRIPT:streamed é世"}], temperature=0,
            max_tokens=50, stream=True, stream_options={"include_usage": True}, extra_body=NOTHINK))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "streamed é世"
        assert srv.metric(METRIC) == chunks[-1].usage.completion_tokens


def test_tiny_model_greedy_identical_on_and_off():
    prompts = ["Hello", "Count to three", "Write a word"]
    res = {}
    for mode, env in (("on", {}), ("off", {"ORCHID_NO_DEVICE_ARGMAX": "1"})):
        with Server(mock=False, model=model_dir("tiny"), args=["--max-seq", "512", "--parallel", "4", "--quiet", "--backend", "cpu"],
                    env=env) as srv:
            client = srv.client(timeout=120)
            # one at a time: each request alone in its batch
            greedy = [ask(client, p, dict(temperature=0, max_tokens=8)) for p in prompts]
            lps = [ask(client, p, dict(temperature=0, max_tokens=8, logprobs=True, top_logprobs=3))
                   for p in prompts[:2]]
            for lp, g in zip(lps, greedy):
                check_logprobs(lp)
                assert lp.choices[0].message.content == g.choices[0].message.content
            n_fast = srv.metric(METRIC)
            # the same requests all at once, with logprobs ones: prefills of different lengths
            # and decode steps share batches, and the CPU engine's rows are batch-invariant
            # (issue 6), so every greedy output is the one the request got alone
            jobs = [(f"g{i}", p, dict(temperature=0, max_tokens=8)) for i, p in enumerate(prompts)]
            jobs += [(f"lp{i}", p, dict(temperature=0, max_tokens=8, logprobs=True, top_logprobs=3))
                     for i, p in enumerate(prompts[:2])]
            both = run_together({name: (lambda p=p, f=f: ask(srv.client(timeout=120), p, f)) for name, p, f in jobs})
            assert set(both) == {name for name, _, _ in jobs}
            for i, alone in enumerate(greedy):
                want = (alone.choices[0].message.content, alone.usage.completion_tokens)
                assert (both[f"g{i}"].choices[0].message.content, both[f"g{i}"].usage.completion_tokens) == want
                if f"lp{i}" in both:
                    check_logprobs(both[f"lp{i}"])
                    assert both[f"lp{i}"].choices[0].message.content == want[0]
                    # the logprobs too, to the printed digit
                    assert lp_values(both[f"lp{i}"]) == lp_values(lps[i])
            res[mode] = ([(r.choices[0].message.content, r.usage.completion_tokens) for r in greedy], n_fast)
    assert res["on"][0] == res["off"][0]
    assert res["on"][1] == sum(n for _, n in res["on"][0]) > 0
    assert res["off"][1] == 0
