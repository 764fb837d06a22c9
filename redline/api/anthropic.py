"""Anthropic's Messages API onto redline's typed request and back: the request's
blocks (text, image, tool_use, tool_result) as structured messages, tools and
tool_choice; the answer as content blocks (thinking, text, tool_use) whole, or as its
streaming events (message_start, content_block_start/delta/stop, message_delta,
message_stop), and errors in its shape.

Anthropic's own fields that an OpenAI-shaped request cannot carry are refused (400),
never dropped."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import Send

from redline.errors import InvalidRequest, RedlineError
from redline.routing.names import parse_tier
from redline.types import (
    ChoiceAnswer,
    ContentPart,
    FinishReason,
    FunctionTool,
    GenerationRequest,
    Message,
    SamplingParams,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    Usage,
)

# Anthropic's tool_choice types as the OpenAI modes
_MODES: dict[str, ToolChoiceMode] = {"auto": "auto", "any": "required", "tool": "function",
                                     "none": "none"}
STOP: dict[str, str] = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                        "content_filter": "refusal", "cancelled": "end_turn",
                        "error": "end_turn", "function_call": "tool_use"}


class Block(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking"]
    text: str | None = None
    # an answer's thinking, given back in its assistant turn: kept in the request, never
    # replayed to an engine (as the OpenAI-shaped APIs do with a past turn's reasoning)
    thinking: str | None = None
    signature: str | None = None
    data: str | None = None  # redacted_thinking's
    source: dict[str, Any] | None = None  # image: base64 (media_type, data) or url
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None
    tool_use_id: str | None = None
    content: str | list[Block] | None = None  # tool_result
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None  # a prompt-caching hint: no effect here


Block.model_rebuild()  # its tool_result content nests blocks


class Turn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant", "system"]  # system: an instruction where it stands
    content: str | list[Block]


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class Choice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(BaseModel):
    """`thinking`: `adaptive` (the model decides) is what every engine here does: a remote
    reasoning engine's reasoning comes back as thinking blocks, and the embedded models do
    not think. A budget (`enabled`) or `disabled` cannot be held to by an OpenAI-shaped
    engine, so they are refused."""
    model_config = ConfigDict(extra="forbid")

    type: Literal["adaptive"]
    display: str | None = None


class ContextEdit(BaseModel):
    """`context_management.edits`: only what leaves the context as it is (clearing
    thinking while keeping all of it); redline edits no context."""
    model_config = ConfigDict(extra="forbid")

    type: Literal["clear_thinking_20251015"]
    keep: Literal["all"]


class ContextManagement(BaseModel):
    model_config = ConfigDict(extra="forbid")

    edits: list[ContextEdit] = Field(default_factory=list)


class OutputConfig(BaseModel):
    """`output_config`: `effort` goes to a remote engine as chat's `reasoning_effort`
    (`xhigh` and `max` as `high`, its highest); `format` (a JSON schema) constrains the
    answer as chat's `response_format` does."""
    model_config = ConfigDict(extra="forbid")

    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: dict[str, Any] | None = None


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(..., min_length=1)
    max_tokens: int = Field(..., ge=1)
    messages: list[Turn] = Field(..., min_length=1)
    system: str | list[Block] | None = None
    stop_sequences: list[str] | None = Field(None, max_length=4)
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    stream: bool = False
    tools: list[Tool] | None = None
    tool_choice: Choice | None = None
    metadata: dict[str, Any] | None = None
    thinking: Thinking | None = None
    context_management: ContextManagement | None = None
    output_config: OutputConfig | None = None
    cache_control: dict[str, Any] | None = None  # a prompt-caching hint: no effect here
    # capacity: redline has one (no priority capacity to use or to refuse), so both values
    # get what they ask for; and one speed, its normal one
    service_tier: Literal["auto", "standard_only"] | None = None
    speed: Literal["standard"] | None = None
    # redline's extensions, as on chat completions
    tier: Literal["S", "A", "B", "auto"] | None = None
    cache: bool | None = None

    def to_generation(self, tier: str | None, tenant: str, no_cache: bool) -> GenerationRequest:
        from redline.api import schemas  # the same JSON Schema check as chat's tools

        messages: list[Message] = []
        if self.system is not None:
            text = self.system if isinstance(self.system, str) else "".join(
                b.text or "" for b in self.system)
            messages.append(Message("system", text))
        for turn in self.messages:
            messages += _turn(turn)
        tools = []
        for i, t in enumerate(self.tools or ()):
            schemas.check_schema(t.input_schema, f"tools[{i}].input_schema")
            tools.append(FunctionTool(t.name, t.description, t.input_schema))
        choice, parallel = None, None
        if self.tool_choice is not None:
            c = self.tool_choice
            mode = _MODES[c.type]
            if mode == "function" and c.name not in {t.name for t in tools}:
                raise InvalidRequest("tool_choice names a tool that is not in tools.",
                                     param="tool_choice.name")
            choice = ToolChoice(mode, c.name if mode == "function" else None)
            parallel = False if c.disable_parallel_tool_use else None
        user = (self.metadata or {}).get("user_id")
        out = self.output_config or OutputConfig()
        effort = {"xhigh": "high", "max": "high"}.get(out.effort or "", out.effort)
        fmt = None
        if out.format is not None:
            if out.format.get("type") != "json_schema" or not isinstance(out.format.get("schema"), dict):
                raise InvalidRequest("output_config.format must be {\"type\": \"json_schema\", "
                                     "\"schema\": {...}}.", param="output_config.format")
            fmt = schemas.json_schema_format({"name": "output", "schema": out.format["schema"],
                                              "strict": True}, "output_config.format")
        gen = GenerationRequest(
            model=self.model, messages=tuple(messages),
            sampling=SamplingParams(max_tokens=self.max_tokens,
                                    temperature=1.0 if self.temperature is None else self.temperature,
                                    top_p=1.0 if self.top_p is None else self.top_p,
                                    top_k=self.top_k or 0, stop=tuple(self.stop_sequences or ())),
            tier=parse_tier(tier),
            tenant=tenant, use_cache=self.cache is not False and not no_cache and not tools,
            user=str(user) if user is not None else None, tools=tuple(tools), tool_choice=choice,
            parallel_tool_calls=parallel, response_format=fmt, extra=_extra(effort, messages))
        return gen


