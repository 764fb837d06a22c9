"""Streams without a model or a socket: history, progress, the manager over a
journal, and the resume route through the in-process app on the fake backend."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from redline.api.app import create_app
from redline.api.services import services_of
from redline.backends.fake import FakeBackend
from redline.config import RedlineConfig, StreamsConfig
from redline.errors import NotFound
from redline.store.memory import MemoryStore
from redline.streams import StreamManager
from redline.streams.history import LengthHistory, Prediction
from redline.streams.progress import Progress
from redline.telemetry.metrics import Metrics
from redline.types import GenerationRequest, Message, Presence, SamplingParams


def _req(text: str = "Tell me about the sea", max_tokens: int = 100) -> GenerationRequest:
    return GenerationRequest(model="m", messages=(Message("user", text),),
                             sampling=SamplingParams(max_tokens=max_tokens))


# ---- history and progress ------------------------------------------------------
def test_prediction_without_history_is_max_tokens():
    p = LengthHistory().predict(_req(max_tokens=64), "m", "S")
    assert p.expected == 64 and p.revise(10) == 64


def test_prediction_is_the_median_of_similar_answers_clipped_to_max_tokens():
    h = LengthHistory()
    for n in (10, 20, 30, 40, 500):
        h.record(_req(max_tokens=100), "m", "S", n)
    p = h.predict(_req(max_tokens=100), "m", "S")
    assert p.expected == 30
    assert p.samples[-1] == 100  # 500 clipped
    assert p.revise(25) == 40  # median of {30, 40, 100}: the answer is past 25 already
    assert p.revise(101) == 100
    assert p.revise(100) == 100


def test_prediction_past_every_seen_length_keeps_growing():
    p = Prediction(max_tokens=1000, samples=(10, 10, 10, 10, 10), tpot_s=None)
    assert p.revise(40) == 50  # a quarter more
    assert p.revise(10) == 13


def test_revise_moves_to_a_broader_rung_when_few_similar_answers_are_longer():
    # specific rung: one answer longer than 25 (a lone 200); broader rung: many near 60
    p = Prediction(1000, (10, 12, 15, 20, 200), None, ((10, 20, 55, 60, 60, 65, 200),))
    assert p.expected == 15
    assert p.revise(25) == 60  # median of the broader rung's {55, 60, 60, 65, 200}
    assert Prediction(1000, (10, 12, 15, 20, 200), None).revise(25) == 200  # no broader rung


def test_history_falls_back_to_coarser_keys_and_learns_the_rate():
    h = LengthHistory()
    for n in range(5):
        h.record(_req("Write a long story please"), "m", "S", 80 + n, tpot_s=0.01)
    other = h.predict(_req("Completely different words here and a longer prompt" * 3), "m", "S")
    assert other.expected == 82  # (model, max_tokens bucket) rung
    assert other.tpot_s == pytest.approx(0.01)
    assert h.predict(_req(), "other-model", "S").expected == 100


def test_progress_counts_tokens_and_counts_down():
    now = [0.0]
    p = Progress(Prediction(100, (50,) * 5, tpot_s=0.02), clock=lambda: now[0])
    first = p.snapshot()
    assert first == {"tokens": 0, "expected_tokens": 50, "eta_ms": 1000}
    for _ in range(10):
        now[0] += 0.01
        snap = p.advance(1)
    assert snap["tokens"] == 10 and snap["expected_tokens"] == 50
    assert 400 < snap["eta_ms"] < 1000  # the live rate (10 ms/token) pulls the EWMA down
    assert p.finish() == {"tokens": 10, "expected_tokens": 10, "eta_ms": 0}


def test_progress_without_any_rate_has_no_eta():
    p = Progress(Prediction(16, (), tpot_s=None))
    assert p.snapshot()["eta_ms"] is None


# ---- the manager -------------------------------------------------------------
class Source:
    """Encoded events from a fake generation; records whether it was closed early."""

    def __init__(self, n: int, delay: float = 0.0, sid: str = "strm-x") -> None:
        self.n, self.delay, self.sid = n, delay, sid
        self.closed_early = False
        self.produced = 0

    async def events(self) -> AsyncIterator[bytes]:
        try:
            for i in range(1, self.n + 1):
                await asyncio.sleep(self.delay)
                self.produced = i
                yield f"id: {self.sid}:{i}\ndata: {{\"i\": {i}}}\n\n".encode()
            yield f"id: {self.sid}:{self.n + 1}\ndata: [DONE]\n\n".encode()
        except (GeneratorExit, asyncio.CancelledError):
            self.closed_early = True
            raise


def _manager(grace: float, store: MemoryStore | None = None) -> StreamManager:
    cfg = StreamsConfig(resume_grace_s=grace, journal_ttl_s=60, follow_stall_s=2)
    shared = store or MemoryStore()
    return StreamManager(cfg, Metrics(), store=lambda: shared)


async def _collect(it: AsyncIterator[bytes], limit: int | None = None) -> list[bytes]:
    """The events read, in order; one write may carry several (all are counted as read)."""
    out: list[bytes] = []
    async for chunk in it:
        out += [part + b"\n\n" for part in chunk.split(b"\n\n")[:-1]]
        if limit is not None and len(out) >= limit:
            break
    await it.aclose()  # type: ignore[attr-defined]
    return out


async def test_follow_then_resume_gives_the_same_bytes_as_one_read():
    m = _manager(grace=5)
    src = Source(20, delay=0.001)
    live = m.start("strm-x", src.events())
    head = await _collect(m.follow(live), limit=7)
    tail = await _collect(await m.open("strm-x", len(head)))
    whole = await _collect(await m.open("strm-x", 0))
    assert head + tail == whole and len(whole) == 21 and whole[-1].endswith(b"[DONE]\n\n")
    assert not src.closed_early
    assert m.metrics.stream_resumes._value.get() == 2
    assert m.metrics.stream_interruptions._value.get() == 1


async def test_a_stream_nobody_reads_marks_its_request_for_the_engine_to_yield():
    """The presence flag the engine reads (engine/scheduler.py): gone while the client is
    away and the stream generates on for a resume, back when a resume follows it."""
    m = _manager(grace=5)
    src = Source(40, delay=0.005)
    presence = Presence()
    live = m.start("strm-x", src.events(), presence=presence)
    await _collect(m.follow(live), limit=3)  # the client reads three events and leaves
    assert presence.gone and not live.done
    resumed = m.follow(live, 3)
    await resumed.__anext__()
    assert not presence.gone  # a reader is back: it keeps its slot
    rest = await _collect(resumed)
    assert rest[-1].endswith(b"[DONE]\n\n") and not presence.gone


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    async def write_many(self, extends, sets):  # type: ignore[no-untyped-def]
        self.writes += 1
        await super().write_many(extends, sets)


async def test_the_journal_is_one_group_write_per_interval_for_all_streams():
    store = CountingStore()
    m = _manager(grace=5, store=store)
    sources = [Source(40, delay=0.005, sid=f"strm-{i}") for i in range(16)]
    t0 = time.monotonic()
    lives = [m.start(f"strm-{i}", s.events()) for i, s in enumerate(sources)]
    await asyncio.gather(*(live.producer for live in lives))  # type: ignore[misc]
    elapsed = time.monotonic() - t0
    # at most one write per 25 ms interval for all 16 streams together (a write per
    # stream per interval would be 16 times that; per stream per event, 656 in all)
    assert 0 < store.writes <= elapsed / m.cfg.journal_flush_s + 2
    for i in range(16):
        whole = await _collect(await m.open(f"strm-{i}", 0))
        assert len(whole) == 41 and whole[0].startswith(f"id: strm-{i}:1\n".encode())
        assert whole[-1].endswith(b"[DONE]\n\n")
        assert f"strm-{i}" not in m.live  # handed over to the journal


async def test_a_stream_read_here_is_journalled_at_its_end_and_a_left_one_as_it_goes():
    store = MemoryStore()
    m = _manager(grace=5, store=store)
    src = Source(400, delay=0.002)
    live = m.start("strm-x", src.events())
    reader = m.follow(live)
    head = [await reader.__anext__() for _ in range(20)]
    await asyncio.sleep(3 * m.cfg.journal_flush_s)
    # its client has these: the stream is announced (meta) but its events wait
    assert await m.journal.meta("strm-x") is not None
    assert await m.journal.read("strm-x", 0) == []
    await reader.aclose()  # the client leaves: from now on the journal follows it
    await asyncio.sleep(5 * m.cfg.journal_flush_s)
    journalled = await m.journal.read("strm-x", 0)
    assert len(journalled) >= 20 and b"".join(journalled).startswith(b"".join(head))
    await live.producer
    whole = await m.journal.read("strm-x", 0)
    assert len(whole) == 401 and whole[:len(journalled)] == journalled
    assert [e.split(b"\n")[0] for e in whole] == [f"id: strm-x:{i}".encode() for i in range(1, 402)]


async def test_finished_stream_replays_from_the_journal():
    m = _manager(grace=5)
    live = m.start("strm-x", Source(5).events())
    await live.producer
    assert "strm-x" not in m.live  # handed over to the journal
    assert len(await _collect(await m.open("strm-x", 2))) == 4


async def test_resuming_at_or_past_the_end_of_a_finished_stream_ends_at_once():
    m = _manager(grace=5)
    live = m.start("strm-x", Source(5).events())
    await live.producer
    assert await asyncio.wait_for(_collect(await m.open("strm-x", 6)), 1) == []
    assert await asyncio.wait_for(_collect(await m.open("strm-x", 60)), 1) == []


async def test_zero_grace_cancels_at_once_when_the_client_leaves():
    m = _manager(grace=0)
    src = Source(10_000, delay=0.001)
    live = m.start("strm-x", src.events())
    await _collect(m.follow(live), limit=3)
    await asyncio.wait_for(live.producer, 1)
    assert src.closed_early and src.produced < 100
    with pytest.raises(NotFound):
        await m.open("strm-x", 3)


async def test_generation_goes_on_during_the_grace_period_and_stops_after():
    m = _manager(grace=0.3)
    src = Source(10_000, delay=0.002)
    live = m.start("strm-x", src.events())
    await _collect(m.follow(live), limit=3)
    await asyncio.sleep(0.1)
    assert not src.closed_early and src.produced > 3
    resumed = await _collect(await m.open("strm-x", 3), limit=5)
    assert resumed[0].startswith(b"id: strm-x:4\n")
    await asyncio.wait_for(live.producer, 2)  # nobody came back: aborted after the grace
    assert src.closed_early and live.aborted
    with pytest.raises(NotFound):
        await m.open("strm-x", 0)


async def test_another_replica_follows_through_the_shared_journal_and_keeps_it_alive():
    store = MemoryStore()
    a, b = _manager(grace=0.2, store=store), _manager(grace=0.2, store=store)
    src = Source(300, delay=0.005)
    live = a.start("strm-x", src.events())
    head = await _collect(a.follow(live), limit=4)  # the client drops from replica a …
    tail = await _collect(await b.open("strm-x", 4))  # … and resumes on replica b (1.5 s)
    assert not src.closed_early  # b's reader mark kept a generating past its 0.2 s grace
    whole = await _collect(await b.open("strm-x", 0))
    assert head + tail == whole and len(whole) == 301


async def test_a_resume_elsewhere_gets_events_while_the_first_client_seems_connected():
    """A half-open connection: replica a still has its reader (it never saw the client
    go), the client resumes on b. b asks a for the stream, and a journals it as it goes:
    b's reader gets events long before the stream ends."""
    store = MemoryStore()
    a, b = _manager(grace=5, store=store), _manager(grace=5, store=store)
    src = Source(600, delay=0.005)
    live = a.start("strm-x", src.events())
    stale = a.follow(live)
    head = await stale.__anext__()  # a's reader took one write, then hangs on
    await asyncio.sleep(3 * a.cfg.journal_flush_s)  # the meta (with its owner) is written
    n = head.count(b"\n\n")
    tail = await asyncio.wait_for(_collect(await b.open("strm-x", n), limit=10), 2)
    assert src.produced < 600 and not live.done
    assert tail[0].startswith(f"id: strm-x:{n + 1}\n".encode()) and len(tail) >= 10
    await stale.aclose()
    await asyncio.wait_for(live.producer, 10)


