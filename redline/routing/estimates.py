"""Live estimates per backend replica, learned from what it does (llm-d routes on
predicted TTFT the same way):

    TTFT ≈ slowdown · (base + queue_per_req · outstanding + prompt_tokens / prefill_rate)
    total ≈ TTFT + slowdown · (output_tokens − 1) · tpot

`slowdown` is what sharing the cores costs a local model now (its engine takes turns
with the process's other local engines, see engine/arbiter.py: with k others holding
work it is about k + 1); 1 for a remote engine. Times are learnt divided by the slowdown
seen when they were measured, so the fit describes the engine alone and the prediction
puts today's sharing back in.

The TTFT coefficients come from an exponentially-forgetting least-squares fit over
(outstanding at start, prompt tokens) → observed TTFT, so the queue term grows when the
engine saturates and shrinks when it drains. TPOT is an EWMA. The p90 of recent TTFTs
is the hedging trigger.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol, cast, runtime_checkable

import numpy as np

from redline.types import GenerationRequest


@dataclass(frozen=True)
class Prediction:
    ttft_s: float
    total_s: float  # for the answer length expected (learnt)
    queue_s: float
    tpot_s: float = 0.0  # a token's time, sharing included

    def longest_s(self, max_tokens: int) -> float:
        """The total for an answer as long as the client allows."""
        return self.ttft_s + max(0, max_tokens - 1) * self.tpot_s


@runtime_checkable
class SharesCores(Protocol):
    """A backend that shares this machine's cores with others (the local engines)."""

    def slowdown(self) -> float: ...


_IMPLEMENTS: dict[tuple[type, type], bool] = {}


def _implements(replica: object, protocol: type) -> bool:
    """`isinstance` against a runtime-checkable protocol, remembered per class: the
    protocol's own check walks its members on every call, and the planner asks it for
    each replica on every request. Backends define these methods on their class."""
    key = (type(replica), protocol)
    found = _IMPLEMENTS.get(key)
    if found is None:
        found = _IMPLEMENTS[key] = isinstance(replica, protocol)
    return found


def slowdown_of(replica: object) -> float:
    if _implements(replica, SharesCores):
        return cast(SharesCores, replica).slowdown()
    return 1.0


@runtime_checkable
class UsesSharedCores(Protocol):
    """A backend on this machine's cores that knows how busy they were lately."""

    def cores_busy(self) -> float: ...


def cores_busy(replica: object) -> float | None:
    """The recent share of the shared cores in use; None for a backend elsewhere."""
    if _implements(replica, UsesSharedCores):
        return cast(UsesSharedCores, replica).cores_busy()
    return None


@runtime_checkable
class ForecastsTTFT(Protocol):
    """A backend that knows its own admitted work (the embedded engine, engine/forecast.py):
    its forecast of a new request's TTFT replaces the learnt queue term. Given the request,
    it may read the prompt itself (what of it the engine holds cached)."""

    def predict_ttft_s(self, prompt_tokens: int, tier: str | None,
                       request: GenerationRequest | None = None) -> float | None: ...

    def predict_tpot_s(self) -> float | None: ...


def own_forecast(replica: object, prompt_tokens: int, tier: str | None,
                 request: GenerationRequest | None = None) -> tuple[float | None, float | None]:
    """The engine's own (TTFT, TPOT) forecast, alone on the cores; (None, None) for a
    backend that has none."""
    if _implements(replica, ForecastsTTFT):
        ttft = cast(ForecastsTTFT, replica).predict_ttft_s(prompt_tokens, tier, request)
        return ttft, own_forecast_tpot(replica)
    return None, None


def own_forecast_tpot(replica: object) -> float | None:
    """The engine's own TPOT forecast for a newcomer (None for a backend without one)."""
    if _implements(replica, ForecastsTTFT):
        return cast(ForecastsTTFT, replica).predict_tpot_s()
    return None


BIAS_MIN, BIAS_MAX = 0.5, 4.0  # one stream's observed/forecast TPOT, clamped


