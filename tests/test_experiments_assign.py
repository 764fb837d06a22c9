"""Sticky arm assignment and the overrides an arm applies."""

from __future__ import annotations

import collections

import pytest

from redline.config import ExperimentsConfig, RedlineConfig
from redline.experiments import Experiments
from redline.experiments.assign import bucket
from redline.types import GenerationRequest, SamplingParams


def exp_cfg(**extra: object) -> ExperimentsConfig:
    return ExperimentsConfig(active=[{
        "name": "speed", "arms": [
            {"name": "control"},
            {"name": "fast", "model": "small", "sampling": {"temperature": 0.0, "max_tokens": 8}},
        ], **extra}])


def req(user: str | None = None, tenant: str = "anonymous", model: str = "big") -> GenerationRequest:
    return GenerationRequest(model=model, prompt="hi", sampling=SamplingParams(max_tokens=64),
                             user=user, tenant=tenant)


def test_same_user_same_arm_every_time_and_across_instances() -> None:
    a, b = Experiments(exp_cfg(), ["big", "small"]), Experiments(exp_cfg(), ["big", "small"])
    for i in range(50):
        arms = {x.assign(req(user=f"u{i}")).arm for x in (a, b) for _ in range(3)}  # type: ignore[union-attr]
        assert len(arms) == 1


def test_weights_split_units_about_evenly() -> None:
    ex = Experiments(exp_cfg(), ["big", "small"])
    counts = collections.Counter(ex.assign(req(user=f"user-{i}")).arm for i in range(4000))  # type: ignore[union-attr]
    assert 1800 < counts["control"] < 2200 and 1800 < counts["fast"] < 2200


def test_override_rewrites_model_and_sampling() -> None:
    ex = Experiments(exp_cfg(), ["big", "small"])
    for i in range(40):
        r = req(user=f"u{i}")
        got = ex.assign(r)
        assert got is not None
        if got.arm == "fast":
            assert r.model == "small" and r.sampling.temperature == 0.0 and r.sampling.max_tokens == 8
        else:
            assert r.model == "big" and r.sampling.max_tokens == 64
    assert got.label == f"speed:{got.arm}"


def test_units() -> None:
    by_user = Experiments(exp_cfg(unit="user"), ["big", "small"])
    assert by_user.assign(req(user=None, tenant="k1")) is None  # nothing to be sticky on
    by_key = Experiments(exp_cfg(unit="tenant"), ["big", "small"])
    arms = {by_key.assign(req(user=f"u{i}", tenant="k1")).arm for i in range(30)}  # type: ignore[union-attr]
    assert len(arms) == 1  # one API key: one arm, whoever its end users are
    auto = Experiments(exp_cfg(), ["big", "small"])
    assert auto.assign(req(user=None, tenant="k1")) is not None  # falls back to the key


def test_models_filter_and_salt() -> None:
    ex = Experiments(exp_cfg(models=["big"]), ["big", "small"])
    assert ex.assign(req(user="u", model="other")) is None
    # the experiment's name salts the hash: one unit's arms in two experiments are independent
    assert bucket("a", "user:u1") != bucket("b", "user:u1")


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        Experiments(exp_cfg(), ["big"])
    with pytest.raises(ValueError, match="unknown sampling"):
        ExperimentsConfig(active=[{"name": "x", "arms": [{"name": "a"},
                                                         {"name": "b", "sampling": {"bogus": 1}}]}])
    with pytest.raises(ValueError):
        ExperimentsConfig(active=[{"name": "x", "arms": [{"name": "only"}]}])
    cfg = RedlineConfig(experiments={"active": [{"name": "x", "arms": [{"name": "a"}, {"name": "b"}]}]})
    assert cfg.experiments.active[0].arms[1].name == "b"
