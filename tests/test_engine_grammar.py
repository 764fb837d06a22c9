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
    ({"type": "integer", "minimum": 5, "maximum": 3},
     "admit no value: the lower bound 5 is not below the upper bound 3"),
    ({"type": "object", "properties": {"p": {"type": ["number", "null"], "minimum": 2.5,
                                             "exclusiveMaximum": 2.5}}},
     "lower bound 2.5 is not below the upper bound 2.5 (at `/properties/p/type/number`)"),
    ({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2}, "admit no integer"),
    ({"type": "number", "exclusiveMinimum": 0, "maximum": 1e-15},
     "admit no number of at most 15 digits"),
    ({"type": "number", "minimum": "0"}, "`minimum` must be a finite number"),
    ({"type": "integer", "maximum": True}, "`maximum` must be a finite number"),
    ({"type": "number", "maximum": [1]}, "`maximum` must be a finite number"),
    ({"type": "integer", "enum": [1, 2], "minimum": 2.5}, "admit no value of the enum"),
    ({"const": -1, "exclusiveMinimum": -1}, "admit no value of the const"),
    ({"anyOf": [{"type": "number"}], "minimum": 0}, "`minimum` together with `anyOf`"),
    ({"$defs": {"n": {"type": "number"}}, "$ref": "#/$defs/n", "maximum": 1},
     "`maximum` together with `$ref`"),
    ({"type": "integer", "minimum": 0, "multipleOf": 5}, "multipleOf"),
    ({"type": "number", "multipleOf": 0.5}, "multipleOf"),
    ({"type": "string", "format": "email"}, "email"),
    ({"type": "string", "pattern": "(a)\\1"}, "backreference"),
    ({"type": "string", "pattern": 5}, "must be a string"),
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


def test_bounds_become_the_numerals_in_range_wherever_the_number_is() -> None:
    gbnf = schema_grammar({"type": "integer", "minimum": 2, "exclusiveMaximum": 5}, "r")
    assert "root ::= [2-4] space\n" in gbnf
    # one-sided, negative, decimal; in properties, list types, arrays, $defs
    nested = schema_grammar({
        "type": "object", "$defs": {"neg": {"type": "integer", "maximum": -3}},
        "properties": {
            "a": {"type": ["integer", "null"], "minimum": 1},
            "b": {"$ref": "#/$defs/neg"},
            "c": {"type": "array", "items": {"type": "number", "minimum": 0.5,
                                             "maximum": 99.95}}}}, "r")
    assert 'a-0 ::= [1-9] [0-9]{0,14} space\n' in nested and '"null"' in nested
    assert 'neg ::= "-" ( [3-9] | [1-9] [0-9]{1,14} ) space\n' in nested
    assert 'c-item ::= ( "0." [5-9] [0-9]{0,13} | [1-9] ( "." [0-9]{1,14} )? |' in nested
    assert '"5" "0"{0,11} )? ) )? ) ) space\n' in nested
    # decimal bounds on an integer round inwards: 1.5 < x <= 3.5 is 2 or 3
    assert "root ::= [2-3] space\n" in schema_grammar(
        {"type": "integer", "exclusiveMinimum": 1.5, "maximum": 3.5}, "r")
    assert 'root ::= ( "-1" | "0" ) space\n' in schema_grammar(
        {"type": "integer", "minimum": -1.25, "exclusiveMaximum": 0.5}, "r")
    # the tighter of the inclusive and exclusive bound; an untyped schema is a number
    assert "root ::= [1-3] space\n" in schema_grammar(
        {"type": "integer", "minimum": 0, "exclusiveMinimum": 0, "maximum": 3,
         "exclusiveMaximum": 9}, "r")
    assert schema_grammar({"maximum": 0.75}, "r") == schema_grammar(
        {"type": "number", "maximum": 0.75}, "r")
    # bounds constrain numbers only: on a string, or beside properties, they change nothing
    assert schema_grammar({"type": "string", "minimum": 3}, "r") == schema_grammar(
        {"type": "string"}, "r")
    assert schema_grammar({"properties": {"a": {"type": "string"}}, "maximum": 1}, "r") == \
        schema_grammar({"properties": {"a": {"type": "string"}}}, "r")
    # a string's maxLength survives a list type (the converter alone would drop it)
    assert "char)?)?" in schema_grammar({"type": ["string", "null"], "maxLength": 3}, "r")


