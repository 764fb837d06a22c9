"""The error budget on live traffic (issue 22): labelled question pairs sent to a real
`redline serve` with the bundled SmolLM2-135M answering, and what the budget made of them.

    python bench/cache_budget_live.py [--pairs bench/data/cache_pairs_test.tsv] [--judge questions]
                                      [--threshold 0.60] [--sample 1.0] [--passes 2]

Each pair gets a tenant of its own (an API key each), so its second question can only meet
its first question's answer: the pair's label says whether serving it is right. Per pair,
in order: ask question A (the model answers, the answer is stored), then question B. When
B is served from the semantic cache, the shadow check (the model's own answer to B,
generated once the engine is idle, compared by the judge) runs before the next pair; a
would-be hit the budget no longer serves is checked against the answer the model gave.
Nothing is tuned here: the threshold starts where `--threshold` says (default: the
configured 0.70) and the budget moves it.

Printed: per pass, the semantic hits served and how many served the answer to a different
question (by the labels); the judge's verdicts against the labels; and the budget's own
estimate, its 95 % bounds and the threshold, from `/metrics`, at the end of each pass.
A second pass asks the same pairs under new tenants, with the budget as the first left it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from routing_common import Procs  # noqa: E402  (bench/ is on the path)

from redline.cache.evaluate import load_pairs  # noqa: E402

MODEL = "smollm2-135m-instruct"
JUDGE = "qwen2.5-coder-0.5b-instruct"  # the questions judge (--judge questions)
ADMIN = "budget-admin"


def metrics(client: httpx.Client) -> dict[str, float]:
    """The budget's series from /metrics, by name and label."""
    out: dict[str, float] = {}
    for line in client.get("/metrics").text.splitlines():
        m = re.match(r"(redline_cache_(?:verified_hits_total|wrong_hits_total|wrong_hit_rate|"
                     r"semantic_threshold|shadow_skipped_total|semantic_hits_total))"
                     r"(\{[^}]*\})?\s+([-+0-9.eE]+|NaN)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def verdicts(m: dict[str, float]) -> dict[str, float]:
    def get(name: str) -> float:
        return sum(v for k, v in m.items() if k.startswith(name))
    return {"verified_served": m.get('redline_cache_verified_hits_total{hit="served"}', 0.0),  # checks
            "wrong_served": m.get('redline_cache_wrong_hits_total{hit="served"}', 0.0),
            "verified_unserved": m.get('redline_cache_verified_hits_total{hit="unserved"}', 0.0),
            "wrong_unserved": m.get('redline_cache_wrong_hits_total{hit="unserved"}', 0.0),
            "skipped": get("redline_cache_shadow_skipped_total")}


@dataclass
class Pass:
    served: int = 0
    served_wrong: int = 0  # by the labels: the answer to a different question
    same_pairs: int = 0
    # the judge against the labels: (label same?, verdict "wrong"?) -> count, served / unserved
    judged: dict[str, int] = field(default_factory=dict)
    skipped: int = 0
    budget: dict[str, float] = field(default_factory=dict)


def ask(client: httpx.Client, key: str, text: str, max_tokens: int) -> str:
    r = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                    json={"model": MODEL, "temperature": 0, "max_tokens": max_tokens,
                          "messages": [{"role": "user", "content": text}]})
    r.raise_for_status()
    return r.headers.get("x-redline-cache", "?")


