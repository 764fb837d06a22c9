"""Admission control: per-tier limits on requests in flight, and under overload shed
the background tier first, then generation, then interactive (B before A before S):
tier T is refused once requests in flight reach `shed_at[T] · max_inflight`.
A refusal is errors.Overloaded: 503 with Retry-After."""

from __future__ import annotations

from collections.abc import Mapping

from redline.errors import Overloaded


class Admission:
    def __init__(self, max_inflight: int, tier_limits: Mapping[str, int],
                 shed_at: Mapping[str, float]) -> None:
        self.max_inflight = max_inflight
        self.tier_limits = dict(tier_limits)
        self.shed_at = dict(shed_at)
        self.inflight: dict[str, int] = {t: 0 for t in tier_limits}
        self.shed: dict[str, int] = {t: 0 for t in tier_limits}

    @property
    def total(self) -> int:
        return sum(self.inflight.values())

    def admit(self, tier: str, retry_after_s: float = 1.0) -> None:
        """Count the request in, or raise Overloaded. Pair with `release(tier)`."""
        limit = self.tier_limits.get(tier)
        if limit is not None and self.inflight.get(tier, 0) >= limit:
            self.shed[tier] = self.shed.get(tier, 0) + 1
            raise Overloaded(f"Too many tier {tier} requests in flight ({limit}); retry shortly.",
                             retry_after=retry_after_s)
        if self.total >= self.shed_at.get(tier, 1.0) * self.max_inflight:
            self.shed[tier] = self.shed.get(tier, 0) + 1
            raise Overloaded(f"The server is overloaded; tier {tier} is shed first. Retry shortly.",
                             retry_after=retry_after_s)
        self.inflight[tier] = self.inflight.get(tier, 0) + 1

    def release(self, tier: str) -> None:
        self.inflight[tier] = max(0, self.inflight.get(tier, 0) - 1)
