"""Tier priority and preempt-and-continue in the scheduler, with made-up sequences."""

from __future__ import annotations

import asyncio

import pytest

from redline.engine.scheduler import Scheduler
from redline.engine.sequence import SeqState, Sequence
from redline.types import Presence, SamplingParams


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def make(loop, prompt, sid, tier="A", presence=None):
    return Sequence(sid, list(prompt), SamplingParams(max_tokens=64, temperature=0),
                    lambda c: None, loop, tier=tier, presence=presence)


def run_step(sched, sampled=None):
    """Schedule, pretend the decode ran, and append a token to each sampling sequence
    (its position in the sequence's context, so that lost or repeated ones show)."""
    batch = sched.schedule()
    sched.commit(batch)
    for seq, _ in batch.samplers:
        seq.output.append(sampled if sampled is not None else 1000 + len(seq.output))
    return batch


def test_tier_s_prefill_goes_before_waiting_a_and_b(loop):
    s = Scheduler(n_seq_max=4, n_batch=16)
    b = make(loop, range(100, 120), "b", "B")
    a = make(loop, range(200, 220), "a", "A")
    top = make(loop, range(300, 320), "s", "S")
    for q in (b, a, top):  # S arrives last
        s.add(q)
    batch = run_step(s)
    assert {e.seq_id for e in batch.entries} == {top.slot}  # the whole budget is S's
    assert top.n_fed == 16 and a.n_fed == 0 and b.n_fed == 0


def test_fcfs_keeps_arrival_order(loop):
    s = Scheduler(n_seq_max=4, n_batch=16, tiers=False)
    b = make(loop, range(100, 120), "b", "B")
    top = make(loop, range(300, 320), "s", "S")
    s.add(b)
    s.add(top)
    batch = run_step(s)
    assert {e.seq_id for e in batch.entries} == {b.slot}


def test_tier_s_admitted_first_when_one_slot_frees(loop):
    s = Scheduler(n_seq_max=1, n_batch=64)
    first = make(loop, [1, 2, 3], "first", "A")
    s.add(first)
    run_step(s)
    a = make(loop, [4, 5], "a", "A")
    top = make(loop, [6, 7], "s", "S")
    s.add(a)
    s.add(top)
    run_step(s)
    assert a.state is SeqState.WAITING and top.state is SeqState.WAITING  # A is not preempted
    s.finish(first)
    run_step(s)
    assert top.state is SeqState.RUNNING and a.state is SeqState.WAITING


def test_b_yields_its_slot_to_s_and_continues_without_gap(loop):
    s = Scheduler(n_seq_max=2, n_batch=64)
    a = make(loop, range(10), "a", "A")
    b = make(loop, range(20, 30), "b", "B")
    s.add(a)
    s.add(b)
    for _ in range(4):
        run_step(s)
    assert b.output == [1000, 1001, 1002, 1003]
    b_slot = b.slot
    top = make(loop, range(40, 45), "s", "S")
    s.add(top)
    batch = run_step(s)
    # b gave its slot to S: its token ids stay, nothing of it runs this step
    assert s.preemptions == 1 and b.preemptions == 1
    assert b.state is SeqState.WAITING and b.slot is None
    assert top.slot == b_slot and a.state is SeqState.RUNNING
    assert all(e.seq_id != b_slot or e.token in range(40, 45) for e in batch.entries)
    assert batch.kv.removals == [(b_slot, 0)]  # S shares no prefix: b's cells are freed
    assert b.output == [1000, 1001, 1002, 1003]
    # S finishes; b comes back and recomputes its prompt and every token it generated
    s.finish(top)
    batch = run_step(s)
    assert b.state is SeqState.RUNNING
    fed = [e.token for e in batch.entries if e.seq_id == b.slot]
    assert fed == list(range(20, 30)) + [1000, 1001, 1002, 1003]
    assert [e.pos for e in batch.entries if e.seq_id == b.slot] == list(range(14))
    assert [seq.id for seq, _ in batch.samplers].count("b") == 1  # its next token, once
    assert b.output == [1000, 1001, 1002, 1003, 1004]
    run_step(s)  # and it decodes on from there
    assert b.output == [1000, 1001, 1002, 1003, 1004, 1005]


