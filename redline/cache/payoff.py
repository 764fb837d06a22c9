"""Whether the semantic lookup pays for itself on this server's recent traffic.

Every greedy miss pays for a semantic lookup before its prompt reaches a model: the
question is embedded (~7 ms of a core in BF16, 20-40 ms of wall time beside decoding
streams on 2 cores) and searched. On traffic that does not repeat itself (fresh questions,
code, documents) no lookup is ever served and every first token comes that much later; a
burst of fresh questions at an idle server had its first token 1.10-1.21x llama-server's
with the cache on and 0.90-0.95x with it off (docs/BENCHMARKS.md).

So the lookup is skipped while it would not pay: while the share of questions it would
serve (a one-sided 95 % upper bound over the last `window` questions) times what a served one saves
(a miss's whole answer time, a running average) is less than what a lookup costs (its
embedding's wall time, a running average). Nothing is lost meanwhile: a skipped question's
answer is still stored, and the embedding it needs for that (after the answer, off the
first token's path) is searched first, so every question, looked up or not, tells whether
it would have been served. The first paraphrase after a run of fresh questions misses;
the next ones are looked up again as soon as the bound pays. With none of the last 256
questions servable the bound is 1.0 %: lookups are skipped while an answer takes less than
~96 lookups' time (a short answer beside busy streams, not a long one); one would-be hit
among them moves that to ~58, two to ~43 (the bound is the error budget's, error_budget.py).
"""

from __future__ import annotations

from collections import deque

from redline.cache.error_budget import wilson

WINDOW = 256  # the recent questions the share is estimated on
MIN_SEEN = 32  # fewer than this: always look up
ALPHA = 0.1  # weight of the newest measurement in the running averages


def upper_bound(hits: int, n: int) -> float:
    """Wilson score upper bound (95 %) of a share seen as `hits` in `n`; 1 with no data."""
    return wilson(hits, n)[1]


class LookupPayoff:
    def __init__(self, window: int = WINDOW, min_seen: int = MIN_SEEN) -> None:
        self.outcomes: deque[bool] = deque(maxlen=window)  # True: it would have been served
        self.min_seen = min_seen
        self.cost_s: float | None = None  # a lookup's embedding, wall time
        self.saving_s: float | None = None  # a miss's answer, arrival to last token
        self.skipped = 0

    def record(self, served: bool) -> None:
        self.outcomes.append(served)

    def observe_cost(self, seconds: float) -> None:
        self.cost_s = _ewma(self.cost_s, seconds)

    def observe_answer(self, seconds: float) -> None:
        self.saving_s = _ewma(self.saving_s, seconds)

    def share_bound(self) -> float:
        return upper_bound(sum(self.outcomes), len(self.outcomes))

    def summary(self) -> dict[str, float | int | bool | None]:
        """What the dashboard shows (`/v1/admin/stats` `cache_lookup`)."""
        return {"looking_up": self.worth_it(), "seen": len(self.outcomes),
                "would_serve": sum(self.outcomes), "share_upper": round(self.share_bound(), 4),
                "lookup_ms": None if self.cost_s is None else round(self.cost_s * 1e3, 2),
                "answer_ms": None if self.saving_s is None else round(self.saving_s * 1e3, 1),
                "skipped": self.skipped}

    def worth_it(self) -> bool:
        """Whether the next question should be looked up."""
        if len(self.outcomes) < self.min_seen or self.cost_s is None or self.saving_s is None:
            return True
        return self.share_bound() * self.saving_s >= self.cost_s


def _ewma(old: float | None, new: float) -> float:
    return new if old is None else old + ALPHA * (new - old)
