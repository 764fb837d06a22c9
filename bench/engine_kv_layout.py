"""What the other sequences' cells cost a step, with llama.cpp's one unified KV buffer
(redline's layout: slots share cells, so a prefix is reused by a metadata copy) and with
one KV stream per sequence (llama-server's with `-np 8`), on the bundled SmolLM2.

In the unified buffer every token of a step attends over every cell in use: flash
attention skips the other sequences' cells, but only after reading their mask entries,
so a step's attention grows with all the cells the slots hold, not with its own. With
long prompts at several streams (`bench/engine_peer.py --workloads long`) that is most
of a step. Each round, for each layout (alternating which goes first), one sequence
holds `--own` cells and measures a `--chunk`-token prompt chunk and a one-token decode,
first alone, then with the `--others` other sequences holding `--held` cells each; then
all of them decode one token together, then every other one (with one KV stream per
sequence, with and without the runner's throwaway tokens between them).

    .venv/bin/python bench/engine_kv_layout.py                  # 7 others x 1,600 cells
    .venv/bin/python bench/engine_kv_layout.py --held 300 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redline.engine.llama import BatchEntry, LlamaModel, LlamaRunner  # noqa: E402
from redline.models import bundled_path, served_path  # noqa: E402


def fill(r: LlamaRunner, seq: int, n: int, salt: int) -> None:
    for s in range(0, n, r.n_batch):
        r.decode([BatchEntry(100 + (salt + i) % 40_000, i, seq, False)
                  for i in range(s, min(n, s + r.n_batch))])


def timed(r: LlamaRunner, entries: list[BatchEntry]) -> float:
    """Seconds of one forward pass; its cells are removed after (the next one repeats it)."""
    t = time.perf_counter()
    r.decode(entries)
    dt = time.perf_counter() - t
    for e in entries:
        r.seq_remove(e.seq_id, e.pos, -1)
    return dt


def measure(r: LlamaRunner, args: argparse.Namespace) -> dict[str, float]:
    own, chunk = args.own, args.chunk
    r.clear()
    fill(r, 0, own, 7)
    step = [BatchEntry(1000 + i, own + i, 0, i == chunk - 1) for i in range(chunk)]
    one = [BatchEntry(500, own, 0, True)]
    out = {"chunk alone": min(timed(r, step) for _ in range(2)),
           "decode alone": min(timed(r, one) for _ in range(5))}
    for s in range(1, args.others + 1):
        fill(r, s, args.held, 1000 * s)
    out["chunk, others held"] = min(timed(r, step) for _ in range(2))
    out["decode, others held"] = min(timed(r, one) for _ in range(5))
    every = [BatchEntry(500, own, 0, True)] + [BatchEntry(500, args.held, s, True)
                                                for s in range(1, args.others + 1)]
    out["all decode together"] = min(timed(r, every) for _ in range(3))
    # every other slot decoding (slots freed and taken again leave holes): per sequence,
    # llama.cpp makes a forward pass of each run of consecutive ids, unless the runner
    # pads the holes with a throwaway token each (`pads`), which it does by default
    half = [e for e in every if e.seq_id % 2 == 0]
    out["every other slot decodes"] = min(timed(r, half) for _ in range(3))
    if not r.unified:
        pads = r._pads
        r._pads = lambda entries: []  # type: ignore[method-assign]
        out["the same, no pads"] = min(timed(r, half) for _ in range(3))
        r._pads = pads  # type: ignore[method-assign]
    else:
        out["the same, no pads"] = out["every other slot decodes"]  # no passes to join
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default=None,
                    help="a GGUF file (default: SmolLM2 as `weights: auto` serves it)")
    ap.add_argument("--own", type=int, default=1024, help="cells the measured sequence holds")
    ap.add_argument("--chunk", type=int, default=512, help="prompt tokens in the measured chunk")
    ap.add_argument("--others", type=int, default=7)
    ap.add_argument("--held", type=int, default=1600, help="cells each other sequence holds")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    path = args.model or str(served_path(bundled_path("smollm2-135m-instruct",
                                                      ROOT / ".redline" / "models"), "auto"))
    model = LlamaModel(path)
    slots = args.others + 1
    runners = {name: LlamaRunner(model, 2048, slots, 512, args.threads, kv_unified=unified)
               for name, unified in (("unified", True), ("per sequence", False))}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in runners}
    for k in range(args.rounds):
        for name in (list(runners) if k % 2 == 0 else list(reversed(runners))):
            results[name].append(measure(runners[name], args))
            print(f"round {k + 1} {name}: " + ", ".join(
                f"{key} {v * 1000:.1f} ms" for key, v in results[name][-1].items()), flush=True)
    print(f"\n{Path(path).name}, {args.threads} threads; the measured sequence holds {args.own} "
          f"cells; {args.others} others hold {args.held} each; medians of {args.rounds} rounds (ms)")
    keys = list(results["unified"][0])
    print("| layout | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for name, rows in results.items():
        print(f"| {name} | " + " | ".join(f"{statistics.median(r[key] for r in rows) * 1000:.1f}"
                                          for key in keys) + " |")
    for r in runners.values():
        r.close()
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
