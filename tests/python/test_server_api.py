"""OpenAI API surface of `orchid serve`, driven by the official openai client
against the scripted mock model (`--mock`, see src/server/port_mock.c): the
model's output is exactly the text after "SCRIPT:" in the last user message,
then <|im_end|>; without a script it emits seeded printable noise until
max_tokens. That makes every response predictable, so these tests pin the
server (validation, sampling plumbing, stop strings, UTF-8, reasoning and tool
parsing, SSE shape, usage, prefix cache), not a model.
"""

import json

import openai
import pytest

from serverproc import MODEL


def chat(client, content, **kw):
    kw.setdefault("max_tokens", 200)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)


def stream_chat(client, content, **kw):
    kw.setdefault("max_tokens", 200)
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": content}], stream=True, **kw
        )
    )
    return chunks


def joined(chunks, field="content"):
    out = ""
    for c in chunks:
        if c.choices:
            v = getattr(c.choices[0].delta, field, None)
            if v is None and c.choices[0].delta.model_extra:
                v = c.choices[0].delta.model_extra.get(field)
            out += v or ""
    return out


NOTHINK = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}


# ---- plain endpoints ----

def test_health_models(srv, client):
    st, h, body = srv.request("GET", "/health")
    assert st == 200 and json.loads(body) == {"status": "ok"}
    assert h["content-type"] == "application/json"
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    st, _, body = srv.request("GET", "/v1/models/nope")
    assert st == 404 and json.loads(body)["error"]["code"] == "model_not_found"


def test_unknown_route_and_method(srv):
    st, _, body = srv.request("GET", "/v1/nothing")
    err = json.loads(body)["error"]
    assert st == 404 and set(err) == {"message", "type", "param", "code"}
    st, h, body = srv.request("GET", "/v1/chat/completions")
    assert st == 405 and h.get("allow") == "POST"
    st, _, _ = srv.request("POST", "/health", body={})
    assert st == 405


# ---- chat, non-streaming ----

def test_chat_script_exact(client):
    r = chat(client, "SCRIPT:Hello, world!", **NOTHINK)
    ch = r.choices[0]
    assert ch.message.content == "Hello, world!"
    assert ch.message.role == "assistant"
    assert ch.finish_reason == "stop"
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == MODEL
    # 13 text tokens + the stop token
    assert r.usage.completion_tokens == 14
    assert r.usage.total_tokens == r.usage.prompt_tokens + 14
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_max_tokens_length(client):
    r = chat(client, "SCRIPT:abcdefghijklmnop", max_tokens=5, **NOTHINK)
    assert r.choices[0].message.content == "abcde"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 5
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "SCRIPT:abcdefgh"}],
                                       max_completion_tokens=3, **NOTHINK)
    assert r.choices[0].message.content == "abc"


def test_content_parts_and_roles(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "SCRIPT:"}, {"type": "text", "text": "ok"}]},
        ],
        max_tokens=10,
        user="someone",
        **NOTHINK,
    )
    assert r.choices[0].message.content == "ok"


def test_utf8_split_across_tokens(client):
    text = "héllo wörld — 世界 🎉"
    r = chat(client, "SCRIPT:" + text, **NOTHINK)
    assert r.choices[0].message.content == text
    chunks = stream_chat(client, "SCRIPT:" + text, **NOTHINK)
    assert joined(chunks) == text


# ---- stop strings ----

def test_stop_string_spanning_tokens(client):
    r = chat(client, "SCRIPT:one two three four", stop=["three"], **NOTHINK)
    assert r.choices[0].message.content == "one two "
    assert r.choices[0].finish_reason == "stop"
    r = chat(client, "SCRIPT:one two three four", stop="o t", **NOTHINK)
    assert r.choices[0].message.content == "one tw"


