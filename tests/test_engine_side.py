"""Prompts computed on the side (engine/side.py): which prompt goes, the state copied
between a per-slot context and the side's one-stream context (`restream`), and the bundled
SmolLM2 answering the same with and without the side, while streams decode beside it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from redline.config import ModelConfig
from redline.engine import compute
from redline.engine.budget import PrefillBudget
from redline.engine.engine import Engine
from redline.engine.llama import (
    POPULATE_MIN,
    STATE_MAGIC,
    BatchEntry,
    LlamaModel,
    LlamaRunner,
    fresh_buffer,
    restream,
)
from redline.engine.scheduler import Scheduler
from redline.engine.sequence import Sequence
from redline.engine.side import side_threads
from redline.models import bundled_path
from redline.types import Message, SamplingParams

# ---- restream: pure bytes ---------------------------------------------------------------


def state(streams: int, which: int, cells: list[int], spare: int = 0) -> tuple[np.ndarray, int]:
    """A sequence state as llama.cpp writes it: magic, seq id, stream count, then a cell
    count per stream (`cells` after it, for stream `which` only)."""
    words = [STATE_MAGIC, 5, streams] + [0] * which + [len(cells), *cells] \
        + [0] * (streams - 1 - which)
    buf = np.zeros(4 * len(words) + spare, dtype=np.uint8)
    buf[:4 * len(words)] = np.array(words, dtype=np.uint32).view(np.uint8)
    return buf, 4 * len(words)


def words(buf: np.ndarray, size: int) -> list[int]:
    return [int(w) for w in buf[:size].view(np.uint32)]


def test_restream_narrows_a_per_slot_state_to_one_stream_and_widens_it_back():
    buf, size = state(8, 3, [11, 12, 13])
    one = restream(buf, size, 1)
    assert one is not None
    assert words(*one) == [STATE_MAGIC, 5, 1, 3, 11, 12, 13]
    # widened for a context of 8 streams: the cells first (read into the target's own
    # stream), then 7 empty streams
    wide = restream(one[0].copy(), one[1], 8)
    assert wide is not None
    assert words(*wide) == [STATE_MAGIC, 5, 8, 3, 11, 12, 13] + [0] * 7


def test_restream_rewrites_in_place_when_the_buffer_has_room_and_copies_when_not():
    buf, size = state(1, 0, [7, 8], spare=4 * 7)
    wide = restream(buf, size, 8)
    assert wide is not None and np.shares_memory(wide[0], buf)  # no fresh pages
    assert words(*wide) == [STATE_MAGIC, 5, 8, 2, 7, 8] + [0] * 7
    tight, size = state(1, 0, [7, 8])
    copied = restream(tight, size, 8)
    assert copied is not None and not np.shares_memory(copied[0], tight)
    assert words(*copied) == words(*wide)


def test_a_large_state_buffer_is_mapped_writable_and_lives_as_long_as_its_views():
    """`fresh_buffer`: a state of a MB and more goes into populated pages (no huge-page
    compaction on its first touch); like `np.empty`'s, they are writable, `restream`
    rewrites a state in them in place, and a view keeps them mapped."""
    small, size = state(1, 0, [7, 8])
    big = fresh_buffer(POPULATE_MIN + 4 * 7)
    assert big.flags.writeable and len(big) == POPULATE_MIN + 4 * 7
    assert isinstance(big.base, memoryview)  # a mapping of its own, not numpy's heap
    big[:size] = small[:size]
    wide = restream(big, size, 8)
    assert wide is not None and np.shares_memory(wide[0], big)
    del big
    assert words(*wide) == [STATE_MAGIC, 5, 8, 2, 7, 8] + [0] * 7
    tiny = fresh_buffer(64)
    assert tiny.flags.writeable and tiny.base is None  # small ones: np.empty


def test_restream_refuses_what_is_not_one_sequences_state():
    buf, size = state(8, 3, [1])
    buf[:4] = 0  # not llama.cpp's magic
    assert restream(buf, size, 1) is None
    empty, size = state(4, 0, [])
    empty[12:16] = 0  # every stream empty: no cells to move
    assert restream(empty, size, 1) is None
    two = np.array([STATE_MAGIC, 5, 2, 1, 9, 1, 9], dtype=np.uint32).view(np.uint8)
    assert restream(two, len(two), 1) is None  # cells in two streams
    assert restream(np.zeros(6, dtype=np.uint8), 6, 1) is None


# ---- the scheduler's choice ---------------------------------------------------------------


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def make(loop, prompt, sid, **sampling):
    return Sequence(sid, list(prompt), SamplingParams(max_tokens=64, temperature=0, **sampling),
                    lambda c: None, loop)


def step(sched):
    batch = sched.schedule()
    sched.commit(batch)
    sched.observe(batch, 0.001 + 0.002 * batch.n_decode
                  + 0.0005 * (len(batch.entries) - batch.n_decode))
    for seq, _ in batch.samplers:
        seq.output.append(7)
    return batch


def decoding(loop, streams: int, protect: int = 1, slack: float | None = 0.5) -> Scheduler:
    s = Scheduler(n_seq_max=8, n_batch=512, budget=PrefillBudget(512, slack, protect=protect))
    for i in range(streams):
        s.add(make(loop, range(10 * i, 10 * i + 10), f"s{i}"))
    for _ in range(3):
        step(s)
    return s


def test_the_side_takes_a_long_prompt_the_budget_would_hold_back(loop):
    s = decoding(loop, 3, protect=2)
    long = make(loop, range(1000, 1600), "long")
    s.add(long)
    step(s)  # admitted: its first chunk
    assert long.in_prefill and s.side_candidate(64) is long
    long.aside = object()  # on the side now: the steps feed it nothing
    batch = step(s)
    assert all(e.seq_id != long.seq_id for e in batch.entries)
    assert s.side_candidate(64) is None  # one at a time
    long.preempted()  # its slot goes: the job is dropped with it
    assert long.aside is None


def test_the_side_takes_no_prompt_the_budget_would_not_hold_back(loop):
    # too few streams decode (the prompt takes the rest of the batch anyway)
    s = decoding(loop, 1, protect=2)
    s.add(make(loop, range(1000, 1600), "long"))
    step(s)
    assert s.side_candidate(64) is None
    # a fixed budget holds nothing back
    s = decoding(loop, 3, slack=None)
    s.add(make(loop, range(1000, 1600), "long"))
    step(s)
    assert s.side_candidate(64) is None
    # a short prompt goes whole; fewer than `min_tokens` left; a prompt scored row by row
    s = decoding(loop, 3)
    s.add(make(loop, range(1000, 1030), "short"))
    s.add(make(loop, range(2000, 2600), "scored", prompt_logprobs=1))
    step(s)
    assert s.side_candidate(64) is None
    s = decoding(loop, 3)
    s.add(make(loop, range(1000, 1600), "long"))
    step(s)
    assert s.side_candidate(10_000) is None


def test_while_the_side_is_taken_the_next_long_prompt_waits_for_it(loop):
    """A second held-back prompt does not run in small chunks on the threads the side
    leaves (each costs twice as much there): it waits for the side. A short prompt still
    goes whole, and a prompt the side failed runs in chunks."""
    s = decoding(loop, 3)
    s.side_min = 64
    first, second = make(loop, range(1000, 1600), "first"), make(loop, range(3000, 3600), "second")
    s.add(first)
    s.add(second)
    step(s)  # admitted: their first chunks
    first.aside = object()
    s.side_busy = True
    short = make(loop, range(5000, 5012), "short")
    s.add(short)
    fed = {e.seq_id for e in step(s).entries}
    assert second.seq_id not in fed and short.seq_id in fed and first.seq_id not in fed
    second.no_side = True  # the side failed it: back to chunks
    assert second.seq_id in {e.seq_id for e in step(s).entries}
    assert s.side_candidate(64) is None
    second.no_side, s.side_busy = False, False
    assert second.seq_id in {e.seq_id for e in step(s).entries}


# ---- the bundled model ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol():
    model = LlamaModel(str(bundled_path("smollm2-135m-instruct", Path(".redline/models"))))
    yield model
    model.close()


LOG = ("The harbour master kept a log of every ship that came in: its name, its cargo, the "
       "weather it met, and the hour it tied up. ")


async def run(engine: Engine, model: LlamaModel, long_prompt: list[int],
              cancel_long: bool = False,
              stream_tokens: int = 24) -> tuple[list[tuple[str, int]], tuple[str, int]]:
    """Two streams decode; once each has a token, the long prompt arrives. Their greedy
    (text, tokens) and the newcomer's."""
    got: list[tuple[str, int]] = [("", 0), ("", 0)]
    first = [asyncio.Event(), asyncio.Event()]

    async def stream(i: int) -> None:
        q = model.tokenize(model.render_chat((Message("user", f"Tell story {i} about the sea."),)),
                           add_special=False)
        async for chunk in engine.generate(q, SamplingParams(max_tokens=stream_tokens,
                                                             temperature=0.0, ignore_eos=True)):
            got[i] = (got[i][0] + chunk.text, got[i][1] + chunk.tokens)
            first[i].set()

    tasks = [asyncio.create_task(stream(i)) for i in range(2)]
    await asyncio.gather(*(e.wait() for e in first))
    newcomer = ("", 0)
    it = engine.generate(long_prompt, SamplingParams(max_tokens=6, temperature=0.0,
                                                     ignore_eos=True))
    if cancel_long:
        await asyncio.sleep(0.05)  # it is on the side by now
        await it.aclose()  # type: ignore[attr-defined]
    else:
        async for chunk in it:
            newcomer = (newcomer[0] + chunk.text, newcomer[1] + chunk.tokens)
    await asyncio.gather(*tasks)
    return got, newcomer


