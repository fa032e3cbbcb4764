"""Concurrency, cancellation, back-pressure, auth and lifecycle of `orchid serve`
(mock model): 32 concurrent streaming clients x 10 requests under the ASan
build, client disconnects (streaming and not) cancel generation within a step,
a full queue answers 429 with Retry-After, --api-key, /health while loading,
SIGINT/SIGTERM with work in flight exit 0.
"""

import json
import os
import signal
import socket
import threading
import time

import openai
import pytest

from serverproc import MODEL, Server

NOTHINK = {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}


def wait_for(fn, timeout=5.0, step=0.02):
    end = time.time() + timeout
    while time.time() < end:
        v = fn()
        if v:
            return v
        time.sleep(step)
    return fn()


def test_32_concurrent_streaming_clients_asan():
    n_clients, n_requests = 32, 10
    with Server(mock=True, asan=True, args=["--parallel", "8", "--max-queue", "64", "--quiet"],
                env={"ORCHID_MOCK_STEP_MS": "1"}) as srv:
        errors = []
        done = [0]
        lock = threading.Lock()

        def worker(ci):
            client = srv.client(timeout=120)
            for k in range(n_requests):
                text = f"client {ci} request {k}: é世 ok"
                try:
                    chunks = list(client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "SCRIPT:" + text}],
                        max_tokens=100, stream=True, stream_options={"include_usage": True}, **NOTHINK))
                    got = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                    fin = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
                    usage = chunks[-1].usage
                    if got != text or fin != ["stop"] or usage is None or \
                            usage.completion_tokens != len(text.encode()) + 1:
                        raise AssertionError(f"bad response {got!r} {fin} {usage}")
                    with lock:
                        done[0] += 1
                except Exception as e:  # noqa: BLE001 - collected and reported below
                    with lock:
                        errors.append(f"client {ci} request {k}: {e!r}")

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=240)
        assert not errors, errors[:5]
        assert done[0] == n_clients * n_requests
        assert wait_for(lambda: srv.metric('orchid_requests_total{endpoint="/v1/chat/completions",status="200"}')
                        == 320)
        assert wait_for(lambda: srv.metric("orchid_running_requests") == 0)
        assert srv.metric("orchid_queue_depth") == 0


@pytest.fixture(scope="module")
def serial():
    # one slot: a cancelled generation that kept running would block the next request
    with Server(mock=True, args=["--parallel", "1", "--max-queue", "1"]) as s:
        yield s


def test_stream_disconnect_cancels(serial):
    client = serial.client()
    before = serial.metric("orchid_requests_cancelled_total")
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "noise"}],
                                            max_tokens=4000, stream=True, **NOTHINK)
    n = 0
    for _ in stream:
        n += 1
        if n == 5:
            break
    stream.close()
    assert wait_for(lambda: serial.metric("orchid_requests_cancelled_total") == before + 1, 3.0)
    assert wait_for(lambda: serial.metric("orchid_running_requests") == 0)
    t0 = time.time()
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "SCRIPT:next"}],
                                       max_tokens=20, **NOTHINK)
    assert r.choices[0].message.content == "next"
    assert time.time() - t0 < 2.0
    assert "error=\"client disconnected\"" in serial.log()


def test_nonstream_disconnect_cancels(serial):
    before = serial.metric("orchid_requests_cancelled_total")
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "noise"}], "max_tokens": 4000,
                       "chat_template_kwargs": {"enable_thinking": False}}).encode()
    s = socket.create_connection(("127.0.0.1", serial.port))
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body)
    time.sleep(0.3)
    s.close()
    assert wait_for(lambda: serial.metric("orchid_requests_cancelled_total") == before + 1, 3.0)
    t0 = time.time()
    r = serial.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "SCRIPT:ok"}],
                                                max_tokens=20, **NOTHINK)
    assert r.choices[0].message.content == "ok" and time.time() - t0 < 2.0


def test_queue_full_429(serial):
    client = serial.client()
    a = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "noise"}],
                                       max_tokens=4000, stream=True, **NOTHINK)
    next(iter(a))
    assert wait_for(lambda: serial.metric("orchid_running_requests") == 1)
    b = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "noise"}],
                                       max_tokens=4000, stream=True, **NOTHINK)
    assert wait_for(lambda: serial.metric("orchid_queue_depth") == 1)
    st, h, body = serial.request("POST", "/v1/chat/completions",
                                 body={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert st == 429 and h.get("retry-after") == "1"
    assert json.loads(body)["error"]["code"] == "queue_full"
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2)
    a.close()
    b.close()
    assert wait_for(lambda: serial.metric("orchid_running_requests") == 0 and
                    serial.metric("orchid_queue_depth") == 0, 3.0)
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "SCRIPT:free"}],
                                       max_tokens=20, **NOTHINK)
    assert r.choices[0].message.content == "free"


