"""Sticky arm assignment: a unit (end user or API key) hashes to the same arm of an
experiment on every request and every replica, with no state to share."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

from redline.config import ArmConfig, ExperimentConfig
from redline.types import GenerationRequest


def bucket(experiment: str, unit: str) -> float:
    """A stable uniform number in [0, 1) for (experiment, unit): the experiment's name is
    the salt, so one user's arms in two experiments are independent."""
    digest = hashlib.sha256(f"{experiment}\x00{unit}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def unit_of(request: GenerationRequest, unit: str) -> str | None:
    if unit == "tenant":
        return f"key:{request.tenant}"
    if request.user:
        return f"user:{request.user}"
    return None if unit == "user" else f"key:{request.tenant}"


@dataclass(frozen=True)
class Assignment:
    experiment: str
    arm: str

    @property
    def label(self) -> str:
        return f"{self.experiment}:{self.arm}"


def choose(exp: ExperimentConfig, unit: str) -> ArmConfig:
    x = bucket(exp.name, unit) * sum(a.weight for a in exp.arms)
    for arm in exp.arms:
        x -= arm.weight
        if x < 0:
            return arm
    return exp.arms[-1]


def apply(arm: ArmConfig, request: GenerationRequest) -> None:
    """Rewrite the request as the arm says; the rest of the pipeline then serves it as is."""
    if arm.model is not None:
        request.model = arm.model
    if arm.tier is not None:
        request.tier = arm.tier
    if arm.sampling:
        request.sampling = dataclasses.replace(request.sampling, **arm.sampling)  # type: ignore[arg-type]  # keys checked by the config
