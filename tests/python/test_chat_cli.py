"""`orchid chat` on the tiny test model: turns stream, the second turn resumes from the
checkpoint at the first turn's generation prompt, /reset starts over, bad flags exit 2."""
import re
import subprocess

from models import ORCHID, model_dir


def run_chat(lines, *flags):
    return subprocess.run([str(ORCHID), "chat", "--model", str(model_dir("tiny")), "--max-tokens", "6",
                           "--temperature", "0", *flags], input="\n".join(lines) + "\n",
                          capture_output=True, text=True, timeout=120)


def stats(stderr):
    return [tuple(map(int, m)) for m in re.findall(r"\[(\d+) prompt tokens, (\d+) reused, (\d+) generated", stderr)]


def test_turns_resume_and_reset():
    r = run_chat(["Hello", "And again?", "/reset", "Fresh start"], "--thinking", "off")
    assert r.returncode == 0, r.stderr
    s = stats(r.stderr)
    assert len(s) == 3, r.stderr
    assert s[0][1] == 0
    assert s[1][1] == s[0][0] - 7  # all but "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert s[2][1] == 0  # after /reset: a new conversation shares no checkpoint ("Fresh" differs from "Hello")
    assert all(1 <= g <= 6 for _, _, g in s)


def test_greedy_is_deterministic():
    a = run_chat(["Say something"], "--thinking", "off")
    b = run_chat(["Say something"], "--thinking", "off")
    assert a.returncode == b.returncode == 0
    assert a.stdout == b.stdout


def test_bad_flags_exit_2():
    for flags in (["--thinking", "maybe"], ["--max-tokens", "0"], ["--temperature", "x"], ["--nope", "1"]):
        r = run_chat([], *flags)
        assert r.returncode == 2 and r.stderr.strip(), (flags, r.stderr)
    r = subprocess.run([str(ORCHID), "chat", "--model", "/nonexistent"], capture_output=True, text=True)
    assert r.returncode == 2
