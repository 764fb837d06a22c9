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


def test_answers_are_measured_by_length_and_a_shortened_one_is_counted(tmp_path: Path) -> None:
    """The scenario compares E2E times only as far as the answers are as long: it counts
    each answer's content deltas, and the answers redline's planner shortened (tier S
    under a total budget it cannot meet), which would otherwise look fast."""
    import asyncio

    from gateway_support import Live

    from redline.api.app import create_app
    from redline.backends.fake import FakeBackend
    from redline.config import RedlineConfig

    slow = FakeBackend("small", ttft_s=0.0, tpot_s=0.02)
    cfg = RedlineConfig(models=[{"name": "small", "bundled": "x"}], cache={"enabled": False},
                        routing={"tiers": {"S": {"total_s": 0.3}}, "classifier": "off"},
                        server={"data_dir": str(tmp_path)})
    items = [scenario.Item(0.05 * i, "one-off", {
        "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": 40,
        "temperature": 0, "stream": True}) for i in range(6)]
    with Live(create_app(cfg, backends={"small": slow})) as gw:
        target = scenario.Target("t", "small", gw.url)
        asyncio.run(scenario.run_target(target, items[:2], {}))  # what the planner learns from
        asyncio.run(scenario.run_target(target, items, {}))
    row = scenario.report(target)
    assert row["answered"] == 6 and row["shortened"] >= 4, row
    cut = [o for o in target.results if o.shortened]
    assert all(0 < o.pieces < 40 for o in cut), cut
    assert row["one-off_pieces_mean"] < 40
