"""The real embedder's thread setting, checked in a fresh process (torch's thread count
is process-wide and is fixed by the first load)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

PROBE = r"""
import asyncio, json, os, sys
import torch
from redline.cache.response_cache import ResponseCache
from redline.config import CacheConfig
from redline.store.memory import MemoryStore

cfg = CacheConfig(**json.loads(sys.argv[1]))
cache = ResponseCache(cfg, MemoryStore())
asyncio.run(cache.start())
vec = cache.embedder.encode(["How do I reset my password?"])
print(json.dumps({"torch_threads": torch.get_num_threads(), "dim": int(vec.shape[1]),
                  "index": cache.index is not None}))
"""


def probe(**cfg: object) -> dict:  # type: ignore[type-arg]
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cfg)], capture_output=True,
                         text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_cache_runs_torch_on_one_thread_by_default() -> None:
    """A second OpenMP team (torch's) next to llama.cpp's makes the engine's threads sleep
    at every barrier: a cache whose thread count was not resolved by the app (see the
    last test) keeps torch to one thread."""
    got = probe()
    assert got == {"torch_threads": 1, "dim": 384, "index": True}


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="torch's default is 1 thread on one core")
def test_embedder_threads_zero_leaves_torch_its_default() -> None:
    got = probe(embedder_threads=0)
    assert got["torch_threads"] > 1 and got["index"]


def test_the_app_keeps_torch_to_one_thread_only_next_to_a_local_engine(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from redline.api.app import create_app
    from redline.config import RedlineConfig

    def resolved(models: list[dict], **cache: object) -> int | None:  # type: ignore[type-arg]
        cfg = RedlineConfig(server={"data_dir": str(tmp_path)}, models=models, cache=cache)
        pipeline = create_app(cfg).state.pipeline
        # the cache and the router's embeddings classifier share the one torch setting
        assert pipeline.router.embedder_threads == pipeline.cache.cfg.embedder_threads
        return pipeline.cache.cfg.embedder_threads  # type: ignore[no-any-return]

    local = {"name": "small", "bundled": "smollm2-135m-instruct"}  # built, not loaded
    remote = {"name": "big", "backend": "openai", "url": "http://127.0.0.1:9"}
    assert resolved([local, remote]) == 1
    assert resolved([remote]) == 0  # a gateway: torch may use every core
    assert resolved([local], embedder_threads=2) == 2  # said explicitly: kept
