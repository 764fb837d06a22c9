"""Split hand-written labelled data once, seeded, into a tuning part and a test part.

Run once (issue 22) on the pools written for it; the outputs are committed and the test
parts' sha256 are in README.md and checked by tests/test_eval_split.py. Never run again
on the same data to "get a better split": that would be tuning on the test part.

    python bench/split_data.py pairs POOL.txt    # lines `kind || question_a || question_b`
    python bench/split_data.py prompts POOL.txt  # lines `TIER difficulty || text`

Each kind (pairs) or tier+difficulty (prompts) is shuffled with seed 22 and cut in half,
so both parts hold every kind in the same proportion.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

SEED = 22
ROOT = Path(__file__).resolve().parent.parent
PAIRS_TUNE = ROOT / "bench" / "data" / "cache_pairs_tune.tsv"
PAIRS_TEST = ROOT / "bench" / "data" / "cache_pairs_test.tsv"
PROMPTS_TUNE = ROOT / "redline" / "routing" / "data" / "tune.jsonl"
PROMPTS_TEST = ROOT / "bench" / "data" / "router_test.jsonl"


def halves(rows: list[tuple[str, ...]], stratum: int) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    by: dict[str, list[tuple[str, ...]]] = defaultdict(list)
    for r in rows:
        by[r[stratum]].append(r)
    rng = np.random.default_rng(SEED)
    tune, test = [], []
    for key in sorted(by):
        group = by[key]
        order = rng.permutation(len(group))
        cut = len(group) // 2
        tune += [group[i] for i in order[:cut]]
        test += [group[i] for i in order[cut:]]
    return tune, test


def read_pool(path: str, fields: int) -> list[tuple[str, ...]]:
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            parts = tuple(p.strip() for p in line.split(" || "))
            if len(parts) != fields or any("\t" in p for p in parts):
                raise ValueError(f"bad line: {line!r}")
            rows.append(parts)
    return rows


def main(kind: str, pool: str) -> None:
    if kind == "pairs":
        rows = read_pool(pool, 3)
        for out, part in zip((PAIRS_TUNE, PAIRS_TEST), halves(rows, 0), strict=True):
            lines = ["label\tkind\tquestion_a\tquestion_b"]
            lines += ["\t".join(("same" if k == "paraphrase" else "diff", k, a, b)) for k, a, b in part]
            out.write_text("\n".join(lines) + "\n")
            print(out, len(part))
    else:
        rows = [(*label.split(), text) for label, text in read_pool(pool, 2)]
        keyed: list[tuple[str, ...]] = [(f"{t} {d}", t, d, x) for t, d, x in rows]
        for out, part in zip((PROMPTS_TUNE, PROMPTS_TEST), halves(keyed, 0), strict=True):
            out.write_text("".join(json.dumps({"text": x, "tier": t, "difficulty": d}) + "\n"
                                   for _, t, d, x in part))
            print(out, len(part))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
