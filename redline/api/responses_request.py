"""POST /v1/responses' body onto redline's typed request: the input items (messages
with text and image parts, `function_call`, `function_call_output`) after the chain of a
`previous_response_id` become structured messages, function tools, tool_choice and
`text.format` the same typed fields as chat completions', so that every backend is asked
the same way. Fields redline does not serve are refused (400 with param), never dropped."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from redline.api import schemas
from redline.errors import InvalidRequest
from redline.routing.names import parse_tier
from redline.types import (
    NO_EXTRA,
    ContentPart,
    Extra,
    FunctionTool,
    GenerationRequest,
    Message,
    ResponseFormat,
    SamplingParams,
    ToolCall,
    ToolChoice,
    new_id,
)


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: dict[str, Any] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # chat's `verbosity` (_extra)


class ReasoningConfig(BaseModel):
    """`reasoning`: the effort goes to a remote engine as chat's `reasoning_effort` (vLLM
    and SGLang take it for their reasoning models); the embedded models do not reason."""
    model_config = ConfigDict(extra="forbid")

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # the old name


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(..., min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    conversation: Any = None  # a /v1/conversations id, or {"id": ...} (conversation_of)
    store: bool = True
    background: bool = False
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    metadata: dict[str, str] | None = Field(None, max_length=16)
    user: str | None = None
    truncation: Literal["disabled", "auto"] | None = None
    include: list[str] | None = None
    reasoning: ReasoningConfig | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    prompt_cache_key: str | None = Field(None, min_length=1, max_length=256)  # a session
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None  # _extra
    # OpenAI's tiers (a remote engine gets any of them, the embedded one serves auto/default)
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast",
                          "ultrafast"] | None = None  # _extra
    # built-in tools' calls: redline runs no built-in tool, so any limit holds (echoed)
    max_tool_calls: int | None = Field(None, ge=1)
    stream_options: schemas.NoObfuscation | None = None
    safety_identifier: str | None = Field(None, min_length=1, max_length=256)  # the end user
    # about the client, for the provider's own records (Codex CLI sends its turn's ids on
    # every call): taken, and not used (nothing in it bears on the answer)
    client_metadata: dict[str, str] | None = None
    # redline's extensions, as on chat completions
    tier: Literal["S", "A", "B", "auto"] | None = None
    cache: bool | None = None
    notify: dict[str, str] | None = None  # a background response's webhook / e-mail


# `include` values: the logprobs of output text (served), and those that add to items of
# tools redline does not serve or to input images kept as sent (nothing to add here), or
# encrypted reasoning for a stateless client to send back: redline never sends a past
# turn's reasoning to an engine (reasoning items given as input are kept, not replayed),
# so there is nothing to carry, and a reasoning item's `encrypted_content` is null
LOGPROBS = "message.output_text.logprobs"
ENCRYPTED = "reasoning.encrypted_content"
INCLUDABLE = frozenset({
    LOGPROBS, ENCRYPTED, "message.input_image.image_url", "file_search_call.results",
    "web_search_call.results", "web_search_call.action.sources",
    "code_interpreter_call.outputs", "computer_call_output.output.image_url"})


def wants_logprobs(body: ResponsesRequest) -> bool:
    """The output text's logprobs: asked for by `include`, or by `top_logprobs`."""
    return LOGPROBS in (body.include or ()) or body.top_logprobs is not None


def parse(raw: bytes) -> ResponsesRequest:
    try:
        body = ResponsesRequest.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors()
        where = ".".join(str(p) for p in errors[0]["loc"]) if errors else ""
        message = (f"Unknown parameter: '{where}'." if errors and errors[0]["type"] == "extra_forbidden"
                   else f"{where}: {errors[0]['msg'] if errors else 'invalid body'}")
        raise InvalidRequest(message, param=where or None) from exc
    if body.background and not body.store:  # as OpenAI: it is polled, so it is kept
        raise InvalidRequest("Background responses need store=true.", param="background")
    if body.notify is not None:
        if not body.background:
            raise InvalidRequest("notify is for background responses (background: true).",
                                 param="notify")
        unknown = sorted(set(body.notify) - {"webhook", "email"})
        if unknown:
            raise InvalidRequest(f"Unknown parameter: 'notify.{unknown[0]}'.",
                                 param=f"notify.{unknown[0]}")
    check_include(body.include or ())
    if body.reasoning is not None:
        for name in ("summary", "generate_summary"):
            if getattr(body.reasoning, name) in ("concise", "detailed"):
                raise InvalidRequest(
                    "The engines behind redline give a reasoning model's own text (the "
                    "reasoning item's content), never a summary of it: use 'auto' or none.",
                    param=f"reasoning.{name}")
    if isinstance(body.input, list) and not body.input:
        raise InvalidRequest("input is empty.", param="input")
    if body.previous_response_id == "":
        raise InvalidRequest("previous_response_id is empty.", param="previous_response_id")
    if body.conversation is not None:
        conversation_of(body)  # its shape
        if body.previous_response_id is not None:
            raise InvalidRequest("previous_response_id and conversation cannot be used "
                                 "together.", param="conversation")
    return body


