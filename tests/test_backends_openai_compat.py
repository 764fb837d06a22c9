"""The OpenAI-compatible backend against a fake upstream served over real HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from redline.backends.fake import FakeBackend
from redline.backends.fake_upstream import Dist, UpstreamSpec, create_upstream
from redline.backends.openai_compat import OpenAICompatBackend, _chunk, from_config
from redline.backends.pool import PoolBackend
from redline.config import ModelConfig
from redline.errors import BackendError, InvalidRequest
from redline.types import Chunk, GenerationRequest, Message, SamplingParams


def chat(n: int = 5, text: str = "hello there") -> GenerationRequest:
    return GenerationRequest(model="m", sampling=SamplingParams(max_tokens=n),
                             messages=(Message("user", text),))


async def stats(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as c:
        return (await c.get(f"{url}/stats")).json()  # type: ignore[no-any-return]


async def test_streams_chat_and_text(live_app: Any) -> None:
    up = live_app(create_upstream(UpstreamSpec(ttft=Dist(0.01), tpot=Dist(0.001))))
    b = OpenAICompatBackend("m", up.url)
    chunks = [c async for c in b.stream(chat(5))]
    assert "".join(c.text for c in chunks) == "tok tok tok tok tok"
    last = chunks[-1]
    assert last.finish_reason == "length" and last.usage is not None
    assert last.usage.completion_tokens == 5 and last.usage.prompt_tokens == 2
    assert last.timings is not None and "prefill" in last.timings.seconds
    assert sum(c.tokens for c in chunks) == 5
    text = GenerationRequest(model="m", sampling=SamplingParams(max_tokens=3), prompt="a b c")
    assert "".join([c.text async for c in b.stream(text)]) == "tok tok tok"
    await b.close()


async def test_closing_the_stream_cancels_upstream(live_app: Any) -> None:
    up = live_app(create_upstream(UpstreamSpec(ttft=Dist(0.01), tpot=Dist(0.05))))
    b = OpenAICompatBackend("m", up.url)
    it = b.stream(chat(200))
    async for _ in it:
        break
    await it.aclose()  # type: ignore[attr-defined]
    for _ in range(100):
        if (await stats(up.url))["cancelled"] == 1:
            break
        await asyncio.sleep(0.02)
    s = await stats(up.url)
    assert s["cancelled"] == 1 and s["completed"] == 0 and b.load() == 0
    await b.close()


async def test_errors_before_the_first_token(live_app: Any) -> None:
    up = live_app(create_upstream(UpstreamSpec(fail_rate=1.0)))
    b = OpenAICompatBackend("m", up.url)
    with pytest.raises(BackendError, match="500"):
        async for _ in b.stream(chat()):
            pass
    await b.close()
    dead = OpenAICompatBackend("m", "http://127.0.0.1:9", connect_timeout_s=0.5)
    with pytest.raises(BackendError, match="unreachable"):
        async for _ in dead.stream(chat()):
            pass
    await dead.close()


async def test_upstream_400_is_the_users_error(live_app: Any) -> None:
    app = FastAPI()

    @app.get("/readyz")
    async def ready() -> dict[str, str]:
        return {"status": "ready"}

    @app.post("/v1/chat/completions")
    async def refuse() -> JSONResponse:
        return JSONResponse({"error": {"message": "bad temperature", "type": "x", "param": None,
                                       "code": None}}, status_code=400)

    up = live_app(app)
    b = OpenAICompatBackend("m", up.url)
    with pytest.raises(InvalidRequest, match="bad temperature"):
        async for _ in b.stream(chat()):
            pass
    await b.close()


async def test_connection_is_reused_after_a_complete_stream(live_app: Any) -> None:
    up = live_app(create_upstream(UpstreamSpec(ttft=Dist(0.0), tpot=Dist(0.0))))
    b = OpenAICompatBackend("m", up.url)
    for _ in range(5):
        assert "".join([c.text async for c in b.stream(chat(3))]) == "tok tok tok"
    # read to the end of each body, every stream went back to the pool: one connection
    assert b.pool.opened == 1 and b.pool.idle == 1
    await b.close()


def test_config_builds_a_pool_from_replica_urls() -> None:
    one = from_config(ModelConfig(name="m", backend="openai", url="http://a:1"))
    assert isinstance(one, OpenAICompatBackend) and one.base == "http://a:1/v1"
    pool = from_config(ModelConfig(name="m", backend="openai", urls=["http://a:1", "http://b:2/v1"]))
    assert isinstance(pool, PoolBackend) and len(pool.replicas) == 2
    with pytest.raises(ValueError, match="url"):
        ModelConfig(name="m", backend="openai")


async def test_pool_sends_to_the_least_outstanding_replica() -> None:
    a, b = FakeBackend("a", ttft_s=0.05), FakeBackend("b", ttft_s=0.05)
    pool = PoolBackend("m", [a, b])
    a.inflight = 3  # a is busy
    assert all(pool.pick() is b for _ in range(4))
    a.inflight = 0
    picks = {id(pool.pick()) for _ in range(4)}
    assert picks == {id(a), id(b)}  # ties alternate
    assert pool.pick(exclude=[a]) is b and pool.pick(usable=lambda r: r is a) is a


async def last_body(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as c:
        return (await c.get(f"{url}/last")).json()  # type: ignore[no-any-return]


@pytest.mark.parametrize(("setting", "sent"), [
    ("off", {"S": None, "B": None}),
    ("lower-first", {"S": 0, "B": 2}),  # vLLM --scheduling-policy priority
    ("higher-first", {"S": 2, "B": 0}),  # SGLang --enable-priority-scheduling
])
async def test_tier_goes_upstream_as_priority_only_when_configured(live_app: Any, setting: str,
                                                                   sent: dict[str, Any]) -> None:
    up = live_app(create_upstream(UpstreamSpec(ttft=Dist(0.001), tpot=Dist(0.001))))
    cfg = ModelConfig(name="m", backend="openai", url=up.url, upstream_priority=setting)
    b = from_config(cfg)
    for tier, value in sent.items():
        req = chat(2)
        req.tier = tier  # type: ignore[assignment]
        req.extra = {"priority": 99}  # a client's own does not outrank its tier
        _ = [c async for c in b.stream(req)]
        body = await last_body(up.url)
        assert body.get("priority") == (99 if value is None else value)
    await b.close()


@pytest.mark.parametrize(("choice", "want"), [
    ({"index": 0, "delta": {"content": "hi"}}, Chunk(text="hi", tokens=1)),
    ({"index": 2, "delta": {"content": "hi"}, "finish_reason": None, "logprobs": None},
     Chunk(text="hi", tokens=1, index=2)),
    ({"index": 0, "delta": {"content": ""}}, None),
    ({"index": 0, "delta": {"role": "assistant", "content": "hi"}}, Chunk(text="hi", tokens=1)),
    ({"index": 0, "delta": {"content": "hi", "refusal": "no"}},
     Chunk(text="hi", tokens=1, extra={"refusal": "no"})),
    ({"index": 0, "delta": {"content": "hi"}, "finish_reason": "length"},
     Chunk(text="hi", tokens=1, finish_reason="length")),
    ({"index": 0, "delta": {"content": None}}, None),
    # a structured-output refusal streams as its own field: passed back, never dropped
    ({"index": 0, "delta": {"refusal": "I can't"}}, Chunk(tokens=1, extra={"refusal": "I can't"})),
])
def test_a_text_delta_alone_is_the_chunk_the_general_path_makes(choice, want):
    """The relayed token's fast path (a text delta alone) and the general parsing agree."""
    assert _chunk(choice) == want
