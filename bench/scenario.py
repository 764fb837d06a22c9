"""The mission's scenario: a customer-service mix with Poisson arrivals, sent to any
OpenAI-compatible targets on the same seeded schedule, one target after the other.

    60 % frequent questions, drawn (Zipf-like) from a small popular pool, 64 tokens
    30 % one-off replies, each text new (an order number, a name), up to 128 tokens
    10 % reports, each text new, up to 256 tokens

Under the line: a frequent question's first token within 1 s, any other's within 3 s.
Printed per target: share under the line, TTFT p50/p99 per kind, E2E p99, and the share
of answers each model gave (X-Redline-Model, else the chunks' `model`).

    .venv/bin/python bench/scenario.py --n 300 --rate 2 \\
        --target auto=auto@http://127.0.0.1:8000 \\
        --target smol=smollm2-135m-instruct@http://127.0.0.1:8000 --plot scenario.png

`--pool-pairs FILE` (a cache pairs file, e.g. bench/data/cache_pairs_tune.tsv) makes the
popular pool its `same` pairs, each asked in either wording at random: the repeats are then
semantic hits as well as exact ones, which the cache's shadow checks and judge work on.

A target is LABEL=MODEL@BASE_URL (BASE_URL without /v1). Progress goes to stderr every
second. Figures measured on a shared machine are provisional: say so next to them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_common import pct, session  # noqa: E402

from redline.backends.sse import data_payloads  # noqa: E402
from redline.bench.loadgen import STALE_CONNECTION  # noqa: E402
from redline.cache.evaluate import load_pairs  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "questions.jsonl"
LINE_S = {"frequent": 1.0, "one-off": 3.0, "report": 3.0}
MIX = (("frequent", 0.6, 64), ("one-off", 0.3, 128), ("report", 0.1, 256))
NAMES = ["Ana", "Bilal", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jun"]
ISSUES = ["arrived damaged", "has not arrived", "was charged twice", "is the wrong size",
          "stopped working after a week", "is missing a part", "was cancelled without notice"]
ONE_OFF = ["Hi, I'm {name}. My order #{num} {issue}. What can you do for me?",
           "Order {num} {issue}; I'm {name} and I need this sorted before Friday. Options?",
           "{name} here. The parcel for order {num} {issue}. Please write me a short reply."]
REPORTS = ["Write a short incident report for order {num}: it {issue}. Cover the timeline, "
           "the likely cause, what we told {name}, and what we will change.",
           "Draft a weekly summary for the support lead: {n} tickets, most about items that "
           "{issue}; order {num} ({name}) escalated. Include recommendations."]


@dataclass(frozen=True)
class Item:
    at: float  # seconds after the start
    kind: str
    body: dict[str, Any]


@dataclass
class Outcome:
    kind: str
    ok: bool
    ttft: float = float("nan")
    e2e: float = float("nan")
    model: str = "?"
    status: int = 0
    tier: str = "?"
    pieces: int = 0  # content deltas received: the answer's length, ~ its tokens
    shortened: bool = False  # redline's planner cut max_tokens (X-Redline-Degraded: shorten)


@dataclass
class Target:
    label: str
    model: str
    url: str
    results: list[Outcome] = field(default_factory=list)


def schedule(n: int, rate: float, seed: int, pool_size: int,
             pool_pairs: str | None = None) -> list[Item]:
    """The seeded schedule every target gets: arrival times and bodies."""
    rng = random.Random(seed)
    pool: list[tuple[str, ...]]
    if pool_pairs:  # two wordings of each popular question
        pool = [(p.a, p.b) for p in load_pairs(pool_pairs) if p.same]
    else:
        pool = [(json.loads(line)["question"],) for line in DATA.read_text().splitlines()
                if line.strip()]
    pool = pool[:pool_size]
    weights = [1.0 / (i + 1) for i in range(len(pool))]  # a few questions most asked
    items, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        x, acc, kind, max_tokens = rng.random(), 0.0, MIX[-1][0], MIX[-1][2]
        for k, p, m in MIX:
            acc += p
            if x <= acc:
                kind, max_tokens = k, m
                break
        fill = {"name": rng.choice(NAMES), "num": 100000 + rng.randrange(900000) + i,
                "issue": rng.choice(ISSUES), "n": rng.randrange(20, 400)}
        if kind == "frequent":
            wordings = rng.choices(pool, weights)[0]
            # one wording draws nothing more: the default schedule stays as it was
            text = wordings[0] if len(wordings) == 1 else rng.choice(wordings)
        elif kind == "one-off":
            text = rng.choice(ONE_OFF).format(**fill)
        else:
            text = rng.choice(REPORTS).format(**fill)
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
                "temperature": 0, "stream": True}
        items.append(Item(t, kind, body))
    return items


async def one(client: aiohttp.ClientSession, target: Target, item: Item,
              headers: dict[str, str]) -> Outcome:
    """One request; sent once more on a fresh connection if the server dropped the pooled
    keep-alive one unanswered (the client pool's failure, not the server's; the first
    try's time counts)."""
    t0 = time.perf_counter()
    try:
        return await _one(client, target, item, headers, t0)
    except STALE_CONNECTION:
        return await _one(client, target, item, headers, t0, retried=True)


async def _one(client: aiohttp.ClientSession, target: Target, item: Item,
               headers: dict[str, str], t0: float, retried: bool = False) -> Outcome:
    ttft = None
    answered = False
    model = "?"
    try:
        async with client.post(f"{target.url}/v1/chat/completions",
                               json={**item.body, "model": target.model}, headers=headers) as r:
            if r.status != 200:
                await r.read()
                return Outcome(item.kind, False, status=r.status)
            answered = True
            model = r.headers.get("x-redline-model", "?")
            tier = r.headers.get("x-redline-tier", "?")
            shortened = r.headers.get("x-redline-degraded") == "shorten"
            pieces = 0
            async for payloads in data_payloads(r.content.iter_any()):
                for payload in payloads:
                    if payload == b"[DONE]":
                        continue
                    if ttft is not None and b'"content"' not in payload:
                        continue  # past the first token, only the answer's length counts
                    chunk = json.loads(payload)
                    if model == "?":
                        model = chunk.get("model", "?")
                    choices = chunk.get("choices") or []
                    if choices and choices[0].get("delta", {}).get("content"):
                        pieces += 1
                        if ttft is None:
                            ttft = time.perf_counter() - t0
            e2e = time.perf_counter() - t0
            return Outcome(item.kind, ttft is not None, ttft if ttft is not None else e2e, e2e,
                           model, 200, tier, pieces, shortened)
    except STALE_CONNECTION:
        if answered or retried:
            return Outcome(item.kind, False, model=model)
        raise
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError):
        return Outcome(item.kind, False, model=model)


