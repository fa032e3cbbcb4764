"""Prefix cache through the real server (issue 6), on the tiny mlx-lm test model (CPU).

A conversation's next turn re-sends the history with the model's reply re-rendered by the
chat template, which is never token-identical to what was generated; the scheduler
therefore checkpoints prompts where turns start: after the system prompt and before the
generation prompt. These tests pin the consequences:
- every turn after the first hits, and reuses exactly the previous prompt minus its
  generation prompt (thinking on and off);
- two conversations that branch from one system prompt both reuse it;
- greedy outputs are identical with and without the cache;
- a tiny cache budget (constant eviction) changes nothing but the hit counts;
- requests that arrive together with one long system prompt prefill it once: the others
  wait in the queue for the first one's checkpoint, then restore it.
"""
import subprocess

import pytest

from models import ORCHID, model_dir
from serverproc import MODEL, Server, run_together

# "<|im_start|>assistant\n<think>\n\n</think>\n\n" (thinking off) and "<|im_start|>assistant\n<think>\n" (on)
GEN_PROMPT_TOKENS = {False: 7, True: 5}


def system(tag):
    return f"[{tag}] You are a careful assistant who answers briefly. " * 12


def chat(client, messages, thinking, max_tokens=5):
    return client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0,
        extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})


def reply_message(r):
    m = r.choices[0].message
    out = {"role": "assistant", "content": m.content or ""}
    if getattr(m, "reasoning_content", None):
        out["reasoning_content"] = m.reasoning_content
    return out


def conversation(client, sys_prompt, thinking, turns, tag):
    """Runs `turns` turns; returns [(prompt_tokens, cached_tokens, text)] per turn."""
    msgs = [{"role": "system", "content": sys_prompt}]
    out = []
    for t in range(turns):
        msgs.append({"role": "user", "content": f"{tag} question {t}: what is {t} plus {t}?"})
        r = chat(client, msgs, thinking)
        out.append((r.usage.prompt_tokens, r.usage.prompt_tokens_details.cached_tokens,
                    (r.choices[0].message.content or "") + "|" + (getattr(r.choices[0].message, "reasoning_content", None) or "")))
        msgs.append(reply_message(r))
    return out


def n_tokens(text):
    r = subprocess.run([str(ORCHID), "tokenize", "--model", str(model_dir("tiny")), "--text", text],
                       capture_output=True, text=True, check=True)
    return len(r.stdout.split())


@pytest.fixture(scope="module")
def cached_srv():
    with Server(mock=False, model=model_dir("tiny"), args=["--max-seq", "2048", "--parallel", "2"]) as s:
        yield s


@pytest.mark.parametrize("thinking", [False, True])
def test_every_turn_after_the_first_hits(cached_srv, thinking):
    gens0 = cached_srv.metric("orchid_generations_total")
    hits0 = cached_srv.metric("orchid_prefix_cache_hit_generations_total")
    turns = conversation(cached_srv.client(timeout=120), system(f"multi-{thinking}"), thinking, 5, "m")
    assert turns[0][1] == 0, "a new system prompt cannot hit"
    # /metrics' hit rate counts the same turns
    assert cached_srv.metric("orchid_generations_total") - gens0 == len(turns)
    assert cached_srv.metric("orchid_prefix_cache_hit_generations_total") - hits0 == len(turns) - 1
    for k in range(1, len(turns)):
        prev_prompt, (prompt, cached, _) = turns[k - 1][0], turns[k]
        assert cached == prev_prompt - GEN_PROMPT_TOKENS[thinking], (k, turns)
        assert cached < prompt


def test_branches_share_the_system_prompt(cached_srv):
    client = cached_srv.client(timeout=120)
    sys_prompt = system("branch")
    a = conversation(client, sys_prompt, False, 1, "first")
    b = conversation(client, sys_prompt, False, 1, "second")
    sys_turn = n_tokens("<|im_start|>system\n" + sys_prompt.strip() + "<|im_end|>\n")
    assert a[0][1] == 0
    assert b[0][1] == sys_turn, (b, sys_turn)


