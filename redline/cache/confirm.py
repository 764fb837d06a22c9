"""A second opinion on borderline semantic candidates, from a stronger embedder.

    similarity(question_vector, entry_key, entry_question) → cosine in the stronger model
    remember(entry_key, question)                          → at insert, off the hot path

The cache searches with all-MiniLM-L6-v2 (fast). A candidate at or over
`cache.similarity_threshold` is served as before; one between `cache.confirm_floor` and
that threshold is served only if all-mpnet-base-v2 (bundled.py; ~5x MiniLM's time) also
finds the two questions at least `cache.confirm_threshold` alike, and the guard lets it
through. Paraphrases with few shared words sit in that band: MiniLM scores them low and
mpnet knows they ask the same. Only a lookup with a borderline candidate pays for the
second embedding (of the question asked); the entry's own vector is made when its answer
is stored, on a thread of its own so lookups never queue behind it, and kept in the store
next to the answer (so every replica has it).

Without the second model (not installed, failed to load) `ResponseCache` has no
Confirmer: semantic hits need `cache.similarity_threshold`, as before issue 22's second
stage, and the start-up log says so.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from redline.cache.bundled import mpnet_path
from redline.cache.embedder import Embedder, load_sentence_model
from redline.store.base import Store, StoreUnavailable

if TYPE_CHECKING:
    from redline.config import CacheConfig

log = logging.getLogger(__name__)

VECTOR = "rl:cache:c:"  # answer key → the cached question's vector in the stronger model


def load_model(cfg: CacheConfig, threads: int = 1) -> Embedder | None:
    """The configured stronger embedder (blocking, ~3 s; the first time also assembles
    the bundled one), or None when the check is off or its model is not there (logged)."""
    if not cfg.confirm:
        return None
    try:
        return load_sentence_model(cfg.confirm_path or str(mpnet_path()), threads)
    except Exception as exc:
        log.warning("semantic cache: borderline check off, hits need similarity %.2f as "
                    "without it (the stronger embedder did not load: %s)",
                    cfg.similarity_threshold, exc)
        return None


class Confirmer:
    def __init__(self, embedder: Embedder, store: Store, lookup_pool: Executor,
                 ttl: float | None) -> None:
        """`lookup_pool`: the thread the question asked is embedded on (the cache's own, so a
        lookup's two embeddings run back to back); inserts get a thread of their own."""
        self.embedder, self.store, self.ttl = embedder, store, ttl
        self._lookup_pool = lookup_pool
        self._put_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cache-confirm")

    def close(self) -> None:
        self._put_pool.shutdown(wait=False, cancel_futures=True)

    async def _encode(self, texts: list[str], pool: Executor) -> np.ndarray:
        embedder = self.embedder
        rows = await asyncio.get_running_loop().run_in_executor(pool, lambda: embedder.encode(texts))
        return np.asarray(rows, dtype=np.float32)  # [len(texts), dim], unit rows

    async def embed_question(self, text: str) -> np.ndarray:
        rows = await self._encode([text], self._lookup_pool)
        return np.asarray(rows[0], dtype=np.float32)

    async def similarity(self, question: np.ndarray, key: str, entry_question: str) -> float:
        """Cosine of the question asked (its vector in this model) and a cached entry's."""
        vector = await self._vector(key)
        if vector is None:  # stored before the model loaded, or by a replica without it
            vector = (await self._encode([entry_question], self._lookup_pool))[0]
            await self._keep(key, vector)
        return float(question @ vector)

    async def remember(self, key: str, question: str) -> None:
        vector = (await self._encode([question], self._put_pool))[0]
        await self._keep(key, vector)

    async def forget(self, key: str) -> None:
        await self.store.delete(VECTOR + key)

    async def _vector(self, key: str) -> np.ndarray | None:
        try:
            raw = await self.store.get(VECTOR + key)
        except StoreUnavailable:
            return None
        if raw is None or len(raw) != 4 * self.embedder.dim:
            return None
        return np.frombuffer(raw, dtype="<f4")

    async def _keep(self, key: str, vector: np.ndarray) -> None:
        try:
            await self.store.set(VECTOR + key, np.asarray(vector, dtype="<f4").tobytes(),
                                 ttl=self.ttl)
        except StoreUnavailable as exc:
            log.warning("confirming vector not kept: %s", exc.message)