def check_include(values: Iterable[str]) -> None:
    """A 400 naming the first `include` value that is not OpenAI's (INCLUDABLE)."""
    for i, what in enumerate(values):
        if what not in INCLUDABLE:
            raise InvalidRequest(f"Invalid value for 'include[{i}]': {what!r}.",
                                 param=f"include[{i}]")


def conversation_of(body: ResponsesRequest) -> str | None:
    """The id of the conversation the request continues, if any."""
    raw = body.conversation
    if raw is None:
        return None
    if isinstance(raw, dict):
        _known(raw, {"id"}, "conversation")
        raw = raw.get("id")
    if not isinstance(raw, str) or not raw:
        raise InvalidRequest("conversation must be a conversation's id, or {\"id\": ...}.",
                             param="conversation")
    return raw


# ---- input items -----------------------------------------------------------------

_PARTS = {"input_text", "input_image", "output_text", "refusal"}


def normalize(raw: str | list[dict[str, Any]], field: str = "input") -> list[dict[str, Any]]:
    """The input as stored items: each with its id, type and status, content as parts.
    `field`: the body's field they came in, for errors (a conversation's `items`)."""
    if isinstance(raw, str):
        return [_message("user", [{"type": "input_text", "text": raw}], None)]
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise InvalidRequest(f"'{field}[{i}]' must be an item (an object).",
                                 param=f"{field}[{i}]")
        kind = item.get("type", "message")
        where = f"{field}[{i}]"
        if item.get("id") is not None and (not isinstance(item["id"], str) or not item["id"]):
            raise InvalidRequest(f"'{where}.id' must be a string.", param=f"{where}.id")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise InvalidRequest(f"Invalid value for '{where}.role': {role!r}.",
                                     param=f"{where}.role")
            _known(item, {"type", "role", "content", "id", "status"}, where)
            out.append(_message(role, _parts(item.get("content"), role, where), item.get("id")))
        elif kind == "function_call":
            _known(item, {"type", "call_id", "name", "arguments", "id", "status", "namespace"},
                   where)
            for key in ("call_id", "name", "arguments"):
                if not isinstance(item.get(key), str):
                    raise InvalidRequest(f"'{where}.{key}' must be a string.",
                                         param=f"{where}.{key}")
            space = item.get("namespace")
            if space is not None and (not isinstance(space, str) or not space):
                raise InvalidRequest(f"'{where}.namespace' must be a string.",
                                     param=f"{where}.namespace")
            out.append({"id": item.get("id") or new_id("fc").replace("-", "_"),
                        "type": "function_call", "status": "completed",
                        "call_id": item["call_id"], "name": item["name"],
                        "arguments": item["arguments"], **({"namespace": space} if space else {})})
        elif kind == "function_call_output":
            _known(item, {"type", "call_id", "output", "id", "status"}, where)
            if not isinstance(item.get("call_id"), str) or not isinstance(item.get("output"), str):
                raise InvalidRequest(f"'{where}' needs call_id and output (strings).",
                                     param=f"{where}.output")
            out.append({"id": item.get("id") or new_id("fco").replace("-", "_"),
                        "type": "function_call_output", "status": "completed",
                        "call_id": item["call_id"], "output": item["output"]})
        elif kind == "reasoning":  # a reasoning model's output, given back: kept, not replayed
            _known(item, {"type", "id", "summary", "content", "encrypted_content", "status"},
                   where)
            out.append({"id": item.get("id") or new_id("rs").replace("-", "_"),
                        "type": "reasoning",
                        "summary": _texts(item.get("summary"), "summary_text", f"{where}.summary"),
                        **({"content": _texts(item["content"], "reasoning_text",
                                              f"{where}.content")}
                           if item.get("content") is not None else {}),
                        **({"encrypted_content": item["encrypted_content"]}
                           if isinstance(item.get("encrypted_content"), str) else {})})
        else:
            raise InvalidRequest(f"Invalid value for '{where}.type': {kind!r}; served are "
                                 "message, function_call, function_call_output and reasoning.",
                                 param=f"{where}.type")
    return out


