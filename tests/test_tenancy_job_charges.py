"""Jobs and batch lines are charged to the API key that made them (issue 21): its token
budget, its model allowlist and its row in GET /v1/admin/usage, as a live request is."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from jobs_support import wait_until

from redline.api.app import create_app
from redline.api.auth import digest
from redline.api.services import services_of
from redline.backends.fake import FakeBackend
from redline.config import RedlineConfig

ADMIN, USER = "sk-admin", "sk-team-a"


def chat(max_tokens: int = 3, model: str = "fake") -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "hi"}]}


def h(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(params=["sqlite", "redis"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The key is looked up by its id where the job runs: in SQLite, and in Redis (what
    replicas share)."""
    if request.param == "redis":
        url: str = request.getfixturevalue("redis_server").rsplit("/", 1)[0] + "/12"
        import redis

        redis.Redis.from_url(url).flushdb()
        return url
    return f"sqlite:///{tmp_path / 'r.db'}"


@pytest.fixture
def client(store_url: str, tmp_path: Path) -> Iterator[TestClient]:
    cfg = RedlineConfig(auth={"keys": [{"name": "ops", "sha256": digest(ADMIN), "role": "admin"},
                                       {"name": "team-a", "sha256": digest(USER)}]},
                        store={"url": store_url},
                        server={"data_dir": str(tmp_path)}, cache={"enabled": False},
                        routing={"classifier": "off"})
    app = create_app(cfg, backends={"fake": FakeBackend(), "other": FakeBackend("other")})
    with TestClient(app) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200, timeout=60)
        yield c


def make_key(c: TestClient, **spec: Any) -> tuple[str, str]:
    r = c.post("/v1/admin/keys", json={"tenant": "team-a", **spec}, headers=h(ADMIN))
    assert r.status_code == 200, r.text
    return str(r.json()["key"]), str(r.json()["id"])


def usage_of(c: TestClient, key_id: str) -> dict[str, Any]:
    rows = c.get("/v1/admin/usage", params={"group_by": "key"}, headers=h(ADMIN)).json()["data"]
    return next((r for r in rows if r["key"] == key_id), {})


def upload(c: TestClient, key: str, lines: list[dict[str, Any]]) -> str:
    raw = "".join(json.dumps(x) + "\n" for x in lines).encode()
    r = c.post("/v1/files", headers=h(key), data={"purpose": "batch"},
               files={"file": ("in.jsonl", io.BytesIO(raw), "application/jsonl")})
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def batch(c: TestClient, key: str, file_id: str) -> Any:
    return c.post("/v1/batches", headers=h(key), json={
        "input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"})


def test_a_job_spends_its_keys_budget_and_shows_in_its_usage(client: TestClient) -> None:
    c = client
    key, key_id = make_key(c, budget_tokens=10, budget_period_s=86400)
    file_id = upload(c, key, [{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions",
                               "body": chat()}])
    r = c.post("/v1/chat/completions", json={**chat(20), "background": True}, headers=h(key))
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    wait_until(lambda: c.get(f"/v1/jobs/{job_id}", headers=h(key)).json()["status"]
               in ("succeeded", "failed"), timeout=60)
    job = c.get(f"/v1/jobs/{job_id}", headers=h(key)).json()
    assert job["status"] == "succeeded", job
    # counted under the key that made it, as a live request is
    row = usage_of(c, key_id)
    assert row["tenant"] == "team-a" and row["requests"] == 1, row
    assert row["output_tokens"] == job["result"]["usage"]["completion_tokens"] == 20
    # its 20 tokens spent the key's budget of 10: the key is refused now, whatever the way
    last: list[Any] = []

    def spent() -> bool:
        last[:] = [c.post("/v1/chat/completions", json=chat(), headers=h(key))]
        return bool(last[0].status_code == 429)

    wait_until(spent, timeout=10)  # charged when the job's answer ends (a store add)
    assert last[0].json()["error"]["code"] == "insufficient_quota"
    refused = batch(c, key, file_id)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "insufficient_quota"
    assert float(refused.headers["retry-after"]) > 0
    refused = c.post("/v1/responses", json={"model": "fake", "input": "hi", "background": True},
                     headers=h(key))
    assert refused.status_code == 429, refused.text
    # the tenant's other key has a budget of its own (none): not affected
    assert c.post("/v1/chat/completions", json=chat(), headers=h(USER)).status_code == 200


