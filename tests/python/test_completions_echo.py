"""Batches of prompts and `echo` on /v1/completions, with and without `logprobs`: the prompt's text opens the
choice's text, and with logprobs every prompt token has its entry (the first one null),
which is what lm-evaluation-harness's local-completions model sends for loglikelihood
tasks (prompt + continuation as token ids, echo, logprobs 1, max_tokens 1 or 0), a batch of
prompts at a time (`prompt`: a list of id lists; choice i is prompt i / n's choice i % n).

The prompt logprobs are checked against mlx-lm itself: the tiny test model's teacher-forced
logits (tools/reference_logits.py, cached) give log_softmax(row p-1)[token p] for every
prompt token p; orchid's CPU engine must report the same to 1e-3 (the logits agree to a
relative 1e-4, test_parity_cpu.py; a log-softmax moves by at most ~2·max|Δlogit|). The
engine scores the prompt's rows itself (batch_seq.score: the whole prompt chunk in one
forward); the server runs twice, with its default prompt chunk and with 16-token chunks,
so that a chunk's last row scores the next chunk's first token.
"""

import json
import math

import numpy as np
import pytest

import models
from models import model_dir
from serverproc import MODEL, Server, run_together

PROMPT_LEN = 40  # three chunks of at most 16 rows
TOL = 1e-3


@pytest.fixture(scope="module", params=[[], ["--prefill-chunk", "16"]], ids=["chunk512", "chunk16"])
def srv(request):
    with Server(mock=False, model=model_dir("tiny"), args=["--max-seq", "512", "--parallel", "3"] + request.param) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return srv.client(timeout=120)


@pytest.fixture(scope="module")
def ref():
    ids = models.prompt_ids(PROMPT_LEN, seed=7)
    records, greedy = models.reference("tiny", ids, 1)
    lps = []  # lps[p]: log_softmax(row p-1)[ids[p]], p >= 1
    tops = []
    for p in range(1, PROMPT_LEN):
        row = records[p - 1].logits.astype(np.float64)
        m = row.max()
        lse = m + math.log(np.exp(row - m).sum())
        lps.append(row[ids[p]] - lse)
        tops.append(np.sort(row)[::-1][:5] - lse)
    return dict(ids=ids, lps=lps, tops=tops, greedy=greedy)


def completion(client, prompt, **kw):
    kw.setdefault("temperature", 0)
    return client.completions.create(model=MODEL, prompt=prompt, **kw)


def test_prompt_logprobs_match_mlx(client, ref):
    ids = ref["ids"]
    r = completion(client, ids, echo=True, logprobs=5, max_tokens=1)
    ch = r.choices[0]
    lp = ch.logprobs
    assert len(lp.tokens) == PROMPT_LEN + 1 == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and lp.text_offset[0] == 0
    got = np.array(lp.token_logprobs[1:PROMPT_LEN])
    worst = float(np.abs(got - np.array(ref["lps"])).max())
    assert worst <= TOL, f"prompt logprobs differ from mlx-lm by {worst:.2e}"
    for p in range(1, PROMPT_LEN):
        alts = sorted(lp.top_logprobs[p].values(), reverse=True)
        assert len(alts) == 5
        assert np.abs(np.array(alts) - ref["tops"][p - 1]).max() <= TOL, f"top logprobs at {p}"
        assert lp.token_logprobs[p] <= alts[0] + 1e-6
    # the generated token: the greedy choice (the best of its alternatives), after the prompt's entries
    assert r.usage.prompt_tokens == PROMPT_LEN and r.usage.completion_tokens == 1
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    assert lp.token_logprobs[PROMPT_LEN] == max(lp.top_logprobs[PROMPT_LEN].values())
    plain = completion(client, ids, max_tokens=1, logprobs=1)
    assert plain.choices[0].logprobs.tokens[0] == lp.tokens[PROMPT_LEN]
    assert ch.text.endswith(plain.choices[0].text)


def test_offsets_follow_the_text(client):
    prompt = "The quick brown fox jumps over the lazy dog."
    r = completion(client, prompt, echo=True, logprobs=2, max_tokens=3)
    ch = r.choices[0]
    lp = ch.logprobs
    assert ch.text.startswith(prompt)
    n = r.usage.prompt_tokens
    assert "".join(lp.tokens[:n]) == prompt
    offs = [0]
    for t in lp.tokens[:n]:
        offs.append(offs[-1] + len(t))
    assert lp.text_offset[:n] == offs[:n]
    # the generated tokens' offsets count from the prompt's start
    assert lp.text_offset[n] == len(prompt)
    assert all(len(d) == 2 for d in lp.top_logprobs[1:])


