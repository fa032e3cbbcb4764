"""Constrained JSON output (response_format json_schema / json_object, the
Responses API's text.format, Anthropic's output_config.format), checked with
the `jsonschema` package as the reference validator.

The scripted mock follows its script where the schema allows and is forced
off it where it does not (a script of plain prose still yields a valid
document); its seeded noise, sampled at several temperatures, must stay
valid too. The tiny model (random weights, the real 248k-token vocabulary with
its multi-byte tokens) is the hard case: noise that a constraint alone turns
into valid documents, greedy and sampled, every request ending on its own
(bounded schemas: enums, short strings, few items).
"""

import decimal
import json

import anthropic
import jsonschema
import openai
import pytest

from models import model_dir
from serverproc import MODEL, Server

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", None]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
        "pet": {"anyOf": [{"type": "null"},
                          {"type": "object", "properties": {"kind": {"const": "cat"}}, "required": ["kind"]}]},
    },
    "required": ["name", "age", "ok", "color"],
    "additionalProperties": False,
}

TREE = {
    "$ref": "#/$defs/node",
    "$defs": {"node": {"type": "object",
                       "properties": {"v": {"type": "number"},
                                      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
                       "required": ["v"], "additionalProperties": False}},
}


def fmt(schema, name="out"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def _multiple_of_in_decimal(validator, m, instance, schema):
    # JSON Schema's multipleOf on the numbers as written (each float's shortest repr is the
    # document's text), as orchid enforces it: the package divides floats, and 0.07 / 0.01
    # = 7.000000000000001 would fail a multiple of 0.01
    if not validator.is_type(instance, "number"):
        return
    with decimal.localcontext(decimal.Context(prec=80)):
        q = decimal.Decimal(repr(instance)) / decimal.Decimal(repr(m))
        if q != q.to_integral_value():
            yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {m!r}")


Validator = jsonschema.validators.extend(jsonschema.validators.validator_for({}),
                                         {"multipleOf": _multiple_of_in_decimal})


def valid(text, schema):
    doc = json.loads(text)
    Validator.check_schema(schema)
    Validator(schema).validate(doc)
    return doc


def ask(client, content, **kw):
    kw.setdefault("max_tokens", 400)
    return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": content}], **kw)


# ---- the mock: scripts, noise, every API ----

def test_script_that_fits_is_followed(client):
    doc = {"name": "Ann", "age": 31, "ok": True, "color": "red", "tags": ["a", "b"], "pet": {"kind": "cat"}}
    r = ask(client, "SCRIPT:" + json.dumps(doc), response_format=fmt(PERSON))
    assert valid(r.choices[0].message.content, PERSON) == doc and r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.model_extra.get("reasoning_content") in (None, "")  # thinking is off


@pytest.mark.parametrize("content", ["SCRIPT:I would rather write prose.", "SCRIPT:{\"name\": 5}", "no script"])
@pytest.mark.parametrize("temperature", [0, 0.8, 1.5])
def test_output_is_always_valid(client, content, temperature):
    for seed in range(4):
        r = ask(client, content, response_format=fmt(PERSON), temperature=temperature, seed=seed)
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        valid(r.choices[0].message.content, PERSON)
        if temperature == 0:
            break


BOUNDED = {
    "type": "object",
    "properties": {"age": {"type": "integer", "minimum": 18, "maximum": 99},
                   "delta": {"type": ["integer", "null"], "exclusiveMinimum": -3, "exclusiveMaximum": 3},
                   "big": {"type": "integer", "minimum": 1000},
                   "p": {"type": "number", "minimum": 0, "maximum": 1},
                   "t": {"type": "number", "exclusiveMinimum": -0.5, "exclusiveMaximum": 0.25},
                   "step": {"type": "integer", "multipleOf": 5, "minimum": -20}},
    "required": ["age", "delta", "big", "p", "t", "step"],
    "additionalProperties": False,
}


def followed_and_forced(client, schema, doc, off_script):
    """A script the schema allows is followed; one it does not is turned back into a valid
    document; sampled noise always ends in one."""
    r = ask(client, "SCRIPT:" + json.dumps(doc), response_format=fmt(schema))
    assert valid(r.choices[0].message.content, schema) == doc
    r = ask(client, "SCRIPT:" + off_script, response_format=fmt(schema))
    valid(r.choices[0].message.content, schema)
    for temperature in (0.8, 1.5):
        for seed in range(4):
            r = ask(client, "no script", response_format=fmt(schema), temperature=temperature, seed=seed)
            assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
            valid(r.choices[0].message.content, schema)


def test_numeric_bounds(client):
    followed_and_forced(client, BOUNDED, {"age": 42, "delta": -2, "big": 123456, "p": 0.75, "t": -0.125, "step": -15},
                        '{"age": 7, "delta": 3, "big": 5, "p": 1.5, "t": 0.25, "step": 7}')


PATTERNS = {
    "type": "object",
    "properties": {"date": {"type": "string", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"},
                   "code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{1,6}$"},
                   "has_ab": {"type": "string", "pattern": "^.{0,4}ab.{0,2}$"},
                   "word": {"type": ["string", "null"], "pattern": "^(?:yes|no|maybe)$"},
                   "tag": {"type": "string", "pattern": "^[a-z]+\\d*$", "minLength": 2, "maxLength": 5}},
    "required": ["date", "code", "has_ab", "word", "tag"],
    "additionalProperties": False,
}


TUPLES = {
    "type": "object",
    "properties": {"pt": {"type": "array", "prefixItems": [{"type": "number"}, {"type": "number"}],
                          "minItems": 2, "maxItems": 2},
                   "head": {"type": "array", "prefixItems": [{"enum": ["a", "b"]}], "items": {"type": "integer"},
                            "maxItems": 3},
                   "set": {"type": "array", "items": {"enum": ["r", "g", "b", 7, None]}, "uniqueItems": True}},
    "required": ["pt", "head", "set"],
    "additionalProperties": False,
}


def test_tuples(client):
    # prefixItems (Pydantic's tuple[...]) with 'items' for the rest; a set of literal values
    followed_and_forced(client, TUPLES, {"pt": [0.5, -2], "head": ["b", 3, 4], "set": [7, "g", None]},
                        '{"pt": [1, 2, 3], "head": [3, "a"], "set": ["r", "r", "x"]}')
    # the older form (draft 7): 'items' as an array, 'additionalItems' for the rest
    old = {"type": "array", "items": [{"type": "boolean"}, {"type": "string", "maxLength": 3}],
           "additionalItems": False, "minItems": 1}
    for script in ("[true, \"abc\"]", "[1, 2, 3]"):
        r = ask(client, "SCRIPT:" + script, response_format=fmt(old))
        jsonschema.Draft7Validator(old).validate(json.loads(r.choices[0].message.content))
    assert json.loads(ask(client, "SCRIPT:[true, \"abc\"]", response_format=fmt(old)).choices[0].message.content) == \
        [True, "abc"]


COUNTS = {
    "type": "object",
    "properties": {"opts": {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"enum": [1, 2]},
                                                            "c": {"type": "null"}},
                            "required": ["a"], "minProperties": 2, "maxProperties": 2, "additionalProperties": False},
                   "some": {"type": "object", "properties": {"x": {"type": "boolean"}, "y": {"type": "boolean"}},
                            "minProperties": 1, "additionalProperties": False}},
    "required": ["opts", "some"],
    "additionalProperties": False,
}