def test_stop_string_never_leaks_in_stream(client):
    chunks = stream_chat(client, "SCRIPT:abc STOP def", stop=["STOP"], **NOTHINK)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(pieces) == "abc "
    assert not any("S" in p for p in pieces)
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_partial_stop_released_at_end(client):
    # "wor" could start "world" but the output ends: it is text, not a stop
    r = chat(client, "SCRIPT:hello wor", stop=["world"], **NOTHINK)
    assert r.choices[0].message.content == "hello wor"
    chunks = stream_chat(client, "SCRIPT:hello wor", stop=["world"], **NOTHINK)
    assert joined(chunks) == "hello wor"


def test_earliest_of_several_stops(client):
    r = chat(client, "SCRIPT:alpha beta gamma", stop=["gamma", "beta", "zzz"], **NOTHINK)
    assert r.choices[0].message.content == "alpha "


# ---- streaming ----

def test_stream_shape_and_usage(client):
    chunks = stream_chat(client, "SCRIPT:streamed text", stream_options={"include_usage": True}, **NOTHINK)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert joined(chunks) == "streamed text"
    fin = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(fin) == 1 and fin[0].choices[0].finish_reason == "stop"
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == len("streamed text") + 1
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    # no usage chunk unless asked
    chunks = stream_chat(client, "SCRIPT:x", **NOTHINK)
    assert all(c.choices for c in chunks)


def test_stream_equals_nonstream(client):
    kw = dict(temperature=0.9, seed=1234, max_tokens=40)
    a = chat(client, "no script here", **kw, **NOTHINK).choices[0].message.content
    b = joined(stream_chat(client, "no script here", **kw, **NOTHINK))
    assert a == b and len(a) > 0


# ---- sampling ----

def test_seed_reproducible(client):
    kw = dict(temperature=1.0, max_tokens=32, **NOTHINK)
    a = chat(client, "noise please", seed=7, **kw).choices[0].message.content
    b = chat(client, "noise please", seed=7, **kw).choices[0].message.content
    c = chat(client, "noise please", seed=8, **kw).choices[0].message.content
    assert a == b
    assert a != c


def test_greedy_deterministic_and_params_accepted(client):
    a = chat(client, "noise", max_tokens=20, temperature=0, **NOTHINK).choices[0].message.content
    b = chat(client, "noise", max_tokens=20, temperature=0, **NOTHINK).choices[0].message.content
    assert a == b
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "noise"}],
        max_tokens=20,
        temperature=0.7,
        top_p=0.9,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        seed=3,
        n=1,
        extra_body={"top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1,
                    "chat_template_kwargs": {"enable_thinking": False}},
    )
    assert r.choices[0].finish_reason == "length" and len(r.choices[0].message.content) > 0


def test_penalties_change_output(client):
    base = chat(client, "noise", max_tokens=60, temperature=0, **NOTHINK).choices[0].message.content
    pen = chat(client, "noise", max_tokens=60, temperature=0, frequency_penalty=2.0,
               **NOTHINK).choices[0].message.content
    assert base != pen


