"""Single-stream decode with and without other slots' cached prefixes in the unified KV
buffer: does attention over the cells kept for prefix reuse slow every step?

One engine, one stream of greedy tokens (ignore_eos), measured as TPOT; between rounds,
the other slots are filled with long prompts that finish (their KV stays cached for reuse)
or emptied. Rounds alternate so both see the same machine noise.

`--levels 0,512,2048,10500` measures a curve instead: the 7 other slots hold that many
cells in all (split evenly), levels in a rotating order each round. `redline serve` bounds
the cells idle slots keep at `prefix_cache_tokens` (default: one context, 2,048).

    .venv/bin/python bench/engine_kv_cells.py [--model PATH] [--prompt-tokens 1500]
    .venv/bin/python bench/engine_kv_cells.py --levels 0,512,1024,2048,4096,10500
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

from redline.engine.engine import Engine
from redline.engine.llama import LlamaModel
from redline.models import bundled_path
from redline.types import SamplingParams


async def tpot(engine: Engine, prompt: list[int], n: int) -> float:
    stamps = []
    async for _ in engine.generate(prompt, SamplingParams(max_tokens=n, temperature=0.0,
                                                          ignore_eos=True)):
        stamps.append(time.perf_counter())
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


async def fill(engine: Engine, model: LlamaModel, slots: int, tokens: int) -> None:
    """Leave `slots` slots holding `tokens` cached tokens each (distinct prompts)."""
    async def one(i: int) -> None:
        text = f"Document {i}: " + " ".join(f"w{i}x{j}" for j in range(tokens))
        prompt = model.tokenize(text)[:tokens]
        async for _ in engine.generate(prompt, SamplingParams(max_tokens=1, temperature=0.0)):
            pass
    await asyncio.gather(*(one(i) for i in range(slots)))


def held(engine: Engine) -> int:
    return sum(len(s.tokens) for s in engine.scheduler.slots if s.owner is None)


async def main_async(a: argparse.Namespace) -> None:
    path = a.model or str(bundled_path("smollm2-135m-instruct", Path(".redline/models")))
    model = LlamaModel(path)
    engine = Engine(model, n_ctx_per_seq=2048, n_seq_max=8, n_batch=512, n_threads=a.threads)
    prompt = model.tokenize("Write a long story about a lighthouse keeper.")
    if a.levels:
        names = {int(x): x.strip() for x in a.levels.split(",")}
    else:
        names = {0: "empty", 7 * a.prompt_tokens: "full"}
    levels = list(names)
    rows: dict[str, list[float]] = {names[lv]: [] for lv in levels}
    try:
        for r in range(a.rounds):
            shift = r % len(levels)
            for lv in levels[shift:] + levels[:shift]:
                engine.scheduler.evict_free()
                engine.runner.clear()
                if lv:
                    await fill(engine, model, 7, lv // 7)
                cells = held(engine)
                t = await tpot(engine, prompt, a.tokens)
                rows[names[lv]].append(t)
                print(f"round {r} {names[lv]:5s}: cells held by idle slots {cells:6d}, "
                      f"TPOT {1000 * t:6.2f} ms", flush=True)
    finally:
        engine.close()
        model.close()
    for kind, xs in rows.items():
        print(f"{kind:5s}: TPOT median {1000 * statistics.median(xs):.2f} ms over {len(xs)} rounds")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=1500)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--levels", default=None, help="idle cells in all, comma-separated (a curve)")
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