def test_property_counts(client):
    # minProperties / maxProperties: over declared properties (a required one kept room for)
    followed_and_forced(client, COUNTS, {"opts": {"b": 2, "a": False}, "some": {"y": True}},
                        '{"opts": {"b": 1, "c": null, "a": true}, "some": {}}')
    # over free keys (greedy only: the mock's noise writes keys of any length)
    free = {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 1, "maxProperties": 2}
    r = ask(client, "SCRIPT:" + json.dumps({"k": 1, "j": -2}), response_format=fmt(free))
    assert valid(r.choices[0].message.content, free) == {"k": 1, "j": -2}
    for script in ('{"k": 1, "j": 2, "i": 3}', "{}"):
        r = ask(client, "SCRIPT:" + script, response_format=fmt(free))
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        assert 1 <= len(valid(r.choices[0].message.content, free)) <= 2


UNION = {
    "type": "object",
    "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 999}, "name": {"type": "string", "maxLength": 8}},
    "additionalProperties": False,
    "anyOf": [{"required": ["id"]}, {"required": ["name"]}],
}


def test_any_of_beside_other_keywords(client):
    # the keywords beside anyOf apply to every alternative: one of the two, in the declared shape
    followed_and_forced(client, UNION, {"name": "ann"}, '{"nick": "x"}')
    shaped = {"type": "string", "anyOf": [{"maxLength": 2}, {"pattern": "^x"}]}
    for script, want in (('"ab"', "ab"), ('"xylophone"', "xylophone")):
        r = ask(client, "SCRIPT:" + script, response_format=fmt(shaped))
        assert valid(r.choices[0].message.content, shaped) == want
    r = ask(client, 'SCRIPT:"abc"', response_format=fmt(shaped))
    valid(r.choices[0].message.content, shaped)


