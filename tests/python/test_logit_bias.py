"""logit_bias (OpenAI semantics) through `orchid serve` with the official openai client.

A map of token ids (string keys) to a bias in [-100, 100] that the sampler adds to the
model's logits before anything else (logprobs included, so they describe the biased
distribution); +100 forces a token, -100 bans it. A greedy request with a bias must not
take the argmax-only path (the scheduler would skip the bias). Bad maps are 400s whose
`param` is logit_bias. First the scripted mock model (its byte vocabulary: id = byte,
256 = <|im_end|>, 264 ids), then the tiny real model on the CPU engine.
"""

import math

import openai
import pytest

from models import model_dir
from serverproc import MODEL, Server, run_together

NOTHINK = {"chat_template_kwargs": {"enable_thinking": False}}
ARGMAX = "orchid_argmax_only_tokens_total"
IM_END = 256


@pytest.fixture(scope="module")
def srv():
    with Server(mock=True, args=["--parallel", "4", "--quiet"]) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return srv.client()


def chat(client, content, bias=None, **kw):
    kw.setdefault("max_tokens", 8)
    kw.setdefault("temperature", 0)
    if bias is not None:
        kw["logit_bias"] = bias
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}],
                                          extra_body=NOTHINK, **kw)


# ---- mock model ----

def test_plus_100_forces_a_token_under_greedy(srv, client):
    before = srv.metric(ARGMAX)
    r = chat(client, "SCRIPT:hello", {str(ord("x")): 100})
    assert r.choices[0].message.content == "x" * 8
    assert r.choices[0].finish_reason == "length"
    # the biased greedy request was sampled on the host, not taken from the argmax
    assert srv.metric(ARGMAX) == before
    r = chat(client, "SCRIPT:hello")
    assert r.choices[0].message.content == "hello"
    assert srv.metric(ARGMAX) == before + 6  # plain greedy still takes the fast path


def test_minus_100_bans_a_token(client):
    r = chat(client, "SCRIPT:banana", {str(ord("a")): -100}, max_tokens=40)
    text = r.choices[0].message.content
    assert text.startswith("b") and text[1] != "a"
    assert "a" not in text and len(text) == 40
    # under sampling too
    r = chat(client, "noise", {str(ord("a")): -100, str(ord("e")): -100}, temperature=1.0, seed=4, max_tokens=200)
    text = r.choices[0].message.content
    assert len(text) == 200 and "a" not in text and "e" not in text


def test_banning_and_forcing_the_stop_token(client):
    r = chat(client, "SCRIPT:hi", {str(IM_END): -100}, max_tokens=10)
    assert r.choices[0].message.content.startswith("hi") and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 10
    r = chat(client, "SCRIPT:hi", {str(IM_END): 100})
    assert r.choices[0].message.content == "" and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 1


def test_completions_and_streaming(client):
    r = client.completions.create(model=MODEL, prompt="anything", max_tokens=4, temperature=0,
                                  logit_bias={"65": 100})
    assert r.choices[0].text == "AAAA"
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "SCRIPT:abc"}], max_tokens=5, temperature=0,
        stream=True, logit_bias={"122": 100}, extra_body=NOTHINK))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "zzzzz"


def test_logprobs_describe_the_biased_distribution(client):
    r = chat(client, "SCRIPT:abc", {str(ord("x")): 100}, max_tokens=3, logprobs=True, top_logprobs=2)
    for e in r.choices[0].logprobs.content:
        assert e.token == "x" and -1e-3 < e.logprob <= 0
        assert e.top_logprobs[0].token == "x" and e.top_logprobs[1].logprob < -80
    # a small bias shifts the log-odds by exactly the bias
    plain = chat(client, "noise", max_tokens=1, logprobs=True, top_logprobs=5).choices[0].logprobs.content[0]
    tops = {t.token: t.logprob for t in plain.top_logprobs}
    a, b = plain.top_logprobs[0].token, plain.top_logprobs[3].token
    biased = chat(client, "noise", {str(ord(b)): 2.5}, max_tokens=1, logprobs=True,
                  top_logprobs=5).choices[0].logprobs.content[0]
    btops = {t.token: t.logprob for t in biased.top_logprobs}
    assert math.isclose(btops[b] - btops[a], tops[b] - tops[a] + 2.5, abs_tol=1e-4)
    # normalised: the biased top list still sums to at most 1 and the chosen token is the new argmax
    assert sum(math.exp(v) for v in btops.values()) <= 1 + 1e-5
    assert biased.token == max(btops, key=btops.get)


