"""Shadow generation: the model's own answer to a question the cache answered, made only
while the engine has nothing else to do.

    await ShadowGenerator(backends).generate(request, model) → the answer text, or None

Low priority by construction: it starts only when the backend (and, for a local model,
every local model of the process: they share the cores) has no request in flight or
waiting, and it is abandoned the moment another request arrives (the iterator is closed,
which cancels the work); it then waits for idle again, at most `attempts` times and
`max_wait_s` in all. One shadow runs at a time. It goes to the backend directly, not
through the router: no breaker, no tenant's tokens, no metrics of user traffic.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from redline.backends.base import Backend
from redline.cache.judge import question_messages, yes_log_odds
from redline.closing import aclose
from redline.types import GenerationRequest, SamplingParams, new_id

T = TypeVar("T")


class ShadowGenerator:
    def __init__(self, backends: Mapping[str, Backend], *, max_wait_s: float = 60.0,
                 poll_s: float = 0.05, attempts: int = 3) -> None:
        self.backends = backends
        self.max_wait_s, self.poll_s, self.attempts = max_wait_s, poll_s, attempts
        self._one = asyncio.Lock()
        self.preempted = 0  # shadows abandoned because a request came (for tests and logs)

    def _sharing(self, model: str) -> list[Backend]:
        """The backends whose work competes with `model`'s."""
        target = self.backends[model]
        if target.info.kind != "local":
            return [target]
        return [b for b in self.backends.values() if b.info.kind == "local"]

    def busy(self, model: str, own: int = 0) -> bool:
        """Anything in flight or waiting besides our own `own` requests?"""
        return sum(b.load() for b in self._sharing(model)) > own

    async def _idle(self, model: str, deadline: float) -> bool:
        while self.busy(model):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(self.poll_s)
        return True

    async def wait_idle(self, model: str) -> bool:
        """Until nothing competes with `model` (True), or `max_wait_s` passed (False)."""
        if model not in self.backends:
            return True  # nothing of ours to wait for
        return await self._idle(model, time.monotonic() + self.max_wait_s)

    async def _when_idle(self, model: str, attempt: Callable[[], Awaitable[T | None]],
                         attempts: int | None = None) -> T | None:
        """`attempt()` each time nothing competes with `model`, until it gives a result:
        at most `attempts` (default: the generator's) times and `max_wait_s` in all, one
        shadow at a time."""
        deadline = time.monotonic() + self.max_wait_s
        async with self._one:
            for _ in range(attempts or self.attempts):
                if not await self._idle(model, deadline):
                    return None
                result = await attempt()
                if result is not None:
                    return result
        return None

    async def generate(self, request: GenerationRequest, model: str) -> str | None:
        """The answer `model` gives to `request`, or None: no such model, never idle long
        enough, preempted every time, or the generation failed or was cut short."""
        backend = self.backends.get(model)
        if backend is None:
            return None

        def attempt() -> Awaitable[str | None]:
            shadow = dataclasses.replace(request, id=new_id("shadow"), use_cache=False,
                                         arrival=time.perf_counter())
            return self._run(backend, shadow, model)

        return await self._when_idle(model, attempt)

    async def judge_questions(self, model: str, cached: str, asked: str) -> float | None:
        """The questions judge: `model`'s log-odds that `asked` is the same question as
        `cached` (judge.py), asked while idle as a shadow is, in tier B (an engine serves
        any request that comes meanwhile first); None when it never was idle long enough,
        or gave no yes or no."""
        backend = self.backends.get(model)
        if backend is None:
            return None
        sampling = SamplingParams(max_tokens=1, temperature=0.0, logprobs=True, top_logprobs=20)
        request = GenerationRequest(model, sampling, messages=question_messages(cached, asked),
                                    id=new_id("judge"), tier="B", use_cache=False)

        async def attempt() -> float | None:
            it = backend.stream(request)
            try:
                async for chunk in it:
                    if chunk.logprobs:
                        return yes_log_odds(chunk.logprobs[0].top)
                    if chunk.finish_reason is not None:
                        return None
            except Exception:  # no verdict; the user's traffic is unaffected
                return None
            finally:
                await aclose(it)
            return None

        # one attempt: nothing preempts it, and a greedy answer would not change
        return await self._when_idle(model, attempt, attempts=1)

    async def _run(self, backend: Backend, request: GenerationRequest, model: str) -> str | None:
        parts: list[str] = []
        it = backend.stream(request)
        try:
            async for chunk in it:
                parts.append(chunk.text)
                if chunk.finish_reason is not None:
                    return "".join(parts) if chunk.finish_reason in ("stop", "length") else None
                if self.busy(model, own=1):  # a request came: it goes first
                    self.preempted += 1
                    return None
        except Exception:  # a failed shadow is no verdict; the user's traffic is unaffected
            return None
        finally:
            await aclose(it)
        return None
