#!/usr/bin/env python3
"""tools/tokenizer_bench.py — orchid's tokenizer vs HF `tokenizers`, side by side, one
thread each, on the same corpus.

Times are wall clock and the measuring thread's CPU time (the CPU time is the
fair number on a shared, busy machine). The corpus (default 10 MB, deterministic) mixes English prose, source code, CJK,
other scripts, emoji and whitespace, like chat traffic; it is written to
.cache/tokenizer_bench/corpus_<MB>.txt. Both sides encode (a) the whole corpus as
one text and (b) line by line (many small calls); best of --rounds. orchid runs
through build/tests/test_text_tokenizer --bench; HF in this process with
RAYON_NUM_THREADS=1. Load time is measured for both. Prints one JSON object.

Usage: .venv/bin/python tools/tokenizer_bench.py [--mb 10] [--rounds 3]
"""
import argparse
import json
import os
import random
import subprocess
import sys
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))


def make_corpus(path, mb):
    import test_tokenizer as tt  # the parity test's generators
    rng = random.Random(42)
    parts, size = [], 0
    gens = [lambda: tt.prose(rng, rng.randint(20, 120)) + "\n",
            lambda: tt.prose(rng, rng.randint(20, 120)) + "\n\n",
            lambda: tt.mix(rng, tt.CODE, 1, 4),
            lambda: tt.sample(rng, tt.CJK, 20, 200) + "\n",
            lambda: tt.mix(rng, tt.ARABIC.split() + tt.OTHER.split() + [" "], 5, 40) + "\n",
            lambda: tt.mix(rng, tt.EMOJI + [" ", "a", "\n"], 3, 20)]
    weights = [40, 15, 20, 10, 10, 5]
    while size < mb * 1_000_000:
        s = rng.choices(gens, weights)[0]()
        parts.append(s)
        size += len(s.encode())
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(parts))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    tok_dir = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "fetch_tokenizer.py")], check=True,
                             capture_output=True, text=True).stdout.strip().splitlines()[-1]
    out_dir = os.path.join(ROOT, ".cache", "tokenizer_bench")
    os.makedirs(out_dir, exist_ok=True)
    corpus = os.path.join(out_dir, f"corpus_{args.mb:g}.txt")
    if not os.path.exists(corpus):
        make_corpus(corpus, args.mb)
    text = open(corpus, encoding="utf-8").read()
    nbytes = len(text.encode())
    lines = text.split("\n")

    from tokenizers import Tokenizer

    def timed(fn):
        w0, c0 = time.perf_counter(), time.thread_time()
        r = fn()
        return r, time.perf_counter() - w0, time.thread_time() - c0

    path = os.path.join(tok_dir, "tokenizer.json")
    hf = None
    load_w = load_c = whole_w = whole_c = lines_w = lines_c = 1e9
    ntok = 0
    for _ in range(args.rounds):
        hf, w, c = timed(lambda: Tokenizer.from_file(path))
        load_w, load_c = min(load_w, w), min(load_c, c)
        # a fresh tokenizer per measurement, so HF's word cache starts cold too
        enc, w, c = timed(lambda: hf.encode(text, add_special_tokens=False).ids)
        whole_w, whole_c = min(whole_w, w), min(whole_c, c)
        ntok = len(enc)
        hf = Tokenizer.from_file(path)
        _, w, c = timed(lambda: [hf.encode(ln, add_special_tokens=False) for ln in lines])
        lines_w, lines_c = min(lines_w, w), min(lines_c, c)

    drv = os.path.join(ROOT, "build", "tests", "test_text_tokenizer")
    p = subprocess.run([drv, "--bench", tok_dir, corpus, str(args.rounds)], check=True, capture_output=True,
                       text=True)
    o = json.loads(p.stdout.strip().splitlines()[-1])
    mb = nbytes / 1e6
    res = {
        "corpus_bytes": nbytes, "hf_tokens": ntok, "orchid_tokens": o["tokens"],
        "hf_load_ms": round(load_w * 1e3, 1), "hf_load_cpu_ms": round(load_c * 1e3, 1),
        "orchid_load_ms": o["load_ms"], "orchid_load_cpu_ms": o["load_cpu_ms"],
        "hf_whole_MBps": round(mb / whole_w, 2), "hf_whole_cpu_MBps": round(mb / whole_c, 2),
        "orchid_whole_MBps": round(mb / o["whole_s"], 2), "orchid_whole_cpu_MBps": round(mb / o["whole_cpu_s"], 2),
        "hf_lines_MBps": round(mb / lines_w, 2), "hf_lines_cpu_MBps": round(mb / lines_c, 2),
        "orchid_lines_MBps": round(mb / o["lines_s"], 2), "orchid_lines_cpu_MBps": round(mb / o["lines_cpu_s"], 2),
        "load_avg": os.getloadavg()[0], "cpus": os.cpu_count(),
    }
    res["speedup_whole_cpu"] = round(res["orchid_whole_cpu_MBps"] / res["hf_whole_cpu_MBps"], 2)
    res["speedup_lines_cpu"] = round(res["orchid_lines_cpu_MBps"] / res["hf_lines_cpu_MBps"], 2)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