def test_max_running_caps_the_batch():
    """--max-running N (the issue's name for --parallel N): three long streams, two run and
    the third waits in the queue until one finishes."""
    with Server(mock=True, args=["--max-running", "2", "--quiet"]) as srv:
        client = srv.client()
        streams = [client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "noise"}],
                                                  max_tokens=4000, stream=True, **NOTHINK) for _ in range(3)]
        for st in streams[:2]:
            next(iter(st))
        assert wait_for(lambda: srv.metric("orchid_running_requests") == 2 and srv.metric("orchid_queue_depth") == 1)
        streams[0].close()
        assert wait_for(lambda: srv.metric("orchid_running_requests") == 2 and srv.metric("orchid_queue_depth") == 0)
        for st in streams[1:]:
            st.close()
        assert wait_for(lambda: srv.metric("orchid_running_requests") == 0, 3.0)


def test_slow_client_does_not_stall_others():
    # a streaming client that never reads must not block the scheduler
    with Server(mock=True, args=["--parallel", "2"]) as srv:
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "noise"}], "max_tokens": 3000,
                           "stream": True, "chat_template_kwargs": {"enable_thinking": False}}).encode()
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        try:
            assert wait_for(lambda: srv.metric("orchid_running_requests") == 1)
            t0 = time.time()
            for _ in range(3):
                r = srv.client().chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "SCRIPT:quick"}], max_tokens=20, **NOTHINK)
                assert r.choices[0].message.content == "quick"
            assert time.time() - t0 < 3.0
        finally:
            s.close()
        assert wait_for(lambda: srv.metric("orchid_running_requests") == 0, 10.0)


def test_metrics_format(serial):
    serial.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "SCRIPT:m"}],
                                            max_tokens=5, **NOTHINK)
    st, h, body = serial.request("GET", "/metrics")
    assert st == 200 and h["content-type"].startswith("text/plain")
    text = body.decode()
    for name in ("orchid_requests_total", "orchid_prompt_tokens_total", "orchid_completion_tokens_total",
                 "orchid_queue_depth", "orchid_running_requests", "orchid_requests_cancelled_total",
                 "orchid_prefix_cache_hit_tokens_total", "orchid_session_tokens", "orchid_session_capacity_tokens"):
        assert f"# TYPE {name} " in text
    for h_ in ("orchid_time_to_first_token_seconds", "orchid_inter_token_latency_seconds"):
        assert f"# TYPE {h_} histogram" in text
        assert f'{h_}_bucket{{le="+Inf"}}' in text and f"{h_}_count" in text
    assert serial.metric("orchid_time_to_first_token_seconds_count") >= 1
    assert 0 < serial.metric("orchid_session_tokens") <= serial.metric("orchid_session_capacity_tokens") == 8192


def test_api_key():
    with Server(mock=True, args=["--api-key", "sekrit"]) as srv:
        st, _, body = srv.request("GET", "/v1/models")
        assert st == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
        st, _, _ = srv.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong"})
        assert st == 401
        st, _, _ = srv.request("GET", "/metrics")
        assert st == 401
        st, _, _ = srv.request("GET", "/health")
        assert st == 200
        with pytest.raises(openai.AuthenticationError):
            srv.client(api_key="nope").models.list()
        r = srv.client(api_key="sekrit").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "SCRIPT:authed"}], max_tokens=10, **NOTHINK)
        assert r.choices[0].message.content == "authed"


def test_health_while_loading():
    with Server(mock=True, wait_ready=False, env={"ORCHID_MOCK_LOAD_MS": "1500"}) as srv:
        st, _, body = srv.request("GET", "/health")
        assert st == 503 and json.loads(body)["status"] == "loading"
        st, _, body = srv.request("POST", "/v1/chat/completions",
                                  body={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
        assert st == 503 and json.loads(body)["error"]["code"] == "model_loading"
        assert wait_for(lambda: srv.request("GET", "/health")[0] == 200, 10.0)


def test_health_during_generation(serial):
    a = serial.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "noise"}],
                                                max_tokens=2000, stream=True, **NOTHINK)
    next(iter(a))
    t0 = time.time()
    st, _, _ = serial.request("GET", "/health")
    assert st == 200 and time.time() - t0 < 0.5
    a.close()
    assert wait_for(lambda: serial.metric("orchid_running_requests") == 0, 3.0)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_with_work_in_flight_exits_0(sig):
    srv = Server(mock=True)
    srv.__enter__()
    try:
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "noise"}], "max_tokens": 5000,
                           "stream": True, "chat_template_kwargs": {"enable_thinking": False}}).encode()
        s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        first = s.recv(4096)
        assert first.startswith(b"HTTP/1.1 200")
        result = {}

        def nonstream():
            try:
                srv.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "noise"}],
                                                     max_tokens=5000, **NOTHINK)
                result["ok"] = True
            except Exception as e:  # noqa: BLE001
                result["err"] = e

        t = threading.Thread(target=nonstream)
        t.start()
        assert wait_for(lambda: srv.metric("orchid_running_requests") == 2, 5.0)
        t0 = time.time()
        rc = srv.stop(sig, timeout=10)
        assert rc == 0, srv.log()[-3000:]
        assert time.time() - t0 < 5
        t.join(5)
        assert isinstance(result.get("err"), openai.APIStatusError) and result["err"].status_code == 503
        rest = b""
        while True:
            try:
                part = s.recv(65536)
            except OSError:
                break
            if not part:
                break
            rest += part
        s.close()
        assert b"data: [DONE]" in rest and b"shutting down" in rest
        assert "shutting down" in srv.log()
    finally:
        srv.__exit__(None, None, None)


