"""Two replicas sharing a real redis-server, in front of one fake upstream: a
conversation by previous_response_id whose turns alternate between the replicas is the
same as on one replica, and a streamed response cut on one replica is resumed on the
other (starting_after) while it is still being generated, byte for byte; a
/v1/conversations conversation, and a stored chat completion, are one on both."""

from __future__ import annotations

import contextlib
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_support import Live

from redline.api.app import create_app
from redline.backends.fake_upstream import Dist, UpstreamSpec, create_upstream
from redline.backends.openai_compat import from_config
from redline.config import RedlineConfig

pytestmark = pytest.mark.slow


@pytest.fixture
def replicas(tmp_path: Path, redis_url: str) -> Iterator[tuple[str, str, str]]:
    with contextlib.ExitStack() as stack:
        up = stack.enter_context(Live(create_upstream(
            UpstreamSpec(ttft=Dist(0.0), tpot=Dist(0.01)), name="served")))
        urls = []
        for name in "ab":
            cfg = RedlineConfig(models=[{"name": "remote", "backend": "openai", "url": up.url,
                                         "upstream_model": "served"}],
                                cache={"enabled": False}, store={"url": redis_url},
                                server={"data_dir": str(tmp_path / name)})
            app = create_app(cfg, backends={"remote": from_config(cfg.models[0])})
            urls.append(stack.enter_context(Live(app)).url)
        yield urls[0], urls[1], up.url


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="key-a", max_retries=0)


def _conversation(urls: list[str], up: str) -> tuple[list[str], list[dict[str, Any]]]:
    previous = None
    answers = []
    for turn, url in enumerate(urls):
        with _client(url) as client:
            r = client.responses.create(model="remote", input=f"turn {turn}",
                                        max_output_tokens=turn + 1, instructions="Be brief.",
                                        previous_response_id=previous)
        answers.append(r.output_text)
        previous = r.id
    return answers, httpx.get(f"{up}/last").json()["messages"]


def test_a_conversation_alternating_replicas_is_the_same_as_on_one(
        replicas: tuple[str, str, str]) -> None:
    a, b, up = replicas
    one = _conversation([a] * 5, up)
    alternating = _conversation([a, b, a, b, a], up)
    assert alternating == one
    answers, sent = one
    assert answers == [" ".join(["tok"] * (i + 1)) for i in range(5)]
    assert len(sent) == 1 + 2 * 5 - 1 and sent[0]["role"] == "system"  # the whole chain


def test_a_conversation_object_is_shared_by_the_replicas(
        replicas: tuple[str, str, str]) -> None:
    """A /v1/conversations conversation made on one replica, continued by responses on
    both, its items added and deleted on either: each replica sees the same items."""
    a, b, up = replicas
    with _client(a) as ca, _client(b) as cb:
        conv = ca.conversations.create(metadata={"k": "v"})
        for turn, client in enumerate([cb, ca, cb]):
            client.responses.create(model="remote", input=f"turn {turn}", max_output_tokens=2,
                                    conversation=conv.id)
        sent = httpx.get(f"{up}/last").json()["messages"]
        assert [m["content"] for m in sent if m["role"] == "user"] == [
            "turn 0", "turn 1", "turn 2"]
        on_a = [i.id for i in ca.conversations.items.list(conv.id, order="asc")]
        on_b = [i.id for i in cb.conversations.items.list(conv.id, order="asc")]
        assert on_a == on_b and len(on_a) == 6
        cb.conversations.items.delete(on_a[0], conversation_id=conv.id)
        assert [i.id for i in ca.conversations.items.list(conv.id, order="asc")] == on_a[1:]
        assert ca.conversations.retrieve(conv.id).metadata == {"k": "v"}
        ca.conversations.delete(conv.id)
        with pytest.raises(openai.NotFoundError):
            cb.conversations.items.list(conv.id)


def test_a_stored_chat_completion_is_shared_by_the_replicas(
        replicas: tuple[str, str, str]) -> None:
    """`store: true` on one replica: listed, read, updated and deleted on the other."""
    a, b, _ = replicas
    with _client(a) as ca, _client(b) as cb:
        r = ca.chat.completions.create(model="remote", max_tokens=3, store=True,
                                       metadata={"k": "v"},
                                       messages=[{"role": "user", "content": "hi"}])
        assert cb.chat.completions.retrieve(r.id).choices[0].message.content == \
            r.choices[0].message.content
        assert [c.id for c in cb.chat.completions.list(metadata={"k": "v"})] == [r.id]
        cb.chat.completions.update(r.id, metadata={"k": "w"})
        assert [c.id for c in ca.chat.completions.list(metadata={"k": "w"})] == [r.id]
        ca.chat.completions.delete(r.id)
        with pytest.raises(openai.NotFoundError):
            cb.chat.completions.retrieve(r.id)