async def test_another_tenant_cannot_resume_a_stream():
    m = _manager(grace=5)
    live = m.start("strm-x", Source(50, delay=0.001).events(), tenant="alice")
    with pytest.raises(NotFound):
        await m.open("strm-x", 0, tenant="bob")
    await live.producer
    with pytest.raises(NotFound):
        await m.open("strm-x", 0, tenant="bob")  # from the journal too
    assert len(await _collect(await m.open("strm-x", 0, tenant="alice"))) == 51


async def test_unknown_stream_is_not_found():
    with pytest.raises(NotFound):
        await _manager(grace=1).open("strm-nope", 0)


# ---- the route, in process ---------------------------------------------------
@pytest.fixture
async def client(tmp_path):
    cfg = RedlineConfig(server={"data_dir": str(tmp_path)}, streams={"resume_grace_s": 5},
                        models=[{"name": "fake", "bundled": "fake"}])
    app = create_app(cfg, backends={"fake": FakeBackend(tpot_s=0.001)})
    async with app.router.lifespan_context(app):
        while not services_of(app).pipeline.ready:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t") as c:
            yield c


BODY = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "max_tokens": 12}


async def test_resume_route_replays_after_last_event_id_or_after(client):
    r = await client.post("/v1/chat/completions", json=BODY)
    sid = r.headers["x-redline-stream-id"]
    events = [e + "\n\n" for e in r.text.split("\n\n") if e]
    assert events[0].startswith(f"id: {sid}:1\n") and events[-1].endswith("data: [DONE]\n\n")
    by_header = await client.get(f"/v1/streams/{sid}", headers={"Last-Event-ID": f"{sid}:5"})
    assert by_header.status_code == 200 and by_header.text == "".join(events[5:])
    by_query = await client.get(f"/v1/streams/{sid}?after=11")
    assert by_query.text == "".join(events[11:])
    assert (await client.get(f"/v1/streams/{sid}")).text == r.text


async def test_progress_rides_on_every_chunk(client):
    r = await client.post("/v1/chat/completions", json=BODY)
    import json

    datas = [json.loads(line[6:]) for line in r.text.splitlines()
             if line.startswith("data: {")]
    progress = [d["redline"]["progress"] for d in datas if "redline" in d]
    assert progress[0]["tokens"] == 0 and progress[0]["expected_tokens"] == 12
    assert [p["tokens"] for p in progress[1:]] == sorted(p["tokens"] for p in progress[1:])
    assert progress[-1] == {"tokens": 12, "expected_tokens": 12, "eta_ms": 0}


async def test_resume_errors_are_openai_shaped(client):
    r = await client.get("/v1/streams/strm-unknown")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    r = await client.post("/v1/chat/completions", json=BODY)
    sid = r.headers["x-redline-stream-id"]
    bad = await client.get(f"/v1/streams/{sid}", headers={"Last-Event-ID": "nonsense"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "Last-Event-ID"
    other = await client.get(f"/v1/streams/{sid}", headers={"Last-Event-ID": "strm-other:3"})
    assert other.status_code == 400
    assert (await client.get(f"/v1/streams/{sid}?after=-1")).status_code == 400