def test_a_preempted_sequence_reuses_its_cells_when_its_slot_is_still_free(loop):
    s = Scheduler(n_seq_max=1, n_batch=64)
    b = make(loop, range(20, 30), "b", "B")
    s.add(b)
    for _ in range(3):
        run_step(s)
    s.preempt(b)  # e.g. nobody read it; then it is the only one again
    batch = run_step(s)
    assert b.reused == 12  # prompt and the 2 fed tokens: only the last one is recomputed
    assert [e.token for e in batch.entries] == [1002] and batch.entries[0].logits
    assert b.output == [1000, 1001, 1002, 1003]


def test_a_and_s_never_preempt_each_other_and_b_never_preempts(loop):
    s = Scheduler(n_seq_max=1, n_batch=64)
    a = make(loop, [1, 2], "a", "A")
    s.add(a)
    run_step(s)
    s.add(make(loop, [3, 4], "s", "S"))
    s.add(make(loop, [5, 6], "b", "B"))
    run_step(s)
    assert s.preemptions == 0 and s.running == [a]


def test_fcfs_does_not_preempt_for_tiers(loop):
    s = Scheduler(n_seq_max=1, n_batch=64, tiers=False)
    b = make(loop, [1, 2], "b", "B")
    s.add(b)
    run_step(s)
    s.add(make(loop, [3, 4], "s", "S"))
    run_step(s)
    assert s.preemptions == 0 and s.running == [b]


@pytest.mark.parametrize("tiers", [True, False])
def test_an_unread_stream_yields_first_to_any_live_request(loop, tiers):
    s = Scheduler(n_seq_max=2, n_batch=64, tiers=tiers)
    away = Presence()
    b = make(loop, range(10), "b", "B")
    gone = make(loop, range(20, 30), "gone", "S", presence=away)
    s.add(b)
    s.add(gone)
    run_step(s)
    run_step(s)
    fresh = make(loop, [7, 8, 9], "fresh", "B")
    s.add(fresh)
    run_step(s)
    assert s.preemptions == 0  # its client reads: it keeps its slot
    away.gone = True  # the client left; the stream generates on for a resume
    run_step(s)
    assert gone.state is SeqState.WAITING and fresh.state is SeqState.RUNNING
    assert b.state is SeqState.RUNNING  # the read B stays (unread goes first, even an S)
    kept = list(gone.output)
    s.finish(b)
    run_step(s)  # a slot frees: the unread one comes back, nobody else waits
    assert gone.state is SeqState.RUNNING and gone.output[: len(kept)] == kept


def test_an_unread_stream_waits_behind_live_ones_and_is_not_preempted_for_nothing(loop):
    s = Scheduler(n_seq_max=1, n_batch=64)
    away = Presence()
    away.gone = True
    unread = make(loop, [1, 2, 3], "unread", "S", presence=away)
    live = make(loop, [4, 5, 6], "live", "B")
    s.add(unread)
    s.add(live)
    run_step(s)
    assert live.state is SeqState.RUNNING and unread.state is SeqState.WAITING
    s.finish(live)
    run_step(s)
    assert unread.state is SeqState.RUNNING
    run_step(s)
    assert s.preemptions == 0  # alone, it generates on


def test_a_cancelled_preempted_sequence_leaves_the_queue(loop):
    s = Scheduler(n_seq_max=1, n_batch=64)
    b = make(loop, [1, 2], "b", "B")
    s.add(b)
    run_step(s)
    s.add(make(loop, [3, 4], "s", "S"))
    run_step(s)
    assert b in s.waiting
    b.cancel()
    assert s.reap_cancelled() == [b]
    assert b not in s.waiting and b.state is SeqState.FINISHED


def test_after_16_abandoned_streams_a_fresh_request_starts_in_the_next_step(loop):
    s = Scheduler(n_seq_max=8, n_batch=512)
    away = Presence()
    abandoned = [make(loop, range(10 * i, 10 * i + 10), f"gone{i}", "A", presence=away)
                 for i in range(16)]
    for q in abandoned:
        s.add(q)
    for _ in range(3):
        run_step(s)
    away.gone = True  # every one of their clients left
    fresh = make(loop, [1, 2, 3], "fresh", "B")
    s.add(fresh)
    batch = run_step(s)
    assert fresh.state is SeqState.RUNNING and s.preemptions == 1
    assert any(seq is fresh for seq, _ in batch.samplers)  # its first token, this step
    assert {e.seq_id for e in batch.entries} == {fresh.slot}  # the unread ones paused
    assert batch.n_decode == 0
    batch = run_step(s)  # its prompt ran: the unread ones decode on beside it
    assert batch.n_decode == 8


