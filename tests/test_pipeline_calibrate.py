"""Local models measure their step costs again once everything has loaded, one model at
a time (backends/local.py `calibrate`): the planner's forecasts come from those costs, and
a warm-up that ran beside other loads measured a busy machine (issue 23)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from redline.api.services import build
from redline.backends.fake import FakeBackend
from redline.config import RedlineConfig


class Loading(FakeBackend):
    """A backend that takes a while to start and records when it calibrates."""

    def __init__(self, name: str, log: list[str], start_s: float) -> None:
        super().__init__(name)
        self.log, self.start_s = log, start_s
        self.calibrating = False

    async def start(self) -> None:
        await asyncio.sleep(self.start_s)
        self.log.append(f"started {self.info.name}")

    async def calibrate(self) -> None:
        others = [b for b in BACKENDS if b is not self and b.calibrating]
        assert not others, "two models calibrated at once"
        self.calibrating = True
        await asyncio.sleep(0.01)
        self.log.append(f"calibrated {self.info.name}")
        self.calibrating = False


BACKENDS: list[Loading] = []


async def test_calibration_comes_after_every_start_one_model_at_a_time(tmp_path: Path) -> None:
    log: list[str] = []
    BACKENDS[:] = [Loading("a", log, 0.05), Loading("b", log, 0.01)]
    plain = FakeBackend("c")  # a backend without calibration is left alone
    cfg = RedlineConfig(server={"data_dir": str(tmp_path)}, cache={"enabled": False},
                        models=[{"name": n, "bundled": "fake"} for n in ("a", "b", "c")])
    services = build(cfg, {"a": BACKENDS[0], "b": BACKENDS[1], "c": plain})
    await services.pipeline.start()
    try:
        assert log == ["started b", "started a", "calibrated a", "calibrated b"]
        assert services.pipeline.ready
    finally:
        await services.pipeline.close()
