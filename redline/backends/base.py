"""The one backend protocol: `stream(request)` yields chunks; closing the iterator
cancels the work. Everything else (router, cache, streams) is built on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from redline.types import Chunk, GenerationRequest


@dataclass(frozen=True)
class BackendInfo:
    name: str
    kind: str  # "local" | "openai" | "fake"
    context_length: int
    size_rank: int = 1


class Backend(Protocol):
    info: BackendInfo

    def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        """Generate. Raises redline.errors before the first chunk for bad requests
        (context too long); the last chunk has finish_reason, usage and timings."""
        ...

    async def start(self) -> None:
        """Load and warm up; the server is ready when every backend has started."""
        ...

    async def close(self) -> None: ...

    def load(self) -> int:
        """Requests in flight (for least-loaded choice)."""
        ...


@runtime_checkable
class Calibrates(Protocol):
    """A backend on this machine's cores (the embedded engine) that measures its step
    costs again once every backend and cache has loaded, one at a time: its forecasts
    come from them, and a warm-up beside other loads measures a busy machine."""

    async def calibrate(self) -> None: ...