def test_port_in_use_fails_cleanly():
    with Server(mock=True) as a:
        import subprocess

        from serverproc import orchid_bin
        p = subprocess.run([orchid_bin(), "serve", "--mock", "--port", str(a.port)], capture_output=True,
                           timeout=20)
        assert p.returncode == 1 and b"cannot listen" in p.stderr
        p = subprocess.run([orchid_bin(), "serve", "--bogus"], capture_output=True, timeout=20)
        assert p.returncode == 2
        # the prompt budget a step, by flag or environment: a bad value names its source
        p = subprocess.run([orchid_bin(), "serve", "--mock", "--max-prefill-tokens", "-1"], capture_output=True, timeout=20)
        assert p.returncode == 2 and b"--max-prefill-tokens" in p.stderr
        env = dict(os.environ, ORCHID_MAX_PREFILL_TOKENS="lots")
        p = subprocess.run([orchid_bin(), "serve", "--mock"], capture_output=True, timeout=20, env=env)
        assert p.returncode == 2 and b"ORCHID_MAX_PREFILL_TOKENS" in p.stderr
        p = subprocess.run([orchid_bin(), "serve", "--mock", "--prefill-chunk", "8"], capture_output=True, timeout=20)
        assert p.returncode == 2 and b"--prefill-chunk" in p.stderr
        env = dict(os.environ, ORCHID_PREFILL_CHUNK="4k")
        p = subprocess.run([orchid_bin(), "serve", "--mock"], capture_output=True, timeout=20, env=env)
        assert p.returncode == 2 and b"ORCHID_PREFILL_CHUNK" in p.stderr
        p = subprocess.run([orchid_bin(), "serve", "--port", "0", "--model", "/nonexistent/model"],
                           capture_output=True, timeout=20)
        assert p.returncode == 1 and b"/nonexistent/model" in p.stderr


def test_n_choices_asan_disconnect_and_queue_full():
    """'n' choices are jobs of their own, queued together or not at all: under ASan, several
    of them stream side by side, a disconnect cancels every one, a request whose choices do
    not fit the queue now is a 429 that queues none of them, and more choices than the queue
    ever holds is a 400."""
    with Server(mock=True, asan=True, args=["--parallel", "4", "--max-queue", "4", "--quiet"],
                env={"ORCHID_MOCK_STEP_MS": "1"}) as srv:
        client = srv.client(timeout=60)
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "SCRIPT:é世 ok"}],
                                           n=4, max_tokens=50, **NOTHINK)
        assert [c.message.content for c in r.choices] == ["é世 ok"] * 4
        before = srv.metric("orchid_requests_cancelled_total")
        stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "noise"}],
                                                n=3, max_tokens=4000, stream=True, **NOTHINK)
        seen = set()
        for i, c in enumerate(stream):
            seen.add(c.choices[0].index)
            if i == 30:
                break
        stream.close()
        assert seen == {0, 1, 2}
        assert wait_for(lambda: srv.metric("orchid_requests_cancelled_total") == before + 3, 3.0)
        assert wait_for(lambda: srv.metric("orchid_running_requests") == 0)
        body = {"model": MODEL, "messages": [{"role": "user", "content": "noise"}], "max_tokens": 4000,
                "chat_template_kwargs": {"enable_thinking": False}}
        st, _, resp = srv.request("POST", "/v1/chat/completions", body=dict(body, n=5))
        assert st == 400 and json.loads(resp)["error"]["param"] == "n"
        a = client.chat.completions.create(model=MODEL, messages=body["messages"], n=4, max_tokens=4000,
                                           stream=True, **NOTHINK)
        next(iter(a))
        assert wait_for(lambda: srv.metric("orchid_running_requests") == 4)
        b = client.chat.completions.create(model=MODEL, messages=body["messages"], n=3, max_tokens=4000,
                                           stream=True, **NOTHINK)
        assert wait_for(lambda: srv.metric("orchid_queue_depth") == 3)
        st, _, resp = srv.request("POST", "/v1/chat/completions", body=dict(body, n=2))
        assert st == 429 and json.loads(resp)["error"]["code"] == "queue_full"
        assert srv.metric("orchid_queue_depth") == 3
        a.close()
        b.close()
        assert wait_for(lambda: srv.metric("orchid_running_requests") == 0, 5.0)
        assert wait_for(lambda: srv.metric("orchid_queue_depth") == 0)
        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "SCRIPT:next"}],
                                           n=2, max_tokens=20, **NOTHINK)
        assert [c.message.content for c in r.choices] == ["next", "next"]