def _extra(effort: str | None, messages: list[Message]) -> dict[str, Any]:
    """The request's fields beyond chat's own: the reasoning effort, and Anthropic's
    prefill. A final assistant turn of text is the start of the answer, which continues
    it: vLLM's chat-template fields, which the embedded engine honours and a remote vLLM
    or SGLang gets as sent."""
    out: dict[str, Any] = {"reasoning_effort": effort} if effort else {}
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant" and not last.tool_calls:
        if last.content != last.content.rstrip():  # Anthropic's own rule
            raise InvalidRequest("messages: final assistant content cannot end with trailing "
                                 "whitespace", param="messages")
        out.update(continue_final_message=True, add_generation_prompt=False)
    return out


def _image(block: Block) -> ContentPart:
    src = block.source or {}
    if src.get("type") == "base64":
        return ContentPart("image_url", image_url=f"data:{src.get('media_type')};base64,"
                                                  f"{src.get('data')}")
    if src.get("type") == "url":
        return ContentPart("image_url", image_url=str(src.get("url")))
    raise InvalidRequest("An image block needs a base64 or url source.", param="messages")


def _text(content: str | list[Block] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(b.text or "" for b in content if b.type == "text")


def _turn(turn: Turn) -> list[Message]:
    if isinstance(turn.content, str):
        return [Message(turn.role, turn.content)]
    if turn.role == "system":
        if any(b.type != "text" for b in turn.content):
            raise InvalidRequest("A system message holds text blocks only.", param="messages")
        return [Message("system", _text(turn.content))]
    out: list[Message] = []
    parts: list[ContentPart] = []
    calls: list[ToolCall] = []
    for b in turn.content:
        if b.type == "tool_result":  # each result: a tool message, before the turn's text
            if turn.role != "user" or not b.tool_use_id:
                raise InvalidRequest("tool_result blocks belong in user turns, with "
                                     "tool_use_id.", param="messages")
            out.append(Message("tool", _text(b.content), tool_call_id=b.tool_use_id))
        elif b.type == "tool_use":
            if turn.role != "assistant" or not b.id or not b.name:
                raise InvalidRequest("tool_use blocks belong in assistant turns, with id and "
                                     "name.", param="messages")
            calls.append(ToolCall(b.id, b.name, json.dumps(b.input or {})))
        elif b.type == "image":
            parts.append(_image(b))
        elif b.type in ("thinking", "redacted_thinking"):
            if turn.role != "assistant":
                raise InvalidRequest("thinking blocks belong in assistant turns.",
                                     param="messages")
        else:
            parts.append(ContentPart("text", text=b.text or ""))
    if parts or calls or not out:
        text = "".join(p.text or "" for p in parts)
        images = any(p.type == "image_url" for p in parts)
        out.append(Message(turn.role, text, tuple(parts) if images else None, tuple(calls),
                           null_content=not parts and bool(calls)))
    return out


def usage_json(u: Usage | None) -> dict[str, Any]:
    """Anthropic's usage: `input_tokens` are the prompt tokens not read from the cache (its
    total input is input_tokens + cache_read_input_tokens + cache_creation_input_tokens)."""
    cached = u.cached_tokens if u is not None else None
    out: dict[str, Any] = {"input_tokens": u.prompt_tokens - (cached or 0) if u else 0,
                           "output_tokens": u.completion_tokens if u else 0}
    if cached is not None:
        out["cache_read_input_tokens"] = cached
    return out


def _input(arguments: str) -> Any:
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"arguments": arguments}  # not JSON: kept whole, not dropped
    return value if isinstance(value, dict) else {"value": value}


