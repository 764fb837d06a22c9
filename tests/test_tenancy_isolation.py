"""Every object has an owner: each object route × {owner, another key, an admin key, no
key} gives the status in the table, on SQLite records and on a real Redis. Another
tenant's object answers 404 exactly as an unknown id does (existence is not disclosed);
lists are per tenant and paged; a batch cannot read another tenant's input file."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from jobs_support import wait_job, wait_until

from redline.api.app import create_app
from redline.api.auth import digest
from redline.api.services import services_of
from redline.backends.fake import FakeBackend
from redline.config import load_config

KEYS = {"owner": "sk-owner-secret", "other": "sk-other-secret", "admin": "sk-admin-secret"}
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "write a report"}],
        "max_tokens": 5}
LINES = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
          "body": {**CHAT, "messages": [{"role": "user", "content": f"q{i}"}]}} for i in range(2)]


def headers(who: str) -> dict[str, str]:
    return {} if who == "nokey" else {"Authorization": f"Bearer {KEYS[who]}"}


def make_client(tmp_path: Path, store_url: str | None) -> TestClient:
    keys = [{"name": "tenant-owner", "sha256": digest(KEYS["owner"])},
            {"name": "tenant-other", "sha256": digest(KEYS["other"])},
            {"name": "ops", "sha256": digest(KEYS["admin"]), "role": "admin"}]
    cfg = load_config(server={"data_dir": str(tmp_path / "data")}, routing={"classifier": "off"},
                      cache={"enabled": False}, auth={"keys": keys},
                      store={"url": store_url}, jobs={"lease_s": 3})
    return TestClient(create_app(cfg, backends={"fake": FakeBackend()}))


@pytest.fixture(params=["sqlite", "redis"])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TestClient]:
    store_url = None
    if request.param == "redis":
        import redis

        # a database of its own on the session's redis-server, emptied first
        store_url = request.getfixturevalue("redis_server").rsplit("/", 1)[0] + "/9"
        redis.Redis.from_url(store_url).flushdb()
    with make_client(tmp_path, store_url) as c:
        wait_until(lambda: c.get("/readyz").status_code == 200)
        yield c


def upload(c: TestClient, who: str, lines: list[dict[str, Any]] = LINES) -> str:
    raw = "".join(json.dumps(x) + "\n" for x in lines).encode()
    r = c.post("/v1/files", headers=headers(who), data={"purpose": "batch"},
               files={"file": ("in.jsonl", io.BytesIO(raw), "application/jsonl")})
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def owned_objects(c: TestClient) -> dict[str, str]:
    """One of each object, made by the owner: a job, a file, a finished batch (with its
    output file) and a stream."""
    h = headers("owner")
    r = c.post("/v1/chat/completions", headers=h, json={**CHAT, "background": True})
    assert r.status_code == 202, r.text
    job = r.json()["id"]
    wait_job(_As(c, "owner"), job)
    file_id = upload(c, "owner")
    r = c.post("/v1/batches", headers=h, json={"input_file_id": file_id,
                                                "endpoint": "/v1/chat/completions",
                                                "completion_window": "24h"})
    assert r.status_code == 200, r.text
    batch = r.json()["id"]
    wait_until(lambda: c.get(f"/v1/batches/{batch}", headers=h).json()["status"]
               in ("completed", "failed"), timeout=60)
    done = c.get(f"/v1/batches/{batch}", headers=h).json()
    assert done["status"] == "completed" and done["output_file_id"], done
    with c.stream("POST", "/v1/chat/completions", headers=h, json={**CHAT, "stream": True}) as s:
        stream = s.headers["x-redline-stream-id"]
        s.read()
    return {"job": job, "file": file_id, "batch": batch, "output": done["output_file_id"],
            "stream": stream}


class _As:
    """A client that sends one key's header (for the polling helpers)."""

    def __init__(self, c: TestClient, who: str) -> None:
        self.c, self.who = c, who

    def get(self, path: str) -> Any:
        return self.c.get(path, headers=headers(self.who))


