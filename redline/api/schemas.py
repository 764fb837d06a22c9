"""OpenAI request schemas, with bounds, parsed into the typed request (redline/types.py).

Every field a client sends is either modelled here (typed, checked) or kept in the
request's `extra` as it came, and passed unchanged to a remote engine (a local engine
refuses what it cannot serve: api/capabilities.py). redline's own extensions (`tier`,
`cache`, `background`, `allow_background`, `notify`) are typed here and consumed: they
never go upstream."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from redline.errors import InvalidRequest
from redline.routing.names import parse_tier
from redline.types import (
    HINTS,
    NO_EXTRA,
    Extra,
    FunctionTool,
    GenerationRequest,
    Message,
    ResponseFormat,
    SamplingParams,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
)
from redline.types import (
    ContentPart as Part,
)

DEFAULT_MAX_TOKENS = 256
MAX_TOP_LOGPROBS = 20  # OpenAI's bound for chat; completions' `logprobs` stops at 5


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")

    def _extra(self) -> Extra:
        return dict(self.model_extra) if self.model_extra else NO_EXTRA


class ImageURL(_Open):
    url: str
    detail: str | None = None


class ContentPart(_Open):
    type: str
    text: str | None = None
    image_url: ImageURL | None = None

    def typed(self) -> Part:
        extra = dict(self._extra())
        if self.image_url is not None and self.image_url.model_extra:
            extra["image_url"] = dict(self.image_url.model_extra)
        return Part(self.type, self.text, None if self.image_url is None else self.image_url.url,
                    None if self.image_url is None else self.image_url.detail, extra or NO_EXTRA)


class FunctionCall(_Open):
    name: str
    arguments: str


class ToolCallIn(_Open):
    id: str
    type: str = "function"
    function: FunctionCall


class ChatMessage(_Open):
    # "function": the answer to a legacy `function_call` (ChatCompletionRequest reads it)
    role: Literal["system", "user", "assistant", "developer", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None  # an assistant turn's legacy call

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content if p.type == "text")

    def typed(self) -> Message:
        parts = None if not isinstance(self.content, list) else tuple(p.typed() for p in self.content)
        calls = tuple(ToolCall(c.id, c.function.name, c.function.arguments, c.type)
                      for c in self.tool_calls or ())
        return Message("system" if self.role == "developer" else self.role, self.text(), parts,
                       calls, self.tool_call_id, self.name, self.content is None, self._extra())


class NoObfuscation(BaseModel):
    """A stream's options as the Responses API has them: OpenAI's `include_obfuscation`
    (random padding on each delta against a length side channel) is taken at false, which
    is what every engine here does; true is a 400 rather than a stream that silently lacks
    it, and so is an option redline does not know."""
    model_config = ConfigDict(extra="forbid")

    include_obfuscation: bool | None = None

    @field_validator("include_obfuscation")
    @classmethod
    def _no_obfuscation(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError("redline does not obfuscate streams: send false or leave it out")
        return value


class StreamOptions(NoObfuscation):
    """Chat's and completions' (a remote engine is always asked for its usage, so nothing
    else of this object could be passed on)."""
    include_usage: bool = False


class Notify(_Open):
    webhook: str | None = None
    email: str | None = None


# OpenAI's metadata: up to 16 pairs (the field's max_length), keys of at most 64 characters,
# values of at most 512
Metadata = dict[Annotated[str, StringConstraints(max_length=64)],
                Annotated[str, StringConstraints(max_length=512)]]


class _SamplingFields(_Open):
    model: str = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    n: int | None = Field(None, ge=1, le=128, description="choices (the configured "
                          "server.max_n bounds it further)")
    stop: str | list[str] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    # vLLM's sampling extensions (its meaning; a remote engine gets them as sent)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, le=10.0)
    min_tokens: int | None = Field(None, ge=0)
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool = False
    # redline extensions (API.md)
    tier: Literal["S", "A", "B", "auto"] | None = None
    cache: bool | None = None
    background: bool = False
    allow_background: bool = Field(False, description="when no model can meet the tier's "
                                   "first-token budget, answer 202 with a job instead")
    notify: Notify | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences")
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for token, bias in (v or {}).items():
            if not token.isdigit() or not -100.0 <= bias <= 100.0:
                raise ValueError("keys are token ids, values between -100 and 100")
        return v

    def sampling(self, max_tokens: int | None, logprobs: bool = False,
                 top_logprobs: int | None = None) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        limit = max_tokens or DEFAULT_MAX_TOKENS
        if self.min_tokens is not None and self.min_tokens > limit:
            raise InvalidRequest(f"min_tokens ({self.min_tokens}) is more than the answer's "
                                 f"token limit ({limit}).", param="min_tokens")
        return SamplingParams(
            max_tokens=limit,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            stop=stop,
            seed=self.seed,
            ignore_eos=self.ignore_eos,
            n=self.n or 1,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=tuple((self.logit_bias or {}).items()),
            min_p=self.min_p, repetition_penalty=self.repetition_penalty,
            min_tokens=self.min_tokens,
            stop_token_ids=None if self.stop_token_ids is None else tuple(self.stop_token_ids),
            include_stop_str_in_output=self.include_stop_str_in_output,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def _request(self, tier: str | None, tenant: str, no_cache: bool, sampling: SamplingParams,
                 **fields: Any) -> GenerationRequest:
        extra = self._extra()
        # OpenAI's hints, kept in `extra` (a remote upstream gets them as sent) and honoured
        # here: requests of one prompt_cache_key stay on one engine replica (as X-Session-ID,
        # which wins), safety_identifier names the end user where `user` does not, and
        # prompt_cache_retention is checked (an embedded engine keeps prefixes in memory)
        hints = {k: hint(extra, k) for k in HINTS}
        gen = GenerationRequest(
            model=self.model, sampling=sampling, tier=parse_tier(tier), tenant=tenant,
            use_cache=self.cache is not False and not no_cache,
            user=self.user if self.user is not None else hints["safety_identifier"],
            session=hints["prompt_cache_key"],
            allow_background=self.allow_background, extra=extra, **fields)
        # answers the cache cannot hold (several choices or prompts, logprobs, tool calls)
        # bypass it
        if gen.choices > 1 or "logprobs" in gen.needs() or "tools" in gen.needs():
            gen.use_cache = False
        return gen


def hint(fields: Mapping[str, Any], name: str) -> str | None:
    """One of OpenAI's string hints (`HINTS`), checked: 1 to 256 characters."""
    value = fields.get(name)
    if value is None:
        return None
    if name == "prompt_cache_retention" and value not in ("in_memory", "24h"):
        raise InvalidRequest("prompt_cache_retention must be 'in_memory' or '24h'.", param=name)
    if not isinstance(value, str) or not 1 <= len(value) <= 256:
        raise InvalidRequest(f"{name} must be a string of 1 to 256 characters.", param=name)
    return value


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    prediction: dict[str, Any] | None = None  # OpenAI's Predicted Outputs
    # OpenAI's deprecated function calling: read as `tools` and `tool_choice` (_legacy)
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    # OpenAI's stored completions: redline keeps the answer (api/chat_store_routes.py)
    store: bool | None = None
    metadata: Metadata | None = Field(None, max_length=16)

    def to_generation(self, tier: str | None, tenant: str, no_cache: bool = False) -> GenerationRequest:
        if self.metadata is not None and not self.store:
            raise InvalidRequest("The 'metadata' parameter is only allowed when 'store' is "
                                 "enabled.", param="metadata")
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequest("top_logprobs needs logprobs: true", param="top_logprobs")
        tools = _tools(self.tools)
        choice = _tool_choice(self.tool_choice, tools)
        parallel = self.parallel_tool_calls
        legacy = self.legacy_functions
        if legacy:
            tools, choice = self._legacy(tools)
            parallel = False  # a legacy answer holds one call
        return self._request(
            tier, tenant, no_cache,
            self.sampling(self.max_completion_tokens or self.max_tokens, bool(self.logprobs),
                          self.top_logprobs),
            messages=_messages(self.messages),
            tools=tools, tool_choice=choice, legacy_functions=legacy,
            parallel_tool_calls=parallel,
            response_format=_response_format(self.response_format),
            max_tokens_field="max_completion_tokens" if self.max_completion_tokens else "max_tokens",
            prediction=_prediction(self.prediction))

    @property
    def legacy_functions(self) -> bool:
        """Whether the client used OpenAI's deprecated function calling."""
        return self.functions is not None or self.function_call is not None

    def _legacy(self, tools: tuple[FunctionTool, ...]) -> tuple[tuple[FunctionTool, ...],
                                                                ToolChoice | None]:
        """`functions` and `function_call` as the tools and tool_choice they mean."""
        if tools or self.tool_choice is not None or self.parallel_tool_calls is not None:
            raise InvalidRequest("Use tools or the deprecated functions, not both.",
                                 param="functions")
        if self.functions is not None and not self.functions:
            raise InvalidRequest("functions must list at least one function.",
                                 param="functions")
        if not self.functions:
            raise InvalidRequest("function_call needs functions.", param="function_call")
        try:
            tools = _tools([{"type": "function", "function": f} for f in self.functions])
        except InvalidRequest as exc:  # named as the client sent them
            raise InvalidRequest(exc.message.replace("tools[", "functions[").replace(
                ".function.", "."), param=(exc.param or "functions").replace(
                "tools[", "functions[").replace(".function.", ".")) from exc
        raw = self.function_call
        if raw is None:
            return tools, None
        if raw in ("none", "auto"):
            return tools, tool_choice_mode(raw, tools)
        if isinstance(raw, dict) and isinstance(raw.get("name"), str) and set(raw) == {"name"}:
            return tools, named_tool(raw["name"], tools, "function_call")
        raise InvalidRequest('function_call must be "none", "auto" or {"name": ...}.',
                             param="function_call")


