"""tests/fuzz/seeds_text.py — seed corpora for the text and server fuzz targets
(tokenizer, tokenizer_load, output_parser, chat, http) and for the checkpoint index
(safetensors_index), called by tools/fuzz_seeds.py
as seed(out, model_dirs). Made from the project's real inputs: the tokenizer parity
test's generated texts and the real tokenizer.json (.cache/tokenizer), the parser
test's tool calls and schema, the request shapes the server tests send, and the tiny
test model's model.safetensors.index.json.
"""
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOK_DIR = REPO / ".cache" / "tokenizer"
MODEL = "Qwen3.6-35B-A3B"


def put(d: Path, name: str, data: bytes):
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"seed-{name}"
    if not p.exists():
        p.write_bytes(data)


def seed_tokenizer(out: Path):
    d = out / "tokenizer"
    import test_tokenizer  # tests/python: the parity test's generator (hard cases of every kind)
    items = test_tokenizer.generate(seed=7)
    rng = random.Random(7)
    short = [t for t in items if len(t.encode()) <= 2000]
    for i, t in enumerate(rng.sample(short, 120)):
        put(d, f"text-{i:03d}", t.encode())
    put(d, "long-word", ("a" * 20000).encode())
    put(d, "long-spaces", (" " * 20000).encode())
    put(d, "long-digits", ("1" * 20000).encode())
    put(d, "added-tokens", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n".encode())
    put(d, "invalid-utf8", b"ab\xc3(cd\xed\xa0\x80\xc0\xaf\xff")
    put(d, "cut-utf8", "日本".encode()[:-1])


_REAL = {}


def small_tokenizer_json(n_vocab=600, n_merges=300):
    """The real tokenizer.json cut down: its normalizer, pre-tokenizer, decoder and
    added tokens, the byte vocabulary and the first merges (and their results)."""
    if "t" not in _REAL:
        _REAL["t"] = (TOK_DIR / "tokenizer.json").read_text()
    t = json.loads(_REAL["t"])
    vocab = {k: v for k, v in t["model"]["vocab"].items() if v < n_vocab}
    merges = []
    for m in t["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append(m)
        if len(merges) >= n_merges:
            break
    t["model"]["vocab"] = vocab
    t["model"]["merges"] = merges
    return t


def seed_tokenizer_load(out: Path):
    d = out / "tokenizer_load"
    if not (TOK_DIR / "tokenizer.json").exists():
        return
    t = small_tokenizer_json()
    put(d, "real-excerpt", json.dumps(t, ensure_ascii=False).encode())
    put(d, "real-excerpt-compact", json.dumps(small_tokenizer_json(300, 60), separators=(",", ":")).encode())
    # merges in the "a b" string form, an unsupported model type, a missing pre-tokenizer
    t2 = small_tokenizer_json(300, 60)
    t2["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in t2["model"]["merges"]]
    put(d, "merges-as-strings", json.dumps(t2).encode())
    t3 = small_tokenizer_json(300, 10)
    t3["model"]["type"] = "WordPiece"
    put(d, "wordpiece", json.dumps(t3).encode())
    t4 = small_tokenizer_json(300, 10)
    t4["pre_tokenizer"] = None
    put(d, "no-pretokenizer", json.dumps(t4).encode())
    raw = (TOK_DIR / "tokenizer.json").read_bytes()
    put(d, "real-head", raw[:4096])


def seed_output_parser(out: Path):
    d = out / "output_parser"
    import test_parsers  # tests/python: the parser test's tool calls
    rng = random.Random(11)
    samples = [
        "\nLet me think.\n\n</think>\n\nThe answer is 4.",
        "<think>\nr\n</think>\n\nc",
        "x < y and <tool and <tool_cal>> and </tool_call> <",
        "see <tool_call>oops</tool_call> end",
        "before\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        "<tool_call><function=f><parameter=a>1</parameter></tool_call>",
        "a </thin b </think>",
    ]
    for _ in range(40):
        parts = []
        if rng.random() < 0.5:
            parts.append(rng.choice(["", "<think>"]) + "\nplan the call\n</think>\n\n")
        parts.append(rng.choice(["", "Let me check.\n\n", "Sure. "]))
        for _ in range(rng.randint(0, 3)):
            parts.append(test_parsers.make_call(rng) + "\n")
        samples.append("".join(parts))
    for i, s in enumerate(samples):
        opts = rng.randrange(16) & ~0x8  # tools given
        put(d, f"{i:03d}", bytes([opts, rng.randrange(256)]) + s.encode())


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                         "required": ["city"]}}}]


