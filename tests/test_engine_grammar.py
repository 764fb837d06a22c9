"""Schemas to grammars, the tool prompt and the tool-call parse (no model needed)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from redline.engine.grammar import schema_grammar
from redline.engine.tools import ToolCallParser, grammar, render
from redline.errors import InvalidRequest
from redline.types import FunctionTool, Message, ToolCall, ToolChoice

WEATHER = FunctionTool("get_weather", "The weather in a city", {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
TIME = FunctionTool("get_time", None, None)


@pytest.mark.parametrize(("schema", "names"), [
    ({"type": "object", "patternProperties": {"^a": {}}}, "patternProperties"),
    ({"type": "number", "minimum": 0}, "integers only"),
    ({"type": "number", "minimum": 0.5, "exclusiveMaximum": 2.25},
     "`minimum`, `exclusiveMaximum` on a `number`"),
    ({"type": "object", "properties": {"p": {"type": ["number", "null"],
                                             "exclusiveMinimum": -1.5}}},
     "`exclusiveMinimum` on a `number` value (at `/properties/p/type/number`)"),
    ({"maximum": 0.75}, "`maximum` on an untyped value"),
    ({"type": "integer", "enum": [1, 2], "minimum": 1.5}, "`minimum` on a `integer`"),
    ({"type": "integer", "minimum": 0}, "both ends"),
    ({"type": "integer", "minimum": 0, "maximum": 10**6}, "at most"),
    ({"type": "string", "format": "email"}, "email"),
    ({"type": "string", "pattern": "a+"}, "anchored"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "maxLength"),
    ({"anyOf": [{"type": "string"}], "properties": {}}, "anyOf"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "object", "properties": {"a": {"type": "string", "multipleOf": 2}}},
     "multipleOf"),
    ({"type": "tuple"}, "unknown type"),
])
def test_what_the_grammar_cannot_enforce_is_refused(schema: dict[str, Any], names: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        schema_grammar(schema, "response_format")
    assert err.value.param == "response_format" and names in str(err.value)


def test_integer_bounds_become_the_values_between_them() -> None:
    gbnf = schema_grammar({"type": "integer", "minimum": 2, "exclusiveMaximum": 5}, "r")
    assert 'root ::= "2" | "3" | "4"' in gbnf
    nullable = schema_grammar({"type": ["integer", "null"], "minimum": 1, "maximum": 2}, "r")
    assert '"1" | "2"' in nullable and '"null"' in nullable
    # decimal bounds on an integer round inwards: 1.5 < x <= 3.5 is 2 or 3
    decimal = schema_grammar({"type": "integer", "exclusiveMinimum": 1.5, "maximum": 3.5}, "r")
    assert 'root ::= "2" | "3"\n' in decimal
    assert 'root ::= "-1" | "0"\n' in schema_grammar(
        {"type": "integer", "minimum": -1.25, "exclusiveMaximum": 0.5}, "r")
    # a string's maxLength survives a list type (the converter alone would drop it)
    assert "char)?)?" in schema_grammar({"type": ["string", "null"], "maxLength": 3}, "r")


def test_json_strings_admit_no_raw_control_characters() -> None:
    gbnf = schema_grammar({"type": "string"}, "r")
    assert r'[^"\\\x7F\x00-\x1F]' in gbnf


def test_forced_tool_call_grammar_names_only_the_offered_functions() -> None:
    both = grammar((WEATHER, TIME), ToolChoice("required"))
    assert both is not None and '"\\"get_weather\\""' in both and '"\\"get_time\\""' in both
    named = grammar((WEATHER, TIME), ToolChoice("function", "get_time"))
    assert named is not None and "get_weather" not in named
    assert grammar((WEATHER,), ToolChoice("auto")) is None
    assert grammar((WEATHER,), None) is None


def test_tools_and_earlier_tool_turns_render_as_text() -> None:
    msgs = (Message("system", "Be brief."), Message("user", "Weather in Paris?"),
            Message("assistant", "", tool_calls=(ToolCall("c1", "get_weather",
                                                          '{"city": "Paris"}'),)),
            Message("tool", "18C, sunny", tool_call_id="c1"))
    out = render(msgs, (WEATHER,), ToolChoice("auto"))
    assert out[0].role == "system" and out[0].content.startswith("Be brief.\n\n# Tools")
    listed = out[0].content.split("<tools>\n")[1].split("\n</tools>")[0]
    assert json.loads(listed)["function"]["name"] == "get_weather"
    assert out[2].content == ('<tool_call>\n{"name": "get_weather", "arguments": '
                              '{"city": "Paris"}}\n</tool_call>')
    assert out[3] == Message("user", "<tool_response>\n18C, sunny\n</tool_response>")
    # tool_choice none: the tools are not offered
    assert "# Tools" not in render(msgs, (WEATHER,), ToolChoice("none"))[0].content


def test_the_parser_splits_text_and_calls_across_any_chunking() -> None:
    answer = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": '
              '{"city": "Paris"}}\n</tool_call><tool_call>{"name": "nope", "arguments": {}}'
              '</tool_call> <tool_')
    for size in (1, 3, 7, len(answer)):
        parser = ToolCallParser((WEATHER,))
        text, deltas = [], []
        for i in range(0, len(answer), size):
            t, d = parser.feed(answer[i:i + size])
            text.append(t)
            deltas.extend(d)
        text.append(parser.flush())
        # an unknown function stays text; an unfinished block at the end is text too
        assert "".join(text) == ('Let me check. <tool_call>{"name": "nope", "arguments": {}}'
                                 '</tool_call> <tool_')
        assert [(d.index, d.name, d.arguments) for d in deltas] == [
            (0, "get_weather", ""), (0, None, '{"city": "Paris"}')]
        assert deltas[0].id and deltas[0].type == "function" and deltas[1].id is None


def test_parallel_tool_calls_false_forces_exactly_one_call() -> None:
    one = grammar((WEATHER, TIME), ToolChoice("required"), parallel=False)
    assert one is not None and "root ::= call\n" in one
    several = grammar((WEATHER, TIME), ToolChoice("required"), parallel=True)
    assert several is not None and 'root ::= call ( "\\n" call )*\n' in several
    # unset: one call (a small model would add calls until max_tokens)
    assert grammar((WEATHER,), ToolChoice("function", "get_weather")) == \
        grammar((WEATHER,), ToolChoice("function", "get_weather"), parallel=False)
