"""The playground's Responses mode in a real headless Chromium against a real server
(in front of the fake upstream engine): each turn continues the last by
previous_response_id (the server keeps the conversation), the output_text deltas
stream into the page, and a connection cut mid-answer resumes by starting_after with
nothing lost or repeated. Screenshots go to test-artifacts/web/."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from jobs_support import start_upstream, upstream_config
from test_web_playwright import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    SEE_SKELETON,
    DroppingProxy,
    playwright_api,
    run_of,
)

pytestmark = pytest.mark.slow
DONE = "window.redline.runs[{i}].doneMs !== null || window.redline.runs[{i}].error"


@pytest.fixture
def page(server_factory: Any, tmp_path: Path) -> Iterator[tuple[Any, DroppingProxy, Any, str]]:
    upstream, up_url = start_upstream(tmp_path, tpot=0.02)
    server = server_factory(upstream_config(up_url))
    proxy = DroppingProxy(server.port)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        with playwright_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            page.add_init_script(SEE_SKELETON)
            page.goto(proxy.url + "/")
            page.wait_for_function("document.querySelectorAll('#model option').length > 1")
            page.select_option("#mode", "responses")
            page.select_option("#model", "up")
            try:
                yield page, proxy, server, up_url
            finally:
                browser.close()
    finally:
        proxy.close()
        upstream.stop()


def ask(page: Any, prompt: str, max_tokens: int) -> int:
    n = page.evaluate("window.redline.runs.length")
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#prompt", prompt)
    page.click("#send")
    return int(n)


def test_turns_chain_by_previous_response_id(page: Any) -> None:
    page, _, server, up = page
    first = ask(page, "Name a colour.", 4)
    page.wait_for_function(DONE.format(i=first), timeout=60_000)
    one = run_of(page, first)
    assert one["error"] is None and one["text"] == "tok tok tok tok"
    assert one["responseId"].startswith("resp_") and one["previousResponseId"] is None
    second = ask(page, "And another?", 3)
    page.wait_for_function(DONE.format(i=second), timeout=60_000)
    two = run_of(page, second)
    assert two["error"] is None and two["text"] == "tok tok tok"
    assert two["previousResponseId"] == one["responseId"]  # chained, not resent
    assert two["progressEvents"] >= 1 and two["usage"]["completion_tokens"] == 3
    stored = httpx.get(f"{server.url}/v1/responses/{two['responseId']}", timeout=30).json()
    assert stored["previous_response_id"] == one["responseId"]
    assert stored["output_text"] == two["text"]
    sent = httpx.get(f"{up}/last", timeout=30).json()["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]  # the whole chain
    answer = page.locator(".answer").nth(second)
    assert answer.get_attribute("data-state") == "done"
    assert answer.locator(".text").inner_text() == two["text"]
    page.screenshot(path=str(ARTIFACTS / "5-responses.png"), full_page=True)


def test_a_dropped_responses_stream_resumes_by_starting_after(page: Any) -> None:
    page, proxy, server, _ = page
    i = ask(page, "Count slowly.", 200)  # 200 x 20 ms
    page.wait_for_function(f"window.redline.runs[{i}].tokens >= 8 || window.redline.runs[{i}].error",
                           timeout=60_000)
    assert proxy.drop_all() >= 2
    page.wait_for_function(DONE.format(i=i), timeout=60_000)
    run = run_of(page, i)
    assert run["error"] is None and run["resumes"] >= 1
    replay = httpx.get(f"{server.url}/v1/responses/{run['responseId']}",
                       params={"stream": "true"}, timeout=30)
    text = "".join(json.loads(line[6:])["delta"] for line in replay.text.splitlines()
                   if line.startswith("data: {") and '"response.output_text.delta"' in line)
    assert text == " ".join(["tok"] * 200) and run["text"] == text  # no gap, no duplicate


def test_chat_mode_still_streams_the_whole_history(page: Any) -> None:
    page, _, _, up = page
    page.select_option("#mode", "chat")
    for turn, n in enumerate((3, 2)):
        i = ask(page, f"turn {turn}", n)
        page.wait_for_function(DONE.format(i=i), timeout=60_000)
        run = run_of(page, i)
        assert run["error"] is None and run["text"] == " ".join(["tok"] * n)
        assert run["streamId"] and "responseId" not in run
    sent = httpx.get(f"{up}/last", timeout=30).json()["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]  # resent whole