def test_batch_lines_are_charged_to_their_key_and_held_to_its_allowlist(
        client: TestClient) -> None:
    c = client
    # each allowed line costs 1 + 4 tokens: the first leaves 4 of 9, the second spends it
    key, key_id = make_key(c, models=["fake"], budget_tokens=9, budget_period_s=86400)
    lines = [{"custom_id": f"ok-{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": chat(4)} for i in range(2)]
    lines.append({"custom_id": "not-allowed", "method": "POST", "url": "/v1/chat/completions",
                  "body": chat(4, model="other")})
    made = batch(c, key, upload(c, key, lines))
    assert made.status_code == 200, made.text
    batch_id = made.json()["id"]
    wait_until(lambda: c.get(f"/v1/batches/{batch_id}", headers=h(key)).json()["status"]
               in ("completed", "failed"), timeout=60)
    done = c.get(f"/v1/batches/{batch_id}", headers=h(key)).json()
    assert done["status"] == "completed", done
    assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    errors = c.get(f"/v1/files/{done['error_file_id']}/content", headers=h(key)).text
    bad = json.loads(errors.splitlines()[0])
    assert bad["custom_id"] == "not-allowed" and bad["response"]["status_code"] == 404
    assert bad["response"]["body"]["error"]["code"] == "model_not_found"
    row = usage_of(c, key_id)
    assert row["requests"] == 2 and row["output_tokens"] == 8, row
    assert row["input_tokens"] + row["output_tokens"] == 10
    # their tokens were charged to the key's budget: spent now
    wait_until(lambda: c.post("/v1/chat/completions", json=chat(),
                              headers=h(key)).status_code == 429, timeout=10)
    assert c.post("/v1/chat/completions", json=chat(), headers=h(USER)).status_code == 200


def test_embeddings_lines_are_charged_to_their_key_and_held_to_its_allowlist(
        client: TestClient) -> None:
    """A batch of /v1/embeddings lines (the bundled MiniLM): each line counts in its key's
    usage and spends its budget as a completion does; a key barred from the model gets a
    404 line."""
    c = client
    key, key_id = make_key(c, budget_tokens=5, budget_period_s=86400)
    barred, _ = make_key(c, models=["fake"])
    body = {"model": "all-minilm-l6-v2", "input": ["a red car", "the sky is blue today"]}
    line = [{"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": body}]
    results = {}
    for k in (key, barred):
        made = c.post("/v1/batches", headers=h(k), json={
            "input_file_id": upload(c, k, line), "endpoint": "/v1/embeddings",
            "completion_window": "24h"})
        assert made.status_code == 200, made.text
        batch_id = made.json()["id"]
        wait_until(lambda: c.get(f"/v1/batches/{batch_id}", headers=h(k)).json()["status"]  # noqa: B023
                   in ("completed", "failed"), timeout=120)
        results[k] = c.get(f"/v1/batches/{batch_id}", headers=h(k)).json()
    done = results[key]
    assert done["request_counts"] == {"total": 1, "completed": 1, "failed": 0}, done
    out = json.loads(c.get(f"/v1/files/{done['output_file_id']}/content", headers=h(key)).text)
    answer = out["response"]["body"]
    assert out["custom_id"] == "e" and out["response"]["status_code"] == 200
    assert [len(d["embedding"]) for d in answer["data"]] == [384, 384]
    assert answer == c.post("/v1/embeddings", json=body, headers=h(USER)).json()
    tokens = answer["usage"]["prompt_tokens"]
    assert tokens > 5
    row = usage_of(c, key_id)
    assert row["requests"] == 1 and row["input_tokens"] == tokens and row["output_tokens"] == 0
    # the line's tokens spent the key's budget of 5
    wait_until(lambda: c.post("/v1/chat/completions", json=chat(),
                              headers=h(key)).status_code == 429, timeout=10)
    bad = results[barred]
    assert bad["request_counts"] == {"total": 1, "completed": 0, "failed": 1}, bad
    err = json.loads(c.get(f"/v1/files/{bad['error_file_id']}/content", headers=h(barred)).text)
    assert err["response"]["status_code"] == 404
    assert err["response"]["body"]["error"]["code"] == "model_not_found"