def test_script_followed_under_sampling(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "SCRIPT:sampled"}],
                                       temperature=0.5, seed=1, max_tokens=50,
                                       extra_body={"top_k": 5, "chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content == "sampled"


# ---- logprobs ----

def test_logprobs(client):
    r = chat(client, "SCRIPT:abc", logprobs=True, top_logprobs=3, **NOTHINK)
    lp = r.choices[0].logprobs.content
    assert [e.token for e in lp] == ["a", "b", "c"] or [e.token for e in lp][:3] == ["a", "b", "c"]
    for e in lp[:3]:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        assert e.top_logprobs[0].token == e.token
        assert e.bytes == list(e.token.encode())
    chunks = stream_chat(client, "SCRIPT:abc", logprobs=True, top_logprobs=2, **NOTHINK)
    toks = [e.token for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert toks[:3] == ["a", "b", "c"]
    r = chat(client, "SCRIPT:abc", **NOTHINK)
    assert r.choices[0].logprobs is None


# ---- thinking ----

def test_thinking_on_splits_reasoning(client):
    r = chat(client, "SCRIPT:let me think</think>\n\nThe answer.")
    m = r.choices[0].message
    assert m.content == "The answer."
    assert m.model_extra["reasoning_content"] == "let me think"
    chunks = stream_chat(client, "SCRIPT:let me think</think>\n\nThe answer.")
    assert joined(chunks, "reasoning_content") == "let me think"
    assert joined(chunks) == "The answer."


CLOSE = "\n\nConsidering the limited time by the user, I have to give the solution based on the thinking directly now."


def test_thinking_budget(client):
    # 40 reasoning characters (one token each in the mock) against a budget of 5: the
    # reasoning is closed with Qwen's closing text after 5, the reply goes on as content
    r = chat(client, "SCRIPT:" + "a" * 40 + "</think>\n\nanswer", max_tokens=200, extra_body={"thinking_budget": 5})
    m = r.choices[0].message
    assert m.model_extra["reasoning_content"] == "aaaaa" + CLOSE
    assert m.content and "Considering" not in m.content
    # within the budget nothing changes
    r = chat(client, "SCRIPT:aaaa</think>\n\nanswer", extra_body={"thinking_budget": 5})
    assert r.choices[0].message.model_extra["reasoning_content"] == "aaaa" and r.choices[0].message.content == "answer"
    # thinking off: no reasoning to close
    r = chat(client, "SCRIPT:plain", extra_body={"thinking_budget": 1, "chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content == "plain"
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, "x", extra_body={"thinking_budget": 0})
    assert e.value.body["param"] == "thinking_budget"


def test_thinking_off(client):
    for kw in (NOTHINK, {"reasoning_effort": "none"}):
        r = chat(client, "SCRIPT:Direct.", **kw)
        assert r.choices[0].message.content == "Direct."
        assert not r.choices[0].message.model_extra.get("reasoning_content")


# ---- tools ----

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]},
    },
}]

CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


def test_tool_call_nonstream_and_round_trip(client):
    r = chat(client, "SCRIPT:" + CALL, tools=TOOLS, **NOTHINK)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    assert ch.message.content in (None, "")
    tc = ch.message.tool_calls[0]
    assert tc.type == "function" and tc.function.name == "get_weather" and tc.id.startswith("call_")
    assert json.loads(tc.function.arguments) == {"city": "Paris", "days": 3}
    # round trip: the tool result goes back
    r2 = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": None, "tool_calls": [tc.model_dump()]},
            {"role": "tool", "tool_call_id": tc.id, "content": "sunny, 21C"},
            {"role": "user", "content": "SCRIPT:It is sunny."},
        ],
        tools=TOOLS, max_tokens=50, **NOTHINK,
    )
    assert r2.choices[0].message.content == "It is sunny."


def test_tool_call_streamed(client):
    chunks = stream_chat(client, "SCRIPT:Checking." + CALL, tools=TOOLS, **NOTHINK)
    calls = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls]
    assert len(calls) >= 1
    name = "".join(tc.function.name or "" for tc in calls if tc.function)
    args = "".join(tc.function.arguments or "" for tc in calls if tc.function)
    assert name == "get_weather" and json.loads(args) == {"city": "Paris", "days": 3}
    assert joined(chunks) == "Checking."
    assert "<tool_call>" not in joined(chunks)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_keeps_text(client):
    r = chat(client, "SCRIPT:" + CALL, tools=TOOLS, tool_choice="none", **NOTHINK)
    assert r.choices[0].message.tool_calls is None
    assert "<tool_call>" in r.choices[0].message.content


def test_tool_choice_named_forces_prefix(client):
    # the prompt ends inside "<tool_call>\n<function=get_weather>\n"; the script repeats it so the
    # mock continues from there
    r = chat(client, "SCRIPT:" + CALL, tools=TOOLS,
             tool_choice={"type": "function", "function": {"name": "get_weather"}})
    tc = r.choices[0].message.tool_calls[0]
    assert tc.function.name == "get_weather"
    assert json.loads(tc.function.arguments)["city"] == "Paris"


CALL2 = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>")