def chat_requests():
    user = {"role": "user", "content": "SCRIPT:Hello there"}
    reqs = [
        {"model": MODEL, "messages": [user]},
        {"model": MODEL, "messages": [{"role": "system", "content": "Be brief."}, user], "max_tokens": 8,
         "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "seed": 1, "stop": ["\n", "end"]},
        {"model": MODEL, "messages": [user], "stream": True, "stream_options": {"include_usage": True}},
        {"model": MODEL, "messages": [user], "logprobs": True, "top_logprobs": 3, "presence_penalty": 0.5,
         "frequency_penalty": 0.2, "repetition_penalty": 1.1, "logit_bias": {"65": 2}},
        {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                    {"type": "text", "text": "b"}]}]},
        {"model": MODEL, "messages": [user], "tools": TOOLS, "tool_choice": "auto"},
        {"model": MODEL, "messages": [user], "tools": TOOLS, "tool_choice": "required"},
        {"model": MODEL, "messages": [user], "tools": TOOLS,
         "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        {"model": MODEL, "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "reasoning_content": "need the tool",
             "tool_calls": [{"id": "call_0", "type": "function",
                             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
            {"role": "user", "content": "thanks"}], "tools": TOOLS},
        {"model": MODEL, "messages": [user], "chat_template_kwargs": {"enable_thinking": False}},
        {"model": MODEL, "messages": [user], "reasoning_effort": "high"},
        {"model": MODEL, "messages": [user], "response_format": {"type": "json_object"}},
        {"model": MODEL, "messages": [user], "n": 2},
        {"model": MODEL, "messages": [{"role": "assistant", "content": "x"}]},
        {"model": "other", "messages": [user]},
        {"model": MODEL, "messages": [user], "max_completion_tokens": 100000},
    ]
    comps = [
        {"model": MODEL, "prompt": "SCRIPT:abc<|im_end|>", "max_tokens": 4},
        {"model": MODEL, "prompt": [1, 2, 3, 65, 66], "logprobs": 2, "stream": True},
        {"model": MODEL, "prompt": ["a", "b"], "echo": True},
        {"model": MODEL, "prompt": [[1, 2, 3], [4, 5]], "echo": True, "logprobs": 1, "max_tokens": 0, "n": 2},
        {"model": MODEL, "prompt": ["a", [1]], "max_tokens": 1},
        {"model": MODEL, "prompt": "x", "suffix": "y"},
    ]
    return reqs, comps


def seed_chat(out: Path):
    d = out / "chat"
    reqs, comps = chat_requests()
    for i, r in enumerate(reqs + comps):
        put(d, f"req-{i:02d}", json.dumps(r, ensure_ascii=False).encode())
    put(d, "messages-array", json.dumps([{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                                         {"role": "assistant", "content": "<think>r</think>a"}]).encode())
    put(d, "not-json", b"{\"model\": ")


def http_request(method, path, body=None, key=True, chunked=False, extra=()):
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if key:
        lines.append("Authorization: Bearer fuzz-key")
    lines += list(extra)
    data = b""
    if body is not None:
        b = json.dumps(body).encode()
        lines.append("Content-Type: application/json")
        if chunked:
            lines.append("Transfer-Encoding: chunked")
            half = len(b) // 2
            data = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, b[:half], len(b) - half, b[half:])
        else:
            lines.append(f"Content-Length: {len(b)}")
            data = b
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


