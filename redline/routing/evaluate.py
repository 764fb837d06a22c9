"""`redline eval-router`: the tier classifier on the tuning part (5-fold out-of-fold, each
fold trained and calibrated without the examples it judges) next to the test part
(`bench/data/router_test.jsonl`, which no training or calibration reads), with per-class
precision and recall and how often the rules decided instead of the model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from redline.routing.classifier import (
    TIERS,
    Classifier,
    Decision,
    Example,
    load_examples,
    tuning_examples,
)

ROOT = Path(__file__).resolve().parent.parent.parent
TEST = ROOT / "bench" / "data" / "router_test.jsonl"
Featurize = Callable[[Sequence[str]], np.ndarray]


@dataclass(frozen=True)
class RouterScores:
    n: int
    tier_accuracy: float
    difficulty_accuracy: float
    per_tier: dict[str, tuple[float, float, int]]  # tier -> (precision, recall, support)
    by_rules: int  # decisions the rules made (the model was below min_confidence)


def scores(examples: Sequence[Example], decisions: Sequence[Decision]) -> RouterScores:
    per: dict[str, tuple[float, float, int]] = {}
    for c in TIERS:
        predicted = [e for e, d in zip(examples, decisions, strict=True) if d.tier == c]
        actual = [d for e, d in zip(examples, decisions, strict=True) if e.tier == c]
        right = sum(e.tier == c for e in predicted)
        per[c] = (right / len(predicted) if predicted else 0.0,
                  sum(d.tier == c for d in actual) / len(actual) if actual else 0.0, len(actual))
    n = len(examples)
    pairs = list(zip(examples, decisions, strict=True))
    return RouterScores(n, sum(e.tier == d.tier for e, d in pairs) / n,
                        sum(e.difficulty == d.difficulty for e, d in pairs) / n,
                        per, sum(d.source == "rules" for d in decisions))


def _cached(featurize: Featurize, texts: Sequence[str]) -> Featurize:
    table = dict(zip(texts, featurize(list(texts)), strict=True))
    return lambda ts: np.stack([table[t] if t in table else featurize([t])[0] for t in ts])


def out_of_fold(examples: Sequence[Example], featurize: Featurize, min_confidence: float,
                default_tier: str = "S", folds: int = 5, seed: int = 0) -> list[Decision]:
    order = np.random.default_rng(seed).permutation(len(examples))
    out: list[Decision | None] = [None] * len(examples)
    for k in range(folds):
        held = set(order[k::folds].tolist())
        model = Classifier(featurize, [e for i, e in enumerate(examples) if i not in held],
                           min_confidence=min_confidence, default_tier=default_tier)
        idx = sorted(held)
        for i, d in zip(idx, model.classify_many([examples[i].text for i in idx]), strict=True):
            out[i] = d
    return [d for d in out if d is not None]


def report(featurize: Featurize, min_confidence: float, default_tier: str = "S",
           test_path: Path = TEST) -> tuple[RouterScores, RouterScores, str]:
    tune = tuning_examples()
    test = load_examples(test_path)
    featurize = _cached(featurize, [e.text for e in tune + test])
    a = scores(tune, out_of_fold(tune, featurize, min_confidence, default_tier))
    model = Classifier(featurize, tune, min_confidence=min_confidence, default_tier=default_tier)
    b = scores(test, model.classify_many([e.text for e in test]))
    lines = [f"min_confidence {min_confidence:.2f} (below it: the rules, then tier {default_tier}); "
             f"temperature {model.temperature:.2f}",
             f"{'':>22} | {'tuning part (5-fold)':>22} | {'TEST part':>22}",
             f"{'examples':>22} | {a.n:>22} | {b.n:>22}",
             f"{'tier accuracy':>22} | {a.tier_accuracy:>22.3f} | {b.tier_accuracy:>22.3f}",
             f"{'difficulty accuracy':>22} | {a.difficulty_accuracy:>22.3f} | {b.difficulty_accuracy:>22.3f}",
             f"{'decided by the rules':>22} | {a.by_rules:>22} | {b.by_rules:>22}"]
    for c in TIERS:
        pa, ra, na = a.per_tier[c]
        pb, rb, nb = b.per_tier[c]
        lines.append(f"{'tier ' + c + ' precision/recall':>22} | {f'{pa:.3f} / {ra:.3f} (n={na})':>22} | "
                     f"{f'{pb:.3f} / {rb:.3f} (n={nb})':>22}")
    return a, b, "\n".join(lines)
