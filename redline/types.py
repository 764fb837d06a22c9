"""Typed values that cross stage boundaries: a request in, chunks out.

Every stage of the pipeline (api → routing → cache → backend → streams) passes
these, never loose dicts.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Tier = Literal["S", "A", "B"]
FinishReason = Literal["stop", "length", "cancelled", "error"]

STAGES = ("queue", "cache", "route", "tokenize", "prefill", "decode", "detokenize", "total")


class _Random:
    """Random bytes from the OS, fetched 4 KiB at a time: ids are made several times a
    request, and a getrandom() call each (uuid4) cost more than the rest of new_id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool = b""
        self._at = 0  # what is before it was handed out
        os.register_at_fork(after_in_child=self._reset)  # a child must not reuse ours

    def _reset(self) -> None:
        self._pool, self._at = b"", 0

    def take(self, n: int) -> bytes:
        with self._lock:
            if self._at + n > len(self._pool):
                self._pool, self._at = os.urandom(4096), 0
            out = self._pool[self._at:self._at + n]
            self._at += n
        return out


_random = _Random()


def new_id(prefix: str) -> str:
    """`prefix-` and 96 random bits in hex (unguessable: a stream id lets its tenant resume)."""
    return f"{prefix}-{_random.take(12).hex()}"


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. temperature 0 means greedy."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@dataclass
class GenerationRequest:
    """One completion to produce. Either `messages` (chat) or `prompt` (text)."""

    model: str
    sampling: SamplingParams
    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    id: str = field(default_factory=lambda: new_id("req"))
    tier: Tier | None = None
    tenant: str = "anonymous"  # API key scope: caches and limits never cross it
    use_cache: bool = True  # False for `Cache-Control: no-cache` or body "cache": false
    user: str | None = None  # OpenAI's end-user id (A/B assignment is sticky on it)
    # the client takes a 202 job (tier B) when its tier's first-token budget can't be met
    allow_background: bool = False
    arrival: float = field(default_factory=time.perf_counter)

    @property
    def is_chat(self) -> bool:
        return self.messages is not None


@dataclass
class StageTimings:
    """Seconds spent per stage for one request; only stages that happened are set."""

    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, dt: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + dt

    def server_timing(self) -> str:
        """The `Server-Timing` header value, in milliseconds, in pipeline order."""
        parts = [f"{s};dur={self.seconds[s] * 1000:.2f}" for s in STAGES if s in self.seconds]
        return ", ".join(parts)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Chunk:
    """A piece of generated text. The last chunk of a stream has `finish_reason` set,
    and carries `usage` and the backend's stage `timings`."""

    text: str = ""
    tokens: int = 0  # output tokens this chunk covers
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    timings: StageTimings | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    """A request that has ended, as every pipeline observer receives it (the cache that
    stores the answer, the stream-length history, the long-tail log, live stats, the A/B
    recorder, the token limiter). Frozen: one observer cannot change what the next sees."""

    request: GenerationRequest
    model: str  # the model that answered
    tier: str
    cache: str  # "miss", "hit", "semantic", "bypass", ...
    status: str  # "200", "499" (the client left), "500"
    finish_reason: str | None
    output_tokens: int
    ttft_s: float | None
    total_s: float
    usage: Usage | None
    text: str  # the whole answer
    timings: Mapping[str, float]  # stage -> seconds, "total" included
    arm: str | None = None  # "experiment:arm" when an A/B experiment enrolled it
