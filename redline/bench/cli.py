"""`redline bench`: measure one or more OpenAI-compatible targets, interleaved, in one run.

    redline bench --target redline=http://127.0.0.1:8000 \\
                  --target llamacpp=http://127.0.0.1:8001,model=smollm2 \\
                  --concurrency 1,4,8 --requests 32 --max-tokens 64 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from redline.bench.loadgen import Body, RunResult, Sample, Target, run_closed, run_poisson
from redline.bench.report import summarize, table

QUESTIONS = (
    "Explain how a refrigerator keeps food cold.",
    "Write a short story about a lighthouse keeper.",
    "What are the main causes of inflation?",
    "Describe the water cycle to a ten-year-old.",
    "List some tips for a good night's sleep.",
    "How does a bicycle stay upright when moving?",
    "Summarize the plot of a heist movie you invent.",
    "Why is the sky blue during the day?",
)


def parse_target(spec: str, default_model: str) -> Target:
    """`name=url[,model=M][,key=K][,extra={json}]`"""
    name, _, rest = spec.partition("=")
    if not rest:
        name, rest = "target", spec
    parts = rest.split(",")
    url, opts = parts[0].rstrip("/"), dict(p.split("=", 1) for p in parts[1:])
    extra = json.loads(opts["extra"]) if "extra" in opts else {}
    return Target(name, url, opts.get("model", default_model), opts.get("key"), extra)


def system_prompt(n_words: int) -> str:
    base = ("You are a careful support assistant for Acme Cloud. Answer briefly and precisely, "
            "cite the relevant policy section, never invent prices, and escalate billing disputes. ")
    words = base.split()
    return " ".join(words[i % len(words)] for i in range(n_words))


def make_bodies(args: argparse.Namespace) -> Callable[[int], Body]:
    system = system_prompt(args.system_words) if args.system_words else None

    def body(i: int) -> Body:
        question = args.prompt or QUESTIONS[i % len(QUESTIONS)]
        if args.unique:
            question = f"(request {i}) {question}"
        messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
        if system:
            messages.insert(0, {"role": "system", "content": system})
        out: Body = {"messages": messages, "max_tokens": args.max_tokens,
                     "temperature": args.temperature}
        if args.ignore_eos:
            out["ignore_eos"] = True
        return out

    return body


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", action="append", default=[],
                   help="name=url[,model=M][,key=K][,extra={json}]; repeat to compare")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--concurrency", default="1,4,8", help="comma list of closed-loop levels")
    p.add_argument("--rate", type=float, help="open loop: Poisson arrivals per second instead")
    p.add_argument("--requests", type=int, default=16, help="requests per target and load level")
    p.add_argument("--rounds", type=int, default=1, help="repeat, alternating target order")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly max tokens")
    p.add_argument("--prompt", help="one fixed user question")
    p.add_argument("--unique", action="store_true", default=True,
                   help="make every prompt unique (no cache hits)")
    p.add_argument("--system-words", type=int, default=0, help="shared system prompt length")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured requests per target first")
    p.add_argument("--json", help="write all summaries here")


async def _bench(args: argparse.Namespace) -> list[RunResult]:
    targets = [parse_target(t, args.model) for t in args.target] or [
        Target("redline", "http://127.0.0.1:8000", args.model)]
    body = make_bodies(args)
    for t in targets:
        if args.warmup:
            await run_closed(t, body, 1, args.warmup)
    results: list[RunResult] = []
    levels = [int(c) for c in str(args.concurrency).split(",")] if args.rate is None else [0]
    for r in range(args.rounds):
        for level in levels:
            order = targets if r % 2 == 0 else list(reversed(targets))
            for t in order:
                load = f"rate {args.rate}/s" if args.rate is not None else f"c={level}"
                label = f"round {r + 1}/{args.rounds} {t.name} {load}"
                seen: list[Sample] = []
                ticker = asyncio.create_task(progress(label, seen, args.requests))
                try:
                    if args.rate is not None:
                        res = await run_poisson(t, body, args.rate, args.requests, seed=r,
                                                samples=seen)
                    else:
                        res = await run_closed(t, body, level, args.requests, samples=seen)
                finally:
                    ticker.cancel()
                results.append(res)
                print(f"  {label}: done", file=sys.stderr)
    return results


async def progress(label: str, seen: list[Sample], total: int, tick_s: float = 1.0) -> None:
    """What a run has done so far, on stderr: every tick on a terminal (one line,
    rewritten), every 10 ticks into a log."""
    tty = sys.stderr.isatty()
    start = time.perf_counter()
    ticks = 0
    while True:
        await asyncio.sleep(tick_s)
        ticks += 1
        if not tty and ticks % 10:
            continue
        failed = sum(1 for x in seen if not x.ok)
        line = (f"  {label}: {len(seen)}/{total} done, {failed} failed, "
                f"{time.perf_counter() - start:.0f} s")
        sys.stderr.write(f"\r{line}   " if tty else f"{line}\n")
        sys.stderr.flush()


def merge(results: list[RunResult]) -> list[RunResult]:
    """Pool the rounds of each (target, load)."""
    merged: dict[tuple[str, int, float | None], RunResult] = {}
    for r in results:
        key = (r.target, r.concurrency, r.rate)
        if key in merged:
            m = merged[key]
            merged[key] = RunResult(r.target, r.concurrency, r.rate, m.wall_s + r.wall_s,
                                    m.samples + r.samples)
        else:
            merged[key] = r
    return list(merged.values())


def run(args: argparse.Namespace) -> int:
    results = merge(asyncio.run(_bench(args)))
    summaries = [summarize(r) for r in results]
    print(table(summaries))
    failures = [s.error for r in results for s in r.samples if not s.ok]
    if failures:
        print(f"\n{len(failures)} failed; first: {failures[0]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([s.__dict__ for s in summaries], f, indent=2)
    return 0
