"""tests/python/test_tokenizer_cli.py — `orchid tokenize` / `orchid detokenize` end to
end (build/orchid): ids equal HF tokenizers on text and on a rendered chat, the
detokenized text equals HF decode, and usage errors exit 2."""
import json
import os
import subprocess

import pytest

import textref

ORCHID = os.path.join(textref.BUILD, "orchid")


def orchid(*args):
    if not os.path.exists(ORCHID):
        subprocess.run(["make", "-s", os.path.relpath(ORCHID, textref.ROOT)], cwd=textref.ROOT, check=True)
    return subprocess.run([ORCHID] + list(args), capture_output=True, text=True, cwd=textref.ROOT)


@pytest.fixture(scope="module")
def tok_dir():
    return textref.tokenizer_dir()


def test_tokenize_text(tok_dir):
    hf = textref.hf_tokenizer(tok_dir)
    text = "Hello, world! It's 2026 — 日本語 👍🏽\n<think>x</think>"
    p = orchid("tokenize", "--model", tok_dir, "--text", text)
    assert p.returncode == 0, p.stderr
    assert [int(x) for x in p.stdout.split()] == hf.encode(text, add_special_tokens=False).ids


def test_tokenize_messages(tok_dir):
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(tok_dir)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    for flag, kw in (("on", {"enable_thinking": True}), ("off", {"enable_thinking": False})):
        p = orchid("tokenize", "--model", tok_dir, "--messages", json.dumps(msgs), "--thinking", flag)
        assert p.returncode == 0, p.stderr
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **kw)
        assert [int(x) for x in p.stdout.split()] == tok.encode(text, add_special_tokens=False)
    p = orchid("tokenize", "--tokenizer", os.path.join(tok_dir, "tokenizer.json"), "--messages",
               json.dumps({"messages": [{"role": "assistant", "content": "x"}]}))
    assert p.returncode == 1 and "No user query found in messages." in p.stderr


def test_detokenize(tok_dir):
    hf = textref.hf_tokenizer(tok_dir)
    ids = [248045, 846, 198, 9419, 11, 220, 88, 248046, 150, 248068]
    p = orchid("detokenize", "--model", tok_dir, "--ids", ",".join(map(str, ids)))
    assert p.returncode == 0, p.stderr
    assert p.stdout == hf.decode(ids, skip_special_tokens=False) + "\n"
    p = orchid("detokenize", "--model", tok_dir, "--ids", ",".join(map(str, ids)), "--skip-special")
    assert p.stdout == hf.decode(ids, skip_special_tokens=True) + "\n"


def test_usage_errors(tok_dir):
    assert orchid("tokenize", "--model", tok_dir).returncode == 2
    assert orchid("tokenize", "--model", tok_dir, "--text", "a", "--messages", "[]").returncode == 2
    assert orchid("tokenize", "--model", tok_dir, "--messages", "[{", "--thinking", "on").returncode == 2
    assert orchid("tokenize", "--model", tok_dir, "--text", "a", "--thinking", "maybe").returncode == 2
    assert orchid("detokenize", "--model", tok_dir, "--ids", "1,x").returncode == 2
    assert orchid("detokenize", "--model", "/nonexistent", "--ids", "1").returncode == 2
    assert orchid("tokenize", "--bogus").returncode == 2