def test_parallel_tool_calls_false_ends_after_the_first_call(client):
    both = chat(client, "SCRIPT:" + CALL + "\n" + CALL2, tools=TOOLS, **NOTHINK)
    assert [json.loads(t.function.arguments)["city"] for t in both.choices[0].message.tool_calls] == ["Paris", "Rome"]
    one = chat(client, "SCRIPT:" + CALL + "\n" + CALL2, tools=TOOLS, parallel_tool_calls=False, **NOTHINK)
    ch = one.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content in (None, "")
    assert [json.loads(t.function.arguments)["city"] for t in ch.message.tool_calls] == ["Paris"]
    # generation stopped at the call's closing tag: the second call's tokens were never made
    assert one.usage.completion_tokens < both.usage.completion_tokens - 5
    # true is the default; a non-boolean is refused
    r = chat(client, "SCRIPT:" + CALL + "\n" + CALL2, tools=TOOLS, parallel_tool_calls=True, **NOTHINK)
    assert len(r.choices[0].message.tool_calls) == 2
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, "x", tools=TOOLS, extra_body={"parallel_tool_calls": "no"})
    assert e.value.body["param"] == "parallel_tool_calls"


def test_parallel_tool_calls_false_streamed_and_after_reasoning(client):
    chunks = stream_chat(client, "SCRIPT:Checking." + CALL + "\n" + CALL2, tools=TOOLS, parallel_tool_calls=False,
                         **NOTHINK)
    calls = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls]
    assert {tc.index for tc in calls} == {0}
    args = "".join(tc.function.arguments or "" for tc in calls if tc.function)
    assert json.loads(args)["city"] == "Paris"
    assert joined(chunks) == "Checking." and chunks[-1].choices[0].finish_reason == "tool_calls"
    # thinking on: a closing tag written while reasoning is not a call's end
    r = chat(client, "SCRIPT:the tag </tool_call> ends a call</think>\n\n" + CALL + "\n" + CALL2, tools=TOOLS,
             parallel_tool_calls=False)
    m = r.choices[0].message
    assert m.model_extra["reasoning_content"] == "the tag </tool_call> ends a call"
    assert [json.loads(t.function.arguments)["city"] for t in m.tool_calls] == ["Paris"]
    # tool_choice none: the text is not a call and nothing is cut
    r = chat(client, "SCRIPT:" + CALL + "\n" + CALL2, tools=TOOLS, tool_choice="none", parallel_tool_calls=False,
             **NOTHINK)
    assert r.choices[0].message.content.count("</tool_call>") == 2


# ---- response_format ----

def test_response_format(client):
    r = chat(client, 'SCRIPT:{"a": 1}', response_format={"type": "json_object"}, **NOTHINK)
    assert json.loads(r.choices[0].message.content) == {"a": 1}
    r = chat(client, "SCRIPT:t", response_format={"type": "text"}, **NOTHINK)
    assert r.choices[0].message.content == "t"
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, "x", response_format={"type": "grammar"})
    assert e.value.body["param"] == "response_format"
    # (json_schema: test_structured_output.py)


# ---- prefix cache ----

def test_prefix_cache_multi_turn(client):
    msgs = [{"role": "user", "content": "SCRIPT:first answer"}]
    r1 = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=50, **NOTHINK)
    assert r1.choices[0].message.content == "first answer"
    msgs += [{"role": "assistant", "content": "first answer"}, {"role": "user", "content": "SCRIPT:second"}]
    r2 = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=50, **NOTHINK)
    assert r2.choices[0].message.content == "second"
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached >= r1.usage.prompt_tokens, (cached, r1.usage.prompt_tokens)


# ---- several choices ('n') ----

