"""What a request needs of its model, checked against the configuration before it is
routed: a capability the model lacks is a 400 with `param` set, never a silent drop.

A remote OpenAI-compatible model gets every field (the upstream decides); the embedded
engine serves only what redline implements on it, so anything else it is asked for
(fields redline does not model, a schema keyword its grammar cannot enforce) is refused
here rather than ignored."""

from __future__ import annotations

from redline.config import ModelConfig, RedlineConfig
from redline.engine.grammar import schema_grammar
from redline.engine.tools import grammar as tool_grammar
from redline.errors import InvalidRequest
from redline.routing.capabilities import Capabilities
from redline.types import GenerationRequest

# the request field that asks for each capability, named in the 400
_PARAM = {"chat": "messages", "completions": "prompt", "tools": "tools",
          "json_schema": "response_format", "vision": "messages", "logprobs": "logprobs"}


def check(config: RedlineConfig, request: GenerationRequest, auto: str = "auto") -> None:
    """Raise InvalidRequest when no configured model could serve `request`: the named one
    (not in the configuration, e.g. a test's fake: not checked), or for `auto` any."""
    if request.sampling.n > config.server.max_n:
        raise InvalidRequest(f"n is {request.sampling.n}; this server allows at most "
                             f"{config.server.max_n} choices.", param="n")
    needs = request.needs()
    if request.model == auto:
        if not any(needs <= m.effective_capabilities() for m in config.models):
            missing = sorted(needs - set().union(*(m.effective_capabilities() for m in config.models)))
            raise InvalidRequest(f"No model here serves {', '.join(missing) or 'this request'}.",
                                 param=_PARAM.get(missing[0], None) if missing else None)
        return
    model = next((m for m in config.models if m.name == request.model), None)
    if model is None:
        return
    missing = sorted(needs - model.effective_capabilities())
    if {"chat", "completions"} & set(missing):  # the wrong kind of model: param "model"
        Capabilities({model.name: model.effective_capabilities()}).check(model.name, needs)
    if missing:
        raise InvalidRequest(f"The model `{model.name}` does not support "
                             f"{', '.join(missing)}.", param=_PARAM[missing[0]])
    if model.backend == "local":
        _local(model, request)


def _local(model: ModelConfig, request: GenerationRequest) -> None:
    """What the embedded engine serves: a 400 here, before routing, for a field it does
    not model or a schema its grammar cannot enforce (the backend checks them again)."""
    if request.extra:
        param = next(iter(request.extra))
        raise InvalidRequest(f"The model `{model.name}` (the embedded engine) does not "
                             f"serve '{param}'.", param=param)
    fmt = request.response_format
    if fmt is not None and fmt.type == "json_schema":
        schema_grammar(dict(fmt.schema or {}), "response_format")
    tool_grammar(request.tools, request.tool_choice)
