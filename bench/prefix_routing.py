"""Prefix hit rate of replica placement policies, simulated (issue 25's second figure).

16 engine replicas, each with an LRU prefix cache of 2,000 blocks of 16 tokens (chained
block hashes over its token ids, vLLM's automatic prefix caching); 500 tenants, each with
its own 1,000-token system prompt; tenant popularity Zipf(s = 1.1); 20,000 requests, each
the tenant's system prompt and a user turn of its own (20-200 tokens), answered with
20-300 tokens (cached too, as vLLM caches decoded blocks: they take room and are never
reused here). Arrivals are Poisson; a request stays on its replica for its prefill (the
uncached prompt tokens, at `--prefill-tps`) plus its decode (`--tpot` a token): that is
the in-flight load the policies see.

The gateway side is redline's own PoolBackend (backends/pool.py) with its PrefixIndex
and placement, fed the prompt as text: each token id is a vocabulary word of 2-7
letters, so the gateway's character blocks (`chars_per_token` set to the vocabulary's
mean) do not line up with the engine's token blocks, as in life. The engine's cache is
the truth the hit rate is counted on.

`--gateways k` puts k gateway replicas, each with its own pool and index and seeing only
its own in-flight requests, behind a random load balancer: whether separate indexes
converge without sharing (issue 25, part 1); with `--shared-index` they share one index
per replica instead, the best a store-kept index could do.

Deterministic (seeded): a figure of the policies, not a timing.
Usage: .venv/bin/python bench/prefix_routing.py [--requests 20000] [--gateways 1]
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
import statistics
import sys
from array import array
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, cast

from redline.backends.base import BackendInfo
from redline.backends.placement import Policy
from redline.backends.pool import PoolBackend
from redline.backends.prefix_index import PrefixIndex, chain_hashes
from redline.config import PlacementConfig
from redline.types import Chunk, GenerationRequest, Message, SamplingParams

VOCAB = 32_000


@dataclass
class Workload:
    replicas: int = 16
    cache_blocks: int = 2000
    block_tokens: int = 16
    tenants: int = 500
    system_tokens: int = 1000
    zipf_s: float = 1.1
    requests: int = 20_000
    user_tokens: tuple[int, int] = (20, 200)
    output_tokens: tuple[int, int] = (20, 300)
    prefill_tps: float = 5000.0  # uncached prompt tokens a second
    tpot: float = 0.03  # seconds an output token
    inflight_per_replica: float = 6.0  # mean load the arrival rate is set for
    seed: int = 0
    load_bound: float = 1.25  # the placement's knobs (PlacementConfig), for the prefix policy
    load_cost_tokens: float = 256.0


class SimReplica:
    """A replica as one gateway sees it: its in-flight requests (ends on the simulated
    clock). Enough of the Backend protocol for the pool to rank it."""

    def __init__(self, name: str) -> None:
        self.info = BackendInfo(name, "fake", 1 << 20)
        self.ends: list[float] = []
        self.now = 0.0

    def load(self) -> int:
        while self.ends and self.ends[0] <= self.now:
            heapq.heappop(self.ends)
        return len(self.ends)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        raise NotImplementedError("simulated: the pool only ranks it")
        yield Chunk()  # pragma: no cover

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


@dataclass
class Engine:
    """One engine replica's prefix cache (the truth) and its in-flight requests."""

    cache: PrefixIndex
    ends: list[float] = field(default_factory=list)
    requests: int = 0

    def inflight(self, now: float) -> int:
        while self.ends and self.ends[0] <= now:
            heapq.heappop(self.ends)
        return len(self.ends)


def token_blocks(tokens: array[int], block_tokens: int) -> list[bytes]:
    n = len(tokens) // block_tokens
    return chain_hashes(tokens[i * block_tokens:(i + 1) * block_tokens].tobytes() for i in range(n))


def vocabulary(rng: random.Random) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [" " + "".join(rng.choice(letters) for _ in range(rng.randint(2, 7))) for _ in range(VOCAB)]


