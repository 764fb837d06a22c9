"""The gate's verdicts on made-up measurements (no model)."""

from __future__ import annotations

import pytest

from redline.optimize.evalset import Question, load_evalset
from redline.optimize.gate import Gate, parse_loss
from redline.optimize.quality import Quality, is_correct, normalise


def q(ppl: float, acc: float, top1: float | None = 0.99) -> Quality:
    return Quality(ppl, 1000, top1, acc, 0.9)


def test_refuses_with_the_numbers_that_failed() -> None:
    gate = Gate(0.01)
    failures = gate.failures(q(20.0, 0.60), q(20.5, 0.55))
    assert len(failures) == 2
    assert "perplexity 20.500 vs 20.000: +2.50% > 1.00% allowed" in failures[0]
    assert "question accuracy 55.0% vs 60.0%" in failures[1]


def test_accepts_within_loss() -> None:
    assert Gate(0.01).failures(q(20.0, 0.60), q(20.1, 0.60)) == []
    assert Gate(0.01).failures(q(20.0, 0.60), q(19.0, 0.65)) == []  # better is fine
    assert Gate(0.05, max_accuracy_drop=0.05).failures(q(20.0, 0.60), q(20.9, 0.575)) == []


def test_agreement_floor() -> None:
    failures = Gate(0.5, min_top1_agreement=0.95).failures(q(20, 0.6), q(20, 0.6, top1=0.9))
    assert failures == ["greedy-token agreement 90.0% < 95.0% required"]


def test_parse_and_bounds() -> None:
    assert parse_loss("1%") == pytest.approx(0.01) and parse_loss("2.5") == pytest.approx(0.025)
    with pytest.raises(ValueError):
        parse_loss("lots")
    with pytest.raises(ValueError):
        Gate(1.5)


def test_answers_are_normalised() -> None:
    question = Question("What is the capital of France?", ("paris",))
    assert is_correct("The capital of France is Paris.", question)
    assert not is_correct("Lyon", question)
    assert normalise("  The Answer!  ") == "answer"
    ev = load_evalset()
    assert len(ev.questions) >= 30 and len(ev.heldout.split()) > 1000