async def run_target(target: Target, items: list[Item], headers: dict[str, str]) -> None:
    done: list[Outcome] = []
    start = time.perf_counter()

    tty = sys.stderr.isatty()

    async def progress() -> None:
        ticks = 0
        while True:
            await asyncio.sleep(1.0)
            ticks += 1
            if not tty and ticks % 10:
                continue  # a log, not a terminal: one line every 10 s
            under = sum(1 for o in done if under_line(o))
            share = f"{100 * under / len(done):.1f} %" if done else "-"
            lead, end = ("\r", "") if tty else ("", "\n")
            sys.stderr.write(f"{lead}[{target.label}] {time.perf_counter() - start:6.1f} s  sent "
                             f"{sum(1 for i in items if i.at <= time.perf_counter() - start)}"
                             f"/{len(items)}  done {len(done)}  under the line {share}   {end}")
            sys.stderr.flush()

    async def fire(client: aiohttp.ClientSession, item: Item) -> None:
        delay = item.at - (time.perf_counter() - start)
        if delay > 0:
            await asyncio.sleep(delay)
        done.append(await one(client, target, item, headers))

    ticker = asyncio.create_task(progress())
    try:
        async with session(1000, timeout=600) as client:
            await asyncio.gather(*(fire(client, i) for i in items))
    finally:
        ticker.cancel()
        sys.stderr.write("\n")
    target.results = done


async def warm(target: Target, items: list[Item], headers: dict[str, str]) -> None:
    """A few requests one after the other, not counted: first-use costs (a model's first
    batches, the cache's embedder) are not what the scenario measures."""
    async with session(4, timeout=600) as client:
        for item in items:
            await one(client, target, item, headers)


def under_line(o: Outcome) -> bool:
    return o.ok and o.ttft < LINE_S[o.kind]


def report(target: Target) -> dict[str, Any]:
    rs = target.results
    ok = [o for o in rs if o.ok]
    out: dict[str, Any] = {
        "target": target.label, "sent": len(rs), "answered": len(ok),
        "under_line": sum(map(under_line, rs)) / len(rs) if rs else float("nan"),
        "e2e_p99_s": pct([o.e2e for o in ok], 99),
    }
    for kind, _, _ in MIX:
        ks = [o.ttft for o in ok if o.kind == kind]
        out[f"{kind}_ttft_p50_s"] = pct(ks, 50)
        out[f"{kind}_ttft_p99_s"] = pct(ks, 99)
        # how long the answers were: E2E compares like with like only if these match
        sizes = [o.pieces for o in ok if o.kind == kind]
        out[f"{kind}_pieces_mean"] = sum(sizes) / len(sizes) if sizes else float("nan")
    out["shortened"] = sum(o.shortened for o in ok)
    models: dict[str, int] = {}
    for o in ok:
        models[o.model] = models.get(o.model, 0) + 1
    out["routed"] = {m: c / len(ok) for m, c in sorted(models.items())} if ok else {}
    # how each kind was served: tier and model (what `auto` decided), answered only
    by_kind: dict[str, dict[str, int]] = {}
    for o in ok:
        key = f"{o.tier}:{o.model}"
        by_kind.setdefault(o.kind, {})[key] = by_kind.setdefault(o.kind, {}).get(key, 0) + 1
    out["served_by_kind"] = by_kind
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    head = ("target", "under line", "frequent TTFT p50/p99", "one-off TTFT p99",
            "report TTFT p99", "E2E p99", "routed")
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for r in rows:
        routed = ", ".join(f"{m} {100 * s:.0f} %" for m, s in r["routed"].items())
        print(" | ".join((
            r["target"], f"{100 * r['under_line']:.1f} %",
            f"{r['frequent_ttft_p50_s']:.2f} / {r['frequent_ttft_p99_s']:.2f} s",
            f"{r['one-off_ttft_p99_s']:.2f} s", f"{r['report_ttft_p99_s']:.2f} s",
            f"{r['e2e_p99_s']:.1f} s", routed)))


