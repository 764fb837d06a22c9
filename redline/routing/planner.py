"""The SLO-aware planner: predict TTFT and total time of this request on each candidate
model (at its best replica, from live estimates) and take the first, in preference order,
whose prediction meets the tier's budget. When none does it degrades instead of missing
silently: the fastest predicted model goes first, and for tier S the answer is shortened
to fit the total budget."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from redline.config import TierBudget
from redline.routing.estimates import Prediction

log = logging.getLogger(__name__)

MIN_SHORT_TOKENS = 16


@dataclass(frozen=True)
class Plan:
    order: tuple[str, ...]  # models to try, best first; later ones are the fallbacks
    max_tokens: int | None  # a cap when the answer is shortened to meet the budget
    predicted: Prediction | None
    degraded: bool


def meets(p: Prediction, budget: TierBudget) -> bool:
    return ((budget.ttft_s is None or p.ttft_s <= budget.ttft_s)
            and (budget.total_s is None or p.total_s <= budget.total_s))


def plan(tier: str, budget: TierBudget, candidates: Sequence[str],
         predict: Callable[[str], Prediction | None], max_tokens: int,
         tpot_of: Callable[[str], float], shorten: bool,
         within_s: float | None = None, crowded: frozenset[str] = frozenset()) -> Plan:
    """`predict(model)` is None when no replica of the model can take traffic now.
    `within_s`: only the models predicted to finish even an answer of `max_tokens` within
    this many seconds are considered (the others stay as fallbacks after them); when none
    does, the soonest to finish goes first. It is how `auto` stops paying for a larger
    model when the machine has no room for it: a report that runs to its cap on a model
    3.5x slower a token holds the shared cores, and slows everyone else, that long.
    `crowded`: models that share cores with no room for a dearer model now; with
    `within_s`, of those only the cheapest a token is considered (moving work onto a
    dearer model on the same cores adds no capacity, it only takes more of it)."""
    preds = {m: pred for m in candidates if (pred := predict(m)) is not None}
    alive = [m for m in candidates if m in preds]
    if not alive:  # every breaker open: try in order anyway, half-open may let one through
        return Plan(tuple(candidates), None, None, degraded=True)
    later: list[str] = []
    if within_s is not None:
        shared = [m for m in alive if m in crowded]
        cheapest = min(shared, key=lambda m: preds[m].tpot_s) if shared else None
        later = [m for m in alive if m in crowded and m != cheapest]  # fallbacks only
        alive = [m for m in alive if m not in later]
        fits = [m for m in alive
                if preds[m].longest_s(max_tokens) <= within_s]
        if fits:
            later = [m for m in alive if m not in fits] + later
            alive = fits
        else:
            alive = sorted(alive, key=lambda m: preds[m].longest_s(max_tokens))
    p = _plan(tier, budget, alive, preds, max_tokens, tpot_of, shorten)
    return dataclasses.replace(p, order=p.order + tuple(later)) if later else p


def _plan(tier: str, budget: TierBudget, alive: list[str], preds: dict[str, Prediction],
          max_tokens: int, tpot_of: Callable[[str], float], shorten: bool) -> Plan:
    if budget.ttft_s is None and budget.total_s is None:
        return Plan(tuple(alive), None, preds[alive[0]], degraded=False)
    good = [m for m in alive if meets(preds[m], budget)]
    if good:
        rest = [m for m in alive if m not in good]
        return Plan(tuple(good + rest), None, preds[good[0]], degraded=False)
    # the least late first, by the budget's own measures: the soonest first token alone
    # would move a tier-S answer onto a slow model that then misses its total by far
    by_ttft = sorted(alive, key=lambda m: _lateness(preds[m], budget))
    best = by_ttft[0]
    p = preds[best]
    cap = None
    if shorten and tier == "S" and budget.total_s is not None and p.total_s > budget.total_s:
        room = budget.total_s - p.ttft_s
        cap = max(MIN_SHORT_TOKENS, min(max_tokens, int(room / max(tpot_of(best), 1e-4)) + 1))
        if cap >= max_tokens:
            cap = None
    log.debug("tier %s: no model meets the budget; degrading to %s (predicted TTFT %.2fs, "
             "total %.2fs, max_tokens %s)", tier, best, p.ttft_s, p.total_s, cap or max_tokens)
    return Plan(tuple(by_ttft), cap, p, degraded=True)


def _lateness(p: Prediction, budget: TierBudget) -> float:
    """How far past its budget a prediction is, as a multiple of the budget (the worse
    of TTFT and total)."""
    late = 0.0
    if budget.ttft_s is not None:
        late = p.ttft_s / budget.ttft_s
    if budget.total_s is not None:
        late = max(late, p.total_s / budget.total_s)
    return late
