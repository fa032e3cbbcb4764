"""tests/python/textref.py — shared helpers for the text (tokenizer, chat template,
parser) parity tests: where the real tokenizer files and the C drivers are, and
how to run a driver on a batch.

The tokenizer files come from tools/fetch_tokenizer.py (idempotent, cached in
.cache/tokenizer/). The C side is driven through unit-test binaries that have
batch modes (build/tests/test_text_*), so thousands of cases cost one process.
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("ORCHID_BUILD", os.path.join(ROOT, "build"))


def tokenizer_dir():
    """Runs tools/fetch_tokenizer.py (fast when cached) and returns the directory."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "fetch_tokenizer.py")],
                         check=True, capture_output=True, text=True, cwd=ROOT)
    return out.stdout.strip().splitlines()[-1]


def driver(name):
    """Path of build/tests/<name>, building it with make if it is missing."""
    path = os.path.join(BUILD, "tests", name)
    if not os.path.exists(path):
        subprocess.run(["make", "-s", os.path.relpath(path, ROOT)], cwd=ROOT, check=True)
    return path


def run_driver(name, args, timeout=600):
    p = subprocess.run([driver(name)] + list(args), capture_output=True, text=True, cwd=ROOT,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def write_jsonl(path, items):
    with open(path, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")


def hf_tokenizer(tok_dir):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