def test_bounds_beside_an_enum_or_const_filter_it() -> None:
    assert 'root ::= "2" | "\\"a\\""\n' in schema_grammar(
        {"enum": [1, 2, "a", 5, 1.25], "minimum": 1.5, "exclusiveMaximum": 5}, "r")
    assert 'root ::= "-0.5"\n' in schema_grammar({"const": -0.5, "maximum": 0}, "r")
    assert 'root ::= "2.5" | "3"\n' in schema_grammar(
        {"type": "number", "enum": [2.5, 3, 4], "exclusiveMinimum": 2, "maximum": 3.0}, "r")


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


def _parse(answer: str, size: int) -> tuple[str, list[tuple[int, str | None, str]]]:
    """`answer` fed `size` characters at a time: the content, and (index, name, arguments)
    of each tool-call delta."""
    parser = ToolCallParser((WEATHER, TIME))
    text, deltas = [], []
    for i in range(0, len(answer), size):
        t, d = parser.feed(answer[i:i + size])
        text.append(t)
        deltas.extend(d)
    t, d = parser.finish()
    text.append(t)
    deltas.extend(d)
    for d in deltas:  # each call whole in one fragment: a client reading tool_calls[0] has it
        assert d.id and d.type == "function" and d.name and d.arguments is not None
    return "".join(text), [(d.index, d.name, d.arguments) for d in deltas]


PARIS = [(0, "get_weather", '{"city": "Paris"}')]


def test_the_parser_splits_text_and_calls_across_any_chunking() -> None:
    answer = ('Let me check. <tool_call>\n{"name": "get_weather", "arguments": '
              '{"city": "Paris"}}\n</tool_call><tool_call>{"name": "nope", "arguments": {}}'
              '</tool_call> <tool_')
    for size in (1, 3, 7, len(answer)):
        # an unknown function stays text; an unfinished block at the end is text too
        assert _parse(answer, size) == (
            'Let me check. <tool_call>{"name": "nope", "arguments": {}}</tool_call> <tool_',
            PARIS)


@pytest.mark.parametrize(("answer", "content", "calls"), [
    # Qwen2.5-Coder calls without the tags (llama.cpp's parser of this format takes it too)
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', "", PARIS),
    ('```json\n{ "name" : "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n```',
     "", PARIS),
    ('```\n{"name": "get_weather", "arguments": {"city": "Paris"}}', "", PARIS),  # unclosed fence
    ('Checking.\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
     '{"name": "get_time", "arguments": {}}',
     "Checking.\n\n", PARIS + [(1, "get_time", "{}")]),
    # braces, fences and objects that are no call stay text, byte for byte
    ('Use {x} or `f()`, <b>bold</b> and a < b.\n```python\nd = {"name": 1}\n```\n'
     '{"name": "Bob", "arguments": {"name": "get_time", "arguments": {}}} '
     '{"name": "get_weather", "arguments": [1]} {"name": "get_weather", "argu',
     'Use {x} or `f()`, <b>bold</b> and a < b.\n```python\nd = {"name": 1}\n```\n'
     '{"name": "Bob", "arguments": {"name": "get_time", "arguments": {}}} '
     '{"name": "get_weather", "arguments": [1]} {"name": "get_weather", "argu', []),
    # a block cut short (max_tokens): a whole call inside counts, else it is all text
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n', "\n", PARIS),
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',
     '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', []),
    ('A brace in a string: {"name": "get_weather", "arguments": {"city": "}{\\""}} ok',
     "A brace in a string:  ok", [(0, "get_weather", '{"city": "}{\\""}')]),
])
def test_the_parser_takes_bare_calls_as_llama_cpp_does(
        answer: str, content: str, calls: list[tuple[int, str | None, str]]) -> None:
    for size in (1, 2, 5, len(answer)):
        assert _parse(answer, size) == (content, calls), size


