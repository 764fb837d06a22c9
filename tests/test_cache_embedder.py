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
    at every barrier: the cache's embedder keeps torch to one thread unless told otherwise."""
    got = probe()
    assert got == {"torch_threads": 1, "dim": 384, "index": True}


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="torch's default is 1 thread on one core")
def test_embedder_threads_zero_leaves_torch_its_default() -> None:
    got = probe(embedder_threads=0)
    assert got["torch_threads"] > 1 and got["index"]
