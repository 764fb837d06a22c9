"""`tool_choice: auto` on the embedded engine: the lazy grammar (tools.lazy_grammar) and the
sampler's wait for its trigger (sampling.Sampler._watch), checked by llama.cpp's grammar
engine over SmolLM2's vocabulary. The model on it: tests/test_models_qwen.py."""

from __future__ import annotations

import json
import re
from typing import Any

import llama_cpp as ll
import pytest
from grammar_oracle import grammar_takes

from redline.backends.local_features import prepare
from redline.engine.sampling import Sampler
from redline.engine.tools import lazy_grammar
from redline.types import FunctionTool, GenerationRequest, Message, SamplingParams, ToolChoice

CODE = {"type": "string", "pattern": "^[A-Z]{3}$"}
FLIGHT = FunctionTool("book_flight", "Book a flight", {
    "type": "object", "properties": {"origin": CODE, "seats": {"type": "integer"}},
    "required": ["origin"], "additionalProperties": False})
TIME = FunctionTool("get_time", None, None)
TOOLS = (FLIGHT, TIME)


def call(name: str, args: dict[str, Any]) -> str:
    return json.dumps({"name": name, "arguments": args})


def test_the_trigger_is_a_call_of_a_listed_tool_begun() -> None:
    got = lazy_grammar(TOOLS, ToolChoice("auto"))
    assert got is not None
    trigger = re.compile(got[1])
    for text, start in [("Sure.\n<tool_call>", "<tool_call>"),
                        ('```json\n{"name": "book_flight"', '{"name": "book_flight"'),
                        ('{ "name" :"get_time"', '{ "name" :"get_time"')]:
        found = trigger.search(text)
        assert found is not None and text[found.start(1):] == start
    # text that only looks like a call: another name, a name still being written
    for text in ['{"name": "Alice"', '{"name": "book_flight_v2', '{"name": "get_', "<tool_"]:
        assert trigger.search(text) is None, text


def test_only_auto_with_something_to_call_is_lazy() -> None:
    assert lazy_grammar(TOOLS, None) is not None  # auto is the default with tools
    assert lazy_grammar(TOOLS, ToolChoice("required")) is None  # forced: grammar()
    assert lazy_grammar(TOOLS, ToolChoice("none")) is None
    assert lazy_grammar((), ToolChoice("auto")) is None
    # a schema the grammar cannot enforce: calls parsed unchecked, as before (no 400)
    odd = FunctionTool("odd", None, {"type": "object", "properties": {
        "n": {"type": "integer", "multipleOf": 3}}})
    assert lazy_grammar((odd,), ToolChoice("auto")) is None
    request = GenerationRequest(model="m", messages=(Message("user", "hi"),), tools=(odd,),
                                sampling=SamplingParams(),
                                tool_choice=ToolChoice("auto"))
    assert prepare(request, 1000).sampling.grammar is None


def test_the_grammar_takes_valid_calls_in_the_forms_begun(smol_vocab: Any) -> None:
    got = lazy_grammar(TOOLS, ToolChoice("auto"))
    assert got is not None
    takes = grammar_takes(smol_vocab, got[0])
    try:
        good = call("book_flight", {"origin": "JFK", "seats": 2})
        assert takes(f"<tool_call>\n{good}\n</tool_call>")
        assert takes(good) and takes(good + "\n```")  # bare, closing a fence or not
        assert takes('{"name":"get_time","arguments":{}}')  # spacing as the model chose
        assert not takes(call("book_flight", {"origin": "London"}))  # the schema holds
        assert not takes(call("book_flight", {"seats": 1}))  # required
        assert not takes(call("cancel_flight", {}))
        assert not takes(f"<tool_call>\n{good}\n</tool_call>\n<tool_call>\n{good}\n</tool_call>")
        assert not takes(f"<tool_call>\n{good}\n</tool_call> Done!")  # the calls end it
    finally:
        takes.free()  # type: ignore[attr-defined]
    parallel = lazy_grammar(TOOLS, ToolChoice("auto"), parallel=True)
    assert parallel is not None
    takes = grammar_takes(smol_vocab, parallel[0])
    try:
        assert takes(f"<tool_call>\n{good}\n</tool_call>\n<tool_call>\n{good}\n</tool_call>")
    finally:
        takes.free()  # type: ignore[attr-defined]


def watched(smol_vocab: Any, text: str) -> Sampler:
    """A sampler of a lazy grammar fed `text` token by token, as the engine would feed it."""
    model, _ = smol_vocab
    got = lazy_grammar(TOOLS, ToolChoice("auto"))
    assert got is not None
    s = Sampler(SamplingParams(grammar=got[0], grammar_trigger=got[1]))
    s._vocab = model.vocab  # noqa: SLF001 (set by _build from a context; none here)
    for t in model.tokenize(text, add_special=False, parse_special=True):
        if s._grammar is not None:  # noqa: SLF001 (triggered: sample() checks each token)
            assert s._allows(t), text  # noqa: SLF001
            ll.llama_sampler_accept(s._grammar, t)  # noqa: SLF001
        elif s._trigger is not None:  # noqa: SLF001 (waiting, as sample() does)
            s._watch(t)  # noqa: SLF001
    return s


@pytest.mark.parametrize("text", [
    'Let me book that.\n```json\n{"name": "book_flight", "arguments": {"origin": "JF',
    '<tool_call>\n{"name": "get_time", "arguments": {',
    # pretty-printed, as Qwen2.5-Coder sometimes begins one (its indentation was refused)
    '{\n    "name": "book_flight",\n    "arguments": {"origin": "JF',
])
def test_a_call_begun_turns_the_grammar_on(smol_vocab: Any, text: str) -> None:
    s = watched(smol_vocab, text)
    try:
        assert s._grammar is not None  # noqa: SLF001
        model, end = smol_vocab
        assert not s._allows(end)  # noqa: SLF001 (mid-call: the answer cannot end here)
        assert not s._allows(model.tokenize("London", add_special=False)[0])  # noqa: SLF001
    finally:
        s.close()


@pytest.mark.parametrize("text", [
    'A JSON example: {"name": "Alice", "age": 3}',  # no listed tool: text
    'I would call {"name": "get_time"} but I need more.',  # a false start: stays text
])
def test_text_that_is_no_call_stays_free(smol_vocab: Any, text: str) -> None:
    s = watched(smol_vocab, text)
    try:
        assert s._grammar is None  # noqa: SLF001
    finally:
        s.close()
