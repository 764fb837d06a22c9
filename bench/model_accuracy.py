"""Each bundled model's accuracy on the question set the quantization gate uses
(bench/data/questions.jsonl, redline/optimize/evalset.py): the figure issue 23 asks for
next to the scenario's share routed to each model, so that routing everything to the
smallest model is visible.

    .venv/bin/python bench/model_accuracy.py                 # every bundled model installed
    .venv/bin/python bench/model_accuracy.py --models smollm2-135m-instruct

Greedy answers of up to `--tokens` tokens (the gate's 16 by default), asked in the model's
own chat template (a base model gets "Question: …\\nAnswer:"), scored as the gate scores
them (optimize/quality.py: any accepted answer among the normalised words). The file each
model is served from is the one `weights: auto` picks, as `redline serve` loads it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redline.models import BUNDLED, bundled_path, served_path  # noqa: E402
from redline.optimize.evalset import load_evalset  # noqa: E402
from redline.optimize.gguf_runner import GgufRunner  # noqa: E402
from redline.optimize.quality import is_correct  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(BUNDLED), help="comma list of bundled names")
    ap.add_argument("--tokens", type=int, default=0, help="answer tokens (0: the gate's)")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    ev = load_evalset()
    tokens = args.tokens or ev.answer_tokens
    rows = []
    for name in args.models.split(","):
        try:
            path = served_path(bundled_path(name, ROOT / ".redline" / "models"), "auto")
        except (FileNotFoundError, ValueError) as exc:
            print(f"{name}: skipped ({exc})", file=sys.stderr)
            continue
        runner = GgufRunner(path, n_threads=args.threads)
        try:
            t0 = time.perf_counter()
            answers = runner.answer([q.question for q in ev.questions], tokens)
            seconds = time.perf_counter() - t0
        finally:
            runner.close()
        right = [is_correct(a, q) for a, q in zip(answers, ev.questions, strict=True)]
        rows.append((name, path.name, sum(right), len(right), seconds))
        wrong = [(q.question, a.strip()[:60]) for q, a, ok in
                 zip(ev.questions, answers, right, strict=True) if not ok]
        for question, answer in wrong[:5]:
            print(f"  {name} wrong: {question!r} -> {answer!r}", file=sys.stderr)
    print(f"\nquestion set: {len(ev.questions)} questions, greedy, up to {tokens} tokens\n")
    print("| model | file | accuracy | answered in |")
    print("|---|---|---|---|")
    for name, file, n_right, n, seconds in rows:
        print(f"| {name} | {file} | {n_right}/{n} = {n_right / n:.1%} | {seconds:.1f} s |")


if __name__ == "__main__":
    main()