# (method, path template, expected status for: owner, other, admin, nokey)
OBJECT_ROUTES: list[tuple[str, str, tuple[int, int, int, int]]] = [
    ("GET", "/v1/jobs/{job}", (200, 404, 404, 401)),
    ("DELETE", "/v1/jobs/{job}", (200, 404, 404, 401)),
    ("GET", "/v1/files/{file}", (200, 404, 404, 401)),
    ("GET", "/v1/files/{file}/content", (200, 404, 404, 401)),
    ("GET", "/v1/files/{output}", (200, 404, 404, 401)),
    ("GET", "/v1/files/{output}/content", (200, 404, 404, 401)),
    ("GET", "/v1/batches/{batch}", (200, 404, 404, 401)),
    ("POST", "/v1/batches/{batch}/cancel", (200, 404, 404, 401)),
    ("GET", "/v1/streams/{stream}", (200, 404, 404, 401)),
    ("GET", "/v1/admin/stats", (403, 403, 200, 401)),
    ("GET", "/v1/admin/slow", (403, 403, 200, 401)),
    ("GET", "/v1/admin/experiments", (403, 403, 200, 401)),
    ("DELETE", "/v1/admin/experiments/samples", (403, 403, 200, 401)),
    ("GET", "/v1/admin/keys", (403, 403, 200, 401)),
    ("GET", "/v1/admin/usage", (403, 403, 200, 401)),
    ("DELETE", "/v1/files/{file}", (200, 404, 404, 401)),  # last: it removes the file
]
WHO = ("other", "admin", "nokey", "owner")  # the owner last: its DELETEs change things
COLUMN = {"owner": 0, "other": 1, "admin": 2, "nokey": 3}


def test_every_object_route_for_every_caller(client: TestClient) -> None:
    ids = owned_objects(client)
    unknown = {k: v[:-4] + "0000" for k, v in ids.items()}
    for method, template, expected in OBJECT_ROUTES:
        for who in WHO:
            path = template.format(**ids)
            r = client.request(method, path, headers=headers(who))
            want = expected[COLUMN[who]]
            assert r.status_code == want, (method, path, who, r.text)
            if want == 404:
                # the same answer as for an id that does not exist: nothing disclosed
                body = r.json()
                assert set(body["error"]) == {"message", "type", "param", "code"}
                missing = client.request(method, template.format(**unknown), headers=headers(who))
                assert missing.status_code == 404
                assert missing.json()["error"]["type"] == body["error"]["type"]
                assert missing.json()["error"]["code"] == body["error"]["code"]
            if want == 403:
                assert r.json()["error"]["type"] == "permission_error"
            if want == 401:
                assert r.json()["error"]["type"] == "authentication_error"


def test_another_tenant_cannot_change_an_object(client: TestClient) -> None:
    h = headers("owner")
    file_id = upload(client, "owner")
    assert client.delete(f"/v1/files/{file_id}", headers=headers("other")).status_code == 404
    assert client.get(f"/v1/files/{file_id}", headers=h).status_code == 200
    # another tenant's file cannot be a batch's input: the same answer as no file at all
    r = client.post("/v1/batches", headers=headers("other"),
                    json={"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                          "completion_window": "24h"})
    nofile = client.post("/v1/batches", headers=headers("other"),
                         json={"input_file_id": "file-nope", "endpoint": "/v1/chat/completions",
                               "completion_window": "24h"})
    assert r.status_code == nofile.status_code == 400, r.text
    assert r.json()["error"]["code"] == nofile.json()["error"]["code"] == "not_found"
    assert r.json()["error"]["param"] == "input_file_id"
    assert client.get("/v1/batches", headers=headers("other")).json()["data"] == []


def test_a_job_cancelled_by_another_key_stays_queued(client: TestClient) -> None:
    """With the worker claiming nothing the job stays queued: another key's DELETE is a
    404 and changes nothing; the owner's cancels it."""
    services_of(client.app).jobs.worker.ready = lambda: False  # nothing is claimed
    r = client.post("/v1/chat/completions", headers=headers("owner"),
                    json={**CHAT, "background": True})
    job = r.json()["id"]
    assert client.delete(f"/v1/jobs/{job}", headers=headers("other")).status_code == 404
    assert client.get(f"/v1/jobs/{job}", headers=headers("owner")).json()["status"] == "queued"
    r = client.delete(f"/v1/jobs/{job}", headers=headers("owner"))
    assert r.status_code == 200 and r.json()["status"] == "cancelled"


def test_lists_are_per_tenant_and_paged(client: TestClient) -> None:
    mine = [upload(client, "owner") for _ in range(5)]
    theirs = [upload(client, "other") for _ in range(2)]
    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        query = "?limit=2" + (f"&after={after}" if after else "")
        page = client.get("/v1/files" + query, headers=headers("owner")).json()
        seen += [f["id"] for f in page["data"]]
        pages += 1
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert seen == list(reversed(mine)) and pages == 3  # newest first, 2 + 2 + 1
    other = client.get("/v1/files?purpose=batch", headers=headers("other")).json()
    assert [f["id"] for f in other["data"]] == list(reversed(theirs))
    assert "tenant" not in other["data"][0]  # the owner is not part of the File object
    # a cursor of another tenant's list finds nothing, rather than a page of theirs
    r = client.get(f"/v1/files?after={theirs[0]}", headers=headers("owner")).json()
    assert r["data"] == [] and r["has_more"] is False
    assert client.get("/v1/files?purpose=batch_output",
                      headers=headers("owner")).json()["data"] == []
