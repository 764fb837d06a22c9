"""What the embedded engine makes of a request beyond plain text: the tool prompt, the
grammar that constrains the answer (`response_format`, vLLM's structured outputs, a forced
tool call), and the parse
of tool calls out of the generated text.

`prepare` raises InvalidRequest (with `param`) for what the engine cannot enforce, before
anything is submitted: a schema keyword the grammar cannot express, a token id outside
the vocabulary in `logit_bias` or `stop_token_ids`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from redline.engine import regex
from redline.engine.grammar import JSON_OBJECT, schema_grammar
from redline.engine.tools import ToolCallParser, grammar, lazy_grammar, offered, render, specs
from redline.errors import InvalidRequest
from redline.types import GUIDED, GUIDED_KINDS, Chunk, GenerationRequest, Message, SamplingParams


@dataclass(frozen=True)
class Prepared:
    messages: tuple[Message, ...] | None  # what the chat template renders
    sampling: SamplingParams  # the request's, with the grammar set
    parse_tools: bool  # the answer may hold tool calls
    grammar_param: str = "response_format"  # the field the grammar comes from (for a 400)
    tools: list[dict[str, Any]] | None = None  # for a template that renders tools itself


@dataclass(frozen=True)
class TemplateOptions:
    """vLLM's chat-template fields: the assistant's turn opened (`add_generation_prompt`),
    or the final message continued (`continue_final_message`), and the template's own
    keyword arguments (`chat_template_kwargs`, such as Qwen3's `enable_thinking`), and a
    template of the request's own (`chat_template`), where the model trusts one."""

    add_generation_prompt: bool = True
    continue_final: bool = False
    kwargs: dict[str, Any] | None = None
    template: str | None = None


def template_options(request: GenerationRequest) -> TemplateOptions:
    """A request's chat-template fields, checked (a 400 names the one that is wrong). A
    text completion has no template: any value but the default is a 400 there."""
    x = request.extra
    kwargs = x.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InvalidRequest("chat_template_kwargs must be an object.",
                             param="chat_template_kwargs")
    template = x.get("chat_template")
    if template is not None and not isinstance(template, str):
        raise InvalidRequest("chat_template must be a string (Jinja).", param="chat_template")
    out = TemplateOptions(_flag(x, "add_generation_prompt", True),
                          _flag(x, "continue_final_message", False), kwargs or None,
                          template or None)
    if request.messages is None and out != TemplateOptions():
        name = ("chat_template" if out.template else "chat_template_kwargs" if out.kwargs
                else "continue_final_message" if out.continue_final else "add_generation_prompt")
        raise InvalidRequest(f"{name}: a text completion has no chat template.", param=name)
    return out


def chat_echo(request: GenerationRequest) -> str | None:
    """vLLM's `echo` on a chat: the answer starts with the last message's text where that
    message has the answer's role (the assistant's; with `add_generation_prompt: false`,
    the last message's own), as vLLM gives it: with `continue_final_message`, the whole
    message, the client's part and the model's. None: nothing to echo."""
    if request.messages is None or not _flag(request.extra, "echo", False) \
            or not request.messages:
        return None
    last = request.messages[-1]
    role = "assistant" if template_options(request).add_generation_prompt else last.role
    return last.content if last.role == role else None


def _flag(extra: Any, name: str, default: bool) -> bool:
    value = extra.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"{name} must be true or false.", param=name)
    return value


def prepare(request: GenerationRequest, n_vocab: int, native_tools: bool = False) -> Prepared:
    """`native_tools`: the model's template renders tools and tool turns itself."""
    s = request.sampling
    for token, _ in s.logit_bias:
        if not 0 <= int(token) < n_vocab:
            raise InvalidRequest(f"logit_bias: token {token} is not in this model's vocabulary "
                                 f"(0..{n_vocab - 1}).", param="logit_bias")
    for stop_id in s.stop_token_ids or ():
        if not 0 <= stop_id < n_vocab:
            raise InvalidRequest(f"stop_token_ids: token {stop_id} is not in this model's "
                                 f"vocabulary (0..{n_vocab - 1}).", param="stop_token_ids")
    gbnf, param = _format_grammar(request), "response_format"
    constrained = guided(request)
    if constrained is not None:
        if gbnf is not None:
            raise InvalidRequest(f"{constrained[1]} and a JSON response_format cannot both "
                                 "constrain one answer.", param=constrained[1])
        gbnf, param = constrained
    messages = request.messages
    tools = offered(request.tools, request.tool_choice)
    trigger = None
    if tools and messages is not None:
        forced = grammar(request.tools, request.tool_choice, request.parallel_tool_calls)
        if forced is not None:
            if gbnf is not None:
                raise InvalidRequest(f"A forced tool call and {param} cannot both constrain "
                                     "one answer.", param=param)
            gbnf, param = forced, "tools"
        elif gbnf is None:  # auto: a call the model starts is a valid call
            lazy = lazy_grammar(request.tools, request.tool_choice, request.parallel_tool_calls)
            if lazy is not None:
                (gbnf, trigger), param = lazy, "tools"
    listed = None
    if messages is not None and native_tools:
        listed = specs(request.tools, request.tool_choice) or None
    elif messages is not None and (tools or any(m.tool_calls or m.role == "tool" for m in messages)):
        messages = render(messages, request.tools, request.tool_choice)
    sampling = s if gbnf is None else dataclasses.replace(s, grammar=gbnf, grammar_trigger=trigger)
    return Prepared(messages, sampling, bool(tools) and messages is not None, param, listed)


