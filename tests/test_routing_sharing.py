"""The planner with local models that share the cores: a model's predicted TTFT and total
grow with the other local engines' work (its slowdown), so it moves off a model that would
miss the budget only because it is shared."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from redline.backends.fake import FakeBackend
from redline.config import RoutingConfig
from redline.routing.router import Routed, Router
from redline.telemetry.metrics import Metrics
from redline.types import GenerationRequest, Message, SamplingParams


def chat(text: str, tier: Any = None) -> GenerationRequest:
    return GenerationRequest(model="auto", sampling=SamplingParams(max_tokens=3),
                             messages=(Message("user", text),), tier=tier)


async def drain(r: Routed) -> None:
    async for _ in r.rest:
        pass


def teach(r: Router, backend: FakeBackend, ttft: float, tpot: float,
          out: int | None = None) -> None:
    """What the planner would have learnt from ten answers of `backend`."""
    stats = r.estimates.of(backend)
    for _ in range(10):
        stats.observe_ttft(ttft, 0, 10)
        stats.observe_tpot(tpot, alpha=1.0)
        if out is not None:
            stats.observe_output(out, alpha=1.0)


def asking(text: str, tier: Any, max_tokens: int) -> GenerationRequest:
    return GenerationRequest(model="auto", sampling=SamplingParams(max_tokens=max_tokens),
                             messages=(Message("user", text),), tier=tier)


async def router(backends: dict[str, FakeBackend], **cfg: Any) -> Router:
    r = Router(backends, next(iter(backends)), RoutingConfig(**cfg), Metrics())
    await r.start()
    return r


class Sharing(FakeBackend):
    """A fake local model whose cores are shared: it reports a slowdown, as LocalBackend
    does from the step arbiter."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.shared = 1.0

    def slowdown(self) -> float:
        return self.shared


async def test_the_planner_sees_other_local_engines_work() -> None:
    small, large = Sharing("small", size_rank=1), Sharing("large", size_rank=2)
    r = await router({"small": small, "large": large}, classifier="off")
    for _ in range(10):  # alone: small answers in 0.6 s, large in 0.4 s
        r.estimates.of(small).observe_ttft(0.6, 0, 10)
        r.estimates.of(large).observe_ttft(0.4, 0, 10)
    alone = r.predict("large", 10, 3)
    assert alone is not None and abs(alone.ttft_s - 0.4) < 0.05
    got = await r.open(r.plan(chat("hi", tier="S")))  # both meet 1 s: small first
    assert got.model == "small"
    await drain(got)
    large.shared = 3.0  # two other local engines have work: large would take 1.2 s
    shared = r.predict("large", 10, 3)
    assert shared is not None and abs(shared.ttft_s - 3 * alone.ttft_s) < 1e-6
    small.shared = 2.0  # small 1.2 s, large 1.2 s: neither meets 1 s; the fastest goes first
    plan = r._plan("S", ["large", "small"], chat("hi", tier="S"))
    assert plan.degraded
    small.shared = 1.0
    plan = r._plan("S", ["large", "small"], chat("hi", tier="S"))
    assert plan.order[0] == "small" and not plan.degraded  # large misses only when shared