SETS = {
    "type": "object",
    "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "uniqueItems": True,
                            "minItems": 2, "maxItems": 6},
                   "any": {"type": "array", "items": {"type": "string", "maxLength": 4}, "uniqueItems": True,
                           "maxItems": 4}},
    "required": ["tags", "any"],
    "additionalProperties": False,
}


def test_sets_of_strings(client):
    # uniqueItems over free strings (Pydantic's set[str]): a repeat is never written
    followed_and_forced(client, SETS, {"tags": ["a", "bc", "\u00e9"], "any": []},
                        '{"tags": ["a", "a", "a"], "any": ["x", "x"]}')


INT_SET = {
    "type": "object",
    "properties": {"ids": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "maxItems": 5}},
    "required": ["ids"],
    "additionalProperties": False,
}


DICE = {
    "type": "object",
    "properties": {"dice": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 6},
                            "uniqueItems": True, "minItems": 2}},
    "required": ["dice"],
    "additionalProperties": False,
}


def test_sets_of_integers(client):
    # uniqueItems over integers without bounds (Pydantic's set[int]): a repeat is never written
    followed_and_forced(client, INT_SET, {"ids": [3, 30, -3, 0]}, '{"ids": [7, 7, 0, -0]}')
    # and over a bounded range (set[conint(ge=1, le=6)]): its values, each at most once
    followed_and_forced(client, DICE, {"dice": [6, 1, 3]}, '{"dice": [2, 2, 9]}')


PRICED = {
    "type": "object",
    "properties": {"price": {"type": "number", "multipleOf": 0.01, "minimum": 0},
                   "step": {"type": ["number", "null"], "multipleOf": 0.25, "maximum": 10},
                   "half": {"type": "integer", "multipleOf": 2.5}},
    "required": ["price", "step", "half"],
    "additionalProperties": False,
}


def test_number_multiples(client):
    # multipleOf on numbers (Pydantic's Field(multiple_of=0.01)) and a fractional one on an
    # integer (its multiples of 5), in decimal as the digits are written
    followed_and_forced(client, PRICED, {"price": 0.07, "step": -1.75, "half": 15},
                        '{"price": 0.075, "step": 0.3, "half": 3}')


ALLOF = {
    "$defs": {"Base": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1}}, "required": ["id"],
                       "title": "Base"}},
    "allOf": [{"$ref": "#/$defs/Base"},
              {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6}, "id": {"maximum": 99}},
               "required": ["name"], "title": "Named"}],
}


def test_all_of(client):
    # an allOf of several schemas (OpenAPI's composed models): every one of them holds
    followed_and_forced(client, ALLOF, {"id": 42, "name": "ann"}, '{"id": 500, "nick": "x"}')


def test_patterns(client):
    # the validator is Python's re (a search), as jsonschema uses it
    followed_and_forced(client, PATTERNS,
                        {"date": "2024-01-31", "code": "ABC-42", "has_ab": "grab!", "word": "maybe", "tag": "ab12"},
                        '{"date": "31/01/2024", "code": "abc", "has_ab": "", "word": "perhaps", "tag": "toolong99"}')
    # a search, not a whole match: without anchors "ab" may stand anywhere
    r = ask(client, 'SCRIPT:"a grab bag"', response_format=fmt({"type": "string", "pattern": "ab"}))
    assert json.loads(r.choices[0].message.content) == "a grab bag"
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, "x", response_format=fmt({"type": "string", "pattern": "(?<=a)b"}))
    assert "lookaround" in e.value.message


