"""Where a local model runs, torch (the MiniLM embedder) and BLAS (the semantic index) are
kept to one thread: their idle threads took cores from llama.cpp's (see
redline/tuning.py). Checked in fresh processes: both settings are process-wide and fixed
by the first use; `redline serve` sets BLAS's (tune_threads), the app factory never does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

CACHE = r"""
import asyncio, json, sys
import torch
from redline.cache.response_cache import ResponseCache
from redline.config import CacheConfig
from redline.store.memory import MemoryStore

cache = ResponseCache(CacheConfig(), MemoryStore(), **json.loads(sys.argv[1]))
asyncio.run(cache.start())
vec = cache.embedder.encode(["How do I reset my password?"])
print(json.dumps({"torch_threads": torch.get_num_threads(), "dim": int(vec.shape[1]),
                  "index": cache.index is not None}))
"""

APP = r"""
import json, sys
from threadpoolctl import threadpool_info
from redline.api.app import create_app
from redline.api.services import services_of
from redline.config import RedlineConfig
from redline.tuning import tune_threads

cfg = RedlineConfig(**json.loads(sys.argv[1]))
before = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
pipeline = services_of(create_app(cfg)).pipeline
after = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
assert after == before or not before, (before, after)  # the app factory leaves them alone
tune_threads(cfg)  # what `redline serve` does first
print(json.dumps({"cache": pipeline.cache.embedder_threads, "router": pipeline.router.embedder_threads,
                  "blas": [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]}))
"""


def run(code: str, arg: dict) -> dict:  # type: ignore[type-arg]
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(arg)], capture_output=True,
                         text=True, timeout=180, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_cache_embedder_runs_torch_on_one_thread_unless_told() -> None:
    assert run(CACHE, {}) == {"torch_threads": 1, "dim": 384, "index": True}
    if (os.cpu_count() or 1) > 1:
        assert run(CACHE, {"embedder_threads": 0})["torch_threads"] > 1


def test_serve_limits_torch_and_blas_only_next_to_a_local_engine(tmp_path) -> None:  # type: ignore[no-untyped-def]
    local = {"name": "small", "bundled": "smollm2-135m-instruct"}  # built, not loaded
    remote = {"name": "big", "backend": "openai", "url": "http://127.0.0.1:9"}
    server = {"data_dir": str(tmp_path)}
    got = run(APP, {"server": server, "models": [local, remote]})
    assert got["cache"] == got["router"] == 1 and got["blas"] and set(got["blas"]) == {1}
    gateway = run(APP, {"server": server, "models": [remote]})  # only remote models
    assert gateway["cache"] == gateway["router"] == 0
    if (os.cpu_count() or 1) > 1:
        assert min(gateway["blas"]) > 1  # left at OpenBLAS's default
    said = run(APP, {"server": {**server, "library_threads": 2}, "models": [local]})
    assert said["cache"] == said["router"] == 2 and set(said["blas"]) == {2}