def test_outputs_identical_without_cache_and_under_eviction(cached_srv):
    """Three interleaved conversations: same greedy text with the cache, without it, and
    with a budget of a few checkpoints (evicting all the time)."""
    def run(client):
        res = []
        msgs = {i: [{"role": "system", "content": system(f"ident-{i % 2}")}] for i in range(3)}
        for t in range(3):
            for i in range(3):
                msgs[i].append({"role": "user", "content": f"conversation {i} turn {t}"})
                r = chat(client, msgs[i], False)
                res.append((r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens))
                msgs[i].append(reply_message(r))
        return res

    with_cache = run(cached_srv.client(timeout=120))
    with Server(mock=False, model=model_dir("tiny"), args=["--max-seq", "2048", "--prefix-cache-mb", "0"]) as s:
        without = run(s.client(timeout=120))
    with Server(mock=False, model=model_dir("tiny"), args=["--max-seq", "2048", "--cache-mem", "0.0006"]) as s:
        evicting = run(s.client(timeout=120))
        # the budget is 629 KiB, not 0 MiB (off): checkpoints were saved and evicted
        assert s.metric("orchid_prefix_cache_max_bytes") == int(0.0006 * (1 << 30))
        assert s.metric("orchid_prefix_cache_saves_total") > 0
        assert s.metric("orchid_prefix_cache_evictions_total") > 0
        # the hit rate's two counters: every finished generation, and those that reused tokens
        assert s.metric("orchid_generations_total") == len(evicting)
        assert s.metric("orchid_prefix_cache_hit_generations_total") == sum(c > 0 for _, c in evicting)
        assert 0 <= s.metric("orchid_prefix_cache_hits_total") <= s.metric("orchid_prefix_cache_lookups_total")
        assert s.metric("orchid_prefix_cache_lookups_total") <= len(evicting)
    assert [t for t, _ in with_cache] == [t for t, _ in without] == [t for t, _ in evicting]
    assert all(c == 0 for _, c in without)
    assert sum(c > 0 for _, c in with_cache) >= 6  # turns 2 and 3 of every conversation
    # six checkpoints need more than the 0.6 MiB budget: some hits must have been evicted
    assert sum(c for _, c in evicting) < sum(c for _, c in with_cache)


def test_concurrent_requests_prefill_a_shared_system_prompt_once():
    """An agent's fan-out: four requests at once, one ~1,500-token system prompt (three
    prefill steps of 512 on the CPU), different questions. The first prefills the system
    turn and checkpoints it; the others wait in the queue for that checkpoint and restore
    it (cached = the system turn) instead of prefilling it beside it. Greedy texts are
    those of the same requests alone without a cache."""
    sys_prompt = "[fan-out] You are a careful assistant who answers briefly and checks every step. " * 90
    sys_turn = n_tokens("<|im_start|>system\n" + sys_prompt.strip() + "<|im_end|>\n")
    assert sys_turn > 1024

    def ask(client, k):
        msgs = [{"role": "system", "content": sys_prompt}, {"role": "user", "content": f"question {k}: {k} plus {k}?"}]
        r = chat(client, msgs, False)
        return r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens

    with Server(mock=False, model=model_dir("tiny"), args=["--max-seq", "4096", "--parallel", "4"]) as s:
        client = s.client(timeout=300)
        got = run_together({k: (lambda k=k: ask(client, k)) for k in range(4)}, timeout=300)
        waits = s.metric("orchid_prefix_cache_shared_waits_total")
    with Server(mock=False, model=model_dir("tiny"), args=["--max-seq", "4096", "--prefix-cache-mb", "0"]) as s:
        client = s.client(timeout=300)
        alone = {k: ask(client, k) for k in range(4)}
    cached = sorted(c for _, c in got.values())
    assert cached == [0, sys_turn, sys_turn, sys_turn], (cached, sys_turn, waits)
    assert waits >= 1
    assert {k: t for k, (t, _) in got.items()} == {k: t for k, (t, _) in alone.items()}
    assert all(c == 0 for _, c in alone.values())


def test_a_cancelled_request_releases_those_waiting_for_its_checkpoint():
    """The first request of a fan-out disconnects while it prefills the shared system
    prompt, with a second one waiting in the queue for its checkpoint: the second is
    admitted all the same (it reuses what the first fed, left in its slot) and completes."""
    import http.client
    import json
    import socket
    import time

    def wait_metric(srv, name, want, timeout=5.0):
        end = time.time() + timeout
        while time.time() < end and srv.metric(name) != want:
            time.sleep(0.02)
        return srv.metric(name) == want

    sys_prompt = "[cancel] You are a careful assistant who answers briefly and checks every step. " * 90

    def send(port, user):
        body = json.dumps({"model": MODEL, "max_tokens": 3, "temperature": 0, "messages": [
            {"role": "system", "content": sys_prompt}, {"role": "user", "content": user}],
            "chat_template_kwargs": {"enable_thinking": False}})
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        return c

    with Server(mock=False, model=model_dir("tiny"), args=["--max-seq", "4096", "--parallel", "4"]) as s:
        a = send(s.port, "first")
        b = send(s.port, "second")
        waited = False
        for _ in range(200):  # b queued behind a's checkpoint (a prefills 1.5k tokens, 512 a step)
            if s.metric("orchid_prefix_cache_shared_waits_total") == 1:
                waited = True
                break
            time.sleep(0.005)
        a.sock.shutdown(socket.SHUT_RDWR)  # cancelled within a step, before or after its checkpoint
        a.close()
        r = b.getresponse()
        reply = json.loads(r.read())
        b.close()
        assert waited, "the second request never waited for the first one's checkpoint"
        assert r.status == 200 and reply["choices"][0]["finish_reason"] in ("stop", "length"), reply
        assert wait_metric(s, "orchid_requests_cancelled_total", 1)
