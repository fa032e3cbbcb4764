"""Bad requests: each one gets the right HTTP status and an OpenAI-shaped error
body {"error": {"message", "type", "param", "code"}}, and the server stays
healthy afterwards. Raw HTTP (http.client / sockets), because the openai
client refuses to send most of these.
"""

import json
import socket

import pytest

from serverproc import MODEL, Server


@pytest.fixture(scope="module")
def srv():
    with Server(mock=True, args=["--max-seq", "4096"]) as s:
        yield s


def M(content="hi"):
    return [{"role": "user", "content": content}]


def chat(**kw):
    body = {"model": MODEL, "messages": M(), "max_tokens": 4}
    body.update(kw)
    return body


def without(key):
    b = chat()
    del b[key]
    return b


C = "/v1/chat/completions"
P = "/v1/completions"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}

# (name, method, path, body (dict -> JSON, str/bytes raw), expected status, expected param or None)
CASES = [
    ("malformed json", "POST", C, b'{"model": ', 400, None),
    ("trailing garbage", "POST", C, b'{"model":"x"} extra', 400, None),
    ("not an object", "POST", C, b"[1,2,3]", 400, None),
    ("empty body", "POST", C, b"", 400, None),
    ("invalid utf-8", "POST", C, b'{"model":"' + MODEL.encode() + b'","messages":[{"role":"user","content":"\xff\xfe"}]}', 400, None),
    ("lone surrogate escape", "POST", C, b'{"model":"' + MODEL.encode() + b'","messages":[{"role":"user","content":"\\ud800"}]}', 400, None),
    ("NaN temperature", "POST", C, ('{"model":"%s","messages":[{"role":"user","content":"x"}],"temperature":NaN}' % MODEL).encode(), 400, None),
    ("missing model", "POST", C, without("model"), 400, "model"),
    ("model wrong type", "POST", C, chat(model=5), 400, "model"),
    ("unknown model", "POST", C, chat(model="gpt-4"), 404, "model"),
    ("missing messages", "POST", C, without("messages"), 400, "messages"),
    ("messages not array", "POST", C, chat(messages="hi"), 400, "messages"),
    ("empty messages", "POST", C, chat(messages=[]), 400, "messages"),
    ("message not object", "POST", C, chat(messages=["hi"]), 400, "messages[0]"),
    ("missing role", "POST", C, chat(messages=[{"content": "x"}]), 400, "messages[0].role"),
    ("unknown role", "POST", C, chat(messages=[{"role": "wizard", "content": "x"}]), 400, "messages[0].role"),
    ("role wrong type", "POST", C, chat(messages=[{"role": 1, "content": "x"}]), 400, "messages[0].role"),
    ("missing content", "POST", C, chat(messages=[{"role": "user"}]), 400, "messages[0].content"),
    ("content wrong type", "POST", C, chat(messages=[{"role": "user", "content": 42}]), 400, "messages[0].content"),
    ("image part", "POST", C, chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]), 400, "messages[0].content"),
    ("text part without text", "POST", C, chat(messages=[{"role": "user", "content": [{"type": "text"}]}]), 400, "messages[0].content"),
    ("system not first", "POST", C, chat(messages=[{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]), 400, "messages"),
    ("tool_calls on user", "POST", C, chat(messages=[{"role": "user", "content": "a", "tool_calls": []}]), 400, "messages[0].tool_calls"),
    ("tool_call args not json", "POST", C, chat(messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{nope"}}]}, {"role": "user", "content": "b"}]), 400, "messages[1].tool_calls[0]"),
    ("temperature string", "POST", C, chat(temperature="hot"), 400, "temperature"),
    ("temperature negative", "POST", C, chat(temperature=-1), 400, "temperature"),
    ("temperature huge", "POST", C, chat(temperature=1e308), 400, "temperature"),
    ("top_p zero", "POST", C, chat(top_p=0), 400, "top_p"),
    ("top_p above one", "POST", C, chat(top_p=1.5), 400, "top_p"),
    ("top_k float", "POST", C, chat(top_k=2.5), 400, "top_k"),
    ("min_p negative", "POST", C, chat(min_p=-0.1), 400, "min_p"),
    ("presence_penalty out of range", "POST", C, chat(presence_penalty=5), 400, "presence_penalty"),
    ("frequency_penalty string", "POST", C, chat(frequency_penalty="x"), 400, "frequency_penalty"),
    ("repetition_penalty zero", "POST", C, chat(repetition_penalty=0), 400, "repetition_penalty"),
    ("max_tokens zero", "POST", C, chat(max_tokens=0), 400, "max_tokens"),
    ("max_tokens negative", "POST", C, chat(max_tokens=-5), 400, "max_tokens"),
    ("max_tokens huge", "POST", C, chat(max_tokens=10**12), 400, "max_tokens"),
    ("max_tokens float", "POST", C, chat(max_tokens=3.5), 400, "max_tokens"),
    ("max_tokens over context", "POST", C, chat(max_tokens=5000), 400, "messages"),
    ("max_completion_tokens string", "POST", C, chat(max_completion_tokens="10"), 400, "max_completion_tokens"),
    ("n seventeen", "POST", C, chat(n=17), 400, "n"),
    ("n zero", "POST", C, chat(n=0), 400, "n"),
    ("n float", "POST", C, chat(n=1.5), 400, "n"),
    ("stream not bool", "POST", C, chat(stream="yes"), 400, "stream"),
    ("stream_options not object", "POST", C, chat(stream_options=1), 400, "stream_options"),
    ("stop wrong type", "POST", C, chat(stop=5), 400, "stop"),
    ("stop list with number", "POST", C, chat(stop=["a", 1]), 400, "stop"),
    ("too many stops", "POST", C, chat(stop=[str(i) for i in range(9)]), 400, "stop"),
    ("seed float", "POST", C, chat(seed=1.5), 400, "seed"),
    ("logprobs not bool", "POST", C, chat(logprobs="true"), 400, "logprobs"),
    ("top_logprobs too many", "POST", C, chat(logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    ("top_logprobs without logprobs", "POST", C, chat(top_logprobs=2), 400, "top_logprobs"),
    ("tools not array", "POST", C, chat(tools={}), 400, "tools"),
    ("tool without function", "POST", C, chat(tools=[{"type": "function"}]), 400, "tools[0]"),
    ("tool bad name", "POST", C, chat(tools=[{"type": "function", "function": {"name": "bad name!"}}]), 400, "tools[0]"),
    ("tool parameters not object", "POST", C, chat(tools=[{"type": "function", "function": {"name": "f", "parameters": "x"}}]), 400, "tools[0]"),
    ("tool wrong type", "POST", C, chat(tools=[{"type": "retrieval", "function": {"name": "f"}}]), 400, "tools[0]"),
    ("tool_choice unknown string", "POST", C, chat(tools=[TOOL], tool_choice="sometimes"), 400, "tool_choice"),
    ("tool_choice names missing tool", "POST", C, chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "g"}}), 400, "tool_choice"),
    ("tool_choice required without tools", "POST", C, chat(tool_choice="required"), 400, "tool_choice"),
    ("response_format json_schema", "POST", C, chat(response_format={"type": "json_schema"}), 400, "response_format.json_schema"),
    ("response_format not object", "POST", C, chat(response_format="json"), 400, "response_format"),
    ("reasoning_effort unknown", "POST", C, chat(reasoning_effort="extreme"), 400, "reasoning_effort"),
    ("chat_template_kwargs not object", "POST", C, chat(chat_template_kwargs=[]), 400, "chat_template_kwargs"),
    ("enable_thinking not bool", "POST", C, chat(chat_template_kwargs={"enable_thinking": "no"}), 400, "chat_template_kwargs.enable_thinking"),
    ("completions missing prompt", "POST", P, {"model": MODEL}, 400, "prompt"),
    ("completions empty prompt", "POST", P, {"model": MODEL, "prompt": ""}, 400, "prompt"),
    ("completions token out of vocab", "POST", P, {"model": MODEL, "prompt": [1, 2, 10**9]}, 400, "prompt"),
    ("completions negative token", "POST", P, {"model": MODEL, "prompt": [-1]}, 400, "prompt"),
    ("completions mixed batch of prompts", "POST", P, {"model": MODEL, "prompt": ["a", [1, 2]]}, 400, "prompt"),
    ("completions prompt object", "POST", P, {"model": MODEL, "prompt": {"a": 1}}, 400, "prompt"),
    ("completions echo not a boolean", "POST", P, {"model": MODEL, "prompt": "a", "echo": 1}, 400, "echo"),
    ("completions max_tokens zero", "POST", P, {"model": MODEL, "prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
    ("completions logprobs 6", "POST", P, {"model": MODEL, "prompt": "a", "logprobs": 6}, 400, "logprobs"),
    ("completions best_of 2", "POST", P, {"model": MODEL, "prompt": "a", "best_of": 2}, 400, "best_of"),
    ("get on chat", "GET", C, None, 405, None),
    ("delete on models", "DELETE", "/v1/models", None, 405, None),
    ("unknown route", "POST", "/v1/embeddings", chat(), 404, None),
    ("root", "GET", "/", None, 404, None),
]


@pytest.mark.parametrize("name,method,path,body,status,param", CASES, ids=[c[0] for c in CASES])
def test_bad_request(srv, name, method, path, body, status, param):
    st, h, data = srv.request(method, path, body=body)
    assert st == status, (name, st, data[:300])
    assert h["content-type"].startswith("application/json")
    err = json.loads(data)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
        assert param.split(".")[0].split("[")[0] in err["message"], err


def test_case_count():
    assert len(CASES) >= 40


def _raw_post(srv, head, body_iter):
    """Sends a request whose body may be refused early; returns the status line."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    try:
        s.sendall(head)
        try:
            for part in body_iter:
                s.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        while b"\r\n\r\n" not in data:
            try:
                part = s.recv(65536)
            except ConnectionResetError:
                break
            if not part:
                break
            data += part
        return data
    finally:
        s.close()


def test_body_too_large(srv):
    body = b'{"model":"' + MODEL.encode() + b'","messages":[{"role":"user","content":"' + b"a" * (10 * 1000 * 1000) + b'"}]}'
    head = f"POST {C} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    data = _raw_post(srv, head, [body[i:i + (1 << 20)] for i in range(0, len(body), 1 << 20)])
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    assert b"request_too_large" in data or b"content-length" in data.lower()


def test_body_too_large_chunked(srv):
    # no Content-Length: the limit is enforced while reading
    head = f"POST {C} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    chunk = b"a" * (1 << 20)
    parts = [b"%x\r\n" % len(chunk) + chunk + b"\r\n" for _ in range(10)] + [b"0\r\n\r\n"]
    data = _raw_post(srv, head, parts)
    assert data.startswith(b"HTTP/1.1 413"), data[:200]


def test_huge_prompt_over_context(srv):
    st, _, data = srv.request("POST", C, body=chat(messages=M("x" * 5000), max_tokens=None))
    assert st == 400
    err = json.loads(data)["error"]
    assert "4096" in err["message"] and err["code"] == "context_length_exceeded"


def test_garbage_request_line(srv):
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    try:
        s.sendall(b"\x00\x01GARBAGE\r\n\r\n")
        s.recv(4096)
    except OSError:
        pass
    finally:
        s.close()


def test_healthy_after_abuse(srv):
    st, _, body = srv.request("GET", "/health")
    assert st == 200
    st, _, body = srv.request("POST", C, body=chat(messages=M("SCRIPT:still fine"), max_tokens=20,
                                                      chat_template_kwargs={"enable_thinking": False}))
    assert st == 200
    assert json.loads(body)["choices"][0]["message"]["content"] == "still fine"
    # 4xx are counted by endpoint and status
    assert srv.metric('orchid_requests_total{endpoint="/v1/chat/completions",status="400"}') >= 40


def test_internal_error_does_not_leak(srv):
    for stream in (False, True):
        st, _, data = srv.request("POST", C, body=chat(messages=M("MOCK_FAIL please"), stream=stream))
        if not stream:
            assert st == 500
            err = json.loads(data)["error"]
            assert err["message"] == "internal server error" and err["type"] == "server_error"
        else:
            assert st == 200 and b"internal server error" in data and data.rstrip().endswith(b"data: [DONE]")
        assert b"secret" not in data and b"deadbeef" not in data
    assert "secret detail" in srv.log()  # the detail is logged, never sent
    st, _, _ = srv.request("POST", C, body=chat(messages=M("SCRIPT:fine"), max_tokens=10))
    assert st == 200