def _cut(url: str, body: dict[str, Any], events: int) -> tuple[str, bytes]:
    with httpx.stream("POST", f"{url}/v1/responses", json={**body, "stream": True},
                      headers={"Authorization": "Bearer key-a"}, timeout=60) as r:
        assert r.status_code == 200
        got = b""
        for raw in r.iter_raw():
            got += raw
            if got.count(b"\n\n") >= events:
                end = [m.end() for m in re.finditer(b"\n\n", got)][events - 1]
                return r.headers["x-request-id"], got[:end]
    raise AssertionError("the stream ended early")


def test_a_stream_cut_on_one_replica_resumes_on_the_other(replicas: tuple[str, str, str]) -> None:
    a, b, _ = replicas
    body = {"model": "remote", "input": "hi", "max_output_tokens": 120}
    for k in (1, *random.Random(20).sample(range(2, 60), 6)):
        rid, head = _cut(a, body, k)  # 120 tokens x 10 ms: still generating on a
        r = httpx.get(f"{b}/v1/responses/{rid}", params={"stream": "true", "starting_after": k - 1},
                      headers={"Authorization": "Bearer key-a"}, timeout=60)
        assert r.status_code == 200
        joined = head + r.content
        datas = [json.loads(e.split(b"data: ", 1)[1]) for e in joined.split(b"\n\n")[:-2]]
        assert [d["sequence_number"] for d in datas] == list(range(len(datas)))
        assert datas[-1]["type"] == "response.incomplete"
        assert datas[-1]["response"]["output_text"] == " ".join(["tok"] * 120)
        whole = httpx.get(f"{a}/v1/responses/{rid}", params={"stream": "true"},
                          headers={"Authorization": "Bearer key-a"}, timeout=60)
        assert whole.content == joined  # what an uninterrupted reader got
        with _client(b) as client:  # and the stored answer is on every replica
            assert client.responses.retrieve(rid).output_text == datas[-1]["response"]["output_text"]


def test_a_streaming_response_is_in_progress_on_every_replica(
        replicas: tuple[str, str, str]) -> None:
    a, b, _ = replicas
    rid, _ = _cut(a, {"model": "remote", "input": "hi", "max_output_tokens": 1000}, 3)
    with _client(b) as client:  # 1000 tokens x 10 ms: generating for seconds yet
        assert client.responses.retrieve(rid).status == "in_progress"
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model="remote", input="x", previous_response_id=rid)
        assert err.value.param == "previous_response_id"
        with pytest.raises(openai.BadRequestError):  # its end would write it again
            client.responses.delete(rid)
        with pytest.raises(openai.NotFoundError):
            client.responses.cancel("resp_unknown")
        events = list(client.responses.retrieve(rid, stream=True, starting_after=1))
        assert events[-1].type == "response.incomplete"
        assert client.responses.retrieve(rid).status == "incomplete"


def test_a_background_response_started_on_one_is_resumed_on_the_other(
        replicas: tuple[str, str, str]) -> None:
    a, b, _ = replicas
    with _client(a) as client:
        r = client.responses.create(model="remote", input="hi", max_output_tokens=150,
                                    background=True)
    auth = {"Authorization": "Bearer key-a"}
    with httpx.stream("GET", f"{b}/v1/responses/{r.id}", params={"stream": "true"},
                      headers=auth, timeout=60) as s:  # 150 x 10 ms: still running
        head = b""
        for raw in s.iter_raw():
            head += raw
            if head.count(b"\n\n") >= 8:
                break
    head = head[:[m.end() for m in re.finditer(b"\n\n", head)][7]]
    rest = httpx.get(f"{b}/v1/responses/{r.id}", params={"stream": "true", "starting_after": 7},
                     headers=auth, timeout=60)
    whole = httpx.get(f"{a}/v1/responses/{r.id}", params={"stream": "true"},
                      headers=auth, timeout=60)
    assert head + rest.content == whole.content  # byte for byte, across the replicas
    last = json.loads(whole.content.split(b"\n\n")[-3].split(b"data: ", 1)[1])
    assert last["response"]["output_text"] == " ".join(["tok"] * 150)
    with _client(b) as client:
        assert client.responses.retrieve(r.id).status == "incomplete"
