"""`orchid serve` on the real tiny test model (random weights, real Qwen3.6
tokenizer and chat template, CPU engine): the whole pipeline end to end with
the official openai client. The text is noise; the tests pin what must hold
for any model: greedy determinism, stream == non-stream, seeds, stop strings
cut at token boundaries from real tokens, logprobs, the prefix cache,
completions from token ids. Requests are kept short (the CPU path is slow).
"""

import pytest

from models import model_dir
from serverproc import MODEL, Server

NOTHINK = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}


@pytest.fixture(scope="module")
def srv():
    with Server(mock=False, model=model_dir("tiny"), args=["--max-seq", "1024", "--parallel", "2"]) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return srv.client(timeout=120)


def ask(client, text, **kw):
    kw.setdefault("max_tokens", 6)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}], **kw)


def test_chat_greedy_stream_matches(client):
    a = ask(client, "Hello", temperature=0, logprobs=True, **NOTHINK)
    ch = a.choices[0]
    assert ch.finish_reason in ("length", "stop")
    assert a.usage.prompt_tokens > 5 and 1 <= a.usage.completion_tokens <= 6
    if ch.finish_reason == "length":
        assert len(ch.logprobs.content) == 6
    b = ask(client, "Hello", temperature=0, **NOTHINK)
    assert b.choices[0].message.content == ch.message.content
    chunks = list(ask(client, "Hello", temperature=0, stream=True, stream_options={"include_usage": True},
                      **NOTHINK))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ch.message.content
    assert chunks[-1].usage.completion_tokens == a.usage.completion_tokens


def test_thinking_on_goes_to_reasoning(client):
    r = ask(client, "Hi", max_tokens=4)
    m = r.choices[0].message
    # random weights never close </think>: everything is reasoning
    assert (m.model_extra.get("reasoning_content") or "") != "" or m.content


def test_seeded_sampling(client):
    kw = dict(temperature=1.0, top_p=0.95, max_tokens=5, **NOTHINK)
    a = ask(client, "Tell me", seed=11, **kw).choices[0].message.content
    b = ask(client, "Tell me", seed=11, **kw).choices[0].message.content
    assert a == b


def test_stop_string_from_real_tokens(client):
    r = ask(client, "Count", temperature=0, max_tokens=6, logprobs=True, **NOTHINK)
    toks = [e.token for e in r.choices[0].logprobs.content]
    text = r.choices[0].message.content
    if len(toks) < 4 or "".join(toks) != text:
        pytest.skip("greedy output too short or not byte-aligned for this check")
    # a stop string spanning the boundary between token 2 and token 3
    cut = len(toks[0]) + len(toks[1])
    left = toks[1][-1:] if toks[1] else ""
    stop = left + toks[2][:2]
    if not stop.strip() or text.find(stop) != cut - len(left):
        pytest.skip("no unambiguous stop string in this output")
    r2 = ask(client, "Count", temperature=0, max_tokens=6, stop=[stop], **NOTHINK)
    assert r2.choices[0].message.content == text[: cut - len(left)]
    assert r2.choices[0].finish_reason == "stop"
    chunks = list(ask(client, "Count", temperature=0, max_tokens=6, stop=[stop], stream=True, **NOTHINK))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text[: cut - len(left)]


def test_completions_ids_and_prefix_cache(client):
    ids = [9707, 11, 1879, 0, 576, 374, 264, 1273]
    r1 = client.completions.create(model=MODEL, prompt=ids, max_tokens=1)
    assert r1.usage.prompt_tokens == len(ids)
    # the session now holds exactly `ids`: a longer prompt starting with them reuses it
    r2 = client.completions.create(model=MODEL, prompt=ids + [13, 279], max_tokens=2)
    assert r2.usage.prompt_tokens_details.cached_tokens == len(ids)
    r3 = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0)
    assert r3.choices[0].finish_reason in ("length", "stop")


def test_prefix_checkpoints_survive_slot_reuse(client):
    # parallel 2: two unrelated requests take both slots, so only the checkpoint
    # store (--prefix-cache-mb) can still serve the first prompt's state
    ids = [785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13]
    client.completions.create(model=MODEL, prompt=ids, max_tokens=1)
    client.completions.create(model=MODEL, prompt=[1, 2, 3], max_tokens=1)
    client.completions.create(model=MODEL, prompt=[4, 5, 6], max_tokens=1)
    r = client.completions.create(model=MODEL, prompt=ids + [42], max_tokens=1)
    assert r.usage.prompt_tokens_details.cached_tokens == len(ids)


def test_tool_call_request_accepted(client):
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
                                                                                  "properties": {}}}}]
    r = ask(client, "What time is it?", tools=tools, max_tokens=4, **NOTHINK)
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")
    r = ask(client, "What time is it?", tools=tools, tool_choice="required", max_tokens=4)
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")


def test_concurrent_requests_batch(client):
    # several sequences decode in one batched forward; every one must complete
    # and greedy outputs must not depend on what else is in the batch
    import threading

    prompts = [f"Question {i}: what is {i} plus {i}?" for i in range(4)]
    solo = [ask(client, p, temperature=0, max_tokens=5, **NOTHINK).choices[0].message.content for p in prompts]
    out = [None] * 4

    def run(i):
        out[i] = ask(client, prompts[i], temperature=0, max_tokens=5, **NOTHINK).choices[0].message.content

    ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert out == solo


