"""The web page in a real headless Chromium against a real server on the bundled model:
skeleton at once, the progress bar moves, the answer completes with its stage timings,
and a connection killed mid-answer resumes by itself with nothing lost or repeated.
Screenshots go to test-artifacts/web/."""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import smol_config

pytestmark = pytest.mark.slow

playwright_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "web"
# set before the page's scripts run: when a skeleton first enters the DOM
SEE_SKELETON = """
window.__seen = {};
new MutationObserver(() => {
  if (window.__seen.skeleton === undefined && document.querySelector('.answer .skeleton'))
    window.__seen.skeleton = performance.now();
}).observe(document, {childList: true, subtree: true});
"""


class DroppingProxy:
    """A TCP proxy in front of the server whose open connections the test can cut,
    like a flaky network would; new connections keep working."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.lock = threading.Lock()
        self.open: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self.lock:
                self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def drop_all(self) -> int:
        with self.lock:
            dropped, self.open = self.open, []
        for s in dropped:
            try:
                # linger 0: close() resets; shutdown() first wakes the pipe threads' recv()
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
        return len(dropped)

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        self.drop_all()


@pytest.fixture
def page(server_factory: Any) -> Iterator[tuple[Any, DroppingProxy, Any]]:
    server = server_factory(smol_config(streams={"resume_grace_s": 30}))
    proxy = DroppingProxy(server.port)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with playwright_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.add_init_script(SEE_SKELETON)
        page.goto(proxy.url + "/")
        page.wait_for_function("document.querySelectorAll('#model option').length > 1")
        try:
            yield page, proxy, server
        finally:
            browser.close()
            proxy.close()


def ask(page: Any, prompt: str, max_tokens: int, tier: str = "auto") -> int:
    """Send a question from the page; returns its index in window.redline.runs."""
    n = page.evaluate("window.redline.runs.length")
    page.select_option("#tier", tier)
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#prompt", prompt)
    page.click("#send")
    return int(n)


def run_of(page: Any, i: int) -> dict[str, Any]:
    return page.evaluate(f"JSON.parse(JSON.stringify(window.redline.runs[{i}]))")  # type: ignore[no-any-return]


def test_question_shows_skeleton_progress_and_timings(page: Any) -> None:
    page, _, server = page
    # the model list offers chat models only: the API also lists the embedder
    listed = [m["id"] for m in httpx.get(f"http://127.0.0.1:{server.port}/v1/models").json()["data"]]
    offered = page.evaluate("[...document.querySelectorAll('#model option')].map(o => o.value)")
    assert "all-minilm-l6-v2" in listed and "all-minilm-l6-v2" not in offered
    assert "auto" in offered and "smollm2-135m-instruct" in offered
    i = ask(page, "Write a short poem about the sea.", 96)
    page.screenshot(path=str(ARTIFACTS / "1-sent.png"))
    page.wait_for_function(f"window.redline.runs[{i}].doneMs !== null || window.redline.runs[{i}].error",
                           timeout=60_000)
    run = run_of(page, i)
    assert run["error"] is None
    seen_skeleton = page.evaluate("window.__seen.skeleton")
    assert seen_skeleton is not None and seen_skeleton <= run["t0"] + run["firstTokenMs"]
    assert run["skeletonMs"] is not None and run["firstTokenMs"] is not None
    assert run["text"].strip()
    # the bar moved: progress events from the server, widths rising to the end
    assert run["progressEvents"] >= 2
    widths = run["widths"]
    assert len(set(widths)) >= 2 and widths == sorted(widths)
    assert run["etas"], "no countdown (eta_ms) arrived"
    answer = page.locator(".answer").nth(i)
    assert answer.get_attribute("data-state") == "done"
    assert answer.locator(".progress .bar").evaluate("el => el.style.width") == "100%"
    assert answer.locator(".skeleton").count() == 0
    assert answer.locator(".text").inner_text() == run["text"]
    timings = answer.locator(".timings").inner_text()
    assert "first token" in timings and "decode" in timings
    assert "decode" in run["timings"]  # the final chunk's redline.timings
    assert "route" in run["serverTiming"]  # the Server-Timing header (stages before the first token)
    page.screenshot(path=str(ARTIFACTS / "2-answered.png"), full_page=True)


def test_dropped_connection_resumes_by_itself(page: Any) -> None:
    page, proxy, server = page
    # the page sends no temperature, so the answer is sampled (OpenAI's default 1.0): now
    # and then it ends within a few tokens (two CI runs: 6 tokens), too soon to cut. Then
    # the page asks again; a cut needs a stream still going after 8 tokens. A story: in
    # SmolLM2's own template, 0 of 30 seeded samples ended within 8 tokens (counting to
    # 200: 3 of 30)
    ended = []
    for _ in range(5):
        i = ask(page, "Write a long story about a dragon who learns to fly.", 300, tier="A")
        # an error or the end stops the wait too; it is long because in a full test run
        # another test's server may still hold the cores for a while
        page.wait_for_function(f"window.redline.runs[{i}].tokens >= 8 || window.redline.runs[{i}].error"
                               f" || window.redline.runs[{i}].doneMs !== null", timeout=180_000)
        started = run_of(page, i)
        assert started["error"] is None, started
        if started["doneMs"] is None:
            break
        ended.append({k: started.get(k) for k in ("text", "tokens", "usage")})
    else:
        pytest.fail(f"five sampled answers all ended before they could be cut: {ended}")
    assert started["tokens"] >= 8, started
    assert proxy.drop_all() >= 2
    page.wait_for_function(f"window.redline.runs[{i}].doneMs !== null || window.redline.runs[{i}].error",
                           timeout=180_000)
    run = run_of(page, i)
    page.screenshot(path=str(ARTIFACTS / "3-resumed.png"), full_page=True)
    assert run["error"] is None
    assert run["resumes"] >= 1
    # what the page shows is exactly the stream's content: no gap, no duplicate
    replay = httpx.get(f"{server.url}/v1/streams/{run['streamId']}?after=0", timeout=30)
    assert replay.status_code == 200
    text = ""
    for line in replay.text.splitlines():
        if line.startswith("data: {"):
            choice = (json.loads(line[6:]).get("choices") or [{}])[0]
            text += choice.get("delta", {}).get("content") or ""
    assert text and run["text"] == text
    assert page.locator(".answer").nth(i).get_attribute("data-resumes") == str(run["resumes"])


def test_dashboard_shows_tiers_and_long_tail(page: Any) -> None:
    page, proxy, _ = page
    i = ask(page, "Say hello.", 16, tier="S")
    page.wait_for_function(f"window.redline.runs[{i}].doneMs !== null", timeout=60_000)
    page.goto(proxy.url + "/dashboard")
    page.wait_for_function("window.redlineStats && window.redlineStats.live.requests >= 1")
    row = page.locator('#tiers tr[data-tier="S"] td')
    assert row.nth(1).inner_text() == "1"
    assert row.nth(3).inner_text().endswith("ms") or row.nth(3).inner_text().endswith(" s")
    page.screenshot(path=str(ARTIFACTS / "4-dashboard.png"), full_page=True)
