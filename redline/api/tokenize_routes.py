"""POST /tokenize and POST /detokenize, as vLLM's server has them (llama.cpp's server has
its own of the same names): how many tokens a request's prompt is to a model, before
sending it, so that a client can keep a prompt within the model's context and its budget.

/tokenize takes a chat completion body (`messages`, and `tools`, which the embedded engine
renders into the prompt) or a completion body (one `prompt` string), plus vLLM's
`add_special_tokens` and `return_token_strs`; it answers vLLM's `{"count", "max_model_len",
"tokens", "token_strs"}`. /detokenize takes `{"model", "tokens"}` and answers
`{"prompt"}`. /apply-template (llama.cpp's server's) takes a chat body and answers
`{"prompt"}`: the text the model's template renders. An embedded model answers here, from
the tokenizer and template its engine uses; a remote model's body goes to its engine's own
endpoint (vLLM's, SGLang's, llama.cpp's), the model name mapped, and its answer comes back
as it is. `auto` is a 400: the count depends on the
model."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from redline.api import upstream
from redline.api.errors import validated
from redline.api.schemas import ChatCompletionRequest, CompletionRequest
from redline.api.services import Services, services_of
from redline.backends.local import LocalBackend
from redline.backends.openai_wire import error_message, request_body
from redline.backends.pool import replicas_of
from redline.errors import BackendError, InvalidRequest, ModelNotFound
from redline.routing.names import AUTO
from redline.types import GenerationRequest

router = APIRouter()


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(..., min_length=1)
    tokens: list[int]


async def read_json(request: Request) -> dict[str, Any]:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest("The body is not valid JSON.") from exc
    if not isinstance(body, dict):
        raise InvalidRequest("The body must be a JSON object.")
    return body


async def counted_model(services: Services, request: Request, body: dict[str, Any]) -> str:
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise InvalidRequest("model is required.", param="model")
    if name == AUTO:
        raise InvalidRequest("Name a model: how many tokens a prompt is depends on the model.",
                             param="model")
    if name not in services.pipeline.model_names():
        raise ModelNotFound(f"The model `{name}` does not exist.", param="model")
    await services.gate.check_model(request.scope, name)  # a key's allowlist and budget
    return name


def local_backend(services: Services, name: str) -> LocalBackend | None:
    """The embedded engine that serves model `name`, if an embedded one does."""
    backend = services.pipeline.router.backends.get(name)
    leaf = None if backend is None else replicas_of(backend)[0]
    return leaf if isinstance(leaf, LocalBackend) else None


async def ask_engine(services: Services, name: str, path: str,
                     body: dict[str, Any]) -> httpx.Response:
    """A remote model's engine's own /tokenize or /detokenize: its answer, or its 4xx
    about the body; a 400 where it has no such endpoint."""
    model = next((m for m in services.config.models if m.name == name), None)
    if model is None or model.backend != "openai" or not model.replica_urls():
        raise InvalidRequest(f"The model `{name}` cannot count tokens here.", param="model")
    r = await upstream.post(model, path, body)
    if r.status_code in (404, 405):
        raise InvalidRequest(f"The engine behind `{name}` has no {path}.", param="model")
    if r.status_code >= 500 or r.status_code in (401, 403):
        raise BackendError(f"{name}: upstream answered {r.status_code}")
    return r


async def chat_tokens(services: Services, name: str, gen: GenerationRequest) -> int:
    """The prompt tokens of the chat `gen` to the model `name`, as its usage would count
    them: an embedded model's tokenizer on the prompt its engine renders (tools too), or
    a remote model's engine at its /tokenize, on the chat redline would send it."""
    backend = local_backend(services, name)
    if backend is not None:
        return len(backend.tokens_of(gen, False))
    chat = request_body(gen, name)[1]
    r = await ask_engine(services, name, "/tokenize",
                         {k: chat[k] for k in ("messages", "tools") if k in chat})
    try:
        answer = r.json()
    except ValueError:
        answer = None
    if r.status_code >= 400:  # the engine's word on the prompt
        raise InvalidRequest(error_message(answer) or f"The engine behind `{name}` refused "
                             f"the prompt ({r.status_code}).")
    count = answer.get("count") if isinstance(answer, dict) else None
    if not isinstance(count, int):
        raise BackendError(f"{name}: its engine's /tokenize gave no count")
    return count


