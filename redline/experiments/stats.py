"""Confidence intervals and significance tests for comparing two arms.

Latency: Mann-Whitney U (no normality assumed: latencies are skewed) decides; the mean
difference with its Welch interval and the medians tell how big. Rates: Wilson
intervals; the two-proportion z test, or Fisher's exact test when a cell is small.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats as st


def _r(x: float, nd: int = 6) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


def describe(values: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """n, mean with its t interval, p50, p90 (seconds)."""
    a = np.asarray(values, dtype=np.float64)
    n = int(a.size)
    if n == 0:
        return {"n": 0, "mean": None, "ci": [None, None], "p50": None, "p90": None}
    mean = float(a.mean())
    if n > 1:
        half = float(st.t.ppf(0.5 + level / 2, n - 1) * a.std(ddof=1) / math.sqrt(n))
    else:
        half = math.nan
    return {"n": n, "mean": _r(mean), "ci": [_r(mean - half), _r(mean + half)],
            "p50": _r(float(np.percentile(a, 50))), "p90": _r(float(np.percentile(a, 90)))}


def compare_latency(control: Sequence[float], treatment: Sequence[float],
                    alpha: float = 0.05) -> dict[str, Any]:
    """Is treatment's latency distribution shifted from control's? Two-sided."""
    a = np.asarray(control, dtype=np.float64)
    b = np.asarray(treatment, dtype=np.float64)
    if a.size < 2 or b.size < 2:
        return {"test": "mann-whitney-u", "p_value": None, "significant": False,
                "reason": "fewer than 2 samples in an arm"}
    u = st.mannwhitneyu(b, a, alternative="two-sided")
    welch = st.ttest_ind(b, a, equal_var=False)
    diff = float(b.mean() - a.mean())
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = math.sqrt(va + vb)
    if se > 0:  # Welch-Satterthwaite degrees of freedom
        dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
        half = float(st.t.ppf(1 - alpha / 2, dof) * se)
    else:
        half = 0.0
    p = float(u.pvalue)
    return {
        "test": "mann-whitney-u", "p_value": _r(p, 8), "significant": bool(p < alpha),
        # P(treatment > control) + ½ P(tie): 0.5 means neither is slower
        "prob_treatment_slower": _r(float(u.statistic) / (a.size * b.size), 4),
        "mean_diff": _r(diff), "mean_diff_ci": [_r(diff - half), _r(diff + half)],
        "welch_p_value": _r(float(welch.pvalue), 8),
        "median_ratio": _r(float(np.median(b) / np.median(a)), 4) if np.median(a) > 0 else None,
    }


def wilson(k: int, n: int, level: float = 0.95) -> list[float | None]:
    if n == 0:
        return [None, None]
    z = float(st.norm.ppf(0.5 + level / 2))
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return [_r(max(0.0, centre - half)), _r(min(1.0, centre + half))]


def rate(k: int, n: int) -> dict[str, Any]:
    return {"count": k, "n": n, "rate": _r(k / n) if n else None, "ci": wilson(k, n)}


def compare_rates(k1: int, n1: int, k2: int, n2: int, alpha: float = 0.05) -> dict[str, Any]:
    """Control k1 of n1 vs treatment k2 of n2, two-sided."""
    if n1 == 0 or n2 == 0:
        return {"test": None, "p_value": None, "significant": False, "reason": "an arm is empty"}
    table = [[k1, n1 - k1], [k2, n2 - k2]]
    pooled = (k1 + k2) / (n1 + n2)
    expected_min = min(n1, n2) * min(pooled, 1 - pooled)
    if expected_min < 5:  # the normal approximation is poor here
        p = float(st.fisher_exact(table).pvalue)
        test = "fisher-exact"
    else:
        se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
        z = (k2 / n2 - k1 / n1) / se
        p = float(2 * st.norm.sf(abs(z)))
        test = "two-proportion-z"
    return {"test": test, "p_value": _r(p, 8), "significant": bool(p < alpha),
            "diff": _r(k2 / n2 - k1 / n1)}
