"""A thin, typed wrapper over llama.cpp's low-level C API (llama-cpp-python's ctypes).

Only the scheduler thread touches a `LlamaRunner`; tokenize/detokenize are
read-only on the vocabulary and safe from any thread.
"""

from __future__ import annotations

import ctypes
import functools
import json
import mmap
import os
from dataclasses import dataclass
from typing import Any

import jinja2
import llama_cpp as ll
import numpy as np

from redline.engine import compute
from redline.engine.template import ChatTemplate
from redline.errors import InvalidRequest
from redline.types import Message

_BACKEND_READY = False
# ctypes callbacks must outlive their registration: the log callback is kept here
_KEPT_CALLBACKS: list[object] = []


def _quiet_logs() -> None:
    global _BACKEND_READY
    if _BACKEND_READY:
        return

    @ll.llama_log_callback
    def _drop(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        return None

    _KEPT_CALLBACKS.append(_drop)
    ll.llama_log_set(_drop, ctypes.c_void_p())
    ll.llama_backend_init()
    _BACKEND_READY = True


@dataclass(frozen=True)
class BatchEntry:
    """One token to feed: its sequence, position, and whether we need its logits."""

    token: int
    pos: int
    seq_id: int
    logits: bool


class LlamaModel:
    """Model weights + vocabulary: tokenize, detokenize, chat template."""

    def __init__(self, path: str, chat_template: str = "auto") -> None:
        _quiet_logs()
        params = ll.llama_model_default_params()
        params.n_gpu_layers = 0
        self.path = path
        self.model = ll.llama_model_load_from_file(path.encode(), params)
        if not self.model:
            raise FileNotFoundError(f"llama.cpp could not load {path}")
        self.vocab = ll.llama_model_get_vocab(self.model)
        self.n_vocab = ll.llama_vocab_n_tokens(self.vocab)
        self.n_ctx_train = ll.llama_model_n_ctx_train(self.model)
        self.add_bos = bool(ll.llama_vocab_get_add_bos(self.vocab))
        self.bos = int(ll.llama_vocab_bos(self.vocab))
        self._template = self._resolve_template(chat_template)

    def _resolve_template(self, choice: str) -> bytes | None:
        """llama.cpp's built-in template for `choice` (`builtin`/`auto`: the one it
        recognises in the file's Jinja text); with `auto`, the Jinja text itself is
        compiled too (`self.jinja`), and it is what renders a chat."""
        self.jinja: ChatTemplate | None = None
        if choice not in ("auto", "builtin"):
            return choice.encode()
        tmpl = ll.llama_model_chat_template(self.model, None)
        if tmpl and choice == "auto":
            try:
                self.jinja = self._compiled(tmpl.decode("utf-8", errors="replace"))
            except jinja2.TemplateError:  # not Jinja that compiles: the built-in one renders
                self.jinja = None
        return tmpl if tmpl else None

    def special_text(self, token: int) -> str:
        """A control token's text ("" for none), as a template writes `bos_token`."""
        if token < 0:
            return ""
        return token_piece(self.vocab, token, special=True).decode("utf-8", errors="replace")

    def compile_template(self, source: str) -> ChatTemplate:
        """A request's own chat template (`chat_template`), with this model's tokens; a 400
        where it does not compile."""
        try:
            return self._compiled(source)
        except jinja2.TemplateError as exc:
            raise InvalidRequest(f"chat_template does not compile: {exc}",
                                 param="chat_template") from exc

    def _compiled(self, source: str) -> ChatTemplate:
        """`source` compiled with this model's BOS and EOS text (TemplateError if it does
        not compile)."""
        return ChatTemplate(source, self.special_text(ll.llama_vocab_bos(self.vocab)),
                            self.special_text(ll.llama_vocab_eos(self.vocab)))

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None or self.jinja is not None

    @property
    def renders_tools(self) -> bool:
        """Whether the model's own template writes a tool prompt and tool-call turns."""
        return self.jinja is not None and self.jinja.renders_tools

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self.vocab, token))

    def fill_in_middle(self, prefix: str, suffix: str) -> list[int]:
        """The prompt that asks for what goes between `prefix` and `suffix`, in the FIM
        tokens the model was trained with (prefix, suffix, middle: the order llama.cpp's
        server and Qwen2.5-Coder use); a 400 for a model that has none."""
        pre, suf, mid = (ll.llama_vocab_fim_pre(self.vocab), ll.llama_vocab_fim_suf(self.vocab),
                         ll.llama_vocab_fim_mid(self.vocab))
        if min(pre, suf, mid) < 0:
            raise InvalidRequest("suffix: this model has no fill-in-the-middle tokens.",
                                 param="suffix")
        bos = [ll.llama_vocab_bos(self.vocab)] if self.add_bos else []
        return [*bos, pre, *self.tokenize(prefix, add_special=False, parse_special=False), suf,
                *self.tokenize(suffix, add_special=False, parse_special=False), mid]

    @functools.cached_property
    def eog_ids(self) -> np.ndarray:
        """Every end-of-generation token (EOS, EOT, ...): what vLLM's min_tokens holds back."""
        return np.array([t for t in range(self.n_vocab) if self.is_eog(t)], dtype=np.int64)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return tokenize(self.vocab, text.encode("utf-8"), add_special, parse_special)

    def piece(self, token: int, special: bool = False) -> bytes:
        return token_piece(self.vocab, token, special)

    def render_chat(self, messages: tuple[Message, ...], add_generation_prompt: bool = True,
                    continue_final: bool = False, tools: list[dict[str, Any]] | None = None,
                    kwargs: dict[str, Any] | None = None,
                    template: ChatTemplate | None = None) -> str:
        """The conversation in the model's chat template (or `template`, a request's own),
        the assistant's turn opened (`add_generation_prompt`), or the final message left
        open for the model to go on with (`continue_final`: vLLM's
        `continue_final_message`). `tools` (function specs) and `kwargs`
        (`chat_template_kwargs`) go to a Jinja template only."""
        if continue_final and add_generation_prompt:
            raise InvalidRequest("Cannot set both `continue_final_message` and "
                                 "`add_generation_prompt` to true.", param="continue_final_message")
        jinja = template or self.jinja
        if jinja is not None:
            text = jinja.render([_as_dict(m) for m in messages], add_generation_prompt,
                                tools, kwargs)
        else:
            if tools:
                raise AssertionError("tools go to a template that renders them")
            text = self._render_builtin(messages, add_generation_prompt)
        if continue_final and messages:
            # cut after the final message's text, as vLLM does: its end-of-turn goes
            end = text.rfind(messages[-1].content)
            if end < 0:
                raise InvalidRequest("continue_final_message: the chat template does not "
                                     "write the final message's text as sent.",
                                     param="continue_final_message")
            text = text[:end + len(messages[-1].content)]
        return text

    def _render_builtin(self, messages: tuple[Message, ...], add_generation_prompt: bool) -> str:
        if self._template is None:
            raise InvalidRequest(
                "this model has no chat template; use /v1/completions", param="model"
            )
        arr = (ll.llama_chat_message * len(messages))()
        keep = []  # the C structs borrow these bytes
        for i, m in enumerate(messages):
            role, content = m.role.encode(), m.content.encode()
            keep += [role, content]
            arr[i].role = role
            arr[i].content = content
        size = 4096 + sum(len(m.content) * 2 for m in messages)
        buf = ctypes.create_string_buffer(size)
        n = ll.llama_chat_apply_template(self._template, arr, len(messages),
                                         add_generation_prompt, buf, size)
        if n > size:
            buf = ctypes.create_string_buffer(n)
            n = ll.llama_chat_apply_template(self._template, arr, len(messages),
                                             add_generation_prompt, buf, n)
        if n < 0:
            raise InvalidRequest(f"chat template {self._template!r} is not supported", param="model")
        return buf.raw[:n].decode("utf-8", errors="replace")

    def close(self) -> None:
        if self.model:
            ll.llama_model_free(self.model)
            self.model = None


