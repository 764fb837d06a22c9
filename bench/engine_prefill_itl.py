"""Issue 23's fair-prefill figure: the inter-token latency of running streams while a
long prompt arrives, with the fixed prefill budget (the rest of n_batch every step) and
the adaptive one (engine/budget.py), in the same run, on the bundled SmolLM2.

    .venv/bin/python bench/engine_prefill_itl.py                 # 7 streams, 1,500 tokens
    .venv/bin/python bench/engine_prefill_itl.py --streams 2 --prompt 300   # a quick check
    .venv/bin/python bench/engine_prefill_itl.py --slack 0.5,1.0    # adaptive at two slacks
    .venv/bin/python bench/engine_prefill_itl.py --streams 1 --kv-layout per_slot  # one stream
    .venv/bin/python bench/engine_prefill_itl.py --side off       # without the side (side.py)
    .venv/bin/python bench/engine_prefill_itl.py --streams 6 --newcomers 2   # two at once
    .venv/bin/python bench/engine_prefill_itl.py --streams 6 --newcomers 2 --yield-to-waiting off,on
    .venv/bin/python bench/engine_prefill_itl.py --side on --worst 4   # what sets the p99

Each round: `--streams` streams decode (greedy, long answers); once each has given a few
tokens, a `--prompt`-token prompt arrives. Their TPOT is the median gap between their
tokens before it arrived; "during" is every gap that ended while it was in prefill (from
its arrival to its first token). The engine is called in process (no HTTP): this is the
scheduler's share. The goal: ITL p99 during the prefill <= 2x TPOT. The gaps' p99 before
the prompt came is printed too: the machine's own jitter, which no budget can remove.
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

from redline.bench.report import percentile  # noqa: E402
from redline.engine.budget import PrefillBudget, protected_streams  # noqa: E402
from redline.engine.engine import Engine  # noqa: E402
from redline.engine.llama import LlamaModel  # noqa: E402
from redline.models import bundled_path, served_path  # noqa: E402
from redline.types import Message, SamplingParams  # noqa: E402

TEXT = ("The harbour master kept a log of every ship that came in: its name, its cargo, the "
        "weather it met, and the hour it tied up. Read this log and answer the question. ")


def long_prompt(model: LlamaModel, n: int, tag: str = "") -> list[int]:
    tokens: list[int] = []
    text = tag
    while len(tokens) < n:
        text += TEXT
        tokens = model.tokenize(text, add_special=True)
    return tokens[:n]


async def decode_stream(engine: Engine, model: LlamaModel, i: int, sampling: SamplingParams,
                        stamps: list[list[float]], started: asyncio.Event, done: asyncio.Event,
                        warm_tokens: int) -> None:
    """Stream `i`: a story, its tokens' times into `stamps[i]`; sets `started` once every
    stream has `warm_tokens`, and stops when `done` is set (or the answer ends)."""
    q = model.tokenize(model.render_chat((Message("user", f"Tell story {i} about the sea."),)),
                       add_special=False)
    it = engine.generate(q, sampling)
    try:
        async for chunk in it:
            if chunk.tokens:
                stamps[i].append(time.perf_counter())
            if all(len(s) >= warm_tokens for s in stamps):
                started.set()
            if done.is_set():
                return
    finally:
        await it.aclose()  # type: ignore[attr-defined]


async def one_round(engine: Engine, model: LlamaModel, streams: int, prompts: list[list[int]],
                    warm_tokens: int, after: int = 400,
                    worst: int = 0
                    ) -> tuple[list[float], list[float], float, list[tuple[float, float, int]]]:
    """(gaps before the prompts came, gaps during their prefill, the last one's TTFT, the
    prefill's `worst` longest steps (`worst_steps`)); the streams end `after` tokens past
    the warm ones."""
    stamps: list[list[float]] = [[] for _ in range(streams)]
    started = asyncio.Event()
    long_sampling = SamplingParams(max_tokens=warm_tokens + after, temperature=0.0,
                                   ignore_eos=True)

    done = asyncio.Event()
    tasks = [asyncio.create_task(decode_stream(engine, model, i, long_sampling, stamps, started,
                                               done, warm_tokens)) for i in range(streams)]
    await started.wait()
    arrived = time.perf_counter()

    async def newcomer(prompt: list[int]) -> float:
        it = engine.generate(prompt, SamplingParams(max_tokens=2, temperature=0.0))
        await it.__anext__()
        at = time.perf_counter()
        await it.aclose()  # type: ignore[attr-defined]
        return at

    first = max(await asyncio.gather(*(newcomer(p) for p in prompts)))
    await asyncio.sleep(0.2)
    done.set()
    await asyncio.gather(*tasks)
    before, during = split_gaps(stamps, arrived, first)
    return before, during, first - arrived, worst_steps(stamps, arrived, first, worst)


def worst_steps(stamps: list[list[float]], arrived: float, first: float,
                n: int) -> list[tuple[float, float, int]]:
    """The `n` longest gaps during the prefill as steps: (gap, when it ended after the
    prompt came, how many streams' gaps end there). The streams' tokens of one step come
    together, so one slow step is one gap in each stream: with 7 streams and ~800 gaps,
    the p99 is the 8th longest gap, set by the second slowest step."""
    if n <= 0:
        return []
    gaps = sorted(((b - a, b) for s in stamps for a, b in zip(s, s[1:], strict=False)
                   if b > arrived and a < first), reverse=True)
    steps: list[tuple[float, float, int]] = []
    for gap, end in gaps:
        for i, (g, at, k) in enumerate(steps):
            if abs(arrived + at - end) < 0.002:  # this step's token in another stream
                steps[i] = (g, at, k + 1)
                break
        else:  # a new step; past the first n, its gaps only interleave with theirs
            if len(steps) < n:
                steps.append((gap, end - arrived, 1))
    return steps


def split_gaps(stamps: list[list[float]], arrived: float, first: float,
               steady: float = 0.0) -> tuple[list[float], list[float]]:
    """Each stream's gaps between tokens: (those that ended before the prompt `arrived`
    and began at `steady` or later, those that overlap its prefill, up to its `first`
    token)."""
    before: list[float] = []
    during: list[float] = []
    for s in stamps:
        for a, b in zip(s, s[1:], strict=False):
            if b <= arrived:
                if a >= steady:
                    before.append(b - a)
            elif a < first:  # overlaps the prefill
                during.append(b - a)
    return before, during


def print_table(first_column: str,
                got: dict[str, tuple[list[float], list[float], list[float]]]) -> None:
    """The Markdown table: one row per mode or server, from (before, during, TTFTs)."""
    print(f"| {first_column} | streams' TPOT (before) | ITL p99 before (no prefill) | ITL p50 "
          "during prefill | ITL p99 during prefill | p99 / TPOT | newcomer TTFT (median) |")
    print("|---|---|---|---|---|---|---|")
    for name, (before, during, ttfts) in got.items():
        tpot = statistics.median(before)
        p99, jitter = percentile(during, 99), percentile(before, 99)
        print(f"| {name} | {tpot * 1e3:.1f} ms | {jitter * 1e3:.1f} ms "
              f"({jitter / tpot:.2f}x) | {percentile(during, 50) * 1e3:.1f} ms | "
              f"{p99 * 1e3:.1f} ms | {p99 / tpot:.2f}x | {statistics.median(ttfts):.2f} s |")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=7)
    ap.add_argument("--prompt", type=int, default=1500)
    ap.add_argument("--newcomers", type=int, default=1, help="prompts that arrive together "
                    "(each its own text); 'during' lasts until the last one's first token, "
                    "and its TTFT is reported")
    ap.add_argument("--rounds", type=int, default=3, help="per mode, interleaved")
    ap.add_argument("--warm-tokens", type=int, default=16)
    ap.add_argument("--after-tokens", type=int, default=400, help="tokens the streams give "
                    "after the warm ones (few: they end during the prefill)")
    ap.add_argument("--worst", type=int, default=0, help="print each round's N longest steps "
                    "during the prefill (when, and how many streams' gaps each holds)")
    ap.add_argument("--weights", default="auto")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--slack", default="0.5", help="the adaptive budget's slack(s), comma-separated")
    ap.add_argument("--floor", default="8", help="the adaptive budget's floor(s) in tokens "
                    "(models[].prefill_floor_tokens), comma-separated")
    ap.add_argument("--protect-share", type=float, default=0.5, help="models[]."
                    "prefill_protect_share: the prompt is held back only while at least this "
                    "share of the --streams + 1 slots decode (7 of 8: it is)")
    ap.add_argument("--yield-to-waiting", default="on", help="models[].prefill_yield_to_waiting"
                    " for the adaptive modes ('on', the default config's; 'off'; 'off,on': "
                    "both): with two or more newcomers, 'on' lets them take the rest of the "
                    "batch in turn instead of holding them back")
    ap.add_argument("--kv-layout", choices=("unified", "per_slot"), default="unified")
    ap.add_argument("--side", default="off,on", help="adaptive modes without and with the "
                    "prompt computed on the side (models[].prefill_side, engine/side.py); "
                    "'nowait': on, but other held-back prompts run in small chunks while the "
                    "side is taken (what the engine did before they waited for it); "
                    "'norecall': on, but a prompt stays on the side when its streams end")
    args = ap.parse_args()
    slots = args.streams + args.newcomers
    protect = protected_streams(args.protect_share, slots)
    path = served_path(bundled_path("smollm2-135m-instruct", ROOT / ".redline" / "models"),
                       args.weights)
    model = LlamaModel(str(path))
    engine = Engine(model, n_ctx_per_seq=max(2048, args.prompt + 64), n_seq_max=slots,
                    n_batch=512, n_threads=args.threads, prefix_reuse=False,
                    kv_unified=args.kv_layout == "unified", side_prefill=True)
    side = engine.side
    prompts = [long_prompt(model, args.prompt, f"Log {j}. " if args.newcomers > 1 else "")
               for j in range(args.newcomers)]
    slacks = [float(x) for x in args.slack.split(",")]
    floors = [int(x) for x in args.floor.split(",")]
    modes: dict[str, tuple[float | None, int, str, bool]] = {"fixed": (None, 8, "off", False)}
    suffix = {"off": "", "on": " + side", "nowait": " + side, no wait",
              "norecall": " + side, no recall"}
    recall, poll = engine.scheduler.side_recall, engine._side_poll

    def poll_nowait() -> None:  # the side is used, but no prompt waits for it
        poll()
        engine.scheduler.side_busy = False

    yielding = [{"on": True, "off": False}[x] for x in args.yield_to_waiting.split(",")]
    for how in args.side.split(","):
        for value in slacks:
            for floor in floors:
                for waiting_first in yielding:
                    name = "adaptive" + (f" {value:g}" if len(slacks) > 1 else "") + (
                        f" floor {floor}" if len(floors) > 1 else "") + suffix[how] + (
                        (" yielding" if waiting_first else " held") if len(yielding) > 1
                        else "")
                    modes[name] = (value, floor, how, waiting_first)
    got: dict[str, tuple[list[float], list[float], list[float]]] = {
        m: ([], [], []) for m in modes}
    try:
        for r in range(args.rounds):
            for mode, (slack, floor, how, waiting_first) in modes.items():
                engine.scheduler.budget = PrefillBudget(512, slack, floor, protect,  # afresh
                                                        waiting_first)
                engine.side = side if how != "off" else None
                engine.scheduler.side_busy = False  # nothing on the side between rounds
                engine._side_poll = (  # type: ignore[method-assign]
                    poll_nowait if how == "nowait" else poll)
                engine.scheduler.side_recall = (  # type: ignore[method-assign]
                    (lambda: False) if how == "norecall" else recall)
                before, during, ttft, steps = await one_round(
                    engine, model, args.streams, prompts, args.warm_tokens, args.after_tokens,
                    args.worst)
                got[mode][0].extend(before)
                got[mode][1].extend(during)
                got[mode][2].append(ttft)
                print(f"round {r + 1} {mode}: TPOT {statistics.median(before) * 1e3:.1f} ms, "
                      f"ITL p99 during {percentile(during, 99) * 1e3:.1f} ms, "
                      f"newcomer TTFT {ttft:.2f} s", file=sys.stderr)
                if steps:
                    print("   longest steps during the prefill (gap, when after the prompt "
                          "came, streams' gaps it holds): " + ", ".join(
                              f"{g * 1e3:.0f} ms @ {at:.2f} s x{k}" for g, at, k in steps),
                          file=sys.stderr)
    finally:
        engine.side = side  # closed with the engine
        engine.close()
        model.close()
    what = (f"a {args.prompt}-token prompt arrives" if args.newcomers == 1 else
            f"{args.newcomers} prompts of {args.prompt} tokens arrive together (TTFT: the last's)")
    print(f"\n{args.streams} streams decoding, {what} "
          f"({path.name}, n_batch 512, KV {args.kv_layout}, held back beside {protect}+ "
          f"streams, {args.rounds} rounds per mode)\n")
    print_table("prefill budget", got)


if __name__ == "__main__":
    asyncio.run(main())
