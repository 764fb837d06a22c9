"""Streams that migrate (issue 25, part 2): two fake upstream replicas of one model, each
cutting every stream after its answer's first pieces (`die_at`, the connection dropped
with no [DONE], like a killed engine) and answering "t1 t2 t3 ..." (a lost or repeated
piece shows). The stream moves to the other replica as a continuation; the client's text
equals an unbroken stream's, the event ids run on without a gap, and a resume (through
the same gateway, and through another one sharing Redis) replays the journal byte for
byte. A stream that cannot move ends with a clear error event, then [DONE]."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import httpx
import pytest

from redline.api.app import create_app
from redline.backends.fake_upstream import UpstreamSpec, create_upstream
from redline.backends.openai_compat import from_config
from redline.config import ModelConfig, RedlineConfig, RoutingConfig
from redline.routing.router import Router
from redline.telemetry.metrics import Metrics
from redline.types import GenerationRequest, Message, SamplingParams

N = 12  # tokens asked
DIE_AT = 5  # each replica cuts a stream after 5 pieces
ANSWER = " ".join(f"t{k}" for k in range(1, N + 1))


def upstreams(live_app: Any, n: int = 2, die_at: int = DIE_AT, tpot: float = 0.0) -> list[str]:
    from redline.backends.fake_upstream import Dist

    spec = UpstreamSpec(numbered=True, die_at=die_at, tpot=Dist(tpot))
    return [live_app(create_upstream(spec)).url for _ in range(n)]


def stats(urls: list[str]) -> list[dict[str, Any]]:
    return [httpx.get(f"{u}/stats").json() for u in urls]


def gateway(live_app: Any, tmp_path: Any, urls: list[str], store: str = "memory://",
            name: str = "g") -> str:
    cfg = RedlineConfig(models=[{"name": "remote", "backend": "openai", "urls": urls}],
                        cache={"enabled": False}, store={"url": store},
                        server={"data_dir": str(tmp_path / name)},
                        routing={"classifier": "off", "hedge": False},
                        streams={"resume_grace_s": 5, "journal_flush_s": 0.01})
    url: str = live_app(create_app(cfg)).url
    deadline = time.monotonic() + 60
    while httpx.get(f"{url}/readyz").status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    return url


def stream(url: str, body: dict[str, Any], cut_after: int | None = None) -> tuple[str, bytes]:
    """POST a stream; read it whole, or `cut_after` events and drop the connection."""
    with httpx.Client(timeout=30) as c, c.stream("POST", f"{url}/v1/chat/completions",
                                                 json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        got = b""
        for raw in r.iter_raw():
            got += raw
            if cut_after is not None and got.count(b"\n\n") >= cut_after:
                end = [m.end() for m in re.finditer(b"\n\n", got)][cut_after - 1]
                return r.headers["x-redline-stream-id"], got[:end]
        return r.headers["x-redline-stream-id"], got


def payloads(events: bytes) -> list[Any]:
    return [json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]"
            for line in events.decode().splitlines() if line.startswith("data: ")]


def text(events: bytes) -> str:
    return "".join((c.get("delta") or {}).get("content") or ""
                   for p in payloads(events) if isinstance(p, dict)
                   for c in p.get("choices") or ())


def seqs(events: bytes) -> list[int]:
    return [int(s) for s in re.findall(rb"^id: [^:]+:(\d+)$", events, re.M)]


CHAT = {"model": "remote", "max_tokens": N, "messages": [{"role": "user", "content": "count"}],
        "stream_options": {"include_usage": True}}


async def test_the_router_continues_a_broken_stream_on_the_other_replica(live_app: Any) -> None:
    urls = upstreams(live_app)
    pool = from_config(ModelConfig(name="m", backend="openai", urls=urls))
    router = Router({"m": pool}, "m", RoutingConfig(classifier="off", hedge=False), Metrics())
    try:
        for chat in (True, False):
            req = GenerationRequest(model="m", sampling=SamplingParams(max_tokens=N), tier="A",
                                    **({"messages": (Message("user", "count to twelve"),)} if chat
                                       else {"prompt": "count: "}))
            got = await router.open(router.plan(req))
            chunks = [got.first] + [c async for c in got.rest]
            assert "".join(c.text for c in chunks) == ANSWER
            assert chunks[-1].finish_reason == "length" and chunks[-1].error is None
            # the continuation's prompt held the 5 tokens resent: counted as completion
            usage = chunks[-1].usage
            assert usage is not None and usage.completion_tokens == N
            assert usage.prompt_tokens == (3 if chat else 1)
        seen = stats(urls)
        assert sorted((s["died"], s["continued"]) for s in seen) == [(0, 2), (2, 0)]
        # what the replica that took over was asked, the last time (text completions)
        survivor = next(u for u, s in zip(urls, seen, strict=True) if s["continued"])
        last = httpx.get(f"{survivor}/last").json()
        assert last["prompt"] == "count: t1 t2 t3 t4 t5" and last["max_tokens"] == N - DIE_AT
    finally:
        await pool.close()


def test_a_chat_continuation_is_asked_as_vllm_takes_it(live_app: Any, tmp_path: Any) -> None:
    urls = upstreams(live_app)
    url = gateway(live_app, tmp_path, urls)
    _, events = stream(url, CHAT)
    seen = stats(urls)
    survivor = next(u for u, s in zip(urls, seen, strict=True) if s["continued"])
    last = httpx.get(f"{survivor}/last").json()
    assert last["messages"][-1] == {"role": "assistant", "content": "t1 t2 t3 t4 t5"}
    assert last["continue_final_message"] is True and last["add_generation_prompt"] is False
    assert last["max_tokens"] == N - DIE_AT
    assert text(events) == ANSWER


def test_the_client_receives_what_an_unbroken_stream_gives(live_app: Any, tmp_path: Any) -> None:
    broken = gateway(live_app, tmp_path, upstreams(live_app), name="broken")
    whole = gateway(live_app, tmp_path, upstreams(live_app, die_at=0), name="whole")
    _, moved = stream(broken, CHAT)
    _, unbroken = stream(whole, CHAT)
    assert text(moved) == text(unbroken) == ANSWER
    assert seqs(moved) == seqs(unbroken) == list(range(1, len(seqs(unbroken)) + 1))

    def shape(events: bytes) -> list[Any]:  # what differs between two requests: ids, times
        out = []
        for p in payloads(events):
            if isinstance(p, dict):
                p = {k: v for k, v in p.items() if k not in ("id", "created")}
                for c in p.get("choices") or ():
                    (c.get("redline") or {}).pop("timings", None)
                    ((c.get("redline") or {}).get("progress") or {}).pop("eta_ms", None)
                p.pop("redline", None)
            out.append(p)
        return out

    assert shape(moved) == shape(unbroken)  # same events, same finish, same usage
    # and the journal replays exactly what the client got
    sid, events = stream(broken, CHAT)
    assert httpx.get(f"{broken}/v1/streams/{sid}", timeout=30).content == events


@pytest.mark.slow
def test_a_resume_through_another_gateway_replays_the_migrated_journal(
        live_app: Any, tmp_path: Any, redis_url: str) -> None:
    urls = upstreams(live_app, tpot=0.05)  # the death comes while the client is away
    a = gateway(live_app, tmp_path, urls, redis_url, "a")
    b = gateway(live_app, tmp_path, urls, redis_url, "b")
    sid, head = stream(a, CHAT, cut_after=2)  # the role event and t1
    r = httpx.get(f"{b}/v1/streams/{sid}", headers={"Last-Event-ID": f"{sid}:2"}, timeout=30)
    assert r.status_code == 200
    joined = head + r.content
    assert text(joined) == ANSWER and joined.endswith(b"data: [DONE]\n\n")
    assert seqs(joined) == list(range(1, joined.count(b"\n\n") + 1))
    assert sum(s["died"] for s in stats(urls)) == 1
    for gw in (a, b):  # finished: either gateway replays it whole, the same bytes
        assert httpx.get(f"{gw}/v1/streams/{sid}", timeout=30).content == joined
        after = httpx.get(f"{gw}/v1/streams/{sid}?after=6", timeout=30).content
        assert after == joined[[m.end() for m in re.finditer(b"\n\n", joined)][5]:]


def error_of(events: bytes) -> str:
    errors = [p["error"]["message"] for p in payloads(events)
              if isinstance(p, dict) and "error" in p]
    assert len(errors) == 1 and events.endswith(b"data: [DONE]\n\n"), events
    return str(errors[0])


def test_with_no_other_replica_the_stream_ends_with_a_clear_error(live_app: Any,
                                                                  tmp_path: Any) -> None:
    one = gateway(live_app, tmp_path, upstreams(live_app, n=1), name="one")
    _, events = stream(one, CHAT)
    assert text(events) == "t1 t2 t3 t4 t5"
    message = error_of(events)
    assert "failed after 5 tokens" in message and "no other replica" in message
    # a pool whose other replica is down: tried, then the same clear end
    dead = f"http://127.0.0.1:{_closed_port()}"
    pair = gateway(live_app, tmp_path, [*upstreams(live_app, n=1), dead], name="pair")
    for _ in range(3):  # wherever placement puts it first
        _, events = stream(pair, CHAT)
        if text(events) != "":
            break
    assert text(events) == "t1 t2 t3 t4 t5"
    assert "no other healthy replica of 'remote'" in error_of(events)


def test_a_stream_of_tool_calls_does_not_move(live_app: Any, tmp_path: Any) -> None:
    urls = upstreams(live_app, die_at=2)
    url = gateway(live_app, tmp_path, urls)
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}}}}
    _, events = stream(url, {**CHAT, "tools": [tool]})
    assert "cannot be resent as a prefix" in error_of(events)
    assert sum(s["continued"] for s in stats(urls)) == 0


def test_a_completion_of_token_ids_does_not_move() -> None:
    """Its continuation would be the ids and the text so far, which no body can say."""
    from redline.backends.continuation import why_not
    from redline.types import GenerationRequest, SamplingParams

    req = GenerationRequest(model="m", sampling=SamplingParams(), prompt="",
                            prompt_ids=((1, 2, 3),))
    assert why_not(req, "continue_final_message") == \
        "its prompt is token ids, and the text so far is not"
    assert why_not(GenerationRequest(model="m", sampling=SamplingParams(), prompt="x"),
                   "continue_final_message") is None


def test_an_answer_constrained_from_its_start_does_not_move() -> None:
    """vLLM's structured outputs, like a response_format: a continuation's grammar would
    start again at the text so far."""
    from redline.backends.continuation import why_not
    from redline.types import GenerationRequest, SamplingParams

    for extra in ({"guided_regex": "[a-z]+"}, {"structured_outputs": {"choice": ["a"]}}):
        req = GenerationRequest(model="m", sampling=SamplingParams(), prompt="x", extra=extra)
        assert why_not(req, "continue_final_message") == \
            f"its {next(iter(extra))} constrains the answer from its start"


def _closed_port() -> int:
    from conftest import free_port

    return int(free_port())


@pytest.mark.slow
def test_a_stream_whose_gateway_is_killed_goes_on_through_another(
        live_app: Any, server_factory: Any, redis_url: str) -> None:
    """kill -9 of the gateway producing a stream: a resume through the other gateway
    (sharing Redis) continues the answer from the journal, numbered on, nothing lost or
    repeated; a stream of tool calls gets a clear error event instead."""
    import signal

    urls = upstreams(live_app, die_at=0, tpot=0.05)
    n = 40
    cfg = {"models": [{"name": "remote", "backend": "openai", "urls": urls}],
           "cache": {"enabled": False}, "store": {"url": redis_url},
           "routing": {"classifier": "off", "hedge": False},
           "streams": {"resume_grace_s": 5, "journal_live": True}}
    a, b = server_factory(cfg), server_factory(cfg)
    body = {**CHAT, "max_tokens": n}
    sid, head = stream(a.url, body, cut_after=8)  # role, t1..t7; the connection stays
    a.stop(signal.SIGKILL)
    r = httpx.get(f"{b.url}/v1/streams/{sid}", headers={"Last-Event-ID": f"{sid}:8"}, timeout=30)
    assert r.status_code == 200
    joined = head + r.content
    assert text(joined) == " ".join(f"t{k}" for k in range(1, n + 1)), b.log()
    assert seqs(joined) == list(range(1, joined.count(b"\n\n") + 1))
    assert joined.endswith(b"data: [DONE]\n\n")
    # the continuation was asked of an engine replica, after the journalled text (the
    # journal may lag what the client got by one group write: regenerated, same text)
    asked = [x["messages"][-1] for x in (httpx.get(f"{u}/last").json() for u in urls)
             if x is not None and x["messages"][-1]["role"] == "assistant"]
    assert len(asked) == 1 and asked[0]["content"].startswith("t1 t2 t3 t4 t5")
    assert text(joined).startswith(asked[0]["content"] + " ")
    # b owns it now: finished, it replays it whole: the same text, and the same bytes
    # after what the client had (events the dead gateway sent past its last journal
    # write were made again by b, with b's timestamps and no progress field)
    replay = httpx.get(f"{b.url}/v1/streams/{sid}", timeout=30).content
    assert text(replay) == text(joined) and replay.endswith(r.content)
