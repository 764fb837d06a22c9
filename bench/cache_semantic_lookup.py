"""Semantic-hit lookup latency at a cache of N entries, in process: what a semantic hit
costs past HTTP (embedding the question, the index search over N cached vectors, the
near-miss guard on the best candidates, the answer's store read).

    python bench/cache_semantic_lookup.py [--entries 10000] [--queries 300] [--decode-streams 8]

Fills a ResponseCache (memory store, default settings, the bundled all-MiniLM-L6-v2 on one
torch thread) with N answers: the tuning part's questions, then made-up ones, their vectors
taken from the embedder for the real questions and random unit vectors for the rest (embedding
10,000 questions would take minutes; search cost depends on N, not on the vectors). Then
asks paraphrases of cached questions one at a time and times `lookup()`. Prints p50/p99
over all lookups and over the semantic hits alone.

The lookup is the served one, verification stage included: the cache runs with the error
budget on (`cache.shadow_sample` as configured), so each candidate's entry bar is read and a
hit may be sampled for a check. `--decode-streams N` starts the bundled SmolLM2-135M in the
same process (as `redline serve` runs it: torch and BLAS on one thread) and keeps N greedy
streams decoding for the whole measurement (each restarted when it ends); the shadow checks
then wait for an idle engine, which never comes, as on a busy server. Quiet-machine command
for the issue's two figures:

    python bench/cache_semantic_lookup.py --entries 10000 --queries 300
    python bench/cache_semantic_lookup.py --entries 10000 --queries 300 --decode-streams 8

`--confirm` turns the borderline check on (cache/confirm.py, all-mpnet-base-v2; the real
entries' mpnet vectors are stored as an insert would) and times each path apart: fast hits
(MiniLM over the threshold), confirmed hits, and misses that paid for the check.
`--borderline` asks only the paraphrases whose MiniLM similarity to their cached question is
in the checked band (cycled up to --queries), for a p99 of the confirmed path with enough
samples.

`--dtypes` (default `float32,auto`): the embedder's arithmetic, one run each in this
process, the configured default (`cache.embedder_dtype: auto`, BF16 on a CPU with
AVX512-BF16) next to float32. Each runs the traced graph, as the server's cache does;
`auto:untraced` runs sentence-transformers' own `encode` instead (as before the graph).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import numpy as np

from redline.backends.base import Backend
from redline.cache.confirm import load_model
from redline.cache.embedder import Embedder, load_minilm, resolve_dtype
from redline.cache.evaluate import TUNE_PAIRS, load_pairs
from redline.cache.keys import cache_keys
from redline.cache.response_cache import ENTRY, CachedAnswer, ResponseCache
from redline.config import CacheConfig
from redline.store.memory import MemoryStore
from redline.types import GenerationRequest, Message, SamplingParams


def request(text: str) -> GenerationRequest:
    return GenerationRequest(model="m", sampling=SamplingParams(temperature=0.0), tenant="t",
                             messages=(Message("user", text),))


MODEL = "smollm2-135m-instruct"


def engine() -> Backend:
    """The bundled small model as `redline serve` builds it, in this process."""
    from redline.api.services import build_backend
    from redline.config import ModelConfig, RedlineConfig
    from redline.engine.arbiter import StepArbiter
    from redline.tuning import tune_threads

    cfg = RedlineConfig(models=[ModelConfig(name=MODEL, bundled=MODEL, n_seq_max=8)])
    tune_threads(cfg)  # BLAS on one thread, as serve does (the embedder is on one already)
    return build_backend(cfg.models[0], cfg.data_path("models", ".keep").parent, StepArbiter())


async def decode_forever(backend: Backend, i: int, stop: asyncio.Event,
                         tokens: list[int]) -> None:
    req = GenerationRequest(model=MODEL, sampling=SamplingParams(temperature=0.0, max_tokens=256),
                            messages=(Message("user", f"Write a long story about ship {i}."),))
    while not stop.is_set():
        async for chunk in backend.stream(req):
            tokens[0] += chunk.tokens
            if stop.is_set():
                break


class Counting:
    """The check's embedder, counting its calls (which lookups paid for it)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner, self.dim, self.calls = inner, inner.dim, 0

    def encode(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        return self.inner.encode(texts)


async def main(entries: int, queries: int, streams: int = 0, confirm: bool = False,
               borderline: bool = False, dtype: str = "auto") -> dict[str, object]:
    # "<dtype>:untraced": sentence-transformers' own encode (before the traced graph)
    dtype, _, how = dtype.partition(":")
    traced = how != "untraced"
    dtype = resolve_dtype(dtype)
    cfg = CacheConfig(max_entries=entries, confirm=confirm, embedder_dtype=dtype)  # type: ignore[arg-type]  # float32 | bfloat16
    backend = engine() if streams else None
    backends: dict[str, Backend] = {MODEL: backend} if backend is not None else {}
    strong = load_model(cfg, 1) if confirm else None
    if confirm and strong is None:
        raise SystemExit("--confirm: all-mpnet-base-v2 is not installed (make install)")
    counting = Counting(strong) if strong is not None else None
    cache = ResponseCache(cfg, MemoryStore(), embedder=load_minilm(None, 1, dtype, traced), backends=backends,
                          confirm_embedder=counting)
    await cache.start()
    assert cache.index is not None
    pairs = [p for path in TUNE_PAIRS for p in load_pairs(path) if p.same]
    real = sorted({p.a for p in pairs})
    vectors = dict(zip(real, load_minilm(None, 1, dtype, traced).encode(real), strict=True))
    strong_vectors = dict(zip(real, strong.encode(real), strict=True)) if strong else {}
    rng = np.random.default_rng(0)
    for i in range(entries):
        text = real[i] if i < len(real) else f"made-up question number {i}"
        if text in vectors:
            v = vectors[text]
        else:
            v = rng.standard_normal(cache.index.dim).astype(np.float32)
            v /= np.linalg.norm(v)
        keys = cache_keys(request(text), "m")
        answer = CachedAnswer("m", f"answer {i}", "stop", 5, 3, text, time.time())
        await cache.store.set(ENTRY + keys.exact, answer.to_bytes(), ttl=None)
        assert keys.partition is not None
        await cache.index.add(keys.partition, keys.exact, text, v, ttl=None)
        if cache.confirmer is not None and text in strong_vectors:
            await cache.confirmer._keep(keys.exact, strong_vectors[text])  # as put() would
    asks = [p.b for p in pairs]
    if borderline:
        b_vectors = load_minilm(None, 1, dtype, traced).encode(asks)
        asks = [q for q, p, v in zip(asks, pairs, b_vectors, strict=True)
                if cfg.confirm_floor <= float(vectors[p.a] @ v) < cfg.similarity_threshold]
    asks = [asks[i % len(asks)] for i in range(queries)]
    await cache.lookup(request(asks[0]))  # warm: reads the partition into the matrix once
    stop, decoded, load = asyncio.Event(), [0], []
    if backend is not None:
        await backend.start()
        load = [asyncio.create_task(decode_forever(backend, i, stop, decoded))
                for i in range(streams)]
        while backend.load() < streams or decoded[0] < 8 * streams:  # all decoding
            await asyncio.sleep(0.05)
    t_start, tokens_at_start = time.perf_counter(), decoded[0]
    all_ms, hit_ms = [], []
    paths: dict[str, list[float]] = {"fast_hit": [], "confirmed_hit": [], "checked_miss": [],
                                     "miss": []}
    for q in asks:
        calls = counting.calls if counting is not None else 0
        t0 = time.perf_counter()
        out = await cache.lookup(request(q))
        ms = (time.perf_counter() - t0) * 1000
        all_ms.append(ms)
        checked = counting is not None and counting.calls > calls
        if out.result == "semantic":
            hit_ms.append(ms)
            paths["confirmed_hit" if checked else "fast_hit"].append(ms)
        else:
            paths["checked_miss" if checked else "miss"].append(ms)
        await asyncio.sleep(0.005)  # think time: the streams decode between lookups
    tok_s = (decoded[0] - tokens_at_start) / (time.perf_counter() - t_start)
    stop.set()
    await asyncio.gather(*load, return_exceptions=True)
    if backend is not None:
        await backend.close()
    await cache.close()

    def pct(xs: list[float], q: float) -> float:
        return float(np.percentile(xs, q)) if xs else float("nan")

    return {"entries": entries, "lookups": len(all_ms), "semantic_hits": len(hit_ms),
            "all_p50_ms": round(statistics.median(all_ms), 2), "all_p99_ms": round(pct(all_ms, 99), 2),
            "hit_p50_ms": round(pct(hit_ms, 50), 2), "hit_p99_ms": round(pct(hit_ms, 99), 2),
            "confirm": confirm, "borderline_only": borderline, "embedder_dtype": dtype, "traced": traced,
            "paths": {k: {"n": len(v), "p50_ms": round(pct(v, 50), 2), "p99_ms": round(pct(v, 99), 2)}
                      for k, v in paths.items() if v},
            "decode_streams": streams, "decode_tok_s": round(tok_s, 1)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--entries", type=int, default=10000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--decode-streams", type=int, default=0,
                    help="greedy streams the bundled SmolLM2-135M decodes meanwhile, in process")
    ap.add_argument("--confirm", action="store_true", help="the borderline check on (mpnet)")
    ap.add_argument("--borderline", action="store_true",
                    help="ask only paraphrases in the checked band (with --confirm)")
    ap.add_argument("--dtypes", default="float32,auto",
                    help="the embedder's arithmetic, one run each (auto: as served)")
    args = ap.parse_args()
    for dtype in args.dtypes.split(","):
        print(json.dumps(asyncio.run(main(args.entries, args.queries, args.decode_streams,
                                          args.confirm, args.borderline, dtype))))