def test_offsets_are_characters(client):
    """text_offset counts characters (Python's len), as OpenAI's and vLLM's do, not bytes."""
    prompt = "Grüße aus Köln — 東京 ✓"
    r = completion(client, prompt, echo=True, logprobs=1, max_tokens=4)
    lp = r.choices[0].logprobs
    n = r.usage.prompt_tokens
    assert lp.text_offset[n] == len(prompt) < len(prompt.encode())
    whole = [i for i in range(n) if "\ufffd" not in lp.tokens[i]]  # tokens that are whole characters
    for i in whole:
        if i + 1 < n and all("\ufffd" not in t for t in lp.tokens[:i + 1]):
            assert lp.text_offset[i + 1] == lp.text_offset[i] + len(lp.tokens[i])
    # generated tokens: each offset where its text starts in the choice's text
    text = r.choices[0].text
    for i in range(n, len(lp.tokens)):
        if "\ufffd" not in lp.tokens[i] and all("\ufffd" not in t for t in lp.tokens[n:i]):
            assert text[lp.text_offset[i]:].startswith(lp.tokens[i])


def test_echo_without_logprobs_and_max_tokens_zero(client, ref):
    prompt = "Once upon a time"
    a = completion(client, prompt, max_tokens=4)
    b = completion(client, prompt, max_tokens=4, echo=True)
    assert b.choices[0].text == prompt + a.choices[0].text
    assert b.choices[0].logprobs is None
    z = completion(client, prompt, max_tokens=0, echo=True)
    assert z.choices[0].text == prompt and z.choices[0].finish_reason == "length"
    assert z.usage.completion_tokens == 0 and z.usage.prompt_tokens == a.usage.prompt_tokens
    zl = completion(client, ref["ids"], max_tokens=0, echo=True, logprobs=0)
    lp = zl.choices[0].logprobs
    assert len(lp.tokens) == PROMPT_LEN and zl.usage.completion_tokens == 0
    assert lp.top_logprobs[1] == {}
    assert np.abs(np.array(lp.token_logprobs[1:]) - np.array(ref["lps"])).max() <= TOL