def test_n_choices_nonstream(client):
    r = chat(client, "SCRIPT:same words", n=3, **NOTHINK)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert all(c.message.content == "same words" and c.finish_reason == "stop" for c in r.choices)
    one = len("same words") + 1
    assert r.usage.completion_tokens == 3 * one
    assert r.usage.total_tokens == r.usage.prompt_tokens + 3 * one
    # sampled: each choice draws from seed + index, so choice i equals a lone request seeded so
    kw = dict(temperature=1.0, max_tokens=24, **NOTHINK)
    r = chat(client, "noise please", n=4, seed=40, **kw)
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) == 4, texts
    for i in (0, 3):
        assert chat(client, "noise please", seed=40 + i, **kw).choices[0].message.content == texts[i]
    assert r.usage.completion_tokens == 4 * 24
    # logprobs per choice
    r = chat(client, "SCRIPT:ab", n=2, logprobs=True, top_logprobs=1, **NOTHINK)
    assert all([t.token for t in c.logprobs.content][:2] == ["a", "b"] for c in r.choices)


def test_n_choices_stream(client):
    chunks = stream_chat(client, "noise please", n=3, temperature=1.0, seed=9, max_tokens=20,
                         stream_options={"include_usage": True}, **NOTHINK)
    by = {}
    for c in chunks[:-1]:
        assert len(c.choices) == 1 and c.id == chunks[0].id
        by.setdefault(c.choices[0].index, []).append(c)
    assert sorted(by) == [0, 1, 2]
    for i, cs in by.items():
        assert cs[0].choices[0].delta.role == "assistant"
        fin = [c for c in cs if c.choices[0].finish_reason]
        assert len(fin) == 1 and fin[0] is cs[-1] and fin[0].choices[0].finish_reason == "length"
        alone = chat(client, "noise please", temperature=1.0, seed=9 + i, max_tokens=20, **NOTHINK)
        assert joined(cs) == alone.choices[0].message.content
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == 60
    # completions: the same shape
    cs = list(client.completions.create(model=MODEL, prompt="SCRIPT:raw<|im_end|>", max_tokens=10, n=2, stream=True))
    assert sorted({c.choices[0].index for c in cs}) == [0, 1]
    assert all("".join(c.choices[0].text for c in cs if c.choices[0].index == i) == "raw" for i in (0, 1))
    r = client.completions.create(model=MODEL, prompt="SCRIPT:raw<|im_end|>", max_tokens=10, n=2)
    assert [c.text for c in r.choices] == ["raw", "raw"] and [c.index for c in r.choices] == [0, 1]


# ---- /tokenize, /detokenize ----

