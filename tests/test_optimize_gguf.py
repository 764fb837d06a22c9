"""The GGUF ladder on the real bundled SmolLM2 (already Q4_1: requantized variants).
Heavy: run under `flock /tmp/redline-cpu.lock`."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest

from redline.models import bundled_path
from redline.optimize.evalset import load_evalset
from redline.optimize.gate import Gate
from redline.optimize.gguf_ladder import optimize_gguf
from redline.optimize.report import markdown, write

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bundled_path("smollm2-135m-instruct", tmp_path_factory.mktemp("models"))


def small_evalset():  # type: ignore[no-untyped-def]
    ev = load_evalset(max_windows=2)
    return dataclasses.replace(ev, questions=ev.questions[:12])


def test_tight_gate_refuses_q2k_with_numbers(smol: Path, tmp_path: Path,
                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="redline.optimize")
    report = optimize_gguf(smol, tmp_path, Gate(0.01), small_evalset(), ["Q2_K"], "smol")
    # minutes of work show where they are: each variant's stages, numbered
    said = caplog.text
    assert "[1/2]" in said and "[2/2] Q2_K: quality" in said and "[2/2] Q2_K: speed" in said
    ref, q2 = report.results
    assert ref.reference and ref.kind == "MOSTLY_Q4_1"
    assert not q2.passed
    assert any(f.startswith("perplexity") and "allowed" in f for f in q2.failures)
    assert q2.quality.perplexity > ref.quality.perplexity * 1.01
    assert q2.file_bytes < ref.file_bytes
    assert report.chosen == ref.name and report.output is None  # nothing passed: keep the source
    assert not list(tmp_path.glob("*.gguf")) and not (tmp_path / ".variants").exists()
    assert any("already quantized" in n for n in report.notes)
    md, js = write(report, tmp_path)
    assert "**refused**: perplexity" in md.read_text()
    assert json.loads(js.read_text())["results"][1]["passed"] is False


def test_loose_gate_accepts_and_writes_a_variant(smol: Path, tmp_path: Path) -> None:
    # Q8_0 of a Q4_1 file loses well under 50% on every measure
    report = optimize_gguf(smol, tmp_path, Gate(0.5), small_evalset(), ["Q8_0"], "smol")
    q8 = report.results[1]
    assert q8.passed, q8.failures
    assert q8.quality.top1_agreement is not None and q8.quality.top1_agreement > 0.8
    if report.chosen == "Q8_0":  # when it is faster here than the source
        assert report.output is not None and Path(report.output).exists()
    assert "Q8_0" in markdown(report)
