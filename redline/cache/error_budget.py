"""The semantic cache's error budget: the share of semantic hits that serve the answer to a
different question (`cache.max_wrong_hit_rate`), estimated from shadow verifications and
kept by moving the similarity threshold.

    record(similarity, wrong) → tighten or loosen the threshold; the estimate and its bounds

Evidence: the last `window` verdicts (similarity of the hit, wrong or not). The live rate
is estimated over the verdicts at or above the current threshold (the hits it still
serves), with Wilson score bounds at 95 % one-sided (z = 1.645): exact enough at small
counts, never outside [0, 1], and it does not collapse to 0 after a run of right hits.

Hysteresis on the two bounds, so that little evidence moves nothing:
- tighten when the lower bound exceeds the budget (the data show the rate is over it):
  the threshold rises by `step`; past `ceiling` semantic hits are off (exact hits only);
- loosen when the upper bound over the band one `step` lower is under the budget (the
  data show it would stay under) and `loosen_after` verdicts have come since the last
  move: one `step` down, never below the configured threshold (the offline-tuned floor).
  The evidence below the current threshold comes from would-be hits that were not served
  (their request went to the model anyway, so its answer is the judge at no extra cost).
  Loosening is slow by design: at a 2 % budget the upper bound needs ~135 right
  verdicts in a row to fall under it.

The judge errs, and how much depends on the model whose answers it compares: a small
model answers two wordings of one question about as differently as two different
questions (SmolLM2-135M: the judge called 80 % of true paraphrases wrong on the tuning
part). Each verdict carries its judge's measured error rates (`JudgeErrors`: the share of
right hits it calls wrong, `false_wrong`, and of wrong hits it calls wrong, `true_wrong`;
`redline eval-judge` measures them on labelled pairs) and the rate is corrected for them
(Rogan-Gladen: true = (observed - false_wrong) / (true_wrong - false_wrong)), bounds too.
A judge that tells the two apart no better than `MIN_SEPARATION` moves nothing: its
bounds are [0, 1]. The default, an uncalibrated judge, is taken at its word (0 and 1).

Pure and synchronous; the cache owns one (per replica) and the metrics read it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

Z95 = 1.645  # one-sided 95 %
CEILING = 0.99  # above this a "semantic" hit is an exact one in all but spelling: turn off
MIN_SEPARATION = 0.2  # true_wrong - false_wrong below this: the verdicts say nothing


@dataclass(frozen=True)
class JudgeErrors:
    """How often the judge says "wrong": of right hits (`false_wrong`) and of wrong ones
    (`true_wrong`), as measured on labelled pairs with one model's answers."""

    false_wrong: float = 0.0
    true_wrong: float = 1.0

    @property
    def likelihood_ratio(self) -> float:
        """How much more likely a "wrong" verdict is on a wrong hit than on a right one."""
        return math.inf if self.false_wrong <= 0 else self.true_wrong / self.false_wrong


PERFECT = JudgeErrors()


def wilson(wrong: int, n: int, z: float = Z95) -> tuple[float, float]:
    """(lower, upper) bounds of a binomial rate from `wrong` of `n`; (0, 1) with no data."""
    if n == 0:
        return 0.0, 1.0
    p = wrong / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    scale = 1 + z * z / n
    return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)


@dataclass(frozen=True)
class Estimate:
    verified: int  # verdicts over the current threshold
    wrong: int  # of which the judge called wrong
    rate: float  # the wrong-hit rate, corrected for the judge's errors (0 with none)
    lower: float
    upper: float
    observed: float = 0.0  # wrong / verified, as the judge said
    informative: bool = True  # False: the judge cannot tell right hits from wrong ones


def _corrected(x: float, false_wrong: float, true_wrong: float) -> float:
    return min(1.0, max(0.0, (x - false_wrong) / (true_wrong - false_wrong)))


class ErrorBudget:
    def __init__(self, budget: float, floor: float, *, step: float = 0.02,
                 loosen_after: int = 50, window: int = 1000) -> None:
        self.budget, self.floor, self.step = budget, floor, step
        self.loosen_after = loosen_after
        self.threshold = floor
        self.semantic_on = True
        self._verdicts: deque[tuple[float, bool, JudgeErrors]] = deque(maxlen=window)
        self._since_move = 0

    def estimate(self, threshold: float | None = None) -> Estimate:
        t = self.threshold if threshold is None else threshold
        n = wrong = 0
        false_wrong = true_wrong = 0.0
        for similarity, was_wrong, judge in self._verdicts:
            if similarity >= t:
                n += 1
                wrong += was_wrong
                false_wrong += judge.false_wrong
                true_wrong += judge.true_wrong
        lower, upper = wilson(wrong, n)
        observed = wrong / n if n else 0.0
        if not n:
            return Estimate(0, 0, 0.0, lower, upper)
        false_wrong, true_wrong = false_wrong / n, true_wrong / n  # the band's judges, on average
        if true_wrong - false_wrong < MIN_SEPARATION:  # it cannot tell: no bound holds
            rate = _corrected(observed, false_wrong, true_wrong) if true_wrong > false_wrong \
                else observed
            return Estimate(n, wrong, rate, 0.0, 1.0, observed, informative=False)
        return Estimate(n, wrong, _corrected(observed, false_wrong, true_wrong),
                        _corrected(lower, false_wrong, true_wrong),
                        _corrected(upper, false_wrong, true_wrong), observed)

    def record(self, similarity: float, wrong: bool, judge: JudgeErrors = PERFECT) -> str:
        """One verdict (by a judge with these errors); returns what it did: "tightened",
        "off", "loosened", "on" or "held"."""
        self._verdicts.append((similarity, wrong, judge))
        self._since_move += 1
        served = self.threshold if self.semantic_on else CEILING
        if self.estimate(served).lower > self.budget:
            return self._tighten()
        if self._since_move < self.loosen_after:
            return "held"
        # the band a loosening would open is judged by the would-be hits there (verdicts on
        # candidates that were not served, the model's own answer the judge)
        if not self.semantic_on:
            return self._loosen() if self.estimate(CEILING).upper < self.budget else "held"
        target = max(self.floor, round(self.threshold - self.step, 4))
        if target < self.threshold and self.estimate(target).upper < self.budget:
            return self._loosen()
        return "held"

    def _tighten(self) -> str:
        self._since_move = 0
        if not self.semantic_on:
            return "held"
        if self.threshold + self.step > CEILING + 1e-9:
            self.semantic_on = False
            return "off"
        self.threshold = round(self.threshold + self.step, 4)
        return "tightened"

    def _loosen(self) -> str:
        self._since_move = 0
        if not self.semantic_on:
            self.semantic_on = True
            return "on"
        if self.threshold <= self.floor + 1e-9:
            return "held"
        self.threshold = max(self.floor, round(self.threshold - self.step, 4))
        return "loosened"
