"""The adaptive prefill budget, with made-up step times (no model)."""

from __future__ import annotations

import asyncio

import pytest

from redline.engine.budget import FIRST, FLOOR, WHOLE_S, PrefillBudget
from redline.engine.scheduler import Scheduler
from redline.engine.sequence import Sequence
from redline.types import SamplingParams


def test_full_batch_when_nothing_decodes() -> None:
    b = PrefillBudget(512)
    assert b.tokens(0) == 512
    b.observe(0, 512, 0.5)
    b.observe(4, 0, 0.02)
    assert b.tokens(0) == 512  # nobody to stall: the whole batch, whatever the costs


def test_small_first_budget_while_costs_are_unknown() -> None:
    b = PrefillBudget(512)
    assert b.tokens(7) == FIRST
    b.observe(7, FIRST, 0.05)  # mixed, but no decode-only step to split it with yet
    assert b.token_s is None and b.tokens(7) == FIRST


def test_budget_shrinks_to_what_fits_in_the_slack_of_a_decode_step() -> None:
    b = PrefillBudget(512, slack=0.5)
    b.observe(7, 0, 0.020)  # a decode-only step of 7 streams: 20 ms (their TPOT)
    b.observe(7, 64, 0.020 + 64 * 0.0005)  # each prompt token adds 0.5 ms
    assert b.decode_s == pytest.approx(0.020)
    assert b.token_s == pytest.approx(0.0005)
    # half a decode step's time / 0.5 ms a token = 20 tokens: the step stays within 1.5x
    assert b.tokens(7) == 20
    assert b.tokens(0) == 512


def test_budget_grows_back_when_prompt_tokens_get_cheap_and_is_bounded() -> None:
    b = PrefillBudget(128, slack=0.5)
    b.observe(2, 0, 0.010)
    b.observe(2, 20, 0.010 + 20 * 0.001)
    small = b.tokens(2)
    for _ in range(40):  # the other model's work went away: tokens cost a tenth
        b.observe(2, 20, 0.010 + 20 * 0.0001)
    assert b.tokens(2) > small
    assert b.tokens(2) <= 128 - 2  # never past the batch
    for _ in range(40):
        b.observe(2, 20, 10.0)  # tokens far dearer than a decode step
    assert b.tokens(2) == FLOOR  # the prompt still advances


def test_short_prompt_only_steps_do_not_set_the_token_cost() -> None:
    b = PrefillBudget(512)
    b.observe(0, 5, 0.02)  # mostly the step's fixed part: 4 ms "a token" would mislead
    assert b.token_s is None
    b.observe(0, 512, 0.256)
    assert b.token_s == pytest.approx(0.0005)


def test_a_prompt_goes_whole_only_when_its_work_is_short_and_measured() -> None:
    b = PrefillBudget(512, slack=0.5)
    assert not b.whole(10)  # the cost of a prompt token is not known yet
    b.observe(7, 0, 0.020)
    b.observe(7, 64, 0.020 + 64 * 0.0005)
    fits = int(WHOLE_S / 0.0005)
    assert b.whole(fits - 1) and not b.whole(fits + 1)
    fixed = PrefillBudget(512, slack=None)
    fixed.observe(7, 0, 0.02)
    fixed.observe(7, 64, 0.052)
    assert not fixed.whole(10)  # a fixed budget takes the rest of the batch anyway


def test_fixed_budget_is_the_rest_of_the_batch() -> None:
    b = PrefillBudget(512, slack=None)
    b.observe(7, 0, 0.02)
    b.observe(7, 505, 0.3)
    assert b.tokens(7) == 505


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def make(loop, prompt, sid):
    return Sequence(sid, list(prompt), SamplingParams(max_tokens=64, temperature=0),
                    lambda c: None, loop)


def step(sched, seconds):
    batch = sched.schedule()
    sched.commit(batch)
    sched.observe(batch, seconds(batch))
    for seq, _ in batch.samplers:
        seq.output.append(7)
    return batch


