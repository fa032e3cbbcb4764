#!/usr/bin/env python3
"""bench/serve_load.py — load test of `orchid serve` (continuous batching and the
prefix cache, issue 6). Standard library only (http.client + threads).

(a) Concurrency sweep: for N in --levels (default 1,8,32,64), N streaming clients at
    once, each one /v1/completions request with a token-id prompt of --prompt-tokens
    (exact length) and max_tokens --gen-tokens, greedy, ignore_eos (the server's vLLM-style
    extension, so a random model cannot stop early; the actual completion tokens from
    `usage` are counted anyway). Measured per level: aggregate decode tok/s (completion
    tokens / (last token − first token of the level)), aggregate end-to-end tok/s
    (completion tokens / level wall time), p50/p99 time to first token, p50/p99/mean
    inter-token latency (gaps between streamed chunks of one request, each chunk counted
    as carrying completion_tokens / chunks of its request) and the longest gap; the rate while every request
    of the level decodes (tokens streamed between the last first token and the first last
    token, over that span: the batched decode without the prefills that overlap the first
    figure's start) and the first tokens' spread; and, from the server's /metrics, the
    scheduler's steps in the level: mean step wall time and the part of it on the host
    outside the model's forwards. With --serial-url (or
    --serial, which starts a second server with --parallel 1) the same requests are also
    served one at a time, side by side: levels in --serial-levels.
(b) Multi-turn replay: one conversation of --turns turns (default 20) on a system prompt of
    --system-tokens (default 4096) token ids; turn k sends system + (user_i + assistant_i
    for i < k) + user_k, with fixed synthetic user/assistant token ids (so the history is
    exact; the model's own reply is not fed back), generating --turn-gen tokens. TTFT per
    turn and usage.prompt_tokens_details.cached_tokens, with the prefix cache on and off
    (the off server runs with --prefix-cache-mb 0).
(c) Fan-out: --fanout chat requests at once sharing one system prompt of about
    --system-tokens tokens, different questions: TTFT p50 / max, wall, cached tokens of each
    (a request that waited for the first one's checkpoint of the system turn reuses it).

Servers: --url uses a running server (the on/off and serial comparisons then need
--url-nocache / --serial-url), otherwise `build/orchid serve` is started with --model,
--backend, --port and the flags each part needs, and stopped afterwards.
Writes --json (default serve_load.json) and prints markdown tables.
"""
import argparse
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.parse


MODEL_IDS = {}  # url -> the served model id (requests must name it)


def model_id(url):
    if url not in MODEL_IDS:
        st, body = request(url, "GET", "/v1/models", None, timeout=30)
        MODEL_IDS[url] = json.loads(body)["data"][0]["id"] if st == 200 else "orchid"
    return MODEL_IDS[url]


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    i = int(k)
    j = min(i + 1, len(xs) - 1)
    return xs[i] + (xs[j] - xs[i]) * (k - i)


def add_server_args(ap, port, max_seq, model=None, backend="cuda", ready_timeout=300):
    """The flags Server reads (--orchid, --model, --backend, --port, --max-seq,
    --ready-timeout, --log-dir), with this script's defaults; model None: required."""
    ap.add_argument("--orchid", default="build/orchid")
    ap.add_argument("--model", default=model, required=model is None)
    ap.add_argument("--backend", default=backend)
    ap.add_argument("--port", type=int, default=port)
    ap.add_argument("--max-seq", type=int, default=max_seq)
    ap.add_argument("--ready-timeout", type=int, default=ready_timeout)
    ap.add_argument("--log-dir", default=".")


