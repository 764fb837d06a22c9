"""A backend for tests and benchmarks that need no model: deterministic text with
configurable time to first token and time per token. Shipped in the package, like
httpx's MockTransport."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

from redline.backends.base import BackendInfo
from redline.errors import BackendError, ContextLengthExceeded
from redline.types import Chunk, GenerationRequest, StageTimings, Usage


class FakeBackend:
    def __init__(self, name: str = "fake", *, ttft_s: float = 0.0, tpot_s: float = 0.0,
                 words: tuple[str, ...] = ("lorem", "ipsum", "dolor", "sit", "amet"),
                 context_length: int = 4096, fail_rate: float = 0.0, size_rank: int = 1,
                 seed: int = 0) -> None:
        self.info = BackendInfo(name, "fake", context_length, size_rank)
        self.ttft_s, self.tpot_s, self.words = ttft_s, tpot_s, words
        self.fail_rate = fail_rate
        self.calls = 0
        self.inflight = 0
        self.cancelled = 0
        self._rng = random.Random(seed)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    def load(self) -> int:
        return self.inflight

    def _prompt_len(self, request: GenerationRequest) -> int:
        text = request.prompt or " ".join(m.content for m in request.messages or ())
        return max(1, len(text.split()))

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        self.calls += 1
        n_prompt = self._prompt_len(request)
        if n_prompt + request.sampling.max_tokens > self.info.context_length:
            raise ContextLengthExceeded("prompt + max_tokens exceed the context", param="messages")
        if self._rng.random() < self.fail_rate:
            raise BackendError(f"{self.info.name} failed (injected)")
        self.inflight += 1
        done = False
        try:
            await asyncio.sleep(self.ttft_s)
            n = request.sampling.max_tokens
            for i in range(n):
                if i:
                    await asyncio.sleep(self.tpot_s)
                word = self.words[i % len(self.words)]
                text = word if i == 0 else " " + word
                if i < n - 1:
                    yield Chunk(text=text, tokens=1)
            done = True
            timings = StageTimings({"prefill": self.ttft_s, "decode": self.tpot_s * (n - 1)})
            yield Chunk(text=text, tokens=1, finish_reason="length",
                        usage=Usage(n_prompt, n), timings=timings)
        finally:
            self.inflight -= 1
            if not done:
                self.cancelled += 1
