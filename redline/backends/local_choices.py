"""Several choices (`n`) on the embedded engine: n sequences of one prompt, merged into one
stream of chunks with their choice index.

Choice 0 goes first; the others are submitted once it has its first token, when its slot
holds the prompt's KV: the scheduler then copies that prefix into their slots (`seq_cp`,
no recomputation), so the prompt is computed once and the n sequences decode together.

Each choice's end but the last is a chunk with `ends_choice`; the last one carries
`finish_reason`, and the usage of all (the prompt counted once, as OpenAI counts it, with
choice 0's cached prompt tokens)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable

from redline.types import Chunk, SamplingParams, Usage

Start = Callable[[int, SamplingParams], AsyncIterator[Chunk]]


def choice_sampling(sampling: SamplingParams, index: int) -> SamplingParams:
    """Choice `index`'s parameters: one choice; with a seed, its own seed stream (distinct
    choices, the same ones for the same seed)."""
    seed = None if sampling.seed is None else (sampling.seed + index) & 0xFFFFFFFF
    return dataclasses.replace(sampling, n=1, seed=seed)


async def merged(n: int, sampling: SamplingParams, start: Start) -> AsyncIterator[Chunk]:
    queue: asyncio.Queue[tuple[int, Chunk | BaseException]] = asyncio.Queue()
    primed = asyncio.Event()

    async def pump(index: int) -> None:
        if index:
            await primed.wait()
        try:
            async for chunk in start(index, choice_sampling(sampling, index)):
                primed.set()
                queue.put_nowait((index, chunk))
        except Exception as exc:  # handed to the consumer, which raises it
            queue.put_nowait((index, exc))
        finally:
            primed.set()

    tasks = [asyncio.create_task(pump(i)) for i in range(n)]
    left = n
    completion = 0
    usage: Usage | None = None
    try:
        while left:
            index, item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            item.index = index
            if item.finish_reason == "error":
                yield item
                return
            if item.finish_reason is None:
                yield item
                continue
            left -= 1
            if item.usage is not None:
                completion += item.usage.completion_tokens
                # choice 0 computed the prompt: its reuse is the request's cached_tokens (the
                # others copied its KV, which the client did not send twice)
                usage = item.usage if index == 0 else usage or item.usage
            if left:
                item.ends_choice, item.finish_reason, item.usage = item.finish_reason, None, None
                item.timings = None
            elif usage is not None:
                item.usage = dataclasses.replace(usage, completion_tokens=completion)
            yield item
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
