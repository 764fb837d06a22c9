"""The statistics tell different distributions apart and do not split identical ones."""

from __future__ import annotations

import numpy as np

from redline.experiments import stats


def test_latency_test_separates_shifted_distributions() -> None:
    rng = np.random.default_rng(1)
    a = rng.lognormal(np.log(0.20), 0.3, 200)
    b = rng.lognormal(np.log(0.26), 0.3, 200)  # 30% slower
    r = stats.compare_latency(a, b)
    assert r["significant"] and r["p_value"] < 1e-6
    assert r["mean_diff"] > 0 and r["mean_diff_ci"][0] > 0
    assert r["prob_treatment_slower"] > 0.6 and r["median_ratio"] > 1.1


def test_latency_test_does_not_split_identical_distributions() -> None:
    # A/A: the false-positive rate is about alpha, not more
    rng = np.random.default_rng(2)
    hits = 0
    for _ in range(200):
        a, b = rng.lognormal(-1.5, 0.4, 100), rng.lognormal(-1.5, 0.4, 100)
        hits += stats.compare_latency(a, b, alpha=0.05)["significant"]
    assert hits <= 20  # expected 10 of 200


def test_rates() -> None:
    r = stats.compare_rates(95, 100, 70, 100)
    assert r["test"] == "two-proportion-z" and r["significant"] and r["diff"] < 0
    same = stats.compare_rates(90, 100, 91, 100)
    assert not same["significant"]
    small = stats.compare_rates(0, 10, 5, 10)
    assert small["test"] == "fisher-exact"
    assert stats.compare_rates(0, 0, 1, 1)["p_value"] is None
    lo, hi = stats.wilson(5, 10)
    assert lo is not None and hi is not None and lo < 0.5 < hi


def test_describe_and_empty() -> None:
    d = stats.describe([0.1, 0.2, 0.3])
    assert d["n"] == 3 and abs(d["mean"] - 0.2) < 1e-9 and d["ci"][0] < 0.2 < d["ci"][1]
    assert stats.describe([])["mean"] is None
    assert not stats.compare_latency([0.1], [0.2])["significant"]
