"""The OpenAI Batch API through the official openai client, unmodified, against a real
uvicorn socket (in-process app on a FakeBackend)."""

from __future__ import annotations

import dataclasses
import io
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from conftest import LiveApp

from redline.api.app import create_app
from redline.api.job_body import decode_body
from redline.backends.fake import FakeBackend
from redline.config import load_config
from redline.errors import InvalidRequest
from redline.jobs.spec import JobSpec


@pytest.fixture
def live(tmp_path: Path) -> Iterator[LiveApp]:
    cfg = load_config(server={"data_dir": str(tmp_path / "data")}, routing={"classifier": "off"},
                      jobs={"lease_s": 3})
    with LiveApp(create_app(cfg, backends={"fake": FakeBackend(tpot_s=0.001)})) as app:
        yield app


@pytest.fixture
def client(live: LiveApp) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0)


def jsonl(lines: list[dict[str, object]]) -> bytes:
    return ("\n".join(json.dumps(x) for x in lines) + "\n").encode()


def chat_line(cid: str, n: int, model: str = "fake") -> dict[str, object]:
    return {"custom_id": cid, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "max_tokens": n,
                     "messages": [{"role": "user", "content": f"question {cid}"}]}}


def wait_batch(client: openai.OpenAI, batch_id: str, timeout: float = 60) -> object:
    deadline = time.monotonic() + timeout
    while True:
        b = client.batches.retrieve(batch_id)
        if b.status in ("completed", "failed", "cancelled", "expired"):
            return b
        assert time.monotonic() < deadline, b.status
        time.sleep(0.05)


def test_batch_round_trip(client: openai.OpenAI) -> None:
    lines = [chat_line(f"q{i}", 2 + i % 3) for i in range(6)]
    lines.append(chat_line("bad-model", 2, model="nope"))  # fails at run: error file
    f = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(lines))), purpose="batch")
    assert f.object == "file" and f.purpose == "batch" and f.bytes == len(jsonl(lines))
    assert client.files.retrieve(f.id).filename == "in.jsonl"
    assert client.files.content(f.id).content == jsonl(lines)

    batch = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"team": "reports"})
    assert batch.object == "batch" and batch.metadata == {"team": "reports"}
    done = wait_batch(client, batch.id)
    assert done.status == "completed"  # type: ignore[attr-defined]
    assert done.request_counts.total == 7  # type: ignore[attr-defined]
    assert done.request_counts.completed == 6 and done.request_counts.failed == 1  # type: ignore[attr-defined]

    out = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]  # type: ignore[attr-defined]
    assert [o["custom_id"] for o in out] == [f"q{i}" for i in range(6)]
    for i, o in enumerate(out):
        body = o["response"]["body"]
        assert o["response"]["status_code"] == 200 and o["error"] is None
        assert body["object"] == "chat.completion"
        assert body["usage"]["completion_tokens"] == 2 + i % 3
    err = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]  # type: ignore[attr-defined]
    assert [e["custom_id"] for e in err] == ["bad-model"]
    assert err[0]["response"]["status_code"] == 404

    listed = client.batches.list(limit=10)
    assert batch.id in [b.id for b in listed.data]


def test_invalid_input_fails_validation(client: openai.OpenAI) -> None:
    raw = jsonl([chat_line("a", 2), chat_line("a", 2)]) + b"{not json\n"
    f = client.files.create(file=("in.jsonl", io.BytesIO(raw)), purpose="batch")
    b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                              completion_window="24h")
    assert b.status == "failed" and b.errors is not None
    codes = {(e.code, e.line) for e in b.errors.data or []}
    assert codes == {("duplicate_custom_id", 2), ("invalid_json", 3)}


def test_client_errors(client: openai.OpenAI, live: LiveApp) -> None:
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve("file-nope")
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions",
                              completion_window="24h")
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("x.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
    r = httpx.post(live.url + "/v1/files", data={"purpose": "batch"})  # no file part
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_cancel_keeps_partial_output(tmp_path: Path) -> None:
    cfg = load_config(server={"data_dir": str(tmp_path / "data")}, routing={"classifier": "off"},
                      jobs={"lease_s": 3, "batch_concurrency": 1})
    with LiveApp(create_app(cfg, backends={"fake": FakeBackend(tpot_s=0.02)})) as app:
        client = openai.OpenAI(base_url=app.url + "/v1", api_key="none", max_retries=0)
        f = client.files.create(file=("in.jsonl", io.BytesIO(jsonl(
            [chat_line(f"q{i}", 20) for i in range(40)]))), purpose="batch")
        b = client.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
        deadline = time.monotonic() + 30
        while client.batches.retrieve(b.id).request_counts.completed < 2:  # type: ignore[union-attr]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert client.batches.cancel(b.id).status == "cancelling"
        done = wait_batch(client, b.id)
        assert done.status == "cancelled"  # type: ignore[attr-defined]
        out = client.files.content(done.output_file_id).text.splitlines()  # type: ignore[attr-defined]
        assert 2 <= len(out) < 40


def test_a_job_keeps_the_body_of_a_request_beyond_plain_text() -> None:
    """The typed copy holds text and sampling; anything more is kept as the body the
    client sent (read again by the api when the job runs), and survives the queue's JSON."""
    plain = decode_body("/v1/chat/completions", dict(chat_line("p", 3)["body"]))  # type: ignore[call-overload]
    assert plain.body is None and plain.messages == [("user", "question p")]
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "n": 2,
            "logprobs": True, "frobnicate": [1]}
    spec = decode_body("/v1/chat/completions", body)
    assert spec.body == body and spec.messages is None
    assert JobSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    with pytest.raises(ValueError):
        spec.request()  # the api reads it: the typed copy would drop fields
    req = plain.request()
    two = dataclasses.replace(req, sampling=dataclasses.replace(req.sampling, n=2))
    with pytest.raises(InvalidRequest):  # no body to keep (scheduled precompute): refused
        JobSpec.of("chat", two)