def seed_http(out: Path):
    d = out / "http"
    reqs, comps = chat_requests()
    for i, r in enumerate(reqs[:10]):
        r = dict(r, max_tokens=16)
        put(d, f"chat-{i:02d}", http_request("POST", "/v1/chat/completions", r, chunked=(i % 3 == 1)))
    for i, r in enumerate(comps):
        put(d, f"completion-{i}", http_request("POST", "/v1/completions", r))
    put(d, "health", http_request("GET", "/health", key=False))
    put(d, "models", http_request("GET", "/v1/models"))
    put(d, "model", http_request("GET", "/v1/models/" + MODEL))
    put(d, "metrics", http_request("HEAD", "/metrics"))
    put(d, "no-key", http_request("POST", "/v1/chat/completions", reqs[0], key=False))
    put(d, "wrong-method", http_request("GET", "/v1/chat/completions"))
    put(d, "unknown", http_request("GET", "/nope"))
    put(d, "too-large", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer fuzz-key\r\n"
                        b"Content-Length: 999999999\r\n\r\n{")
    put(d, "mock-fail", http_request("POST", "/v1/completions", {"model": MODEL, "prompt": "MOCK_FAIL", "max_tokens": 2}))
    put(d, "keepalive-two", http_request("GET", "/health", key=False) + http_request("GET", "/v1/models"))
    put(d, "http10", b"GET /health HTTP/1.0\r\n\r\n")
    # Anthropic Messages: every block kind, streaming and not, the x-api-key header, count_tokens
    tool = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
    am = {"model": "claude-x", "max_tokens": 16, "system": [{"type": "text", "text": "sys"}], "tools": [tool],
          "messages": [{"role": "user", "content": "SCRIPT:hi <tool_call>"},
                       {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": ""},
                                                         {"type": "text", "text": "a"},
                                                         {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                                          "input": {"city": "Oslo"}}]},
                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                                     "content": [{"type": "text", "text": "sunny"}], "is_error": True},
                                                    {"type": "text", "text": "SCRIPT:ok"}]},
                       {"role": "assistant", "content": "o"}]}
    put(d, "messages", http_request("POST", "/v1/messages", am))
    put(d, "messages-stream", http_request("POST", "/v1/messages", dict(am, stream=True, stop_sequences=["k"],
                                                                         thinking={"type": "enabled", "budget_tokens": 9}),
                                           chunked=True))
    put(d, "messages-key", http_request("POST", "/v1/messages", dict(am, tool_choice={"type": "any"}), key=False,
                                        extra=("x-api-key: fuzz-key",)))
    put(d, "count-tokens", http_request("POST", "/v1/messages/count_tokens", {"model": "m", "messages": am["messages"]}))
    # /tokenize (a prompt, a chat with tools, token strings) and /detokenize; several choices
    put(d, "tokenize", http_request("POST", "/tokenize", {"prompt": "a<|im_end|>é", "return_token_strs": True}))
    put(d, "tokenize-chat", http_request("POST", "/tokenize", dict(reqs[0], tools=[{"type": "function", "function": {
        "name": "get_weather", "parameters": tool["input_schema"]}}])))
    put(d, "detokenize", http_request("POST", "/detokenize", {"tokens": [72, 195, 256, 257]}))
    put(d, "chat-n", http_request("POST", "/v1/chat/completions", dict(reqs[0], n=3, max_tokens=8, stream=True,
                                                                       stream_options={"include_usage": True})))
    # OpenAI Responses: every input item kind, streaming and not
    rs = {"model": MODEL, "instructions": "i", "max_output_tokens": 16, "reasoning": {"effort": "low"},
          "tools": [{"type": "function", "name": "get_weather", "parameters": tool["input_schema"]}],
          "input": [{"role": "developer", "content": "d"},
                    {"role": "user", "content": [{"type": "input_text", "text": "SCRIPT:a</think>b"}]},
                    {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}]},
                    {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"},
                    {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                    {"role": "user", "content": "SCRIPT:ok"}]}
    put(d, "responses", http_request("POST", "/v1/responses", rs))
    # constrained output and a thinking budget
    schema = {"type": "object", "properties": {"a": {"enum": [1, "x"]}, "b": {"type": "string", "maxLength": 3}},
              "required": ["a"]}
    put(d, "json-schema", http_request("POST", "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 24, "stream": True, "temperature": 1.0, "seed": 3,
        "messages": [{"role": "user", "content": "SCRIPT:{\"a\": 1}"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}))
    put(d, "thinking-budget", http_request("POST", "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 40, "thinking_budget": 2,
        "messages": [{"role": "user", "content": "SCRIPT:abcdef</think>ok"}]}))
    put(d, "responses-stream", http_request("POST", "/v1/responses", dict(rs, stream=True, tool_choice="required"),
                                            chunked=True))
    put(d, "bad-utf8", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer fuzz-key\r\n"
                       b"Content-Length: 5\r\n\r\n{\"\xff\"}")