def _texts(raw: Any, kind: str, where: str) -> list[dict[str, Any]]:
    """A reasoning item's summary or content: a list of `{"type": kind, "text"}` parts."""
    if not isinstance(raw, list):
        raise InvalidRequest(f"'{where}' must be a list of {kind} parts.", param=where)
    for j, part in enumerate(raw):
        if not isinstance(part, dict) or part.get("type") != kind \
                or not isinstance(part.get("text"), str):
            raise InvalidRequest(f"'{where}[{j}]' must be {{\"type\": \"{kind}\", \"text\": ...}}.",
                                 param=f"{where}[{j}]")
        _known(part, {"type", "text"}, f"{where}[{j}]")
    return [dict(p) for p in raw]


def _known(item: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(item) - known)
    if unknown:
        raise InvalidRequest(f"Unknown parameter: '{where}.{unknown[0]}'.",
                             param=f"{where}.{unknown[0]}")


def _message(role: str, parts: list[dict[str, Any]], item_id: Any) -> dict[str, Any]:
    return {"id": item_id if isinstance(item_id, str) else new_id("msg").replace("-", "_"),
            "type": "message", "role": role, "status": "completed", "content": parts}


def _parts(content: Any, role: str, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        if role == "assistant":
            return [{"type": "output_text", "text": content, "annotations": []}]
        return [{"type": "input_text", "text": content}]
    if not isinstance(content, list):
        raise InvalidRequest(f"'{where}.content' must be a string or a list of parts.",
                             param=f"{where}.content")
    out = []
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        part_kind = part.get("type") if isinstance(part, dict) else None
        if part_kind not in _PARTS:
            raise InvalidRequest(f"Invalid value for '{at}.type': {part_kind!r}.",
                                 param=f"{at}.type")
        if part_kind == "input_image":
            _known(part, {"type", "image_url", "detail"}, at)
            if not isinstance(part.get("image_url"), str):
                raise InvalidRequest(f"'{at}.image_url' must be a URL (or a data: URL).",
                                     param=f"{at}.image_url")
        elif part_kind == "refusal":
            _known(part, {"type", "refusal"}, at)
        else:
            _known(part, {"type", "text", "annotations", "logprobs"}, at)
            if not isinstance(part.get("text"), str):
                raise InvalidRequest(f"'{at}.text' must be a string.", param=f"{at}.text")
        out.append(dict(part))
    return out


def messages(items: list[dict[str, Any]]) -> list[Message]:
    """Stored items as chat messages: a function_call joins the assistant turn before it
    (or opens one), a function_call_output is a tool message."""
    out: list[Message] = []
    for item in items:
        kind = item["type"]
        if kind == "function_call":
            call = ToolCall(item["call_id"], flat_name(item.get("namespace"), item["name"]),
                            item["arguments"])
            if out and out[-1].role == "assistant":
                out[-1] = dataclasses.replace(out[-1], tool_calls=(*out[-1].tool_calls, call))
            else:
                out.append(Message("assistant", "", tool_calls=(call,), null_content=True))
        elif kind == "function_call_output":
            out.append(Message("tool", item["output"], tool_call_id=item["call_id"]))
        elif kind == "message":
            parts = []
            for p in item["content"]:
                if p["type"] == "input_image":
                    parts.append(ContentPart("image_url", image_url=p["image_url"],
                                             detail=p.get("detail")))
                else:
                    parts.append(ContentPart("text", text=p.get("text") or p.get("refusal") or ""))
            text = "".join(p.text or "" for p in parts)
            images = any(p.type == "image_url" for p in parts)
            role = "system" if item["role"] == "developer" else item["role"]
            out.append(Message(role, text, tuple(parts) if images else None))
        # reasoning items of earlier outputs: not sent back to the model (as OpenAI's
        # chat-shaped engines do not take them)
    return out


# ---- the typed request -------------------------------------------------------------

def generation(body: ResponsesRequest, items: list[dict[str, Any]], tier: str | None,
               tenant: str, no_cache: bool) -> GenerationRequest:
    history = ([Message("system", body.instructions)] if body.instructions else []) + messages(items)
    tools = _tools(body.tools)
    logprobs = wants_logprobs(body)
    return GenerationRequest(
        model=body.model, messages=tuple(history),
        sampling=SamplingParams(
            max_tokens=body.max_output_tokens or schemas.DEFAULT_MAX_TOKENS,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            logprobs=logprobs, top_logprobs=body.top_logprobs if logprobs else None),
        tier=parse_tier(tier),
        tenant=tenant,
        use_cache=body.cache is not False and not no_cache and not tools and not logprobs,
        user=body.user if body.user is not None else body.safety_identifier,
        session=body.prompt_cache_key,  # one replica for its requests (X-Session-ID wins)
        tools=tools, tool_choice=_tool_choice(body.tool_choice, tools),
        parallel_tool_calls=body.parallel_tool_calls,
        response_format=_format(body.text.format if body.text else None),
        max_tokens_field="max_completion_tokens", extra=_extra(body))


def _extra(body: ResponsesRequest) -> Extra:
    """What a remote engine gets beyond the typed request, as chat completions name it:
    `reasoning_effort`, `verbosity`, `prompt_cache_retention`, `service_tier` (the
    embedded engine takes the retention, and the others at their defaults, and refuses
    any other value, as it refuses any field it does not serve)."""
    extra = {"reasoning_effort": body.reasoning.effort if body.reasoning else None,
             "verbosity": body.text.verbosity if body.text else None,
             "prompt_cache_retention": body.prompt_cache_retention,
             "service_tier": body.service_tier}
    named = {k: v for k, v in extra.items() if v is not None}
    return named or NO_EXTRA


def _tools(raw: list[dict[str, Any]] | None) -> tuple[FunctionTool, ...]:
    out = []
    for i, tool in enumerate(raw or ()):
        if tool.get("type") == "namespace":  # function tools grouped under a name
            _known(tool, {"type", "name", "description", "tools"}, f"tools[{i}]")
            space, about, inner = tool.get("name"), tool.get("description"), tool.get("tools")
            if not isinstance(space, str) or not space or not isinstance(inner, list):
                raise InvalidRequest("A namespace tool needs a name and a list of tools.",
                                     param=f"tools[{i}]")
            for j, member in enumerate(inner):
                fn = _function(member, f"tools[{i}].tools[{j}]")
                described = " ".join(d for d in (about, fn.description)
                                     if isinstance(d, str) and d)
                out.append(dataclasses.replace(fn, name=flat_name(space, fn.name),
                                               description=described or None))
            continue
        out.append(_function(tool, f"tools[{i}]"))
    return tuple(out)


def _function(tool: Any, where: str) -> FunctionTool:
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind != "function":
        raise InvalidRequest(f"Invalid value for '{where}.type': {kind!r}; only 'function' "
                             "tools (and namespaces of them) are served.", param=f"{where}.type")
    _known(tool, {"type", "name", "description", "parameters", "strict"}, where)
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest("A function tool needs a name.", param=f"{where}.name")
    params = tool.get("parameters")
    if params is not None:
        schemas.check_schema(params, f"{where}.parameters")
    description, strict = tool.get("description"), tool.get("strict")
    return FunctionTool(name, description if isinstance(description, str) else None,
                        params, strict if isinstance(strict, bool) else None)


# a namespace's function as the engine sees it: one name, valid wherever OpenAI's
# function-name rule (letters, digits, _ and -) is enforced; a call back to its two parts
NAMESPACE_SEP = "__"


def flat_name(namespace: str | None, name: str) -> str:
    return name if not namespace else f"{namespace}{NAMESPACE_SEP}{name}"


def namespaced(body: ResponsesRequest) -> dict[str, tuple[str, str]]:
    """The request's namespaced functions: the engine's name -> (namespace, name)."""
    out = {}
    for tool in body.tools or ():
        if tool.get("type") == "namespace":
            for member in tool.get("tools") or ():
                out[flat_name(tool["name"], member["name"])] = (tool["name"], member["name"])
    return out


def _tool_choice(raw: str | dict[str, Any] | None,
                 tools: tuple[FunctionTool, ...]) -> ToolChoice | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return schemas.tool_choice_mode(raw, tools)
    name, space = raw.get("name"), raw.get("namespace")
    if raw.get("type") != "function" or not isinstance(name, str) \
            or not isinstance(space, str | None):
        raise InvalidRequest("tool_choice must be none, auto, required or "
                             '{"type": "function", "name": ..., "namespace"?: ...}.',
                             param="tool_choice")
    return schemas.named_tool(flat_name(space, name), tools, "tool_choice.name")


def _format(raw: dict[str, Any] | None) -> ResponseFormat | None:
    if raw is None:
        return None
    kind = raw.get("type")
    if kind in ("text", "json_object"):
        _known(raw, {"type"}, "text.format")
        return ResponseFormat(kind)
    if kind != "json_schema":
        raise InvalidRequest(f"Invalid value for 'text.format.type': {kind!r}.",
                             param="text.format.type")
    _known(raw, {"type", "name", "schema", "strict", "description"}, "text.format")
    if not isinstance(raw.get("name"), str) or not isinstance(raw.get("schema"), dict):
        raise InvalidRequest("text.format json_schema needs name and schema.",
                             param="text.format.schema")
    return schemas.json_schema_format(raw, "text.format.schema")
