"""/v1/messages over a limit (issue 21): a 429 in Anthropic's error shape with the
Retry-After the OpenAI routes give for the same limit, read by the official `anthropic`
client: the request rate (answered by the rate-limit middleware), the concurrency cap
and a spent budget (answered by the route)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest
from conftest import LiveApp
from jobs_support import wait_until

from redline.api.app import create_app
from redline.api.auth import digest
from redline.backends.fake import FakeBackend
from redline.config import RedlineConfig

RPM, CAP, BUDGET = "sk-rpm", "sk-cap", "sk-budget"
ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture
def live() -> Iterator[tuple[str, FakeBackend]]:
    keys = [{"name": "rpm-team", "sha256": digest(RPM), "rpm": 1},
            {"name": "cap-team", "sha256": digest(CAP), "max_concurrent": 1},
            {"name": "budget-team", "sha256": digest(BUDGET), "budget_tokens": 5,
             "budget_period_s": 86400}]
    cfg = RedlineConfig(auth={"keys": keys}, store={"url": "memory://"},
                        cache={"enabled": False}, routing={"classifier": "off"})
    backend = FakeBackend(tpot_s=0.03)
    with LiveApp(create_app(cfg, backends={"fake": backend})) as app:
        yield app.url, backend


def client(url: str, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0,
                               default_headers={"Authorization": f"Bearer {key}"})


def refused(url: str, key: str) -> anthropic.RateLimitError:
    with client(url, key) as c, pytest.raises(anthropic.RateLimitError) as caught:
        c.messages.create(model="fake", max_tokens=3, messages=ASK)  # type: ignore[arg-type]
    return caught.value


def assert_anthropic_429(err: anthropic.RateLimitError) -> int:
    body: Any = err.body
    assert err.status_code == 429
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error", body
    assert set(body) == {"type", "error"} and body["error"]["message"]
    retry_after = err.response.headers["retry-after"]
    assert retry_after.isdigit() and int(retry_after) >= 1, retry_after
    return int(retry_after)


def openai_429(url: str, key: str) -> httpx.Response:
    r = httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                   json={"model": "fake", "max_tokens": 3, "messages": ASK}, timeout=30)
    assert r.status_code == 429, r.text
    return r


def test_over_the_request_rate(live: tuple[str, FakeBackend]) -> None:
    url, _ = live
    with client(url, RPM) as c:
        assert c.messages.create(model="fake", max_tokens=3, messages=ASK).type == "message"  # type: ignore[arg-type]
    wait = assert_anthropic_429(refused(url, RPM))
    assert abs(int(openai_429(url, RPM).headers["retry-after"]) - wait) <= 1  # the same window
    with client(url, RPM) as c, pytest.raises(anthropic.RateLimitError) as counting:
        c.messages.count_tokens(model="fake", messages=ASK)  # type: ignore[arg-type]
    assert_anthropic_429(counting.value)  # its count_tokens too, in its shape


def test_over_the_concurrency_cap(live: tuple[str, FakeBackend]) -> None:
    url, backend = live
    with httpx.Client(base_url=url, timeout=30) as h, \
            h.stream("POST", "/v1/messages", headers={"Authorization": f"Bearer {CAP}"},
                     json={"model": "fake", "max_tokens": 200, "stream": True,
                           "messages": ASK}) as held:
        assert held.status_code == 200
        lines = held.iter_lines()  # kept: dropping it closes the connection (the stream ends)
        next(lines)
        wait_until(lambda: backend.inflight == 1)
        err = refused(url, CAP)
        assert "concurrent" in str(err.body)
        assert assert_anthropic_429(err) == int(openai_429(url, CAP).headers["retry-after"])


def test_a_spent_budget(live: tuple[str, FakeBackend]) -> None:
    url, _ = live
    with client(url, BUDGET) as c:
        c.messages.create(model="fake", max_tokens=10, messages=ASK)  # type: ignore[arg-type]
    caught: list[anthropic.RateLimitError] = []

    def spent() -> bool:
        with client(url, BUDGET) as c:
            try:
                c.messages.create(model="fake", max_tokens=3, messages=ASK)  # type: ignore[arg-type]
            except anthropic.RateLimitError as exc:
                caught.append(exc)
                return True
        return False

    wait_until(spent, timeout=10)  # charged when the first answer ends (a store add)
    wait = assert_anthropic_429(caught[-1])
    assert wait > 60  # to the budget period's end
    assert abs(int(openai_429(url, BUDGET).headers["retry-after"]) - wait) <= 2
