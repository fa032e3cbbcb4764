"""tests/python/test_chat_template.py — orchid's native chat template vs transformers'
Jinja rendering of the template that ships in .cache/tokenizer (tokenizer_config.json
/ chat_template.jinja, made by tools/fetch_tokenizer.py).

Generates several hundred conversations that reach every branch of the template:
system message (string, parts, empty), tools, user string / text-part / image /
video content, assistant reasoning_content vs inline <think>, history before and
after the last real user query, tool calls with every argument type, tool-result
runs, user turns that are only <tool_response> blocks, every option
(add_generation_prompt, enable_thinking, preserve_thinking, add_vision_id), and the
template's errors. Output must be byte-identical; errors must carry the same message.
"""
import json
import random

import pytest

import textref

N_CONV = 600


@pytest.fixture(scope="module")
def hf_tok():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(textref.tokenizer_dir())


TEXTS = ["Hello", "  padded  \n", "", "What's 2+2?", "日本語で答えて", "emoji 👩‍💻 ok", "line1\nline2\n\n",
         "<tool_call>literal</tool_call>", "tab\there", "\u00a0nbsp\u3000", "quote \" and \\ backslash",
         "<think>not reasoning</think>", "x" * 50]
VALUES = ["Paris", "", "multi\nline", 3, -17, 0.25, 1e-07, 1.5e20, True, False, None, [1, "a", None],
          {"k": "v", "n": [1, 2], "u": "é"}, [], {}, "ünïcödé", "with \"quotes\""]


def text_parts(rng, allow_media=True):
    parts = []
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if allow_media and r < 0.2:
            parts.append(rng.choice([{"type": "image"}, {"type": "image", "image": "x.png"},
                                     {"image_url": {"url": "http://x"}}]))
        elif allow_media and r < 0.3:
            parts.append(rng.choice([{"type": "video"}, {"video": "v.mp4"}]))
        else:
            parts.append({"type": "text", "text": rng.choice(TEXTS)})
    return parts


def content(rng, allow_media=True):
    r = rng.random()
    if r < 0.65:
        return rng.choice(TEXTS)
    if r < 0.9:
        return text_parts(rng, allow_media)
    return None


def tool_call(rng):
    args = {}
    for i in range(rng.randint(0, 4)):
        args[rng.choice(["city", "n", "flag", "items", "opts", "q", f"p{i}"])] = rng.choice(VALUES)
    fn = {"name": rng.choice(["get_weather", "search", "run_code"]), "arguments": args}
    if rng.random() < 0.1:
        fn["arguments"] = json.dumps(args)  # a string: the template skips it
    return {"type": "function", "id": f"call_{rng.randint(0, 99)}", "function": fn} if rng.random() < 0.8 else fn


def assistant(rng):
    m = {"role": "assistant"}
    r = rng.random()
    body = rng.choice(TEXTS + ["The answer is 4."])
    if r < 0.3:
        m["content"] = body
        m["reasoning_content"] = rng.choice(["", "  think hard \n", "step 1\nstep 2", "<think>odd</think>"])
    elif r < 0.55:
        m["content"] = rng.choice(["<think>\nreason\n</think>\n\n", "<think>r</think>", "pre<think>\n\nr\n\n</think>\n\n",
                                   "a</think>b</think>c", "\n\n</think>\n\nonly end"]) + body
    elif r < 0.65:
        m["content"] = None
    else:
        m["content"] = body
        if rng.random() < 0.2:
            m["reasoning_content"] = None
    if rng.random() < 0.35:
        m["tool_calls"] = [tool_call(rng) for _ in range(rng.randint(1, 3))]
    return m


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city, é ü 日本",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "n": {"type": "integer", "minimum": 1},
                                          "flag": {"type": "boolean"}},
                                          "required": ["city"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search \"the web\"\nfor text",
                                      "parameters": {"type": "object", "properties": {
                                          "q": {"type": "string"}, "opts": {"type": "object"},
                                          "items": {"type": "array", "items": {"type": "number"}}}}}},
    {"type": "function", "function": {"name": "run_code", "parameters": {}}},
]