class Server:
    """An `orchid serve` child process (or a given URL)."""

    def __init__(self, args, port, extra, log_name, url=None, env=None):
        self.proc = None
        self.log = None
        if url:
            self.url = url.rstrip("/")
            return
        self.url = "http://127.0.0.1:%d" % port
        cmd = [args.orchid, "serve", "--model", args.model, "--backend", args.backend, "--port", str(port),
               "--max-seq", str(args.max_seq), "--quiet"] + extra
        self.log = open(os.path.join(args.log_dir, log_name), "w")
        print("starting: " + " ".join(cmd), file=sys.stderr, flush=True)
        self.t_start = time.time()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.wait_ready(args.ready_timeout)
        print("  ready after %.1f s" % (time.time() - self.t_start), file=sys.stderr, flush=True)

    def wait_ready(self, timeout):
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.proc and self.proc.poll() is not None:
                raise RuntimeError("server exited with %d (see its log)" % self.proc.returncode)
            try:
                st, body = request(self.url, "GET", "/health", None, timeout=5)
                if st == 200:
                    return
                if b"error" in body:
                    raise RuntimeError("server failed: %s" % body[:300])
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.5)
        raise RuntimeError("server not ready after %d s" % timeout)

    def stop(self):
        if self.proc:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        if self.log:
            self.log.close()
            self.log = None


def request(url, method, path, body, timeout=600):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        c.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def metrics_lines(url, prefix):
    """The server's /metrics lines whose names start with prefix, as {name: value}."""
    try:
        status, body = request(url, "GET", "/metrics", None, timeout=30)
    except (OSError, http.client.HTTPException) as e:
        return {"error": str(e)}
    if status != 200:
        return {"error": "status %d" % status}
    got = {}
    for line in body.decode(errors="replace").splitlines():
        if line.startswith(prefix) and "{" not in line:
            name, _, value = line.rpartition(" ")
            got[name] = float(value)
    return got


SCHED = ("orchid_scheduler_steps_total", "orchid_scheduler_forward_seconds_total", "orchid_scheduler_host_seconds_total")


def sched_delta(before, after):
    """What the scheduler did between two metrics_lines(url, "orchid_scheduler_") reads: steps,
    mean step wall time, and its split into model forwards and host work around them (the
    model idles during the latter). Empty when the server does not report them."""
    if any(k not in before or k not in after for k in SCHED):
        return {}
    steps, fwd, host = (after[k] - before[k] for k in SCHED)
    if steps <= 0:
        return {}
    return {"sched_steps": int(steps), "sched_step_ms": (fwd + host) / steps * 1e3,
            "sched_forward_ms": fwd / steps * 1e3, "sched_host_ms": host / steps * 1e3}


def cache_metrics(url):
    """The server's orchid_prefix_cache_* lines of /metrics after the sweep (what the prefix
    cache did under that load: saves, evictions, host blocks pinned and the time they took)."""
    got = metrics_lines(url, "orchid_prefix_cache")
    if got and "error" not in got:
        print("  prefix cache after the sweep: " + ", ".join("%s %g" % (k[len("orchid_prefix_cache_"):], v)
                                                           for k, v in got.items()))
    return got


# Sampling parameters of every request (--temperature / --top-p / --top-k; greedy by default).
SAMPLING = {"temperature": 0}


