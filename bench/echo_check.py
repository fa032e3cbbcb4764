#!/usr/bin/env python3
"""bench/echo_check.py — /v1/completions `echo` + `logprobs` (the prompt's own logprobs:
lm-evaluation-harness's loglikelihood requests) on one backend against the CPU reference
backend, end to end through two `orchid serve` processes on the same checkpoint. The CPU
path is checked against mlx-lm itself by tests/python/test_completions_echo.py; this is
the same question for CUDA, where prompt rows come out of the prefill kernels and are scored
on the GPU (cuda_score.cu, the default) or, with ORCHID_NO_ROW_SCORES=1, in chunks of
SCHED_PROMPT_LP_ROWS with every row's logits scored on the host. Standard library only
(bench/serve_load.py's Server and request helpers), so it runs on the device machine.

Checks, per prompt (token-id prompts of lengths around the 16-row chunk edges and longer):
  - the echoed tokens, text and text_offset equal the reference's exactly;
  - every prompt token's logprob (the first null) and its top-n values within --tol
    (absolute, nats) of the reference's; the top-n sets equal where the reference's
    n-th and (n+1)-th values are more than --tol apart (ties may order either way);
  - with max_tokens 0 no generated token; with max_tokens > 0 greedy continuations
    compared (a flip is reported when the reference's top two are within --tol);
  - a batch of prompts in one request (choice i = prompt i) equals the prompts alone;
  - the same prompts sent together with plain decoding requests equal them alone: the prompt
    rows within --tol, the generated rows within --beside-gen-tol (a CUDA sequence decoding
    beside others takes the batched kernels, whose sums run in another order than the
    one-token kernels': ~0.02 nats apart on the tiny model, H100, session 40).
Exit 1 on any mismatch; an error if the reference is the tested server itself (same backend,
same environment: a check that cannot fail).

The tolerance fits a reference whose logits are the tested server's up to rounding: the CPU
backend against CUDA on the tiny random test model is not one (its CUDA logits differ by a
mean relative 0.024, worst 0.3: test_cuda_model; logprobs then move by up to ~0.6, measured
on the H100, session 39). To check a scoring path on CUDA, compare CUDA with CUDA:
--ref-backend cuda --ref-env ORCHID_NO_ROW_SCORES=1 --prefill-chunk 16 (the
reference's rows' logits scored on the host, 16 rows a forward, against the tested server's
rows scored on the GPU in forwards of the same 16 rows: the same logits, so only the scoring
differs). Without --prefill-chunk the tested server prefills whole prompts, whose kernels
differ from 16-row forwards' in their sums: on the tiny model prompt logprobs then move by a
median 0.017 nats, p90 0.037, one of 330 by 1.45 (a -15-nat tail token) (H100, session 40),
too far for the default tolerance.
Environment variables the caller sets reach both servers; --env and --ref-env set one.

  bench/echo_check.py --orchid build/orchid --model DIR [--backend cuda] [--ref-backend cpu]
"""
import argparse
import json
import os
import random
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_load import Server, add_server_args, model_id, request  # noqa: E402


def complete(url, prompt, **kw):
    body = {"model": model_id(url), "prompt": prompt, "temperature": 0, "echo": True}
    body.update(kw)
    st, raw = request(url, "POST", "/v1/completions", body)
    if st != 200:
        raise RuntimeError("HTTP %d: %s" % (st, raw[:300]))
    return json.loads(raw)["choices"]


def compare_choice(name, got, ref, n_prompt, tol, problems, notes, gen_tol=None):
    """Adds got's differences from ref to problems (or notes, for ties); returns the worst
    absolute logprob difference. Prompt rows (before n_prompt) are held to tol, generated
    rows to gen_tol (default tol)."""
    gen_tol = tol if gen_tol is None else gen_tol
    lg, lr = got["logprobs"], ref["logprobs"]
    if lg["tokens"] == lr["tokens"] and got["text"] != ref["text"]:
        problems.append("%s: text differs" % name)
    for key in ("tokens", "text_offset"):
        if lg[key][:n_prompt] != lr[key][:n_prompt]:
            problems.append("%s: prompt %s differ" % (name, key))
    worst = 0.0
    for p in range(min(len(lg["token_logprobs"]), len(lr["token_logprobs"]))):
        a, b = lg["token_logprobs"][p], lr["token_logprobs"][p]
        if (a is None) != (b is None):
            problems.append("%s: token %d logprob null on one side only" % (name, p))
            continue
        if a is None:
            continue
        gen = p >= n_prompt
        t = gen_tol if gen else tol
        if gen and lg["tokens"][p] != lr["tokens"][p]:
            rv = sorted(lr["top_logprobs"][p].values(), reverse=True)
            (notes if len(rv) > 1 and rv[0] - rv[1] <= t else problems).append(
                "%s: generated token %d differs (%r vs %r)" % (name, p, lg["tokens"][p], lr["tokens"][p]))
            break  # the continuations part here
        worst = max(worst, abs(a - b))
        if abs(a - b) > t:
            problems.append("%s: token %d logprob %.6f vs reference %.6f" % (name, p, a, b))
        tg, tr = lg["top_logprobs"][p], lr["top_logprobs"][p]
        vg, vr = sorted(tg.values(), reverse=True), sorted(tr.values(), reverse=True)
        if len(vg) != len(vr):
            problems.append("%s: token %d: %d top entries vs %d" % (name, p, len(vg), len(vr)))
            continue
        for x, y in zip(vg, vr):
            worst = max(worst, abs(x - y))
            if abs(x - y) > t:
                problems.append("%s: token %d top value %.6f vs %.6f" % (name, p, x, y))
                break
        # the sets must agree unless a tie straddles the cut (values within tol of each other)
        clear = all(vr[i] - vr[i + 1] > t for i in range(len(vr) - 1))
        if clear and set(tg) != set(tr) and vr[-1] > min(tr.values()) - t:
            notes.append("%s: token %d top sets differ (%s vs %s)" % (name, p, sorted(tg), sorted(tr)))
    return worst


