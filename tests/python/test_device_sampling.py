"""Sampled requests drawn by the device sampler (model/device_sampling.h): a request that
samples without penalties, logit_bias or logprobs has its token drawn where the logits are
(on CUDA, cuda_sample.cu) and only an id comes back. The mock model stands in for a device
backend here (ORCHID_MOCK_DEVICE_SAMPLING=1: it draws with the sampler's host reference), so
the scheduler's side is tested without a GPU: seeded requests repeat, alone or sharing a
batch with greedy, logprobs and penalised ones; those others keep their paths (the greedy
argmax, the host sampler) and give what they give without the device sampler;
orchid_device_sampled_tokens_total counts exactly the device-drawn tokens; a script the
model is sure of (logit 15 against < 4) is followed at temperature 1 with top_p 0.9; and
ORCHID_NO_DEVICE_SAMPLING=1 puts every sampled token back on the host sampler.
"""

from serverproc import MODEL, Server, run_together

NOTHINK = {"chat_template_kwargs": {"enable_thinking": False}}
DEVICE = "orchid_device_sampled_tokens_total"
ARGMAX = "orchid_argmax_only_tokens_total"
ON = {"ORCHID_MOCK_DEVICE_SAMPLING": "1", "ORCHID_MOCK_STEP_MS": "5"}

# name -> (prompt, request fields, drawn by the device sampler)
MIX = {
    "t08": ("tell me something", dict(temperature=0.8, seed=5, max_tokens=40), True),
    "t13_topk": ("another prompt", dict(temperature=1.3, seed=11, top_k=20, max_tokens=30), True),
    "topp_minp": ("a third prompt", dict(temperature=1.0, seed=3, top_p=0.7, min_p=0.05, max_tokens=30), True),
    "greedy": ("tell me something", dict(temperature=0, max_tokens=40), False),
    "sampled_lp": ("tell me something", dict(temperature=0.8, seed=5, max_tokens=40, logprobs=True, top_logprobs=2),
                   False),
    "penalised": ("tell me something", dict(temperature=0.8, seed=5, presence_penalty=0.5, max_tokens=40), False),
}


def ask(client, prompt, fields):
    kw = dict(fields)
    extra = dict(NOTHINK)
    for k in ("top_k", "min_p"):
        if k in kw:
            extra[k] = kw.pop(k)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                          extra_body=extra, **kw)


def texts(out):
    return {n: (r.choices[0].message.content, r.usage.completion_tokens) for n, r in out.items()}


def test_mock_device_sampling_repeats_and_counts():
    with Server(mock=True, args=["--parallel", "8", "--quiet"], env=ON) as srv:
        client = srv.client(timeout=120)
        alone = {n: ask(client, p, f) for n, (p, f, _) in MIX.items()}
        counted_alone = srv.metric(DEVICE)
        together = run_together({n: (lambda n=n: ask(srv.client(timeout=120), MIX[n][0], MIX[n][1])) for n in MIX})
        counted = srv.metric(DEVICE) - counted_alone
    # seeded: the same text alone and sharing batches
    assert texts(alone) == texts(together)
    want = sum(alone[n].usage.completion_tokens for n, (_, _, dev) in MIX.items() if dev)
    assert counted_alone == counted == want > 0
    # sampled text is noise here: the mock's noise logits are < 4 apart, so at these
    # temperatures the draws wander and differ from the greedy text
    assert alone["t08"].choices[0].message.content != alone["greedy"].choices[0].message.content


def test_mock_other_paths_unchanged_and_off_switch():
    res, counts = {}, {}
    for mode, env in (("on", ON), ("off", dict(ON, ORCHID_NO_DEVICE_SAMPLING="1"))):
        with Server(mock=True, args=["--parallel", "4", "--quiet"], env=env) as srv:
            client = srv.client(timeout=120)
            res[mode] = texts({n: ask(client, p, f) for n, (p, f, dev) in MIX.items() if not dev})
            dev = ask(client, *MIX["t08"][:2])
            counts[mode] = (srv.metric(DEVICE), srv.metric(ARGMAX), dev.usage.completion_tokens)
            if mode == "off":
                assert "ORCHID_NO_DEVICE_SAMPLING" in srv.log()
    assert res["on"] == res["off"]
    assert counts["on"][0] == counts["on"][2] > 0
    assert counts["off"][0] == 0
    assert counts["on"][1] == counts["off"][1] == res["on"]["greedy"][1]


def test_mock_device_sampling_follows_a_sure_script():
    with Server(mock=True, args=["--parallel", "2", "--quiet"], env=ON) as srv:
        client = srv.client(timeout=60)
        for seed in (1, 2, 3):
            r = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "SCRIPT:the quick brown fox"}], temperature=1.0,
                top_p=0.9, seed=seed, max_tokens=64, extra_body=NOTHINK)
            assert r.choices[0].message.content == "the quick brown fox"
        assert srv.metric(DEVICE) > 0


def test_mock_without_device_sampler_keeps_host_sampling():
    # the mock without the switch reports no device sampler: sampled requests still work
    with Server(mock=True, args=["--parallel", "2", "--quiet"]) as srv:
        r = ask(srv.client(timeout=60), *MIX["t08"][:2])
        assert r.usage.completion_tokens > 0
        assert srv.metric(DEVICE) == 0
