"""What the host prompt cache costs against what it saves (engine/host_cache.py).

One llama.cpp context of the bundled SmolLM2 (as shipped, 2 threads): a `--tokens`-token
prompt is prefilled, then its KV state is copied out (`llama_state_seq_get_data`, what a
save does) and back into another sequence (`llama_state_seq_set_data`, what a restore
does) `--rounds` times. Prints the prefill's time next to the save's and restore's p50.

    .venv/bin/python bench/engine_host_cache.py [--tokens 600] [--rounds 10]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from redline.engine.llama import BatchEntry, LlamaModel, LlamaRunner
from redline.models import bundled_path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=600)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--models-dir", default=".redline/models")
    a = p.parse_args()
    model = LlamaModel(str(bundled_path("smollm2-135m-instruct", Path(a.models_dir))))
    runner = LlamaRunner(model, max(2048, a.tokens + 16), 2, 512, 2)
    words = "policy account service region billing support ticket customer order refund "
    tokens = model.tokenize(words * (a.tokens // 8 + 1), add_special=False)[:a.tokens]
    t0 = time.perf_counter()
    for start in range(0, len(tokens), 512):
        chunk = tokens[start:start + 512]
        runner.decode([BatchEntry(t, start + i, 0, False) for i, t in enumerate(chunk)])
    prefill = time.perf_counter() - t0
    saves, restores = [], []
    size = 0
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        state, size = runner.seq_state(0)
        saves.append(time.perf_counter() - t0)
        runner.seq_remove(1, -1, -1)
        t0 = time.perf_counter()
        if not runner.set_seq_state(1, state, size):
            raise SystemExit("llama.cpp refused the restore")
        restores.append(time.perf_counter() - t0)
    runner.close()
    model.close()
    print(json.dumps({"tokens": len(tokens), "state_mb": round(size / 1e6, 1),
                      "prefill_ms": round(prefill * 1000, 1),
                      "save_p50_ms": round(statistics.median(saves) * 1000, 2),
                      "restore_p50_ms": round(statistics.median(restores) * 1000, 2),
                      "prefill_over_restore": round(prefill / statistics.median(restores), 0)}))


if __name__ == "__main__":
    main()
