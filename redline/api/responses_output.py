"""A Responses API answer from redline's chunks: output items (`message` with
`output_text` parts, `function_call`, `reasoning`) assembled as the chunks come, each
step also written as OpenAI's semantic stream events (`response.output_item.added`,
`response.content_part.added`, `response.output_text.delta`, ...`.done`), numbered by
`sequence_number` from 0, with redline's progress in a `redline` key as chat chunks
carry it. The same assembly serves the whole (non-stream) answer, so both agree."""

from __future__ import annotations

import time
from typing import Any

import orjson

from redline.api.chunks import token_logprob
from redline.api.responses_request import ResponsesRequest, conversation_of
from redline.types import Chunk, FinishReason, ToolCallDelta, Usage, new_id

DONE = b"data: [DONE]\n\n"  # ends the journal's copy (streams/journal.py); clients stop at it


def _id(prefix: str) -> str:
    return new_id(prefix).replace("-", "_")


def usage_json(u: Usage | None) -> dict[str, Any]:
    inp, out = (u.prompt_tokens, u.completion_tokens) if u else (0, 0)
    return {"input_tokens": inp,
            "input_tokens_details": {"cached_tokens": (u.cached_tokens or 0) if u else 0},
            "output_tokens": out, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": inp + out}


def response_json(body: ResponsesRequest, response_id: str, created_at: int, model: str,
                  status: str, output: list[dict[str, Any]], usage: Usage | None = None,
                  error: dict[str, Any] | None = None,
                  incomplete: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Response object; the request's settings echoed as OpenAI echoes them."""
    fmt = (body.text.format if body.text and body.text.format else None) or {"type": "text"}
    echoed: dict[str, Any] = {"format": fmt}
    if body.text is not None and body.text.verbosity is not None:
        echoed["verbosity"] = body.text.verbosity
    text = "".join(p["text"] for item in output if item["type"] == "message"
                   for p in item["content"] if p["type"] == "output_text")
    answer = {
        "id": response_id, "object": "response", "created_at": created_at, "status": status,
        "background": body.background, "error": error, "incomplete_details": incomplete,
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
        "model": model, "output": output, "output_text": text,
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": body.previous_response_id,
        "store": body.store, "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": echoed, "tool_choice": body.tool_choice or "auto",
        "tools": body.tools or [], "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": body.truncation or "disabled", "top_logprobs": body.top_logprobs,
        "usage": None if status in ("queued", "in_progress") else usage_json(usage),
        "user": body.user, "metadata": body.metadata or {},
    }
    for asked in ("prompt_cache_retention", "service_tier", "max_tool_calls"):  # as asked
        if getattr(body, asked) is not None:
            answer[asked] = getattr(body, asked)
    if body.reasoning is not None:  # as asked (the summary's old name under its new one)
        answer["reasoning"] = {"effort": body.reasoning.effort,
                               "summary": body.reasoning.summary or body.reasoning.generate_summary}
    conversation = conversation_of(body)
    if conversation is not None:  # its input and output are added to it once it has run
        answer["conversation"] = {"id": conversation}
    return answer


def outcome(finish: FinishReason | None, error: str | None) -> tuple[str, dict[str, Any] | None,
                                                                     dict[str, Any] | None]:
    """status, error, incomplete_details for how generation ended."""
    if finish == "error":
        return "failed", {"code": "server_error", "message": error or "generation failed"}, None
    if finish == "length":
        return "incomplete", None, {"reason": "max_output_tokens"}
    if finish == "content_filter":
        return "incomplete", None, {"reason": "content_filter"}
    if finish == "cancelled":
        return "cancelled", None, None
    return "completed", None, None


class Output:
    """The output items of one response, built from its chunks; `add` and `close` also
    return the stream events of each step (a caller that does not stream drops them).
    One item is open at a time (text, reasoning, or a tool call by its index), so each
    item's deltas are contiguous, in the order the model produced them."""

    def __init__(self, namespaced: dict[str, tuple[str, str]] | None = None) -> None:
        """`namespaced`: the engine's names of namespaced functions -> (namespace, name),
        which a function_call item gives apart, as OpenAI's does."""
        self.namespaced = namespaced or {}
        self._flat = ""  # the open function call's name as the engine gives it
        self.items: list[dict[str, Any]] = []
        self.seq = -1
        self._open: tuple[str, int] | None = None
        self.created_at = int(time.time())

    def event(self, kind: str, data: dict[str, Any]) -> bytes:
        self.seq += 1
        return (b"event: " + kind.encode() + b"\ndata: "
                + orjson.dumps({"type": kind, "sequence_number": self.seq, **data}) + b"\n\n")

    @property
    def _at(self) -> int:
        return len(self.items) - 1

    def _start(self, key: tuple[str, int], item: dict[str, Any],
               redline: dict[str, Any] | None) -> list[bytes]:
        out = self.close()
        self._open = key
        self.items.append(item)
        head = {k: ([] if k in ("content", "summary") else v) for k, v in item.items()}
        out.append(self.event("response.output_item.added",
                              {"output_index": self._at, "item": head | {"status": "in_progress"}}))
        if item["type"] in ("message", "reasoning"):
            part = _empty_part(item["type"])
            out.append(self.event("response.content_part.added", {
                "item_id": item["id"], "output_index": self._at, "content_index": 0,
                "part": part} | _rl(redline)))
        return out

    def add(self, chunk: Chunk, redline: dict[str, Any] | None = None) -> list[bytes]:
        out: list[bytes] = []
        if chunk.reasoning:
            if self._open != ("reasoning", 0):
                out += self._start(("reasoning", 0), {
                    "id": _id("rs"), "type": "reasoning", "summary": [],
                    "content": [{"type": "reasoning_text", "text": ""}]}, redline)
            item = self.items[-1]
            item["content"][0]["text"] += chunk.reasoning
            out.append(self.event("response.reasoning_text.delta", {
                "item_id": item["id"], "output_index": self._at, "content_index": 0,
                "delta": chunk.reasoning} | _rl(redline)))
        if chunk.text:
            if self._open != ("text", 0):
                out += self._start(("text", 0), {
                    "id": _id("msg"), "type": "message", "status": "completed",
                    "role": "assistant", "content": [_empty_part("message")]}, redline)
            item = self.items[-1]
            part = item["content"][0]
            part["text"] += chunk.text
            lps = [token_logprob(t, fill_bytes=True) for t in chunk.logprobs or ()]
            part["logprobs"] += lps
            out.append(self.event("response.output_text.delta", {
                "item_id": item["id"], "output_index": self._at, "content_index": 0,
                "delta": chunk.text, "logprobs": lps} | _rl(redline)))
        for d in chunk.tool_calls:
            out += self._call(d, redline)
        return out

    def _call(self, d: ToolCallDelta, redline: dict[str, Any] | None) -> list[bytes]:
        out: list[bytes] = []
        if self._open != ("call", d.index):
            self._flat = d.name or ""
            out += self._start(("call", d.index), {
                "id": _id("fc"), "type": "function_call", "status": "completed",
                "call_id": d.id or _id("call"), **self._named(self._flat), "arguments": ""},
                redline)
        item = self.items[-1]
        if d.name and self._flat != d.name and d.id is None:
            self._flat += d.name  # a name streamed in pieces
            item.pop("namespace", None)
            item.update(self._named(self._flat))
        if d.arguments:
            item["arguments"] += d.arguments
            out.append(self.event("response.function_call_arguments.delta", {
                "item_id": item["id"], "output_index": self._at, "delta": d.arguments}
                | _rl(redline)))
        return out

    def _named(self, flat: str) -> dict[str, str]:
        """A function call's name as the client named the function: a namespaced one's
        engine name given apart into its namespace and its own name."""
        space = self.namespaced.get(flat)
        return {"name": flat} if space is None else {"name": space[1], "namespace": space[0]}

    def close(self) -> list[bytes]:
        """The ...done events of the open item."""
        if self._open is None:
            return []
        self._open = None
        item, at = self.items[-1], self._at
        out: list[bytes] = []
        if item["type"] == "message":
            part = item["content"][0]
            out.append(self.event("response.output_text.done", {
                "item_id": item["id"], "output_index": at, "content_index": 0,
                "text": part["text"], "logprobs": part["logprobs"]}))
            out.append(self.event("response.content_part.done", {
                "item_id": item["id"], "output_index": at, "content_index": 0, "part": part}))
        elif item["type"] == "reasoning":
            part = item["content"][0]
            out.append(self.event("response.reasoning_text.done", {
                "item_id": item["id"], "output_index": at, "content_index": 0,
                "text": part["text"]}))
            out.append(self.event("response.content_part.done", {
                "item_id": item["id"], "output_index": at, "content_index": 0, "part": part}))
        else:
            out.append(self.event("response.function_call_arguments.done", {
                "item_id": item["id"], "output_index": at, "name": item["name"],
                "arguments": item["arguments"]}))
        out.append(self.event("response.output_item.done", {"output_index": at, "item": item}))
        return out


def _empty_part(kind: str) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "reasoning_text", "text": ""}
    return {"type": "output_text", "text": "", "annotations": [], "logprobs": []}


def _rl(redline: dict[str, Any] | None) -> dict[str, Any]:
    return {} if redline is None else {"redline": redline}
