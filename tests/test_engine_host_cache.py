"""The host-memory prompt cache: bookkeeping and scheduling with made-up sequences, and
the KV state copied out and back on the real bundled SmolLM2 (slow)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from redline.engine.host_cache import MIN_NEW_TOKENS, HostCache
from redline.engine.scheduler import KVOps, Scheduler
from redline.engine.sequence import Sequence
from redline.types import SamplingParams


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def make(loop, prompt, sid="s"):
    return Sequence(sid, list(prompt), SamplingParams(max_tokens=2, temperature=0), lambda c: None, loop)


def finish_after_prefill(sched, seq):
    while seq.in_prefill:
        batch = sched.schedule()
        sched.commit(batch)
    sched.finish(seq)


def test_host_cache_keeps_the_longest_match_and_evicts_least_recently_used():
    h = HostCache(capacity_bytes=300)
    a = h.put(list(range(100)), "A", 100)
    b = h.put([7] * 100, "B", 100)
    entry, n = h.best(list(range(80)) + [1, 2], limit=1000)
    assert entry is a and n == 80
    assert h.best([9] * 10, 1000) == (None, 0)
    assert h.best(list(range(100)), limit=40)[1] == 40
    h.used_for(a, 80)  # a is now the most recently used: b goes first
    h.put([8] * 100, "C", 100)
    h.put([6] * 100, "D", 100)
    assert h.best([7] * 100, 1000) == (None, 0) and b.payload is None
    assert h.best(list(range(100)), 1000)[0] is a
    assert h.used <= h.capacity and len(h) == 3
    assert h.put([5] * 100, "too big", 301) is None


def test_an_entry_that_extends_another_replaces_it_and_a_short_extension_is_not_saved():
    h = HostCache(capacity_bytes=10_000)
    h.put(list(range(200)), "A", 10)
    assert not h.wants(list(range(200 + MIN_NEW_TOKENS - 1)))  # too little that is new
    assert h.wants(list(range(200 + MIN_NEW_TOKENS)))
    longer = h.put(list(range(300)), "B", 20)
    assert len(h) == 1 and h.used == 20
    assert h.best(list(range(250)), 1000) == (longer, 250)
    assert not HostCache(0).wants(list(range(500)))


def test_a_forgotten_prefix_is_saved_then_restored_instead_of_recomputed(loop):
    host = HostCache(capacity_bytes=1 << 30)
    s = Scheduler(n_seq_max=2, n_batch=512, cache_cells=0, host=host)
    system = list(range(1000, 1300))
    a = make(loop, system + [1, 2], "a")
    s.add(a)
    finish_after_prefill(s, a)
    # free slots may keep no cells: the next step forgets a's and asks for a copy first
    b = make(loop, system + [3, 4], "b")
    s.add(b)
    batch = s.schedule()
    assert batch.kv.saves == [(a.slot, system + [1, 2])]
    host.put(system + [1, 2], "state of a", 1)  # what the engine does with the save
    # the slot was forgotten in this same step, before b was placed: nothing to restore
    # yet, so b computed its prompt (the engine saves before it removes)
    assert b.reused == 0 and not batch.kv.restores
    s.commit(batch)
    finish_after_prefill(s, b)
    c = make(loop, system + [5, 6], "c")
    s.add(c)
    batch = s.schedule()
    (seq_id, entry, keep), = batch.kv.restores
    assert seq_id == c.slot and entry.payload == "state of a" and keep == len(system)
    assert (c.slot, 0) in batch.kv.removals  # the slot is emptied before the copy comes back
    assert c.reused == c.cached == len(system)
    assert [e.token for e in batch.entries] == [5, 6]


def test_a_prefix_still_in_a_slot_is_not_restored_from_the_host(loop):
    host = HostCache(capacity_bytes=1 << 30)
    host.put(list(range(1000, 1300)), "old", 1)
    s = Scheduler(n_seq_max=2, n_batch=512, host=host)
    a = make(loop, list(range(1000, 1300)) + [1], "a")
    s.add(a)
    finish_after_prefill(s, a)  # the slot keeps a's cells (no bound)
    b = make(loop, list(range(1000, 1300)) + [2], "b")
    s.add(b)
    batch = s.schedule()
    assert not batch.kv.restores and b.reused == 300 and host.restores == 0


def test_without_a_host_cache_nothing_is_saved(loop):
    s = Scheduler(n_seq_max=2, n_batch=512, cache_cells=0)
    a = make(loop, list(range(300)), "a")
    s.add(a)
    finish_after_prefill(s, a)
    s.add(make(loop, list(range(300)), "b"))
    batch = s.schedule()
    assert not batch.kv.saves and not batch.kv.restores
    assert s.evict_oldest(KVOps()) is None


# ---- the real model --------------------------------------------------------------------

SYSTEM = ("You are a support assistant for Acme Cloud. Be brief, be precise, cite the policy "
          "section, and never invent prices. ") * 8


@pytest.fixture(scope="module")
def model():
    from redline.engine.llama import LlamaModel
    from redline.models import bundled_path
    m = LlamaModel(str(bundled_path("smollm2-135m-instruct", Path(".redline/models"))))
    yield m
    m.close()


def chat(model, question):
    from redline.types import Message
    msgs = (Message("system", SYSTEM), Message("user", question))
    return model.tokenize(model.render_chat(msgs), add_special=False)


@pytest.mark.slow
def test_a_saved_state_copied_back_gives_the_logits_of_a_full_prefill(model):
    from redline.engine.llama import BatchEntry, LlamaRunner
    from redline.engine.prefix import common_prefix

    def last(runner, seq_id, tokens, start):
        runner.decode([BatchEntry(t, start + i, seq_id, i == len(tokens) - 1)
                       for i, t in enumerate(tokens)])
        return runner.logits(len(tokens) - 1).copy()

    runner = LlamaRunner(model, 1024, 4, 256, 2)
    try:
        # a question whose first token is not a near-tie (llama.cpp's CPU kernels are not
        # batch-invariant: a copy within the KV buffer moves logits by ~0.6 too)
        p1, p2 = chat(model, "What is the capital of France?"), chat(model, "What is the capital of Italy?")
        n = common_prefix(p1, p2)
        assert n > 150
        full = last(runner, 0, p2, 0)
        last(runner, 1, p1, 0)
        state, size = runner.seq_state(1)
        assert size > 0
        runner.seq_remove(1, -1, -1)
        assert runner.set_seq_state(2, state, size)
        assert runner.seq_remove(2, n, -1)
        restored = last(runner, 2, p2[n:], n)
        assert np.abs(restored - full).max() < 1.5
        assert int(restored.argmax()) == int(full.argmax())
        # negative control: an empty sequence decoding the suffix alone differs
        alone = last(runner, 3, p2[n:], n)
        assert np.abs(alone - full).max() > 1.5
    finally:
        runner.close()


@pytest.mark.slow
async def test_the_engine_restores_a_forgotten_system_prompt_and_answers_the_same(model):
    from redline.engine.engine import Engine
    greedy = SamplingParams(max_tokens=8, temperature=0.0)

    async def ask(engine, question):
        chunks = [c async for c in engine.generate(chat(model, question), greedy)]
        return "".join(c.text for c in chunks), chunks[-1].usage

    plain = Engine(model, n_ctx_per_seq=1024, n_seq_max=2, n_batch=256, n_threads=2,
                   prefix_reuse=False)
    # free slots keep no cells: every finished prompt leaves the KV buffer
    hosted = Engine(model, n_ctx_per_seq=1024, n_seq_max=2, n_batch=256, n_threads=2,
                    cache_cells=0, host_cache_bytes=256 << 20)
    try:
        system_len = len(model.tokenize(SYSTEM, add_special=False))
        for q in ("What is the capital of France?", "What is the capital of Italy?",
                  "What is the capital of Japan?"):
            want, _ = await ask(plain, q)
            got, usage = await ask(hosted, q)
            assert got == want
        assert hosted.host is not None and hosted.host.restores >= 1
        assert usage is not None and usage.cached_tokens is not None
        assert usage.cached_tokens >= system_len
    finally:
        plain.close()
        hosted.close()
