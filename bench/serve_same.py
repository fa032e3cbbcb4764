#!/usr/bin/env python3
"""bench/serve_same.py — batch invariance of `orchid serve` end to end (issue 6): the same
greedy requests served together (staggered, so prompt chunks arrive while others decode)
and then one at a time must produce the same completions, token for token, with the same
logprobs to the last bit (random test weights rarely flip a greedy token, so the logprobs
are what shows a difference). Standard
library only (bench/serve_load.py's Server and request helpers).

Requests are /v1/completions with token-id prompts of mixed lengths (some above 64 tokens:
the prefill GEMM path on CUDA, some below: the batched-decode kernels), temperature 0,
ignore_eos, --gen tokens each, against one server started with --batch-invariant on|off
and the prefix cache off (so the one-at-a-time pass recomputes every prompt). Prints the
number of completions that differ; exits 1 when --expect-same and any differ.

--temperature T (> 0): the requests sample instead (top_p 0.9, top_k 40, seed 1000 + i, no
logprobs: on CUDA the device sampler's path); a seeded request must then draw the same
completion together and alone (batch-invariant logits, a deterministic draw).

  bench/serve_same.py --orchid build/orchid --model DIR --backend cuda [--invariant on|off]
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


def complete(url, prompt, gen, temperature=0.0, seed=0):
    """The completion's text and its top-2 logprobs (full float precision: a difference in
    the last bits of a logit shows there even where the greedy token does not change); a
    sampled request (temperature > 0): the text alone."""
    body = {"model": model_id(url), "prompt": prompt, "max_tokens": gen, "temperature": 0, "ignore_eos": True,
            "logprobs": 2}
    if temperature > 0:
        body.update(temperature=temperature, top_p=0.9, top_k=40, seed=seed)
        del body["logprobs"]
    st, raw = request(url, "POST", "/v1/completions", body)
    if st != 200:
        return None, "HTTP %d: %s" % (st, raw[:200])
    ch = json.loads(raw)["choices"][0]
    return json.dumps([ch["text"], ch.get("logprobs")], sort_keys=True), None


def main():
    ap = argparse.ArgumentParser()
    add_server_args(ap, port=8131, max_seq=2048)
    ap.add_argument("--invariant", default="on", choices=("on", "off"))
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--lengths", default="17,90,33,250,8,120,61,400,5,70,45,160",
                    help="prompt lengths, comma-separated (the first --requests of them)")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--stagger-ms", type=int, default=40)
    ap.add_argument("--expect-same", action="store_true")
    ap.add_argument("--temperature", type=float, default=0.0, help="> 0: seeded sampled requests instead of greedy")
    args = ap.parse_args()
    rnd = random.Random(7)
    lengths = [int(x) for x in args.lengths.split(",") if x][: args.requests]
    prompts = [[rnd.randrange(1000, 150000) for _ in range(n)] for n in lengths]
    srv = Server(args, args.port, ["--parallel", str(args.requests), "--prefix-cache-mb", "0", "--batch-invariant",
                                   args.invariant], "serve_same_%s.log" % args.invariant)
    try:
        together, errs = [None] * len(prompts), []

        def one(i):
            time.sleep(i * args.stagger_ms / 1000.0)
            together[i], e = complete(srv.url, prompts[i], args.gen, args.temperature, 1000 + i)
            if e:
                errs.append(e)

        t0 = time.time()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t1 = time.time()
        alone = []
        for i, p in enumerate(prompts):
            text, e = complete(srv.url, p, args.gen, args.temperature, 1000 + i)
            alone.append(text)
            if e:
                errs.append(e)
        t2 = time.time()
    finally:
        srv.stop()
    differ = [i for i in range(len(prompts)) if together[i] != alone[i]]
    print("%sbatch-invariant %s: %d requests (prompt lengths %s), %d tokens each: together %.2f s, one at a time %.2f s; "
          "%d completions differ %s, %d errors" % ("temperature %g, " % args.temperature if args.temperature > 0 else "",
                                                   args.invariant, len(prompts), lengths, args.gen, t1 - t0, t2 - t1,
                                                   len(differ), differ, len(errs)))
    for e in errs[:3]:
        print("  error: " + e)
    if errs or (args.expect_same and differ):
        sys.exit(1)


if __name__ == "__main__":
    main()