def seed_json_grammar(out: Path):
    """fuzz_json_grammar: schema NUL document, and bare documents (json_object)."""
    d = out / "json_grammar"
    import test_structured_output as t  # tests/python: the schemas constrained output is tested with
    person = {"name": "Ann", "age": 31, "ok": True, "color": "red", "tags": ["a", "b"], "pet": {"kind": "cat"}}
    tree = {"v": 1.5e3, "kids": [{"v": -2}, {"v": 0, "kids": []}]}
    pairs = [(t.PERSON, json.dumps(person)), (t.PERSON, json.dumps(person, indent=2)), (t.TREE, json.dumps(tree)),
             ({"type": "string", "maxLength": 3}, '"\\u00e9\\n"'), ({"enum": ["a", 1, None]}, "1"),
             ({"type": ["number", "null"]}, "-0.5E+2"), ({"anyOf": [{"const": "x"}, {"type": "array"}]}, "[1,[]]"),
             (t.BOUNDED, '{"age": 42, "delta": null, "big": 1000, "p": 0.5, "t": 0, "step": 5}'),
             ({"type": "integer", "multipleOf": 7, "maximum": 100}, "-49"),
             (t.PRICED, '{"price": 0.07, "step": null, "half": -15}'),
             (t.DICE, '{"dice": [1, 6]}'),
             ({"type": "number", "multipleOf": 0.25, "minimum": -3}, "-2.75"),
             ({"type": "number", "allOf": [{"multipleOf": 0.1}, {"multipleOf": 0.25, "exclusiveMinimum": 0}]}, "1.5"),
             ({"type": "number", "minimum": 0.1, "exclusiveMaximum": 0.3}, "0.25"),
             (t.PATTERNS, '{"date": "2024-01-31", "code": "ABC-42", "has_ab": "grab!", "word": null, "tag": "ab1"}'),
             ({"type": "string", "pattern": "^(ab)+$", "minLength": 2, "maxLength": 7}, '"abab"'),
             ({"type": "string", "pattern": "^(?:[0-9a-f]{2}:){2}[^\\d\\s]\\w*$"}, '"0a:ff:\\u00e9x"'),
             ({"type": "string", "pattern": "a|b(c|d)*?e{2,}"}, '"zzbcdee"'),
             ({"type": "integer", "exclusiveMinimum": -12.5, "maximum": -3}, "-12"),
             (t.TUPLES, '{"pt": [0.5, -2], "head": ["b", 3, 4], "set": ["r", null]}'),
             ({"type": "array", "items": {"type": "boolean"}, "uniqueItems": True}, "[false, true]"),
             ({"type": "integer", "enum": [1, "a", 3], "minimum": 2}, "3"),
             ({"type": "array", "items": [{"type": "boolean"}], "additionalItems": False}, "[true]"),
             ({"type": "string", "maxLength": 2}, '"\\ud83d\\ude00x"'),
             (t.COUNTS, '{"opts": {"b": 2, "a": false}, "some": {"y": true}}'),
             (t.UNION, '{"name": "ann", "id": 7}'),
             ({"type": ["string", "null"], "oneOf": [{"type": "string", "minLength": 2}, {"type": "integer"}]}, '"ab"'),
             ({"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1, "maxProperties": 2},
              '{"k": 1, "j": -2}'),
             (t.ALLOF, '{"name": "ann", "id": 42}'),
             (t.SETS, '{"tags": ["a", "\\u00e9", "\u00e8"], "any": ["x"]}'),
             ({"type": "array", "items": {"type": "string", "maxLength": 1}, "uniqueItems": True}, '["a", "\\ud83d\\ude00"]'),
             ({"type": "integer", "minimum": 0, "allOf": [{"maximum": 9}, {"type": ["integer", "null"], "minimum": 2}]}, "5"),
             ({"allOf": [{"properties": {"a": {}, "b": {}}, "additionalProperties": False},
                         {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]}, '{"a": [], "b": 1}')]
    for i, (schema, doc) in enumerate(pairs):
        put(d, f"pair-{i}", json.dumps(schema).encode() + b"\0" + doc.encode())
    for i, doc in enumerate(['{"a": {"b": [true, null, "\u00e9\\""]}}', "{}", '{"x": 1e5, "y": "\xe4\xb8\x96"}']):
        put(d, f"object-{i}", doc.encode())


def seed_safetensors_index(out: Path, model_dirs):
    """fuzz_safetensors_index links the tiny model's shards: its real index, and variants."""
    d = out / "safetensors_index"
    tiny = [m for m in model_dirs if m.name.startswith("tiny")]
    if not tiny or not (tiny[0] / "model.safetensors.index.json").exists():
        return
    raw = (tiny[0] / "model.safetensors.index.json").read_bytes()
    put(d, "tiny", raw)
    idx = json.loads(raw)
    wm = idx["weight_map"]
    keys = sorted(wm)
    put(d, "few", json.dumps({"weight_map": {k: wm[k] for k in keys[:3]}}).encode())
    put(d, "wrong-shard", json.dumps({"weight_map": {keys[0]: "model-00002-of-00004.safetensors"
                                      if wm[keys[0]] != "model-00002-of-00004.safetensors"
                                      else "model-00001-of-00004.safetensors"}}).encode())
    put(d, "missing-shard", json.dumps({"weight_map": {keys[0]: "model-00009-of-00009.safetensors"}}).encode())
    put(d, "unknown-tensor", json.dumps({"weight_map": {"no.such.tensor": wm[keys[0]]}}).encode())
    put(d, "empty-map", b'{"weight_map": {}}')


def seed(out: Path, model_dirs):
    sys.path.insert(0, str(REPO / "tests" / "python"))
    makers = [("output_parser", seed_output_parser), ("chat", seed_chat), ("http", seed_http),
              ("json_grammar", seed_json_grammar),
              ("safetensors_index", lambda o: seed_safetensors_index(o, model_dirs))]
    if (TOK_DIR / "tokenizer.json").exists():
        makers += [("tokenizer", seed_tokenizer), ("tokenizer_load", seed_tokenizer_load)]
    for target, make in makers:
        if not any((out / target).glob("seed-*")):  # seeded once; the corpus then grows by fuzzing
            make(out)
