"""Process-wide tuning, done once by `redline serve` (and `redline worker`) for the
process it runs, never by the app factory: an application that embeds redline, and every
test that builds an app, keeps its own process settings.

- BLAS (and through `server.library_threads`, torch) kept to one thread next to a local
  engine. llama.cpp's threads hold every core and wait for each other at each step:
  OpenBLAS's workers busy-wait after every call (one semantic-index search every 100 ms
  cut the engine's batched decoding from ~240 to ~90 tok/s on 2 cores), and torch's
  OpenMP team made llama.cpp's threads sleep at barriers (-15 %). One thread each costs
  little: ~16 instead of ~12 ms to embed a question.
- The garbage collector: what startup made (models, embedder, routes) lives as long as
  the process, so once the models are loaded it is frozen out of the collector's sight
  (a full collection no longer walks it: pauses of tens of ms at the tail while streams
  run; vLLM and SGLang do the same after warm-up), and the young generation is 20,000
  objects instead of 700: a request or a relayed token allocates hundreds, so at 700 a
  collection ran every ~18 requests at 64 streams and traversed the in-flight requests'
  live objects each time, ~0.1 ms of the loop per request. Paired A/B at 64 streams:
  TTFT p50 -0.18 ms, p90 -0.64 ms (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os

from redline.api.services import library_threads
from redline.config import RedlineConfig

log = logging.getLogger(__name__)

YOUNG_GENERATION = 20_000


def tune_threads(config: RedlineConfig) -> int:
    """Limit BLAS to `library_threads(config)` threads, process-wide and kept."""
    threads = library_threads(config.server.library_threads, [m.backend for m in config.models])
    if threads:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads, user_api="blas")  # process-wide, kept (not a context)
        os.environ["OPENBLAS_NUM_THREADS"] = str(threads)  # a copy loaded later (scipy's)
    return threads


def tune_collector() -> None:
    """Freeze what exists now (call it once startup is done) and widen the young
    generation (see the module's docstring)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_GENERATION, *gc.get_threshold()[1:])


async def tune_collector_when(ready: asyncio.Event) -> None:
    """tune_collector() once `ready` is set (the models are loaded)."""
    await ready.wait()
    tune_collector()
    log.debug("collector tuned: %d objects frozen", gc.get_freeze_count())


__all__ = ["tune_collector", "tune_collector_when", "tune_threads"]
