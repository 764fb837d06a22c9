"""What the fake upstream (fake_upstream.py) answers, in OpenAI's exact shapes, made
from the request alone (deterministic but for the tool-call ids):

- tools offered (and `tool_choice` not "none") and the last message not a tool result:
  a call of the named function, else of the first tool (and of the second as well when
  there are two and `parallel_tool_calls` is not false), its arguments made from the
  parameters schema and streamed in 5-character fragments; finish_reason "tool_calls".
- the last message a tool result: "result: <its content>." (finish "stop").
- `response_format` json_object / json_schema: a JSON object (from the schema's
  properties) in 3-character pieces.
- otherwise "tok tok ..." up to max_tokens (choice i>0 says "tok<i>"), the first piece
  "images:<k>" when the messages hold k image parts; `numbered`: "t1 t2 t3 ..." instead
  (choice i>0: "t<i>.1 ..."), so that a lost or repeated piece shows in the text.
- a continuation (`continued`): the same answer without the pieces the prefix already
  holds (a replica continuing what another began, as vLLM's `continue_final_message` does).
- `reasoning_effort` set: `reasoning_content` deltas before the answer (as vLLM's and
  DeepSeek's reasoning models stream them).
- `n` choices, interleaved step by step; `logprobs`/`top_logprobs` (chat's shape, or
  completions' `logprobs: k`); usage with `prompt_tokens_details.cached_tokens` when set.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Choice:
    steps: list[tuple[Any, bool]] = field(default_factory=list)  # (delta or text, has logprob)
    finish: str = "stop"


def _value(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return "tok"
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        return {k: _value(v) for k, v in (schema.get("properties") or {}).items()}
    return {"integer": 1, "number": 1.5, "boolean": True, "array": [], "null": None}.get(
        str(kind), "tok")


def _pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


class Answer:
    def __init__(self, body: dict[str, Any], chat: bool, max_tokens: int, words: int,
                 cached_tokens: int | None, call_id: str, numbered: bool = False) -> None:
        self.body, self.chat, self.words, self.cached = body, chat, words, cached_tokens
        self.numbered = numbered
        self.model = body.get("model")
        self.created = int(time.time())
        self.top = int(body.get("top_logprobs") or 0) if chat else int(body.get("logprobs") or 0)
        self.logprobs = bool(body.get("logprobs")) if chat else body.get("logprobs") is not None
        n = int(body.get("n") or 1)
        if not chat and isinstance(body.get("prompt"), list):  # n choices for each prompt
            n *= max(1, len(body["prompt"]))
        self.choices = [self._choice(i, max_tokens, f"{call_id}{i}") for i in range(n)]
        self.steps = max(len(c.steps) for c in self.choices)
        self.offsets = [0] * n

    def _choice(self, i: int, max_tokens: int, call_id: str) -> _Choice:
        body = self.body
        if not self.chat:
            return _Choice([(w if k == 0 else f" {w}", True)
                            for k, w in enumerate(self._words(i, max_tokens))], "length")
        messages = body.get("messages") or [{}]
        last = messages[-1]
        tools = [t for t in body.get("tools") or () if t.get("type") == "function"]
        choice = body.get("tool_choice")
        if tools and choice != "none" and last.get("role") != "tool":
            return self._calls(tools, choice, call_id)
        fmt = (body.get("response_format") or {}).get("type")
        if last.get("role") == "tool":
            pieces, finish = [f"result: {last.get('content')}", "."], "stop"
        elif fmt in ("json_object", "json_schema"):
            schema = (body["response_format"].get("json_schema") or {}).get("schema")
            value = _value(schema) if fmt == "json_schema" else {"answer": "tok"}
            pieces, finish = _pieces(json.dumps(value), 3), "stop"
        else:
            words = self._words(i, max(1, max_tokens))
            images = sum(1 for m in messages if isinstance(m.get("content"), list)
                         for p in m["content"] if p.get("type") == "image_url")
            pieces = [f"images:{images}" if images else words[0]] + [f" {w}" for w in words[1:]]
            finish = "length"
        if len(pieces) > max_tokens:
            pieces, finish = pieces[:max_tokens], "length"
        steps: list[tuple[Any, bool]] = [({"content": p}, True) for p in pieces]
        if body.get("reasoning_effort"):  # a reasoning model thinks first (vLLM, DeepSeek)
            steps[:0] = [({"reasoning_content": p, "content": None}, False)
                         for p in ("Let me", " think.")]
        steps[0][0]["role"] = "assistant"
        return _Choice(steps, finish)

    def _words(self, i: int, n: int) -> list[str]:
        if self.numbered:
            return [f"t{k + 1}" if i == 0 else f"t{i}.{k + 1}" for k in range(n)]
        return ["tok" if i == 0 else f"tok{i}"] * n

    def continued(self, prefix: str, limit: int) -> int:
        """Make this answer the continuation of `prefix` (what an earlier stream of it
        produced): drop the first pieces of choice 0 whose text `prefix` begins with (the
        longest such run), keep `limit` more. Returns how many were dropped."""
        c = self.choices[0]
        done, text = 0, ""
        for piece, _ in c.steps:
            token = (piece.get("content") or "") if self.chat else piece
            if not token or not prefix.startswith(text + token):
                break
            text += token
            done += 1
        c.steps = c.steps[done:done + limit]
        if self.chat and c.steps:
            c.steps[0] = ({**c.steps[0][0], "role": "assistant"}, c.steps[0][1])
        self.steps = max(len(ch.steps) for ch in self.choices)
        return done

    def suffix_steps(self, prompt: str) -> int:
        """Text completions: how many of choice 0's first pieces `prompt` ends with (a
        continuation sends the prompt with the text generated so far appended)."""
        whole = "".join(p for p, _ in self.choices[0].steps)
        ends = [0]
        for p, _ in self.choices[0].steps:
            ends.append(ends[-1] + len(p))
        return next((k for k in range(len(ends) - 1, 0, -1)
                     if prompt.endswith(whole[:ends[k]])), 0)

    def _calls(self, tools: list[dict[str, Any]], choice: Any, call_id: str) -> _Choice:
        named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
        chosen = [t for t in tools if t["function"]["name"] == named] if named else tools[:1]
        if not named and len(tools) > 1 and self.body.get("parallel_tool_calls") is not False:
            chosen.append(tools[1])
        steps: list[tuple[Any, bool]] = []
        for j, tool in enumerate(chosen):
            fn = tool["function"]
            head: dict[str, Any] = {"index": j, "id": f"{call_id}_{j}", "type": "function",
                                    "function": {"name": fn["name"], "arguments": ""}}
            delta: dict[str, Any] = {"tool_calls": [head]}
            if j == 0:
                delta = {"role": "assistant", "content": None, **delta, "refusal": None}
            steps.append((delta, False))
            args = json.dumps(_value({"type": "object", **(fn.get("parameters") or {})}))
            steps += [({"tool_calls": [{"index": j, "function": {"arguments": piece}}]}, False)
                      for piece in _pieces(args, 5)]
        return _Choice(steps, "tool_calls")

    def _logprob(self, step: int, token: str, index: int) -> Any:
        lp = round(-0.05 * (step + 1) - 0.01 * index, 4)
        alts = [(token, lp)] + [(f"alt{k}", round(lp - 1.0 - k, 4)) for k in range(self.top)]
        if self.chat:
            return {"content": [{"token": token, "logprob": lp, "bytes": list(token.encode()),
                                 "top_logprobs": [{"token": t, "logprob": v,
                                                   "bytes": list(t.encode())}
                                                  for t, v in alts[:self.top]]}],
                    "refusal": None}
        offset = self.offsets[index]
        self.offsets[index] += len(token)
        return {"tokens": [token], "token_logprobs": [lp],
                "top_logprobs": [dict(alts[:self.top])], "text_offset": [offset]}

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": "cmpl-fake", "object": "chat.completion.chunk" if self.chat else
                "text_completion", "created": self.created, "model": self.model,
                "choices": choices}

    def step(self, i: int) -> list[dict[str, Any]]:
        """The chunks of step i: each choice's piece, then the end of any that ends."""
        out = []
        for index, c in enumerate(self.choices):
            if i >= len(c.steps):
                continue
            piece, scored = c.steps[i]
            token = (piece.get("content") or "") if self.chat else piece
            lp = self._logprob(i, token, index) if scored and self.logprobs else None
            body: dict[str, Any] = {"index": index}
            body["delta" if self.chat else "text"] = piece
            out.append(self._envelope([{**body, "logprobs": lp, "finish_reason": None}]))
            if i == len(c.steps) - 1:
                end: dict[str, Any] = {"index": index}
                end["delta" if self.chat else "text"] = {} if self.chat else ""
                out.append(self._envelope([{**end, "logprobs": None,
                                            "finish_reason": c.finish}]))
        return out

    def usage(self) -> dict[str, Any]:
        done = sum(len(c.steps) for c in self.choices)
        out: dict[str, Any] = {"prompt_tokens": self.words, "completion_tokens": done,
                               "total_tokens": self.words + done}
        if self.cached is not None:
            out["prompt_tokens_details"] = {"cached_tokens": self.cached}
        return out

    def tail(self) -> list[dict[str, Any]]:
        if not (self.body.get("stream_options") or {}).get("include_usage"):
            return []
        return [{**self._envelope([]), "usage": self.usage()}]

    def whole(self) -> dict[str, Any]:
        """The non-streamed completion: what the stream's chunks add up to."""
        self.offsets = [0] * len(self.choices)
        choices = []
        for index, c in enumerate(self.choices):
            lps = [self._logprob(i, (p.get("content") or "") if self.chat else p, index)
                   for i, (p, scored) in enumerate(c.steps) if scored] if self.logprobs else None
            out: dict[str, Any] = {"index": index}
            if self.chat:
                content = "".join(p.get("content") or "" for p, _ in c.steps)
                reasoning = "".join(p.get("reasoning_content") or "" for p, _ in c.steps)
                calls: dict[int, dict[str, Any]] = {}
                for p, _ in c.steps:
                    for d in p.get("tool_calls") or ():
                        call = calls.setdefault(d["index"], {"id": d.get("id"), "type": "function",
                                                             "function": {"name": "",
                                                                          "arguments": ""}})
                        call["function"]["name"] += d["function"].get("name") or ""
                        call["function"]["arguments"] += d["function"].get("arguments") or ""
                message: dict[str, Any] = {"role": "assistant",
                                           "content": content if content or not calls else None,
                                           "refusal": None}
                if calls:
                    message["tool_calls"] = [calls[k] for k in sorted(calls)]
                if reasoning:
                    message["reasoning_content"] = reasoning
                out["message"] = message
                out["logprobs"] = None if lps is None else {
                    "content": [x for lp in lps for x in lp["content"]], "refusal": None}
            else:
                out["text"] = "".join(p for p, _ in c.steps)
                out["logprobs"] = None if lps is None else {
                    key: [x for lp in lps for x in lp[key]]
                    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
            out["finish_reason"] = c.finish
            choices.append(out)
        return {"id": "cmpl-fake", "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": choices,
                "usage": self.usage()}


def prompt_words(body: dict[str, Any], chat: bool) -> int:
    if chat:
        parts = []
        for m in body.get("messages") or []:
            content = m.get("content")
            if isinstance(content, list):
                parts += [str(p.get("text") or "") for p in content]
            else:
                parts.append(str(content or ""))
        text = " ".join(parts)
    else:
        prompt = body.get("prompt") or ""
        text = " ".join(map(str, prompt)) if isinstance(prompt, list) else str(prompt)
    return max(1, len(text.split()))


def embedding_answer(body: dict[str, Any]) -> dict[str, Any]:
    """/v1/embeddings: a unit vector per input (`dimensions`, default 8) made from its
    text's (or token array's) hash; base64 as OpenAI encodes it (little-endian float32)."""
    raw = body.get("input")
    items = [raw] if isinstance(raw, str) or (isinstance(raw, list) and raw
                                              and isinstance(raw[0], int)) else list(raw or ())
    dim = int(body.get("dimensions") or 8)
    data, tokens = [], 0
    for i, item in enumerate(items):
        seed = int.from_bytes(hashlib.sha256(json.dumps(item).encode()).digest()[:8], "little")
        vec = [((seed >> (k % 60)) % 97 + 1) / 97.0 for k in range(dim)]
        norm = math.sqrt(sum(x * x for x in vec))
        vec = [x / norm for x in vec]
        tokens += len(item) if isinstance(item, list) else len(str(item).split())
        value: Any = vec
        if body.get("encoding_format") == "base64":
            value = base64.b64encode(struct.pack(f"<{dim}f", *vec)).decode()
        data.append({"object": "embedding", "index": i, "embedding": value})
    return {"object": "list", "data": data, "model": body.get("model"),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def rerank_answer(body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's /rerank: documents scored by the share of the query's words they hold, best
    first, `top_n` of them (0 or absent: all), each with its document."""
    query = set(str(body.get("query", "")).lower().split())
    docs = [d if isinstance(d, str) else str(d.get("text", "")) for d in body.get("documents") or ()]
    scores = [len(query & set(d.lower().split())) / max(len(query), 1) for d in docs]
    order = sorted(range(len(docs)), key=lambda i: -scores[i])[:int(body.get("top_n") or len(docs))]
    tokens = len(query) + sum(len(d.split()) for d in docs)
    return {"id": "rerank-fake", "model": body.get("model"), "usage": {"total_tokens": tokens},
            "results": [{"index": i, "document": {"text": docs[i]}, "relevance_score": scores[i]}
                        for i in order]}
