"""Typed values that cross stage boundaries: a request in, chunks out.

Every stage of the pipeline (api → routing → cache → backend → streams) passes
these, never loose dicts. The request carries all of OpenAI's chat and completion
fields (structured messages, tools, response formats, logprobs, n, penalties) and the
answer all of its deltas (text, reasoning, tool-call fragments, logprobs, per choice);
what redline does not model rides along in `extra` mappings, both ways, so that a
remote engine gets the client's fields and the client the engine's, unchanged.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Tier = Literal["S", "A", "B"]
FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call",
                       "cancelled", "error"]
# fields a value does not model, as they came (JSON values): passed on unchanged
Extra = Mapping[str, Any]


class _NoExtra(dict[str, Any]):
    """The shared empty `extra`: a dict (JSON encoders take it as one) that cannot change,
    and hashable (a dataclass default must be)."""

    def __hash__(self) -> int:  # type: ignore[override]  # dict sets it to None; this one is immutable
        return 0

    def _frozen(self, *_: Any, **__: Any) -> Any:
        raise TypeError("NO_EXTRA cannot change")

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = _frozen


NO_EXTRA: Extra = _NoExtra()
# OpenAI's string hints: in `extra` (a remote engine gets them as sent), and honoured by
# every model (as the session and the end user, and prompt_cache_retention's permission to
# keep cached prefixes longer: an embedded engine keeps them as long as its memory holds
# them, in memory, whichever value is sent), so they need no engine that passes fields on
HINTS = ("prompt_cache_key", "safety_identifier", "prompt_cache_retention")
# an assistant message's own reasoning, as reasoning engines answer it (vLLM, DeepSeek)
PAST_REASONING = frozenset(("reasoning_content", "reasoning"))
# request fields at the value that asks for what every engine here does anyway (OpenAI's
# and vLLM's defaults): nothing stored, no service tier, text out, special tokens not shown,
# the assistant's turn opened, the prompt not echoed, the default verbosity. A remote engine
# gets them as sent; any other value is a field redline does not model
DEFAULTS: dict[str, tuple[Any, ...]] = {
    "store": (False,), "service_tier": ("auto", "default"), "modalities": (["text"],),
    "skip_special_tokens": (True,), "spaces_between_special_tokens": (True,),
    "echo": (False,), "verbosity": ("medium",),
}
# vLLM's chat-template fields: in `extra` (a remote engine gets them as sent), and honoured
# by the embedded engine, which renders the model's own template
# (backends/local_features.py `template_options`)
TEMPLATE_FIELDS = ("add_generation_prompt", "continue_final_message", "chat_template_kwargs",
                   "chat_template")


# vLLM's structured outputs: in `extra` (a remote engine gets them as sent), and honoured by
# the embedded engine's grammar (backends/local_features.py `guided`): `structured_outputs`
# (vLLM >= 0.10) with one of these keys, or the older top-level `guided_*` fields
GUIDED = ("guided_json", "guided_choice", "guided_grammar", "guided_regex", "structured_outputs")
GUIDED_KINDS = ("json", "choice", "grammar", "regex", "json_object")


def _says(value: Any) -> bool:
    """Whether a field's value carries anything (null, "", [] and {} do not)."""
    return value is not None and value != "" and value != [] and value != {}


STAGES = ("queue", "cache", "route", "tokenize", "prefill", "decode", "detokenize", "total")


