"""What a request names, checked in one place: its model (`auto`, the virtual model the
router chooses for, or one the server serves) and its tier (S, A, B, or `auto`: the
router decides)."""

from __future__ import annotations

from collections.abc import Collection

from redline.errors import InvalidRequest, ModelNotFound
from redline.types import Tier

AUTO = "auto"
TIERS: tuple[Tier, ...] = ("S", "A", "B")


def check_model(name: str, served: Collection[str]) -> None:
    """404 (ModelNotFound, param "model") for a model that is neither served nor `auto`."""
    if name != AUTO and name not in served:
        raise ModelNotFound(f"The model `{name}` does not exist.", param="model")


def resolve_model(name: str, served: Collection[str], default: str) -> str:
    """The served model `name` stands for: `auto` is `default` (before any routing)."""
    check_model(name, served)
    return default if name == AUTO else name


def parse_tier(value: str | None) -> Tier | None:
    """A tier as a client writes it (the X-Redline-Tier header or the body's `tier`):
    None for none or `auto` (the router decides), else S, A or B; anything else is a 400."""
    if value is None or value == AUTO:
        return None
    if value not in TIERS:
        raise InvalidRequest("X-Redline-Tier must be one of S, A, B, auto", param="tier")
    return value


__all__ = ["AUTO", "TIERS", "check_model", "parse_tier", "resolve_model"]
