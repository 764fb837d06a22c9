"""A short question arriving while streams decode: its TTFT and the streams' ITL, with the
newcomer's prompt run alone in a step first (the default with one KV stream per slot,
`Scheduler._alone`) and mixed into the streams' step, in the same run, on the bundled
SmolLM2, in process (no HTTP).

    .venv/bin/python bench/engine_newcomer.py                    # 1, 3 and 7 streams
    .venv/bin/python bench/engine_newcomer.py --streams 3 --questions 40 --rounds 2

Each round and mode: `--streams` streams decode (greedy, long answers); once each has
given a few tokens, `--questions` one-line questions (~40 prompt tokens each, in the chat
template, every one its own) arrive one at a time, `--gap-ms` apart on average (seeded,
uniform within ±50 %), each asking for two tokens. Reported per mode: the questions' TTFT
p50 / p90, and the streams' gaps between tokens while the questions came (p50 / p99).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_prefill_itl import decode_stream  # noqa: E402  (bench/ is on the path)

from redline.bench.report import percentile  # noqa: E402
from redline.engine.engine import Engine  # noqa: E402
from redline.engine.llama import LlamaModel  # noqa: E402
from redline.models import bundled_path, served_path  # noqa: E402
from redline.types import Message, SamplingParams  # noqa: E402

TOPICS = ("the water cycle", "a rainbow", "tides", "volcanoes", "the seasons", "thunder",
          "photosynthesis", "magnets", "gravity", "snowflakes", "the moon's phases", "wind")


async def one_round(engine: Engine, model: LlamaModel, streams: int, questions: int,
                    gap_s: float, seed: int, tag: str) -> tuple[list[float], list[float]]:
    """(the questions' TTFTs, the streams' gaps while they came)."""
    stamps: list[list[float]] = [[] for _ in range(streams)]
    started, done = asyncio.Event(), asyncio.Event()
    long_sampling = SamplingParams(max_tokens=4000, temperature=0.0, ignore_eos=True)

    tasks = [asyncio.create_task(decode_stream(engine, model, i, long_sampling, stamps, started,
                                               done, 8)) for i in range(streams)]
    await started.wait()
    begin = time.perf_counter()
    rng = random.Random(seed)
    ttfts: list[float] = []
    for j in range(questions):
        text = (f"In two sentences, explain {TOPICS[j % len(TOPICS)]} to a child "
                f"(question {tag}{j}).")
        prompt = model.tokenize(model.render_chat((Message("user", text),)), add_special=False)
        t0 = time.perf_counter()
        it = engine.generate(prompt, SamplingParams(max_tokens=2, temperature=0.0))
        await it.__anext__()
        ttfts.append(time.perf_counter() - t0)
        await it.aclose()  # type: ignore[attr-defined]
        await asyncio.sleep(max(0.0, gap_s * rng.uniform(0.5, 1.5) - ttfts[-1]))
    end = time.perf_counter()
    done.set()
    await asyncio.gather(*tasks)
    gaps = [b - a for s in stamps for a, b in zip(s, s[1:], strict=False) if a >= begin and b <= end]
    return ttfts, gaps


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", default="1,3,7")
    ap.add_argument("--questions", type=int, default=30)
    ap.add_argument("--gap-ms", type=float, default=250.0)
    ap.add_argument("--rounds", type=int, default=2, help="per mode and load, interleaved")
    ap.add_argument("--kv-layout", choices=("unified", "per_slot"), default="per_slot")
    ap.add_argument("--weights", default="auto")
    args = ap.parse_args()
    loads = [int(x) for x in args.streams.split(",")]
    path = served_path(bundled_path("smollm2-135m-instruct", ROOT / ".redline" / "models"),
                       args.weights)
    model = LlamaModel(str(path))
    engine = Engine(model, n_ctx_per_seq=4096 + 128, n_seq_max=8, n_batch=512, n_threads=0,
                    kv_unified=args.kv_layout == "unified", side_prefill=False)
    alone = engine.scheduler._alone
    modes = {"alone first": alone, "mixed": lambda decoding: []}
    got = {(k, m): ([], []) for k in loads for m in modes}  # type: ignore[var-annotated]
    try:
        for r in range(args.rounds):
            for k in loads:
                for m in (list(modes) if r % 2 == 0 else list(modes)[::-1]):
                    engine.scheduler._alone = modes[m]  # type: ignore[method-assign]
                    ttfts, gaps = await one_round(engine, model, k, args.questions,
                                                  args.gap_ms / 1e3, r, f"{m[0]}{k}r{r}-")
                    got[(k, m)][0].extend(ttfts)
                    got[(k, m)][1].extend(gaps)
                    print(f"round {r + 1}, {k} streams, {m}: TTFT p50 "
                          f"{statistics.median(ttfts) * 1e3:.1f} ms, ITL p99 "
                          f"{percentile(gaps, 99) * 1e3:.1f} ms", file=sys.stderr)
    finally:
        engine.scheduler._alone = alone  # type: ignore[method-assign]
        engine.close()
        model.close()
    print(f"\nshort questions arriving one at a time beside decoding streams ({path.name}, "
          f"KV {args.kv_layout}, {args.questions} questions x {args.rounds} rounds per row)\n")
    print("| streams | mode | question TTFT p50 | p90 | streams' ITL p50 | p99 |")
    print("|---|---|---|---|---|---|")
    for (k, m), (ttfts, gaps) in got.items():
        print(f"| {k} | {m} | {percentile(ttfts, 50) * 1e3:.1f} ms | "
              f"{percentile(ttfts, 90) * 1e3:.1f} ms | {percentile(gaps, 50) * 1e3:.1f} ms | "
              f"{percentile(gaps, 99) * 1e3:.1f} ms |")


if __name__ == "__main__":
    asyncio.run(main())
