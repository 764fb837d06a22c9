"""Capabilities in routing: `auto`, rules, fallbacks and the planner choose only models
that serve what the request needs; a chat request naming a completions-only (base) model
is a 400 on `model`, while /v1/completions still reaches it."""

from __future__ import annotations

import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from redline.api.app import create_app
from redline.backends.fake import FakeBackend
from redline.config import RedlineConfig, RouteRule, RoutingConfig
from redline.errors import InvalidRequest
from redline.routing.capabilities import Capabilities
from redline.routing.router import Routed, Router
from redline.telemetry.metrics import Metrics
from redline.types import ContentPart, FunctionTool, GenerationRequest, Message, SamplingParams

BASE = {"large": ["completions"]}  # the larger model is a base model, as gemma3-270m is

TEXTS = ["what is the capital of France?", "hi", "thanks!",
         "write a python function that implements a trie with unit tests",
         "explain in detail how TCP congestion control works, step by step",
         "write a detailed 30-page report on the global coffee market",
         "summarise this contract and list every obligation of both parties"]


def chat(text: str, model: str = "auto", tier: Any = None) -> GenerationRequest:
    return GenerationRequest(model=model, sampling=SamplingParams(max_tokens=3),
                             messages=(Message("user", text),), tier=tier)


def completion(text: str, model: str = "auto") -> GenerationRequest:
    return GenerationRequest(model=model, sampling=SamplingParams(max_tokens=3), prompt=text)


def fakes(**kw: Any) -> dict[str, FakeBackend]:
    return {"small": FakeBackend("small", size_rank=1, **kw.get("small", {})),
            "large": FakeBackend("large", size_rank=2, **kw.get("large", {}))}


async def router(backends: dict[str, FakeBackend], caps: dict[str, list[str]] | None = None,
                 **cfg: Any) -> Router:
    r = Router(backends, next(iter(backends)), RoutingConfig(**cfg), Metrics(),
               capabilities=BASE if caps is None else caps)
    await r.start()
    return r


async def drain(r: Routed) -> None:
    async for _ in r.rest:
        pass


async def test_auto_never_sends_a_chat_request_to_a_model_without_chat() -> None:
    backends = fakes()
    r = await router(backends)
    for tier in (None, "S", "A", "B"):
        for text in TEXTS:
            tier_, order, _ = r.decide(chat(text, tier=tier))
            assert order == ["small"], (text, tier, order)
            got = await r.open(r.plan(chat(text, tier=tier)))
            assert got.model == "small"
            await drain(got)
    assert backends["large"].calls == 0


async def test_without_the_capability_the_same_requests_do_reach_the_large_model() -> None:
    """The counterpart of the test above: it is the capability that keeps them off."""
    r = await router(fakes(), caps={})
    models = set()
    for tier in ("A", "B"):
        for text in TEXTS:
            got = await r.open(r.plan(chat(text, tier=tier)))
            models.add(got.model)
            await drain(got)
    assert "large" in models


async def test_the_planner_does_not_move_chat_to_a_model_without_chat() -> None:
    backends = fakes()
    r = await router(backends, classifier="off")
    # small is predicted far over budget, large well within: only completions may move
    for _ in range(10):
        r.estimates.of(backends["small"]).observe_ttft(5.0, 0, 10)
        r.estimates.of(backends["large"]).observe_ttft(0.01, 0, 10)
    got = await r.open(r.plan(chat("what is the capital of France?", tier="S")))
    assert got.model == "small"
    await drain(got)
    got = await r.open(r.plan(completion("The capital of France is")))
    assert got.model == "large"
    await drain(got)


async def test_fallbacks_skip_a_model_without_chat() -> None:
    backends = fakes(small={"fail_rate": 1.0})
    r = await router(backends, fallbacks={"small": ["large"]}, classifier="off")
    with pytest.raises(Exception) as err:
        await r.open(r.plan(chat("hello", model="small")))
    assert not isinstance(err.value, InvalidRequest)
    assert backends["large"].calls == 0
    got = await r.open(r.plan(completion("Once upon a time", model="small")))  # completions may fall back
    assert got.model == "large"
    await drain(got)


async def test_a_rule_naming_a_model_without_chat_is_passed_over_for_chat() -> None:
    backends = fakes()
    r = await router(backends, rules=[RouteRule(match=r"coffee", tier="B", model="large")])
    got = await r.open(r.plan(chat("a long report on coffee")))
    assert (got.model, got.tier) == ("small", "B")
    await drain(got)
    got = await r.open(r.plan(completion("a long report on coffee")))
    assert got.model == "large"
    await drain(got)


async def test_explicit_chat_to_a_base_model_is_a_400_on_model() -> None:
    r = await router(fakes())
    with pytest.raises(InvalidRequest) as err:
        await r.open(r.plan(chat("hello", model="large")))
    assert err.value.status == 400 and err.value.param == "model"
    assert "completions only" in err.value.message
    got = await r.open(r.plan(completion("hello", model="large")))
    assert got.model == "large"
    await drain(got)


async def test_no_chat_model_at_all_is_a_400_and_fcfs_auto_skips_a_base_default() -> None:
    r = await router(fakes(), caps={"small": ["completions"], "large": ["completions"]})
    with pytest.raises(InvalidRequest) as err:
        await r.open(r.plan(chat("hello")))
    assert err.value.param == "model"
    backends = {"base": FakeBackend("base", size_rank=1), "chatty": FakeBackend("chatty", size_rank=2)}
    r = Router(backends, "base", RoutingConfig(mode="fcfs"), Metrics(),
               capabilities={"base": ["completions"]})
    got = await r.open(r.plan(chat("hello")))
    assert got.model == "chatty"
    await drain(got)
    got = await r.open(r.plan(completion("hello")))
    assert got.model == "base"
    await drain(got)


