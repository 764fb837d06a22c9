"""The one circuit breaker (redline/breaker.py), on a clock the test moves, and the one
model/tier parser (routing/names.py)."""

from __future__ import annotations

import pytest

from redline.breaker import CircuitBreaker
from redline.errors import InvalidRequest, ModelNotFound
from redline.routing.names import AUTO, check_model, parse_tier, resolve_model


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_threshold_consecutive_failures_open_it_and_a_success_in_between_resets() -> None:
    clock = Clock()
    b = CircuitBreaker(threshold=3, ttl_s=5.0, clock=clock)
    b.failure()
    b.failure()
    b.success()  # not consecutive: counting starts again
    b.failure()
    b.failure()
    assert b.state == "closed" and b.acquire()
    b.failure()
    assert b.state == "open" and b.is_open and not b.acquire()


def test_half_open_lets_one_probe_through_and_its_result_decides() -> None:
    clock = Clock()
    b = CircuitBreaker(threshold=1, ttl_s=5.0, clock=clock)
    b.failure()
    clock.now += 4.9
    assert not b.acquire()  # not due yet
    clock.now += 0.2
    assert b.state == "half-open" and not b.is_open
    assert b.acquire()  # the probe
    assert b.is_open and not b.acquire()  # one at a time
    b.failure()  # the probe failed: open again, for a whole ttl from now
    assert b.state == "open"
    clock.now += 5.1
    assert b.acquire()
    b.release()  # cancelled: proved nothing, the next call may probe
    assert b.acquire()
    b.success()
    assert b.state == "closed" and b.acquire() and b.acquire()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        CircuitBreaker(threshold=0)


def test_models_and_tiers_are_checked_in_one_place() -> None:
    served = {"small", "large"}
    assert resolve_model(AUTO, served, "small") == "small"
    assert resolve_model("large", served, "small") == "large"
    check_model(AUTO, served)
    with pytest.raises(ModelNotFound) as missing:
        check_model("nope", served)
    assert missing.value.param == "model"
    assert [parse_tier(t) for t in (None, "auto", "S", "A", "B")] == [None, None, "S", "A", "B"]
    for bad in ("s", "C", ""):
        with pytest.raises(InvalidRequest) as refused:
            parse_tier(bad)
        assert refused.value.param == "tier"