def test_pydantic_models_through_the_sdk(client):
    # what users send: the openai SDK's parse() turns a Pydantic model into a strict schema
    # (bounds from Field(ge=, le=), lengths, a nested model with a description); and the
    # model's own schema, where the nested model is a $ref with a description beside it
    from typing import Literal

    from pydantic import BaseModel, Field

    class Address(BaseModel):
        city: str = Field(max_length=20)
        zip: str = Field(pattern=r"^\d{5}$")
        code: str = Field(pattern=r"^[A-Z]{2}\d+$", max_length=6)

    class Person(BaseModel):
        name: str = Field(max_length=12)
        age: int = Field(ge=0, le=150)
        score: float = Field(ge=0, le=1)
        home: Address = Field(description="where they live")
        tags: list[str] = Field(max_length=3)
        lot: int = Field(multiple_of=100, ge=0)
        price: float = Field(multiple_of=0.01, ge=0)
        colors: set[Literal["red", "green", "blue"]]
        where: tuple[float, float]
        pair: tuple[int, str] | None

    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    for temperature, seed in ((0, 0), (1.0, 1), (1.5, 2)):
        r = parse(model=MODEL, messages=[{"role": "user", "content": "no script"}], response_format=Person,
                  max_tokens=1500, temperature=temperature, seed=seed)
        p = r.choices[0].message.parsed
        assert isinstance(p, Person) and 0 <= p.age <= 150 and 0 <= p.score <= 1, r.choices[0].message.content
        assert len(p.where) == 2 and (p.pair is None or len(p.pair) == 2) and p.lot % 100 == 0 and p.lot >= 0
        assert decimal.Decimal(repr(p.price)) % decimal.Decimal("0.01") == 0 and p.price >= 0
        assert p.colors <= {"red", "green", "blue"}
    schema = Person.model_json_schema()
    r = ask(client, "no script", response_format=fmt(schema), temperature=1.0, seed=3, max_tokens=1500)
    Person.model_validate_json(r.choices[0].message.content)
    valid(r.choices[0].message.content, schema)


def test_recursive_schema_and_stream(client):
    for seed in range(6):
        chunks = list(ask(client, "no script", response_format=fmt(TREE), temperature=1.0, seed=seed, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].choices[0].finish_reason == "stop"
        valid(text, TREE)


def test_json_object_is_enforced(client):
    r = ask(client, "SCRIPT:plain words, not JSON", response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = ask(client, 'SCRIPT:{"a": [1, {"b": null}]}', response_format={"type": "json_object"})
    assert json.loads(r.choices[0].message.content) == {"a": [1, {"b": None}]}


def test_responses_and_anthropic(srv, client):
    r = client.responses.create(model=MODEL, input="SCRIPT:prose", max_output_tokens=400,
                                text={"format": {"type": "json_schema", "name": "p", "schema": PERSON}})
    valid(r.output_text, PERSON)
    assert [it.type for it in r.output] == ["message"]
    ac = anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0)
    m = ac.messages.create(model=MODEL, max_tokens=400, messages=[{"role": "user", "content": "SCRIPT:prose"}],
                           extra_body={"output_config": {"format": {"type": "json_schema", "schema": PERSON}}})
    assert [b.type for b in m.content] == ["text"] and m.stop_reason == "end_turn"
    valid(m.content[0].text, PERSON)
    # beside tools: a tool_use / function_call, or the document
    call = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
            "</tool_call>")
    tool = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
    fmt_a = {"output_config": {"format": {"type": "json_schema", "schema": PERSON}}}
    m = ac.messages.create(model=MODEL, max_tokens=400, messages=[{"role": "user", "content": "SCRIPT:" + call}],
                           tools=[tool], extra_body=fmt_a)
    assert m.stop_reason == "tool_use" and m.content[-1].input == {"city": "Paris"}
    m = ac.messages.create(model=MODEL, max_tokens=400, messages=[{"role": "user", "content": "SCRIPT:prose"}],
                           tools=[tool], extra_body=fmt_a)
    assert m.stop_reason == "end_turn"
    valid(m.content[0].text, PERSON)
    r = client.responses.create(model=MODEL, input="SCRIPT:" + call, max_output_tokens=400,
                                tools=[{"type": "function", "name": "get_weather", "parameters": tool["input_schema"]}],
                                text={"format": {"type": "json_schema", "name": "p", "schema": PERSON}})
    assert [it.type for it in r.output] == ["function_call"]


def test_logprobs_and_penalties_still_work(client):
    r = ask(client, "SCRIPT:prose", response_format=fmt(PERSON), logprobs=True, top_logprobs=2,
            frequency_penalty=0.5, temperature=0.7, seed=1)
    valid(r.choices[0].message.content, PERSON)
    assert len(r.choices[0].logprobs.content) == r.usage.completion_tokens - 1  # the end token is not text


BAD = [
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": PERSON}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a(?=b)"}}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"minimum": 0}}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/nope"}}},
     "response_format.json_schema.schema"),
]


