"""The router with fake backends: tiers, model choice, planner, fallbacks, breakers,
admission, and hedging against fake upstreams over real HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from redline.backends.fake import FakeBackend
from redline.backends.fake_upstream import Dist, UpstreamSpec, create_upstream
from redline.backends.openai_compat import OpenAICompatBackend
from redline.backends.pool import PoolBackend
from redline.config import RouteRule, RoutingConfig, TierBudget
from redline.errors import BackendError, ModelNotFound, Overloaded
from redline.routing.router import Routed, Router
from redline.telemetry.metrics import Metrics
from redline.types import FunctionTool, GenerationRequest, Message, ResponseFormat, SamplingParams


def req(text: str, model: str = "auto", tier: Any = None, n: int = 4) -> GenerationRequest:
    return GenerationRequest(model=model, sampling=SamplingParams(max_tokens=n),
                             messages=(Message("user", text),), tier=tier)


async def drain(r: Routed) -> str:
    out = [r.first.text]
    async for c in r.rest:
        out.append(c.text)
    return "".join(out)


async def route(r: Router, request: GenerationRequest) -> Routed:
    """Plan, then open the plan: the way the pipeline serves a request."""
    return await r.open(r.plan(request))


async def router(backends: dict[str, Any], **cfg: Any) -> Router:
    r = Router(backends, next(iter(backends)), RoutingConfig(**cfg), Metrics())
    await r.start()
    return r


@pytest.fixture
def two() -> dict[str, FakeBackend]:
    return {"small": FakeBackend("small", size_rank=1), "large": FakeBackend("large", size_rank=2)}


async def test_auto_sends_simple_to_small_and_complex_to_large(two: dict[str, FakeBackend]) -> None:
    r = await router(two)
    simple = await route(r, req("what is the capital of France?"))
    assert (simple.model, simple.tier) == ("small", "S")
    await drain(simple)
    hard = await route(r, req("write a python function that implements a trie with unit tests"))
    assert (hard.model, hard.tier) == ("large", "A")
    await drain(hard)
    report = await route(r, req("write a detailed 30-page report on the global coffee market"))
    assert (report.model, report.tier) == ("large", "B")
    await drain(report)


async def test_explicit_tier_and_model_win(two: dict[str, FakeBackend]) -> None:
    r = await router(two)
    got = await route(r, req("write a detailed report on coffee", model="small", tier="S"))
    assert (got.model, got.tier) == ("small", "S")
    await drain(got)
    with pytest.raises(ModelNotFound):
        await route(r, req("hi", model="nope"))


async def test_rules_override_the_classifier(two: dict[str, FakeBackend]) -> None:
    r = await router(two, rules=[RouteRule(match=r"^hi\b", tier="A", model="large")])
    got = await route(r, req("hi there"))
    assert (got.model, got.tier) == ("large", "A")
    await drain(got)


async def test_planner_moves_off_a_model_that_would_miss_the_budget(two: dict[str, FakeBackend]) -> None:
    r = await router(two, classifier="off")
    # teach the estimates: large is slow to first token, small is fast
    for _ in range(10):
        r.estimates.of(two["large"]).observe_ttft(2.0, 0, 10)
        r.estimates.of(two["small"]).observe_ttft(0.05, 0, 10)
    got = await route(r, req("explain the proof of Fermat's last theorem", model="large",
                           tier="S"))
    assert got.model == "large"  # a named model without fallbacks is kept (degraded)
    assert got.degraded
    await drain(got)
    r2 = await router(two, classifier="off", fallbacks={"large": ["small"]})
    for _ in range(10):
        r2.estimates.of(two["large"]).observe_ttft(2.0, 0, 10)
        r2.estimates.of(two["small"]).observe_ttft(0.05, 0, 10)
    got = await route(r2, req("explain", model="large", tier="S"))
    assert got.model == "small" and not got.degraded
    await drain(got)
    # tier A allows 3 s: large meets it and stays first
    got = await route(r2, req("explain", model="large", tier="A"))
    assert got.model == "large"
    await drain(got)


async def slow_small(two: dict[str, FakeBackend]) -> Router:
    """A router over "small", seen to answer 500 tokens at 0.5 s TTFT and 50 ms a token:
    a tier-S answer of that length misses its 3 s total."""
    r = await router({"small": two["small"]}, classifier="off")
    stats = r.estimates.of(two["small"])
    for _ in range(10):
        stats.observe_ttft(0.5, 0, 10)
        stats.observe_output(500)
    stats.tpot_s = 0.05
    return r


async def test_shortens_tier_s_answers_that_cannot_fit(two: dict[str, FakeBackend]) -> None:
    r = await slow_small(two)
    got = await route(r, req("tell me everything", model="small", tier="S", n=500))
    text = await drain(got)
    assert got.degraded and len(text.split()) == 51  # (3 s − 0.5 s) / 0.05 s + 1


async def test_structured_answers_are_never_shortened(two: dict[str, FakeBackend]) -> None:
    """A tool call or a JSON document cut at a token cap is no answer (an agent client
    sent a tier-S turn and got half a tool call): such a request keeps its max_tokens,
    predicted late or not, while the same question in plain text is shortened."""
    r = await slow_small(two)
    plain = r.plan(req("tell me everything", model="small", tier="S", n=500))
    assert plain.degraded and plain.request.sampling.max_tokens == 51
    tools = req("tell me everything", model="small", tier="S", n=500)
    tools.tools = (FunctionTool("f", None, {"type": "object"}),)
    schema = req("tell me everything", model="small", tier="S", n=500)
    schema.response_format = ResponseFormat("json_object")
    for structured in (tools, schema):
        planned = r.plan(structured)
        assert planned.degraded and planned.request.sampling.max_tokens == 500


async def test_allow_background_turns_a_predicted_miss_into_would_miss(
        two: dict[str, FakeBackend]) -> None:
    r = await router({"large": two["large"]}, classifier="off")
    for _ in range(10):
        r.estimates.of(two["large"]).observe_ttft(2.0, 0, 10)  # S allows 1 s to first token
    miss = req("explain", model="large", tier="S")
    miss.allow_background = True
    planned = r.plan(miss)  # a plan that says so: nothing sent, nothing admitted
    assert planned.would_miss and planned.tier == "S" and planned.degraded
    assert planned.predicted is not None and planned.predicted.ttft_s >= 1.0
    assert planned.request.sampling.max_tokens == miss.sampling.max_tokens  # not shortened
    assert r.metrics.value("redline_degradations_total", {"tier": "S", "action": "background"}) == 1
    assert r.admission.inflight["S"] == 0
    assert two["large"].calls == 0
    # without the opt-in the answer still comes, degraded (fastest model) and counted so
    got = await route(r, req("explain", model="large", tier="S"))
    assert got.degraded and got.model == "large"
    await drain(got)
    assert r.metrics.value("redline_degradations_total", {"tier": "S", "action": "fastest"}) == 1
    # tier A allows 3 s: 2 s meets it, so the opt-in changes nothing
    fits = req("explain", model="large", tier="A")
    fits.allow_background = True
    got = await route(r, fits)
    assert not got.degraded
    await drain(got)


async def test_errors_before_first_token_are_retried_then_fall_back() -> None:
    bad = FakeBackend("large", size_rank=2, fail_rate=1.0)
    ok = FakeBackend("small", size_rank=1)
    r = await router({"large": bad, "small": ok}, classifier="off",
                     fallbacks={"large": ["small"]})
    got = await route(r, req("hello", model="large", tier="A"))
    assert got.model == "small" and got.attempts == 2
    await drain(got)
    r2 = await router({"large": FakeBackend("large", fail_rate=1.0)}, classifier="off")
    with pytest.raises(BackendError):
        await route(r2, req("hello", model="large", tier="A"))


async def test_a_dead_backend_opens_its_breaker_and_traffic_moves() -> None:
    dead = FakeBackend("a", fail_rate=1.0)
    alive = FakeBackend("a", seed=1)
    pool = PoolBackend("m", [dead, alive])
    r = await router({"m": pool}, classifier="off", breaker_threshold=3, hedge=False)
    for _ in range(12):
        await drain(await route(r, req("hi", model="m", tier="A")))
    assert r.breakers.is_open("m/0") and not r.breakers.is_open("m/1")
    calls = dead.calls
    for _ in range(5):
        assert (await route(r, req("hi", model="m", tier="A"))).model == "m"
    assert dead.calls == calls  # no traffic to the open breaker
    assert r.metrics.backend_up.labels("m/0")._value.get() == 0


async def test_admission_sheds_b_before_a_before_s(two: dict[str, FakeBackend]) -> None:
    tiers = {"S": TierBudget(ttft_s=1, total_s=3, max_inflight=100),
             "A": TierBudget(ttft_s=3, max_inflight=100), "B": TierBudget(max_inflight=2)}
    r = await router(two, classifier="off", max_inflight=10, tiers=tiers)
    held = [await route(r, req("x", model="small", tier="B")) for _ in range(2)]
    with pytest.raises(Overloaded):  # B's own limit
        await route(r, req("x", model="small", tier="B"))
    held += [await route(r, req("x", model="small", tier="S")) for _ in range(3)]
    # 5 in flight: B is shed (at 50 %), A and S still served
    held.append(await route(r, req("x", model="small", tier="A")))
    held += [await route(r, req("x", model="small", tier="S")) for _ in range(2)]
    with pytest.raises(Overloaded) as exc:  # 8 in flight: A shed at 80 %
        await route(r, req("x", model="small", tier="A"))
    assert exc.value.retry_after is not None
    held += [await route(r, req("x", model="small", tier="S")) for _ in range(2)]
    with pytest.raises(Overloaded):  # 10: S too
        await route(r, req("x", model="small", tier="S"))
    for h in held:
        await h.rest.aclose()  # type: ignore[attr-defined]
    assert r.admission.total == 0


async def upstream_stats(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as c:
        return (await c.get(f"{url}/stats")).json()  # type: ignore[no-any-return]


async def test_hedging_takes_the_faster_replica_and_cancels_the_loser(live_app: Any) -> None:
    slow = live_app(create_upstream(UpstreamSpec(ttft=Dist(2.0), tpot=Dist(0.001))))
    fast = live_app(create_upstream(UpstreamSpec(ttft=Dist(0.01), tpot=Dist(0.001))))
    a, b = OpenAICompatBackend("m", slow.url), OpenAICompatBackend("m", fast.url)
    pool = PoolBackend("m", [a, b])
    r = await router({"m": pool}, classifier="off", hedge_budget=1.0)
    for _ in range(10):  # both replicas' observed p90 TTFT is 50 ms
        r.estimates.of(a).observe_ttft(0.05, 0, 1)
        r.estimates.of(b).observe_ttft(0.05, 0, 1)
    b.inflight = 1  # the pool's first choice is the slow replica
    got = await route(r, req("hi", model="m", tier="S"))
    b.inflight = 0
    assert got.hedged and await drain(got) == "tok tok tok tok"
    for _ in range(100):
        if (await upstream_stats(slow.url))["cancelled"] == 1:
            break
        await asyncio.sleep(0.02)
    assert (await upstream_stats(slow.url))["cancelled"] == 1
    assert (await upstream_stats(fast.url))["completed"] == 1
    await pool.close()


async def test_fcfs_mode_is_the_plain_baseline(two: dict[str, FakeBackend]) -> None:
    r = await router(two, mode="fcfs")
    got = await route(r, req("what is the capital of France?"))
    assert (got.model, got.tier) == ("small", "S")  # the default model, tier S
    await drain(got)


async def test_a_due_breaker_lets_one_probe_through_at_a_time() -> None:
    from redline.routing.breaker import Breakers

    b = Breakers(threshold=1, ttl_s=0.01)
    with pytest.raises(RuntimeError):
        async with b.guard("x"):
            raise RuntimeError("upstream down")
    assert b.is_open("x")
    await asyncio.sleep(0.02)
    assert not b.is_open("x")  # due: one probe may go
    async with b.guard("x"):
        assert b.is_open("x")  # the probe is in flight: the others wait
    assert not b.is_open("x")  # it succeeded: closed


async def test_the_backend_gets_the_tier_it_is_served_in(two: dict[str, FakeBackend]) -> None:
    """The embedded engine orders its work by tier (S first): the planned request carries
    the tier decided here, and shares the original's presence flag (streams set it)."""
    r = await router(two, rules=[RouteRule(match="urgent", tier="S")])
    asked = req("urgent: what is 2 + 2?")
    plan = r.plan(asked)
    assert asked.tier is None and plan.tier == "S" and plan.request.tier == "S"
    assert plan.request.presence is asked.presence and plan.request.id == asked.id


def test_a_list_of_prompts_is_routed_by_its_longest_and_planned_for_all() -> None:
    """A text completion with several prompts goes to one model: the longest prompt is
    what the difficulty classifier reads, and the planner counts every prompt's prefill."""
    from redline.routing.router import _last_user_text, _prompt_tokens

    long = "Explain, step by step, how a compiler turns source code into machine code. " * 4
    several = GenerationRequest(model="auto", sampling=SamplingParams(max_tokens=8),
                                prompt="hi", prompts=("hi", long, "ok"))
    one = GenerationRequest(model="auto", sampling=SamplingParams(max_tokens=8), prompt="hi")
    assert _last_user_text(several) == long
    assert _last_user_text(one) == "hi"
    assert _prompt_tokens(several) == (len(long) + 4) // 4
    assert _prompt_tokens(one) == 1
