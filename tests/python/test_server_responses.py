"""OpenAI Responses surface of `orchid serve` (/v1/responses), driven by the
official openai client: its models and its stream accumulator
(responses.stream -> get_final_response, which checks item identities and
that every item was finished) are the reference for the shapes.

Against the scripted mock (see test_server_api.py) the tests pin the
translation edges: instructions, input items (messages, reasoning,
function_call, function_call_output) fed back as Codex does, tool_choice,
reasoning effort, max_output_tokens, usage with the prefix cache, and errors
naming the field. Against the tiny model's real chat template and tokenizer
they pin that a Responses request renders to exactly the prompt of the
equivalent chat request.
"""

import json

import openai
import pytest

from models import model_dir
from serverproc import MODEL, Server


NOTHINK = {"reasoning": {"effort": "none"}}
THOUGHT = "SCRIPT:let me think</think>\n\nThe answer."
TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                         "required": ["city"]}}]
CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


def raw_events(srv, body):
    """POSTs a streaming body; returns [(event name, data dict)] in order."""
    status, headers, data = srv.request("POST", "/v1/responses", dict(body, stream=True), timeout=60)
    assert status == 200 and headers["content-type"] == "text/event-stream"
    out = []
    for block in data.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        name, d = lines[0][7:], json.loads(lines[1][6:])
        assert d["type"] == name, block
        out.append((name, d))
    assert [d["sequence_number"] for _, d in out] == list(range(len(out)))
    return out


def shape(output):
    """Output items without their ids (those differ between requests)."""
    out = []
    for it in output:
        d = it.model_dump(exclude_none=True)
        d.pop("id", None)
        d.pop("call_id", None)
        d.pop("parsed_arguments", None)
        for c in d.get("content", []):
            c.pop("parsed", None)
        out.append(d)
    return out


# ---- plain replies ----

def test_text_reply_and_echo(client):
    r = client.responses.create(model=MODEL, input="SCRIPT:Hello there.", instructions="Be brief.",
                                temperature=0.5, max_output_tokens=100, **NOTHINK)
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed" and r.model == MODEL
    assert r.output_text == "Hello there."
    assert [it.type for it in r.output] == ["message"]
    msg = r.output[0]
    assert msg.role == "assistant" and msg.status == "completed" and msg.id.startswith("msg_")
    assert msg.content[0].type == "output_text" and msg.content[0].annotations == []
    assert r.instructions == "Be brief." and r.temperature == 0.5 and r.max_output_tokens == 100
    assert r.tool_choice == "auto" and r.tools == [] and r.error is None and r.incomplete_details is None
    u = r.usage
    assert u.output_tokens == len("Hello there.") + 1 and u.output_tokens_details.reasoning_tokens == 0
    assert u.total_tokens == u.input_tokens + u.output_tokens and u.input_tokens_details.cached_tokens >= 0


def test_same_prompt_as_chat(client):
    """instructions and leading developer/system messages make one system message."""
    r = client.responses.create(model=MODEL, instructions="A.", **NOTHINK, input=[
        {"role": "developer", "content": "B."},
        {"role": "user", "content": [{"type": "input_text", "text": "SCRIPT:"}, {"type": "input_text", "text": "x"}]}])
    c = client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "A.\n\nB."},
                                                              {"role": "user", "content": "SCRIPT:x"}],
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert r.output_text == c.choices[0].message.content == "x"
    assert r.usage.input_tokens == c.usage.prompt_tokens


def test_reasoning_item(client):
    r = client.responses.create(model=MODEL, input=THOUGHT, reasoning={"effort": "high"})
    assert [it.type for it in r.output] == ["reasoning", "message"]
    rs = r.output[0]
    assert rs.id.startswith("rs_") and rs.content[0].type == "reasoning_text" and rs.content[0].text == "let me think"
    assert r.output_text == "The answer."
    n = r.usage.output_tokens_details.reasoning_tokens
    assert 0 < n <= r.usage.output_tokens, r.usage
    r = client.responses.create(model=MODEL, input="SCRIPT:Direct.", **NOTHINK)
    assert [it.type for it in r.output] == ["message"] and r.usage.output_tokens_details.reasoning_tokens == 0