class _Random:
    """Random bytes from the OS, fetched 4 KiB at a time: ids are made several times a
    request, and a getrandom() call each (uuid4) cost more than the rest of new_id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool = b""
        self._at = 0  # what is before it was handed out
        os.register_at_fork(after_in_child=self._reset)  # a child must not reuse ours

    def _reset(self) -> None:
        self._pool, self._at = b"", 0

    def take(self, n: int) -> bytes:
        with self._lock:
            if self._at + n > len(self._pool):
                self._pool, self._at = os.urandom(4096), 0
            out = self._pool[self._at:self._at + n]
            self._at += n
        return out


_random = _Random()


def new_id(prefix: str) -> str:
    """`prefix-` and 96 random bits in hex (unguessable: a stream id lets its tenant resume)."""
    return f"{prefix}-{_random.take(12).hex()}"


class Presence:
    """Whether anyone reads a request's answer now. The streams layer sets `gone` while a
    stream's client is away (it generates on for a resume) and clears it when one comes
    back; the embedded engine reads it: such a sequence gives its slot to anyone who
    waits, and continues later (engine/scheduler.py). A flag passed down, not a callback."""

    __slots__ = ("gone",)

    def __init__(self) -> None:
        self.gone = False


@dataclass(frozen=True)
class ContentPart:
    """One part of a message's content: `text`, `image_url` (a URL or a data: URL), or
    another type passed on as it came (its fields in `extra`)."""

    type: str
    text: str | None = None
    image_url: str | None = None
    detail: str | None = None  # image_url's detail: auto, low, high
    extra: Extra = NO_EXTRA  # the part's other fields (image_url's others under "image_url")


@dataclass(frozen=True)
class ToolCall:
    """A complete call of a function tool, as an assistant message carries it."""

    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it (not parsed: it may not be valid)
    type: str = "function"


@dataclass(frozen=True)
class Message:
    role: str
    content: str = ""  # the text (a list of parts: their text joined), what local engines read
    parts: tuple[ContentPart, ...] | None = None  # the content as parts, when it came as a list
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # role "tool": the call it answers
    name: str | None = None
    null_content: bool = False  # content was null or absent (an assistant turn of tool calls)
    extra: Extra = NO_EXTRA

    @property
    def images(self) -> int:
        return sum(1 for p in self.parts or () if p.type == "image_url")


@dataclass(frozen=True)
class FunctionTool:
    """A tool the model may call (chat completions knows only function tools)."""

    name: str
    description: str | None = None
    parameters: Extra | None = None  # a JSON Schema
    strict: bool | None = None
    extra: Extra = NO_EXTRA


ToolChoiceMode = Literal["none", "auto", "required", "function"]


@dataclass(frozen=True)
class ToolChoice:
    """`none`, `auto`, `required`, or `function` (then `name` is the one to call)."""

    mode: ToolChoiceMode
    name: str | None = None


@dataclass(frozen=True)
class ResponseFormat:
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None  # json_schema's
    schema: Extra | None = None
    strict: bool | None = None
    description: str | None = None


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. temperature 0 means greedy. None: the client did not set it
    (a remote engine then applies its own default)."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    n: int = 1  # choices
    logprobs: bool = False
    top_logprobs: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: tuple[tuple[str, float], ...] = ()  # (token id, bias), in the client's order
    # vLLM's sampling fields, as vLLM means them (None: not sent, the engine's default)
    min_p: float | None = None  # drop tokens below min_p × the likeliest one's probability
    repetition_penalty: float | None = None  # over prompt and output: logit / p (or × p if < 0)
    min_tokens: int | None = None  # no end of generation (EOS, stop ids, stop strings) before
    stop_token_ids: tuple[int, ...] | None = None  # these tokens end it too (and are kept)
    include_stop_str_in_output: bool | None = None  # the stop string that ended it is kept
    # the embedded engine scores the prompt too (an echoed completion's logprobs), with
    # this many alternatives a token; set by the local backend, never by a client
    prompt_logprobs: int | None = None
    # GBNF that the embedded engine constrains the answer to: set by the local backend from
    # response_format and tool_choice, never by a client (a remote engine never sees it)
    grammar: str | None = None
    # with a grammar: it applies from the first place the answer has this text on (llama.cpp's
    # lazy grammar: `tool_choice: auto` constrains a call once the model starts one)
    grammar_trigger: str | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def vllm(self) -> tuple[Any, ...]:
        """vLLM's fields as sent (VLLM_UNSET: none of them)."""
        return (self.min_p, self.repetition_penalty, self.min_tokens, self.stop_token_ids,
                self.include_stop_str_in_output)


VLLM_UNSET: tuple[Any, ...] = (None,) * 5