def conversation(rng):
    msgs = []
    r = rng.random()
    if r < 0.5:
        msgs.append({"role": "system", "content": content(rng, allow_media=False) or "sys"})
    elif r < 0.55:
        msgs.append({"role": "system", "content": rng.choice(["", "   "])})
    for _ in range(rng.randint(1, 4)):
        msgs.append({"role": "user", "content": content(rng)})
        if rng.random() < 0.15:
            msgs.append({"role": "user", "content": "<tool_response>\nprior\n</tool_response>"})
        for _ in range(rng.randint(0, 2)):
            a = assistant(rng)
            msgs.append(a)
            if a.get("tool_calls"):
                for _ in range(rng.randint(1, 3)):
                    msgs.append({"role": "tool", "content": rng.choice(TEXTS + ['{"temp": 21}'])})
    # make sure there is a user query somewhere (errors are generated separately)
    if not any(m["role"] == "user" for m in msgs):
        msgs.insert(1 if msgs and msgs[0]["role"] == "system" else 0, {"role": "user", "content": "q"})
    if rng.random() < 0.1:  # ends with tool results (agent loop continuation)
        msgs.append(assistant(rng) | {"tool_calls": [tool_call(rng)]})
        msgs.append({"role": "tool", "content": "result"})
    tools = None
    r = rng.random()
    if r < 0.35:
        tools = rng.sample(TOOLS, rng.randint(1, 3))
    elif r < 0.4:
        tools = []
    opts = {"add_generation_prompt": int(rng.random() < 0.8), "enable_thinking": rng.choice([-1, 0, 1]),
            "preserve_thinking": rng.choice([-1, -1, 0, 1]), "add_vision_id": int(rng.random() < 0.2)}
    return {"messages": msgs, "tools": tools, "opts": opts}


def error_cases():
    return [
        {"messages": [], "tools": None, "opts": {}},
        {"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}], "tools": None, "opts": {}},
        {"messages": [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}], "tools": None, "opts": {}},
        {"messages": [{"role": "user", "content": "<tool_response>x</tool_response>"}], "tools": None, "opts": {}},
        {"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}], "tools": None, "opts": {}},
        {"messages": [{"role": "user", "content": 5}], "tools": None, "opts": {}},
        {"messages": [{"role": "user", "content": {"text": "a"}}], "tools": None, "opts": {}},
        {"messages": [{"role": "system", "content": [{"type": "image"}]}, {"role": "user", "content": "a"}],
         "tools": None, "opts": {}},
        {"messages": [{"role": "system", "content": [{"type": "video"}]}, {"role": "user", "content": "a"}],
         "tools": None, "opts": {}},
        {"messages": [{"role": "user", "content": [{"type": "audio", "audio": "x"}]}], "tools": None, "opts": {}},
    ]


def hf_render(tok, case):
    if not case["messages"]:
        # transformers refuses an empty conversation before the template runs; the
        # template itself raises this message
        return {"error": "No messages provided."}
    kw = {}
    o = case["opts"]
    if o.get("enable_thinking", -1) != -1:
        kw["enable_thinking"] = bool(o["enable_thinking"])
    if o.get("preserve_thinking", -1) != -1:
        kw["preserve_thinking"] = bool(o["preserve_thinking"])
    if o.get("add_vision_id"):
        kw["add_vision_id"] = True
    try:
        return {"text": tok.apply_chat_template(case["messages"], tools=case["tools"], tokenize=False,
                                                add_generation_prompt=bool(o.get("add_generation_prompt", 1)), **kw)}
    except Exception as e:  # jinja2 TemplateError from raise_exception
        return {"error": str(e)}


def test_chat_template_parity(hf_tok, tmp_path):
    rng = random.Random(2024)
    cases = [conversation(rng) for _ in range(N_CONV)] + error_cases()
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    textref.write_jsonl(inp, cases)
    rc, _, err = textref.run_driver("test_text_chat", ["--render-batch", str(inp), str(out)])
    assert rc == 0, err
    got = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    assert len(got) == len(cases)
    bad = []
    n_err = 0
    for case, g in zip(cases, got):
        want = hf_render(hf_tok, case)
        if "error" in want:
            n_err += 1
            if "error" not in g or g["error"] != want["error"]:
                bad.append((case, g, want))
        elif g != want:
            bad.append((case, g, want))
    assert not bad, f"{len(bad)} of {len(cases)} differ; first:\n{json.dumps(bad[0], ensure_ascii=False, indent=1)[:3000]}"
    assert n_err >= len(error_cases())


def test_template_is_the_one_implemented(hf_tok):
    """The shipped template text is the one chat.c implements (FNV hash check in C),
    checked here through the driver's unit mode running against the same file."""
    import os
    text = open(os.path.join(textref.tokenizer_dir(), "chat_template.jinja"), encoding="utf-8").read().rstrip()
    h = 1469598103934665603
    for b in text.encode():
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    assert h == 0xfc7c1897b7bee9cc
    assert hf_tok.chat_template.rstrip() == text