def _messages(messages: list[ChatMessage]) -> tuple[Message, ...]:
    """The turns, typed; an assistant's legacy `function_call` as a tool call, and the
    `function` message after it as its answer (OpenAI's deprecated function calling)."""
    out: list[Message] = []
    last: str | None = None  # the id given to the latest legacy call
    for i, m in enumerate(messages):
        typed = m.typed()
        if m.function_call is not None:
            fc = m.function_call
            if m.role != "assistant" or not isinstance(fc.get("name"), str) or \
                    not isinstance(fc.get("arguments", ""), str) or set(fc) - {"name", "arguments"}:
                raise InvalidRequest("function_call is an assistant turn's {\"name\": ..., "
                                     "\"arguments\": ...}.", param=f"messages[{i}].function_call")
            last = f"call_legacy_{i}"
            call = ToolCall(last, fc["name"], fc.get("arguments") or "{}", "function")
            typed = dataclasses.replace(typed, tool_calls=(*typed.tool_calls, call))
        elif m.role == "function":
            if last is None or not m.name:
                raise InvalidRequest("A function message answers an assistant's function_call "
                                     "before it, and names the function.",
                                     param=f"messages[{i}]")
            typed = dataclasses.replace(typed, role="tool", tool_call_id=last)
        out.append(typed)
    return tuple(out)