def test_scheduler_splits_a_long_prompt_while_streams_decode(loop) -> None:
    """7 streams decode; a 1,500-token prompt arrives. With the costs measured, each
    step carries a small chunk of it (adaptive), not 505 tokens (fixed)."""
    def cost(batch):  # made-up machine: 2 ms a decode token + 1 ms fixed, 0.5 ms a prompt token
        return 0.001 + 0.002 * batch.n_decode + 0.0005 * (len(batch.entries) - batch.n_decode)

    decode_only = cost(type("B", (), {"n_decode": 7, "entries": [0] * 7})())
    for slack in (0.5, None):
        s = Scheduler(n_seq_max=8, n_batch=512, budget=PrefillBudget(512, slack))
        streams = [make(loop, range(10 * i, 10 * i + 10), f"s{i}") for i in range(7)]
        for q in streams:
            s.add(q)
        step(s, cost)  # their prompts (nothing decodes yet: the whole batch)
        for _ in range(3):
            step(s, cost)  # decode-only steps: the budget learns what a step costs
        s.add(make(loop, range(1000, 2500), "long"))
        batches = [step(s, cost) for _ in range(3)]
        assert [b.n_decode for b in batches] == [7] * 3  # every stream decodes every step
        chunks = [len(b.entries) - 7 for b in batches]
        if slack is None:
            assert chunks == [505, 505, 490]  # 18x a decode step: the stall
        else:
            # about 0.5 x 15 ms / 0.5 ms = 15 tokens: each step within 1.5x a decode step
            assert all(FLOOR <= c <= 15 for c in chunks), chunks
            assert all(cost(b) <= 1.5 * decode_only + 1e-9 for b in batches)


def test_a_short_prompt_runs_in_one_step_and_a_long_one_is_chunked_to_its_end(loop) -> None:
    """7 streams decode. A 43-token question finishes its prompt in the step it is
    admitted to (its first token does not wait for chunks); a 1,500-token prompt is
    chunked within 1.5x a decode step to its last token."""
    def cost(batch):  # as above: 0.5 ms a prompt token, so WHOLE_S is 200 tokens
        return 0.001 + 0.002 * batch.n_decode + 0.0005 * (len(batch.entries) - batch.n_decode)

    decode_only = cost(type("B", (), {"n_decode": 7, "entries": [0] * 7})())
    s = Scheduler(n_seq_max=9, n_batch=512, budget=PrefillBudget(512, 0.5))
    for i in range(7):
        s.add(make(loop, range(10 * i, 10 * i + 10), f"s{i}"))
    for _ in range(4):
        step(s, cost)
    short = make(loop, range(3000, 3043), "short")
    s.add(short)
    first = step(s, cost)
    assert len(first.entries) - first.n_decode == 43
    assert not short.in_prefill and any(q is short for q, _ in first.samplers)
    s.finish(short)
    long = make(loop, range(1000, 2500), "long")
    s.add(long)
    batches = []
    while long.in_prefill:
        batches.append(step(s, cost))
    assert len(batches) > 50  # chunked all the way
    assert all(cost(b) <= 1.5 * decode_only + 1e-9 for b in batches)


def test_with_a_stream_per_slot_a_short_newcomer_runs_alone_then_the_streams(loop) -> None:
    """One KV stream per slot (`contiguous`): a step with decoding streams and a prompt is
    two forward passes, and the newcomer's first token waits for both. Its prompt runs
    alone in a step, the streams decode in the next (with it); two newcomers at once
    alternate with the streams, so the streams wait for one prompt at a time. In the
    unified buffer (one pass either way) the prompt joins the streams' step."""
    def cost(batch):
        return 0.001 + 0.002 * batch.n_decode + 0.0005 * (len(batch.entries) - batch.n_decode)

    for contiguous in (True, False):
        s = Scheduler(n_seq_max=10, n_batch=512, budget=PrefillBudget(512, 0.5))
        s.contiguous = contiguous
        streams = [make(loop, range(10 * i, 10 * i + 10), f"s{i}") for i in range(7)]
        for q in streams:
            s.add(q)
        for _ in range(4):
            step(s, cost)
        a, b = (make(loop, range(3000 + 100 * i, 3043 + 100 * i), f"q{i}") for i in range(2))
        s.add(a)
        s.add(b)
        batches = [step(s, cost) for _ in range(4)]
        shape = [(x.n_decode, len(x.entries) - x.n_decode) for x in batches]
        if contiguous:
            assert shape == [(0, 43), (8, 0), (0, 43), (9, 0)]
        else:
            assert shape == [(7, 43), (8, 43), (9, 0), (9, 0)]
        assert not a.in_prefill and not b.in_prefill
        assert all(len(q.output) == 4 + (2 if contiguous else 4) for q in streams)


