"""bench/scenario.py's schedule: seeded, the same for every target, and with `--pool-pairs`
the popular questions come in both wordings of a labelled pair (semantic repeats)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import scenario  # noqa: E402

from redline.cache.evaluate import load_pairs  # noqa: E402


def frequent(items: list[scenario.Item]) -> list[str]:
    return [i.body["messages"][0]["content"] for i in items if i.kind == "frequent"]


def test_the_schedule_is_seeded_and_the_mix_holds() -> None:
    a, b = scenario.schedule(300, 2.0, 0, 20), scenario.schedule(300, 2.0, 0, 20)
    assert [(i.at, i.body) for i in a] == [(i.at, i.body) for i in b]
    assert [(i.at, i.body) for i in a] != [(i.at, i.body) for i in scenario.schedule(300, 2.0, 1, 20)]
    share = len(frequent(a)) / len(a)
    assert 0.5 < share < 0.7 and len(set(frequent(a))) <= 20


def test_pool_pairs_asks_both_wordings_of_same_pairs() -> None:
    path = BENCH / "data" / "cache_pairs_tune.tsv"
    same = [(p.a, p.b) for p in load_pairs(path) if p.same][:10]
    asked = frequent(scenario.schedule(400, 2.0, 0, 10, str(path)))
    wordings = {w for pair in same for w in pair}
    assert set(asked) <= wordings
    both = [pair for pair in same if pair[0] in asked and pair[1] in asked]
    assert len(both) >= 3  # the popular ones come in either wording
