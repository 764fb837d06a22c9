"""Typed answers to OpenAI's JSON: chat and text completion chunks (streamed) and
whole completions, encoded with orjson from the typed values of redline/types.py.

One `ChunkEncoder` per response: its envelope (id, object, created, model) is fixed;
each event is one `orjson.dumps` of a small dict (a microsecond or two a token), in
OpenAI's key order, with redline's own `redline` key (progress, timings) last."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

import orjson

from redline.types import ChoiceAnswer, Chunk, TokenLogprob, ToolCall, ToolCallDelta, Usage

Kind = Literal["chat", "text"]


def usage_json(u: Usage | None) -> dict[str, Any]:
    if u is None:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    out: dict[str, Any] = {"prompt_tokens": u.prompt_tokens,
                           "completion_tokens": u.completion_tokens,
                           "total_tokens": u.total_tokens}
    if u.cached_tokens is not None or u.prompt_details:
        details = dict(u.prompt_details)
        if u.cached_tokens is not None:
            details["cached_tokens"] = u.cached_tokens
        out["prompt_tokens_details"] = details
    if u.completion_details is not None:
        out["completion_tokens_details"] = dict(u.completion_details)
    return out


def token_logprob(t: TokenLogprob, fill_bytes: bool = False) -> dict[str, Any]:
    """A token's logprob and its alternatives as chat completions and Responses write
    them; `fill_bytes`: its UTF-8 bytes where the backend gave none (Responses always
    has them, chat says null)."""
    return {"token": t.token, "logprob": t.logprob, "bytes": _bytes(t.token, t.bytes, fill_bytes),
            "top_logprobs": [{"token": o.token, "logprob": o.logprob,
                              "bytes": _bytes(o.token, o.bytes, fill_bytes)} for o in t.top]}


def _bytes(token: str, given: tuple[int, ...] | None, fill: bool) -> list[int] | None:
    if given is not None:
        return list(given)
    return list(token.encode()) if fill else None


def _chat_logprobs(lps: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {"content": [token_logprob(t) for t in lps], "refusal": None}


def _text_logprobs(lps: Sequence[TokenLogprob], at: int) -> dict[str, Any]:
    """Completions' shape; a token without its own offset (the embedded engine's) starts
    where the previous one ended, from `at`."""
    offsets = []
    for t in lps:
        at = t.offset if t.offset is not None else at
        offsets.append(at)
        at += len(t.token)
    return {"tokens": [t.token for t in lps], "token_logprobs": [t.logprob for t in lps],
            "top_logprobs": [None if t.logprob is None else {o.token: o.logprob for o in t.top}
                             for t in lps],
            "text_offset": offsets}


def _call_delta(d: ToolCallDelta) -> dict[str, Any]:
    out: dict[str, Any] = {"index": d.index}
    if d.id is not None:
        out["id"] = d.id
    if d.type is not None:
        out["type"] = d.type
    fn: dict[str, Any] = {}
    if d.name is not None:
        fn["name"] = d.name
    if d.arguments is not None:
        fn["arguments"] = d.arguments
    if fn or d.id is not None:
        out["function"] = fn
    return out


def _function_delta(deltas: Sequence[ToolCallDelta]) -> dict[str, Any]:
    """The legacy `function_call` delta of a chunk's call fragments (its first call's:
    a legacy answer holds one): the name where it starts, and its arguments' piece."""
    first = [d for d in deltas if d.index == 0]
    out: dict[str, Any] = {}
    name = next((d.name for d in first if d.name is not None), None)
    if name is not None:
        out["name"] = name
    out["arguments"] = "".join(d.arguments or "" for d in first)
    return out


def _call(c: ToolCall) -> dict[str, Any]:
    return {"id": c.id, "type": c.type, "function": {"name": c.name, "arguments": c.arguments}}


