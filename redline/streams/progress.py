"""The progress bar and countdown of one stream:

    {"tokens": n, "expected_tokens": m, "eta_ms": t}

`expected_tokens` comes from the history (see history.py) and is revised as tokens
arrive; `eta_ms` is the tokens still expected times the live time per token (an
EWMA of the gaps between tokens, seeded with the model's recent rate).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from redline.streams.history import Prediction

RATE_ALPHA = 0.1  # EWMA weight of the newest per-token gap (~20 tokens of memory)


class Progress:
    def __init__(self, prediction: Prediction,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.prediction = prediction
        self.clock = clock
        self.tokens = 0
        self.expected = prediction.expected
        self.tpot_s = prediction.tpot_s
        self._last_at: float | None = None
        self.finished = False

    def advance(self, tokens: int) -> dict[str, int | None]:
        """`tokens` more output tokens came now; returns the snapshot to send."""
        now = self.clock()
        if tokens > 0:
            if self._last_at is not None:
                gap = (now - self._last_at) / tokens
                self.tpot_s = gap if self.tpot_s is None else self.tpot_s + RATE_ALPHA * (
                    gap - self.tpot_s)
            self._last_at = now
            self.tokens += tokens
            self.expected = self.prediction.revise(self.tokens)
        return self.snapshot()

    def finish(self) -> dict[str, int | None]:
        self.finished = True
        self.expected = self.tokens
        return self.snapshot()

    def snapshot(self) -> dict[str, int | None]:
        remaining = max(0, self.expected - self.tokens)
        eta: int | None = 0 if self.finished else None
        if not self.finished and self.tpot_s is not None:
            eta = round(remaining * self.tpot_s * 1000)
        return {"tokens": self.tokens, "expected_tokens": self.expected, "eta_ms": eta}
