"""The semantic index: per partition, the cached questions' vectors, searched by a dot
product over a numpy matrix (exact search; at 10k rows × 384 dims about 1 ms).

Shared through the store, so Redis-backed replicas see each other's entries: each
partition is an append-only list in the store (`append`/`range`); an item is one record
(answer key, question, float32 vector). Every replica keeps a local matrix per partition
and, before each search, reads only the items it has not seen yet: `range(key, seen - 1)`
returns the last item it already holds (a check that the list was not expired and
rebuilt meanwhile; if it was, the partition is read again whole) plus anything new.
That is one store round trip per lookup (~0.1 ms on Redis or SQLite), and a hit cached
by replica A is found by replica B on its very next lookup.

Bounds: a replica holds at most 2 × `max_entries` rows per partition (then compacts to
the newest `max_entries`) and `max_partitions` partitions (LRU). Answers evicted from
the store leave stale rows; a stale candidate is skipped when its answer is gone.

Past ~100k rows per partition, exact search costs more than the embedding: swap the
matrix for an ANN index (hnswlib `Index(space="ip")` with `add_items` per new record,
or faiss `IndexHNSWFlat`) behind the same `search()`; the store list stays the source
of truth and each replica still builds its index from it incrementally.
"""

from __future__ import annotations

import asyncio
import json
import struct
from dataclasses import dataclass, field

import numpy as np
from cachetools import LRUCache

from redline.store.base import Store

_HEADER = struct.Struct(">I")


def encode_record(key: str, question: str, vector: np.ndarray) -> bytes:
    head = json.dumps({"k": key, "q": question}, ensure_ascii=False).encode()
    return _HEADER.pack(len(head)) + head + np.asarray(vector, dtype="<f4").tobytes()


def decode_record(raw: bytes) -> tuple[str, str, np.ndarray]:
    (n,) = _HEADER.unpack_from(raw)
    head = json.loads(raw[_HEADER.size:_HEADER.size + n])
    vector = np.frombuffer(raw, dtype="<f4", offset=_HEADER.size + n)
    return head["k"], head["q"], vector


@dataclass(frozen=True)
class Candidate:
    similarity: float
    key: str
    question: str


@dataclass
class _Partition:
    dim: int
    keys: list[str] = field(default_factory=list)
    questions: list[str] = field(default_factory=list)
    matrix: np.ndarray = field(init=False)  # [capacity, dim]; rows [0, n) are live
    n: int = 0
    seen: int = 0  # items of the store list already read
    last: bytes | None = None  # the last item read, to detect a rebuilt list
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.matrix = np.zeros((16, self.dim), dtype=np.float32)

    def clear(self) -> None:
        self.keys, self.questions, self.n, self.seen, self.last = [], [], 0, 0, None

    def extend(self, items: list[bytes], max_entries: int) -> None:
        for raw in items:
            key, question, vector = decode_record(raw)
            if vector.shape[0] != self.dim:  # written by a different embedder: unusable
                continue
            if self.n == self.matrix.shape[0]:
                grown = np.zeros((self.n * 2, self.dim), dtype=np.float32)
                grown[: self.n] = self.matrix[: self.n]
                self.matrix = grown
            self.matrix[self.n] = vector
            self.keys.append(key)
            self.questions.append(question)
            self.n += 1
        self.seen += len(items)
        self.last = items[-1]
        if self.n > 2 * max_entries:  # compact: keep the newest max_entries
            drop = self.n - max_entries
            self.matrix[:max_entries] = self.matrix[drop:self.n]
            self.keys, self.questions = self.keys[drop:], self.questions[drop:]
            self.n = max_entries

    def search(self, vector: np.ndarray, k: int) -> list[Candidate]:
        if self.n == 0:
            return []
        sims = self.matrix[: self.n] @ vector  # [n]
        k = min(k, self.n)
        top = np.argpartition(-sims, k - 1)[:k] if self.n > k else np.arange(self.n)
        top = top[np.argsort(-sims[top])]
        return [Candidate(float(sims[i]), self.keys[i], self.questions[i]) for i in top]


class SemanticIndex:
    def __init__(self, store: Store, dim: int, *, prefix: str = "rl:cache:p:",
                 max_entries: int = 10000, max_partitions: int = 4096) -> None:
        self.store, self.dim, self.prefix = store, dim, prefix
        self.max_entries = max_entries
        self._parts: LRUCache[str, _Partition] = LRUCache(maxsize=max_partitions)

    async def add(self, partition: str, key: str, question: str, vector: np.ndarray,
                  ttl: float | None) -> None:
        """Publish a record; every replica (this one included) reads it on its next search."""
        await self.store.append(self.prefix + partition, encode_record(key, question, vector), ttl)

    async def search(self, partition: str, vector: np.ndarray, k: int = 4) -> list[Candidate]:
        part = await self._refresh(partition)
        return part.search(vector, k)

    async def _refresh(self, partition: str) -> _Partition:
        part = self._parts.get(partition)
        if part is None:
            part = self._parts[partition] = _Partition(self.dim)
        async with part.lock:
            list_key = self.prefix + partition
            if part.seen:
                items = await self.store.range(list_key, part.seen - 1)
                if items and items[0] == part.last:
                    new = items[1:]
                else:  # expired and rebuilt since we last looked: read it again whole
                    part.clear()
                    new = await self.store.range(list_key, 0)
            else:
                new = await self.store.range(list_key, 0)
            if new:
                part.extend(new, self.max_entries)
        return part