def simulate(w: Workload, policy: Policy, gateways: int = 1, shared: bool = False) -> dict[str, Any]:
    rng = random.Random(w.seed)
    vocab = vocabulary(rng)
    chars_per_token = statistics.fmean(len(v) for v in vocab)
    systems = [array("i", (rng.randrange(VOCAB) for _ in range(w.system_tokens)))
               for _ in range(w.tenants)]
    system_texts = ["".join(vocab[t] for t in s) for s in systems]
    cum = list(itertools.accumulate(1.0 / (k + 1) ** w.zipf_s for k in range(w.tenants)))
    mean_s = ((w.system_tokens + sum(w.user_tokens) / 2) * 0.5 / w.prefill_tps
              + sum(w.output_tokens) / 2 * w.tpot)
    rate = w.replicas * w.inflight_per_replica / mean_s  # requests a second (Little's law)

    # the gateway's index mirrors the engine's cache in tokens: as many of its (character)
    # blocks as hold the engine's 2,000 x 16 tokens
    placement = PlacementConfig(policy=policy, block_tokens=w.block_tokens,
                                chars_per_token=chars_per_token, load_bound=w.load_bound,
                                load_cost_tokens=w.load_cost_tokens)
    views = [[SimReplica(f"r{i}") for i in range(w.replicas)] for _ in range(gateways)]
    pools = [PoolBackend("m", v, placement, cache_blocks=w.cache_blocks) for v in views]
    if shared:  # what an index kept in the store would give at best (no delay, no cost)
        for pool in pools[1:]:
            pool.indexes = pools[0].indexes
    engines = [Engine(PrefixIndex(w.cache_blocks)) for _ in range(w.replicas)]
    arrivals = random.Random(w.seed + 1)
    now = 0.0
    prompt_total = cached_total = ceiling = 0
    seen = [False] * w.tenants  # the ceiling: every system prompt cached after its first use
    spread: list[float] = []
    for i in range(w.requests):
        now += arrivals.expovariate(rate)
        tenant = rng.choices(range(w.tenants), cum_weights=cum)[0]
        user = array("i", (rng.randrange(VOCAB) for _ in range(rng.randint(*w.user_tokens))))
        n_out = rng.randint(*w.output_tokens)
        g = arrivals.randrange(gateways)
        for r in views[g]:
            r.now = now
        req = GenerationRequest(model="m", sampling=SamplingParams(max_tokens=n_out), id=f"r{i}",
                                messages=(Message("system", system_texts[tenant]),
                                          Message("user", "".join(vocab[t] for t in user))))
        chosen = pools[g].pick(request=req)
        assert chosen is not None
        pools[g].record(chosen, req)
        at = views[g].index(chosen)  # type: ignore[arg-type]
        engine = engines[at]
        loads = [e.inflight(now) for e in engines]
        mean = statistics.fmean(loads)
        spread.append(max(loads) / mean if mean else 1.0)
        prompt = systems[tenant] + user
        blocks = token_blocks(prompt, w.block_tokens)
        hit = engine.cache.match(blocks) * w.block_tokens
        output = array("i", (rng.randrange(VOCAB) for _ in range(n_out)))
        engine.cache.add(token_blocks(prompt + output, w.block_tokens))
        prompt_total += len(prompt)
        ceiling += len(systems[tenant]) // w.block_tokens * w.block_tokens if seen[tenant] else 0
        seen[tenant] = True
        cached_total += hit
        end = now + (len(prompt) - hit) / w.prefill_tps + n_out * w.tpot
        heapq.heappush(engine.ends, end)
        heapq.heappush(views[g][at].ends, end)
        engine.requests += 1
    per_replica = [e.requests for e in engines]
    spread.sort()
    return {
        "policy": policy, "gateways": gateways, "shared_index": shared, "requests": w.requests,
        "prefix_hit_rate": round(cached_total / prompt_total, 4),
        "requests_max_over_mean": round(max(per_replica) / statistics.fmean(per_replica), 3),
        "inflight_max_over_mean_p50": round(spread[len(spread) // 2], 3),
        "inflight_max_over_mean_p99": round(spread[int(len(spread) * 0.99)], 3),
        "arrival_rate_per_s": round(rate, 2),
        "ceiling": round(ceiling / prompt_total, 4),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--gateways", type=int, nargs="*", default=[1])
    p.add_argument("--policies", nargs="*", default=["prefix", "least_loaded", "round_robin"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shared-index", action="store_true",
                   help="the gateways share one index per replica (as if kept in the store)")
    p.add_argument("--load-bound", type=float, default=1.25)
    p.add_argument("--load-cost-tokens", type=float, default=256.0)
    a = p.parse_args()
    w = Workload(requests=a.requests, seed=a.seed, load_bound=a.load_bound,
                 load_cost_tokens=a.load_cost_tokens)
    rows = []
    for g in a.gateways:
        for policy in a.policies:
            row = simulate(w, cast(Policy, policy), g, a.shared_index and g > 1)
            rows.append(row)
            print(json.dumps(row), flush=True)
    base = {r["gateways"]: r["prefix_hit_rate"] for r in rows if r["policy"] == "least_loaded"}
    for r in rows:
        if r["policy"] == "prefix" and base.get(r["gateways"]):
            print(f"gateways={r['gateways']}: prefix-aware hit rate {r['prefix_hit_rate']:.1%} = "
                  f"{r['prefix_hit_rate'] / base[r['gateways']]:.2f}x least-loaded", file=sys.stderr)


if __name__ == "__main__":
    main()
