"""The optimisation report: one markdown table for people, one JSON for machines."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from redline.optimize.ladder import Report, Result


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _verdict(r: Result, chosen: str | None) -> str:
    if r.reference:
        tag = "reference"
    elif r.passed:
        tag = "pass"
    else:
        tag = "**refused**: " + "; ".join(r.failures)
    return f"{tag} ✅ chosen" if r.name == chosen else tag


def markdown(report: Report) -> str:
    ref = report.results[0]
    lines = [
        f"### `redline optimize` — {report.model}",
        "",
        f"Source: `{report.source}`. Gate: perplexity rise ≤ {report.gate.max_quality_loss:.2%}, "
        f"question-accuracy drop ≤ {report.gate.accuracy_drop:.2%}"
        + (f", greedy-token agreement ≥ {report.gate.min_top1_agreement:.1%}"
           if report.gate.min_top1_agreement else "")
        + f". Evaluated on {report.tokens_scored} held-out tokens and {report.questions} questions; "
        f"speed is single-stream, best of 5; variants are ranked by the time of a 256-token "
        f"prompt + 64-token answer (req ms). Whole run: {report.seconds:.0f} s.",
        "",
        "| variant | weights | file MiB | weights MiB | prefill tok/s | decode tok/s | req ms "
        "| perplexity | Δ ppl | top-1 agree | accuracy | answer agree | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report.results:
        q = r.quality
        rise = q.perplexity / ref.quality.perplexity - 1
        lines.append(
            f"| {r.name} | {r.kind} | {_mib(r.file_bytes)} | {_mib(r.memory_bytes)} "
            f"| {r.speed.prefill_tok_s:.0f} | {r.speed.decode_tok_s:.1f} "
            f"| {r.speed.request_s() * 1000:.0f} | {q.perplexity:.3f} "
            f"| {rise:+.2%} | {_pct(q.top1_agreement)} | {q.accuracy:.1%} | {_pct(q.answer_agreement)} "
            f"| {_verdict(r, report.chosen)} |")
    lines.append("")
    lines.append(f"Chosen: **{report.chosen}**" + (f", written to `{report.output}`" if report.output
                                                    else " (the source file itself; nothing faster passed)"))
    refused = [r.name for r in report.results if not r.passed]
    if refused:
        lines.append(f"Refused: {', '.join(refused)}.")
    lines += [f"- {n}" for n in report.notes]
    return "\n".join(lines) + "\n"


def to_json(report: Report) -> dict[str, Any]:
    out = dataclasses.asdict(report)
    for r, row in zip(report.results, out["results"], strict=True):
        row["passed"] = r.passed
    return out


def write(report: Report, out_dir: Path) -> tuple[Path, Path]:
    md, js = out_dir / "report.md", out_dir / "report.json"
    md.write_text(markdown(report))
    js.write_text(json.dumps(to_json(report), indent=2))
    return md, js