def test_stream_echo_matches(client, ref):
    ids = ref["ids"]
    whole = completion(client, ids, echo=True, logprobs=1, max_tokens=3)
    chunks = list(completion(client, ids, echo=True, logprobs=1, max_tokens=3, stream=True,
                             stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    toks, vals = [], []
    for c in chunks:
        if c.choices and c.choices[0].logprobs:
            toks += c.choices[0].logprobs.tokens
            vals += c.choices[0].logprobs.token_logprobs
    assert toks == whole.choices[0].logprobs.tokens
    assert vals == whole.choices[0].logprobs.token_logprobs
    # the first chunk is the prompt's, alone
    first = next(c for c in chunks if c.choices)
    assert len(first.choices[0].logprobs.tokens) == PROMPT_LEN
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    z = list(completion(client, "Hi there", echo=True, max_tokens=0, stream=True))
    assert "".join(c.choices[0].text for c in z if c.choices) == "Hi there"
    assert [c.choices[0].finish_reason for c in z if c.choices][-1] == "length"


def test_echo_does_not_change_the_continuation_and_skips_the_cache(client, ref):
    ids = ref["ids"]
    plain = completion(client, ids, max_tokens=6)  # checkpoints the prompt
    again = completion(client, ids + [11], max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens >= PROMPT_LEN - 1
    e = completion(client, ids, max_tokens=6, echo=True, logprobs=1)
    assert e.usage.prompt_tokens_details.cached_tokens == 0
    assert e.choices[0].logprobs.tokens[PROMPT_LEN:] == completion(client, ids, max_tokens=6, logprobs=1).choices[
        0].logprobs.tokens
    assert e.choices[0].text.endswith(plain.choices[0].text)


def test_echo_alongside_other_requests(client, ref):
    ids = ref["ids"]
    alone = completion(client, ids, echo=True, logprobs=3, max_tokens=4)
    jobs = {
        "echo": lambda: completion(client, ids, echo=True, logprobs=3, max_tokens=4),
        "chat": lambda: client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                       max_tokens=8, temperature=0),
        "long": lambda: completion(client, models.prompt_ids(90, seed=3), max_tokens=5, echo=True, logprobs=1),
    }
    out = run_together(jobs)
    a, b = alone.choices[0], out["echo"].choices[0]
    assert b.text == a.text
    assert b.logprobs.tokens == a.logprobs.tokens
    assert np.abs(np.array(b.logprobs.token_logprobs[1:]) - np.array(a.logprobs.token_logprobs[1:])).max() == 0
    assert len(out["long"].choices[0].logprobs.tokens) == 95 or out["long"].choices[0].finish_reason == "stop"


def test_n_choices_each_echo(client):
    r = completion(client, "Echo me", echo=True, max_tokens=2, n=2, temperature=1.0, seed=3)
    assert len(r.choices) == 2 and all(c.text.startswith("Echo me") for c in r.choices)


def test_a_batch_of_prompts_is_each_prompt_alone(client):
    prompts = ["Once upon a time", "The capital of", "1, 2, 3,"]
    alone = [completion(client, p, max_tokens=4) for p in prompts]
    r = completion(client, prompts, max_tokens=4)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [a.choices[0].text for a in alone]
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert r.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    # with n: prompt-major order, each prompt's choices drawn as a request of it alone
    ids = [models.prompt_ids(12, seed=1), models.prompt_ids(9, seed=2)]
    kw = dict(max_tokens=3, n=2, temperature=1.0, seed=9)
    both = completion(client, ids, **kw)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    for p in range(2):
        one = completion(client, ids[p], **kw)
        assert [c.text for c in both.choices[2 * p:2 * p + 2]] == [c.text for c in one.choices]
    assert both.usage.prompt_tokens == 21


def test_a_batch_of_loglikelihood_requests(client, ref):
    """lm-evaluation-harness's local-completions batch: token-id prompts, echo, logprobs 1,
    max_tokens 1, temperature 0; each choice's entries those of its prompt alone."""
    ids = [ref["ids"], ref["ids"][:25], models.prompt_ids(30, seed=5)]
    body = dict(echo=True, logprobs=1, max_tokens=1, seed=1234)
    r = completion(client, ids, **body)
    assert len(r.choices) == 3
    for c in r.choices:
        one = completion(client, ids[c.index], **body).choices[0].logprobs
        assert len(c.logprobs.tokens) == len(ids[c.index]) + 1
        assert c.logprobs.tokens == one.tokens
        assert c.logprobs.token_logprobs == one.token_logprobs
    assert np.abs(np.array(r.choices[0].logprobs.token_logprobs[1:PROMPT_LEN]) - np.array(ref["lps"])).max() <= TOL
    chunks = list(completion(client, ids, stream=True, **body))
    for c in r.choices:
        got = [t for ch in chunks for x in ch.choices if x.index == c.index and x.logprobs for t in x.logprobs.tokens]
        assert got == c.logprobs.tokens


@pytest.mark.parametrize("body,param", [
    ({"prompt": ["a", [1, 2]]}, "prompt"),
    ({"prompt": ["a", ""]}, "prompt"),
    ({"prompt": [[1, 2], []]}, "prompt"),
    ({"prompt": [[1, 2], [1, 248320]]}, "prompt"),
    ({"prompt": ["a"] * 65}, "prompt"),
    ({"prompt": ["a"] * 9, "n": 15}, "n"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"prompt": "x", "echo": "yes"}, "echo"),
    ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
])
def test_bad_requests(srv, body, param):
    import http.client
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    host, port = srv.url.split("//")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    c.request("POST", path, json.dumps(dict(body, model=MODEL)), {"Content-Type": "application/json"})
    resp = c.getresponse()
    err = json.loads(resp.read())["error"]
    assert resp.status == 400 and err["param"] == param, err


def test_a_stop_token_keeps_its_entry(client, ref):
    """lm-evaluation-harness sums token_logprobs[ctxlen:-1]: the entry after the prompt's must be
    the generated token's even when that token ends the reply (an end-of-text id, no text)."""
    ids = ref["ids"][:20]
    r = completion(client, ids, echo=True, logprobs=1, max_tokens=1, logit_bias={"248046": 100})
    ch = r.choices[0]
    assert ch.finish_reason == "stop" and r.usage.completion_tokens == 1
    lp = ch.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 21
    assert lp.tokens[20] == "<|im_end|>" and -1e-3 < lp.token_logprobs[20] <= 0
    assert lp.text_offset[20] == len(ch.text)
    plain = completion(client, ids, max_tokens=1, logprobs=1, logit_bias={"248046": 100})
    assert plain.choices[0].finish_reason == "stop" and plain.choices[0].logprobs.tokens == []
