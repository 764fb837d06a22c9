"""The engine's own TTFT forecast from the work it admitted (engine/forecast.py), with
made-up step costs and sequences (no model)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator

import pytest

from redline.engine.budget import PrefillBudget
from redline.engine.forecast import Forecast
from redline.engine.sequence import Sequence
from redline.types import SamplingParams


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def seq(loop: asyncio.AbstractEventLoop, sid: str, prompt: int = 10, written: int = 0,
        tier: str = "A", max_tokens: int = 256) -> Sequence:
    first = 1000 * (1 + sum(map(ord, sid)))  # prompts that share no prefix
    s = Sequence(sid, list(range(first, first + prompt)),
                 SamplingParams(max_tokens=max_tokens, temperature=0),
                 lambda c: None, loop, tier=tier)
    s.n_fed = prompt + written  # running: its prompt is in the KV
    s.output = [7] * written
    return s


def costed(slots: int = 2) -> Forecast:
    b = PrefillBudget(512, slack=None)
    b.decode_s, b.token_s = 0.02, 0.001  # 20 ms a decode step, 1 ms a prompt token
    return Forecast(slots, b, expected_len=100)


def test_no_forecast_until_the_step_costs_are_measured(loop: asyncio.AbstractEventLoop) -> None:
    f = Forecast(2, PrefillBudget(512))
    assert f.ttft_s(50, "A", [], []) is None


def test_a_free_slot_starts_at_once(loop: asyncio.AbstractEventLoop) -> None:
    f = costed()
    alone = f.ttft_s(50, "A", [], [])
    assert alone == pytest.approx(50 * 0.001 + 0.02)  # its prompt and one step
    busy = f.ttft_s(50, "A", [seq(loop, "r1", written=10)], [])
    assert busy == pytest.approx(alone)  # one slot still free: the stream costs nothing here


def test_full_slots_wait_for_the_soonest_answer_to_end(loop: asyncio.AbstractEventLoop) -> None:
    f = costed()
    running = [seq(loop, "r1", written=10), seq(loop, "r2", written=60)]
    got = f.ttft_s(50, "A", running, [])
    # r2 has about 40 tokens left of the 100-token average: 40 steps of 20 ms first
    assert got == pytest.approx(40 * 0.02 + 50 * 0.001 + 0.02)
    # a request waiting ahead takes that slot: the next one frees after r1's 90 tokens
    ahead = seq(loop, "w1", prompt=30)
    ahead.n_fed, ahead.output = 0, []
    later = f.ttft_s(50, "A", running, [ahead])
    assert later == pytest.approx(90 * 0.02 + 80 * 0.001 + 0.02)


def test_tier_s_passes_waiting_work_and_takes_a_b_slot(loop: asyncio.AbstractEventLoop) -> None:
    f = costed()
    running = [seq(loop, "r1", written=10), seq(loop, "r2", written=10, tier="B")]
    waiting = [seq(loop, "w1", tier="A")]
    waiting[0].n_fed = 0
    s = f.ttft_s(20, "S", running, waiting)
    a = f.ttft_s(20, "A", running, waiting)
    assert s is not None and a is not None
    assert s == pytest.approx(20 * 0.001 + 0.02)  # the B answer yields its slot
    assert a > 1.0  # behind w1, after r1 or r2 ends
    fcfs = f.ttft_s(20, "S", running, waiting, tiers=False)
    assert fcfs == pytest.approx(a)


def test_answers_past_the_average_and_the_average_learns(loop: asyncio.AbstractEventLoop) -> None:
    f = costed()
    long = seq(loop, "r", written=150, max_tokens=256)
    assert f.remaining(long) == 50  # outlived the average: half the average again
    assert f.remaining(seq(loop, "c", written=150, max_tokens=160)) == 10  # its cap
    for _ in range(50):
        f.finished(20)
    assert f.expected_len < 25
    assert 15 <= f.remaining(seq(loop, "n", written=5)) <= 16  # ceil(average - 5)


def test_a_step_costs_more_with_more_streams_and_the_newcomer_counts() -> None:
    f = costed(slots=8)
    for _ in range(20):
        f.observe_step(1, 0, 0.010)
        f.observe_step(5, 0, 0.030)  # 5 ms more a stream
        f.observe_step(5, 40, 0.090)  # a mixed step: not a decode step's cost
    assert f.step_s(3) == pytest.approx(0.020, rel=1e-6)
    assert f.tpot_s(4) == pytest.approx(0.030, rel=1e-6)  # 4 running + the newcomer
    one = costed()
    for _ in range(5):
        one.observe_step(2, 0, 0.012)
    assert one.step_s(6) == pytest.approx(0.012)  # one batch size seen: no slope to guess


def test_unread_streams_cost_a_read_newcomer_nothing(loop: asyncio.AbstractEventLoop) -> None:
    from redline.types import Presence

    f = costed()
    away = Presence()
    away.gone = True
    gone = [seq(loop, "g1", written=10), seq(loop, "g2", written=20)]
    for s in gone:
        s.presence = away
    alone = f.ttft_s(50, "B", [], [])
    # both slots are held by streams nobody reads: one yields, and they pause while the
    # newcomer's prompt runs
    assert f.ttft_s(50, "B", gone, []) == pytest.approx(alone)
    away.gone = False  # read again: full slots, it waits for the soonest to end
    assert f.ttft_s(50, "B", gone, []) > alone + 50 * 0.02


def test_a_prompt_alone_costs_a_fixed_part_and_a_part_per_token() -> None:
    f = costed()
    f.budget.token_s = 0.004  # what a prompt token adds beside decoding streams
    f.observe_step(0, 20, 0.050)  # a short question: mostly the fixed part
    assert f.prefill_s(20) is None  # one size seen: no slope yet
    f.observe_step(0, 400, 0.430)
    f.observe_step(3, 0, 0.030)  # a decode step teaches the prompt fit nothing
    f.observe_step(3, 8, 0.060)  # nor does a mixed one
    # 30 ms + 1 ms a token, from the two prompt-only steps
    assert f.prefill_s(200) == pytest.approx(0.230)
    assert f.ttft_s(20, "A", [], []) == pytest.approx(0.050)
    # past n_batch (512) a prompt takes two steps, each with its fixed part
    assert f.prefill_s(600) == pytest.approx(0.030 + 0.512 + 0.030 + 0.088)


def test_beside_decoding_streams_a_prompt_token_costs_the_mixed_rate(
        loop: asyncio.AbstractEventLoop) -> None:
    f = costed(slots=4)
    f.observe_step(0, 20, 0.050)
    f.observe_step(0, 400, 0.430)
    running = [seq(loop, "r1", written=10)]
    # one stream decodes: the prompt rides its steps at the budget's per-token cost
    assert f.ttft_s(20, "A", running, []) == pytest.approx(20 * 0.001 + 0.02)


def test_prompts_ahead_that_share_a_system_prompt_compute_it_once(
        loop: asyncio.AbstractEventLoop) -> None:
    """Eight users send one 400-token system prompt at once: the first computes it, the
    others copy its cells and compute their own questions; the newcomer too."""
    f = costed(slots=16)
    system = list(range(400))
    waiting = []
    for i in range(7):
        s = Sequence(f"w{i}", system + [5000 + i] * 20, SamplingParams(max_tokens=64),
                     lambda c: None, loop)
        waiting.append(s)
    mine = system + [9000] * 20
    got = f.ttft_s(420, "A", [], waiting, tokens=mine)
    # 420 + 6 x 20 for those ahead, 20 for its own: 560 tokens, not 8 x 420
    assert got == pytest.approx(560 * 0.001 + 2 * 0.02)
    # without its tokens the newcomer's own part is the count it was given
    assert f.ttft_s(420, "A", [], waiting) == pytest.approx(960 * 0.001 + 2 * 0.02)


def test_a_held_back_prompt_on_the_side_costs_its_prompt_only_time_on_half_the_threads(
        loop: asyncio.AbstractEventLoop) -> None:
    """7 streams decode; a 1,000-token prompt would be held back, 8 tokens a step. On the
    side it runs in prompt-only chunks instead, on half the threads: that time twice over,
    then one step for its last token; a prompt ahead of it (on the side or waiting for it)
    first."""
    b = PrefillBudget(512, slack=0.5, floor=8, protect=4)
    b.decode_s, b.token_s = 0.02, 0.004  # a prompt token beside decodes: 4 ms; 2 per step
    f = Forecast(8, b, expected_len=100)
    f.observe_step(0, 100, 0.130)
    f.observe_step(0, 500, 0.530)  # prompt-only steps: 30 ms + 1 ms a token
    running = [seq(loop, f"r{i}", written=10) for i in range(6)]
    held = f.ttft_s(1000, "A", running, [])
    assert held == pytest.approx(1000 * 0.004 + 125 * 0.02)  # 8 tokens a step, 125 steps
    f.side_factor, f.side_min = 2.0, 64
    side = f.ttft_s(1000, "A", running, [], side=True)
    assert side == pytest.approx(2 * f.prefill_s(1000) + 0.02)
    assert side < held
    ahead = seq(loop, "ahead", prompt=600)
    ahead.n_fed = 0  # its prompt is still to compute (on the side now, or next)
    assert f.ttft_s(1000, "A", [*running, ahead], [], side=True) \
        == pytest.approx(2 * f.prefill_s(1600) + 0.02)
    # a short prompt, or too few streams: as without the side
    assert f.ttft_s(40, "A", running, [], side=True) == f.ttft_s(40, "A", running, [])
    few = running[:2]
    assert f.ttft_s(1000, "A", few, [], side=True) == f.ttft_s(1000, "A", few, [])


def test_long_prompts_that_do_not_wait_alone_take_the_rest_of_the_batch(
        loop: asyncio.AbstractEventLoop) -> None:
    """With `yield_to_waiting`, a long newcomer beside 4 decoding streams and 3 long prompts in
    their slots is forecast at the rest of the batch a step after those ahead, not held
    back at 8 tokens a step; alone beside 7 streams, held back as before."""
    b = PrefillBudget(512, slack=0.5, floor=8, protect=4, yield_to_waiting=True)
    b.decode_s, b.token_s = 0.02, 0.004  # 2 prompt tokens fit in a step's slack: floor 8
    f = Forecast(8, b, expected_len=100)
    streams = [seq(loop, f"r{i}", written=10) for i in range(7)]
    prompts = []
    for i in range(3):
        p = seq(loop, f"p{i}", prompt=1000)
        p.n_fed = 0  # still to compute
        prompts.append(p)
    work = 4000  # theirs and its own
    got = f.ttft_s(1000, "A", streams[:4] + prompts, [])
    assert got == pytest.approx(work * 0.004 + math.ceil(work / (512 - 7)) * 0.02)
    held = f.ttft_s(1000, "A", streams, [])
    assert held == pytest.approx(1000 * 0.004 + math.ceil(1000 / 8) * 0.02)
    # a request queued for the last slot ahead of it: it does not wait alone
    queued = seq(loop, "q", prompt=20)
    queued.n_fed = 0
    behind = f.ttft_s(1000, "A", [*streams, seq(loop, "r7", written=10)], [queued])
    assert behind is not None and behind < held
    off = Forecast(8, PrefillBudget(512, slack=0.5, floor=8, protect=4), expected_len=100)
    off.budget.decode_s, off.budget.token_s = 0.02, 0.004
    assert off.ttft_s(1000, "A", streams[:4] + prompts, []) == pytest.approx(
        work * 0.004 + math.ceil(work / 8) * 0.02)