def main():
    ap = argparse.ArgumentParser()
    add_server_args(ap, port=8141, max_seq=1024)
    ap.add_argument("--ref-backend", default="cpu")
    ap.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="an environment variable for the tested server only (repeatable)")
    ap.add_argument("--ref-env", action="append", default=[], metavar="K=V",
                    help="an environment variable for the reference server only (repeatable)")
    ap.add_argument("--prefill-chunk", type=int, default=0,
                    help="the tested server's --prefill-chunk (0: its default; 16: the reference's forwards)")
    ap.add_argument("--lengths", default="1,2,15,16,17,33,40,100,300")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--tol", type=float, default=5e-3, help="absolute logprob tolerance (nats)")
    ap.add_argument("--beside-gen-tol", type=float, default=0.05,
                    help="tolerance of generated rows decoded beside other requests against alone (nats)")
    args = ap.parse_args()
    rnd = random.Random(11)
    lengths = [int(x) for x in args.lengths.split(",") if x]
    prompts = [[rnd.randrange(1000, 150000) for _ in range(n)] for n in lengths]
    extra = ["--parallel", "8", "--prefix-cache-mb", "0"]

    def run_all(url):
        out = {}
        for n, p in zip(lengths, prompts):
            out[("alone0", n)] = complete(url, p, max_tokens=0, logprobs=args.top)[0]
            out[("alone4", n)] = complete(url, p, max_tokens=4, logprobs=args.top)[0]
        # lm-evaluation-harness's batched payload: id lists, echo, logprobs 1, max_tokens 1
        batch = complete(url, prompts[-4:], max_tokens=1, logprobs=1)
        for n, ch in zip(lengths[-4:], batch):
            out[("batch", n)] = ch
        return out

    problems, notes = [], []
    ref_args = argparse.Namespace(**vars(args))
    ref_args.backend = args.ref_backend
    def env_with(pairs):
        env = dict(os.environ)
        for kv in pairs:
            k, _, v = kv.partition("=")
            env[k] = v
        return env

    if args.backend == args.ref_backend and sorted(args.env) == sorted(args.ref_env) and not args.prefill_chunk:
        ap.error("the reference would be the tested server itself (same backend, same environment); "
                 "set --ref-backend or --ref-env (e.g. --ref-backend cuda --ref-env ORCHID_NO_ROW_SCORES=1)")
    ref = Server(ref_args, args.port, extra, "echo_ref_%s.log" % args.ref_backend, env=env_with(args.ref_env))
    try:
        want = run_all(ref.url)
        # the batch's entries against the same prompts alone at logprobs 1 (same server)
        for n, p in zip(lengths[-4:], prompts[-4:]):
            want[("batch_alone", n)] = complete(ref.url, p, max_tokens=1, logprobs=1)[0]
    finally:
        ref.stop()
    srv = Server(args, args.port + 1, extra + (["--prefill-chunk", str(args.prefill_chunk)] if args.prefill_chunk else []), "echo_%s.log" % args.backend, env=env_with(args.env))
    try:
        got = run_all(srv.url)
        # the echo requests beside plain decoding requests: the same records
        beside, errs = {}, []

        def plain(i):
            try:
                complete(srv.url, prompts[i % len(prompts)][:50] or [1000], echo=False, max_tokens=64, ignore_eos=True)
            except Exception as e:  # noqa: BLE001 - reported below
                errs.append(str(e))

        def echoed(n, p):
            try:
                beside[n] = complete(srv.url, p, max_tokens=4, logprobs=args.top)[0]
            except Exception as e:  # noqa: BLE001
                errs.append(str(e))

        ts = [threading.Thread(target=plain, args=(i,)) for i in range(6)]
        ts += [threading.Thread(target=echoed, args=(n, p)) for n, p in zip(lengths, prompts)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        problems += ["beside plain requests: %s" % e for e in errs]
    finally:
        srv.stop()

    worst = 0.0
    for key, ch in got.items():
        n = key[1]
        if key[0] == "alone0" and len(ch["logprobs"]["tokens"]) != n:
            problems.append("%s: max_tokens 0 gave %d entries for %d prompt tokens" % (key, len(ch["logprobs"]["tokens"]), n))
        worst = max(worst, compare_choice("%s %s" % key, ch, want[key], n, args.tol, problems, notes))
    for n in lengths[-4:]:
        compare_choice("batch vs alone (reference) %d" % n, want[("batch", n)], want[("batch_alone", n)], n, 1e-6,
                       problems, notes)
    for n in lengths:
        if n in beside:
            a, b = beside[n], got[("alone4", n)]
            if json.dumps(a, sort_keys=True) != json.dumps(b, sort_keys=True):
                w = compare_choice("beside vs alone %d" % n, a, b, n, args.tol, problems, notes, args.beside_gen_tol)
                notes.append("beside vs alone %d: worst %.2e" % (n, w))
                notes.append("beside vs alone %d: not bitwise equal (batched kernels differ from alone)" % n)
    for s in notes:
        print("note: " + s)
    for s in problems:
        print("MISMATCH: " + s)
    print("echo check: %d prompts (lengths %s), worst |logprob - reference| %.2e, %d mismatches, %d notes"
          % (len(lengths), args.lengths, worst, len(problems), len(notes)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
