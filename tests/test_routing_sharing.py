"""The planner with local models that share the cores: a model's predicted TTFT and total
grow with the other local engines' work (its slowdown), so it moves off a model that would
miss the budget only because it is shared."""

from __future__ import annotations

from typing import Any

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
