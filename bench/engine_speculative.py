"""Issue 23's speculative-decoding figure: single-stream TPOT with and without n-gram
prompt-lookup drafting (engine/speculative.py), rounds interleaved in one run.

    .venv/bin/python bench/engine_speculative.py                      # SmolLM2, 3 rounds
    .venv/bin/python bench/engine_speculative.py --model qwen2.5-coder-0.5b-instruct
    .venv/bin/python bench/engine_speculative.py --rounds 1 --max-tokens 48   # a quick check

Two engines over one loaded model, one with drafting and one without, take turns on the
same prompts (the order flips each round): answers that quote their prompt (a typo fix, a
rename in code, an extraction) and ordinary chat questions, where drafting should cost
little. One request at a time (a single user), greedy (or sampled with `--temperature`,
each prompt seeded alike in both modes). TPOT is a request's decode time over its tokens
after the first; the table gives medians per kind, the draft tokens accepted / proposed,
and how many answers were the same text in both modes. The engine is called in process (no
HTTP): this is the engine's share.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redline.engine.engine import Engine  # noqa: E402
from redline.engine.llama import LlamaModel  # noqa: E402
from redline.engine.speculative import NgramSettings  # noqa: E402
from redline.models import bundled_path, served_path  # noqa: E402
from redline.types import Message, SamplingParams  # noqa: E402

QUOTING = [
    "Repeat this paragraph with the typos fixed: The harbour mastre kept a log of every ship "
    "that came in: its name, its cargo, the wether it met, and the hour it tied up. On stormy "
    "nights he wrote by candel light, and in the morning he copied the log into the big book "
    "that the town kept in the library.",
    "Rewrite this function with `total` renamed to `subtotal`:\n\n```python\n"
    "def invoice(items, tax_rate):\n    total = 0\n    for item in items:\n"
    "        total += item.price * item.quantity\n    if total > 1000:\n"
    "        total *= 0.95\n    return total + total * tax_rate\n```",
    "Copy every sentence of this text that mentions a date: The meeting was moved to March 3. "
    "Everyone agreed on the budget. The report is due on April 14, and the review follows on "
    "April 21. Lunch will be served at noon. The office closes on May 1 for the holiday.",
    "Quote the customer's complaint word for word, then summarise it: \"I ordered the blue "
    "kettle on Monday and it arrived on Friday with a cracked lid. The box was fine, so it "
    "must have been packed broken. I want a replacement, not a refund.\"",
]
CHAT = [
    "What is the capital of France, and what is it known for?",
    "Give me three tips for sleeping better.",
    "Explain what a binary search does.",
    "Why is the sky blue?",
]


def chat_tokens(model: LlamaModel, question: str) -> list[int]:
    return model.tokenize(model.render_chat((Message("user", question),)), add_special=False)


async def one(engine: Engine, tokens: list[int], max_tokens: int, temperature: float = 0.0,
              seed: int | None = None) -> tuple[str, float, int]:
    """(text, TPOT seconds, output tokens) of one request alone."""
    stamps: list[float] = []
    text = ""
    n = 0
    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed)
    async for chunk in engine.generate(tokens, sampling):
        text += chunk.text
        if chunk.tokens:
            stamps.append(time.perf_counter())
            n += chunk.tokens
    tpot = (stamps[-1] - stamps[0]) / (n - 1) if n > 1 else float("nan")
    return text, tpot, n


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--weights", default="auto", help="as the model's config: auto, as-shipped")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-draft", type=int, default=NgramSettings.max_draft)
    ap.add_argument("--min-match", type=int, default=NgramSettings.min_match)
    ap.add_argument("--max-match", type=int, default=NgramSettings.max_match)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="> 0: sampled answers, each prompt seeded (the same seed in both modes)")
    args = ap.parse_args()
    path = served_path(bundled_path(args.model, ROOT / ".redline" / "models"), args.weights)
    model = LlamaModel(str(path))
    settings = NgramSettings(args.max_draft, args.min_match, args.max_match)
    kw = dict(n_ctx_per_seq=1024, n_seq_max=2, n_batch=512, n_threads=args.threads,
              prefix_reuse=False)
    engines = {"off": Engine(model, **kw), "ngram": Engine(model, speculative=settings, **kw)}  # type: ignore[arg-type]
    prompts = {"quoting": [chat_tokens(model, q) for q in QUOTING],
               "chat": [chat_tokens(model, q) for q in CHAT]}
    tpot: dict[tuple[str, str], list[float]] = {}
    tokens: dict[tuple[str, str], int] = {}
    seconds: dict[tuple[str, str], float] = {}
    drafts: dict[str, list[int]] = {k: [0, 0] for k in prompts}  # proposed, accepted
    same: dict[str, list[int]] = {k: [0, 0] for k in prompts}  # identical, compared
    try:
        for tokens_ in prompts["chat"][:1]:  # warm both engines (first-call allocations)
            for engine in engines.values():
                await one(engine, tokens_, 8)
        for r in range(args.rounds):
            order = list(engines) if r % 2 == 0 else list(reversed(engines))
            for kind, group in prompts.items():
                for p in group:
                    texts = {}
                    for mode in order:
                        engine = engines[mode]
                        before = (engine.draft_proposed, engine.draft_accepted)
                        t0 = time.perf_counter()
                        seed = None if args.temperature <= 0 else 1000 * r + group.index(p)
                        text, t, n = await one(engine, p, args.max_tokens, args.temperature,
                                               seed)
                        seconds[kind, mode] = seconds.get((kind, mode), 0.0) + \
                            time.perf_counter() - t0
                        texts[mode] = text
                        tpot.setdefault((kind, mode), []).append(t)
                        tokens[kind, mode] = tokens.get((kind, mode), 0) + n
                        drafts[kind][0] += engine.draft_proposed - before[0]
                        drafts[kind][1] += engine.draft_accepted - before[1]
                    same[kind][0] += texts["off"] == texts["ngram"]
                    same[kind][1] += 1
            print(f"round {r + 1}: " + ", ".join(
                f"{k} {m} {statistics.median(v) * 1e3:.1f} ms" for (k, m), v in tpot.items()),
                file=sys.stderr)
    finally:
        for engine in engines.values():
            engine.close()
        model.close()
    how = "greedy" if args.temperature <= 0 else f"temperature {args.temperature}, seeded"
    print(f"\nsingle stream, {how}, up to {args.max_tokens} tokens ({path.name}, "
          f"max_draft {args.max_draft}, match {args.min_match}..{args.max_match}, "
          f"{args.rounds} rounds interleaved)\n")
    print("| answers | TPOT off | TPOT ngram | speed-up | tok/s off | tok/s ngram | "
          "drafts accepted / proposed | same text |")
    print("|---|---|---|---|---|---|---|---|")
    for kind in prompts:
        off = statistics.median(tpot[kind, "off"])
        on = statistics.median(tpot[kind, "ngram"])
        rate = [tokens[kind, m] / seconds[kind, m] for m in ("off", "ngram")]
        proposed, accepted = drafts[kind]
        print(f"| {kind} | {off * 1e3:.1f} ms | {on * 1e3:.1f} ms | {off / on:.2f}x | "
              f"{rate[0]:.0f} | {rate[1]:.0f} | {accepted} / {proposed} | "
              f"{same[kind][0]}/{same[kind][1]} |")


if __name__ == "__main__":
    asyncio.run(main())
