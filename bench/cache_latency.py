"""Cache latency over HTTP on the bundled model, side by side in one run:
a miss (the model answers), an exact hit and a semantic hit (embedding included).

    flock /tmp/redline-cpu.lock python bench/cache_latency.py [--misses 12] [--hits 300]

Starts `redline serve` on a free port with SmolLM2-135M, a SQLite store in a temp dir
and the default cache settings; requests are sequential, non-streaming, temperature 0,
on one keep-alive connection. Prints a Markdown table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import httpx
from routing_common import Procs  # bench/ is on the path

MODEL = "smollm2-135m-instruct"

QUESTIONS = [
    ("How do I reset my password?", "How can I reset my password?"),
    ("Where is my order?", "Can you tell me where my order is?"),
    ("How do I cancel my subscription?", "How can I cancel my subscription?"),
    ("What is your return policy?", "Can you explain your return policy?"),
    ("How long does shipping take?", "How long will shipping take?"),
    ("How do I change my email address?", "How can I change the email address on my account?"),
    ("Why was my card declined?", "Why did my card get declined?"),
    ("How do I track my package?", "How can I track my package?"),
    ("How do I delete my account?", "How can I delete my account?"),
    ("Can I get a refund?", "Is it possible to get a refund?"),
    ("What is the capital of France?", "Which city is the capital of France?"),
    ("How do I reverse a list in Python?", "How can I reverse a list in Python?"),
    ("Why is the sky blue?", "What makes the sky blue?"),
    ("How do I download my invoice?", "Where can I download my invoice?"),
    ("Do you ship internationally?", "Do you offer international shipping?"),
    ("How do I upgrade my plan?", "How can I upgrade my plan?"),
]


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def ask(client: httpx.Client, text: str, max_tokens: int) -> tuple[float, str, str]:
    body = {"model": MODEL, "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": text}]}
    t0 = time.perf_counter()
    r = client.post("/v1/chat/completions", json=body)
    dt = time.perf_counter() - t0
    r.raise_for_status()
    return dt, r.headers.get("x-redline-cache", "?"), r.headers.get("server-timing", "")


def summary(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "p50_ms": statistics.median(xs) * 1000, "p99_ms": pct(xs, 99) * 1000,
            "mean_ms": statistics.fmean(xs) * 1000}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--misses", type=int, default=len(QUESTIONS))
    ap.add_argument("--hits", type=int, default=300, help="exact hits to time")
    ap.add_argument("--semantic", type=int, default=150, help="semantic lookups to time")
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    qs = QUESTIONS[: args.misses]
    procs = Procs()
    try:
        try:
            url = procs.serve({"models": [{"name": MODEL, "bundled": MODEL, "n_seq_max": 4}]},
                              timeout=300)
        except TimeoutError as exc:
            print(exc)
            return 1
        with httpx.Client(base_url=url, timeout=120) as client:
            ask(client, "warm up the connection", 4)
            miss: list[float] = []
            exact: list[float] = []
            sem: list[float] = []
            sem_other: dict[str, Any] = {}
            for q, _ in qs:
                dt, result, _ = ask(client, q, args.max_tokens)
                if result == "miss":
                    miss.append(dt)
            time.sleep(0.5)  # answers are stored just after each response
            for i in range(args.hits):
                dt, result, _ = ask(client, qs[i % len(qs)][0], args.max_tokens)
                if result == "hit":
                    exact.append(dt)
            for i in range(args.semantic):
                dt, result, _ = ask(client, qs[i % len(qs)][1], args.max_tokens)
                if result == "semantic":
                    sem.append(dt)
                else:
                    sem_other[result] = sem_other.get(result, 0) + 1
    finally:
        procs.stop()
    out = {"miss": summary(miss), "exact_hit": summary(exact), "semantic_hit": summary(sem),
           "semantic_not_hit": sem_other, "max_tokens": args.max_tokens}
    if miss and exact:
        out["exact_speedup_p50"] = statistics.median(miss) / statistics.median(exact)
    print("| path | n | p50 ms | p99 ms |\n|---|---|---|---|")
    for name in ("miss", "exact_hit", "semantic_hit"):
        s = out[name]
        if s["n"]:
            print(f"| {name} | {s['n']} | {s['p50_ms']:.2f} | {s['p99_ms']:.2f} |")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
