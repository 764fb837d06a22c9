"""Several replicas of one model as one backend: each request goes to the replica with
the fewest outstanding requests (ties go round-robin). The router reaches the replicas
itself to hedge and to skip those whose breaker is open."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Sequence

from redline.backends.base import Backend, BackendInfo
from redline.types import Chunk, GenerationRequest


class PoolBackend:
    def __init__(self, name: str, replicas: Sequence[Backend]) -> None:
        if not replicas:
            raise ValueError(f"pool {name!r} needs at least one replica")
        first = replicas[0].info
        self.info = BackendInfo(name, first.kind, first.context_length, first.size_rank)
        self.replicas = list(replicas)
        self._turn = itertools.count()

    def pick(self, exclude: Sequence[Backend] = (),
             usable: Callable[[Backend], bool] | None = None) -> Backend | None:
        """The least-loaded replica not in `exclude` (and `usable`, if given)."""
        n = len(self.replicas)
        start = next(self._turn) % n
        best: Backend | None = None
        for i in range(n):
            r = self.replicas[(start + i) % n]
            if any(r is e for e in exclude) or (usable is not None and not usable(r)):
                continue
            if best is None or r.load() < best.load():
                best = r
        return best

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        replica = self.pick() or self.replicas[0]
        async for chunk in replica.stream(request):
            yield chunk

    async def start(self) -> None:
        await asyncio.gather(*(r.start() for r in self.replicas))

    async def close(self) -> None:
        await asyncio.gather(*(r.close() for r in self.replicas), return_exceptions=True)

    def load(self) -> int:
        return sum(r.load() for r in self.replicas)


def replicas_of(backend: Backend) -> list[Backend]:
    """The leaves that serve `backend`: its replicas for a pool, else itself."""
    return list(backend.replicas) if isinstance(backend, PoolBackend) else [backend]
