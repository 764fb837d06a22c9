"""Issue 23's tier-priority figure: tier-S TTFT p99 with a first-come-first-served
engine and with tier priority (S prefilled first, B preempted for S and continued later),
on the same seeded schedule, in the same run, with the number shed in each.

    .venv/bin/python bench/engine_priority.py                     # 300 requests
    .venv/bin/python bench/engine_priority.py --requests 24       # a quick check

The schedule: `--requests` requests, tiers S/A/B drawn 30/40/30 % (seeded), Poisson
arrivals at `--load` (1.5) times the engine's capacity, which is measured first: the
completions per second of the same mix at concurrency n_seq_max. Answers: S up to 32
tokens, A 96, B 192 (greedy, no early stop). Admission is redline's own (routing/
admission.py with the default limits: B shed first, then A, then S), so "shed" counts
what a server would answer 503. The engine is called in process (no HTTP).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redline.bench.cli import QUESTIONS  # noqa: E402
from redline.bench.report import percentile  # noqa: E402
from redline.config import RoutingConfig  # noqa: E402
from redline.engine.engine import Engine  # noqa: E402
from redline.engine.llama import LlamaModel  # noqa: E402
from redline.errors import Overloaded  # noqa: E402
from redline.models import bundled_path, served_path  # noqa: E402
from redline.routing.admission import Admission  # noqa: E402
from redline.types import Message, SamplingParams  # noqa: E402

MAX_TOKENS = {"S": 32, "A": 96, "B": 192}
SHARE = (("S", 0.3), ("A", 0.4), ("B", 0.3))


def schedule(n: int, rate: float, seed: int) -> list[tuple[float, str, str]]:
    """(arrival offset s, tier, question): the same for every policy."""
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        t += rng.expovariate(rate)
        x, tier = rng.random(), "B"
        for name, share in SHARE:
            if x < share:
                tier = name
                break
            x -= share
        out.append((t, tier, rng.choice(QUESTIONS)))
    return out


def admission() -> Admission:
    cfg = RoutingConfig()
    return Admission(cfg.max_inflight, {t: b.max_inflight for t, b in cfg.tiers.items()},
                     {str(t): f for t, f in cfg.shed_at.items()})


async def serve(engine: Engine, tokens: list[int], tier: str,
                scale: float = 1.0) -> tuple[float, float]:
    """(TTFT, total) seconds."""
    t0 = time.perf_counter()
    ttft = None
    sampling = SamplingParams(max_tokens=max(1, int(MAX_TOKENS[tier] * scale)),
                              temperature=0.0, ignore_eos=True)
    async for chunk in engine.generate(tokens, sampling, tier=tier):
        if ttft is None and chunk.tokens:
            ttft = time.perf_counter() - t0
    return (ttft or time.perf_counter() - t0), time.perf_counter() - t0


async def capacity(engine: Engine, prompts: dict[str, list[int]], n_seq: int, n: int,
                   scale: float) -> float:
    """Completions per second of the mix, `n_seq` at a time."""
    plan = schedule(n, 1.0, seed=99)
    queue = list(plan)
    t0 = time.perf_counter()

    async def worker() -> None:
        while queue:
            _, tier, q = queue.pop()
            await serve(engine, prompts[q], tier, scale)

    await asyncio.gather(*(worker() for _ in range(n_seq)))
    return n / (time.perf_counter() - t0)


async def run(engine: Engine, prompts: dict[str, list[int]],
              plan: list[tuple[float, str, str]], scale: float) -> dict[str, object]:
    adm = admission()
    ttft: dict[str, list[float]] = {"S": [], "A": [], "B": []}
    start = time.perf_counter()
    preempted0 = engine.scheduler.preemptions

    async def one(at: float, tier: str, q: str) -> None:
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        try:
            adm.admit(tier)
        except Overloaded:
            return
        try:
            first, _ = await serve(engine, prompts[q], tier, scale)
            ttft[tier].append(first)
        finally:
            adm.release(tier)

    await asyncio.gather(*(one(*item) for item in plan))
    return {"ttft": ttft, "shed": dict(adm.shed), "wall": time.perf_counter() - start,
            "preemptions": engine.scheduler.preemptions - preempted0}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--load", type=float, default=1.5, help="arrival rate / capacity")
    ap.add_argument("--seed", type=int, default=23)
    ap.add_argument("--n-seq", type=int, default=8)
    ap.add_argument("--calibrate", type=int, default=16, help="requests to measure capacity")
    ap.add_argument("--answer-scale", type=float, default=1.0,
                    help="answers' lengths times this (a quick check: 0.25)")
    ap.add_argument("--weights", default="auto")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    path = served_path(bundled_path("smollm2-135m-instruct", ROOT / ".redline" / "models"),
                       args.weights)
    model = LlamaModel(str(path))
    engine = Engine(model, n_ctx_per_seq=1024, n_seq_max=args.n_seq, n_batch=512,
                    n_threads=args.threads)
    prompts = {q: model.tokenize(model.render_chat((Message("user", q),)), add_special=False)
               for q in QUESTIONS}
    results = {}
    try:
        cap = await capacity(engine, prompts, args.n_seq, args.calibrate, args.answer_scale)
        plan = schedule(args.requests, args.load * cap, args.seed)
        print(f"capacity {cap:.2f} req/s; arrivals at {args.load * cap:.2f} req/s", file=sys.stderr)
        for policy in ("fcfs", "priority"):
            engine.scheduler.tiers = policy == "priority"
            results[policy] = await run(engine, prompts, plan, args.answer_scale)
            print(f"{policy}: done in {results[policy]['wall']:.0f} s", file=sys.stderr)
    finally:
        engine.close()
        model.close()
    counts = {t: sum(1 for _, tier, _ in plan if tier == t) for t in "SAB"}
    print(f"\n{args.requests} requests (S/A/B {counts['S']}/{counts['A']}/{counts['B']}, seed "
          f"{args.seed}) at {args.load}x capacity ({cap:.2f} req/s measured), {path.name}, "
          f"n_seq_max {args.n_seq}, answers x{args.answer_scale}\n")
    print("| engine policy | tier-S TTFT p50 | tier-S TTFT p99 | tier-A TTFT p99 | tier-B TTFT p99 "
          "| shed S/A/B | preemptions |")
    print("|---|---|---|---|---|---|---|")
    for policy, r in results.items():
        t, shed = r["ttft"], r["shed"]
        assert isinstance(t, dict) and isinstance(shed, dict)
        print(f"| {policy} | {percentile(t['S'], 50):.2f} s | {percentile(t['S'], 99):.2f} s | "
              f"{percentile(t['A'], 99):.2f} s | {percentile(t['B'], 99):.2f} s | "
              f"{shed.get('S', 0)}/{shed.get('A', 0)}/{shed.get('B', 0)} | {r['preemptions']} |")


if __name__ == "__main__":
    asyncio.run(main())