async def forward(services: Services, name: str, path: str, body: dict[str, Any]) -> Response:
    """A remote model's engine answers, as it answers."""
    r = await ask_engine(services, name, path, body)
    return Response(r.content, status_code=r.status_code, media_type="application/json")


async def _embedded(request: Request, path: str) -> tuple[dict[str, Any], LocalBackend] | Response:
    """The body and the embedded engine of the model it names; for a remote model, its
    engine's own answer at `path`."""
    services = services_of(request.app)
    body = await read_json(request)
    name = await counted_model(services, request, body)
    backend = local_backend(services, name)
    if backend is None:
        return await forward(services, name, path, body)
    return body, backend


def _flag(body: dict[str, Any], key: str, default: bool) -> bool:
    value = body.pop(key, default)
    if not isinstance(value, bool):
        raise InvalidRequest(f"{key} must be true or false.", param=key)
    return value


@router.post("/tokenize", response_model=None)
async def tokenize(request: Request) -> Response:
    got = await _embedded(request, "/tokenize")
    if isinstance(got, Response):
        return got
    body, backend = got
    chat = "messages" in body
    special = _flag(body, "add_special_tokens", not chat)
    strs = _flag(body, "return_token_strs", False)
    if not chat:  # a text prompt has no template (vLLM's /tokenize reads it for chats only)
        _flag(body, "add_generation_prompt", True)
    if chat and special:
        raise InvalidRequest("A chat template writes its own special tokens "
                             "(add_special_tokens: false).", param="add_special_tokens")
    parsed: ChatCompletionRequest | CompletionRequest = (
        validated(ChatCompletionRequest, body) if chat else validated(CompletionRequest, body))
    gen = parsed.to_generation(None, "anonymous")
    if gen.prompts:
        raise InvalidRequest("/tokenize takes one prompt.", param="prompt")
    tokens = backend.tokens_of(gen, special)
    out: dict[str, Any] = {"count": len(tokens), "max_model_len": backend.cfg.n_ctx,
                           "tokens": tokens, "token_strs": None}
    if strs:
        out["token_strs"] = backend.text_of(tokens, special=True)[1]
    return Response(orjson.dumps(out), media_type="application/json")


@router.post("/apply-template", response_model=None)
async def apply_template(request: Request) -> Response:
    """llama.cpp's server's /apply-template: a chat body's prompt as the model's template
    renders it (`{"prompt"}`), to see what the model is sent. A remote model's engine
    answers it where it has one (llama.cpp's server does; vLLM's does not: a 400)."""
    got = await _embedded(request, "/apply-template")
    if isinstance(got, Response):
        return got
    body, backend = got
    if "messages" not in body:
        raise InvalidRequest("messages is required.", param="messages")
    gen = validated(ChatCompletionRequest, body).to_generation(None, "anonymous")
    return Response(orjson.dumps({"prompt": backend.chat_text(gen)}),
                    media_type="application/json")


@router.post("/detokenize", response_model=None)
async def detokenize(request: Request) -> Response:
    got = await _embedded(request, "/detokenize")
    if isinstance(got, Response):
        return got
    body, backend = got
    parsed = validated(DetokenizeRequest, body)
    text, _ = backend.text_of(parsed.tokens, special=True)
    return Response(orjson.dumps({"prompt": text}), media_type="application/json")


__all__ = ["chat_tokens", "counted_model", "local_backend", "read_json", "router"]
