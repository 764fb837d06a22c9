"""Several choices (`n`, or a list of prompts) on the embedded engine: one sequence per
choice, merged into one stream of chunks with their choice index (prompt index * n +
choice, as OpenAI numbers them).

Each prompt's choice 0 goes first; its other choices are submitted once it has its first
token, when its slot holds the prompt's KV: the scheduler then copies that prefix into their
slots (`seq_cp`, no recomputation), so each prompt is computed once and the n sequences
decode together.

Each choice's end but the last is a chunk with `ends_choice`; the last one carries
`finish_reason`, and the usage of all (each prompt counted once, as OpenAI counts it, with
its choice 0's cached prompt tokens)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from redline.types import Chunk, SamplingParams, Usage

Start = Callable[[int, SamplingParams], AsyncIterator[Chunk]]


def choice_sampling(sampling: SamplingParams, index: int) -> SamplingParams:
    """Choice `index`'s parameters: one choice; with a seed, its own seed stream (distinct
    choices, the same ones for the same seed)."""
    seed = None if sampling.seed is None else (sampling.seed + index) & 0xFFFFFFFF
    return dataclasses.replace(sampling, n=1, seed=seed)


async def merged(choices: int, sampling: SamplingParams, start: Start) -> AsyncIterator[Chunk]:
    """`choices` choices: `sampling.n` for each prompt; `start(index, sampling)` starts one."""
    n = sampling.n
    queue: asyncio.Queue[tuple[int, Chunk | BaseException]] = asyncio.Queue()
    primed = [asyncio.Event() for _ in range(0, choices, n)]  # per prompt: its KV is there

    async def pump(index: int) -> None:
        ready = primed[index // n]
        if index % n:
            await ready.wait()
        try:
            async for chunk in start(index, choice_sampling(sampling, index % n)):
                ready.set()
                queue.put_nowait((index, chunk))
        except Exception as exc:  # handed to the consumer, which raises it
            queue.put_nowait((index, exc))
        finally:
            ready.set()

    tasks = [asyncio.create_task(pump(i)) for i in range(choices)]
    left = choices
    completion = 0
    usages: dict[int, Usage] = {}  # per prompt: its choice 0's usage (or another's till then)
    details: list[Mapping[str, Any]] = []
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
                if item.usage.completion_details:  # a prediction's drafts, every choice's
                    details.append(item.usage.completion_details)
                # choice 0 computed the prompt: its reuse is the prompt's cached_tokens (the
                # others copied its KV, which the client did not send twice)
                if index % n == 0 or index // n not in usages:
                    usages[index // n] = item.usage
            if left:
                item.ends_choice, item.finish_reason, item.usage = item.finish_reason, None, None
                item.timings = None
            elif usages:
                item.usage = Usage(sum(u.prompt_tokens for u in usages.values()), completion,
                                   cached_tokens=sum(u.cached_tokens or 0 for u in usages.values()),
                                   completion_details=summed(details))
            yield item
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def summed(details: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Every choice's completion_tokens_details, its counts added (None: none had any)."""
    if not details:
        return None
    out: dict[str, Any] = {}
    for d in details:
        for key, value in d.items():
            out[key] = out.get(key, 0) + value if isinstance(value, int) else value
    return out