def test_unread_streams_pause_only_while_a_read_prompt_runs(loop):
    s = Scheduler(n_seq_max=4, n_batch=8)  # a 20-token prompt takes three steps
    away = Presence()
    gone = make(loop, range(5), "gone", "A", presence=away)
    s.add(gone)
    run_step(s)
    away.gone = True
    assert run_step(s).n_decode == 1  # alone, it generates on
    fresh = make(loop, range(100, 120), "fresh", "A")
    s.add(fresh)
    written = len(gone.output)
    for _ in range(3):
        batch = run_step(s)
        assert batch.n_decode == 0 and gone.state is SeqState.RUNNING  # a free slot: kept
    assert fresh.output and len(gone.output) == written
    assert run_step(s).n_decode == 2
    assert len(gone.output) == written + 1


def test_model_config_scheduling_fields():
    from pydantic import ValidationError

    from redline.config import ModelConfig

    cfg = ModelConfig(name="m", bundled="smollm2-135m-instruct")
    assert (cfg.scheduling, cfg.prefill_slack, cfg.upstream_priority) == ("priority", 0.5, "off")
    fixed = ModelConfig(name="m", bundled="smollm2-135m-instruct", scheduling="fcfs",
                        prefill_slack=None)
    assert fixed.scheduling == "fcfs" and fixed.prefill_slack is None
    for bad in ({"scheduling": "lifo"}, {"prefill_slack": 0}, {"upstream_priority": "yes"}):
        with pytest.raises(ValidationError):
            ModelConfig(name="m", bundled="smollm2-135m-instruct", **bad)


def _costed(s: Scheduler, base: float, per_stream: float) -> None:
    s.budget.decode_s, s.budget.token_s = base + per_stream, 0.004
    s.step_cost = lambda n: base + per_stream * n


@pytest.mark.parametrize("per_stream,alone,beside", [(0.005, 1, 0), (0.0001, 3, 3)])
def test_unread_streams_ride_only_as_their_cost_allows(loop, per_stream, alone, beside):
    """A CPU (a step costs ~5 ms more per stream): alone, one unread stream decodes per
    step (a newcomer waits about one stream's step); beside a read one, none. Nearly free
    batching (a GPU): they all ride."""
    s = Scheduler(n_seq_max=4, n_batch=64)
    away = Presence()
    gone = [make(loop, range(10 * i, 10 * i + 5), f"g{i}", "A", presence=away) for i in range(3)]
    for q in gone:
        s.add(q)
    run_step(s)
    away.gone = True
    _costed(s, 0.002, per_stream)
    assert run_step(s).n_decode == alone
    if alone == 1:  # fewest written first: they take turns
        assert sorted(len(q.output) for q in gone) == [1, 1, 2]
        run_step(s)
        run_step(s)
        assert [len(q.output) for q in gone] == [2, 2, 2]
    live = make(loop, [1, 2, 3], "live", "A")
    s.add(live)
    assert run_step(s).n_decode == 0  # its prompt runs alone
    assert run_step(s).n_decode == 1 + beside


def test_an_unread_prompt_runs_only_in_steps_nobody_reads(loop):
    s = Scheduler(n_seq_max=1, n_batch=64)
    _costed(s, 0.002, 0.005)
    away = Presence()
    gone = make(loop, range(40), "gone", "A", presence=away)
    s.add(gone)
    run_step(s)
    run_step(s)
    away.gone = True
    s.add(make(loop, [1, 2, 3], "live", "A"))
    run_step(s)  # the live one takes its slot
    assert gone.state is SeqState.WAITING
    s.finish(s.running[0])
    batch = run_step(s)  # back, alone: its recompute in short steps
    # (1 + 0.5) x a stream's 7 ms step, at 4 ms a prompt token: 2 tokens a step
    assert len(batch.entries) == 2 and batch.n_decode == 0
