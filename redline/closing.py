"""Closing an async iterator that may be a generator: the one way every layer frees what
a stream of chunks or events holds (an upstream connection, an engine sequence)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any


async def aclose(it: AsyncIterator[Any]) -> None:
    """Close `it` if it can be closed (an async generator, or any iterator with
    `aclose`). A generator running in another task raises RuntimeError here; that task
    is inside it and ends it itself, so that is not an error."""
    close = getattr(it, "aclose", None)
    if close is None:
        return
    try:
        await close()
    except RuntimeError:  # "already running": closed by the task that runs it
        pass


__all__ = ["aclose"]