def wait_ready(c: TestClient) -> None:
    for _ in range(600):
        if c.get("/readyz").status_code == 200:
            return
        time.sleep(0.05)
    raise TimeoutError


def test_the_api_answers_openai_shaped_400_and_completions_still_reach_the_base_model() -> None:
    config = RedlineConfig(models=[{"name": "small", "bundled": "x", "size_rank": 1},
                                   {"name": "large", "bundled": "x", "size_rank": 2,
                                    "capabilities": ["completions"]}],
                           cache={"enabled": False})
    backends = fakes()
    with TestClient(create_app(config, backends)) as c:
        wait_ready(c)
        r = c.post("/v1/chat/completions", json={
            "model": "large", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "model" and err["type"] == "invalid_request_error"
        assert "completions only" in err["message"]
        r = c.post("/v1/completions", json={"model": "large", "prompt": "hi", "max_tokens": 3})
        assert r.status_code == 200, r.text
        for text in TEXTS:
            r = c.post("/v1/chat/completions", json={
                "model": "auto", "messages": [{"role": "user", "content": text}], "max_tokens": 3,
                "tier": "A"})
            assert r.status_code == 200 and r.headers["x-redline-model"] == "small", r.text
    assert backends["large"].calls == 1



def with_fields(text: str, model: str = "auto", tier: Any = None,
                **extra: Any) -> GenerationRequest:
    return GenerationRequest(model=model, sampling=SamplingParams(max_tokens=3),
                             messages=(Message("user", text),), tier=tier, extra=extra)


async def fields_router(backends: dict[str, FakeBackend], **cfg: Any) -> Router:
    """"small" is embedded (its fields would be dropped), "large" a remote engine."""
    r = Router(backends, "small", RoutingConfig(**cfg), Metrics(),
               capabilities=Capabilities({"small": ["chat", "completions"],
                                          "large": ["chat", "completions"]},
                                         passes_fields=["large"]))
    await r.start()
    return r


async def test_fields_redline_does_not_model_only_reach_an_engine_that_is_passed_them() -> None:
    """`auto`, the planner's choices and fallbacks send a request with a field redline
    does not model (a remote engine's own, e.g. `reasoning_effort`) only to a model whose
    engine gets it as sent, never to an embedded one that would drop it; the hints every
    model honours do not count. Named, the embedded model is a 400 on the field."""
    backends = fakes()
    r = await fields_router(backends, fallbacks={"large": ["small"]})
    for tier in (None, "S", "A", "B"):
        for text in TEXTS:
            _, order, _ = r.decide(with_fields(text, tier=tier, reasoning_effort="low"))
            assert order == ["large"], (text, tier, order)
            got = await r.open(r.plan(with_fields(text, tier=tier, reasoning_effort="low")))
            assert got.model == "large"
            await drain(got)
    small_before = backends["small"].calls
    got = await r.open(r.plan(with_fields("hi", prompt_cache_key="s1")))  # a hint only
    assert got.model == "small"
    await drain(got)
    assert backends["small"].calls == small_before + 1
    with pytest.raises(InvalidRequest) as err:
        r.check(with_fields("hi", model="small", reasoning_effort="low", top_k_x=1))
    assert err.value.param == "reasoning_effort"
    # the remote model failing: no fallback to the embedded one for such a request
    backends["large"].fail_rate = 1.0
    with pytest.raises(Exception) as failed:
        await r.open(r.plan(with_fields("hi", model="large", reasoning_effort="low")))
    assert not isinstance(failed.value, InvalidRequest)
    assert backends["small"].calls == small_before + 1


async def test_auto_with_only_embedded_models_names_the_field() -> None:
    r = Router(fakes(), "small", RoutingConfig(), Metrics(),
               capabilities={"small": ["chat"], "large": ["chat"]})
    await r.start()
    with pytest.raises(InvalidRequest) as err:
        r.check(with_fields("hi", reasoning_effort="high"))
    assert err.value.param == "reasoning_effort"
    assert "remote engine" in err.value.message


async def test_fields_of_messages_parts_and_tools_count_and_empty_ones_do_not() -> None:
    r = await fields_router(fakes(), classifier="off")
    part = ContentPart("text", text="hi", extra={"cache_control": {"type": "ephemeral"}})
    asks = {
        "messages[0].name_x": (Message("user", "hi", extra={"name_x": "a"}),),
        "messages[0].content[0].cache_control": (Message("user", "hi", parts=(part,)),),
    }
    for field, messages in asks.items():
        request = GenerationRequest(model="auto", sampling=SamplingParams(max_tokens=3),
                                    messages=messages)
        assert request.unmodelled() == [field]
        assert r.decide(request)[1] == ["large"]
        with pytest.raises(InvalidRequest) as err:
            r.check(GenerationRequest(model="small", sampling=SamplingParams(max_tokens=3),
                                      messages=messages))
        assert err.value.param == field
    tool = FunctionTool("f", extra={"tool.cache_control": {"type": "ephemeral"}})
    assert GenerationRequest(model="auto", sampling=SamplingParams(max_tokens=3),
                             messages=(Message("user", "hi"),), tools=(tool,)
                             ).unmodelled() == ["tools[0].cache_control"]
    sent_back = (Message("user", "hi"),
                 Message("assistant", "hello", extra={"refusal": None, "annotations": [],
                                                      "reasoning_content": "greet"}),
                 Message("user", "again"))
    quiet = GenerationRequest(model="auto", sampling=SamplingParams(max_tokens=3),
                              messages=sent_back)
    assert quiet.unmodelled() == [] and r.decide(quiet)[1] == ["small", "large"]