def test_parallel_tool_calls_false_forces_exactly_one_call() -> None:
    one = grammar((WEATHER, TIME), ToolChoice("required"), parallel=False)
    assert one is not None and "root ::= call\n" in one
    several = grammar((WEATHER, TIME), ToolChoice("required"), parallel=True)
    assert several is not None and 'root ::= call ( "\\n" call )*\n' in several
    # unset: one call (a small model would add calls until max_tokens)
    assert grammar((WEATHER,), ToolChoice("function", "get_weather")) == \
        grammar((WEATHER,), ToolChoice("function", "get_weather"), parallel=False)


def _live(answer: str, size: int) -> tuple[str, list[tuple[int, str, str]], int]:
    """`answer` fed `size` characters at a time under the engine's grammar (`live`): the
    content, each call assembled from its fragments (index, name, arguments), and how
    many characters had been fed when the first fragment came."""
    parser = ToolCallParser((WEATHER, TIME))
    text: list[str] = []
    calls: dict[int, list[str]] = {}
    first = -1
    for i in range(0, len(answer), size):
        t, deltas = parser.feed(answer[i:i + size], live=True)
        text.append(t)
        assert len({d.index for d in deltas}) == len(deltas)  # one fragment a call a chunk
        for d in deltas:
            first = i + size if first < 0 else first
            call = calls.setdefault(d.index, ["", ""])
            if d.name:
                assert d.id and d.type == "function" and not call[0]
                call[0] = d.name
            call[1] += d.arguments or ""
    t, deltas = parser.finish()
    text.append(t)
    for d in deltas:
        calls.setdefault(d.index, ["", ""])[1] += d.arguments or ""
    return "".join(text), [(i, c[0], c[1]) for i, c in sorted(calls.items())], first


@pytest.mark.parametrize(("answer", "content", "calls"), [
    ('Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa}ris"}}\n'
     '</tool_call>', "Sure.\n", [(0, "get_weather", '{"city": "Pa}ris"}')]),
    ('```json\n{\n    "name": "get_weather",\n    "arguments": {"city": "Oslo"}\n}\n```',
     "", [(0, "get_weather", '{"city": "Oslo"}')]),
    ('{"name":"get_time","arguments":{}}', "", [(0, "get_time", "{}")]),
    ('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n<tool_call>\n'
     '{"name": "get_weather", "arguments": {"city": "Rome", "days": [1, {"x": "]"}]}}\n'
     '</tool_call>', "\n", [(0, "get_time", "{}"),
                            (1, "get_weather", '{"city": "Rome", "days": [1, {"x": "]"}]}')]),
])
def test_a_call_the_grammar_holds_streams_as_it_is_written(
        answer: str, content: str, calls: list[tuple[int, str, str]]) -> None:
    """Under the engine's grammar the call is sure to be valid, so its header goes out as
    soon as its name is written and its arguments follow fragment by fragment (as OpenAI
    streams them), not all at once when the call has ended."""
    for size in (1, 3, 8, len(answer)):
        got_content, got_calls, first = _live(answer, size)
        assert (got_content, got_calls) == (content, calls), size
        for _, _, args in calls:
            json.loads(args)  # the fragments join to the arguments as written
        if size == 1:  # the header came with the name's closing quote
            assert first == answer.index(f'"{calls[0][1]}"') + len(calls[0][1]) + 2


def test_a_streamed_call_cut_short_stays_a_call() -> None:
    """max_tokens inside the arguments: the fragments already out stay a call (the
    answer's finish_reason says `length`), as OpenAI's stream leaves them."""
    got_content, got_calls, _ = _live('<tool_call>\n{"name": "get_weather", "arguments": '
                                      '{"city": "Ber', 4)
    assert got_content == "" and got_calls == [(0, "get_weather", '{"city": "Ber')]


def test_without_the_grammar_a_call_comes_whole() -> None:
    """Not live (no grammar, or before it holds): a call is only a call once whole, so it
    is not streamed (a call-shaped object may still turn out to be text)."""
    parser = ToolCallParser((WEATHER, TIME))
    head = '{"name": "get_weather", "arguments": {"city": '
    assert parser.feed(head) == ("", ())
    text, deltas = parser.feed('"Paris"}}')
    assert text == "" and [(d.name, d.arguments) for d in deltas] == [
        ("get_weather", '{"city": "Paris"}')]
