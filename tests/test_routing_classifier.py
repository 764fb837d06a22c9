"""The difficulty classifier on the labelled set it ships with."""

from __future__ import annotations

import pytest

from redline.routing.classifier import Classifier, cross_validate, load_examples, text_features


def test_the_labelled_set_is_balanced_enough() -> None:
    ex = load_examples()
    assert len(ex) >= 150
    for tier in "SAB":
        assert sum(e.tier == tier for e in ex) >= 30
    for d in ("simple", "complex"):
        assert sum(e.difficulty == d for e in ex) >= 50


def test_routing_accuracy_held_out() -> None:
    # 5-fold cross-validation: every example is judged by a model that never saw it
    acc = cross_validate(load_examples(), text_features)
    assert acc["tier"] >= 0.88
    assert acc["difficulty"] >= 0.82


@pytest.mark.parametrize(("text", "tier", "difficulty"), [
    ("hi!", "S", "simple"),
    ("what's the capital of Peru?", "S", "simple"),
    ("implement a lock-free queue in C++ and explain the memory ordering", "A", "complex"),
    ("write a comprehensive report on the european steel industry", "B", "complex"),
])
def test_unseen_examples(text: str, tier: str, difficulty: str) -> None:
    d = Classifier().classify(text)
    assert (d.tier, d.difficulty) == (tier, difficulty)
