"""Resume over real sockets: a TCP proxy cuts the client's connection at random
points and `redline.client` must put the stream back together byte for byte.
The fake backend runs in process (fast); the slow tests use a real server process
on the real bundled SmolLM2 at temperature 0."""

from __future__ import annotations

import asyncio
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from conftest import SMOL, smol_config

from redline.api.app import create_app
from redline.backends.fake import FakeBackend
from redline.client import astream_chat, stream_chat
from redline.config import RedlineConfig


class CuttingProxy:
    """Forwards TCP to `upstream`; each connection's response is cut (both sides
    closed) after `budget()` bytes from the server (None: never)."""

    def __init__(self, upstream_port: int, budget: Callable[[], int | None]) -> None:
        self.upstream_port, self.budget = upstream_port, budget
        self.cuts = 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CuttingProxy:
        self.thread.start()
        self.ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    async def _shutdown(self) -> None:
        self.server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready.set()
        self.loop.run_forever()

    async def _handle(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        u_reader, u_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        budget = self.budget()

        async def up() -> None:
            while data := await c_reader.read(65536):
                u_writer.write(data)
                await u_writer.drain()

        async def down() -> None:
            nonlocal budget
            while data := await u_reader.read(65536):
                if budget is not None and len(data) >= budget:
                    c_writer.write(data[:budget])
                    self.cuts += 1
                    return
                if budget is not None:
                    budget -= len(data)
                c_writer.write(data)
                await c_writer.drain()

        tasks = [asyncio.ensure_future(up()), asyncio.ensure_future(down())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()
        for w in (c_writer, u_writer):
            w.transport.abort()


def _text(chunks: Iterator[openai.types.chat.ChatCompletionChunk]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


# ---- fake backend, real sockets --------------------------------------------------
@pytest.fixture
def fake_server(live_app, tmp_path):
    cfg = RedlineConfig(server={"data_dir": str(tmp_path)}, streams={"resume_grace_s": 10},
                        models=[{"name": "fake", "bundled": "fake"}])
    words = tuple(f"w{i}" for i in range(97))
    return live_app(create_app(cfg, backends={"fake": FakeBackend(tpot_s=0.0005, words=words)}))


FAKE = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 300}


def test_client_helper_resumes_across_random_cuts(fake_server):
    port = int(fake_server.url.rsplit(":", 1)[1])
    whole = _text(stream_chat(_client(fake_server.url), **FAKE))
    rng = random.Random(1)
    with CuttingProxy(port, lambda: rng.randrange(1_500, 40_000)) as proxy:
        for _ in range(10):
            assert _text(stream_chat(_client(proxy.url), max_resumes=50, **FAKE)) == whole
        assert proxy.cuts >= 10


def test_client_helper_retries_a_resume_that_breaks_before_its_headers(fake_server):
    port = int(fake_server.url.rsplit(":", 1)[1])
    whole = _text(stream_chat(_client(fake_server.url), **FAKE))
    budgets = iter([3_000, 60, 60, None])
    with CuttingProxy(port, lambda: next(budgets, None)) as proxy:
        assert _text(stream_chat(_client(proxy.url), max_resumes=3, backoff_s=0.01, **FAKE)) == whole
        assert proxy.cuts == 3
    budgets = iter([3_000, 60, 60, None])
    with CuttingProxy(port, lambda: next(budgets, None)) as proxy, pytest.raises(
            openai.APIConnectionError):
        _text(stream_chat(_client(proxy.url), max_resumes=2, backoff_s=0.01, **FAKE))


def test_async_client_helper_resumes(fake_server):
    port = int(fake_server.url.rsplit(":", 1)[1])
    whole = _text(stream_chat(_client(fake_server.url), **FAKE))
    rng = random.Random(2)

    async def run() -> str:
        client = openai.AsyncOpenAI(base_url=f"{proxy.url}/v1", api_key="-", max_retries=0)
        out = [c.choices[0].delta.content or "" async for c in
               astream_chat(client, max_resumes=50, **FAKE) if c.choices]
        await client.close()
        return "".join(out)

    with CuttingProxy(port, lambda: rng.randrange(1_500, 40_000)) as proxy:
        assert asyncio.run(run()) == whole


# ---- the real model ----------------------------------------------------------------
pytest_slow = pytest.mark.slow
# "cache": False: each trial generates afresh (a cache hit would replay a stored answer)
CHAT = {"model": SMOL, "temperature": 0, "max_tokens": 96, "cache": False,
        "messages": [{"role": "user", "content": "Describe a walk along the sea at dawn."}]}


@pytest.fixture(scope="module")
def resumable_server(tmp_path_factory):
    from conftest import ServerProcess

    server = ServerProcess(smol_config(streams={"resume_grace_s": 2}),
                           tmp_path_factory.mktemp("streams")).start()
    yield server
    server.stop()


def _raw(url: str, body: dict, cut_after: int | None = None) -> tuple[str, bytes]:
    """POST a stream with httpx; read `cut_after` events then drop the connection."""
    with httpx.Client(timeout=60) as c, c.stream("POST", f"{url}/v1/chat/completions",
                                                 json={**body, "stream": True}) as r:
        assert r.status_code == 200
        got = b""
        for raw in r.iter_raw():
            got += raw
            if cut_after is not None and got.count(b"\n\n") >= cut_after:
                return r.headers["x-redline-stream-id"], got[: _nth_end(got, cut_after)]
        return r.headers["x-redline-stream-id"], got


def _nth_end(data: bytes, n: int) -> int:
    return [m.end() for m in re.finditer(b"\n\n", data)][n - 1]


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _sse_text(events: bytes) -> str:
    import json

    out = []
    for line in events.decode().splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                out.append(choice.get("delta", {}).get("content") or "")
    return "".join(out)


@pytest_slow
def test_killed_clients_resume_byte_for_byte(resumable_server):
    """A client dies after a random number of events and resumes by Last-Event-ID: what
    it holds then is exactly that stream's bytes (as a whole replay gives them), and
    its text is the uninterrupted greedy answer."""
    url = resumable_server.url
    _, uninterrupted = _raw(url, CHAT)
    n_events = uninterrupted.count(b"\n\n")
    answer = _sse_text(uninterrupted)
    rng = random.Random(7)
    interrupted = _metric(url, "redline_stream_interruptions_total")
    for _ in range(12):
        k = rng.randrange(1, n_events)
        sid, head = _raw(url, CHAT, cut_after=k)
        r = httpx.get(f"{url}/v1/streams/{sid}", timeout=60,
                      headers={"Last-Event-ID": f"{sid}:{k}"})
        assert r.status_code == 200
        joined = head + r.content
        assert [int(s) for s in re.findall(rb"^id: [^:]+:(\d+)$", joined, re.M)] == list(
            range(1, n_events + 1))
        assert joined == httpx.get(f"{url}/v1/streams/{sid}", timeout=60).content
        assert _sse_text(joined) == answer
    assert _metric(url, "redline_stream_interruptions_total") >= interrupted + 12


@pytest_slow
def test_openai_client_helper_through_random_cuts(resumable_server):
    url = resumable_server.url
    port = int(url.rsplit(":", 1)[1])
    whole = _text(stream_chat(_client(url), **CHAT))
    assert len(whole) > 100
    rng = random.Random(11)
    resumes = _metric(url, "redline_stream_resumes_total")
    with CuttingProxy(port, lambda: rng.randrange(1_500, 8_000)) as proxy:
        for _ in range(8):
            assert _text(stream_chat(_client(proxy.url), max_resumes=100, **CHAT)) == whole
        assert proxy.cuts >= 8
    assert _metric(url, "redline_stream_resumes_total") >= resumes + 8


@pytest_slow
def test_resume_after_the_stream_finished_replays_it(resumable_server):
    url = resumable_server.url
    sid, whole = _raw(url, CHAT)
    r = httpx.get(f"{url}/v1/streams/{sid}", timeout=30)
    assert r.status_code == 200 and r.content == whole
    r = httpx.get(f"{url}/v1/streams/{sid}?after=3", timeout=30)
    assert r.content == whole[_nth_end(whole, 3):]


@pytest_slow
def test_resume_past_the_grace_period_is_404_and_the_sequence_was_freed(resumable_server):
    url = resumable_server.url
    long = {**CHAT, "max_tokens": 1500, "ignore_eos": True}
    sid, _ = _raw(url, long, cut_after=3)
    time.sleep(0.5)
    assert _metric(url, "redline_requests_in_flight") >= 1  # still generating, in the grace
    time.sleep(2.5)  # resume_grace_s = 2
    r = httpx.get(f"{url}/v1/streams/{sid}", headers={"Last-Event-ID": f"{sid}:3"}, timeout=10)
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "invalid_request_error"
    deadline = time.monotonic() + 5
    while _metric(url, "redline_requests_in_flight") > 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _metric(url, "redline_requests_in_flight") == 0
    assert _metric(url, 'redline_requests_total{status="499"}') >= 1


def test_proxy_cuts(fake_server):
    """The proxy itself: a budget cuts the response, None passes it whole."""
    port = int(fake_server.url.rsplit(":", 1)[1])
    with CuttingProxy(port, lambda: 50) as proxy, pytest.raises(httpx.HTTPError):
        httpx.get(f"{proxy.url}/healthz", timeout=5).raise_for_status()
    with CuttingProxy(port, lambda: None) as proxy:
        assert httpx.get(f"{proxy.url}/healthz", timeout=5).status_code == 200


@pytest_slow
def test_a_stream_that_gave_its_slot_away_resumes_whole(server_factory):
    """Issue 21: a stream whose client left yields its slot to requests somebody reads
    (preempted: it keeps its token ids and is recomputed from them later). Resumed, the
    events joined to what the client held are exactly the full replay: numbered without
    gap or repeat, ending in [DONE], its text going on from what the client had. (Not
    the same text as an uninterrupted run: the recompute's KV differs from incremental
    decoding in the last bits, llama.cpp's kernels are not batch-invariant, and a near tie
    later in a long greedy answer may go the other way.)"""
    cfg = smol_config(streams={"resume_grace_s": 60})
    cfg["models"][0]["n_seq_max"] = 2  # two live requests take every slot
    url = server_factory(cfg).url
    long = {**CHAT, "max_tokens": 160, "ignore_eos": True}
    preempted = f'redline_engine_preemptions_total{{model="{SMOL}"}}'
    before = _metric(url, preempted)
    sid, head = _raw(url, long, cut_after=3)  # the client leaves; it generates on
    live = {**CHAT, "max_tokens": 48, "ignore_eos": True}

    def ask(i: int) -> int:
        body = {**live, "messages": [{"role": "user", "content": f"Count to {i + 20}."}]}
        return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).status_code

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(ask, range(2))) == [200, 200]
    assert _metric(url, preempted) >= before + 1  # it gave its slot away
    r = httpx.get(f"{url}/v1/streams/{sid}", timeout=120,
                  headers={"Last-Event-ID": f"{sid}:3"})
    assert r.status_code == 200
    joined = head + r.content
    assert joined == httpx.get(f"{url}/v1/streams/{sid}", timeout=60).content
    ids = [int(x) for x in re.findall(rb"^id: [^:]+:(\d+)$", joined, re.M)]
    assert ids == list(range(1, len(ids) + 1)) and len(ids) > 3
    assert joined.endswith(b"data: [DONE]\n\n")
    held, whole = _sse_text(head), _sse_text(joined)
    assert whole.startswith(held) and len(whole) > len(held) + 200  # 160 tokens on
