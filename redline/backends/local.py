"""The embedded llama.cpp engine as a backend."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from redline.backends.base import BackendInfo
from redline.backends.local_choices import merged
from redline.backends.local_features import (
    Prepared,
    TemplateOptions,
    chat_echo,
    named_as_sent,
    prepare,
    template_options,
    with_tool_calls,
)
from redline.config import ModelConfig
from redline.engine.arbiter import StepArbiter
from redline.engine.budget import protected_streams
from redline.engine.engine import Engine
from redline.engine.llama import LlamaModel
from redline.engine.sampling import GrammarError, check_grammar
from redline.engine.speculative import NgramSettings
from redline.engine.template import ChatTemplate
from redline.engine.tools import ToolCallParser
from redline.errors import ContextLengthExceeded, InvalidRequest, NotReady
from redline.models import bundled_path, served_path
from redline.types import Chunk, GenerationRequest, Message, SamplingParams, TokenLogprob

TOKENIZED_KEPT = 32  # prompts whose tokens stay memoised (a forecast, then the stream)


class LocalBackend:
    def __init__(self, cfg: ModelConfig, models_dir: Path, arbiter: StepArbiter | None = None) -> None:
        self.cfg = cfg
        # shared with the process's other local models: one engine steps at a time
        self.arbiter = arbiter or StepArbiter()
        self._models_dir = models_dir
        self.info = BackendInfo(cfg.name, "local", cfg.n_ctx, cfg.size_rank)
        self.engine: Engine | None = None
        self.model: LlamaModel | None = None
        self._grammars: set[str] = set()  # grammars llama.cpp has compiled here
        # prompts tokenized lately, by text: the planner's forecast tokenizes a request's
        # prompt and its stream, a moment later, finds it here
        self._tokenized: OrderedDict[tuple[str, bool], list[int]] = OrderedDict()
        self._templates: OrderedDict[str, ChatTemplate] = OrderedDict()  # requests' own

    async def start(self) -> None:
        await asyncio.to_thread(self._load)
        if self.cfg.warmup:
            await self.warmup()

    def _load(self) -> None:
        cfg = self.cfg
        path = Path(cfg.path) if cfg.path else bundled_path(cfg.bundled or "", self._models_dir)
        path = served_path(path, cfg.weights)
        self.model = LlamaModel(str(path), self.cfg.chat_template)
        self.engine = Engine(self.model, n_ctx_per_seq=self.cfg.n_ctx, n_seq_max=self.cfg.n_seq_max,
                             n_batch=self.cfg.n_batch, n_threads=self.cfg.n_threads,
                             prefix_reuse=self.cfg.prefix_reuse, arbiter=self.arbiter,
                             name=cfg.name, cache_cells=self._cache_cells(),
                             tiers=cfg.scheduling == "priority", prefill_slack=cfg.prefill_slack,
                             prefill_floor=cfg.prefill_floor_tokens,
                             speculative=self._speculative(),
                             host_cache_bytes=cfg.host_cache_mb << 20,
                             busy_cells=cfg.prefix_cache_tokens_decoding,
                             kv_unified=cfg.kv_layout == "unified",
                             prefill_protect=protected_streams(cfg.prefill_protect_share,
                                                               cfg.n_seq_max),
                             prefill_yield_to_waiting=cfg.prefill_yield_to_waiting,
                             side_prefill=cfg.prefill_side)

    def _speculative(self) -> NgramSettings | None:
        s = self.cfg.speculative
        if s.method == "off":
            return None
        return NgramSettings(s.max_draft, s.min_match, s.max_match, s.max_decoding)

    def _cache_cells(self) -> int:
        """Idle slots' cached prefixes, bounded: every step attends over the cells in use
        (config.py `prefix_cache_tokens`; one context's worth by default)."""
        tokens = self.cfg.prefix_cache_tokens
        return self.cfg.n_ctx if tokens is None else tokens

    async def warmup(self, tag: str = "Warm-up") -> None:
        """Touch every code path once (prefill, batched decode) so the first user
        does not pay for page faults and first-call allocations. `tag` starts the prompts
        (another tag: prompts no cached prefix holds, whose steps measure a prefill)."""
        # first a prompt long enough that its step teaches the engine what a prompt token
        # costs (engine/budget.py), then batched decode steps: the planner's forecast for
        # this model (engine/forecast.py) is ready before the first request
        long = f"{tag}: " + ", ".join(f"item {i}" for i in range(48)) + "."
        await self._drain(GenerationRequest(model=self.cfg.name, prompt=long,
                                            sampling=SamplingParams(max_tokens=2, temperature=0.0)))
        prompt = f"{tag}: count from one to ten."
        req = GenerationRequest(model=self.cfg.name, prompt=prompt,
                                sampling=SamplingParams(max_tokens=24, temperature=0.0))
        n = min(4, self.cfg.n_seq_max)
        await asyncio.gather(*[self._drain(req) for _ in range(n)])

    async def calibrate(self) -> None:
        """Measure the step costs again now that everything in the process has loaded.
        The warm-up ran beside the other models' loading and warm-ups and the caches'
        embedders, and what a step cost then was several times a quiet step: the planner
        forecast a shared system prompt's answer taking seconds and shortened tier-S
        answers it need not have (issue 23). The pipeline calls this for one local model
        at a time, before it reports ready."""
        if self.engine is None or not self.cfg.warmup:
            return
        self.engine.forget_costs()
        await self.warmup("Calibration")

    async def _drain(self, req: GenerationRequest) -> None:
        async for _ in self.stream(req):
            pass

    def prompt_tokens(self, request: GenerationRequest,
                      messages: tuple[Message, ...] | None = None,
                      prompt: str | None = None,
                      tools: list[dict[str, Any]] | None = None) -> list[int]:
        """A prompt's tokens: a chat's messages in the model's template (with `tools`
        for a template that renders them itself), or a text prompt's."""
        assert self.model is not None
        messages = request.messages if messages is None else messages
        chat = messages is not None
        opts = template_options(request)  # a text prompt's: a 400 for any but the defaults
        if messages is not None:
            text = self._rendered(messages, tools, opts)
        else:
            text = (request.prompt if prompt is None else prompt) or ""
            if request.suffix is not None:  # fill in the middle
                return self.model.fill_in_middle(text, request.suffix)
        key = (text, chat)
        tokens = self._tokenized.get(key)
        if tokens is None:
            tokens = self.model.tokenize(text, add_special=not chat, parse_special=chat)
            if chat and self.model.add_bos and tokens[:1] != [self.model.bos]:
                tokens.insert(0, self.model.bos)  # as llama.cpp's server: one BOS, always
            self._tokenized[key] = tokens
            if len(self._tokenized) > TOKENIZED_KEPT:
                self._tokenized.popitem(last=False)
        return list(tokens)

    def _rendered(self, messages: tuple[Message, ...], tools: list[dict[str, Any]] | None,
                  opts: TemplateOptions) -> str:
        assert self.model is not None
        own = self._own_template(opts)
        if own is None and opts.kwargs and self.model.jinja is None:
            raise InvalidRequest("chat_template_kwargs: this model's chat template is "
                                 "llama.cpp's built-in one, which takes no arguments.",
                                 param="chat_template_kwargs")
        return self.model.render_chat(messages, opts.add_generation_prompt, opts.continue_final,
                                      tools, opts.kwargs, own)

    def _own_template(self, opts: TemplateOptions) -> ChatTemplate | None:
        """The request's own chat template, compiled (the last few are kept), where this
        model trusts one (vLLM's --trust-request-chat-template); else a 400."""
        if opts.template is None:
            return None
        assert self.model is not None
        if not self.cfg.trust_request_chat_template:
            raise InvalidRequest("Chat template is passed with request, but this model does "
                                 "not trust request templates (trust_request_chat_template "
                                 "in its config).", param="chat_template")
        own = self._templates.get(opts.template)
        if own is None:
            own = self._templates[opts.template] = self.model.compile_template(opts.template)
            if len(self._templates) > 16:
                self._templates.popitem(last=False)
        return own

    def chat_text(self, request: GenerationRequest) -> str:
        """What /apply-template answers: a chat's prompt as this model's engine renders it
        (its template, its tools), before tokenizing."""
        if self.model is None:
            raise NotReady("the model is still loading", retry_after=1)
        prepared = self._prepare(request)
        assert prepared.messages is not None
        return self._rendered(prepared.messages, prepared.tools, template_options(request))

    def tokens_of(self, request: GenerationRequest, add_special: bool | None = None) -> list[int]:
        """What /tokenize answers: the tokens of `request`'s prompt as this model takes it
        (a chat's template, its tools rendered as the engine renders them); a text
        prompt with or without the BOS token (`add_special`; default: with)."""
        if self.model is None:
            raise NotReady("the model is still loading", retry_after=1)
        if request.prompt_ids:
            return self._ids(request.prompt_ids[0])
        if request.messages is None and add_special is False:
            return self.model.tokenize(request.prompt or "", add_special=False,
                                       parse_special=False)
        prepared = self._prepare(request)
        return self.prompt_tokens(request, prepared.messages, tools=prepared.tools)

    def text_of(self, tokens: list[int], special: bool = False) -> tuple[str, list[str]]:
        """The text of `tokens`, and each token's own text; `special`: control tokens
        written out (`<|im_start|>`), as /detokenize and /tokenize's token strings give
        them on vLLM and llama.cpp's server."""
        if self.model is None:
            raise NotReady("the model is still loading", retry_after=1)
        for i, t in enumerate(tokens):
            if not 0 <= t < self.model.n_vocab:
                raise InvalidRequest(f"tokens[{i}] is {t}, not in this model's vocabulary "
                                     f"(0..{self.model.n_vocab - 1}).", param=f"tokens[{i}]")
        pieces = [self.model.piece(t, special) for t in tokens]
        return (b"".join(pieces).decode("utf-8", errors="replace"),
                [p.decode("utf-8", errors="replace") for p in pieces])

    async def stream(self, request: GenerationRequest) -> AsyncIterator[Chunk]:
        if self.engine is None or self.model is None:
            raise NotReady("the model is still loading", retry_after=1)
        if request.is_chat and not self.cfg.has("chat"):  # the router refuses it first
            raise InvalidRequest(f"The model `{self.cfg.name}` serves completions only (a base "
                                 "model: it has no chat capability).", param="model",
                                 code="model_not_supported")
        t0 = time.perf_counter()
        # tools rendered, grammar set: a 400 for what the engine cannot enforce
        with named_as_sent(request):
            prepared = self._prepare(request)
            if prepared.sampling.grammar is not None:
                self._check_grammar(prepared.sampling.grammar, prepared.grammar_param)
        # one token list per prompt (a text completion may send several)
        lists = ([self._ids(ids) for ids in request.prompt_ids] if request.prompt_ids else
                 [self.prompt_tokens(request, prepared.messages, p, prepared.tools)
                  for p in request.prompts or (None,)])
        prompts = [self._checked(tokens, request) for tokens in lists]
        tokenize_s = time.perf_counter() - t0
        engine, model = self.engine, self.model
        sampling = prepared.sampling
        if request.echo and sampling.logprobs:  # the engine scores the prompt too
            sampling = dataclasses.replace(sampling, prompt_logprobs=sampling.top_logprobs or 0)
        n = sampling.n
        texts: Sequence[str] = ()  # what echo gives back: each prompt's text (ids decoded)
        if request.echo:
            texts = ([self.text_of(list(ids))[0] for ids in request.prompt_ids]
                     if request.prompt_ids else request.prompts or (request.prompt or "",))
        head = chat_echo(request)
        predicted = None if not request.prediction else model.tokenize(
            request.prediction, add_special=False, parse_special=False)

        def start(index: int, sampling: SamplingParams) -> AsyncIterator[Chunk]:
            tokens = prompts[index // n]
            chunks = engine.generate(tokens, sampling, request.id if index == 0 else None,
                                     request.tier, request.presence, predicted)
            if prepared.parse_tools:
                chunks = with_tool_calls(chunks, ToolCallParser(request.tools))
            if request.echo:
                chunks = echoed(chunks, texts[index // n], model.piece(tokens[0]))
            elif head is not None:
                chunks = echoed(chunks, head, b"")
            return chunks

        choices = n * len(prompts)
        stream = start(0, sampling) if choices == 1 else merged(choices, sampling, start)
        async for chunk in stream:
            if chunk.timings is not None:
                chunk.timings.add("tokenize", tokenize_s)
            yield chunk

    def _prepare(self, request: GenerationRequest) -> Prepared:
        assert self.model is not None
        own = self._own_template(template_options(request)) if request.messages else None
        native = own.renders_tools if own is not None else self.model.renders_tools
        return prepare(request, self.model.n_vocab, native)

    def _ids(self, ids: tuple[int, ...]) -> list[int]:
        """A prompt of token ids, each in this model's vocabulary."""
        assert self.model is not None
        bad = next((t for t in ids if t >= self.model.n_vocab), None)
        if bad is not None:
            raise InvalidRequest(f"'prompt' holds token {bad}, not in this model's vocabulary "
                                 f"(0..{self.model.n_vocab - 1}).", param="prompt")
        return list(ids)

    def _checked(self, tokens: list[int], request: GenerationRequest) -> list[int]:
        """A prompt's tokens, which with max_tokens must fit a sequence's context."""
        assert self.model is not None
        limit = self.cfg.n_ctx
        if len(tokens) + request.sampling.max_tokens > limit:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(tokens) + request.sampling.max_tokens} tokens ({len(tokens)} in the messages, "
                f"{request.sampling.max_tokens} in the completion). Please reduce the length of the "
                "messages or completion.",
                param="messages" if request.is_chat else "prompt",
            )
        return tokens or self.model.tokenize(" ", add_special=True)

    def _check_grammar(self, gbnf: str, param: str) -> None:
        """Compile a grammar once here, where a failure is the client's 400, not in the
        engine thread (a grammar llama.cpp refuses would stop the engine)."""
        if gbnf in self._grammars:
            return
        assert self.model is not None
        try:
            check_grammar(self.model.vocab, gbnf)
        except GrammarError as exc:
            raise InvalidRequest("The embedded engine could not compile a grammar for this "
                                 "schema.", param=param) from exc
        if len(self._grammars) >= 256:
            self._grammars.clear()
        self._grammars.add(gbnf)

    def load(self) -> int:
        return self.engine.active if self.engine else 0

    def stats(self) -> dict[str, int]:
        """The engine's scheduler counters, for /metrics (read from another thread: a
        step may move them on meanwhile)."""
        e = self.engine
        if e is None:
            return {}
        s, h = e.scheduler, e.host
        return {"steps": e.steps, "preemptions": s.preemptions, "evictions": s.evictions,
                "slots_busy": len(s.running),  # each running sequence holds a slot
                "host_saves": h.saves if h else 0, "host_restores": h.restores if h else 0,
                "host_restored_tokens": h.restored_tokens if h else 0,
                "host_bytes": h.used if h else 0,
                "side_prefills": e.side_jobs, "side_prefill_tokens": e.side_tokens}

    def predict_ttft_s(self, prompt_tokens: int, tier: str | None,
                       request: GenerationRequest | None = None) -> float | None:
        """For the planner: the engine's forecast from the work it has admitted; given the
        request, from its prompt's own tokens, so that a prefix the engine holds (a system
        prompt many users share) is not forecast as computed again."""
        if self.engine is None:
            return None
        tokens = self._forecast_tokens(request) if request is not None else None
        return self.engine.predict_ttft_s(prompt_tokens, tier, tokens)

    def _forecast_tokens(self, request: GenerationRequest) -> list[int] | None:
        """The tokens of a request's one prompt as its stream will send them (None for
        what the stream prepares further: tools, several prompts, or a request this model
        refuses, which the stream reports)."""
        if self.model is None or request.tools or len(request.prompts) > 1 \
                or (request.is_chat and not self.cfg.has("chat")):
            return None
        if request.prompt_ids:
            return list(request.prompt_ids[0])
        try:
            return self.prompt_tokens(request)
        except InvalidRequest:  # no chat template: the stream says so
            return None

    def cores_busy(self) -> float:
        """For the planner: how much of the shared cores the local engines used lately."""
        return self.engine.cores_busy() if self.engine else 0.0

    def predict_tpot_s(self) -> float | None:
        return self.engine.predict_tpot_s() if self.engine else None

    def slowdown(self) -> float:
        """For the planner: how much longer work takes here now than alone, because the
        process's other local models have work on the same cores."""
        return self.engine.slowdown() if self.engine else 1.0

    async def close(self) -> None:
        if self.engine is not None:
            await asyncio.to_thread(self.engine.close)
            self.engine = None
        if self.model is not None:
            self.model.close()
            self.model = None


async def echoed(chunks: AsyncIterator[Chunk], prompt: str, first: bytes) -> AsyncIterator[Chunk]:
    """OpenAI's `echo`: a text completion's answer starts with its prompt, and with
    logprobs each prompt token's comes first (the first token's is null: nothing before
    it predicts it). `first`: the prompt's first token's text."""
    head = True
    async for chunk in chunks:
        if head and chunk.finish_reason != "error":
            head = False
            chunk.text = prompt + chunk.text
            if chunk.prompt_logprobs is not None:
                lead = TokenLogprob(first.decode("utf-8", "replace"), None, tuple(first))
                chunk.logprobs = (lead, *chunk.prompt_logprobs, *(chunk.logprobs or ()))
        yield chunk