@dataclass
class GenerationRequest:
    """One completion to produce. Either `messages` (chat) or `prompt` (text)."""

    model: str
    sampling: SamplingParams
    messages: tuple[Message, ...] | None = None
    prompt: str | None = None
    # a text completion's list of several prompts (`prompt` is the first): one choice per
    # prompt and `n`, choice index = prompt index * n + choice, as OpenAI numbers them
    prompts: tuple[str, ...] = ()
    id: str = field(default_factory=lambda: new_id("req"))
    tier: Tier | None = None
    tenant: str = "anonymous"  # API key scope: caches and limits never cross it
    use_cache: bool = True  # False for `Cache-Control: no-cache` or body "cache": false
    user: str | None = None  # OpenAI's end-user id (A/B assignment is sticky on it)
    session: str | None = None  # X-Session-ID: its requests stay on one engine replica
    # the client takes a 202 job (tier B) when its tier's first-token budget can't be met
    allow_background: bool = False
    tools: tuple[FunctionTool, ...] = ()
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    max_tokens_field: str = "max_tokens"  # or "max_completion_tokens": as the client named it
    echo: bool = False  # a text completion's answer starts with its prompt (OpenAI's `echo`)
    # a text completion's prompts as token ids, one tuple each (its `prompt`/`prompts` are
    # then empty text): the model's own vocabulary, so a request that names its model
    prompt_ids: tuple[tuple[int, ...], ...] = ()
    # fill in the middle: a text completion's answer goes between its prompt and this
    suffix: str | None = None
    # Predicted Outputs: what the client expects most of the answer to be (its speed, never
    # its text: the embedded engine drafts from it)
    prediction: str | None = None
    # the client sent OpenAI's deprecated `functions` / `function_call` (read as tools and
    # tool_choice): its answer says `function_call`, as OpenAI's does
    legacy_functions: bool = False
    # the client's fields that redline does not model: a remote engine gets them unchanged
    extra: Extra = NO_EXTRA
    arrival: float = field(default_factory=time.perf_counter)
    # shared by its copies (routing replaces fields): set while nobody reads the answer
    presence: Presence = field(default_factory=Presence, compare=False, repr=False)

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    @property
    def choices(self) -> int:
        """How many choices the answer has: `n` for each prompt."""
        return self.sampling.n * max(1, len(self.prompts))

    def is_plain(self) -> bool:
        """Text in, text out, one choice: nothing beyond what redline had before tools,
        response formats, logprobs and `extra` (what every part of redline carries)."""
        s = self.sampling
        return (not self.tools and self.tool_choice is None and self.parallel_tool_calls is None
                and (self.response_format is None or self.response_format.type == "text")
                and s.n == 1 and not self.prompts and not s.logprobs and s.top_logprobs is None
                and not s.logit_bias
                and s.presence_penalty is None and s.frequency_penalty is None and not self.extra
                and s.vllm() == VLLM_UNSET and not self.echo and self.prediction is None
                and not self.prompt_ids and self.suffix is None
                and all(m.parts is None and not m.tool_calls and m.tool_call_id is None
                        and m.name is None and not m.extra for m in self.messages or ()))

    def needs(self) -> frozenset[str]:
        """The model capabilities (config.Capability) that this request needs."""
        out = {"chat" if self.is_chat else "completions"}
        if self.tools and (self.tool_choice is None or self.tool_choice.mode != "none"):
            out.add("tools")
        if (self.response_format is not None and self.response_format.type != "text") \
                or any(self.extra.get(k) is not None for k in GUIDED):
            out.add("json_schema")
        if self.sampling.logprobs or self.sampling.top_logprobs:
            out.add("logprobs")
        if any(m.images for m in self.messages or ()):
            out.add("vision")
        if self.unmodelled():
            out.add("fields")  # only an engine that is passed them (a remote one) serves them
        return frozenset(out)

    def unmodelled(self) -> list[str]:
        """The fields that redline does not model, as the request names them: its own
        (less the hints every model honours), its messages', their content parts' and its
        tools' (less empty values, which say nothing: a message the client got from an
        answer and sends back holds `refusal: null`, `annotations: []`). A remote engine
        gets them as sent; an embedded one could only drop them, so it is never chosen
        for them. An assistant turn's reasoning is not among them: the embedded engine
        does not replay a past turn's reasoning (as the Responses API does not, with any
        engine), and a remote one gets it as sent."""
        # a top-level null is a field not sent; an empty object may mean something here
        # (`web_search_options: {}` turns search on), so only DEFAULTS' values say nothing
        out = [k for k, v in self.extra.items() if k not in HINTS and k not in GUIDED
               and k not in TEMPLATE_FIELDS and not (k == "echo" and self.is_chat)
               and v is not None
               and not any(v == d and type(v) is type(d) for d in DEFAULTS.get(k, ()))]
        outputs = self.extra.get("structured_outputs")
        if isinstance(outputs, dict):  # what of it the grammar does not serve (regex, ...)
            out += [f"structured_outputs.{k}" for k, v in outputs.items()
                    if k not in GUIDED_KINDS and v is not None and v is not False]
        for i, m in enumerate(self.messages or ()):
            out += [f"messages[{i}].{k}" for k, v in m.extra.items() if _says(v)
                     and not (m.role == "assistant" and k in PAST_REASONING)]
            out += [f"messages[{i}].content[{j}].{k}" for j, p in enumerate(m.parts or ())
                    for k, v in p.extra.items() if _says(v)]
        for i, t in enumerate(self.tools):
            out += [f"tools[{i}].{k[5:]}" if k.startswith("tool.") else f"tools[{i}].function.{k}"
                    for k, v in t.extra.items() if _says(v)]
        return out


@dataclass
class StageTimings:
    """Seconds spent per stage for one request; only stages that happened are set."""

    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, stage: str, dt: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + dt

    def server_timing(self) -> str:
        """The `Server-Timing` header value, in milliseconds, in pipeline order."""
        parts = [f"{s};dur={self.seconds[s] * 1000:.2f}" for s in STAGES if s in self.seconds]
        return ", ".join(parts)


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None  # prompt_tokens_details.cached_tokens, where reported
    prompt_details: Extra = NO_EXTRA  # prompt_tokens_details' other fields
    completion_details: Extra | None = None  # completion_tokens_details, as reported

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: tuple[int, ...] | None = None