def plot(targets: list[Target], path: str, note: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display here
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, what in zip(axes, ("ttft", "e2e"), strict=True):
        for t in targets:
            xs = sorted(getattr(o, what) for o in t.results if o.ok)
            if not xs:
                continue
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=t.label)
        ax.set_xscale("log")
        ax.set_xlabel(f"{'TTFT' if what == 'ttft' else 'end-to-end time'} (s, log)")
        ax.set_ylabel("share of answered requests at or below")
        ax.grid(True, which="both", alpha=0.3)
        if what == "ttft":
            for s in sorted(set(LINE_S.values())):
                ax.axvline(s, color="grey", linestyle="--", linewidth=0.8)
        ax.legend(loc="lower right")
    fig.suptitle(note, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_target(spec: str) -> Target:
    label, _, rest = spec.partition("=")
    model, _, url = rest.partition("@")
    if not (label and model and url):
        raise SystemExit(f"--target {spec!r}: write LABEL=MODEL@BASE_URL")
    return Target(label, model, url.rstrip("/").removesuffix("/v1"))


async def main_async(a: argparse.Namespace) -> None:
    targets = [parse_target(s) for s in a.target]
    items = schedule(a.n, a.rate, a.seed, a.pool, a.pool_pairs)
    headers = {"Authorization": f"Bearer {a.api_key}"} if a.api_key else {}
    kinds = {k: sum(1 for i in items if i.kind == k) for k, _, _ in MIX}
    print(f"# {a.n} requests, Poisson {a.rate}/s (seed {a.seed}), over {items[-1].at:.0f} s; "
          f"{kinds}; pool of {a.pool} frequent questions", file=sys.stderr)
    for i, t in enumerate(targets):
        if i and a.pause:
            await asyncio.sleep(a.pause)  # the previous target's stragglers drain
        own = headers or {  # an open redline server: a tenant (and a cache) per target run
            "Authorization": f"Bearer scenario-{t.label}-{a.seed}-{time.time_ns()}"}
        await warm(t, schedule(a.warmup, a.rate, a.seed + 1000, a.pool, a.pool_pairs), own)
        await run_target(t, items, own)
    rows = [report(t) for t in targets]
    if a.json:
        print(json.dumps(rows, indent=2))
    else:
        print_table(rows)
        for r in rows:
            print(f"# {r['target']} served (tier:model): " + "; ".join(
                f"{kind} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
                for kind, c in r["served_by_kind"].items()))
            print(f"# {r['target']} answer length (content deltas, mean): " + ", ".join(
                f"{kind} {r[f'{kind}_pieces_mean']:.1f}" for kind, _, _ in MIX)
                + f"; shortened by the planner: {r['shortened']}")
    if a.dump:  # every request's outcome, for a closer look (which model made the tail)
        with open(a.dump, "w") as f:
            for t in targets:
                for o in t.results:
                    f.write(json.dumps({"target": t.label, **o.__dict__}) + "\n")
    if a.plot:
        plot(targets, a.plot, a.note or f"{a.n} requests at {a.rate}/s, seed {a.seed} "
             "(provisional: measured on a shared machine)")
        print(f"plot: {a.plot}", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", action="append", required=True, help="LABEL=MODEL@BASE_URL")
    p.add_argument("--n", type=int, default=300, help="requests")
    p.add_argument("--rate", type=float, default=2.0, help="arrivals per second (Poisson)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pool", type=int, default=20, help="popular questions the frequent ones use")
    p.add_argument("--pool-pairs", default=None, help="FILE.tsv: the pool is its `same` pairs, "
                   "asked in either wording (semantic hits)")
    p.add_argument("--pause", type=float, default=5.0, help="seconds between targets")
    p.add_argument("--warmup", type=int, default=4, help="requests per target first, not counted")
    p.add_argument("--api-key", default=None, help="default: on an open server, a new bearer "
                   "token per target run, so that no target is served from another's cache")
    p.add_argument("--json", action="store_true", help="JSON rows instead of the table")
    p.add_argument("--dump", default=None, help="FILE.jsonl: every request's outcome")
    p.add_argument("--plot", default=None, help="FILE.png: TTFT and E2E distributions")
    p.add_argument("--note", default=None, help="the figure's title line")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
