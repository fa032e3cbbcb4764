"""tests/python/test_parsers.py — orchid's incremental output parser (src/text/
output_parser.c) against mlx-lm's Qwen XML tool parser (mlx_lm/tool_parsers/
qwen3_coder.py) and against its own whole-text result.

* Well-formed outputs (reasoning, content, 0-3 tool calls with every schema type)
  fed in random chunk sizes: reasoning/content as constructed, each call's name
  and arguments equal to what mlx-lm's parse_tool_call returns for the block.
* Chunking invariance: any split of the text gives the same result as one piece.
* Malformed / tag-like noise ("<", "<tool", "</thin", unterminated or function-less
  <tool_call> blocks): no text is lost, content == the input exactly.
"""
import json
import random

import pytest

import textref

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "temp": {"type": "number"},
        "metric": {"type": "boolean"}, "opts": {"type": "object"}, "tags": {"type": "array"},
        "note": {"type": "str"}, "count": {"type": "int64"}, "ratio": {"type": "float"},
        "blob": {}}}}},
    {"type": "function", "function": {"name": "run_code", "parameters": {"type": "object", "properties": {
        "code": {"type": "string"}, "timeout": {"type": "number"}}}}},
]

VALUES = {
    "city": ["Paris", "New York", "São Paulo", "東京", "a <b> c", "  spaced  ", "multi\nline"],
    "days": ["3", "0", "-2", "10"],
    "temp": ["21.5", "-3", "1e3", "0.001"],
    "metric": ["true", "false", "True", "FALSE"],
    "opts": ['{"a": 1, "b": [true, null]}', "{}", '{"nested": {"x": "y"}}'],
    "tags": ['["x", "y"]', "[]", "[1, 2.5]"],
    "note": ["hello", "42"],
    "count": ["7", "12"],
    "ratio": ["0.5", "2"],
    "blob": ['{"k": 1}', "plain", "[1]"],
    "code": ["print('hi')\nfor i in range(3):\n    print(i)", "x = {'a': 1}", "if a < b and c > d: pass"],
    "timeout": ["30", "2.5"],
    "unknown_param": ["whatever", "123"],
}


def make_call(rng):
    tool = rng.choice(TOOLS)["function"]
    names = list(tool["parameters"]["properties"]) + ["unknown_param"]
    params = rng.sample(names, rng.randint(0, min(4, len(names))))
    block = f"<tool_call>\n<function={tool['name']}>\n"
    for p in params:
        v = rng.choice(VALUES.get(p, ["x"]))
        if rng.random() < 0.05:
            v = "null"
        block += f"<parameter={p}>\n{v}\n</parameter>\n"
    block += "</function>\n</tool_call>"
    return block


def expected_call(block):
    from mlx_lm.tool_parsers import qwen3_coder
    inner = block[len("<tool_call>"):-len("</tool_call>")]
    return qwen3_coder.parse_tool_call(inner, TOOLS)


def chunks(rng, n):
    out = []
    while sum(out) < n:
        out.append(rng.choice([1, 1, 2, 3, 5, 8, 13, 40]))
    return out


def run_batch(tmp_path, cases):
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    textref.write_jsonl(inp, cases)
    rc, _, err = textref.run_driver("test_text_parser", ["--parse-batch", str(inp), str(out)])
    assert rc == 0, err
    res = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert len(res) == len(cases)
    return res


def test_wellformed_against_mlx_lm(tmp_path):
    pytest.importorskip("mlx_lm.tool_parsers.qwen3_coder")
    rng = random.Random(5)
    cases, expect = [], []
    for _ in range(400):
        thinking = rng.random() < 0.6
        reasoning = rng.choice(["", "Let me think.", "step 1\n\nstep 2", "consider <tool_call> syntax", "a < b"])
        content = rng.choice(["", "Sure.", "I'll check the weather.", "x < y", "Answer: 4"])
        calls = [make_call(rng) for _ in range(rng.choice([0, 0, 1, 1, 2, 3]))]
        text = ""
        if thinking:
            text += "\n" + reasoning + "\n</think>\n\n"
        text += content
        if calls:
            text += ("\n\n" if content else "") + "\n".join(calls)
        want_calls = [expected_call(c) for c in calls]
        cases.append({"text": text, "tools": TOOLS, "opts": {"start_in_reasoning": thinking},
                      "chunks": chunks(rng, len(text.encode()))})
        expect.append((reasoning.strip("\n") if thinking else "", content, want_calls))
    got = run_batch(tmp_path, cases)
    bad = []
    for case, (r, c, calls), g in zip(cases, expect, got):
        gc = [{"name": x["name"], "arguments": x["arguments"]} for x in g["calls"]]
        if g["reasoning"] != r or g["content"] != c or gc != calls or not g["order_ok"]:
            bad.append((case["text"], g, (r, c, calls)))
    assert not bad, f"{len(bad)} differ; first: {bad[0]}"


def test_chunking_invariance(tmp_path):
    rng = random.Random(11)
    pieces = ["<think>", "</think>", "\n", "\n\n", "text", " ", "<tool_call>", "</tool_call>", "<function=f>",
              "<parameter=a>", "</parameter>", "</function>", "1", "<", ">", "é", "日本", "<tool", "</thi"]
    cases = []
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 25)))
        opts = {"start_in_reasoning": rng.random() < 0.5, "parse_tools": rng.random() < 0.9}
        n = len(text.encode())
        cases.append({"text": text, "tools": None, "opts": opts, "chunks": []})
        cases.append({"text": text, "tools": None, "opts": opts, "chunks": [1] * n})
        cases.append({"text": text, "tools": None, "opts": opts, "chunks": chunks(rng, n)})
    got = run_batch(tmp_path, cases)
    for i in range(0, len(cases), 3):
        whole = {k: got[i][k] for k in ("reasoning", "content", "calls")}
        for j in (i + 1, i + 2):
            assert {k: got[j][k] for k in ("reasoning", "content", "calls")} == whole, cases[i]["text"]


def test_noise_is_never_lost(tmp_path):
    rng = random.Random(3)
    pieces = ["<", "<t", "<tool", "<tool_call", "<tool_call>", "</tool_call>", "</think", "<think", "think>",
              ">", "abc", " ", "\n", "é", "</", "<parameter=x>", "</function>", "<|im_end|>", "\t"]
    cases = []
    for _ in range(500):
        text = "x" + "".join(rng.choice(pieces) for _ in range(rng.randint(1, 30)))
        cases.append({"text": text, "tools": TOOLS, "opts": {"start_in_reasoning": False},
                      "chunks": chunks(rng, len(text.encode()))})
    got = run_batch(tmp_path, cases)
    for case, g in zip(cases, got):
        assert g["reasoning"] == "" and g["calls"] == [], case["text"]
        assert g["content"] == case["text"], (case["text"], g["content"])
