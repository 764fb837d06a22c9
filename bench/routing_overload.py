"""Tiers under overload: a mixed workload offered at 2× the large model's capacity.

Two fake upstreams with capacity limits (they queue beyond it, like an engine at its
batch limit): small (16 at once, TTFT 50 ms, 10 ms/token) and large (4 at once, TTFT
300 ms, 30 ms/token). Open-loop Poisson arrivals, 50 % tier S chat (32 tokens), 35 %
tier A generation (64), 15 % tier B reports (128), all sent as model `auto` with
X-Redline-Tier. Same run, two gateways: redline's SLO mode, and the baseline FCFS with no
tiers (every request to the large default model, first come first served).
Usage: flock /tmp/redline-cpu.lock .venv/bin/python bench/routing_overload.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_common import Procs, Result, session, stream_once, summary  # noqa: E402

from redline.routing.classifier import load_examples  # noqa: E402

LARGE = {"capacity": 4, "ttft": 0.3, "tpot": 0.03}
SMALL = {"capacity": 16, "ttft": 0.05, "tpot": 0.01}
MIX = (("S", 0.5, 32), ("A", 0.35, 64), ("B", 0.15, 128))


def large_capacity_rps() -> float:
    mean_service = sum(p * (LARGE["ttft"] + (n - 1) * LARGE["tpot"]) for _, p, n in MIX)
    return LARGE["capacity"] / mean_service


def workload(n: int, seed: int = 0) -> list[tuple[str, dict[str, object]]]:
    rng = random.Random(seed)
    texts = {t: [e.text for e in load_examples() if e.tier == t] for t in "SAB"}
    out = []
    for _ in range(n):
        tier, tokens = _pick(rng.random())
        body = {"model": "auto", "max_tokens": tokens, "temperature": 0,
                "messages": [{"role": "user", "content": rng.choice(texts[tier])}]}
        out.append((tier, body))
    return out


def _pick(x: float) -> tuple[str, int]:
    acc = 0.0
    for tier, p, tokens in MIX:
        acc += p
        if x <= acc:
            return tier, tokens
    return MIX[-1][0], MIX[-1][2]


async def open_loop(url: str, work: list[tuple[str, dict[str, object]]], rate: float,
                    seed: int = 1) -> list[Result]:
    rng = random.Random(seed)
    async with session(1000, timeout=300) as client:
        tasks = []
        for tier, body in work:
            tasks.append(asyncio.create_task(
                stream_once(client, url, body, {"X-Redline-Tier": tier}, tier)))
            await asyncio.sleep(rng.expovariate(rate))
        return list(await asyncio.gather(*tasks))


def report(res: list[Result]) -> dict[str, object]:
    out: dict[str, object] = {}
    for tier in "SAB":
        rs = [r for r in res if r.tier == tier]
        ok = [r for r in rs if r.ok]
        within = [r for r in ok if tier != "S" or (r.ttft < 1.0 and r.total < 3.0)]
        models: dict[str, int] = {}
        for r in ok:
            m = r.headers.get("x-redline-model", "?")
            models[m] = models.get(m, 0) + 1
        out[tier] = {"sent": len(rs), "answered": len(ok),
                     "shed_503": sum(r.status == 503 for r in rs),
                     "within_budget": len(within) / len(rs) if rs else None,
                     "ttft": summary([r.ttft for r in ok]), "total": summary([r.total for r in ok]),
                     "models": models}
    return out


async def run(duration: float, factor: float) -> dict[str, object]:
    procs = Procs()
    try:
        small = procs.upstream(**SMALL, seed=1)
        large = procs.upstream(**LARGE, seed=2)
        models = [{"name": "small", "backend": "openai", "url": small, "size_rank": 1},
                  {"name": "large", "backend": "openai", "url": large, "size_rank": 2}]
        rate = factor * large_capacity_rps()
        n = int(rate * duration)
        work = workload(n)
        out: dict[str, object] = {"offered_rps": rate, "large_capacity_rps": large_capacity_rps(),
                                  "requests": n}
        gateways: dict[str, dict[str, Any]] = {
            "redline_slo": ({"default_model": "large",
                             "routing": {"max_inflight": 24}}),
            "fcfs_no_tiers": ({"default_model": "large", "routing": {"mode": "fcfs"}}),
        }
        for name, extra in gateways.items():
            url = procs.gateway(models, **extra)
            res = await open_loop(url, work, rate)
            out[name] = report(res)
            await asyncio.sleep(2)  # let the upstreams drain before the next run
        return out
    finally:
        procs.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    p.add_argument("--factor", type=float, default=2.0, help="offered load / large capacity")
    a = p.parse_args()
    print(json.dumps(asyncio.run(run(a.duration, a.factor)), indent=2))


if __name__ == "__main__":
    main()
