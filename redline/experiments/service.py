"""Experiments: assigns each request to an arm (rewriting it as the arm says), records
how every arm's completions went, and compares each arm with the control (arm one)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from redline.config import ExperimentsConfig
from redline.experiments import stats
from redline.experiments.assign import Assignment, apply, choose, unit_of
from redline.experiments.record import Recorder
from redline.routing.names import AUTO
from redline.types import GenerationRequest

LATENCY = ("ttft", "tpot", "e2e")
RATES = ("completed", "interrupted")


class Experiments:
    def __init__(self, cfg: ExperimentsConfig, models: Iterable[str]) -> None:
        known = set(models) | {AUTO}
        for exp in cfg.active:
            for arm in exp.arms:
                if arm.model is not None and arm.model not in known:
                    raise ValueError(f"experiment {exp.name!r}, arm {arm.name!r}: unknown model "
                                     f"{arm.model!r}; configured: {sorted(known)}")
        self.cfg = cfg
        self.recorder = Recorder(cfg.max_samples)  # add to pipeline.observers
        self.started_at = time.time()

    def assign(self, request: GenerationRequest) -> Assignment | None:
        """Enrol the request in the first running experiment that takes it, and apply that
        arm's overrides to it. None: not enrolled (no experiment, or no unit to be sticky on)."""
        for exp in self.cfg.active:
            if not exp.enabled or (exp.models and request.model not in exp.models):
                continue
            unit = unit_of(request, exp.unit)
            if unit is None:
                continue
            arm = choose(exp, unit)
            apply(arm, request)
            return Assignment(exp.name, arm.name)
        return None

    def snapshot(self) -> dict[str, Any]:
        """Every experiment's arms (figures with 95% intervals) and each arm against control."""
        alpha = self.cfg.alpha
        out = []
        for exp in self.cfg.active:
            arms: list[dict[str, Any]] = []
            data: dict[str, dict[str, Any]] = {}
            for arm in exp.arms:
                ttft, tpot, e2e, outcomes, hits = self.recorder.copy(f"{exp.name}:{arm.name}")
                n = len(outcomes)
                data[arm.name] = {"ttft": ttft, "tpot": tpot, "e2e": e2e, "n": n,
                                  **{r: outcomes.count(r) for r in RATES}}
                arms.append({
                    "name": arm.name, "weight": arm.weight,
                    "overrides": arm.model_dump(exclude={"name", "weight"}, exclude_defaults=True),
                    "requests": n, "cache_hits": hits,
                    **{m: stats.describe(data[arm.name][m]) for m in LATENCY},
                    **{f"{r}_rate": stats.rate(data[arm.name][r], n) for r in RATES},
                })
            control = exp.arms[0].name
            comparisons = []
            for arm in exp.arms[1:]:
                c, t = data[control], data[arm.name]
                row: dict[str, Any] = {"control": control, "treatment": arm.name}
                for m in LATENCY:
                    row[m] = stats.compare_latency(c[m], t[m], alpha)
                for r in RATES:
                    row[f"{r}_rate"] = stats.compare_rates(c[r], c["n"], t[r], t["n"], alpha)
                comparisons.append(row)
            out.append({"name": exp.name, "enabled": exp.enabled, "unit": exp.unit,
                        "models": exp.models, "control": control, "arms": arms,
                        "comparisons": comparisons})
        return {"object": "experiments", "alpha": alpha, "since": round(self.started_at, 3),
                "units": "seconds", "experiments": out}

    def reset(self) -> None:
        self.recorder.reset()
        self.started_at = time.time()