class Forecasting(Sharing):
    """A fake local model that forecasts its own TTFT from its admitted work, as the
    embedded engine does (engine/forecast.py)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.forecast: float | None = None

    def predict_ttft_s(self, prompt_tokens: int, tier: str | None,
                       request: object = None) -> float | None:
        return self.forecast

    def predict_tpot_s(self) -> float | None:
        return None  # learnt from the observations the test feeds


async def test_the_engines_own_forecast_replaces_the_learnt_queue_term() -> None:
    small, large = Forecasting("small", size_rank=1), Forecasting("large", size_rank=2)
    r = await router({"small": small, "large": large}, classifier="off")
    for _ in range(10):
        r.estimates.of(large).observe_ttft(0.4, 0, 10)
    assert r.predict("large", 10, 3).ttft_s == pytest.approx(0.4, abs=0.05)  # type: ignore[union-attr]
    large.forecast = 5.0  # its slots are full: it knows the soonest frees in 5 s
    large.shared = 2.0
    assert r.predict("large", 10, 3).ttft_s == pytest.approx(10.0)  # type: ignore[union-attr]
    # a tier-A request, large first (complex), moves to small: large misses 3 s
    plan = r._plan("A", ["large", "small"], chat("hi", tier="A"))
    assert plan.order[0] == "small"


async def test_auto_pays_for_the_larger_model_only_while_it_finishes_in_time() -> None:
    small, large = Forecasting("small", size_rank=1), Forecasting("large", size_rank=2)
    r = await router({"small": small, "large": large}, classifier="off", quality_total_s=8.0)
    teach(r, small, 0.1, 0.01, out=100)
    teach(r, large, 0.3, 0.04, out=100)
    report = asking("write a report", "B", 150)
    plan = r.plan(report)
    assert plan.order == ("large", "small")  # up to 0.3 + 149 x 40 ms = 6.3 s: within 8 s
    # the longest answer allowed counts, not the expected 100 tokens (4.3 s)
    longer = dataclasses.replace(report, sampling=SamplingParams(max_tokens=256))
    assert r.plan(longer).order[0] == "small"  # up to 10.5 s
    large.shared = small.shared = 2.0  # both engines hold work: large up to 12.5 s
    plan = r.plan(report)
    assert plan.order[0] == "small" and not plan.degraded
    named = dataclasses.replace(report, model="large")  # a named model is not second-guessed
    assert r.plan(named).order[0] == "large"
    r.cfg = r.cfg.model_copy(update={"quality_total_s": None})  # off: the budget alone
    assert r.plan(report).order[0] == "large"


async def test_auto_does_not_move_onto_a_model_that_would_hold_the_cores() -> None:
    small, large = Forecasting("small", size_rank=1), Forecasting("large", size_rank=2)
    r = await router({"small": small, "large": large}, classifier="off", quality_total_s=8.0)
    teach(r, small, 0.1, 0.01)
    teach(r, large, 0.1, 0.04)
    small.forecast, large.forecast = 1.5, 0.2  # small's queue misses tier S's 1 s
    ask = asking("hi", "S", 64)
    plan = r.plan(ask)
    assert plan.order[0] == "large"  # up to 0.2 + 63 x 40 ms = 2.7 s, and meets S's 1 s
    long_ask = dataclasses.replace(ask, sampling=SamplingParams(max_tokens=256))
    plan = r.plan(long_ask)  # large: up to 10.4 s; small up to 4 s, but its TTFT misses
    assert plan.order == ("small", "large") and plan.degraded
    r.cfg = r.cfg.model_copy(update={"quality_total_s": None})
    assert r.plan(long_ask).order[0] == "large"  # off: the tier's budget alone


class OnSharedCores(Forecasting):
    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.busy = 0.0

    def cores_busy(self) -> float:
        return self.busy


async def test_auto_takes_the_slower_model_only_while_the_cores_have_headroom() -> None:
    small, large = OnSharedCores("small", size_rank=1), OnSharedCores("large", size_rank=2)
    r = await router({"small": small, "large": large}, classifier="off", quality_total_s=8.0,
                     quality_headroom=0.5)
    teach(r, small, 0.1, 0.01)
    teach(r, large, 0.1, 0.03)
    report = asking("write a report", "A", 200)
    complex_ = r._plan("A", ["large", "small"], report)
    assert complex_.order[0] == "large"  # up to 6.1 s, and the cores are idle
    small.busy = large.busy = 0.6  # the local engines used 60 % of the cores lately
    crowded = r._plan("A", ["large", "small"], report)
    assert crowded.order == ("small", "large")  # the soonest to finish; large a fallback


async def test_degraded_tier_s_goes_to_the_least_late_not_the_soonest_first_token() -> None:
    small, large = Forecasting("small", size_rank=1), Forecasting("large", size_rank=2)
    r = await router({"small": small, "large": large}, classifier="off")
    teach(r, small, 0.1, 0.05, out=64)
    teach(r, large, 0.1, 0.2, out=64)
    small.forecast, large.forecast = 1.2, 0.3  # small's queue: a first token in 1.2 s
    ask = asking("hi", "S", 64)
    plan = r._plan("S", ["small", "large"], ask)
    # small: 1.2 s + 63 x 50 ms = 4.4 s (1.5x its 3 s); large: 0.3 + 63 x 0.2 = 12.9 s (4.3x)
    assert plan.degraded and plan.order[0] == "small"


async def test_auto_tier_s_stays_on_the_cheapest_model_of_the_shared_cores() -> None:
    small, large = OnSharedCores("small", size_rank=1), OnSharedCores("large", size_rank=2)
    r = await router({"small": small, "large": large}, classifier="off")
    teach(r, small, 0.1, 0.02, out=30)
    teach(r, large, 0.1, 0.07, out=30)
    small.forecast, large.forecast = 2.5, 0.2  # small has a queue, large is idle
    ask = asking("hi", "S", 40)
    plan = r._plan("S", ["small", "large"], ask)
    # large would answer sooner (0.2 + 39 x 70 ms = 2.9 s vs 3.3 s), but on the same
    # cores: taking it adds no capacity and takes 3.5x more of them
    assert plan.order == ("small", "large")
    small.forecast = None  # the same, both on shared cores, for a named model: not auto
    named = dataclasses.replace(ask, model="large")
    assert r.plan(named).order[0] == "large"
