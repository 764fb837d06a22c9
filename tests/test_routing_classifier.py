"""The difficulty classifier on the labelled set it ships with."""

from __future__ import annotations

import numpy as np
import pytest

from redline.routing.classifier import (
    TIERS,
    Classifier,
    cross_validate,
    fit_temperature,
    load_examples,
    out_of_fold_logits,
    rule_tier,
    text_features,
    tuning_examples,
)


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


def test_below_the_set_confidence_the_rules_and_the_default_decide() -> None:
    never_sure = Classifier(min_confidence=1.01, default_tier="A")
    batch, writing, plain = never_sure.classify_many([
        "tag each of the 400 photos with a colour",
        "write a thank-you note to my neighbour",
        "what's the tallest tree in the world",
    ])
    assert {d.source for d in (batch, writing, plain)} == {"rules"}
    assert (batch.tier, writing.tier, plain.tier) == ("B", "A", "A")  # the last: the default
    assert rule_tier("what's the tallest tree in the world") == "S"
    assert rule_tier("write a comprehensive report on rail freight") == "B"
    sure = Classifier(min_confidence=0.0)
    assert sure.classify("what's the tallest tree in the world").source == "model"


def test_confidence_is_calibrated_out_of_fold() -> None:
    # on examples each judged by a model trained without them, the mean confidence is
    # close to the accuracy (uncalibrated, the softmax is overconfident here)
    ex = tuning_examples()
    x = text_features([e.text for e in ex])
    labels = [e.tier for e in ex]
    logits = out_of_fold_logits(x, labels, seed=3)
    y = np.array([TIERS.index(t) for t in labels])
    t = fit_temperature(x, labels)
    for temp, tolerance in ((t, 0.05),):
        p = np.exp(logits / temp - (logits / temp).max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        gap = abs(float(p.max(axis=1).mean()) - float((p.argmax(axis=1) == y).mean()))
        assert gap < tolerance, (temp, gap)


def test_the_router_passes_its_configured_fallback() -> None:
    from redline.config import RoutingConfig
    from redline.routing.router import _build_classifier

    cfg = RoutingConfig(classifier_min_confidence=0.6, classifier_default_tier="A")
    c = _build_classifier("features", 1, cfg)
    assert (c.min_confidence, c.default_tier) == (0.6, "A")