def test_n_choices_are_lone_requests(client, srv):
    # 'n' on a real model: greedy choices are the lone request's tokens (run side by side in
    # the batch: batch invariance), seeded ones each a lone request at seed + index, and the
    # choices after the first take the prompt from the first one's checkpoint
    alone = ask(client, "Count with me", temperature=0, **NOTHINK).choices[0].message.content
    hits = srv.metric("orchid_prefix_cache_hit_generations_total")
    system = "You are a patient counting tutor. " * 40  # > 128 tokens: worth waiting for (sched.c)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": system},
                                                              {"role": "user", "content": "Count with me"}],
                                       temperature=0, n=3, max_tokens=6, **NOTHINK)
    assert r.choices[0].message.content == r.choices[1].message.content == r.choices[2].message.content
    assert srv.metric("orchid_prefix_cache_hit_generations_total") >= hits + 2
    r = ask(client, "Count with me", temperature=0, n=2, **NOTHINK)
    assert [c.message.content for c in r.choices] == [alone, alone]
    r = ask(client, "Count with me", temperature=1.0, seed=5, n=2, **NOTHINK)
    for i in (0, 1):
        lone = ask(client, "Count with me", temperature=1.0, seed=5 + i, **NOTHINK)
        assert r.choices[i].message.content == lone.choices[0].message.content


def test_tokenize_matches_hf_and_chat_usage(client, srv):
    # the real tokenizer: /tokenize equals HF tokenizers' encode, /detokenize its decode,
    # and a chat's count is what /v1/chat/completions reports as prompt tokens
    import json as _json
    from tokenizers import Tokenizer
    hf = Tokenizer.from_file(str(model_dir("tiny") / "tokenizer.json"))
    text = "Hello, wörld! 你好 — <|im_start|>user\n  x = y->z[0]++ 🙂"
    st, _, body = srv.request("POST", "/tokenize", body={"prompt": text, "return_token_strs": True})
    r = _json.loads(body)
    assert st == 200 and r["tokens"] == hf.encode(text, add_special_tokens=False).ids
    assert "".join(r["token_strs"]).replace("\ufffd", "") != ""
    st, _, body = srv.request("POST", "/detokenize", body={"tokens": r["tokens"]})
    assert st == 200 and _json.loads(body)["prompt"] == hf.decode(r["tokens"], skip_special_tokens=False) == text
    msgs = [{"role": "user", "content": "What is 2 + 2?"}]
    st, _, body = srv.request("POST", "/tokenize", body={"messages": msgs, "chat_template_kwargs": {"enable_thinking": False}})
    usage = ask(client, "What is 2 + 2?", **NOTHINK).usage
    assert st == 200 and _json.loads(body)["count"] == usage.prompt_tokens


def _tiny_with(tmp_path, gen_config):
    """The tiny model's files (linked) with a generation_config.json of gen_config's text."""
    d = tmp_path / "tiny-gc"
    d.mkdir()
    for p in model_dir("tiny").iterdir():
        (d / p.name).symlink_to(p)
    (d / "generation_config.json").write_text(gen_config)
    return d


def test_generation_config_sampling_defaults(tmp_path):
    # Qwen3.6's generation_config.json (MODEL.md): requests that leave sampling out take it
    import json as _json
    d = _tiny_with(tmp_path, _json.dumps({"do_sample": True, "temperature": 1.0, "top_k": 20, "top_p": 0.95,
                                          "bos_token_id": 248044}))
    with Server(mock=False, model=d, args=["--max-seq", "512", "--parallel", "2"]) as s:
        c = s.client(timeout=120)
        assert "request sampling defaults: temperature 1, top_p 0.95, top_k 20" in s.log()
        # sampled, not greedy: seeded requests that leave sampling out are the requests that
        # give Qwen's parameters themselves, and they are not all the greedy text
        greedy = ask(c, "Hi", max_tokens=16, temperature=0, **NOTHINK).choices[0].message.content
        outs = []
        for seed in range(6):
            a = ask(c, "Hi", max_tokens=16, seed=seed, **NOTHINK).choices[0].message.content
            b = ask(c, "Hi", max_tokens=16, seed=seed, temperature=1.0, top_p=0.95,
                    extra_body={"top_k": 20, "chat_template_kwargs": {"enable_thinking": False}})
            assert a == b.choices[0].message.content
            outs.append(a)
        assert len(set(outs)) > 1 and any(o != greedy for o in outs), outs
    with Server(mock=False, model=d, args=["--max-seq", "512", "--generation-config", "none"]) as s:
        c = s.client(timeout=120)
        assert "request sampling defaults: greedy (--generation-config none)" in s.log()
        outs = {ask(c, "Hi", max_tokens=8, **NOTHINK).choices[0].message.content for _ in range(2)}
        assert outs == {ask(c, "Hi", max_tokens=8, temperature=0, **NOTHINK).choices[0].message.content}


def test_generation_config_bad_fields_are_warnings(tmp_path):
    d = _tiny_with(tmp_path, '{"do_sample": false, "temperature": "hot", "top_p": 0, "top_k": 2.5}')
    with Server(mock=False, model=d, args=["--max-seq", "512"]) as s:
        log = s.log()
        assert "'temperature' is out of range" in log and "'top_p' is out of range" in log
        assert "'top_k' is out of range" in log and "request sampling defaults: greedy (generation_config.json)" in log
        c = s.client(timeout=120)
        assert len({ask(c, "Hi", max_tokens=6, **NOTHINK).choices[0].message.content for _ in range(2)}) == 1
    d2 = tmp_path / "x"
    d2.mkdir()
    for p in model_dir("tiny").iterdir():
        (d2 / p.name).symlink_to(p)
    (d2 / "generation_config.json").write_text("[1, 2")
    with Server(mock=False, model=d2, args=["--max-seq", "512"]) as s:
        assert "requests default to greedy" in s.log()
        assert s.client(timeout=60).models.list().data