class ChunkEncoder:
    """The JSON of one response's events and of its whole answer."""

    __slots__ = ("kind", "id", "model", "created", "include_usage", "legacy", "_object",
                 "_offsets")

    def __init__(self, kind: Kind, gen_id: str, model: str, include_usage: bool = False,
                 legacy: bool = False) -> None:
        """`legacy`: the client asked with OpenAI's deprecated `functions`, so its call is
        a `function_call` (one, without an id) and its finish reason "function_call"."""
        self.kind = kind
        self.legacy = legacy
        self.id = gen_id.replace("req-", "chatcmpl-" if kind == "chat" else "cmpl-")
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage
        self._object = "chat.completion.chunk" if kind == "chat" else "text_completion"
        self._offsets: dict[int, int] = {}  # choice -> text length so far (text logprobs)

    def _event(self, choices: list[dict[str, Any]], redline: dict[str, Any] | None) -> str:
        out: dict[str, Any] = {"id": self.id, "object": self._object, "created": self.created,
                               "model": self.model, "choices": choices}
        if self.include_usage:
            out["usage"] = None
        if redline:
            out["redline"] = redline
        return orjson.dumps(out).decode()

    def _logprobs(self, lps: Sequence[TokenLogprob] | None, index: int = 0,
                  whole: bool = False) -> dict[str, Any] | None:
        if lps is None:
            return None
        if self.kind == "chat":
            return _chat_logprobs(lps)
        out = _text_logprobs(lps, 0 if whole else self._offsets.get(index, 0))
        if not whole and lps:
            self._offsets[index] = out["text_offset"][-1] + len(lps[-1].token)
        return out

    def _reason(self, reason: str) -> str:
        """A finish reason as the client's API names it (legacy: "function_call")."""
        return "function_call" if self.legacy and reason == "tool_calls" else reason

    def role(self, index: int, progress: dict[str, Any] | None) -> str:
        """Chat's first event of a choice: the assistant role."""
        return self._event([{"index": index, "delta": {"role": "assistant", "content": ""},
                             "logprobs": None, "finish_reason": None}],
                           None if progress is None else {"progress": progress})

    def delta(self, chunk: Chunk, progress: dict[str, Any] | None) -> str:
        """A chunk's delta (text, reasoning, tool-call fragments, logprobs), without its
        finish (that is `finish`'s event)."""
        choice: dict[str, Any] = {"index": chunk.index}
        if self.kind == "chat":
            delta: dict[str, Any] = {}
            if chunk.text:
                delta["content"] = chunk.text
            if chunk.reasoning:
                delta["reasoning_content"] = chunk.reasoning
            if chunk.tool_calls and self.legacy:
                delta["function_call"] = _function_delta(chunk.tool_calls)
            elif chunk.tool_calls:
                delta["tool_calls"] = [_call_delta(d) for d in chunk.tool_calls]
            delta.update(chunk.extra)
            choice["delta"] = delta
        else:
            choice["text"] = chunk.text
        choice["logprobs"] = self._logprobs(chunk.logprobs, chunk.index)
        choice["finish_reason"] = None
        return self._event([choice], None if progress is None else {"progress": progress})

    def text(self, text: str, progress: dict[str, Any] | None) -> str:
        """The per-token event of a plain text answer (choice 0)."""
        if self.kind == "chat":
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice["logprobs"] = None
        choice["finish_reason"] = None
        return self._event([choice], None if progress is None else {"progress": progress})

    def finish(self, index: int, reason: str, redline: dict[str, Any] | None) -> str:
        choice: dict[str, Any] = {"index": index}
        if self.kind == "chat":
            choice["delta"] = {}
        else:
            choice["text"] = ""
        choice["logprobs"] = None
        choice["finish_reason"] = self._reason(reason)
        return self._event([choice], redline)

    def usage(self, usage: Usage | None) -> str:
        out: dict[str, Any] = {"id": self.id, "object": self._object, "created": self.created,
                               "model": self.model, "choices": [], "usage": usage_json(usage)}
        return orjson.dumps(out).decode()

    def full(self, choices: Sequence[ChoiceAnswer], usage: Usage | None,
             default_finish: str = "stop") -> bytes:
        """A whole (non-streamed) completion."""
        out: list[dict[str, Any]] = []
        for c in choices:
            text = "".join(c.text)
            calls = c.tool_calls()
            choice: dict[str, Any] = {"index": c.index}
            if self.kind == "chat":
                message: dict[str, Any] = {"role": "assistant",
                                           "content": text if text or not calls else None}
                if c.reasoning:
                    message["reasoning_content"] = "".join(c.reasoning)
                if calls and self.legacy:
                    message["function_call"] = {"name": calls[0].name,
                                                "arguments": calls[0].arguments}
                elif calls:
                    message["tool_calls"] = [_call(t) for t in calls]
                message.update(c.extra)
                choice["message"] = message
            else:
                choice["text"] = text
            choice["logprobs"] = self._logprobs(c.logprobs, c.index, whole=True)
            choice["finish_reason"] = self._reason(c.finish_reason or default_finish)
            out.append(choice)
        return orjson.dumps({"id": self.id,
                             "object": "chat.completion" if self.kind == "chat" else "text_completion",
                             "created": self.created, "model": self.model, "choices": out,
                             "usage": usage_json(usage)})
