"""Hedged tier-S requests against an upstream whose TTFT p99 is 10× its p50.

Two replicas of one fake upstream (TTFT 100 ms ± 20 ms, 5 % of requests 1 s), behind two
gateways in the same run: hedging on and off. Reports client TTFT p50/p99 and extra
upstream requests. Usage: flock /tmp/redline-cpu.lock .venv/bin/python bench/routing_hedge.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_common import Procs, closed_loop, summary, upstream_stats  # noqa: E402


async def run(n: int, concurrency: int) -> dict[str, object]:
    procs = Procs()
    try:
        ups = [procs.upstream(ttft=0.1, ttft_jitter=0.02, slow_p=0.05, slow=1.0, tpot=0.005, seed=s)
               for s in (1, 2)]
        model = [{"name": "m", "backend": "openai", "urls": ups}]
        gws = {"hedged": procs.gateway(model, routing={"hedge": True}),
               "unhedged": procs.gateway(model, routing={"hedge": False})}
        body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        out: dict[str, object] = {}
        for name, url in gws.items():
            before = sum([(await upstream_stats(u))["requests"] for u in ups])
            await closed_loop(url, [body] * 50, concurrency, {"X-Redline-Tier": "S"})  # warm the estimates
            mid = sum([(await upstream_stats(u))["requests"] for u in ups])
            res = await closed_loop(url, [body] * n, concurrency, {"X-Redline-Tier": "S"})
            after = sum([(await upstream_stats(u))["requests"] for u in ups])
            ok = [r for r in res if r.ok]
            out[name] = {"ttft": summary([r.ttft for r in ok]), "answered": len(ok), "sent": n,
                         "upstream_requests": after - mid, "warmup_upstream": mid - before,
                         "extra_upstream": (after - mid - n) / n}
        h, u = out["hedged"], out["unhedged"]
        out["p99_ratio"] = h["ttft"]["p99"] / u["ttft"]["p99"]  # type: ignore[index]
        out["unhedged_p99_over_p50"] = u["ttft"]["p99"] / u["ttft"]["p50"]  # type: ignore[index]
        return out
    finally:
        procs.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, default=1000)
    p.add_argument("-c", "--concurrency", type=int, default=8)
    a = p.parse_args()
    print(json.dumps(asyncio.run(run(a.n, a.concurrency)), indent=2))


if __name__ == "__main__":
    main()
