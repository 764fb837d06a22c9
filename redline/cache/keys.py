"""What makes two requests "the same question": the exact key and the semantic partition.

Exact key = sha256 over the tenant, the resolved model, the whitespace-normalised
messages (or prompt) and every sampling parameter that changes the output. Semantic
lookups compare only the last user message, inside a partition that fixes everything
else: tenant, model, system prompt, earlier turns and sampling parameters. So an answer
is never served across tenants, models, system prompts or conversations.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from redline.types import GenerationRequest, SamplingParams


def normalise(text: str) -> str:
    """Collapse whitespace; keep case and punctuation (they can change the answer)."""
    return " ".join(text.split())


def _sampling(s: SamplingParams) -> list[object]:
    # temperature/top_p/top_k/seed are kept even for greedy requests: cheap, and never wrong
    return [s.max_tokens, round(s.temperature, 4), round(s.top_p, 4), s.top_k, list(s.stop),
            s.seed, s.ignore_eos]


def _digest(parts: list[object]) -> str:
    raw = json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:40]


@dataclass(frozen=True)
class CacheKeys:
    exact: str  # the answer's key
    partition: str | None  # semantic partition; None when the request has no user question
    question: str | None  # the last user message, normalised


def cache_keys(request: GenerationRequest, model: str) -> CacheKeys:
    sampling = _sampling(request.sampling)
    if request.messages is None:
        exact = _digest([request.tenant, model, "text", normalise(request.prompt or ""), sampling])
        return CacheKeys(exact, None, None)  # text completions: exact only
    msgs = [[m.role, normalise(m.content)] for m in request.messages]
    exact = _digest([request.tenant, model, "chat", msgs, sampling])
    if msgs[-1][0] != "user" or not msgs[-1][1]:
        return CacheKeys(exact, None, None)
    partition = _digest([request.tenant, model, "chat", msgs[:-1], sampling])
    return CacheKeys(exact, partition, msgs[-1][1])
