"""The typed request as an OpenAI-compatible engine's JSON body, and that engine's
streamed choices as typed chunks: redline's side of the wire to a remote engine.

Faithful both ways: every field the client sent goes upstream (modelled ones typed,
the rest from `extra` as they came), and every field of a delta comes back (unknown
ones in the chunk's `extra`); tool-call fragments keep the upstream's split."""

from __future__ import annotations

from typing import Any

from redline.types import (
    NO_EXTRA,
    ContentPart,
    Extra,
    FinishReason,
    FunctionTool,
    GenerationRequest,
    Message,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
)

FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "eos": "stop",
                                   "tool_calls": "tool_calls", "content_filter": "content_filter",
                                   "function_call": "function_call", "abort": "cancelled",
                                   "error": "error"}
# the delta fields a chunk models; any other (non-null) one is passed back in `extra`
_DELTA_KNOWN = frozenset(("role", "content", "reasoning_content", "tool_calls"))


def _part(p: ContentPart) -> dict[str, Any]:
    out: dict[str, Any] = {"type": p.type}
    if p.text is not None:
        out["text"] = p.text
    if p.image_url is not None:
        image: dict[str, Any] = {"url": p.image_url}
        if p.detail is not None:
            image["detail"] = p.detail
        image.update(p.extra.get("image_url") or {})
        out["image_url"] = image
    out.update((k, v) for k, v in p.extra.items() if k != "image_url" or p.image_url is None)
    return out


def message_json(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role}
    if m.parts is not None:
        out["content"] = [_part(p) for p in m.parts]
    else:
        out["content"] = None if m.null_content else m.content
    if m.name is not None:
        out["name"] = m.name
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": c.type,
                              "function": {"name": c.name, "arguments": c.arguments}}
                             for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    out.update(m.extra)
    return out


def _tool(t: FunctionTool) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": t.name}
    if t.description is not None:
        fn["description"] = t.description
    if t.parameters is not None:
        fn["parameters"] = t.parameters
    if t.strict is not None:
        fn["strict"] = t.strict
    fn.update((k, v) for k, v in t.extra.items() if not k.startswith("tool."))
    out: dict[str, Any] = {"type": "function", "function": fn}
    out.update((k[5:], v) for k, v in t.extra.items() if k.startswith("tool."))
    return out


def request_body(request: GenerationRequest, model: str) -> tuple[str, dict[str, Any]]:
    """The path and JSON body for `request`, streamed with usage (redline reads streams)."""
    s = request.sampling
    body: dict[str, Any] = dict(request.extra)  # first: a modelled field always wins
    body.update({"model": model, "stream": True, "stream_options": {"include_usage": True},
                 request.max_tokens_field: s.max_tokens, "temperature": s.temperature,
                 "top_p": s.top_p})
    optional: dict[str, Any] = {
        "stop": list(s.stop) or None, "seed": s.seed,
        "top_k": s.top_k or None,  # vLLM, SGLang, llama.cpp accept it; OpenAI does not need it
        "ignore_eos": s.ignore_eos or None, "n": s.n if s.n != 1 else None,
        "presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty,
        "logit_bias": dict(s.logit_bias) or None, "user": request.user,
        # vLLM's fields, as the client sent them
        "min_p": s.min_p, "repetition_penalty": s.repetition_penalty, "min_tokens": s.min_tokens,
        "stop_token_ids": None if s.stop_token_ids is None else list(s.stop_token_ids),
        "include_stop_str_in_output": s.include_stop_str_in_output}
    body.update((k, v) for k, v in optional.items() if v is not None)
    if request.messages is None:
        if request.prompt_ids:  # token ids, as the client sent them
            ids = [list(p) for p in request.prompt_ids]
            body["prompt"] = ids if len(ids) > 1 else ids[0]
        else:
            body["prompt"] = list(request.prompts) if request.prompts else request.prompt or ""
        if s.logprobs:
            body["logprobs"] = s.top_logprobs or 0
        if request.echo:
            body["echo"] = True
        if request.suffix is not None:
            body["suffix"] = request.suffix
        return "/completions", body
    body["messages"] = [message_json(m) for m in request.messages]
    if s.logprobs:
        body["logprobs"] = True
        if s.top_logprobs is not None:
            body["top_logprobs"] = s.top_logprobs
    if request.tools:
        body["tools"] = [_tool(t) for t in request.tools]
    if request.tool_choice is not None:
        c = request.tool_choice
        body["tool_choice"] = c.mode if c.mode != "function" else {
            "type": "function", "function": {"name": c.name}}
    if request.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = request.parallel_tool_calls
    if request.prediction is not None:
        body["prediction"] = {"type": "content", "content": request.prediction}
    if request.response_format is not None:
        f = request.response_format
        fmt: dict[str, Any] = {"type": f.type}
        if f.type == "json_schema":
            spec: dict[str, Any] = {"name": f.name}
            for key, value in (("description", f.description), ("schema", f.schema),
                               ("strict", f.strict)):
                if value is not None:
                    spec[key] = value
            fmt["json_schema"] = spec
        body["response_format"] = fmt
    return "/chat/completions", body


def _bytes(raw: Any) -> tuple[int, ...] | None:
    return None if raw is None else tuple(int(b) for b in raw)


def logprobs(raw: Any) -> tuple[TokenLogprob, ...] | None:
    """A choice's `logprobs`, chat's shape (`content`) or text completions' (`tokens`)."""
    if not isinstance(raw, dict):
        return None
    if "content" in raw:
        return tuple(TokenLogprob(
            str(t["token"]), float(t["logprob"]), _bytes(t.get("bytes")),
            tuple(TopLogprob(str(o["token"]), float(o["logprob"]), _bytes(o.get("bytes")))
                  for o in t.get("top_logprobs") or ()))
            for t in raw["content"] or ())
    tokens = raw.get("tokens") or []
    values = raw.get("token_logprobs") or []
    tops = raw.get("top_logprobs") or [None] * len(tokens)
    offsets = raw.get("text_offset") or [None] * len(tokens)
    return tuple(TokenLogprob(str(t), None if v is None else float(v), None,
                              tuple(TopLogprob(str(k), float(x)) for k, x in (top or {}).items()),
                              off)
                 for t, v, top, off in zip(tokens, values, tops, offsets, strict=False))


def tool_call_deltas(raw: Any) -> tuple[ToolCallDelta, ...]:
    out = []
    for d in raw or ():
        fn = d.get("function") or {}
        out.append(ToolCallDelta(int(d.get("index", 0)), d.get("id"), d.get("type"),
                                 fn.get("name"), fn.get("arguments")))
    return tuple(out)


def delta_extra(delta: dict[str, Any]) -> Extra:
    return {k: v for k, v in delta.items() if k not in _DELTA_KNOWN and v is not None} \
        or NO_EXTRA


def error_message(payload: Any) -> str | None:
    """What an engine's error body says (OpenAI's `error`, an object or a string, or a
    FastAPI `detail`), or None where it says nothing of the kind."""
    if isinstance(payload, dict):
        err = payload.get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err)
        if err:
            return str(err)
        if "detail" in payload:
            return str(payload["detail"])
    return None


def usage(u: dict[str, Any]) -> Usage:
    prompt = dict(u.get("prompt_tokens_details") or {})
    cached = prompt.pop("cached_tokens", None)
    completion = u.get("completion_tokens_details")
    return Usage(int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0),
                 None if cached is None else int(cached), prompt or NO_EXTRA,
                 dict(completion) if isinstance(completion, dict) else None)
