"""Shared token prefixes (prefix reuse in the KV buffer and in the host cache)."""

from __future__ import annotations


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share (slices compare in C: a bisection)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 8:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    while a[lo] == b[lo]:
        lo += 1
    return lo
