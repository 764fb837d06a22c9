"""`n = 4` vs `n = 1` on the embedded engine (issue 19's second embedded figure).

One engine of the bundled SmolLM2-135M in this process. A prompt of about `--prompt-tokens`
tokens (a fresh one each round, so no round reuses another's prefix), `--max-tokens` tokens
per choice (`ignore_eos`: every choice decodes them all), temperature 0.8, seeded; `n = 1`
and `n = 4` alternate, `--rounds` times. Reported: E2E p50 of each and their ratio (the
issue's bound: at most 1.5, from one shared prefill and four sequences decoded together).

Needs a quiet machine for its timings; run small where it is not:
    .venv/bin/python bench/n_choices.py --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from redline.backends.local import LocalBackend
from redline.config import ModelConfig
from redline.types import GenerationRequest, Message, SamplingParams

SMOL = "smollm2-135m-instruct"
WORDS = ("policy account service region billing support ticket customer order refund "
         "shipping invoice product warranty contract delivery schedule payment").split()


def _prompt(round_: int, tokens: int) -> str:
    words = [WORDS[(i * 7 + round_ * 3) % len(WORDS)] for i in range(tokens)]
    return f"Round {round_}. Summarise these notes: " + " ".join(words)


async def _e2e(backend: LocalBackend, prompt: str, n: int, args: argparse.Namespace) -> float:
    request = GenerationRequest(model=SMOL, messages=(Message("user", prompt),),
                                sampling=SamplingParams(max_tokens=args.max_tokens,
                                                        temperature=0.8, seed=7, n=n,
                                                        ignore_eos=True))
    t0 = time.perf_counter()
    async for _ in backend.stream(request):
        pass
    return time.perf_counter() - t0


async def run(args: argparse.Namespace) -> dict[str, Any]:
    cfg = ModelConfig(name=SMOL, bundled=SMOL, n_seq_max=8, n_threads=args.threads,
                      n_ctx=max(1024, args.prompt_tokens * 2 + args.max_tokens))
    backend = LocalBackend(cfg, Path(".redline/models"))
    await backend.start()
    times: dict[int, list[float]] = {1: [], 4: []}
    try:
        for r in range(args.rounds):
            for n in ((1, 4) if r % 2 == 0 else (4, 1)):
                times[n].append(await _e2e(backend, _prompt(r * 2 + n, args.prompt_tokens),
                                           n, args))
    finally:
        await backend.close()
    p50 = {n: statistics.median(v) for n, v in times.items()}
    return {"rounds": args.rounds, "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.max_tokens,
            "e2e_p50_ms": {f"n={n}": round(v * 1000, 1) for n, v in p50.items()},
            "ratio": round(p50[4] / p50[1], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=400)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0, help="0: all cores")
    print(json.dumps(asyncio.run(run(parser.parse_args())), indent=2))


if __name__ == "__main__":
    main()
