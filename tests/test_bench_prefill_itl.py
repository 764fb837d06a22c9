"""bench/engine_prefill_itl.py's reading of the gaps: the streams' gaps split at the
prompt's arrival and first token, and the longest gaps grouped into the steps that made
them (one slow step is one gap in every stream)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import engine_prefill_itl as itl  # noqa: E402


def stamps(streams: int, steps: list[float], skew: float = 0.0002) -> list[list[float]]:
    """Each stream's token times: one per step, the streams a little apart within it."""
    return [[t + i * skew for t in steps] for i in range(streams)]


def test_the_longest_gaps_are_grouped_by_step() -> None:
    # steps every 20 ms, one of 50 ms ending at 1.09 and one of 45 ms ending at 1.635;
    # the prompt came at 1.0 and gave its first token at 2.0
    times = [0.90 + 0.02 * i for i in range(8)]  # ... 1.04
    times += [1.09]  # a 50 ms step
    times += [1.09 + 0.02 * i for i in range(1, 26)]  # ... 1.59
    times += [1.635]  # a 45 ms step
    times += [1.635 + 0.02 * i for i in range(1, 25)]  # ... 2.115
    got = itl.worst_steps(stamps(7, times), arrived=1.0, first=2.0, n=2)
    assert [round(g, 3) for g, _, _ in got] == [0.050, 0.045]
    assert [k for _, _, k in got] == [7, 7]  # one gap in each of the 7 streams
    assert abs(got[0][1] - 0.09) < 0.002 and abs(got[1][1] - 0.635) < 0.002


def test_gaps_outside_the_prefill_are_not_its_steps() -> None:
    times = [0.90, 0.95, 1.20, 1.22, 1.24, 2.5]  # 250 ms gap before, 1.26 s after
    before, during = itl.split_gaps(stamps(2, times), arrived=1.0, first=1.23)
    assert len(before) == 2 and all(g < 0.06 for g in before)
    got = itl.worst_steps(stamps(2, times), arrived=1.0, first=1.23, n=3)
    assert [round(g, 2) for g, _, _ in got] == [0.25, 0.02, 0.02]  # the gap that spans it
    assert got[0][2] == 2
    assert max(during) < 0.26


def test_a_step_counts_its_gaps_that_come_after_another_steps() -> None:
    """Sorted by length, one step's gaps may interleave with another's: each listed step
    still counts all of its streams' gaps."""
    a = [1.00, 1.02, 1.07, 1.09, 1.11, 1.16]  # 50 ms at 1.07, 50 ms at 1.16
    b = [1.00, 1.02, 1.069, 1.09, 1.11, 1.159]  # 49 ms at 1.069, 49 ms at 1.159
    got = itl.worst_steps([a, b], arrived=1.01, first=1.2, n=1)
    assert len(got) == 1 and got[0][2] == 2
