"""Hedged first tokens (tier S): start on one replica; if its first token has not come by
`delay` (the replica's observed p90 TTFT), send a second copy to another replica, keep
whichever answers first and cancel the other, which closes its upstream request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Opened(Generic[T]):
    """What a started call gives back: its value (first chunk and the rest) and how to
    close it if it loses."""

    def __init__(self, value: T, close: Callable[[], Awaitable[None]]) -> None:
        self.value, self.close = value, close


async def hedged(first: Callable[[], Awaitable[Opened[T]]],
                 second: Callable[[], Awaitable[Opened[T]]] | None,
                 delay: float, may_hedge: Callable[[], bool]) -> tuple[Opened[T], bool]:
    """Returns the winner and whether a hedge was sent. If both fail, the primary's
    error is raised."""
    primary = asyncio.ensure_future(first())
    try:
        done, _ = await asyncio.wait({primary}, timeout=delay)
        if done or second is None or not may_hedge():
            return await primary, False
    except BaseException:
        primary.cancel()
        raise
    backup = asyncio.ensure_future(second())
    tasks = {primary, backup}
    try:
        winner: asyncio.Future[Opened[T]] | None = None
        pending = set(tasks)
        while pending and winner is None:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if not t.cancelled() and t.exception() is None and winner is None:
                    winner = t
        if winner is None:
            return await primary, True  # both failed: raises the primary's error
        for t in tasks - {winner}:
            await _discard(t)
        return winner.result(), True
    except BaseException:
        for t in tasks:
            await _discard(t)
        raise


async def _discard(task: asyncio.Future[Opened[T]]) -> None:
    """Cancel a loser; if it had already started streaming, close it."""
    if not task.done():
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        return
    if not task.cancelled() and task.exception() is None:
        await task.result().close()
