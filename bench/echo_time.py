#!/usr/bin/env python3
"""bench/echo_time.py — how fast a server scores prompts: /v1/completions with `echo`,
`logprobs` and max_tokens 0 (lm-evaluation-harness's loglikelihood requests), timed end to
end against one `orchid serve` process (started here, or --url). Token-id prompts of
--prompt-tokens ids; --requests of them one at a time, then --concurrent at once; reports
each set's wall time and prompt tokens scored a second, and checks every reply has a
logprob for each prompt token after the first. Standard library only (serve_load.py's
Server and request helpers), so it runs on the device machine; run it against the CUDA
server with and without its row scores (ORCHID_NO_ROW_SCORES=1: the logits rows go to the
host, 16 a forward) for the A/B.

  bench/echo_time.py --orchid build/orchid --model DIR [--backend cuda] [--json out.json]
"""
import argparse
import json
import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_load import Server, add_server_args, model_id, request  # noqa: E402


def score(url, ids, top):
    body = {"model": model_id(url), "prompt": ids, "echo": True, "logprobs": top, "max_tokens": 0, "temperature": 0}
    st, raw = request(url, "POST", "/v1/completions", body)
    if st != 200:
        raise RuntimeError("HTTP %d: %s" % (st, raw[:300]))
    lps = json.loads(raw)["choices"][0]["logprobs"]["token_logprobs"]
    if len(lps) != len(ids) or lps[0] is not None or any(v is None for v in lps[1:]):
        raise RuntimeError("a reply without the prompt's logprobs (%d entries for %d tokens)" % (len(lps), len(ids)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_server_args(ap, port=18431, max_seq=4096, model="", ready_timeout=600)
    ap.add_argument("--url", help="an already running server instead")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--concurrent", type=int, default=8)
    ap.add_argument("--top", type=int, default=1, help="logprobs (alternatives) a token")
    ap.add_argument("--vocab", type=int, default=151643, help="ids drawn below this")
    ap.add_argument("--json")
    args = ap.parse_args()
    rng = random.Random(5)
    prompts = [[rng.randrange(args.vocab) for _ in range(args.prompt_tokens)] for _ in range(args.requests + args.concurrent)]
    srv = Server(args, args.port, ["--parallel", str(args.parallel)], "echo_time_server.log", url=args.url)
    out = {"prompt_tokens": args.prompt_tokens, "top": args.top}
    try:
        score(srv.url, prompts[0][:64], args.top)  # warm-up (first forward's allocations)
        t0 = time.time()
        for p in prompts[:args.requests]:
            score(srv.url, p, args.top)
        dt = time.time() - t0
        out["serial_s"] = dt
        out["serial_tok_s"] = args.requests * args.prompt_tokens / dt
        errors = []

        def one(p):
            try:
                score(srv.url, p, args.top)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(str(e))

        threads = [threading.Thread(target=one, args=(p,)) for p in prompts[args.requests:]]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        dt = time.time() - t0
        if errors:
            raise RuntimeError(errors[0])
        out["concurrent_s"] = dt
        out["concurrent_tok_s"] = args.concurrent * args.prompt_tokens / dt
    finally:
        srv.stop()
    print("echo time: %d-token prompts, logprobs %d: one at a time %.0f tok/s (%d in %.2f s), %d at once %.0f tok/s (%.2f s)"
          % (args.prompt_tokens, args.top, out["serial_tok_s"], args.requests, out["serial_s"], args.concurrent,
             out["concurrent_tok_s"], out["concurrent_s"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
