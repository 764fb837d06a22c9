"""A llama.cpp model measured directly on the low-level API: one context, logits for
every position of a window (perplexity), batched greedy answers, timed generation."""

from __future__ import annotations

import time
from pathlib import Path

import llama_cpp as ll
import numpy as np

from redline.engine.llama import BatchEntry, LlamaModel, LlamaRunner
from redline.optimize.runner import TokenScores, logsumexp_rows
from redline.types import Message


class GgufRunner:
    def __init__(self, path: Path, n_threads: int = 0, n_ctx_per_seq: int = 384,
                 n_seq: int = 16) -> None:
        self.path = path
        self.model = LlamaModel(str(path), "auto")
        self.n_seq = n_seq
        self.ctx = LlamaRunner(self.model, n_ctx_per_seq=n_ctx_per_seq, n_seq_max=n_seq,
                               n_batch=512, n_threads=n_threads)

    def tokenize(self, text: str) -> list[int]:
        return self.model.tokenize(text, add_special=False, parse_special=False)

    def _with_bos(self, ids: list[int]) -> list[int]:
        bos = ll.llama_vocab_bos(self.model.vocab)
        return [bos, *ids] if self.model.add_bos and bos >= 0 else list(ids)

    def score(self, window: list[int]) -> TokenScores:
        feed = self._with_bos(window)
        skip = len(feed) - len(window)  # row r predicts feed[r + 1]; window[1:] ← rows skip..
        self.ctx.clear()
        self.ctx.decode([BatchEntry(t, i, 0, i >= skip) for i, t in enumerate(feed)])
        # rows: [len(window) - 1, vocab]
        rows = np.stack([self.ctx.logits(r).copy() for r in range(skip, len(feed) - 1)])
        targets = np.asarray(window[1:])
        nll = logsumexp_rows(rows) - rows[np.arange(len(targets)), targets]
        return TokenScores(nll.astype(np.float64), rows.argmax(axis=-1).astype(np.int64))

    def _question_ids(self, question: str) -> list[int]:
        # a chat model is asked in its own template (else it answers in template tokens)
        if self.model.has_chat_template:
            text = self.model.render_chat((Message("user", question),))
            return self.model.tokenize(text, add_special=False, parse_special=True)
        return self._with_bos(self.tokenize(f"Question: {question}\nAnswer:"))

    def answer(self, prompts: list[str], max_tokens: int) -> list[str]:
        out: list[str] = []
        for i in range(0, len(prompts), self.n_seq):
            out += self._answer_group(prompts[i:i + self.n_seq], max_tokens)
        return out

    def _answer_group(self, prompts: list[str], max_tokens: int) -> list[str]:
        # shapes: one sequence per prompt; each step decodes one token of every open sequence
        self.ctx.clear()
        pos, nxt = [], []
        for seq, p in enumerate(prompts):
            ids = self._question_ids(p)
            self.ctx.decode([BatchEntry(t, j, seq, j == len(ids) - 1) for j, t in enumerate(ids)])
            nxt.append(int(self.ctx.logits(len(ids) - 1).argmax()))
            pos.append(len(ids))
        pieces: list[list[bytes]] = [[] for _ in prompts]
        open_ = set(range(len(prompts)))
        for _ in range(max_tokens):
            for seq in list(open_):
                if self.model.is_eog(nxt[seq]):
                    open_.discard(seq)
                    continue
                pieces[seq].append(self.model.piece(nxt[seq]))
                if b"\n" in b"".join(pieces[seq]).lstrip():
                    open_.discard(seq)
            if not open_:
                break
            order = sorted(open_)
            self.ctx.decode([BatchEntry(nxt[s], pos[s], s, True) for s in order])
            for i, s in enumerate(order):
                nxt[s] = int(self.ctx.logits(i).argmax())
                pos[s] += 1
        return [b"".join(p).decode("utf-8", errors="replace").strip().split("\n")[0]
                for p in pieces]

    def timed_generate(self, ids: list[int], n_new: int) -> tuple[float, float]:
        feed = self._with_bos(ids)
        self.ctx.clear()
        t0 = time.perf_counter()
        self.ctx.decode([BatchEntry(t, i, 0, i == len(feed) - 1) for i, t in enumerate(feed)])
        token = int(self.ctx.logits(len(feed) - 1).argmax())
        t1 = time.perf_counter()
        for i in range(n_new):
            self.ctx.decode([BatchEntry(token, len(feed) + i, 0, True)])
            token = int(self.ctx.logits(0).argmax())
        return t1 - t0, time.perf_counter() - t1

    def memory_bytes(self) -> int:
        return int(ll.llama_model_size(self.model.model))

    def file_type(self) -> str:
        from redline.optimize.gguf import file_type

        return file_type(self.model.model)

    def close(self) -> None:
        self.ctx.close()
        self.model.close()