@pytest.mark.parametrize("rf,param", BAD)
def test_unenforceable_schemas_are_refused(client, rf, param):
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, "x", response_format=rf)
    assert e.value.body["param"] == param, e.value.body


WEATHER = [{"type": "function", "function": {
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
CALL = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>"


def test_beside_tools_the_reply_is_the_document_or_calls(client):
    # OpenAI's rule: the schema binds the content; the model may call tools instead
    r = ask(client, "SCRIPT:" + CALL, response_format=fmt(PERSON), tools=WEATHER)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content in (None, "")
    assert json.loads(ch.message.tool_calls[0].function.arguments) == {"city": "Paris"}
    # two calls (whitespace between them), and the end after them
    r = ask(client, "SCRIPT:" + CALL + "\n" + CALL.replace("Paris", "Rome"), response_format=fmt(PERSON),
            tools=WEATHER)
    assert [json.loads(t.function.arguments)["city"] for t in r.choices[0].message.tool_calls] == ["Paris", "Rome"]
    # a document, and prose forced into one
    r = ask(client, 'SCRIPT:{"name": "Ann", "age": 30, "ok": true, "color": "red"}', response_format=fmt(PERSON),
            tools=WEATHER)
    assert valid(r.choices[0].message.content, PERSON)["name"] == "Ann" and r.choices[0].message.tool_calls is None
    r = ask(client, "SCRIPT:prose, then " + CALL, response_format=fmt(PERSON), tools=WEATHER)
    assert r.choices[0].message.tool_calls is None
    valid(r.choices[0].message.content, PERSON)
    # a document once begun cannot turn into a call; text after a call cannot follow
    r = ask(client, 'SCRIPT:{"name": "B"}' + CALL, response_format={"type": "json_object"}, tools=WEATHER)
    assert r.choices[0].message.tool_calls is None and json.loads(r.choices[0].message.content)["name"] == "B"
    r = ask(client, "SCRIPT:" + CALL + "trailing prose", response_format=fmt(PERSON), tools=WEATHER)
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.content in (None, "")
    # tool_choice none: the document only; required / named: the call; parallel off: one call
    r = ask(client, "SCRIPT:prose", response_format=fmt(PERSON), tools=WEATHER, tool_choice="none")
    valid(r.choices[0].message.content, PERSON)
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = ask(client, "SCRIPT:" + CALL, response_format=fmt(PERSON), tools=WEATHER, tool_choice=choice)
        assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == {"city": "Paris"}, choice
    r = ask(client, "SCRIPT:" + CALL + "\n" + CALL.replace("Paris", "Rome"), response_format=fmt(PERSON),
            tools=WEATHER, parallel_tool_calls=False)
    assert len(r.choices[0].message.tool_calls) == 1


def test_beside_tools_sampled_noise_stays_valid(client):
    for t in (0.7, 1.0, 1.5):
        for seed in range(3):
            r = ask(client, "no script", response_format=fmt(PERSON), tools=WEATHER, temperature=t, seed=seed)
            ch = r.choices[0]
            assert ch.finish_reason in ("stop", "tool_calls"), (t, seed, ch.finish_reason)
            if not ch.message.tool_calls:
                valid(ch.message.content, PERSON)


# ---- the tiny model: the real vocabulary ----

def test_tiny_model_noise_becomes_valid_documents():
    with Server(mock=False, model=model_dir("tiny"), args=["--max-seq", "2048", "--parallel", "2"]) as s:
        c = s.client(timeout=300)
        for schema in (PERSON, TREE, BOUNDED, PATTERNS, TUPLES, COUNTS, UNION, ALLOF, SETS):
            for temperature, seed in ((0, 0), (0.7, 1), (1.0, 2), (1.0, 3)):
                r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Describe it."}],
                                              max_tokens=600, temperature=temperature, seed=seed,
                                              response_format=fmt(schema))
                assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
                valid(r.choices[0].message.content, schema)
        # beside tools (the real vocabulary has single <tool_call> / </tool_call> tokens): a
        # valid document or tool calls, never a refusal
        for temperature, seed in ((0, 0), (1.0, 4)):
            r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Weather?"}],
                                          max_tokens=600, temperature=temperature, seed=seed,
                                          response_format=fmt(PERSON), tools=WEATHER)
            ch = r.choices[0]
            if ch.message.tool_calls:
                assert ch.finish_reason in ("tool_calls", "length")
            else:
                assert ch.finish_reason == "stop", ch.message.content
                valid(ch.message.content, PERSON)
