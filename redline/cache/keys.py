"""What makes two requests "the same question": the exact key and the semantic partition.

Exact key = sha256 over the tenant, the resolved model, the whitespace-normalised
messages (or prompt) with their structure (parts, images, tool calls and ids, names),
every sampling parameter that changes the output, the tools, tool_choice,
response_format, and every passed-through field. Semantic lookups compare only the
last user message, inside a partition that fixes everything else: tenant, model,
system prompt, sampling parameters, response format. The semantic cache serves only
single-turn, tool-less, text-only questions (a system prompt allowed); anything else is
exact-only. So an answer is never served across tenants, models, system prompts or
conversations.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from redline.types import VLLM_UNSET, GenerationRequest, Message, SamplingParams


def normalise(text: str) -> str:
    """Collapse whitespace; keep case and punctuation (they can change the answer)."""
    return " ".join(text.split())


def _sampling(s: SamplingParams) -> list[object]:
    # temperature/top_p/top_k/seed are kept even for greedy requests: cheap, and never wrong
    out: list[object] = [s.max_tokens, round(s.temperature, 4), round(s.top_p, 4), s.top_k,
                         list(s.stop), s.seed, s.ignore_eos]
    more = [s.n, s.logprobs, s.top_logprobs, s.presence_penalty, s.frequency_penalty,
            [list(b) for b in s.logit_bias]]
    if more != [1, False, None, None, None, []]:  # keys of plain requests stay as they were
        out.append(more)
    if s.vllm() != VLLM_UNSET:
        out.append(list(s.vllm()))
    return out


def _shape(request: GenerationRequest) -> list[object]:
    """Every other field that changes the output (empty for a plain request)."""
    out: list[object] = []
    if request.tools or request.tool_choice is not None or request.parallel_tool_calls is not None:
        out.append(["tools", list(request.tools), request.tool_choice,
                    request.parallel_tool_calls])
    if request.response_format is not None:
        out.append(["format", request.response_format])
    if request.extra:
        out.append(["extra", dict(request.extra)])
    return out


def _message(m: Message) -> list[Any]:
    out: list[Any] = [m.role, normalise(m.content)]
    if m.parts is not None or m.tool_calls or m.tool_call_id or m.name or m.extra:
        out.append([None if m.parts is None else list(m.parts),
                    list(m.tool_calls), m.tool_call_id, m.name, dict(m.extra)])
    return out


def _semantic(request: GenerationRequest) -> bool:
    """A single-turn, tool-less, text-only question, answered as text."""
    msgs = request.messages or ()
    return (not request.tools and request.sampling.n == 1 and not request.sampling.logprobs
            and not request.extra and all(m.role == "system" for m in msgs[:-1])
            and all(m.parts is None or all(p.type == "text" for p in m.parts) for m in msgs)
            and not any(m.tool_calls or m.tool_call_id for m in msgs))


def _fields(value: Any) -> Any:
    """A dataclass as its fields (the same JSON as `asdict`'s, without its deep copy: a
    tool's JSON Schema is copied whole by asdict on every request), any other mapping as
    a dict."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in fields(value)}
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def _digest(parts: list[object]) -> str:
    raw = json.dumps(parts, ensure_ascii=False, separators=(",", ":"), default=_fields)
    return hashlib.sha256(raw.encode()).hexdigest()[:40]


@dataclass(frozen=True)
class CacheKeys:
    exact: str  # the answer's key
    partition: str | None  # semantic partition; None when the request has no user question
    question: str | None  # the last user message, normalised


def cache_keys(request: GenerationRequest, model: str) -> CacheKeys:
    sampling = _sampling(request.sampling)
    shape = _shape(request)
    if request.messages is None:
        exact = _digest([request.tenant, model, "text", normalise(request.prompt or ""), sampling,
                         *shape])
        return CacheKeys(exact, None, None)  # text completions: exact only
    msgs = [_message(m) for m in request.messages]
    exact = _digest([request.tenant, model, "chat", msgs, sampling, *shape])
    if msgs[-1][0] != "user" or not msgs[-1][1] or not _semantic(request):
        return CacheKeys(exact, None, None)
    partition = _digest([request.tenant, model, "chat", msgs[:-1], sampling, *shape])
    return CacheKeys(exact, partition, msgs[-1][1])
