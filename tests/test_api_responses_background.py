"""Background responses (`background: true`) through the official `openai` client:
accepted as `queued`, run as a durable job, read by GET while they run, streamed and
resumed by `starting_after`, cancelled (queued or running), and each tenant's alone."""

from __future__ import annotations

import json
import time
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

FINAL = ("completed", "failed", "incomplete", "cancelled")
Env = tuple[openai.OpenAI, openai.OpenAI, str]


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """A gateway whose worker runs one job at a time, in front of an upstream that
    takes 10 ms a token (so a long answer is still running when a test looks)."""
    data: Path = tmp_path_factory.mktemp("background")
    with Live(create_upstream(UpstreamSpec(ttft=Dist(0.0), tpot=Dist(0.01)),
                              name="served")) as up:
        cfg = RedlineConfig(models=[{"name": "remote", "backend": "openai", "url": up.url,
                                     "upstream_model": "served"}],
                            cache={"enabled": False}, server={"data_dir": str(data)},
                            jobs={"concurrency": 1, "lease_s": 3})
        with Live(create_app(cfg, backends={"remote": from_config(cfg.models[0])})) as gw:
            a = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="key-a", max_retries=0)
            b = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="key-b", max_retries=0)
            yield a, b, gw.url
            a.close()
            b.close()


