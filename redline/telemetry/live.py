"""Live figures for the dashboard page: the last few minutes of finished completions,
per tier, computed exactly (no histogram buckets) from a bounded window.

An `Observer` of the pipeline. Prometheus and Grafana are the long-term view; this is
the "what is happening right now on this replica" view that needs no other service."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from redline.telemetry.longtail import Budget, over_budget

if TYPE_CHECKING:
    from redline.types import Finished


@dataclass(frozen=True)
class _Done:
    at: float  # monotonic seconds
    tier: str
    model: str
    cache: str
    status: str
    ttft_s: float | None
    total_s: float | None
    tokens: int
    in_budget: bool


class LiveStats:
    def __init__(self, budgets: Mapping[str, Budget], capacity: int = 4096) -> None:
        self.budgets = budgets
        self.window: deque[_Done] = deque(maxlen=capacity)

    def on_finish(self, completion: Finished) -> None:
        total = completion.total_s
        ok = not over_budget(self.budgets.get(completion.tier), completion.ttft_s, total)
        self.window.append(_Done(time.monotonic(), completion.tier, completion.model,
                                 completion.cache, completion.status, completion.ttft_s, total,
                                 completion.output_tokens, ok))

    def summary(self, window_s: float = 300.0) -> dict[str, Any]:
        since = time.monotonic() - window_s
        recent = [d for d in self.window if d.at >= since]
        tiers: dict[str, list[_Done]] = {}
        for d in recent:
            tiers.setdefault(d.tier, []).append(d)
        hits = sum(1 for d in recent if d.cache in ("hit", "semantic"))
        return {
            "window_s": window_s,
            "requests": len(recent),
            "requests_per_s": round(len(recent) / window_s, 3),
            "tokens_per_s": round(sum(d.tokens for d in recent) / window_s, 2),
            "cache_hit_rate": _ratio(hits, len(recent)),
            "cache": _count(d.cache for d in recent),
            "interrupted": sum(1 for d in recent if d.status == "499"),
            "errors": sum(1 for d in recent if d.status.startswith("5")),
            "tiers": {t: _tier(ds, self.budgets.get(t)) for t, ds in sorted(tiers.items())},
        }


def _tier(done: list[_Done], budget: Budget | None) -> dict[str, Any]:
    ttft = sorted(d.ttft_s for d in done if d.ttft_s is not None)
    ok_total = sorted(d.total_s for d in done if d.total_s is not None and d.status == "200")
    return {
        "requests": len(done),
        "slo_attainment": _ratio(sum(1 for d in done if d.in_budget), len(done)),
        "budget_ms": {"ttft": _ms(budget.ttft_s if budget else None),
                      "total": _ms(budget.total_s if budget else None)},
        "ttft_ms": {"p50": _ms(_quantile(ttft, 0.5)), "p99": _ms(_quantile(ttft, 0.99))},
        "e2e_ms": {"p50": _ms(_quantile(ok_total, 0.5)), "p99": _ms(_quantile(ok_total, 0.99))},
    }


def _quantile(sorted_values: list[float], q: float) -> float | None:
    """Nearest rank: the smallest value with at least q of the values at or below it."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def _ratio(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out
