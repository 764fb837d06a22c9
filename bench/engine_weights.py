"""Decode and prefill speed of the bundled SmolLM2 in several GGUF types, straight through
llama.cpp's low-level API (no scheduler, no HTTP): the numbers behind `weights: auto`.

    .venv/bin/python bench/engine_weights.py [--types as-shipped,BF16,F16,Q8_0,Q4_0]

For each type: 8 sequences prefilled together (one ~30-token chat prompt each), then 64
decode steps of 8 tokens, best of 3; then the same with 1 sequence. Converted files are
kept in the conversion cache (`redline.models.conversion_cache()`). Speed only: whether a
type keeps the model's quality is `redline optimize`'s question.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import llama_cpp as ll
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from redline.engine.llama import BatchEntry, LlamaModel  # noqa: E402
from redline.models import bundled_path, served_path  # noqa: E402

PROMPT = ("<|im_start|>user\nWrite a short story about a dragon and a knight who become "
          "friends.<|im_end|>\n<|im_start|>assistant\n")


def measure(m: LlamaModel, nseq: int, steps: int = 64, threads: int = 2) -> tuple[float, float]:
    """(decode tok/s, prefill ms) for `nseq` sequences, best of 3."""
    p = ll.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = 2048 * nseq, 512, 512, nseq
    p.n_threads = p.n_threads_batch = threads
    p.kv_unified, p.swa_full, p.no_perf = True, True, True
    ctx = ll.llama_init_from_model(m.model, p)
    b = ll.llama_batch_init(512, 0, 1)

    def dec(entries: list[BatchEntry]) -> None:
        for i, e in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i] = e.token, e.pos, 1
            b.seq_id[i][0], b.logits[i] = e.seq_id, int(e.logits)
        b.n_tokens = len(entries)
        assert ll.llama_decode(ctx, b) == 0

    prompt = m.tokenize(PROMPT, False, True)
    best = (0.0, float("inf"))
    try:
        for _ in range(3):
            ll.llama_memory_clear(ll.llama_get_memory(ctx), True)
            t0 = time.perf_counter()
            dec([BatchEntry(t, i, s, i == len(prompt) - 1) for s in range(nseq)
                 for i, t in enumerate(prompt)])
            t1 = time.perf_counter()
            for k in range(steps):
                dec([BatchEntry(100 + s, len(prompt) + k, s, True) for s in range(nseq)])
                for s in range(nseq):
                    np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, s), shape=(m.n_vocab,)).argmax()
            t2 = time.perf_counter()
            best = (max(best[0], nseq * steps / (t2 - t1)), min(best[1], (t1 - t0) * 1000))
    finally:
        ll.llama_batch_free(b)
        ll.llama_free(ctx)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="as-shipped,BF16,F16,Q8_0,Q4_0")
    args = ap.parse_args()
    src = bundled_path("smollm2-135m-instruct", ROOT / ".redline" / "models")
    print("type        8 seqs: decode tok/s  prefill ms | 1 seq: decode tok/s  prefill ms")
    for t in args.types.split(","):
        m = LlamaModel(str(served_path(src, t)))
        try:
            d8, p8 = measure(m, 8)
            d1, p1 = measure(m, 1)
        finally:
            m.close()
        print(f"{t:<11} {d8:20.1f} {p8:11.0f} | {d1:18.1f} {p1:11.0f}")


if __name__ == "__main__":
    main()