def _wait(client: openai.OpenAI, rid: str, until: tuple[str, ...] = FINAL,
          timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        r = client.responses.retrieve(rid)
        if r.status in until:
            return r
        assert time.monotonic() < deadline, r.status
        time.sleep(0.02)


def test_a_background_response_is_queued_then_completed(env: Env) -> None:
    a, b, _ = env
    r = a.responses.create(model="remote", input="hi", max_output_tokens=5, background=True,
                           instructions="Be brief.")
    assert r.status in ("queued", "in_progress") and r.background and r.output == []
    assert r.usage is None  # none yet
    done = _wait(a, r.id)
    assert done.status == "incomplete"  # 5 tokens: its max_output_tokens
    assert done.output_text == " ".join(["tok"] * 5) and done.usage.output_tokens == 5
    assert done.background and done.created_at == r.created_at
    items = a.responses.input_items.list(r.id)
    assert [i.type for i in items.data] == ["message"]
    follow = a.responses.create(model="remote", input="more", max_output_tokens=2,
                                previous_response_id=r.id)  # it continues the chain
    assert follow.output_text == "tok tok"
    for call in (lambda: b.responses.retrieve(r.id), lambda: b.responses.cancel(r.id),
                 lambda: b.responses.input_items.list(r.id)):
        with pytest.raises(openai.NotFoundError):  # another tenant's
            call()
    with pytest.raises(openai.BadRequestError) as err:  # finished: not cancelled any more
        a.responses.cancel(r.id)
    assert "incomplete" in err.value.message


def test_a_background_stream_is_followed_and_resumed(env: Env) -> None:
    a, _, url = env
    with httpx.stream("POST", f"{url}/v1/responses", timeout=60,
                      headers={"Authorization": "Bearer key-a"},
                      json={"model": "remote", "input": "hi", "max_output_tokens": 30,
                            "background": True, "stream": True}) as r:
        assert r.status_code == 200
        whole = b"".join(r.iter_raw())
    events = [json.loads(e.split(b"data: ", 1)[1]) for e in whole.split(b"\n\n")[:-2]]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created"
    assert events[0]["response"]["status"] == "queued"
    assert events[-1]["type"] == "response.incomplete"
    rid = events[0]["response"]["id"]
    assert events[-1]["response"]["output_text"] == " ".join(["tok"] * 30)
    for k in (0, 3, len(events) - 2):  # resumed after event k: the rest, byte for byte
        rest = httpx.get(f"{url}/v1/responses/{rid}", timeout=60,
                         params={"stream": "true", "starting_after": k},
                         headers={"Authorization": "Bearer key-a"})
        assert rest.status_code == 200
        head = b"".join(e + b"\n\n" for e in whole.split(b"\n\n")[:k + 1])
        assert head + rest.content == whole
    streamed = list(a.responses.retrieve(rid, stream=True, starting_after=2))
    assert streamed[0].sequence_number == 3 and streamed[-1].type == "response.incomplete"


def test_cancel_a_running_and_a_queued_background_response(env: Env) -> None:
    a, _, url = env
    running = a.responses.create(model="remote", input="long", max_output_tokens=3000,
                                 background=True)  # 30 s at 10 ms a token
    queued = a.responses.create(model="remote", input="next", max_output_tokens=3,
                                background=True)  # behind it: one job at a time
    _wait(a, running.id, until=("in_progress",))
    assert a.responses.retrieve(queued.id).status == "queued"
    c = a.responses.cancel(queued.id)
    assert c.status == "cancelled" and c.output == []
    assert a.responses.retrieve(queued.id).status == "cancelled"
    c = a.responses.cancel(running.id)
    assert c.status == "cancelled"
    r = a.responses.retrieve(running.id)
    assert r.status == "cancelled"
    assert 0 < r.output_text.count("tok") < 3000  # what it had produced when it stopped
    assert a.responses.cancel(running.id).status == "cancelled"  # again: idempotent
    replay = httpx.get(f"{url}/v1/responses/{running.id}", params={"stream": "true"},
                       headers={"Authorization": "Bearer key-a"}, timeout=60)
    last = json.loads(replay.content.split(b"\n\n")[-3].split(b"data: ", 1)[1])
    assert last["response"]["status"] == "cancelled"
    job = httpx.get(f"{url}/v1/jobs/{running.id}", headers={"Authorization": "Bearer key-a"})
    assert job.json()["status"] == "cancelled"
    with pytest.raises(openai.BadRequestError) as err:  # a foreground one: not cancellable
        a.responses.cancel(a.responses.create(model="remote", input="x",
                                              max_output_tokens=1).id)
    assert "background" in err.value.message


def test_a_chain_cannot_continue_a_running_background_response(env: Env) -> None:
    a, _, _ = env
    r = a.responses.create(model="remote", input="long", max_output_tokens=2000,
                           background=True)
    with pytest.raises(openai.BadRequestError) as err:
        a.responses.create(model="remote", input="x", previous_response_id=r.id)
    assert err.value.param == "previous_response_id"
    with pytest.raises(openai.BadRequestError):  # its end would write it again
        a.responses.delete(r.id)
    assert a.responses.cancel(r.id).status == "cancelled"


def test_background_responses_in_a_conversation_see_each_other(env: Env) -> None:
    """A background response reads its conversation when a worker runs it (not when it
    was accepted), so one queued behind another continues from it; each adds its turn
    once it has run, and one cancelled while queued adds nothing."""
    a, _, _ = env
    conv = a.conversations.create()
    blocker = a.responses.create(model="remote", input="long", max_output_tokens=300,
                                 background=True)
    first = a.responses.create(model="remote", input="one", max_output_tokens=3,
                               background=True, conversation=conv.id)
    dropped = a.responses.create(model="remote", input="never", max_output_tokens=3,
                                 background=True, conversation=conv.id)
    second = a.responses.create(model="remote", input="two", max_output_tokens=3,
                                background=True, conversation=conv.id)
    assert a.responses.cancel(dropped.id).status == "cancelled"  # still queued
    a.responses.cancel(blocker.id)
    done = [_wait(a, r.id) for r in (first, second)]
    assert [r.status for r in done] == ["incomplete", "incomplete"]  # at their limit: ran
    assert done[1].conversation is not None and done[1].conversation.id == conv.id
    items = list(a.conversations.items.list(conv.id, order="asc"))
    texts = ["".join(p.text for p in i.content) for i in items]
    assert texts == ["one", done[0].output_text, "two", done[1].output_text]
    assert [i.role for i in items] == ["user", "assistant", "user", "assistant"]
    # the second was asked with the first's turn before its own (the upstream counts
    # a prompt's words): had it read the conversation when accepted, it held nothing
    assert done[0].usage is not None and done[1].usage is not None
    assert done[1].usage.input_tokens >= done[0].usage.input_tokens + 3


def test_a_job_that_ended_without_writing_its_end_reads_as_failed() -> None:
    from redline.api.responses_background import view
    from redline.jobs.model import Job

    queued = {"id": "resp_x", "status": "queued", "error": None, "usage": None}
    job = Job(id="resp_x", kind="response", spec={"response": queued})
    assert view(job, None) == queued  # known from the job alone (a memory store restarted)
    job.status = "running"
    assert view(job, queued)["status"] == "in_progress"  # type: ignore[index]
    job.status, job.error = "failed", {"code": "max_attempts", "message": "tried 3 times"}
    failed = view(job, {**queued, "status": "in_progress"})
    assert failed is not None and failed["status"] == "failed"  # never in_progress forever
    assert failed["error"] == {"code": "server_error", "message": "tried 3 times"}