@pytest.mark.slow
@pytest.mark.parametrize("unified", [False, True])
async def test_a_prompt_on_the_side_gives_the_answer_it_gives_in_the_engines_steps(smol, unified):
    """Beside two decoding streams, a 600-token prompt (behind a 40-token prefix another
    request left in its slot, which goes along) is computed on the side and copied into
    its slot: the same greedy answer as held back in the engine's own steps, and (per
    slot) the streams' answers unchanged."""
    prompt = smol.tokenize(LOG * 30, add_special=True)[:640]
    answers = {}
    for side in (False, True):
        engine = Engine(smol, n_ctx_per_seq=1024, n_seq_max=4, n_batch=256, n_threads=2,
                        kv_unified=unified, side_prefill=side, prefill_protect=1)
        try:
            # a request that leaves the prompt's first 40 tokens cached in a slot
            async for _ in engine.generate(prompt[:40], SamplingParams(max_tokens=1,
                                                                       temperature=0.0)):
                pass
            answers[side] = await run(engine, smol, prompt)
            assert engine.side_jobs == (1 if side else 0)
            # all but its 40 cached tokens (behind them, what its first step fed) and its
            # last one, which the engine's step feeds for its logits
            assert (0 < engine.side_tokens <= 599) if side else engine.side_tokens == 0
            assert compute.reserved() == 0  # the cores are the steps' again
        finally:
            engine.close()
    assert answers[True][1] == answers[False][1] and answers[True][1][1] == 6
    assert [g[1] for g in answers[True][0]] == [24, 24]
    if not unified:
        # per slot each stream's pass is its own either way; in the unified buffer the
        # streams' rows shared passes with the prompt's chunks (64+ rows take llama.cpp's
        # tiled attention), which may move a greedy choice between near-equal tokens
        assert answers[True][0] == answers[False][0]


