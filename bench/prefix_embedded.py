"""TTFT of prefix-aware vs least-loaded placement on two embedded-engine replicas (issue
25's first figure).

Two engines of the bundled SmolLM2-135M in this process (one thread each, `n_seq_max` 8),
one pool, redline's router in front (no HTTP: the figure is about placement, not the
server). 16 tenants, each with its own system prompt of about `--system-tokens` tokens;
their requests are interleaved (a seeded shuffle) and sent `--concurrency` at a time, each
asking `--max-tokens` tokens. The same requests run once per policy, on fresh engines.
Reported per policy: TTFT p50 and p99 (router.open until the first chunk), output tok/s
over the whole run, the share of prompt tokens the engines took from their prefix caches
(usage's `cached_tokens`), and the busiest replica's share of requests against the mean.

Needs a quiet machine for its timings; run small where it is not:
    .venv/bin/python bench/prefix_embedded.py --requests 48 --concurrency 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

from redline.backends.base import Backend
from redline.backends.local import LocalBackend
from redline.backends.placement import Policy
from redline.backends.pool import PoolBackend
from redline.config import ModelConfig, RoutingConfig
from redline.routing.router import Router
from redline.telemetry.metrics import Metrics
from redline.types import Chunk, GenerationRequest, Message, SamplingParams

WORDS = ("policy account service region billing support ticket customer order refund "
         "shipping invoice product warranty contract delivery schedule payment balance "
         "report manager escalate priority answer politely briefly always never").split()


class Counted:
    """A replica that counts the requests sent to it (the bench's load figure)."""

    def __init__(self, inner: LocalBackend) -> None:
        self.inner = inner
        self.info = inner.info
        self.requests = 0

    def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        self.requests += 1
        return self.inner.stream(request)

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    def load(self) -> int:
        return self.inner.load()


def system_prompt(tenant: int, tokens: int) -> str:
    rng = random.Random(tenant)
    # ~1.3 tokens a word for these words in SmolLM2's tokenizer
    words = [rng.choice(WORDS) for _ in range(int(tokens / 1.3))]
    return f"You are the assistant of company {tenant}. " + " ".join(words)


def workload(n: int, tenants: int, system_tokens: int, max_tokens: int) -> list[GenerationRequest]:
    rng = random.Random(0)
    order = [i % tenants for i in range(n)]
    rng.shuffle(order)
    return [GenerationRequest(model="m", tier="A", sampling=SamplingParams(max_tokens=max_tokens,
                                                                           temperature=0.0),
                              messages=(Message("system", system_prompt(t, system_tokens)),
                                        Message("user", f"Question {i}: where is my order?")))
            for i, t in enumerate(order)]


async def run(policy: Policy, requests: list[GenerationRequest], concurrency: int,
              models_dir: Path, cache_tokens: int | None = None,
              placement: dict[str, float] | None = None,
              host_cache_mb: int | None = None) -> dict[str, Any]:
    cfg = ModelConfig.model_validate({"name": "m", "bundled": "smollm2-135m-instruct", "n_threads": 1,
                                      "n_seq_max": 8, "n_ctx": 2048, "replicas": 2,
                                      "prefix_cache_tokens": cache_tokens,
                                      **({} if host_cache_mb is None else {"host_cache_mb": host_cache_mb}),
                                      "placement": {"policy": policy, **(placement or {})}})
    replicas = [Counted(LocalBackend(cfg, models_dir)) for _ in range(cfg.replicas)]
    pool = PoolBackend("m", cast(list[Backend], replicas), cfg.placement, cfg.cache_blocks(),
                       cfg.load_cost_tokens())
    routing = RoutingConfig.model_validate({"classifier": "off", "hedge": False})
    router = Router({"m": pool}, "m", routing, Metrics())
    await pool.start()
    await router.start()
    ttfts: list[float] = []
    tokens = 0
    prompt_tokens = cached_tokens = 0
    queue = list(requests)

    async def client() -> None:
        nonlocal tokens, prompt_tokens, cached_tokens
        while queue:
            req = queue.pop(0)
            t0 = time.perf_counter()
            got = await router.open(router.plan(req))
            ttfts.append(time.perf_counter() - t0)
            tokens += got.first.tokens
            async for chunk in got.rest:
                tokens += chunk.tokens
                if chunk.usage is not None:
                    prompt_tokens += chunk.usage.prompt_tokens
                    cached_tokens += chunk.usage.cached_tokens or 0

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    await pool.close()
    counts = [r.requests for r in replicas]
    ttfts.sort()
    return {"policy": policy, "requests": len(requests), "host_cache_mb": cfg.host_cache_mb,
            "load_cost_tokens": cfg.load_cost_tokens(),
            "ttft_p50_s": round(ttfts[len(ttfts) // 2], 3),
            "ttft_p99_s": round(ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))], 3),
            "tok_per_s": round(tokens / wall, 1),
            "prefix_hit": round(cached_tokens / max(1, prompt_tokens), 3),
            "busiest_over_mean": round(max(counts) / statistics.fmean(counts), 3),
            "per_replica": counts}


async def amain() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=160)
    p.add_argument("--tenants", type=int, default=16)
    p.add_argument("--system-tokens", type=int, default=600)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--models-dir", default=".redline/models")
    p.add_argument("--policies", nargs="*", default=["prefix", "least_loaded"])
    p.add_argument("--prefix-cache-tokens", type=int, default=None,
                   help="models[].prefix_cache_tokens for both policies (default: n_ctx)")
    p.add_argument("--host-cache-mb", type=int, default=None,
                   help="models[].host_cache_mb for both policies (0: off; default: the config's)")
    p.add_argument("--load-bound", type=float, default=None, help="placement.load_bound")
    p.add_argument("--load-cost-tokens", type=float, default=None, help="placement.load_cost_tokens")
    a = p.parse_args()
    knobs = {k: v for k, v in (("load_bound", a.load_bound), ("load_cost_tokens", a.load_cost_tokens))
             if v is not None}
    requests = workload(a.requests, a.tenants, a.system_tokens, a.max_tokens)
    for policy in a.policies:
        print(json.dumps(await run(cast(Policy, policy), requests, a.concurrency, Path(a.models_dir),
                                   a.prefix_cache_tokens, knobs, a.host_cache_mb)),
              flush=True)


if __name__ == "__main__":
    asyncio.run(amain())