def clear_of_a_window_edge(window_s: int = 60, margin_s: float = 5.0) -> None:
    """Start calls that must share one rate-limit window well before its edge. The
    sliding-window counter (the `limits` library) floors the previous window's weighted
    count, so just after an edge a key with rpm 2 that made 2 calls before it gets one
    more: three calls straddling the edge all pass."""
    left = window_s - time.time() % window_s
    if left < margin_s:
        time.sleep(left + 0.1)


def test_live_embeddings_count_in_usage_and_the_keys_request_limit(client: TestClient) -> None:
    """POST /v1/embeddings is one of the key's requests as a completion is: its row in
    the usage report (its input tokens, no output), and its own request limit."""
    c = client
    key, key_id = make_key(c, rpm=2)
    body = {"model": "all-minilm-l6-v2", "input": "where is my parcel"}
    clear_of_a_window_edge()
    answers = [c.post("/v1/embeddings", json=body, headers=h(key)) for _ in range(3)]
    assert [r.status_code for r in answers] == [200, 200, 429], answers[-1].text
    assert answers[2].json()["error"]["code"] == "rate_limit_exceeded"
    tokens = answers[0].json()["usage"]["prompt_tokens"]
    assert tokens > 0
    wait_until(lambda: usage_of(c, key_id).get("requests") == 2, timeout=10)
    row = usage_of(c, key_id)
    assert row["input_tokens"] == 2 * tokens and row["output_tokens"] == 0, row
    # another key of the same tenant has its own window
    assert c.post("/v1/embeddings", json=body, headers=h(USER)).status_code == 200


def test_a_job_counts_against_its_keys_own_request_limit(client: TestClient) -> None:
    c = client
    key, _ = make_key(c, rpm=3)  # its own window, not its tenant's
    r = c.post("/v1/chat/completions", json={**chat(), "background": True}, headers=h(key))
    assert r.status_code == 202, r.text  # 1: the submission
    job_id = r.json()["id"]
    wait_until(lambda: c.get(f"/v1/jobs/{job_id}", headers=h(USER)).json()["status"]
               == "succeeded", timeout=60)  # 2: the job as it ran (read with another key)
    assert c.post("/v1/chat/completions", json=chat(), headers=h(key)).status_code == 200  # 3
    r = c.post("/v1/chat/completions", json=chat(), headers=h(key))
    assert r.status_code == 429 and "RPM" in r.json()["error"]["message"], r.text
    assert c.post("/v1/chat/completions", json=chat(), headers=h(USER)).status_code == 200


def test_a_revoked_keys_queued_job_does_not_run(client: TestClient) -> None:
    """Accepted before the key was revoked, claimed after: it fails with a 401 error
    instead of running on a key that no longer exists."""
    c = client
    key, key_id = make_key(c)
    worker = services_of(c.app).jobs.worker
    ready = worker.ready
    worker.ready = lambda: False  # nothing is claimed while the key is revoked
    r = c.post("/v1/chat/completions", json={**chat(), "background": True}, headers=h(key))
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    assert c.delete(f"/v1/admin/keys/{key_id}", headers=h(ADMIN)).status_code == 200
    worker.ready = ready  # claims resume
    wait_until(lambda: c.get(f"/v1/jobs/{job_id}", headers=h(USER)).json()["status"]
               in ("succeeded", "failed"), timeout=60)
    job = c.get(f"/v1/jobs/{job_id}", headers=h(USER)).json()
    assert job["status"] == "failed", job
    assert job["error"]["type"] == "authentication_error" and "revoked" in job["error"]["message"]
    assert usage_of(c, key_id).get("requests", 0) == 0  # it never ran