@contextlib.contextmanager
def named_as_sent(request: GenerationRequest) -> Iterator[None]:
    """A 400 on `tools` or `tool_choice` inside, named as the client sent them: `functions`
    and `function_call` for OpenAI's deprecated function calling (read as tools)."""
    try:
        yield
    except InvalidRequest as exc:
        if not request.legacy_functions or exc.param not in ("tools", "tool_choice"):
            raise
        name = "functions" if exc.param == "tools" else "function_call"
        raise InvalidRequest(exc.message.replace(f"'{exc.param}'", f"'{name}'").replace(
            f"`{exc.param}`", f"`{name}`"), param=name) from exc


def guided(request: GenerationRequest) -> tuple[str, str] | None:
    """vLLM's structured outputs as a grammar, and the field it comes from (for a 400):
    `structured_outputs` with one of json (a JSON Schema, or its JSON text), choice (a
    list of strings: the answer is one of them), grammar (GBNF, as xgrammar and llama.cpp
    take it), regex (the whole answer matches it: engine/regex.py) or json_object; or the
    older guided_json, guided_choice, guided_grammar, guided_regex."""
    asked = [(k, v) for k, v in request.extra.items() if k in GUIDED and v is not None]
    if not asked:
        return None
    if len(asked) > 1:
        raise InvalidRequest(f"{asked[0][0]} and {asked[1][0]} cannot both constrain one "
                             "answer.", param=asked[1][0])
    field, value = asked[0]
    if field == "structured_outputs":
        if not isinstance(value, dict):
            raise InvalidRequest("structured_outputs must be an object.", param=field)
        kinds = [k for k in GUIDED_KINDS if value.get(k) not in (None, False)]
        if len(kinds) != 1:
            raise InvalidRequest("structured_outputs takes exactly one of "
                                 f"{', '.join(GUIDED_KINDS)}.", param=field)
        kind, value, field = kinds[0], value[kinds[0]], f"structured_outputs.{kinds[0]}"
    else:
        kind = field.removeprefix("guided_")
    if kind == "json_object":
        if value is not True:
            raise InvalidRequest("json_object must be true.", param=field)
        return JSON_OBJECT, field
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise InvalidRequest("The JSON Schema is not valid JSON.", param=field) from exc
        if not isinstance(value, dict):
            raise InvalidRequest("The JSON Schema must be an object.", param=field)
        return schema_grammar(value, field), field
    if kind == "choice":
        if not isinstance(value, list) or not value or \
                not all(isinstance(c, str) and c for c in value):
            raise InvalidRequest("The choices must be a list of non-empty strings.", param=field)
        return "root ::= " + " | ".join(_literal(c) for c in value), field
    if kind == "regex":
        if not isinstance(value, str):
            raise InvalidRequest("The regex must be a string.", param=field)
        try:
            return "root ::= " + regex.expression(value), field
        except regex.RegexError as exc:
            raise InvalidRequest(f"The embedded engine cannot enforce this regex: {exc}.",
                                 param=field) from exc
    if not isinstance(value, str) or not value.strip():
        raise InvalidRequest("The grammar must be GBNF text.", param=field)
    return value, field


def _literal(text: str) -> str:
    """`text` as a GBNF string literal."""
    escaped = (text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
               .replace("\r", "\\r").replace("\t", "\\t"))
    return f'"{escaped}"'


def _format_grammar(request: GenerationRequest) -> str | None:
    fmt = request.response_format
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return JSON_OBJECT
    schema = dict(fmt.schema) if fmt.schema is not None else {}
    return schema_grammar(schema, "response_format")


async def with_tool_calls(chunks: AsyncIterator[Chunk], parser: ToolCallParser) -> AsyncIterator[Chunk]:
    """`chunks` with tool-call blocks taken out of the text and made tool-call deltas; a
    choice that called a tool finishes with "tool_calls"."""
    async for chunk in chunks:
        text, calls = parser.feed(chunk.text, live=chunk.constrained)
        if chunk.finish is not None:
            rest, last = parser.finish()
            text, calls = text + rest, calls + last
            if parser.calls and chunk.finish == "stop":
                if chunk.finish_reason is not None:
                    chunk.finish_reason = "tool_calls"
                else:
                    chunk.ends_choice = "tool_calls"
        chunk.text, chunk.tool_calls = text, chunk.tool_calls + calls
        yield chunk
