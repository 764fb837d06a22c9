"""A ratio budget (Finagle's retry budget): every request deposits `ratio` tokens, each
retry or hedge spends one, so extra upstream calls stay under `ratio` of the traffic
plus a small burst allowance."""

from __future__ import annotations


class RatioBudget:
    def __init__(self, ratio: float, burst: float = 5.0, initial: float = 1.0) -> None:
        self.ratio, self.burst = ratio, burst
        self.tokens = min(initial, burst)
        self.requests = 0
        self.spent = 0

    def deposit(self) -> None:
        self.requests += 1
        self.tokens = min(self.burst, self.tokens + self.ratio)

    def take(self) -> bool:
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        self.spent += 1
        return True