def stream_completion(url, prompt_ids, max_tokens, t_origin):
    """One streaming /v1/completions request; returns times relative to t_origin."""
    body = {"model": model_id(url), "prompt": prompt_ids, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}, **SAMPLING}
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=1200)
    res = {"t_send": time.time() - t_origin, "chunks": [], "completion_tokens": None, "cached_tokens": None,
           "prompt_tokens": None, "error": None, "finish_reason": None}
    try:
        c.request("POST", "/v1/completions", body=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            res["error"] = "HTTP %d: %s" % (r.status, r.read()[:300].decode("utf-8", "replace"))
            return res
        buf = b""
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            now = time.time() - t_origin
            try:
                ev = json.loads(data)
            except ValueError:
                buf += data
                continue
            if ev.get("error"):
                res["error"] = str(ev["error"])[:300]
                break
            ch = ev.get("choices") or []
            if ch:
                if ch[0].get("text"):
                    res["chunks"].append(now)
                if ch[0].get("finish_reason"):
                    res["finish_reason"] = ch[0]["finish_reason"]
                    if not res["chunks"]:
                        res["chunks"].append(now)
            us = ev.get("usage")
            if us:
                res["completion_tokens"] = us.get("completion_tokens")
                res["prompt_tokens"] = us.get("prompt_tokens")
                res["cached_tokens"] = (us.get("prompt_tokens_details") or {}).get("cached_tokens")
    except (OSError, http.client.HTTPException) as e:
        res["error"] = repr(e)
    finally:
        c.close()
    res["t_end"] = time.time() - t_origin
    return res


def run_level(url, prompts, gen, concurrent):
    """All prompts; `concurrent` at a time (len(prompts) at once for the batched server)."""
    t0 = time.time()
    out = [None] * len(prompts)
    sem = threading.Semaphore(concurrent)

    def work(i):
        with sem:
            out[i] = stream_completion(url, prompts[i], gen, t0)

    th = [threading.Thread(target=work, args=(i,)) for i in range(len(prompts))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.time() - t0
    return summarize(out, wall)


def summarize(rs, wall):
    errors = [r["error"] for r in rs if r["error"]]
    ok = [r for r in rs if not r["error"] and r["chunks"]]
    ttft = [r["chunks"][0] - r["t_send"] for r in ok]
    itl = []
    toks = 0
    for r in ok:
        n = r["completion_tokens"] if r["completion_tokens"] is not None else len(r["chunks"])
        toks += n
        c = r["chunks"]
        per = n / len(c) if c else 1.0  # tokens per streamed chunk of this request
        for a, b in zip(c, c[1:]):
            itl.append((b - a) / per)
    first = min((r["chunks"][0] for r in ok), default=0.0)
    last = max((r["chunks"][-1] for r in ok), default=0.0)
    decode_span = last - first
    # The span in which every request of the level is decoding: from the last first token
    # to the first last token. agg_decode_tok_s above also holds the prompts still being
    # prefilled at its start and the stragglers at its end; this is the batched decode alone.
    all_a = max((r["chunks"][0] for r in ok), default=0.0)
    all_b = min((r["chunks"][-1] for r in ok), default=0.0)
    in_all = 0.0
    for r in ok:
        n = r["completion_tokens"] if r["completion_tokens"] is not None else len(r["chunks"])
        per = n / len(r["chunks"])
        in_all += per * sum(1 for t in r["chunks"] if all_a < t <= all_b)
    return {
        "requests": len(rs), "ok": len(ok), "errors": errors[:5], "n_errors": len(errors),
        "completion_tokens": toks, "wall_s": wall,
        "agg_decode_tok_s": toks / decode_span if decode_span > 0 else float("nan"),
        "agg_e2e_tok_s": toks / wall if wall > 0 else float("nan"),
        "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
        "itl_p50_ms": pct(itl, 50) * 1e3, "itl_p99_ms": pct(itl, 99) * 1e3,
        "itl_mean_ms": sum(itl) / len(itl) * 1e3 if itl else float("nan"),
        "itl_max_ms": max(itl) * 1e3 if itl else float("nan"),
        "first_token_spread_s": all_a - first,
        "all_decoding_s": all_b - all_a,
        "all_decoding_tok_s": in_all / (all_b - all_a) if all_b > all_a else float("nan"),
        "finish_reasons": sorted(set(str(r["finish_reason"]) for r in ok)),
    }


def make_prompts(n, length, seed, vocab_lo, vocab_hi):
    rng = random.Random(seed)
    return [[rng.randrange(vocab_lo, vocab_hi) for _ in range(length)] for _ in range(n)]


def sweep(args, url, levels, label, serial):
    res = {}
    # warm-up: a short request, then two prompts of the measured length at once, so the first
    # level does not pay for first uses (CUDA loads a kernel's module on its first launch: the
    # packed prefill's, the batched decode's). On the H200 the 64-stream level run first had
    # ~0.6 s more time to first token than run last; part of that may be the prefix cache's
    # first pinned host blocks, which this does not warm (not separated).
    stream_completion(url, make_prompts(1, 32, 999, args.vocab_lo, args.vocab_hi)[0], 8, time.time())
    run_level(url, make_prompts(2, args.prompt_tokens, 998, args.vocab_lo, args.vocab_hi), 8, 1 if serial else 2)
    for n in levels:
        prompts = make_prompts(n, args.prompt_tokens, 1000 + n, args.vocab_lo, args.vocab_hi)
        print("  %s: N=%d ..." % (label, n), file=sys.stderr, flush=True)
        before = metrics_lines(url, "orchid_scheduler_")
        r = run_level(url, prompts, args.gen_tokens, 1 if serial else n)
        time.sleep(0.1)  # a step is counted at its end, just after its tokens went out
        r.update(sched_delta(before, metrics_lines(url, "orchid_scheduler_")))
        res[str(n)] = r
        print("    %s" % json.dumps({k: r[k] for k in ("ok", "n_errors", "completion_tokens", "wall_s", "agg_decode_tok_s",
                                                    "all_decoding_tok_s", "ttft_p50_s", "itl_p50_ms", "sched_step_ms",
                                                    "sched_host_ms") if k in r}), file=sys.stderr, flush=True)
    return res


def multiturn(args, url, label):
    rng = random.Random(7)
    lo, hi = args.vocab_lo, args.vocab_hi
    system = [rng.randrange(lo, hi) for _ in range(args.system_tokens)]
    hist = list(system)
    turns = []
    for k in range(args.turns):
        user = [rng.randrange(lo, hi) for _ in range(args.user_tokens)]
        prompt = hist + user
        t0 = time.time()
        r = stream_completion(url, prompt, args.turn_gen, t0)
        if r["error"]:
            turns.append({"turn": k + 1, "error": r["error"]})
            print("    %s turn %d: %s" % (label, k + 1, r["error"]), file=sys.stderr, flush=True)
            break
        ttft = r["chunks"][0] - r["t_send"]
        turns.append({"turn": k + 1, "prompt_tokens": len(prompt), "cached_tokens": r["cached_tokens"], "ttft_s": ttft,
                      "total_s": r["t_end"] - r["t_send"]})
        asst = [rng.randrange(lo, hi) for _ in range(args.asst_tokens)]
        hist = prompt + asst
    print("  %s: TTFT %s" % (label, ", ".join("%.3f" % t.get("ttft_s", float("nan")) for t in turns)),
          file=sys.stderr, flush=True)
    return turns


FANOUT_SENTENCE = "You are a careful assistant who answers briefly and checks every step of your work. "


def fanout(args, url, label):
    """An agent's fan-out: --fanout chat requests at once, one system prompt of about
    --system-tokens tokens (a sentence of ~16 repeated, behind a tag new to this server so
    no earlier checkpoint matches), each its own question, --turn-gen tokens each, streamed.
    Returns TTFT p50 / max, the wall until the last finished, and each request's cached
    tokens (with the prefix cache, all but one should reuse the system turn)."""
    tag = "[fan-out %d.%d] " % (os.getpid(), int(time.time() * 1e6))
    system = tag + FANOUT_SENTENCE * max(1, args.system_tokens // 16)
    t0 = time.time()
    res = [None] * args.fanout

    def one(k):
        body = {"model": model_id(url), "messages": [{"role": "system", "content": system},
                                                   {"role": "user", "content": "question %d: what is %d plus %d?" % (k, k, k)}],
                "max_tokens": args.turn_gen, "stream": True, "stream_options": {"include_usage": True},
                "chat_template_kwargs": {"enable_thinking": False}, **SAMPLING}
        u = urllib.parse.urlparse(url)
        c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=1200)
        r = {"ttft": None, "cached": None, "error": None}
        try:
            c.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                      headers={"Content-Type": "application/json"})
            resp = c.getresponse()
            if resp.status != 200:
                r["error"] = "HTTP %d" % resp.status
            while r["error"] is None:
                line = resp.readline()
                if not line:
                    break
                line = line.strip()
                if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                    continue
                ev = json.loads(line[5:])
                ch = ev.get("choices") or []
                if ch and r["ttft"] is None and ((ch[0].get("delta") or {}).get("content") or
                                                 (ch[0].get("delta") or {}).get("reasoning_content")):
                    r["ttft"] = time.time() - t0
                if ev.get("usage"):
                    r["cached"] = (ev["usage"].get("prompt_tokens_details") or {}).get("cached_tokens")
                    r["prompt_tokens"] = ev["usage"].get("prompt_tokens")
        except (OSError, http.client.HTTPException, ValueError) as e:
            r["error"] = repr(e)
        finally:
            c.close()
        r["end"] = time.time() - t0
        res[k] = r

    th = [threading.Thread(target=one, args=(k,)) for k in range(args.fanout)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    ok = [r for r in res if not r["error"]]
    ttft = [r["ttft"] if r["ttft"] is not None else r["end"] for r in ok]
    out = {"requests": args.fanout, "ok": len(ok), "errors": [r["error"] for r in res if r["error"]][:3],
           "prompt_tokens": ok[0].get("prompt_tokens") if ok else None,
           "ttft_p50_s": pct(ttft, 50), "ttft_max_s": max(ttft) if ttft else float("nan"),
           "wall_s": max((r["end"] for r in ok), default=float("nan")), "cached": sorted(r["cached"] or 0 for r in ok)}
    print("  %s: %s" % (label, json.dumps(out)), file=sys.stderr, flush=True)
    return out


def fmt(x, f="%.1f"):
    return "–" if x is None or x != x else f % x


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_args(ap, port=8123, max_seq=8192, model="models/tiny")
    ap.add_argument("--url", help="a running server (cache on, batched); skips starting one")
    ap.add_argument("--url-nocache", help="a running server with --prefix-cache-mb 0 (for the replay's cache-off column)")
    ap.add_argument("--serial-url", help="a running server with --parallel 1")
    ap.add_argument("--levels", default="1,8,32,64")
    ap.add_argument("--serial-levels", default="1,8", help="levels also served one at a time ('' = none)")
    ap.add_argument("--parallel", type=int, default=64, help="--parallel of the batched server")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=256)
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--system-tokens", type=int, default=4096)
    ap.add_argument("--user-tokens", type=int, default=64)
    ap.add_argument("--asst-tokens", type=int, default=64)
    ap.add_argument("--turn-gen", type=int, default=16)
    ap.add_argument("--vocab-lo", type=int, default=1000)
    ap.add_argument("--vocab-hi", type=int, default=150000)
    ap.add_argument("--fanout", type=int, default=8, help="requests of the fan-out part (one system prompt)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: sweep,serial,replay,nocache,fanout")
    ap.add_argument("--temperature", type=float, default=0.0, help="sampling temperature of every request (0 = greedy)")
    ap.add_argument("--top-p", type=float, default=None, help="top_p of every request (default: not sent)")
    ap.add_argument("--top-k", type=int, default=None, help="top_k of every request (default: not sent)")
    ap.add_argument("--seed", type=int, default=None, help="seed of every request (default: not sent)")
    ap.add_argument("--json", default="serve_load.json")
    ap.add_argument("--server-args", default="", help="more flags for every server started (e.g. '--batch-invariant off')")
    args = ap.parse_args()
    SAMPLING["temperature"] = args.temperature
    for key, val in (("top_p", args.top_p), ("top_k", args.top_k), ("seed", args.seed)):
        if val is not None:
            SAMPLING[key] = val
    skip = set(s for s in args.skip.split(",") if s)
    levels = [int(x) for x in args.levels.split(",") if x]
    serial_levels = [int(x) for x in args.serial_levels.split(",") if x]
    out = {"config": vars(args), "batched": {}, "serial": {}, "replay_cache_on": [], "replay_cache_off": [], "fanout": {}}

    def save():
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)

    # batched server, prefix cache on: the sweep, then the replay
    if not ({"sweep", "replay", "fanout"} <= skip):
        s = Server(args, args.port, ["--parallel", str(args.parallel)] + args.server_args.split(), "serve_batched.log",
                   args.url)
        try:
            if "sweep" not in skip:
                out["batched"] = sweep(args, s.url, levels, "batched", False)
                out["batched_cache_metrics"] = cache_metrics(s.url)
                save()
            if "replay" not in skip:
                out["replay_cache_on"] = multiturn(args, s.url, "replay, cache on")
                save()
            if "fanout" not in skip:
                out["fanout"] = fanout(args, s.url, "fan-out")
                save()
        finally:
            s.stop()
    # one-at-a-time server, prefix cache off: the serial sweep and the cache-off replay
    want_serial = "serial" not in skip and serial_levels
    want_off = "replay" not in skip and "nocache" not in skip
    if want_serial or want_off:
        given = args.serial_url or args.url_nocache
        if args.url and not given:
            print("no --serial-url / --url-nocache: serial and cache-off parts skipped", file=sys.stderr)
        else:
            s = Server(args, args.port + 1, ["--parallel", "1", "--prefix-cache-mb", "0"] + args.server_args.split(),
                       "serve_serial_nocache.log", given)
            try:
                if want_serial:
                    out["serial"] = sweep(args, s.url, serial_levels, "serial", True)
                    save()
                if want_off:
                    out["replay_cache_off"] = multiturn(args, s.url, "replay, cache off")
                    save()
            finally:
                s.stop()
    save()

    print("\n| streams | batched decode tok/s | all decoding tok/s | batched e2e tok/s | TTFT p50 / p99 (s) |"
          " ITL p50 / p99 / mean / max (ms) | step ms (host) | one-at-a-time e2e tok/s | one-at-a-time TTFT p50 / p99 (s) |"
          " tokens | errors |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in levels:
        b = out["batched"].get(str(n))
        sr = out["serial"].get(str(n))
        if not b:
            continue
        print("| %d | %s | %s | %s | %s / %s | %s / %s / %s / %s | %s (%s) | %s | %s | %d | %d |" % (
            n, fmt(b["agg_decode_tok_s"], "%.0f"), fmt(b.get("all_decoding_tok_s"), "%.0f"),
            fmt(b["agg_e2e_tok_s"], "%.0f"), fmt(b["ttft_p50_s"], "%.3f"),
            fmt(b["ttft_p99_s"], "%.3f"), fmt(b["itl_p50_ms"]), fmt(b["itl_p99_ms"]), fmt(b.get("itl_mean_ms")),
            fmt(b.get("itl_max_ms")),
            fmt(b.get("sched_step_ms"), "%.2f"), fmt(b.get("sched_host_ms"), "%.2f"),
            fmt(sr["agg_e2e_tok_s"], "%.0f") if sr else "–",
            (fmt(sr["ttft_p50_s"], "%.2f") + " / " + fmt(sr["ttft_p99_s"], "%.2f")) if sr else "–",
            b["completion_tokens"], b["n_errors"] + (sr["n_errors"] if sr else 0)))
    on, off = out["replay_cache_on"], out["replay_cache_off"]
    if on or off:
        print("\n| turn | prompt tokens | cached (on) | TTFT cache on (s) | TTFT cache off (s) |")
        print("|---:|---:|---:|---:|---:|")
        for k in range(max(len(on), len(off))):
            a = on[k] if k < len(on) else {}
            b = off[k] if k < len(off) else {}
            print("| %d | %s | %s | %s | %s |" % (k + 1, a.get("prompt_tokens", b.get("prompt_tokens", "–")),
                                                 a.get("cached_tokens", "–"), fmt(a.get("ttft_s"), "%.3f"),
                                                 fmt(b.get("ttft_s"), "%.3f")))
    fo = out["fanout"]
    if fo:
        print("\n| fan-out requests | prompt tokens | TTFT p50 / max (s) | wall (s) | cached tokens | errors |")
        print("|---:|---:|---:|---:|---|---:|")
        print("| %d | %s | %s / %s | %s | %s | %d |" % (fo["requests"], fo["prompt_tokens"], fmt(fo["ttft_p50_s"], "%.3f"),
                                                    fmt(fo["ttft_max_s"], "%.3f"), fmt(fo["wall_s"], "%.3f"),
                                                    ", ".join(str(c) for c in fo["cached"]), fo["requests"] - fo["ok"]))
    print("\nwritten: %s" % args.json)


if __name__ == "__main__":
    main()
