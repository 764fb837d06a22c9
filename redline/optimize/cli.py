"""`redline optimize MODEL --max-quality-loss 1%`: the ladder, the gate, the report.

MODEL is a bundled model name, a `.gguf` file, or a transformers model folder (needs the
`torch` extra). Exit status 0 when a report was written (even if every variant was
refused: the reference is then the answer), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from redline.optimize.gate import Gate, parse_loss


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="bundled model name, .gguf path, or transformers model folder")
    p.add_argument("--max-quality-loss", default="1%",
                   help="largest allowed perplexity rise and question-accuracy drop (default 1%%)")
    p.add_argument("--max-accuracy-drop",
                   help="largest allowed question-accuracy drop (default: --max-quality-loss)")
    p.add_argument("--min-agreement", default="0%",
                   help="smallest allowed greedy-token agreement with the reference (default off)")
    p.add_argument("--variants", help="comma list; GGUF default F16,Q8_0,Q6_K,Q5_K_M,Q4_K_M,Q3_K_M,"
                   "Q2_K; transformers default bf16,int8-dynamic")
    p.add_argument("--out", help="output folder (default .redline/optimized/<model>)")
    p.add_argument("--threads", type=int, default=0, help="0 = all cores")
    p.add_argument("--heldout", type=Path, help="held-out text (default bench/data/heldout.txt)")
    p.add_argument("--questions", type=Path, help="question set (default bench/data/questions.jsonl)")
    p.add_argument("--max-windows", type=int, default=8, help="256-token perplexity windows")


def _resolve(model: str, models_dir: Path) -> tuple[str, Path]:
    from redline.models import BUNDLED, bundled_path

    if model in BUNDLED:
        return "gguf", bundled_path(model, models_dir)
    path = Path(model)
    if path.is_file() and path.suffix == ".gguf":
        return "gguf", path
    if path.is_dir() and (path / "config.json").exists():
        return "hf", path
    raise ValueError(f"{model!r} is neither a bundled model ({', '.join(BUNDLED)}), a .gguf file, "
                     "nor a transformers model folder")


def run(args: argparse.Namespace) -> int:
    from redline.optimize.evalset import load_evalset
    from redline.optimize.report import markdown, write

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        gate = Gate(parse_loss(args.max_quality_loss), parse_loss(args.min_agreement),
                    parse_loss(args.max_accuracy_drop) if args.max_accuracy_drop else None)
        kind, path = _resolve(args.model, Path(".redline/models"))
        ev = load_evalset(args.heldout, args.questions, max_windows=args.max_windows)
    except (ValueError, FileNotFoundError) as exc:
        print(f"redline optimize: {exc}", file=sys.stderr)
        return 2
    name = path.stem if kind == "gguf" and args.model.endswith(".gguf") else Path(args.model).name
    out = Path(args.out or Path(".redline/optimized") / name)
    variants = [v.strip() for v in args.variants.split(",")] if args.variants else None
    if kind == "gguf":
        from redline.optimize.gguf import LADDER
        from redline.optimize.gguf_ladder import optimize_gguf

        report = optimize_gguf(path, out, gate, ev, variants or list(LADDER), name, args.threads)
    else:
        from redline.optimize.hf import HF_LADDER, optimize_hf

        report = optimize_hf(path, out, gate, ev, variants or list(HF_LADDER), name, args.threads)
    md, js = write(report, out)
    print(markdown(report))
    print(f"report: {md} and {js}")
    return 0
