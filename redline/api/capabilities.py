"""What the api refuses of a request before it is routed, beyond its schema: more choices
than the server allows, and what the embedded engine does not serve, a 400 with `param`
set rather than a silent drop.

A remote OpenAI-compatible model gets every field (the upstream decides); the embedded
engine serves only what redline implements on it, so anything else it is asked for
(fields redline does not model, a schema keyword its grammar cannot enforce) is refused
here rather than ignored.

Whether the model has the capabilities the request needs (chat or completions, tools,
json_schema, vision, logprobs) is not checked here: the router checks that, once, for
every request it plans (routing/capabilities.py, Router.check), after an A/B arm may
have changed the model; two copies of that check had drifted apart in their answers."""

from __future__ import annotations

from redline.backends.local_features import guided, named_as_sent
from redline.config import ModelConfig, RedlineConfig
from redline.engine.grammar import schema_grammar
from redline.engine.tools import grammar as tool_grammar
from redline.errors import InvalidRequest
from redline.routing.names import AUTO
from redline.types import GenerationRequest


def check(config: RedlineConfig, request: GenerationRequest) -> None:
    """Raise InvalidRequest for more than `max_n` choices (all prompts'), or for what the named model's
    embedded engine does not serve (a model not in the configuration, e.g. a test's
    fake, and `auto` are not checked here)."""
    if request.sampling.n > config.server.max_n:
        raise InvalidRequest(f"n is {request.sampling.n}; this server allows at most "
                             f"{config.server.max_n} choices.", param="n")
    if request.choices > config.server.max_n:  # a list of prompts: n choices each
        raise InvalidRequest(f"{len(request.prompts)} prompts of n={request.sampling.n} are "
                             f"{request.choices} choices; this server allows at most "
                             f"{config.server.max_n}.", param="prompt")
    if request.prompt_ids and request.model == AUTO:
        raise InvalidRequest("A prompt of token ids names its model: ids mean a token only in "
                             "that model's vocabulary.", param="model")
    model = next((m for m in config.models if m.name == request.model), None)
    if model is not None and model.backend == "local":
        _local(model, request)


def _local(model: ModelConfig, request: GenerationRequest) -> None:
    """What the embedded engine serves: a 400 here, before routing, for a field it does
    not model or a schema its grammar cannot enforce (the backend checks them again)."""
    unknown = request.unmodelled()
    if unknown:
        raise InvalidRequest(f"The model `{model.name}` (the embedded engine) does not "
                             f"serve '{unknown[0]}'.", param=unknown[0])
    fmt = request.response_format
    if fmt is not None and fmt.type == "json_schema":
        schema_grammar(dict(fmt.schema or {}), "response_format")
    guided(request)  # vLLM's structured outputs
    with named_as_sent(request):
        tool_grammar(request.tools, request.tool_choice, request.parallel_tool_calls)