def test_with_a_stream_per_slot_a_burst_shares_its_step_while_requests_queue(loop) -> None:
    """Five questions at once at an idle engine with four slots: the first reached it
    sooner and decodes; three more take the other slots, the fifth queues for one. The
    three (as many newcomers as streams decoding, or more: a burst) compute their prompts
    in one step, then every stream decodes. With a slot for everyone the same burst goes
    one at a time, alternating with the streams (grouped, the streams would run in step:
    each later newcomer would wait for its wave's prompts)."""
    def cost(batch):
        return 0.001 + 0.002 * batch.n_decode + 0.0005 * (len(batch.entries) - batch.n_decode)

    for slots, queued in ((4, True), (8, False)):
        s = Scheduler(n_seq_max=slots, n_batch=512, budget=PrefillBudget(512, 0.5))
        s.contiguous = True
        s.add(make(loop, range(3000, 3043), "q0"))
        step(s, cost)  # its prompt: nothing decodes yet, the whole batch
        for _ in range(2):
            step(s, cost)  # it decodes: the budget learns what a step costs
        burst = [make(loop, range(3100 + 100 * i, 3143 + 100 * i), f"q{i + 1}") for i in range(4)]
        for q in burst:
            s.add(q)
        batches = [step(s, cost) for _ in range(4)]
        shape = [(x.n_decode, len(x.entries) - x.n_decode) for x in batches]
        if queued:
            assert shape[:2] == [(0, 129), (4, 0)]
            assert [len(q.output) for q in burst] == [4, 4, 4, 0]  # the fifth still waits
        else:
            assert shape == [(0, 43), (2, 0), (0, 43), (3, 0)]


def test_the_floor_is_set_per_model() -> None:
    """`models[].prefill_floor_tokens`: a step carries at least that many prompt tokens,
    however dear they are (1: the smallest chunks, the streams' gaps shortest)."""
    for floor in (1, 8, 32):
        b = PrefillBudget(512, slack=0.5, floor=floor)
        b.observe(7, 0, 0.020)
        b.observe(7, 16, 0.020 + 16 * 0.01)  # 10 ms a prompt token: 1 token fits in the slack
        assert b.tokens(7) == floor
    from redline.config import ModelConfig

    assert ModelConfig(name="m", bundled="smollm2-135m-instruct").prefill_floor_tokens == FLOOR


def test_a_long_prompt_is_held_back_only_for_enough_decoding_streams(loop) -> None:
    """`protect` 4 of 8 slots: beside 7 decoding streams a 1,500-token prompt is chunked
    within the slack; beside one it takes the rest of the batch every step (its first
    token does not wait ~100 small chunks for one stream's ITL). A short prompt is not
    affected either way (it goes whole)."""
    def cost(batch):  # as above
        return 0.001 + 0.002 * batch.n_decode + 0.0005 * (len(batch.entries) - batch.n_decode)

    for streams, held in ((7, True), (3, False), (1, False)):
        s = Scheduler(n_seq_max=8, n_batch=512, budget=PrefillBudget(512, 0.5, protect=4))
        for i in range(streams):
            s.add(make(loop, range(10 * i, 10 * i + 10), f"s{i}"))
        for _ in range(4):
            step(s, cost)
        s.add(make(loop, range(1000, 2500), "long"))
        chunks = [len(b.entries) - b.n_decode for b in (step(s, cost) for _ in range(3))]
        if held:
            assert all(c <= 15 for c in chunks), chunks
        else:
            assert chunks == [512 - streams] * 2 + [1500 - 2 * (512 - streams)], chunks
    b = PrefillBudget(512, 0.5, protect=4)
    assert b.yields(3) and not b.yields(4)
    assert not PrefillBudget(512, None, protect=4).yields(0)  # a fixed budget: no rule to bend
    assert not PrefillBudget(512, 0.5).yields(1)  # protect 1: held back for any stream


