"""Live estimates per backend replica, learned from what it does (llm-d routes on
predicted TTFT the same way):

    TTFT ≈ base + queue_per_req · outstanding + prompt_tokens / prefill_rate
    total ≈ TTFT + (output_tokens − 1) · tpot

The TTFT coefficients come from an exponentially-forgetting least-squares fit over
(outstanding at start, prompt tokens) → observed TTFT, so the queue term grows when the
engine saturates and shrinks when it drains. TPOT is an EWMA. The p90 of recent TTFTs
is the hedging trigger.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Prediction:
    ttft_s: float
    total_s: float
    queue_s: float


class ReplicaStats:
    def __init__(self, prior_ttft_s: float = 0.2, prior_tpot_s: float = 0.02,
                 forget: float = 0.98, window: int = 200) -> None:
        self.prior_ttft_s, self.tpot_s = prior_ttft_s, prior_tpot_s
        self.forget = forget
        # normal equations of the forgetting least squares, features [1, load, prompt/1000]
        self._a = np.eye(3) * 1e-3
        self._b = np.zeros(3)
        self._coef: np.ndarray | None = None
        self._ttfts: deque[float] = deque(maxlen=window)
        self.out_tokens = 64.0  # EWMA of answer length, for the expected total time
        self.samples = 0
        self.errors = 0
        self.last_seen = 0.0

    def observe_ttft(self, ttft_s: float, load_at_start: int, prompt_tokens: int) -> None:
        x = np.array([1.0, float(load_at_start), prompt_tokens / 1000.0])
        self._a = self.forget * self._a + np.outer(x, x)
        self._b = self.forget * self._b + x * ttft_s
        self._coef = None
        self._ttfts.append(ttft_s)
        self.samples += 1
        self.last_seen = time.monotonic()

    def observe_tpot(self, tpot_s: float, alpha: float = 0.1) -> None:
        self.tpot_s += alpha * (tpot_s - self.tpot_s)

    def observe_output(self, tokens: int, alpha: float = 0.1) -> None:
        self.out_tokens += alpha * (tokens - self.out_tokens)

    def expected_tokens(self, max_tokens: int) -> int:
        return max(1, min(max_tokens, round(self.out_tokens)))

    def coef(self) -> np.ndarray:
        if self._coef is None:
            ridge = np.diag([1e-6, 1e-2, 1e-2])  # keeps the slopes sane on few samples
            c = np.linalg.solve(self._a + ridge, self._b)
            self._coef = np.maximum(c, 0.0)
        return self._coef

    def p90_ttft(self) -> float | None:
        if len(self._ttfts) < 10:
            return None
        return float(np.quantile(np.fromiter(self._ttfts, float), 0.9))

    def predict(self, load: int, prompt_tokens: int, output_tokens: int) -> Prediction:
        if self.samples < 3:
            queue = 0.0
            ttft = self.prior_ttft_s
        else:
            base, per_req, per_ktok = self.coef()
            queue = per_req * load
            ttft = base + queue + per_ktok * prompt_tokens / 1000.0
        total = ttft + max(0, output_tokens - 1) * self.tpot_s
        return Prediction(ttft, total, queue)


class Estimates:
    """ReplicaStats for every replica, by identity (a replica's name may repeat in pools)."""

    def __init__(self, prior_ttft_s: float = 0.2, prior_tpot_s: float = 0.02) -> None:
        self._stats: dict[int, ReplicaStats] = {}
        self.prior_ttft_s, self.prior_tpot_s = prior_ttft_s, prior_tpot_s

    def of(self, replica: object) -> ReplicaStats:
        key = id(replica)
        stats = self._stats.get(key)
        if stats is None:
            stats = self._stats[key] = ReplicaStats(self.prior_ttft_s, self.prior_tpot_s)
        return stats