class CompletionRequest(_SamplingFields):
    # text, or token ids (a list of ints, or of lists): `_prompts` tells them apart
    prompt: str | list[str] | list[int] | list[list[int]] = Field(...)
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None  # fill in the middle: what comes after the completion

    def to_generation(self, tier: str | None, tenant: str, no_cache: bool = False) -> GenerationRequest:
        prompts, ids = _prompts(self.prompt)
        if self.suffix is not None and (self.echo or ids):
            raise InvalidRequest("suffix (fill in the middle) takes a text prompt and no echo.",
                                 param="suffix")
        gen = self._request(
            tier, tenant, no_cache,
            self.sampling(self.max_tokens or 16, self.logprobs is not None, self.logprobs),
            prompt=prompts[0], prompts=prompts if len(prompts) > 1 else (), echo=self.echo,
            prompt_ids=ids, suffix=self.suffix)
        if gen.echo or ids or self.suffix is not None:  # the cache keeps answers to text
            gen.use_cache = False
        return gen


def not_storable(body: ChatCompletionRequest | CompletionRequest) -> None:
    """A job answers later and elsewhere: `store` keeps what the route answers only."""
    if isinstance(body, ChatCompletionRequest) and body.store:
        raise InvalidRequest("store: true keeps what the chat completions route answers; a "
                             "background job or a batch line is not stored.", param="store")


def _prediction(raw: dict[str, Any] | None) -> str | None:
    """Predicted Outputs' `{"type": "content", "content": ...}`: its text (a string, or
    text parts joined)."""
    if raw is None:
        return None
    if raw.get("type") != "content" or set(raw) - {"type", "content"}:
        raise InvalidRequest("prediction must be {\"type\": \"content\", \"content\": ...}.",
                             param="prediction")
    content = raw.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            and set(p) == {"type", "text"} for p in content):
        return "".join(p["text"] for p in content)
    raise InvalidRequest("prediction.content must be a string or a list of text parts.",
                         param="prediction.content")


def _prompts(prompt: str | list[str] | list[int] | list[list[int]],
             ) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
    """A completion's prompts (one choice each): as text (one string, or a list of
    several), or as token ids (one list of ids, or a list of such lists); the other is
    empty."""
    if isinstance(prompt, str):
        return (prompt,), ()
    if not prompt:
        raise InvalidRequest("'prompt' is an empty list.", param="prompt")
    if all(isinstance(p, str) for p in prompt):
        return tuple(p for p in prompt if isinstance(p, str)), ()
    lists: list[Any] = [prompt] if all(isinstance(p, int) for p in prompt) else list(prompt)
    ids: list[tuple[int, ...]] = []
    for i, p in enumerate(lists):
        if not isinstance(p, list) or not p or \
                not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in p):
            raise InvalidRequest("'prompt' is a string, a list of strings, a list of token ids "
                                 "or a list of such lists (non-empty, ids >= 0), not a mix.",
                                 param="prompt" if len(lists) == 1 else f"prompt[{i}]")
        ids.append(tuple(p))
    return ("",) * len(ids), tuple(ids)


