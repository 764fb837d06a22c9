"""OpenAI request schemas, with bounds. Unknown OpenAI fields are accepted and
ignored (clients send many); redline's own extensions are typed here too."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from redline.errors import InvalidRequest
from redline.routing.names import parse_tier
from redline.types import GenerationRequest, Message, SamplingParams

DEFAULT_MAX_TOKENS = 256


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ContentPart(_Open):
    type: str
    text: str | None = None


class ChatMessage(_Open):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text or "" for p in self.content if p.type == "text")


class StreamOptions(_Open):
    include_usage: bool = False


class Notify(_Open):
    webhook: str | None = None
    email: str | None = None


class _SamplingFields(_Open):
    model: str = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    n: int | None = Field(None, ge=1, le=1, description="only n=1 is served")
    stop: str | list[str] | None = None
    seed: int | None = None
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

    def sampling(self, max_tokens: int | None) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return SamplingParams(
            max_tokens=max_tokens or DEFAULT_MAX_TOKENS,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            stop=stop,
            seed=self.seed,
            ignore_eos=self.ignore_eos,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    def to_generation(self, tier: str | None, tenant: str, no_cache: bool = False) -> GenerationRequest:
        messages = tuple(Message("system" if m.role == "developer" else m.role, m.text())
                         for m in self.messages)
        return GenerationRequest(
            model=self.model,
            messages=messages,
            sampling=self.sampling(self.max_completion_tokens or self.max_tokens),
            tier=_tier(tier),
            tenant=tenant,
            use_cache=self.cache is not False and not no_cache,
            user=self.user,
            allow_background=self.allow_background,
        )


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] = Field(...)
    echo: bool = False

    def to_generation(self, tier: str | None, tenant: str, no_cache: bool = False) -> GenerationRequest:
        prompt = self.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise InvalidRequest("only one prompt per request is served", param="prompt")
            prompt = prompt[0]
        return GenerationRequest(
            model=self.model,
            prompt=prompt,
            sampling=self.sampling(self.max_tokens or 16),
            tier=_tier(tier),
            tenant=tenant,
            use_cache=self.cache is not False and not no_cache,
            user=self.user,
            allow_background=self.allow_background,
        )


def _tier(value: str | None) -> Any:
    return parse_tier(value)  # routing/names.py: the one tier parser