@pytest.mark.slow
async def test_a_prompt_on_the_side_comes_back_when_the_streams_it_was_held_back_for_end(smol):
    """Two short streams decode when a 1,200-token prompt arrives: it goes to the side,
    and once they end (nothing to hold it back for) it is recalled at its next chunk: what
    the side computed is copied in and the engine's steps finish it on all the threads,
    with the answer it gives held back."""
    prompt = smol.tokenize(LOG * 60, add_special=True)[:1200]
    answers = []
    for side in (False, True):
        engine = Engine(smol, n_ctx_per_seq=2048, n_seq_max=4, n_batch=256, n_threads=2,
                        kv_unified=False, side_prefill=side, prefill_protect=1)
        try:
            got, newcomer = await run(engine, smol, prompt, stream_tokens=4)
            answers.append(newcomer)
            if side:
                assert engine.side_jobs == 1 and engine.side_recalls == 1
                assert 0 < engine.side_tokens < 1100  # part of it, not all
            assert compute.reserved() == 0
        finally:
            engine.close()
    assert answers[0] == answers[1] and answers[1][1] == 6


@pytest.mark.slow
async def test_a_prompt_cancelled_on_the_side_is_dropped_and_the_streams_go_on(smol):
    prompt = smol.tokenize(LOG * 60, add_special=True)[:1200]
    engine = Engine(smol, n_ctx_per_seq=2048, n_seq_max=4, n_batch=256, n_threads=2,
                    kv_unified=False, side_prefill=True, prefill_protect=1)
    try:
        got, newcomer = await run(engine, smol, prompt, cancel_long=True)
        assert newcomer == ("", 0) and [g[1] for g in got] == [24, 24]
        for _ in range(100):  # the side stops at its next chunk
            if engine.side is not None and engine.side.job is None and compute.reserved() == 0:
                break
            await asyncio.sleep(0.05)
        assert compute.reserved() == 0 and engine.side_jobs == 0
        # and the engine serves on
        q = smol.tokenize(smol.render_chat((Message("user", "Hi"),)), add_special=False)
        out = [c.tokens async for c in engine.generate(q, SamplingParams(max_tokens=3,
                                                                          temperature=0.0))]
        assert sum(out) == 3
    finally:
        engine.close()