@dataclass(frozen=True)
class TokenLogprob:
    """One sampled token's log-probability and its most likely alternatives."""

    token: str
    logprob: float | None  # None: an echoed prompt's first token, which nothing predicts
    bytes: tuple[int, ...] | None = None
    top: tuple[TopLogprob, ...] = ()
    offset: int | None = None  # text completions: where the token starts in the text


@dataclass(frozen=True)
class ToolCallDelta:
    """A fragment of a streamed tool call: the first of a call carries its `id`, `type`
    and function `name`, later ones pieces of `arguments`; None: absent in the fragment
    (kept as the engine split them, so a client sees its exact fragments)."""

    index: int
    id: str | None = None
    type: str | None = None
    name: str | None = None
    arguments: str | None = None


@dataclass
class Chunk:
    """A piece of one choice's answer (choice `index`). The last chunk of a stream has
    `finish_reason` set, and carries `usage` and the backend's stage `timings`; with
    several choices, each other choice's end is a chunk with `ends_choice` set."""

    text: str = ""
    tokens: int = 0  # output tokens this chunk covers
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    timings: StageTimings | None = None
    error: str | None = None
    index: int = 0
    reasoning: str = ""  # reasoning_content (DeepSeek- and vLLM-style reasoning models)
    tool_calls: tuple[ToolCallDelta, ...] = ()
    logprobs: tuple[TokenLogprob, ...] | None = None
    ends_choice: FinishReason | None = None
    extra: Extra = NO_EXTRA  # the delta's fields that redline does not model
    # the embedded engine's first chunk, when asked (SamplingParams.prompt_logprobs): each
    # prompt token's log-probability after the ones before it (from the second token on)
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None
    # the embedded engine's grammar held this chunk's tokens (a tool call it is sure of
    # can then be streamed as it is written)
    constrained: bool = False

    @property
    def finish(self) -> FinishReason | None:
        """How this chunk's choice ended here, if it did."""
        return self.finish_reason or self.ends_choice

    @property
    def has_delta(self) -> bool:
        return bool(self.text or self.reasoning or self.tool_calls or self.logprobs
                    or self.extra)


@dataclass
class ChoiceAnswer:
    """One choice's whole answer, assembled from its chunks (a non-streamed reply)."""

    index: int
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, list[Any]] = field(default_factory=dict)  # index -> [id, type, name, args]
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, chunk: Chunk) -> None:
        if chunk.text:
            self.text.append(chunk.text)
        if chunk.reasoning:
            self.reasoning.append(chunk.reasoning)
        for d in chunk.tool_calls:
            call = self.calls.setdefault(d.index, [None, None, None, []])
            call[0] = call[0] if d.id is None else d.id
            call[1] = call[1] if d.type is None else d.type
            call[2] = call[2] if d.name is None else (call[2] or "") + d.name
            if d.arguments:
                call[3].append(d.arguments)
        if chunk.logprobs is not None:
            self.logprobs = [*(self.logprobs or ()), *chunk.logprobs]
        for key, value in chunk.extra.items():  # strings are streamed in pieces; others whole
            old = self.extra.get(key)
            self.extra[key] = old + value if isinstance(old, str) and isinstance(value, str) \
                else value
        if chunk.finish is not None:
            self.finish_reason = chunk.finish

    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(ToolCall(c[0] or "", c[2] or "", "".join(c[3]), c[1] or "function")
                     for _, c in sorted(self.calls.items()))


def assemble(chunks: list[Chunk], n: int = 1) -> list[ChoiceAnswer]:
    """The choices of an answer from its chunks, in index order (n at least)."""
    out = {i: ChoiceAnswer(i) for i in range(n)}
    for chunk in chunks:
        out.setdefault(chunk.index, ChoiceAnswer(chunk.index)).add(chunk)
    return [out[i] for i in sorted(out)]


@dataclass(frozen=True, slots=True)
class Finished:
    """A request that has ended, as every pipeline observer receives it (the cache that
    stores the answer, the stream-length history, the long-tail log, live stats, the A/B
    recorder, the token limiter). Frozen: one observer cannot change what the next sees."""

    request: GenerationRequest
    model: str  # the model that answered
    tier: str
    cache: str  # "miss", "hit", "semantic", "bypass", ...
    status: str  # "200", "499" (the client left), "500"
    finish_reason: str | None
    output_tokens: int
    ttft_s: float | None
    total_s: float
    usage: Usage | None
    text: str  # the whole answer
    timings: Mapping[str, float]  # stage -> seconds, "total" included
    arm: str | None = None  # "experiment:arm" when an A/B experiment enrolled it