def test_biased_and_plain_requests_share_a_batch(srv):
    jobs = {"plain": None, "forced": {str(ord("q")): 100}, "banned": {str(ord("s")): -100}}
    out = run_together({n: (lambda n=n: chat(srv.client(), "SCRIPT:same script", jobs[n], max_tokens=11)
                            .choices[0].message.content) for n in jobs}, timeout=60)
    assert out["plain"] == "same script"
    assert out["forced"] == "q" * 11
    assert out["banned"][0] != "s" and "s" not in out["banned"]


@pytest.mark.parametrize("bias, what", [
    ({"abc": 1}, "token ids"),
    ({"264": 1}, "token ids"),          # the mock vocabulary is [0, 264)
    ({"-1": 1}, "token ids"),
    ({"1.5": 1}, "token ids"),
    ({"": 1}, "token ids"),
    ({"65": 101}, "[-100, 100]"),
    ({"65": -100.5}, "[-100, 100]"),
    ({"65": "1"}, "[-100, 100]"),
    ({"65": None}, "[-100, 100]"),
    ([65, 1], "object"),
    ("65", "object"),
    ({str(i): 1 for i in range(264)} | {f"0{i}": 1 for i in range(37)}, "at most 300"),
])
def test_bad_logit_bias_is_a_400_naming_the_field(client, bias, what):
    for call in (lambda: chat(client, "SCRIPT:x", bias),
                 lambda: client.completions.create(model=MODEL, prompt="x", max_tokens=1, logit_bias=bias)):
        with pytest.raises(openai.BadRequestError) as e:
            call()
        assert e.value.status_code == 400
        assert e.value.body["param"] == "logit_bias"
        assert "logit_bias" in e.value.body["message"] and what in e.value.body["message"]


def test_limits_accepted(client):
    # exactly 300 entries, the bounds, floats, an empty map, null
    big = {str(i): -100 for i in range(264)} | {f"0{i}": -100 for i in range(36)}
    big[str(ord("k"))] = 100
    assert len(big) == 300
    assert chat(client, "SCRIPT:hi", big, max_tokens=3).choices[0].message.content == "kkk"
    assert chat(client, "SCRIPT:hi", {"104": -99.5, "105": 0.25}).choices[0].message.content != "hi"
    assert chat(client, "SCRIPT:hi", {}).choices[0].message.content == "hi"
    assert chat(client, "SCRIPT:hi", None).choices[0].message.content == "hi"


# ---- the tiny real model (CPU engine) ----

def test_tiny_model_force_and_ban():
    with Server(mock=False, model=model_dir("tiny"), args=["--max-seq", "512", "--parallel", "2", "--quiet"]) as srv:
        client = srv.client(timeout=120)
        # Qwen's byte-level vocabulary starts with printable ASCII from '!': id = ord(c) - 33
        r = chat(client, "Hello", {str(ord("x") - 33): 100}, max_tokens=4)
        assert r.choices[0].message.content == "xxxx"
        # banning the greedy argmax gives the runner-up: the plain request's second choice
        plain = chat(client, "Hello", max_tokens=1, logprobs=True, top_logprobs=2).choices[0].logprobs.content[0]
        first, second = plain.top_logprobs[0].token, plain.top_logprobs[1].token
        assert first == plain.token
        ids = tokenizer_ids(first)
        if ids is None:
            pytest.skip(f"greedy token {first!r} is not a single token on its own")
        banned = chat(client, "Hello", {str(ids): -100}, max_tokens=1, logprobs=True,
                      top_logprobs=2).choices[0].logprobs.content[0]
        assert banned.token == second


def tokenizer_ids(token_text):
    """The id of the token whose text is token_text (the HF tokenizer the tokenizer
    tests use), or None when the text is not exactly one token."""
    import textref

    hf = textref.hf_tokenizer(textref.tokenizer_dir())
    enc = hf.encode(token_text, add_special_tokens=False).ids
    return enc[0] if len(enc) == 1 and hf.decode(enc) == token_text else None
