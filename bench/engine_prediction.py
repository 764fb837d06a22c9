"""Predicted Outputs (chat completions' `prediction`) on the embedded engine: one user's
code edits answered with and without the code as it was given as the prediction, rounds
interleaved in one run.

    .venv/bin/python bench/engine_prediction.py                                   # SmolLM2
    .venv/bin/python bench/engine_prediction.py --model qwen2.5-coder-0.5b-instruct
    .venv/bin/python bench/engine_prediction.py --rounds 1 --max-tokens 64       # a quick check

OpenAI's Predicted Outputs let a client send what it expects most of the answer to be; the
embedded engine drafts from it (engine/speculative.py, `Prediction`) and keeps a drafted
token only where the model chose it too, so the answer is the same and only its speed
changes. Each task asks for a small edit of a piece of code and predicts the code as it
was; a third mode predicts another task's code (a wrong guess: what drafting then costs).
One request at a time, greedy, in process (no HTTP: the engine's share). The table
gives, per mode, the median end-to-end time and TPOT over the tasks, the prediction tokens
accepted / proposed, and how many answers were the same text in both modes.
"""

from __future__ import annotations

import argparse
import dataclasses
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redline.engine import speculative  # noqa: E402
from redline.engine.engine import Engine  # noqa: E402
from redline.engine.llama import LlamaModel  # noqa: E402
from redline.models import bundled_path, served_path  # noqa: E402
from redline.types import Message, SamplingParams  # noqa: E402

CODE = [
    ("Rename the variable `total` to `subtotal`.",
     "def invoice(items, tax_rate):\n    total = 0\n    for item in items:\n"
     "        total += item.price * item.quantity\n    if total > 1000:\n"
     "        total *= 0.95\n    return total + total * tax_rate\n"),
    ("Add a docstring to the function.",
     "def mean(values):\n    if not values:\n        raise ValueError(\"no values\")\n"
     "    return sum(values) / len(values)\n\n\ndef spread(values):\n"
     "    return max(values) - min(values)\n"),
    ("Change the default port from 8080 to 9090.",
     "import argparse\n\n\ndef parse():\n    ap = argparse.ArgumentParser()\n"
     "    ap.add_argument(\"--host\", default=\"127.0.0.1\")\n"
     "    ap.add_argument(\"--port\", type=int, default=8080)\n"
     "    ap.add_argument(\"--workers\", type=int, default=4)\n    return ap.parse_args()\n"),
    ("Make the class keep a count of how many times `greet` was called.",
     "class Greeter:\n    def __init__(self, name):\n        self.name = name\n\n"
     "    def greet(self):\n        return f\"Hello, {self.name}!\"\n"),
]


def task(model: LlamaModel, ask: str, code: str) -> tuple[list[int], list[int]]:
    """The prompt's tokens and the prediction's (the code as it was, fenced as answers are)."""
    question = f"{ask} Answer with the whole code only.\n\n```python\n{code}```"
    prompt = model.tokenize(model.render_chat((Message("user", question),)), add_special=False)
    return prompt, model.tokenize(f"```python\n{code}```", add_special=False,
                                  parse_special=False)


async def one(engine: Engine, prompt: list[int], prediction: list[int] | None,
              max_tokens: int) -> tuple[str, float, float, int, int, int]:
    """(text, seconds, TPOT seconds, tokens, prediction tokens accepted, proposed)."""
    stamps: list[float] = []
    text, n, accepted, proposed = "", 0, 0, 0
    t0 = time.perf_counter()
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    async for chunk in engine.generate(prompt, sampling, prediction=prediction):
        text += chunk.text
        if chunk.tokens:
            stamps.append(time.perf_counter())
            n += chunk.tokens
        if chunk.usage is not None and chunk.usage.completion_details:
            accepted = chunk.usage.completion_details["accepted_prediction_tokens"]
            proposed = accepted + chunk.usage.completion_details["rejected_prediction_tokens"]
    seconds = time.perf_counter() - t0
    tpot = (stamps[-1] - stamps[0]) / (n - 1) if n > 1 else float("nan")
    return text, seconds, tpot, n, accepted, proposed


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--weights", default="auto", help="as the model's config: auto, as-shipped")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--max-draft", type=int, default=speculative.PREDICTED.max_draft,
                    help="the longest draft a step takes from the prediction")
    args = ap.parse_args()
    speculative.PREDICTED = dataclasses.replace(speculative.PREDICTED, max_draft=args.max_draft)
    path = served_path(bundled_path(args.model, ROOT / ".redline" / "models"), args.weights)
    model = LlamaModel(str(path))
    engine = Engine(model, n_ctx_per_seq=1024, n_seq_max=2, n_batch=512, n_threads=args.threads,
                    prefix_reuse=False)
    tasks = [task(model, ask, code) for ask, code in CODE]
    modes = ("plain", "predicted", "wrong")
    e2e: dict[str, list[float]] = {m: [] for m in modes}
    tpot: dict[str, list[float]] = {m: [] for m in modes}
    drafts = {m: [0, 0] for m in modes}  # accepted, proposed
    same = {m: 0 for m in modes}
    try:
        await one(engine, tasks[0][0], None, 8)  # first-call allocations
        for r in range(args.rounds):
            order = modes if r % 2 == 0 else modes[::-1]
            for i, (prompt, prediction) in enumerate(tasks):
                texts = {}
                guess = {"plain": None, "predicted": prediction,
                         "wrong": tasks[(i + 1) % len(tasks)][1]}
                for mode in order:
                    text, s, t, _, a, p = await one(engine, prompt, guess[mode], args.max_tokens)
                    texts[mode] = text
                    e2e[mode].append(s)
                    tpot[mode].append(t)
                    drafts[mode][0] += a
                    drafts[mode][1] += p
                for mode in modes:
                    same[mode] += texts["plain"] == texts[mode]
            print(f"round {r + 1}: " + ", ".join(
                f"{m} {statistics.median(v):.2f} s" for m, v in e2e.items()), file=sys.stderr)
    finally:
        engine.close()
        model.close()
    print(f"\none user's code edits, greedy, up to {args.max_tokens} tokens ({path.name}, "
          f"{len(tasks)} tasks, {args.rounds} rounds interleaved, max_draft {args.max_draft})\n")
    print("| prediction | E2E p50 | TPOT p50 | E2E speed-up | prediction tokens accepted / "
          "proposed | same text as plain |")
    print("|---|---|---|---|---|---|")
    n = len(tasks) * args.rounds
    base = statistics.median(e2e["plain"])
    for mode in modes:
        acc = f"{drafts[mode][0]} / {drafts[mode][1]}" if mode != "plain" else "—"
        name = {"plain": "none", "predicted": "the code as it was",
                "wrong": "another task's code"}[mode]
        print(f"| {name} | {statistics.median(e2e[mode]):.2f} s | "
              f"{statistics.median(tpot[mode]) * 1e3:.1f} ms | "
              f"{base / statistics.median(e2e[mode]):.2f}x | {acc} | {same[mode]}/{n} |")


if __name__ == "__main__":
    asyncio.run(main())
