"""Several replicas of one model as one backend. Each request goes to the replica ranked
first by the pool's placement policy (backends/placement.py): by default the one whose
engine probably holds the longest part of its prompt in its prefix cache (the pool's
per-replica PrefixIndex of what it sent there), against its load, with no replica taken
above a bounded multiple of the mean load; a request with a session key (X-Session-ID,
else the OpenAI `user`) goes back to the replica its session used while that one is
usable. The router reaches the replicas itself, in `rank` order, to retry, to hedge and
to skip those whose breaker is open, and tells the pool where it sent each request
(`record`), which is what the index learns from."""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence

from redline.backends.base import Backend, BackendInfo
from redline.backends.continuation import Mode
from redline.backends.placement import Policy, Weights, affinity, rank
from redline.backends.prefix_index import PrefixIndex, prompt_text, text_blocks
from redline.config import PlacementConfig
from redline.types import Chunk, GenerationRequest

_MEMO = 256  # requests whose block hashes are kept between `rank` and `record`
# a new prefix's home is hashed from its 4th block (~64 tokens), not its 1st: prompts that
# open with the same boilerplate ("You are a helpful assistant") still get different homes
_ANCHOR_BLOCKS = 4


class PoolBackend:
    def __init__(self, name: str, replicas: Sequence[Backend],
                 placement: PlacementConfig | None = None, cache_blocks: int | None = None,
                 load_cost_tokens: float | None = None) -> None:
        """`cache_blocks`: what each replica's engine caches (ModelConfig.cache_blocks());
        `load_cost_tokens`: ModelConfig.load_cost_tokens(), else the placement's for remote
        engines."""
        if not replicas:
            raise ValueError(f"pool {name!r} needs at least one replica")
        first = replicas[0].info
        self.info = BackendInfo(name, first.kind, first.context_length, first.size_rank)
        self.replicas = list(replicas)
        cfg = placement or PlacementConfig()
        self.policy: Policy = cfg.policy
        cost = load_cost_tokens if load_cost_tokens is not None else cfg.load_cost(local=False)
        self.weights = Weights(cfg.load_bound, cost / cfg.block_tokens,
                               cfg.load_floor)
        self.block_bytes = max(1, round(cfg.block_tokens * cfg.chars_per_token))
        capacity = cache_blocks if cache_blocks is not None else (cfg.cache_blocks or 16384)
        self.indexes = [PrefixIndex(capacity) for _ in self.replicas]
        self.sessions_on = cfg.sessions
        self.session_capacity = cfg.session_capacity
        self.sessions: OrderedDict[str, int] = OrderedDict()  # key -> replica position
        self._turn = itertools.count()
        self._memo: OrderedDict[str, list[bytes]] = OrderedDict()
        # how a stream whose replica dies continues on another (routing/migrate.py)
        self.migrate: Mode = cfg.migrate if cfg.migrate != "auto" else "continue_final_message"

    # -- choosing -------------------------------------------------------------------

    def rank(self, request: GenerationRequest | None = None,
             usable: Callable[[Backend], bool] | None = None,
             exclude: Sequence[Backend] = ()) -> list[Backend]:
        """The replicas not in `exclude` (and `usable`, if given), best first for
        `request` (without one: by load alone)."""
        cands = [i for i, r in enumerate(self.replicas)
                 if not any(r is e for e in exclude) and (usable is None or usable(r))]
        if not cands:
            return []
        loads = [self.replicas[i].load() for i in cands]
        homes: list[int] | None = None
        if self.policy == "prefix" and request is not None:
            blocks = self.blocks(request)
            hits = [self.indexes[i].match(blocks) for i in cands]
            if blocks:
                anchor = blocks[min(len(blocks), _ANCHOR_BLOCKS) - 1]
                homes = [affinity(anchor, i) for i in cands]
            policy: Policy = "prefix"
        else:
            hits = [0] * len(cands)
            policy = "least_loaded" if self.policy == "prefix" else self.policy
        order = [cands[j] for j in rank(policy, loads, hits, next(self._turn), self.weights, homes)]
        pinned = self._pinned(request)
        if pinned is not None and pinned in order:  # usable: its session stays there
            order.remove(pinned)
            order.insert(0, pinned)
        return [self.replicas[i] for i in order]

    def pick(self, exclude: Sequence[Backend] = (),
             usable: Callable[[Backend], bool] | None = None,
             request: GenerationRequest | None = None) -> Backend | None:
        """The first of `rank`, or None when no replica qualifies."""
        ranked = self.rank(request, usable, exclude)
        return ranked[0] if ranked else None

    def record(self, replica: Backend, request: GenerationRequest) -> None:
        """`request` was sent to `replica`: its engine now holds the prompt's blocks, and
        the request's session (if any) lives there."""
        at = next((i for i, r in enumerate(self.replicas) if r is replica), None)
        if at is None:
            return
        if self.policy == "prefix":
            self.indexes[at].add(self.blocks(request))
        key = self._session_key(request)
        if key is not None:
            self.sessions[key] = at
            self.sessions.move_to_end(key)
            while len(self.sessions) > self.session_capacity:
                self.sessions.popitem(last=False)

    def blocks(self, request: GenerationRequest) -> list[bytes]:
        """The prompt's chained block hashes (kept a while: `rank` and `record` both ask)."""
        got = self._memo.get(request.id)
        if got is None:
            got = text_blocks(prompt_text(request), self.block_bytes)
            self._memo[request.id] = got
            if len(self._memo) > _MEMO:
                self._memo.popitem(last=False)
        return got

    def _session_key(self, request: GenerationRequest | None) -> str | None:
        if request is None or not self.sessions_on:
            return None
        key = request.session or request.user
        # scoped by tenant: two tenants' user ids are not one session
        return f"{request.tenant}\x00{key}" if key else None

    def _pinned(self, request: GenerationRequest | None) -> int | None:
        key = self._session_key(request)
        return self.sessions.get(key) if key is not None else None

    # -- serving (when the pool is called directly, not through the router) ----------

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        replica = self.pick(request=request) or self.replicas[0]
        self.record(replica, request)
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