def whole(msg_id: str, model: str, answer: ChoiceAnswer, usage: Usage | None) -> bytes:
    content: list[dict[str, Any]] = []
    if answer.reasoning:
        content.append({"type": "thinking", "thinking": "".join(answer.reasoning),
                        "signature": ""})
    if answer.text:
        content.append({"type": "text", "text": "".join(answer.text)})
    for call in answer.tool_calls():
        content.append({"type": "tool_use", "id": call.id, "name": call.name,
                        "input": _input(call.arguments)})
    return orjson.dumps({"id": msg_id, "type": "message", "role": "assistant", "model": model,
                         "content": content,
                         "stop_reason": STOP.get(answer.finish_reason or "stop", "end_turn"),
                         "stop_sequence": None, "usage": usage_json(usage)})


def event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


def error_body(status: int, message: str) -> dict[str, Any]:
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
            529: "overloaded_error", 503: "overloaded_error"}.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_headers(retry_after: float | None) -> dict[str, str]:
    """`Retry-After` for an error that has one (429, 503), in whole seconds and at least
    one, as the OpenAI routes write it (api/errors.py)."""
    return {} if retry_after is None else {"Retry-After": str(max(1, math.ceil(retry_after)))}


async def send_error(send: Send, err: RedlineError,
                     extra: Sequence[tuple[bytes, bytes]] = ()) -> None:
    """An error in Anthropic's shape from ASGI middleware (a 429 before the route runs)."""
    body = orjson.dumps(error_body(err.status, err.message))
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
               *extra, *((k.lower().encode(), v.encode())
                         for k, v in error_headers(err.retry_after).items())]
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Blocks:
    """The content-block events of one streamed answer: a block opens when its kind of
    content starts (thinking, text, or a tool call by its index) and closes when another
    starts, so that each block's deltas are contiguous, as Anthropic's are."""

    def __init__(self) -> None:
        self.index = -1
        self.open: tuple[str, int] | None = None
        self.stop: FinishReason | None = None

    def _start(self, key: tuple[str, int], block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.open = key
        out.append(event("content_block_start", {"index": self.index, "content_block": block}))
        return out

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", {"index": self.index})]

    def add(self, reasoning: str, text: str, calls: Any) -> list[bytes]:
        out: list[bytes] = []
        if reasoning:
            if self.open != ("thinking", 0):
                out += self._start(("thinking", 0), {"type": "thinking", "thinking": "",
                                                     "signature": ""})
            out.append(event("content_block_delta", {"index": self.index, "delta": {
                "type": "thinking_delta", "thinking": reasoning}}))
        if text:
            if self.open != ("text", 0):
                out += self._start(("text", 0), {"type": "text", "text": ""})
            out.append(event("content_block_delta", {"index": self.index, "delta": {
                "type": "text_delta", "text": text}}))
        for d in calls:
            if self.open != ("tool", d.index):
                out += self._start(("tool", d.index), {"type": "tool_use", "id": d.id or "",
                                                       "name": d.name or "", "input": {}})
            if d.arguments:
                out.append(event("content_block_delta", {"index": self.index, "delta": {
                    "type": "input_json_delta", "partial_json": d.arguments}}))
        return out