def test_stream_events_and_accumulator(srv, client):
    ev = raw_events(srv, {"model": MODEL, "input": THOUGHT, "max_output_tokens": 200})
    names = [n for n, _ in ev]
    assert names[:2] == ["response.created", "response.in_progress"] and names[-1] == "response.completed"
    assert ev[0][1]["response"]["status"] == "in_progress" and ev[0][1]["response"]["output"] == []
    added = [d for n, d in ev if n == "response.output_item.added"]
    assert [(d["output_index"], d["item"]["type"]) for d in added] == [(0, "reasoning"), (1, "message")]
    text = "".join(d["delta"] for n, d in ev if n == "response.output_text.delta")
    thought = "".join(d["delta"] for n, d in ev if n == "response.reasoning_text.delta")
    assert (thought, text) == ("let me think", "The answer.")
    done = {d["output_index"]: d["item"] for n, d in ev if n == "response.output_item.done"}
    final = ev[-1][1]["response"]
    assert final["status"] == "completed" and final["output"] == [done[0], done[1]]
    assert final["usage"]["output_tokens"] > 0
    with client.responses.stream(model=MODEL, input=THOUGHT, max_output_tokens=200) as s:
        deltas = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        got = s.get_final_response()
    plain = client.responses.create(model=MODEL, input=THOUGHT, max_output_tokens=200)
    assert deltas == "The answer." and got.output_text == plain.output_text
    assert shape(got.output) == shape(plain.output)
    assert got.usage.output_tokens == plain.usage.output_tokens
    assert got.usage.output_tokens_details.reasoning_tokens == plain.usage.output_tokens_details.reasoning_tokens