def _tools(raw: list[dict[str, Any]] | None) -> tuple[FunctionTool, ...]:
    out = []
    for i, tool in enumerate(raw or ()):
        if tool.get("type") != "function":
            raise InvalidRequest(f"Invalid value for 'tools[{i}].type': {tool.get('type')!r}; "
                                 "only 'function' tools are supported.", param=f"tools[{i}].type")
        fn = tool.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InvalidRequest("A function tool needs function.name.",
                                 param=f"tools[{i}].function.name")
        params = fn.get("parameters")
        if params is not None:
            check_schema(params, f"tools[{i}].function.parameters")
        description, strict = fn.get("description"), fn.get("strict")
        known = {"name", "description", "parameters", "strict"}
        extra = {k: v for k, v in fn.items() if k not in known}
        extra |= {f"tool.{k}": v for k, v in tool.items() if k not in ("type", "function")}
        out.append(FunctionTool(fn["name"], description if isinstance(description, str) else None,
                                params, strict if isinstance(strict, bool) else None,
                                extra or NO_EXTRA))
    return tuple(out)


def _tool_choice(raw: str | dict[str, Any] | None,
                 tools: tuple[FunctionTool, ...]) -> ToolChoice | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return tool_choice_mode(raw, tools)
    fn = raw.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    if raw.get("type") != "function" or not isinstance(name, str):
        raise InvalidRequest("tool_choice must be none, auto, required or "
                             '{"type": "function", "function": {"name": ...}}.', param="tool_choice")
    return named_tool(name, tools, "tool_choice")


_STRING_MODES: dict[str, ToolChoiceMode] = {"none": "none", "auto": "auto", "required": "required"}


def tool_choice_mode(raw: str, tools: tuple[FunctionTool, ...]) -> ToolChoice:
    """`tool_choice` given as a string (chat completions and the Responses API alike)."""
    mode = _STRING_MODES.get(raw)
    if mode is None:
        raise InvalidRequest(f"Invalid value for 'tool_choice': {raw!r}.", param="tool_choice")
    if mode == "required" and not tools:
        raise InvalidRequest("tool_choice 'required' needs tools.", param="tool_choice")
    return ToolChoice(mode)


def named_tool(name: str, tools: tuple[FunctionTool, ...], param: str) -> ToolChoice:
    """`tool_choice` naming one function, which must be among `tools`."""
    if name not in {t.name for t in tools}:
        raise InvalidRequest(f"tool_choice names {name!r}, which is not in tools.", param=param)
    return ToolChoice("function", name)


def _response_format(raw: dict[str, Any] | None) -> ResponseFormat | None:
    if raw is None:
        return None
    kind = raw.get("type")
    if kind in ("text", "json_object"):
        return ResponseFormat(kind)
    if kind != "json_schema":
        raise InvalidRequest(f"Invalid value for 'response_format.type': {kind!r}.",
                             param="response_format.type")
    spec = raw.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise InvalidRequest("response_format json_schema needs json_schema.name.",
                             param="response_format.json_schema")
    return json_schema_format(spec, "response_format.json_schema.schema")


def json_schema_format(spec: dict[str, Any], param: str) -> ResponseFormat:
    """A `json_schema` response format from its name, schema (checked when given: a 400
    on `param`), strict and description: chat's `response_format.json_schema` and the
    Responses API's `text.format` hold the same fields."""
    schema = spec.get("schema")
    if schema is not None:
        check_schema(schema, param)
    strict, description = spec.get("strict"), spec.get("description")
    return ResponseFormat("json_schema", spec["name"], schema,
                          strict if isinstance(strict, bool) else None,
                          description if isinstance(description, str) else None)


def check_schema(schema: Any, param: str) -> None:
    if not isinstance(schema, dict):
        raise InvalidRequest(f"'{param}' must be a JSON Schema object.", param=param)
    try:
        key = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise InvalidRequest(f"'{param}' is not a JSON Schema.", param=param) from exc
    error = _schema_error(key)
    if error is not None:
        raise InvalidRequest(f"'{param}' is not a valid JSON Schema: {error}", param=param)


@functools.lru_cache(maxsize=1024)
def _schema_error(canonical: bytes) -> str | None:
    """Why a schema (canonical JSON) is not valid JSON Schema, or None. Remembered: a
    check against the 2020-12 metaschema costs ~3 ms, and clients resend the same tools
    with every turn."""
    # imported here: only requests with schemas pay for it (no type stubs are installed)
    import jsonschema  # type: ignore[import-untyped,unused-ignore]  # stubs only with types-jsonschema

    schema = orjson.loads(canonical)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return str(exc.message)
    return None
