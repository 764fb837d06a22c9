"""Which replica of a pool should serve a request: a pure ranking of candidates, from
their loads and expected prefix hits, unit-tested with made-up numbers.

- `prefix` (default): the expected cost of a replica is the prompt blocks it must compute
  (those its prefix cache probably lacks) plus `load_cost_blocks` per request in flight; the
  cheapest wins. Bounded load (consistent hashing with bounded loads, Mirrokni et al.; what
  SGLang's cache-aware router does with its balance thresholds): a replica that would go above
  `load_bound` times the mean load with this request is not chosen while another is under
  it, so a popular prefix cannot pile every request onto one replica. A prefix seen nowhere
  goes to its home replica, the first by rendezvous hashing of the prompt's anchor block
  (`affinity`), within the bound: homes spread prefixes evenly, and gateway replicas that
  keep separate indexes place a new prefix on the same replica without talking to each
  other (their indexes converge; measured in docs/BENCHMARKS.md). Without an anchor (a
  prompt shorter than a block), ties go to the least loaded, then in turn.
- `least_loaded`: fewest requests in flight, ties in turn (redline's choice before).
- `round_robin`: in turn, whatever the loads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Policy = Literal["prefix", "least_loaded", "round_robin"]


@dataclass(frozen=True)
class Weights:
    load_bound: float = 1.25  # >= 1: a multiple of the mean load, this request included
    load_cost_blocks: float = 16.0  # one request in flight weighs this many uncached blocks
    load_floor: int = 2  # a replica may always reach this many in flight (see load_cap)


def load_cap(loads: Sequence[int], bound: float, floor: int = 1) -> int:
    """The most requests in flight a replica may reach by taking one more: `bound` times
    the mean after this request, rounded up, and never below `floor` (at low load a
    multiple of the mean is below 2, and would send every second request of a prefix
    elsewhere; SGLang's router has an absolute threshold for the same reason). The least
    loaded replica is always under it."""
    return max(1, floor, math.ceil(bound * (sum(loads) + 1) / len(loads)))


def affinity(anchor: bytes, replica: int) -> int:
    """Rendezvous (highest random weight) score of `replica` for a prefix whose anchor
    block hashes to `anchor`: splitmix64 of the pair, cheap and well mixed."""
    z = (int.from_bytes(anchor[:8], "little") ^ (replica + 1) * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


def rank(policy: Policy, loads: Sequence[int], hits: Sequence[int], turn: int,
         weights: Weights, homes: Sequence[int] | None = None) -> list[int]:
    """Positions of the candidates, best first (the rest are the retry order).

    `loads[i]`: requests in flight on candidate i; `hits[i]`: prompt blocks its cache
    probably holds (ignored unless `policy` is prefix); `turn`: a counter that rotates ties;
    `homes[i]`: its `affinity` for this prompt (a prefix seen nowhere goes to the highest).

    >>> rank("prefix", loads=[3, 0, 1], hits=[0, 0, 40], turn=0, weights=Weights())
    [2, 1, 0]
    """
    n = len(loads)
    if n == 0:
        return []

    def rotation(i: int) -> int:
        return (i - turn) % n

    if policy == "round_robin":
        return sorted(range(n), key=rotation)
    if policy == "least_loaded":
        return sorted(range(n), key=lambda i: (loads[i], rotation(i)))
    cap = load_cap(loads, weights.load_bound, weights.load_floor)
    # a prefix seen nowhere: rank by home (rendezvous affinity)
    new_homes = homes if homes is not None and not any(hits) else None

    def key(i: int) -> tuple[bool, float, int, int]:
        over = loads[i] + 1 > cap
        if over:  # only as a last resort, least loaded first
            return (True, float(loads[i]), 0, rotation(i))
        if new_homes is not None:
            return (False, 0.0, -new_homes[i], rotation(i))
        return (False, weights.load_cost_blocks * loads[i] - hits[i], loads[i], rotation(i))

    return sorted(range(n), key=key)