def test_max_output_tokens_incomplete(srv, client):
    r = client.responses.create(model=MODEL, input="SCRIPT:a long scripted answer", max_output_tokens=3, **NOTHINK)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == "a l" and r.usage.output_tokens == 3 and r.output[0].status == "incomplete"
    ev = raw_events(srv, {"model": MODEL, "input": "SCRIPT:a long one", "max_output_tokens": 3,
                          "reasoning": {"effort": "none"}})
    assert ev[-1][0] == "response.incomplete"
    assert ev[-1][1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


# ---- tools ----

def test_function_call_round_trip(client):
    r = client.responses.create(model=MODEL, input="SCRIPT:Checking." + CALL, tools=TOOLS, **NOTHINK)
    assert [it.type for it in r.output] == ["message", "function_call"]
    fc = r.output[1]
    assert fc.id.startswith("fc_") and fc.call_id.startswith("call_") and fc.name == "get_weather"
    assert json.loads(fc.arguments) == {"city": "Paris", "days": 3} and fc.status == "completed"
    assert r.tools[0].name == "get_weather"
    with client.responses.stream(model=MODEL, input="SCRIPT:Checking." + CALL, tools=TOOLS, **NOTHINK) as s:
        args = "".join(e.delta for e in s if e.type == "response.function_call_arguments.delta")
        got = s.get_final_response()
    assert json.loads(args) == {"city": "Paris", "days": 3} and shape(got.output) == shape(r.output)
    # Codex's loop: the whole conversation goes back, the output items as they came
    history = [{"role": "user", "content": "SCRIPT:Checking." + CALL}] + [it.model_dump(exclude_none=True)
                                                                         for it in r.output]
    r2 = client.responses.create(model=MODEL, tools=TOOLS, **NOTHINK, input=history + [
        {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny, 21C"},
        {"role": "user", "content": "SCRIPT:It is sunny."}])
    assert r2.output_text == "It is sunny." and r2.status == "completed"


def test_reasoning_items_go_back(client):
    r = client.responses.create(model=MODEL, input=THOUGHT + CALL, tools=TOOLS, reasoning={"effort": "low"})
    assert [it.type for it in r.output] == ["reasoning", "message", "function_call"]
    history = [{"role": "user", "content": THOUGHT + CALL}] + [it.model_dump(exclude_none=True) for it in r.output]
    r2 = client.responses.create(model=MODEL, tools=TOOLS, input=history + [
        {"type": "function_call_output", "call_id": r.output[2].call_id,
         "output": [{"type": "input_text", "text": "sunny"}]},
        {"role": "user", "content": "SCRIPT:done</think>\n\nok"}])
    assert r2.output_text == "ok"


def test_tool_choice(client):
    r = client.responses.create(model=MODEL, input="SCRIPT:" + CALL, tools=TOOLS,
                                tool_choice={"type": "function", "name": "get_weather"})
    assert r.output[-1].type == "function_call" and json.loads(r.output[-1].arguments)["city"] == "Paris"
    r = client.responses.create(model=MODEL, input="SCRIPT:" + CALL, tools=TOOLS, tool_choice="required")
    assert r.output[-1].type == "function_call"
    r = client.responses.create(model=MODEL, input="SCRIPT:" + CALL, tools=TOOLS, tool_choice="none", **NOTHINK)
    assert [it.type for it in r.output] == ["message"] and "<tool_call>" in r.output_text


def test_parallel_tool_calls_false(client):
    two = "SCRIPT:" + CALL + "\n" + CALL.replace("Paris", "Rome")
    r = client.responses.create(model=MODEL, input=two, tools=TOOLS, max_output_tokens=400, **NOTHINK)
    assert [json.loads(it.arguments)["city"] for it in r.output if it.type == "function_call"] == ["Paris", "Rome"]
    r = client.responses.create(model=MODEL, input=two, tools=TOOLS, parallel_tool_calls=False, max_output_tokens=400,
                                **NOTHINK)
    assert [json.loads(it.arguments)["city"] for it in r.output if it.type == "function_call"] == ["Paris"]
    assert r.status == "completed"


def test_json_object_format(client):
    r = client.responses.create(model=MODEL, input='SCRIPT:{"a": 1}', text={"format": {"type": "json_object"}},
                                **NOTHINK)
    assert json.loads(r.output_text) == {"a": 1}


def test_multi_turn_reads_the_cache(client):
    r1 = client.responses.create(model=MODEL, input="SCRIPT:first answer", **NOTHINK)
    history = [{"role": "user", "content": "SCRIPT:first answer"}] + [it.model_dump(exclude_none=True)
                                                                      for it in r1.output]
    r2 = client.responses.create(model=MODEL, **NOTHINK,
                                 input=history + [{"role": "user", "content": "SCRIPT:second"}])
    assert r2.output_text == "second"
    assert r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens


# ---- errors: the field named ----

BAD = [
    ({}, "input"),
    ({"input": 5}, "input"),
    ({"input": []}, "input"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": "x", "background": True}, "background"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
    ({"input": [{"role": "critic", "content": "x"}]}, "input[0]"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0]"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input[0]"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0]"),
    ({"input": [{"type": "web_search_call", "id": "w"}]}, "input[0]"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": "x", "tools": [{"type": "function", "name": "bad name!"}]}, "tools[0]"),
    ({"input": "x", "tools": TOOLS, "tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
    ({"input": "x", "tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": "x", "text": {"format": {"type": "grammar", "grammar": "a+"}}}, "text.format"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "temperature": 3}, "temperature"),
    ({"input": "x", "instructions": 5}, "instructions"),
    ({"input": "x", "top_logprobs": 3}, "top_logprobs"),
]


@pytest.mark.parametrize("body,param", BAD)
def test_bad_requests(srv, body, param):
    status, _, data = srv.request("POST", "/v1/responses", dict({"model": MODEL}, **body))
    err = json.loads(data)["error"]
    assert status == 400 and err["type"] == "invalid_request_error", err
    assert err["param"] == param or (err["param"] or "").startswith(param), err


def test_wrong_model_and_server_keeps_serving(client):
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-5", input="x")
    assert client.responses.create(model=MODEL, input="SCRIPT:still here", **NOTHINK).output_text == "still here"


# ---- the real template: the same prompt as the chat request ----

def test_same_prompt_as_chat_on_the_real_template():
    with Server(mock=False, model=model_dir("tiny"), args=["--max-seq", "1024", "--parallel", "1"]) as s:
        c = s.client(timeout=120)
        items = [
            {"role": "developer", "content": "Use tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "Call the tool."}]},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": json.dumps({"city": "Paris", "days": 3})},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"role": "user", "content": "Thanks."},
        ]
        chat = [
            {"role": "system", "content": "Be brief.\n\nUse tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "Checking.", "reasoning_content": "Call the tool.",
             "tool_calls": [{"id": "call_1", "type": "function", "function": {
                 "name": "get_weather", "arguments": json.dumps({"city": "Paris", "days": 3})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
            {"role": "user", "content": "Thanks."},
        ]
        chat_tools = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")}}
                      for t in TOOLS]
        for on in (False, True):
            r = c.responses.create(model=MODEL, instructions="Be brief.", input=items, tools=TOOLS,
                                   max_output_tokens=2, temperature=0,
                                   reasoning={"effort": "medium" if on else "none"})
            o = c.chat.completions.create(model=MODEL, messages=chat, tools=chat_tools, max_tokens=2, temperature=0,
                                          extra_body={"chat_template_kwargs": {"enable_thinking": on}})
            assert r.usage.input_tokens == o.usage.prompt_tokens, (on, r.usage, o.usage)
            assert r.usage.output_tokens == o.usage.completion_tokens
            m = o.choices[0].message
            text = "".join(p.text for it in r.output for p in (it.content or []))
            assert text == (m.model_extra.get("reasoning_content") or "") + (m.content or "")