class ReplicaStats:
    def __init__(self, prior_ttft_s: float = 0.2, prior_tpot_s: float = 0.02,
                 forget: float = 0.98, window: int = 200) -> None:
        self.prior_ttft_s, self.tpot_s = prior_ttft_s, prior_tpot_s
        self.forget = forget
        # normal equations of the forgetting least squares, features [1, load, prompt/1000];
        # 3×3 in plain Python: numpy's per-call cost is more than the arithmetic here, and
        # this runs on every request
        self._a = [[1e-3 if i == j else 0.0 for j in range(3)] for i in range(3)]
        self._b = [0.0, 0.0, 0.0]
        self._coef: tuple[float, float, float] | None = None
        self._ttfts: deque[float] = deque(maxlen=window)
        # observed TPOT over the engine's own forecast of it (its step fit knows the batch
        # a newcomer joins; streams also ride steps with prompt chunks, and the relay)
        self.tpot_bias = 1.0
        self.out_tokens = 64.0  # EWMA of answer length, for the expected total time
        self.samples = 0
        self.errors = 0
        self.last_seen = 0.0

    def observe_ttft(self, ttft_s: float, load_at_start: int, prompt_tokens: int,
                     slowdown: float = 1.0) -> None:
        ttft_s /= max(slowdown, 1.0)
        x = (1.0, float(load_at_start), prompt_tokens / 1000.0)
        f = self.forget
        for i in range(3):
            row = self._a[i]
            for j in range(3):
                row[j] = f * row[j] + x[i] * x[j]
            self._b[i] = f * self._b[i] + x[i] * ttft_s
        self._coef = None
        self._ttfts.append(ttft_s)
        self.samples += 1
        self.last_seen = time.monotonic()
        self.coef()  # solved here, off the next request's path (the router calls this late)

    def observe_tpot(self, tpot_s: float, alpha: float = 0.1, slowdown: float = 1.0,
                     own_s: float | None = None) -> None:
        """A stream's TPOT; `own_s`: what the engine forecast it to be at its start."""
        tpot_s /= max(slowdown, 1.0)
        self.tpot_s += alpha * (tpot_s - self.tpot_s)
        if own_s is not None and own_s > 0:
            ratio = min(BIAS_MAX, max(BIAS_MIN, tpot_s / own_s))
            self.tpot_bias += alpha * (ratio - self.tpot_bias)

    def observe_output(self, tokens: int, alpha: float = 0.1) -> None:
        self.out_tokens += alpha * (tokens - self.out_tokens)

    def expected_tokens(self, max_tokens: int) -> int:
        return max(1, min(max_tokens, round(self.out_tokens)))

    def coef(self) -> tuple[float, float, float]:
        if self._coef is None:
            ridge = (1e-6, 1e-2, 1e-2)  # keeps the slopes sane on few samples
            m = [[self._a[i][j] + (ridge[i] if i == j else 0.0) for j in range(3)]
                 for i in range(3)]
            c = _solve3(m, list(self._b))
            self._coef = (max(c[0], 0.0), max(c[1], 0.0), max(c[2], 0.0))
        return self._coef

    def p90_ttft(self) -> float | None:
        if len(self._ttfts) < 10:
            return None
        return float(np.quantile(np.fromiter(self._ttfts, float), 0.9))

    def predict(self, load: int, prompt_tokens: int, output_tokens: int,
                slowdown: float = 1.0, own_ttft_s: float | None = None,
                own_tpot_s: float | None = None) -> Prediction:
        """`own_ttft_s`, `own_tpot_s`: the engine's own forecast from its admitted work and
        its decode step now (alone on the cores), used instead of the learnt fit when there
        is one; its TPOT scaled by how far observed streams were from it (`tpot_bias`)."""
        if own_ttft_s is not None:
            ttft = own_ttft_s
            queue = max(0.0, own_ttft_s - self.coef()[0]) if self.samples >= 3 else 0.0
        elif self.samples < 3:
            queue = 0.0
            ttft = self.prior_ttft_s
        else:
            base, per_req, per_ktok = self.coef()
            queue = per_req * load
            ttft = base + queue + per_ktok * prompt_tokens / 1000.0
        k = max(slowdown, 1.0)
        tpot = self.tpot_s
        if own_tpot_s is not None:
            # the engine's forecast for the batch it would join, as far off as it has been:
            # a plain average of past streams lags when the load changes (eight streams'
            # TPOT forecast for one, and tier-S answers shortened for minutes)
            tpot = own_tpot_s * self.tpot_bias
        total = k * (ttft + max(0, output_tokens - 1) * tpot)
        return Prediction(k * ttft, total, k * queue, k * tpot)


def _solve3(m: list[list[float]], b: list[float]) -> list[float]:
    """m x = b for a 3×3 symmetric positive definite m (Gaussian elimination with
    partial pivoting)."""
    for col in range(3):
        piv = max(range(col, 3), key=lambda r: abs(m[r][col]))
        if piv != col:
            m[col], m[piv] = m[piv], m[col]
            b[col], b[piv] = b[piv], b[col]
        for r in range(col + 1, 3):
            k = m[r][col] / m[col][col]
            for j in range(col, 3):
                m[r][j] -= k * m[col][j]
            b[r] -= k * b[col]
    x = [0.0, 0.0, 0.0]
    for r in (2, 1, 0):
        x[r] = (b[r] - sum(m[r][j] * x[j] for j in range(r + 1, 3))) / m[r][r]
    return x


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
