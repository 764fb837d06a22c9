"""Percentiles and the side-by-side table that `redline bench` prints."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from redline.bench.loadgen import RunResult


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


@dataclass(frozen=True)
class Summary:
    target: str
    load: str
    ok: int
    failed: int
    tok_s: float
    ttft: tuple[float, float, float]  # p50, p90, p99 seconds
    tpot: tuple[float, float, float]
    itl: tuple[float, float, float]
    e2e: tuple[float, float, float]


def _p3(values: Sequence[float]) -> tuple[float, float, float]:
    return percentile(values, 50), percentile(values, 90), percentile(values, 99)


def summarize(run: RunResult) -> Summary:
    ok = [s for s in run.samples if s.ok]
    tokens = sum(s.tokens for s in ok)
    load = f"c={run.concurrency}" if run.rate is None else f"rate={run.rate:g}/s"
    return Summary(
        target=run.target, load=load, ok=len(ok), failed=len(run.samples) - len(ok),
        tok_s=tokens / run.wall_s if run.wall_s > 0 else 0.0,
        ttft=_p3([s.ttft for s in ok]),
        tpot=_p3([t for s in ok if (t := s.tpot) is not None]),
        itl=_p3([x for s in ok for x in s.itl]),
        e2e=_p3([s.e2e for s in ok]),
    )


def _ms(v: tuple[float, float, float]) -> str:
    return "/".join("-" if math.isnan(x) else f"{x * 1000:.0f}" for x in v)


def table(summaries: Sequence[Summary]) -> str:
    head = ("target", "load", "ok", "fail", "out tok/s", "TTFT ms p50/p90/p99",
            "TPOT ms p50/p90/p99", "ITL ms p50/p90/p99", "E2E ms p50/p90/p99")
    rows = [head] + [(s.target, s.load, str(s.ok), str(s.failed), f"{s.tok_s:.1f}", _ms(s.ttft),
                      _ms(s.tpot), _ms(s.itl), _ms(s.e2e)) for s in summaries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