@pytest.mark.slow
async def test_a_prompt_the_side_fails_runs_in_the_engines_steps(smol, monkeypatch, caplog):
    """The side computes the prompt but its state comes back in a layout `restream` does
    not read (a llama.cpp upgrade, say): the job fails, is logged, and the prompt runs in
    the engine's steps from where its slot was, with the answer it gives there and no
    second try on the side."""
    import redline.engine.side as side_module

    real = side_module.restream

    def narrows_only(state, size, streams):  # the prefix goes in; the result cannot come out
        return real(state, size, streams) if streams == 1 else None

    prompt = smol.tokenize(LOG * 30, add_special=True)[:400]
    answers = []
    for broken in (False, True):
        if broken:
            monkeypatch.setattr(side_module, "restream", narrows_only)
        engine = Engine(smol, n_ctx_per_seq=1024, n_seq_max=4, n_batch=256, n_threads=2,
                        kv_unified=False, side_prefill=broken, prefill_protect=1)
        try:
            answers.append(await run(engine, smol, prompt))
            assert engine.side_jobs == 0 and compute.reserved() == 0
        finally:
            engine.close()
    assert answers[1][1] == answers[0][1] and answers[1][1][1] == 6
    assert "a prompt on the side failed" in caplog.text


def test_the_side_is_a_model_setting_and_needs_two_threads(smol):
    assert ModelConfig(name="m", bundled="smollm2-135m-instruct").prefill_side is True
    assert ModelConfig(name="m", bundled="smollm2-135m-instruct", prefill_side=False) \
        .prefill_side is False
    one = Engine(smol, n_ctx_per_seq=256, n_seq_max=2, n_batch=64, n_threads=1, side_prefill=True)
    try:
        assert one.side is None  # one thread: nothing to split
    finally:
        one.close()


def test_the_side_takes_what_keeps_the_streams_within_the_slack():
    assert [side_threads(n, 0.5) for n in (1, 2, 3, 4, 8, 16)] == [0, 1, 1, 1, 2, 5]
    assert [side_threads(n, 1.0) for n in (2, 4, 8)] == [1, 2, 4]  # half: 2x
    assert side_threads(8, None) == 4  # a fixed budget (the side is not used then)
    assert side_threads(8, 9.0) == 4  # never more than half


def test_a_per_slot_state_loads_into_the_sides_context_and_back(smol):
    """The layout `restream` reads is llama.cpp's: a slot's cells go into the side's
    one-stream context and back into another slot, and give the same logits there."""
    a = LlamaRunner(smol, 512, 4, 128, 2, kv_unified=False)
    b = LlamaRunner(smol, 512, 1, 128, 1, kv_unified=True, here=True)
    try:
        toks = smol.tokenize(LOG * 4, add_special=True)[:100]
        a.decode([BatchEntry(t, i, 1, i == 99) for i, t in enumerate(toks[:99])])
        one = restream(*a.seq_state(1), 1)
        assert one is not None and b.set_seq_state(0, *one)
        back = restream(*b.seq_state(0), a.n_stream)
        assert back is not None and a.set_seq_state(3, *back)
        a.decode([BatchEntry(toks[99], 99, 1, True), BatchEntry(toks[99], 99, 3, True)])
        assert np.array_equal(a.logits(0), a.logits(1))
    finally:
        a.close()
        b.close()


@pytest.mark.slow
def test_over_http_a_long_prompt_beside_streams_is_answered_from_the_side(server_factory):
    """A real user's view, through `redline serve` and the official `openai` client: two
    streams are being read when a long document question arrives; it is answered (the
    same greedy answer as when asked alone), and /metrics counts a prompt computed on the
    side."""
    import re
    import threading

    import httpx
    import openai
    from conftest import SMOL, smol_config

    cfg = smol_config()
    # no prefix reuse: the question asked again is computed again, not found in a slot
    cfg["models"][0].update(n_seq_max=4, n_threads=2, prefill_protect_share=0.25,
                            prefix_reuse=False)
    cfg["cache"] = {"enabled": False}
    url = server_factory(cfg).url
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    question = [{"role": "user", "content": LOG * 12 + "Which ship came in last?"}]

    def ask() -> str:
        r = client.chat.completions.create(model=SMOL, messages=question, max_tokens=8,
                                           temperature=0)
        return r.choices[0].message.content or ""

    def side_prefills() -> float:
        text = httpx.get(f"{url}/metrics").text
        m = re.search(rf'^redline_engine_side_prefills_total{{model="{SMOL}"}} (\S+)$', text,
                      re.M)
        return float(m.group(1)) if m else 0.0

    alone = ask()  # nothing decodes beside it: the whole batch, not the side
    assert side_prefills() == 0
    reading = [threading.Event(), threading.Event()]

    def stream(i: int) -> None:
        with client.chat.completions.create(
                model=SMOL, stream=True, max_tokens=120, temperature=0,
                messages=[{"role": "user", "content": f"Tell story {i} about the sea."}],
                extra_body={"ignore_eos": True}) as s:
            for _ in s:
                reading[i].set()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    assert all(e.wait(60) for e in reading)
    beside = ask()
    for t in threads:
        t.join(120)
    assert beside == alone and beside
    assert side_prefills() == 1
