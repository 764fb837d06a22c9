"""Transformers variants (the optional `torch` extra): fp32 as the reference, bf16, and
torch's dynamic INT8 (Linear weights int8, activations quantized on the fly).

Dynamic INT8 is the trap the gate exists for (the issue that asked for this gate reports
SmolLM2's perplexity going from 12.3 to 65 under it, while bf16 kept it). torch marks its quantized tensors as
deprecated; the warning is silenced here and the variant kept because it is still the
one-line INT8 that people reach for.
"""

from __future__ import annotations

import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from redline.optimize.evalset import EvalSet
from redline.optimize.gate import Gate
from redline.optimize.ladder import Candidate, Report, run_ladder
from redline.optimize.runner import TokenScores, logsumexp_rows

HF_LADDER = ("bf16", "int8-dynamic")


def _torch() -> Any:
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        raise RuntimeError("the transformers path needs the torch extra: "
                           "pip install 'redline[torch]'") from exc
    return torch


class HfRunner:
    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.torch = _torch()
        self.model, self.tok = model.eval(), tokenizer

    def tokenize(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def _with_bos(self, ids: list[int]) -> list[int]:
        bos = self.tok.bos_token_id
        return [bos, *ids] if bos is not None else list(ids)

    def _logits(self, ids: list[int]) -> np.ndarray:
        with self.torch.inference_mode():
            out = self.model(self.torch.tensor([ids]))
        logits: np.ndarray = out.logits[0].float().numpy()  # [len(ids), vocab]
        return logits

    def score(self, window: list[int]) -> TokenScores:
        feed = self._with_bos(window)
        skip = len(feed) - len(window)
        rows = self._logits(feed)[skip:len(feed) - 1]
        targets = np.asarray(window[1:])
        nll = logsumexp_rows(rows) - rows[np.arange(len(targets)), targets]
        return TokenScores(nll.astype(np.float64), rows.argmax(axis=-1).astype(np.int64))

    def _question_ids(self, question: str) -> list[int]:
        if getattr(self.tok, "chat_template", None):
            ids = self.tok.apply_chat_template([{"role": "user", "content": question}],
                                               add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if isinstance(ids, dict) else ids)
        return self._with_bos(self.tokenize(f"Question: {question}\nAnswer:"))

    def answer(self, questions: list[str], max_tokens: int) -> list[str]:
        out = []
        for q in questions:
            ids = self._question_ids(q)
            new = self._greedy(ids, max_tokens, stop_newline=True)
            out.append(self.tok.decode(new, skip_special_tokens=True).strip().split("\n")[0])
        return out

    def _greedy(self, ids: list[int], n: int, stop_newline: bool = False) -> list[int]:
        torch = self.torch
        new: list[int] = []
        with torch.inference_mode():
            out = self.model(torch.tensor([ids]), use_cache=True)
            for _ in range(n):
                token = int(out.logits[0, -1].argmax())
                if stop_newline and (token == self.tok.eos_token_id
                                     or "\n" in self.tok.decode(new + [token]).lstrip()):
                    break
                new.append(token)
                out = self._step(torch.tensor([[token]]), out)
        return new

    def _step(self, token: Any, out: Any) -> Any:
        # transformers 5 calls the KV cache `cache`; older releases `past_key_values`
        if hasattr(out, "cache"):
            return self.model(token, cache=out.cache, use_cache=True)
        return self.model(token, past_key_values=out.past_key_values, use_cache=True)

    def timed_generate(self, ids: list[int], n_new: int) -> tuple[float, float]:
        torch = self.torch
        with torch.inference_mode():
            t0 = time.perf_counter()
            out = self.model(torch.tensor([self._with_bos(ids)]), use_cache=True)
            token = out.logits[0, -1].argmax().view(1, 1)
            t1 = time.perf_counter()
            for _ in range(n_new):
                out = self._step(token, out)
                token = out.logits[0, -1].argmax().view(1, 1)
        return t1 - t0, time.perf_counter() - t1

    def memory_bytes(self) -> int:
        return _state_bytes(self.model.state_dict())

    def close(self) -> None:
        self.model = None


def _state_bytes(state: dict[str, Any]) -> int:
    torch = _torch()
    total = 0
    for v in state.values():
        for t in v if isinstance(v, tuple) else (v,):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _load(model_dir: Path, n_threads: int) -> tuple[Any, Any]:
    torch = _torch()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if n_threads:
        torch.set_num_threads(n_threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(model_dir)


class HfCandidate:
    """`fp32` (the reference: the folder as it is), `bf16` or `int8-dynamic`."""

    def __init__(self, model_dir: Path, name: str, work_dir: Path, n_threads: int = 0) -> None:
        if name not in ("fp32", *HF_LADDER):
            raise ValueError(f"unknown transformers variant {name!r}; try {', '.join(HF_LADDER)}")
        self.src, self.name, self.n_threads = model_dir, name, n_threads
        self.path = model_dir if name == "fp32" else work_dir / f"{model_dir.name}-{name}"
        self.kind = {"fp32": "torch.float32", "bf16": "torch.bfloat16",
                     "int8-dynamic": "qint8 Linear + fp32"}[name]

    def open(self) -> HfRunner:
        torch = _torch()
        model, tok = _load(self.src, self.n_threads)
        if self.name == "bf16":
            model = model.to(torch.bfloat16)
            model.save_pretrained(self.path)
            tok.save_pretrained(self.path)
        elif self.name == "int8-dynamic":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch deprecates quantized tensors (see above)
                model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear},
                                                               dtype=torch.qint8)
            # not a save_pretrained format: the whole module, for torch.load(weights_only=False)
            self.path.mkdir(parents=True, exist_ok=True)
            torch.save(model, self.path / "model.pt")
            tok.save_pretrained(self.path)
        return HfRunner(model, tok)

    def file_bytes(self) -> int:
        return _dir_bytes(self.path)

    def write(self, out_dir: Path) -> Path:
        if self.name == "fp32":
            return self.path
        dest = out_dir / self.path.name
        if dest != self.path:
            shutil.rmtree(dest, ignore_errors=True)
            shutil.move(self.path, dest)
        self.path = dest
        return dest

    def discard(self) -> None:
        if self.name != "fp32" and self.path.parent.name == ".variants":
            shutil.rmtree(self.path, ignore_errors=True)


def optimize_hf(model_dir: Path, out_dir: Path, gate: Gate, ev: EvalSet, names: list[str],
                model: str | None = None, n_threads: int = 0) -> Report:
    work = out_dir / ".variants"
    ref = HfCandidate(model_dir, "fp32", work, n_threads)
    variants: list[Candidate] = [HfCandidate(model_dir, n, work, n_threads) for n in names]
    notes = ["int8-dynamic is written as a pickled module (model.pt, torch.load with "
             "weights_only=False); bf16 as a save_pretrained folder."]
    report = run_ladder(model or model_dir.name, ref, variants, ev, gate, out_dir, notes,
                        str(model_dir))
    shutil.rmtree(work, ignore_errors=True)
    return report