def test_a_long_prompt_is_held_back_only_while_it_waits_alone(loop) -> None:
    """`yield_to_waiting` (`models[].prefill_yield_to_waiting`): one long newcomer beside 7
    decoding streams (the fairness figure) is chunked within the slack; two or more long
    prompts waiting for their first token take the rest of the batch in turn, as if too
    few streams decoded. With the rule off they are held back whenever `protect` streams
    decode."""
    def cost(batch):  # as above
        return 0.001 + 0.002 * batch.n_decode + 0.0005 * (len(batch.entries) - batch.n_decode)

    for streams, prompts, waiting_first, held in ((7, 1, True, True), (6, 2, True, False),
                                             (4, 4, True, False), (4, 4, False, True)):
        budget = PrefillBudget(512, 0.5, protect=4, yield_to_waiting=waiting_first)
        s = Scheduler(n_seq_max=8, n_batch=512, budget=budget)
        for i in range(streams):
            s.add(make(loop, range(20 * i, 20 * i + 20), f"s{i}"))  # 80+ tokens: costs learnt
        for _ in range(4):
            step(s, cost)
        for i in range(prompts):
            s.add(make(loop, range(1000 + 2000 * i, 2500 + 2000 * i), f"long{i}"))
        assert s.pending_prompts() == (prompts if waiting_first else 0)  # queued for a slot
        chunks = [len(b.entries) - b.n_decode for b in (step(s, cost) for _ in range(2))]
        assert s.pending_prompts() == (prompts if waiting_first else 0)
        if held:
            assert all(c <= 15 for c in chunks), chunks
        else:
            assert chunks == [512 - streams] * 2, chunks
    # one long newcomer beside 7 streams and a request queued for a slot: not alone
    s = Scheduler(n_seq_max=8, n_batch=512,
                  budget=PrefillBudget(512, 0.5, protect=4, yield_to_waiting=True))
    for i in range(7):
        s.add(make(loop, range(20 * i, 20 * i + 20), f"s{i}"))
    for _ in range(4):
        step(s, cost)
    s.add(make(loop, range(1000, 2500), "long"))
    s.add(make(loop, range(5000, 5020), "queued"))
    chunks = [len(b.entries) - b.n_decode for b in (step(s, cost) for _ in range(2))]
    assert len(s.waiting) == 1 and s.pending_prompts() == 2
    assert chunks == [512 - 7] * 2, chunks
    b = PrefillBudget(512, 0.5, protect=4, yield_to_waiting=True)
    assert b.yields(7, 2) and b.yields(4, 4) and not b.yields(7, 1) and not b.yields(4, 1)
    assert b.yields(3, 1)  # too few streams: as before
    assert PrefillBudget(512, 0.5, yield_to_waiting=True).yields(1, 1)  # one stream, one prompt
    assert not PrefillBudget(512, 0.5, protect=4).yields(6, 6)  # the rule off
    assert not PrefillBudget(512, None, yield_to_waiting=True).yields(4, 4)  # a fixed budget


def test_the_protected_share_is_a_model_setting() -> None:
    from redline.config import ModelConfig

    assert ModelConfig(name="m", bundled="smollm2-135m-instruct").prefill_protect_share == 0.5
    assert ModelConfig(name="m", bundled="smollm2-135m-instruct").prefill_yield_to_waiting
    with pytest.raises(ValueError):
        ModelConfig(name="m", bundled="smollm2-135m-instruct", prefill_protect_share=1.5)