def wait_change(client: httpx.Client, before: dict[str, float], seconds: float) -> dict[str, float]:
    deadline = time.monotonic() + seconds
    while True:
        now = verdicts(metrics(client))
        if now != before or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--pairs", default=str(ROOT / "bench" / "data" / "cache_pairs_test.tsv"))
    ap.add_argument("--threshold", type=float, default=None, help="cache.similarity_threshold "
                    "(default: the configured 0.70)")
    ap.add_argument("--sample", type=float, default=1.0, help="cache.shadow_sample")
    ap.add_argument("--budget", type=float, default=0.02, help="cache.max_wrong_hit_rate")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0, help="first N pairs only (0: all)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--shadow-wait", type=float, default=20.0, help="seconds to wait for a "
                    "served hit's shadow verdict before the next pair")
    ap.add_argument("--seed", type=int, default=7, help="order of the pairs (shuffled once)")
    ap.add_argument("--judge", choices=("answers", "questions"), default="answers",
                    help="cache.judge; questions: Qwen2.5-Coder-0.5B (loaded beside SmolLM2) "
                    "is asked whether the two questions are the same")
    args = ap.parse_args()
    pairs = load_pairs(args.pairs)
    random.Random(args.seed).shuffle(pairs)
    if args.limit:
        pairs = pairs[: args.limit]
    keys = [f"tenant-key-{i}" for i in range(len(pairs) * args.passes)]
    cache: dict[str, object] = {"shadow_sample": args.sample, "max_wrong_hit_rate": args.budget,
                                "judge": args.judge}
    models: list[dict[str, object]] = [{"name": MODEL, "bundled": MODEL}]
    if args.judge == "questions":
        models.append({"name": JUDGE, "bundled": JUDGE, "size_rank": 2})
    if args.threshold is not None:
        cache["similarity_threshold"] = args.threshold
    cfg = {"models": models,
           "cache": cache,
           "auth": {"keys": [{"name": f"t{i}", "sha256": hashlib.sha256(k.encode()).hexdigest()}
                             for i, k in enumerate(keys)]
                    + [{"name": "admin", "role": "admin",
                        "sha256": hashlib.sha256(ADMIN.encode()).hexdigest()}]}}
    procs = Procs()
    passes: list[Pass] = []
    try:
        try:
            url = procs.serve(cfg, timeout=300)
        except TimeoutError as exc:
            print(exc)
            return 1
        t_start = time.monotonic()
        with httpx.Client(base_url=url, timeout=300) as client:
            for p in range(args.passes):
                result = Pass()
                for i, pair in enumerate(pairs):
                    key = keys[p * len(pairs) + i]
                    result.same_pairs += pair.same
                    ask(client, key, pair.a, args.max_tokens)
                    time.sleep(0.05)  # the answer is stored just after the response
                    before = verdicts(metrics(client))
                    got = ask(client, key, pair.b, args.max_tokens)
                    if got == "semantic":
                        result.served += 1
                        result.served_wrong += not pair.same
                        after = wait_change(client, before, args.shadow_wait)
                    else:
                        after = wait_change(client, before, 0.5)
                    for kind in ("served", "unserved"):  # verified counts every check
                        bad = after[f"wrong_{kind}"] - before[f"wrong_{kind}"]
                        ok = after[f"verified_{kind}"] - before[f"verified_{kind}"] - bad
                        for verdict, n in (("right", ok), ("wrong", bad)):
                            if n:
                                k = f"{kind}: label {'same' if pair.same else 'diff'}, judge {verdict}"
                                result.judged[k] = result.judged.get(k, 0) + int(n)
                    result.skipped += int(after["skipped"] - before["skipped"])
                    if (i + 1) % 25 == 0:
                        print(f"  pass {p + 1}: {i + 1}/{len(pairs)} pairs, {result.served} "
                              f"served, {result.served_wrong} of them wrong "
                              f"({time.monotonic() - t_start:.0f} s)", flush=True)
                m = metrics(client)
                result.budget = {k.split("{")[0].removeprefix("redline_cache_") +
                                 (k[k.index("{"):] if "{" in k else ""): v
                                 for k, v in m.items()
                                 if "wrong_hit_rate" in k or "semantic_threshold" in k}
                passes.append(result)
    finally:
        procs.stop()
    print(f"\npairs: {args.pairs} ({len(pairs)} pairs, {sum(p.same for p in pairs)} same), "
          f"judge {args.judge}, shadow_sample {args.sample}, budget {args.budget}, threshold "
          f"{args.threshold if args.threshold is not None else 'configured (0.70)'}, "
          f"max_tokens {args.max_tokens}, seed {args.seed}")
    print("| pass | semantic hits served | wrong by the labels | wrong-hit rate | recall "
          "(served same / same pairs) | budget's estimate [lower, upper] | threshold at the end |")
    print("|---|---|---|---|---|---|---|")
    for n, r in enumerate(passes, start=1):
        b = r.budget
        est, lo, hi = (b.get(f'wrong_hit_rate{{value="{v}"}}', float("nan"))
                       for v in ("estimate", "lower", "upper"))
        rate = r.served_wrong / r.served if r.served else 0.0
        print(f"| {n} | {r.served} | {r.served_wrong} | {rate:.3f} | "
              f"{(r.served - r.served_wrong) / max(1, r.same_pairs):.3f} | "
              f"{est:.3f} [{lo:.3f}, {hi:.3f}] | "
              f"{b.get('semantic_threshold', float('nan')):.2f} |")
    for n, r in enumerate(passes, start=1):
        print(f"pass {n}: the judge's verdicts against the labels: "
              f"{json.dumps(dict(sorted(r.judged.items())))}; shadows skipped: {r.skipped}")
    print(json.dumps({"passes": [r.__dict__ for r in passes]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
