"""Countdown accuracy on a mixed workload.

A warm-up pass (its own topics) fills the server's length history; then an
evaluation pass on other topics records every chunk's `redline.progress` and when it
arrived. Measured per evaluated stream:

- expected_tokens before the first token vs the tokens that came; baseline: the naive
  guess (always max_tokens);
- at the halfway point (the first chunk with tokens >= final/2), eta_ms vs the time
  that really remained until the last chunk; baseline: the same live rate times
  (max_tokens - tokens), i.e. a countdown that assumes every answer runs to max_tokens.

    python bench/streams_countdown.py [--url http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from streams_server import SMOL, server  # noqa: E402

# (template, max_tokens): the answers' lengths differ by kind of request
TEMPLATES = [
    ("In one short sentence, what is {t}?", 64),
    ("Give three keywords about {t}, comma separated.", 32),
    ("List five facts about {t}.", 200),
    ("Write a short paragraph about {t}.", 160),
    ("Write a detailed essay about {t}.", 256),
    ("Explain {t} to a child in two sentences.", 96),
]
WARM_TOPICS = ["volcanoes", "the moon", "honey bees", "rainbows", "chess", "coffee", "glaciers",
               "the violin", "tides", "paper"]
EVAL_TOPICS = ["deserts", "owls", "electricity", "the Roman empire", "tea", "earthquakes",
               "jazz", "photosynthesis"]


async def run_one(c: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> dict:
    # tier A: every request streams here (auto would send long ones to the job queue)
    body = {"model": SMOL, "temperature": 0, "max_tokens": max_tokens, "stream": True,
            "cache": False, "tier": "A", "messages": [{"role": "user", "content": prompt}]}
    points = []  # (arrival s, tokens, expected, eta_ms)
    finished_at = None
    async with c.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return {"max_tokens": max_tokens, "points": [], "end": None,
                    "error": f"HTTP {r.status_code}: {r.text[:200]}"}
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            data = json.loads(line[6:])
            prog = (data.get("redline") or {}).get("progress")
            if prog is not None:
                points.append((now, prog["tokens"], prog["expected_tokens"], prog["eta_ms"]))
            if data.get("choices") and data["choices"][0].get("finish_reason"):
                finished_at = now
    return {"max_tokens": max_tokens, "points": points, "end": finished_at, "prompt": prompt}


async def run_pass(url: str, jobs: list[tuple[str, int]], concurrency: int) -> list[dict]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=120) as c:
        async def one(prompt: str, mt: int) -> dict:
            async with sem:
                return await run_one(c, url, prompt, mt)
        return await asyncio.gather(*(one(p, mt) for p, mt in jobs))


def evaluate(results: list[dict]) -> dict:
    exp_err, naive_err, eta_err, naive_eta_err = [], [], [], []
    errors = [r["error"] for r in results if r.get("error")]
    for r in results:
        pts, mt = r["points"], r["max_tokens"]
        if not pts or r["end"] is None or pts[-1][1] == 0:
            continue
        final = pts[-1][1]
        exp_err.append(abs(pts[0][2] - final) / final)
        naive_err.append(abs(mt - final) / final)
        if final < 4:
            continue
        half = next(p for p in pts if p[1] >= final / 2)
        remaining = r["end"] - half[0]
        if half[3] is None or remaining <= 0 or half[2] <= half[1]:
            continue
        eta_err.append(abs(half[3] / 1000 - remaining) / remaining)
        per_token = half[3] / 1000 / (half[2] - half[1])  # the server's live rate
        naive_eta_err.append(abs((mt - half[1]) * per_token - remaining) / remaining)
    return {
        "streams": len(results),
        "expected_tokens_before_first_rel_err_median": statistics.median(exp_err),
        "naive_max_tokens_rel_err_median": statistics.median(naive_err),
        "eta_at_half_rel_err_median": statistics.median(eta_err),
        "naive_eta_at_half_rel_err_median": statistics.median(naive_eta_err),
        "streams_at_half": len(eta_err),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url")
    p.add_argument("--concurrency", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", help="write every stream's progress points here (JSON)")
    args = p.parse_args()
    rng = random.Random(args.seed)
    warm = [(t.format(t=topic), mt) for topic in WARM_TOPICS for t, mt in TEMPLATES]
    evals = [(t.format(t=topic), mt) for topic in EVAL_TOPICS for t, mt in TEMPLATES]
    rng.shuffle(warm)
    rng.shuffle(evals)
    with server(args.url) as url:
        t0 = time.perf_counter()
        asyncio.run(run_pass(url, warm, args.concurrency))
        results = asyncio.run(run_pass(url, evals, args.concurrency))
        if args.save:
            Path(args.save).write_text(json.dumps(results))
        out = evaluate(results)
        out["warm_streams"] = len(warm)
        out["concurrency"] = args.concurrency
        out["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