def _as_dict(m: Message) -> dict[str, Any]:
    """A message as a chat template reads it (OpenAI's shape; a call's arguments as an
    object where they are one, as vLLM and llama.cpp's server give them to templates,
    which write them with `tojson`)."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                             for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def _arguments(text: str) -> Any:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def tokenize(vocab: Any, data: bytes, add_special: bool, parse_special: bool) -> list[int]:
    """`data`'s tokens in `vocab` (what a sampler, which has the vocabulary and no model,
    calls too)."""
    cap = len(data) + 8
    buf = (ll.llama_token * cap)()
    n = ll.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
    if n < 0:  # buffer too small: -n is the size needed
        cap = -n
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
    return list(buf[:n])


def token_piece(vocab: Any, token: int, special: bool = False) -> bytes:
    """`token`'s text; `special`: control tokens written out, as llama.cpp's grammar reads
    them (without, they are empty, as a detokenized answer has them)."""
    buf = ctypes.create_string_buffer(64)
    n = ll.llama_token_to_piece(vocab, token, buf, 64, 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = ll.llama_token_to_piece(vocab, token, buf, -n, 0, special)
    return buf.raw[:n]


# KV state copies of this size and more go into pages mapped and touched at once
# (MAP_POPULATE). numpy asks for transparent huge pages for large arrays (madvise), and
# where the kernel then compacts memory on the first touch (THP `defrag: madvise`, the
# default on many distributions, this VM's) a fresh 10 MB `np.empty` took 20-28 ms to
# fill with a slot's state, populated pages 4-6 ms (np.empty without the madvise 6-7 ms):
# the host cache's copy of a 453-token slot sat on a newcomer's first step (session 32)
POPULATE_MIN = 1 << 20


def fresh_buffer(n: int) -> np.ndarray:
    """A writable uint8 buffer of `n` bytes, its pages in place when it is large."""
    if n >= POPULATE_MIN and hasattr(mmap, "MAP_POPULATE"):
        mem = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_POPULATE)
        return np.frombuffer(mem, dtype=np.uint8)  # the array keeps the mapping open
    return np.empty(n, dtype=np.uint8)


def _bytes_ptr(buf: np.ndarray) -> Any:
    return buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))


STATE_MAGIC = 0xAF143CD8  # llama.cpp's sequence state begins with it, then the seq id


def restream(state: np.ndarray, size: int, streams: int) -> tuple[np.ndarray, int] | None:
    """One sequence's KV state (`LlamaRunner.seq_state`) for a context with `streams` KV
    streams, or None when it is not one sequence's state in the layout this reads.
    llama.cpp writes a magic number and the sequence id, the context's stream count, then
    for each stream a cell count and, where it is not 0, those cells. It reads a
    sequence's cells into that sequence's own stream whichever stream wrote them, but
    refuses a state whose stream count is not its own: so a per-slot context's state (1
    stream of 8 holding cells) and a one-stream context's (engine/side.py) differ only in
    the empty streams' zero counts. Rewritten in `state`'s own memory where it has room
    (tens of MB: a fresh copy costs page faults, ~70 ms here), so `state` is spent;
    else copied into a `fresh_buffer`."""
    if size % 4 or size < 16:
        return None
    words = state[:size].view(np.uint32)
    if words[0] != STATE_MAGIC or words[2] < 1:
        return None
    had = int(words[2])
    lead = 0  # empty streams before the one with cells
    while lead < had and 3 + lead < len(words) and words[3 + lead] == 0:
        lead += 1
    trail = had - 1 - lead  # and after it: their zero counts end the state
    if lead == had or (trail and np.any(words[len(words) - trail:])):
        return None
    head = np.array([words[0], words[1], streams], dtype=np.uint32).view(np.uint8)
    start, end = 4 * lead, size - 4 * trail  # the head goes right before the cells
    out_size = end - start + 4 * (streams - 1)
    if start + out_size > len(state):  # no room after them for the zero counts
        out = fresh_buffer(out_size)
        out[:12] = head
        out[12:end - start] = state[start + 12:end]
        out[end - start:] = 0
        return out, out_size
    state[start:start + 12] = head
    state[end:end + 4 * (streams - 1)] = 0
    return state[start:start + out_size], out_size


# a throwaway token (`pads`) costs about this fraction of a forward pass (SmolLM2 on 2
# cores: 1.3-2 ms a token, ~9 ms a pass)
PADS_PER_PASS = 4


def forward_passes(counts: dict[int, int], n_ubatch: int) -> int:
    """How many forward passes llama.cpp makes of a batch with `counts[seq]` tokens of each
    sequence when each has its own KV stream: a pass takes a run of consecutive sequence
    ids, from the lowest with tokens left, and as many tokens of each as the one with
    fewest has left (its `split_equal`, sequential)."""
    left = {s: n for s, n in sorted(counts.items()) if n > 0}
    passes = 0
    while left:
        ids = list(left)
        run = [ids[0]]
        for s in ids[1:]:
            if s != run[-1] + 1:
                break
            run.append(s)
        take = min(min(left[s] for s in run), max(1, n_ubatch // len(run)))
        for s in run:
            left[s] -= take
            if not left[s]:
                del left[s]
        passes += 1
    return passes


def pads(counts: dict[int, int], n_ubatch: int, room: int) -> dict[int, int]:
    """Throwaway tokens to append to sequences of a batch (`counts[seq]` tokens each) where
    they save forward passes (`forward_passes`), each pass saved paying for at most
    `PADS_PER_PASS` of them, `room` in all: first one in each sequence between two of
    the batch's (decoding slots 0, 2, 4 and 6 take four passes, or one with a token in
    1, 3 and 5), then the sequences with counts in a range brought up to its top (eight
    prompts of 40 to 47 tokens take eight passes, or one with 28 tokens more)."""
    ids = sorted(counts)
    have = dict(counts)
    best = forward_passes(have, n_ubatch)
    added = 0
    for a, b in zip(ids, ids[1:], strict=False):
        gap = range(a + 1, b)
        if not gap or added + len(gap) > room:
            continue
        trial = have | {s: 1 for s in gap}
        passes = forward_passes(trial, n_ubatch)
        if passes < best and len(gap) <= PADS_PER_PASS * (best - passes):
            have, best, added = trial, passes, added + len(gap)
    while best > 1:
        levels = sorted(set(have.values()))
        choice = None  # (trial, passes, cost, gain)
        for i, low in enumerate(levels):
            for high in levels[i + 1:]:
                raised = [s for s, n in have.items() if low <= n < high]
                cost = sum(high - have[s] for s in raised)
                if added + cost > room:
                    break
                trial = have | {s: high for s in raised}
                passes = forward_passes(trial, n_ubatch)
                gain = PADS_PER_PASS * (best - passes) - cost
                if passes < best and gain >= 0 and (choice is None or gain > choice[3]):
                    choice = (trial, passes, cost, gain)
        if choice is None:
            break
        have, best, added = choice[0], choice[1], added + choice[2]
    return {s: n - counts.get(s, 0) for s, n in have.items() if n > counts.get(s, 0)}


class LlamaRunner:
    """One llama.cpp context with `n_seq_max` sequences over one unified KV buffer,
    so that sequences can share cells (prefix reuse is a metadata copy); or, with
    `kv_unified` False, one KV stream per sequence (config `kv_layout: per_slot`): each
    attends over its own cells only. llama.cpp then splits a batch into forward passes
    of consecutive sequence ids with as many tokens each, so `decode` orders the batch by
    sequence (and maps `logits` indices back), appends throwaway tokens where they save
    passes (`pads`), and a copy between sequences copies the whole stream, then drops
    what was not asked for."""

    def __init__(self, model: LlamaModel, n_ctx_per_seq: int, n_seq_max: int, n_batch: int,
                 n_threads: int, kv_unified: bool = True, here: bool = False) -> None:
        self.model = model
        # here: passes run on the calling thread (the side's own, engine/side.py), with
        # all `n_threads`; else on the compute thread, with what the side leaves
        self.here = here
        self.n_seq_max = n_seq_max
        self.n_batch = n_batch
        params = ll.llama_context_default_params()
        params.n_ctx = n_ctx_per_seq * n_seq_max
        params.n_batch = n_batch
        params.n_ubatch = n_batch
        params.n_seq_max = n_seq_max
        threads = n_threads or os.cpu_count() or 1
        params.n_threads = threads
        params.n_threads_batch = threads
        self.threads = self._threads_now = threads
        self.unified = kv_unified
        self.n_stream = 1 if kv_unified else n_seq_max  # KV streams (restream)
        params.kv_unified = kv_unified
        params.swa_full = True  # partial removal from SWA caches needs the full cache
        params.no_perf = True
        self.ctx = ll.llama_init_from_model(model.model, params)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.n_ctx = ll.llama_n_ctx(self.ctx)
        self.n_ctx_seq = n_ctx_per_seq
        self.mem = ll.llama_get_memory(self.ctx)
        self._batch = ll.llama_batch_init(n_batch, 0, 1)
        self._row: list[int] | None = None  # per stream: entry index -> its row in the batch

    def decode(self, entries: list[BatchEntry]) -> None:
        """Run one forward pass; entries with logits=True can then be sampled by index."""
        b = self._batch
        self._row = None
        pads: list[BatchEntry] = []
        if not self.unified:  # each sequence's tokens together, sequences in id order
            pads = self._pads(entries)
            rows = entries + pads
            order = sorted(range(len(rows)), key=lambda i: rows[i].seq_id)
            if order[:len(entries)] != list(range(len(entries))):
                self._row = [0] * len(entries)
                for row, i in enumerate(order):
                    if i < len(entries):
                        self._row[i] = row
            entries = [rows[i] for i in order]
        for i, e in enumerate(entries):
            b.token[i] = e.token
            b.pos[i] = e.pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = e.seq_id
            b.logits[i] = 1 if e.logits else 0
        b.n_tokens = len(entries)
        try:
            if self.here:
                rc = ll.llama_decode(self.ctx, b)
            else:
                # on the process's one compute thread: one OpenMP team for all models, less
                # the threads a prompt computed on the side holds now (compute.py)
                want = compute.threads(self.threads)
                if want != self._threads_now:
                    ll.llama_set_n_threads(self.ctx, want, want)
                    self._threads_now = want
                rc = compute.run(ll.llama_decode, self.ctx, b)
        finally:
            for pad in pads:  # a pad's cell is nobody's token
                ll.llama_memory_seq_rm(self.mem, pad.seq_id, pad.pos, pad.pos + 1)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with {rc} (KV cache full?)")

    def _pads(self, entries: list[BatchEntry]) -> list[BatchEntry]:
        """The throwaway tokens `pads` adds to this batch, each at its sequence's next
        position (their cells are removed after the pass)."""
        counts: dict[int, int] = {}
        nxt: dict[int, int] = {}
        for e in entries:
            counts[e.seq_id] = counts.get(e.seq_id, 0) + 1
            nxt[e.seq_id] = max(nxt.get(e.seq_id, 0), e.pos + 1)
        out = []
        for seq, k in pads(counts, self.n_batch, self.n_batch - len(entries)).items():
            pos = nxt[seq] if seq in nxt else self.seq_pos_max(seq) + 1
            if pos + k <= self.n_ctx_seq:  # its stream has the cells
                out += [BatchEntry(0, pos + i, seq, False) for i in range(k)]
        return out

    def logits(self, index: int) -> np.ndarray:
        """Logits of batch entry `index`: [n_vocab] float32, a view valid until the next decode."""
        ptr = ll.llama_get_logits_ith(self.ctx, index if self._row is None else self._row[index])
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,))

    def seq_pos_max(self, seq_id: int) -> int:
        """The last position sequence `seq_id` holds a cell for; -1 when it holds none."""
        return int(ll.llama_memory_seq_pos_max(self.mem, seq_id))

    def seq_remove(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        return bool(ll.llama_memory_seq_rm(self.mem, seq_id, p0, p1))

    def seq_copy(self, src: int, dst: int, p0: int, p1: int) -> None:
        if self.unified:
            ll.llama_memory_seq_cp(self.mem, src, dst, p0, p1)
            return
        # between streams llama.cpp copies only whole sequences (anything else aborts the
        # process): copy all of it into the (empty) destination, then keep [p0, p1)
        ll.llama_memory_seq_cp(self.mem, src, dst, -1, -1)
        if p1 >= 0:
            ll.llama_memory_seq_rm(self.mem, dst, p1, -1)
        if p0 > 0:
            ll.llama_memory_seq_rm(self.mem, dst, 0, p0)

    def seq_state(self, seq_id: int, into: np.ndarray | None = None,
                  spare: int = 0) -> tuple[np.ndarray, int]:
        """A copy of sequence `seq_id`'s KV state (its cells), and its size in bytes (into
        a `fresh_buffer`). Into `into` when it has room for the state and `spare` bytes
        more (a buffer used again touches no new pages)."""
        size = ll.llama_state_seq_get_size(self.ctx, seq_id)
        buf = into if into is not None and len(into) >= size + spare \
            else fresh_buffer(size + spare)
        return buf, ll.llama_state_seq_get_data(self.ctx, _bytes_ptr(buf), size, seq_id)

    def set_seq_state(self, seq_id: int, state: np.ndarray, size: int) -> bool:
        """Load a `seq_state` copy into sequence `seq_id` (empty); False when it does not fit."""
        return bool(ll.llama_state_seq_set_data(self.ctx, _bytes_ptr(state), size, seq_id))

    def clear(self) -> None:
        ll.llama_memory_clear(self.mem, True)

    def close(self) -> None:
        if self.ctx:
            ll.llama_batch_free(self._batch)
            ll.llama_free(self.ctx)
            self.ctx = None