def test_tokenize_detokenize(srv, client):
    def post(path, body):
        st, _, data = srv.request("POST", path, body=body)
        return st, json.loads(data)
    # a prompt: the mock's ids are its bytes, its tags one id each
    st, r = post("/tokenize", {"model": MODEL, "prompt": "ab<|im_end|>"})
    assert st == 200 and r["tokens"] == [97, 98, 256] and r["count"] == 3 and r["token_strs"] is None
    assert r["max_model_len"] == client.models.retrieve(MODEL).model_extra["max_model_len"]
    st, r2 = post("/tokenize", {"content": "ab<|im_end|>", "return_token_strs": True})  # llama.cpp's name
    assert st == 200 and r2["tokens"] == r["tokens"] and r2["token_strs"] == ["a", "b", "<|im_end|>"]
    # a chat: the ids /v1/chat/completions feeds the model (its usage counts them)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "SCRIPT:ok"}]
    st, r = post("/tokenize", {"messages": msgs, "chat_template_kwargs": {"enable_thinking": False}})
    usage = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5, **NOTHINK).usage
    assert st == 200 and r["count"] == usage.prompt_tokens == len(r["tokens"])
    st, d = post("/detokenize", {"tokens": r["tokens"]})
    assert st == 200 and d["prompt"] == d["content"] and d["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "SCRIPT:ok" in d["prompt"]
    # UTF-8: a character cut between ids comes back as U+FFFD, whole it round-trips
    st, r = post("/tokenize", {"prompt": "é世"})
    assert st == 200 and len(r["tokens"]) == 5
    assert post("/detokenize", {"tokens": r["tokens"]})[1]["prompt"] == "é世"
    assert post("/detokenize", {"tokens": r["tokens"][:1]})[1]["prompt"] == "\ufffd"
    assert post("/detokenize", {"tokens": []})[1]["prompt"] == ""
    # bad input: a 400 naming the field, a wrong model a 404, GET a 405
    for path, body, param in [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": msgs}, "messages"),
        ("/tokenize", {"messages": msgs, "add_generation_prompt": False}, "add_generation_prompt"),
        ("/tokenize", {"messages": [{"role": "user", "content": 1}]}, "messages[0].content"),
        ("/tokenize", {"prompt": "a", "return_token_strs": "yes"}, "return_token_strs"),
        ("/detokenize", {}, "tokens"),
        ("/detokenize", {"tokens": [1, -1]}, "tokens[1]"),
        ("/detokenize", {"tokens": [10**9]}, "tokens[0]"),
        ("/detokenize", {"tokens": [1.5]}, "tokens[0]"),
        ("/detokenize", {"tokens": ["a"]}, "tokens[0]"),
    ]:
        st, e = post(path, body)
        assert st == 400 and e["error"]["param"] == param, (path, body, st, e)
    st, e = post("/tokenize", {"model": "other", "prompt": "a"})
    assert st == 404 and e["error"]["code"] == "model_not_found"
    assert srv.request("GET", "/tokenize")[0] == 405
    st, _, _ = srv.request("POST", "/detokenize", body="[1, 2")
    assert st == 400


# ---- completions ----

def test_completions(client):
    r = client.completions.create(model=MODEL, prompt="SCRIPT:raw text<|im_end|>", max_tokens=20)
    assert r.choices[0].text == "raw text" and r.choices[0].finish_reason == "stop"
    assert r.object == "text_completion"
    ids = [ord(c) for c in "SCRIPT:ids"] + [256]
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=20)
    assert r.choices[0].text == "ids"
    assert r.usage.prompt_tokens == len(ids)
    chunks = list(client.completions.create(model=MODEL, prompt="SCRIPT:streaming raw<|im_end|>", max_tokens=30,
                                            stream=True, stop=["raw"]))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "streaming "
    r = client.completions.create(model=MODEL, prompt="SCRIPT:ab<|im_end|>", max_tokens=5, logprobs=2)
    assert r.choices[0].logprobs.tokens[:2] == ["a", "b"]
    assert len(r.choices[0].logprobs.top_logprobs[0]) == 2
    r = client.completions.create(model=MODEL, prompt="noise", max_tokens=7)
    assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"


def test_default_completion_max_tokens_is_16(client):
    r = client.completions.create(model=MODEL, prompt="noise")
    assert r.usage.completion_tokens == 16


def test_context_overflow_names_numbers(client):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client, "x", max_tokens=9000)
    msg = e.value.body["message"]
    assert "8192" in msg and "9000" in msg
    assert e.value.body["code"] == "context_length_exceeded"


def test_request_log_line(srv, client):
    chat(client, "SCRIPT:logged", **NOTHINK)
    lines = [l for l in srv.log().splitlines() if l.startswith("POST /v1/chat/completions 200 ")]
    assert lines
    import re
    assert re.match(r"POST /v1/chat/completions 200 \d+ms prompt=\d+ cached=\d+ completion=\d+ tok/s=[\d.]+$",
                    lines[-1]), lines[-1]
    bad = [l for l in srv.log().splitlines() if l.startswith("POST /v1/chat/completions 400 ")]
    assert all('error="' in l for l in bad)


def test_tool_choice_required_forces_a_call(client):
    r = chat(client, "SCRIPT:" + CALL, tools=TOOLS, tool_choice="required")
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.tool_calls[0].function.name == "get_weather"
    chunks = stream_chat(client, "SCRIPT:" + CALL, tools=TOOLS, tool_choice="required")
    calls = [tc for c in chunks if c.choices and c.choices[0].delta.tool_calls for tc in c.choices[0].delta.tool_calls]
    assert calls and calls[0].function.name == "get_weather"


def test_usage_counts_and_ids_unique(client):
    ids = set()
    for _ in range(3):
        r = chat(client, "SCRIPT:xy", **NOTHINK)
        ids.add(r.id)
        assert r.usage.completion_tokens == 3 and r.created > 0
    assert len(ids) == 3
