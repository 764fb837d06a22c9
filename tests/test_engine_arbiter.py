"""The step arbiter with fake engines (threads, no model): one step at a time across
engines, fair by core time, level start after idle, and the slowdown the planner uses."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from redline.engine.arbiter import StepArbiter
from redline.routing.estimates import ReplicaStats


class FakeClock:
    """Core time as the fake engines say they used it: the accounting is exact, whatever
    the machine is doing."""

    def __init__(self) -> None:
        self.now = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self.now

    def advance(self, dt: float) -> None:
        with self._lock:
            self.now += dt


class FakeEngine:
    """A thread that takes `steps` turns, each `cost` of core time (and a real pause, so
    that the other engine's thread runs meanwhile)."""

    def __init__(self, arbiter: StepArbiter, clock: FakeClock, name: str, cost: float,
                 steps: int, log: list[str], inside: list[int]) -> None:
        self.left = steps
        self.member = arbiter.join(name, lambda: self.left)
        self.arbiter, self.clock, self.cost, self.log, self.inside = arbiter, clock, cost, log, inside
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while self.left > 0:
            with self.arbiter.turn(self.member):
                self.inside.append(1)
                assert len(self.inside) == 1, "two engines stepped at once"
                self.clock.advance(self.cost)
                self.log.append(self.member.name)
                threading.Event().wait(0.0005)
                self.inside.pop()
            self.left -= 1


def run_engines(specs: list[tuple[str, float, int]], grace_s: float = 0.05
                ) -> tuple[StepArbiter, list[str], list[FakeEngine]]:
    clock = FakeClock()
    arbiter = StepArbiter(clock=clock, grace_s=grace_s)
    log: list[str] = []
    inside: list[int] = []
    engines = [FakeEngine(arbiter, clock, n, c, s, log, inside) for n, c, s in specs]
    for e in engines:
        e.thread.start()
    for e in engines:
        e.thread.join(timeout=60)
        assert not e.thread.is_alive()
    return arbiter, log, engines


def test_steps_of_different_engines_never_overlap() -> None:
    arbiter, log, _ = run_engines([("a", 1.0, 60), ("b", 1.0, 60), ("c", 1.0, 60)])
    assert arbiter.max_holders_seen == 1
    assert sorted(set(log)) == ["a", "b", "c"] and len(log) == 180


def test_contended_while_another_engine_waits() -> None:
    """An engine stepping back to back (Engine._steps) hands the turn on once another
    engine waits for it, and not before."""
    arbiter = StepArbiter()
    a = arbiter.join("a", lambda: 1)
    b = arbiter.join("b", lambda: 1)
    arbiter.acquire(a)
    assert not arbiter.contended(a)
    waiter = threading.Thread(target=lambda: (arbiter.acquire(b), arbiter.release(b)))
    waiter.start()
    for _ in range(2000):
        if arbiter.contended(a):
            break
        threading.Event().wait(0.001)
    assert arbiter.contended(a)
    arbiter.release(a)
    waiter.join(timeout=5)
    assert not waiter.is_alive() and not arbiter.contended(a)


def test_a_run_of_steps_is_charged_as_it_goes() -> None:
    """An engine that keeps the turn for many steps is charged after each: the cores it
    uses show in `utilization` (the router's headroom) before it hands the turn on, and
    the hand-off charges only what came after."""
    clock = FakeClock()
    arbiter = StepArbiter(clock=clock)
    a = arbiter.join("a", lambda: 1)
    arbiter.acquire(a)
    clock.advance(2.0)
    assert arbiter.utilization() == 0.0
    arbiter.charge(a)
    assert a.vtime == pytest.approx(2.0)
    assert arbiter.utilization() == pytest.approx(0.2, rel=0.01)  # 2 s of the last 10
    clock.advance(1.0)
    arbiter.release(a)
    assert a.vtime == pytest.approx(3.0)
    assert arbiter.utilization() == pytest.approx(0.3, rel=0.01)


def test_fair_by_core_time_not_by_turn() -> None:
    """a's steps cost 4× b's: while both have work, b takes about four steps per a step,
    so neither gets much more core time than the other (by turns, b would get a quarter)."""
    arbiter, log, (a, b) = run_engines([("a", 4.0, 30), ("b", 1.0, 400)])
    # look at the stretch where both still had work: up to a's last step
    both = log[: max(i for i, n in enumerate(log) if n == "a") + 1]
    time_a = 4.0 * both.count("a")
    time_b = 1.0 * both.count("b")
    assert both.count("b") > 2 * both.count("a")  # not alternation
    assert 0.5 < time_b / time_a < 2.0


def test_an_engine_back_from_idle_banks_no_credit() -> None:
    clock = FakeClock()
    arbiter = StepArbiter(clock=clock)
    work = {"a": 1, "b": 0}
    a = arbiter.join("a", lambda: work["a"])
    b = arbiter.join("b", lambda: work["b"])
    for _ in range(100):  # a alone for 100 s of core time
        with arbiter.turn(a):
            clock.advance(1.0)
    work["b"] = 1
    arbiter.acquire(b)
    assert b.vtime >= a.vtime - 1.0  # starts level with a, not 100 s behind
    arbiter.release(b)


def test_slowdown_counts_the_other_engines_with_work() -> None:
    arbiter = StepArbiter()
    work = {"a": 0, "b": 0, "c": 0}

    def probe(name: str) -> Callable[[], int]:
        return lambda: work[name]

    a, b, c = (arbiter.join(n, probe(n)) for n in "abc")
    assert arbiter.slowdown(a) == 1.0
    work["a"] = 5
    assert arbiter.slowdown(a) == 1.0  # its own work is not sharing
    work["b"] = 1
    assert arbiter.slowdown(a) == 2.0 and arbiter.slowdown(c) == 3.0
    arbiter.leave(b)
    assert arbiter.slowdown(a) == 1.0


def test_estimates_learn_alone_and_predict_with_the_sharing() -> None:
    stats = ReplicaStats()
    for load in range(20):  # measured while one other engine had work: twice as long
        stats.observe_ttft(2 * (0.1 + 0.05 * (load % 4)), load % 4, 100, slowdown=2.0)
        stats.observe_tpot(0.04, alpha=1.0, slowdown=2.0)
    alone = stats.predict(1, 100, 11)
    shared = stats.predict(1, 100, 11, slowdown=2.0)
    assert abs(alone.ttft_s - 0.15) < 0.02 and abs(stats.tpot_s - 0.02) < 1e-9
    assert abs(shared.ttft_s - 2 * alone.ttft_s) < 1e-9
    assert abs(shared.total_s - 2 * alone.total_s) < 1e-9


def test_recent_slowdown_is_the_share_of_the_cores_the_others_used() -> None:
    now = [0.0]
    arbiter = StepArbiter(clock=lambda: now[0])
    a = arbiter.join("a", lambda: 0)
    b = arbiter.join("b", lambda: 0)
    assert arbiter.recent_slowdown(a) == 1.0  # nobody used the cores lately

    def step(m, seconds: float) -> None:  # type: ignore[no-untyped-def]
        arbiter.acquire(m)
        now[0] += seconds
        arbiter.release(m)

    step(b, 1.0)  # b used 1 s of the last 10: a could have had 90 % of the cores
    assert abs(arbiter.recent_slowdown(a) - 1 / 0.9) < 0.01
    assert arbiter.recent_slowdown(b) == 1.0  # its own steps are not sharing
    for _ in range(8):
        step(b, 1.0)  # b busy most of the window: fair turns still give a half
    assert arbiter.recent_slowdown(a) == 2.0
    assert arbiter.slowdown(a) == 1.0  # b holds no work this instant


def test_tpot_follows_the_engines_forecast_scaled_by_its_observed_bias() -> None:
    """A local engine's TPOT forecast knows the batch a newcomer joins; the learnt part is
    only how far observed streams were from it. After eight streams (TPOT ~32 ms) the
    load falls to one: the prediction follows at once instead of the streams' average."""
    stats = ReplicaStats()
    for _ in range(30):  # streams at 8: the engine forecast 30 ms, they saw 33 ms
        stats.observe_ttft(0.05, 1, 50)
        stats.observe_tpot(0.033, own_s=0.030)
    assert stats.tpot_bias == pytest.approx(1.1, rel=0.05)
    alone = stats.predict(0, 50, 64, own_ttft_s=0.04, own_tpot_s=0.010)  # one stream now
    assert alone.tpot_s == pytest.approx(0.011, rel=0.05)
    assert stats.tpot_s > 0.03  # the plain average still remembers the eight streams
    # a remote backend (no forecast of its own) keeps the learnt average
    assert stats.predict(0, 50, 64).tpot_s == pytest.approx(stats.tpot_s)
    # one wild stream moves the bias by a clamped step only
    stats.observe_tpot(5.0, own_s=0.010)
    assert stats.tpot_bias < 1.1 + 0.1 * 4.0
