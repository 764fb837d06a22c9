"""What the api refuses of a request before it is routed, beyond its schema: more choices
than the server allows, and what the embedded engine does not serve (penalties,
logit_bias, several choices, fields redline does not model, earlier tool turns), a 400
with `param` set rather than a silent drop. A remote OpenAI-compatible model gets every
field (the upstream decides).

Whether the model has the capabilities the request needs (chat or completions, tools,
json_schema, vision, logprobs) is not checked here: the router checks that, once, for
every request it plans (routing/capabilities.py, Router.check), after an A/B arm may
have changed the model; two copies of that check had drifted apart in their answers."""

from __future__ import annotations

from redline.config import ModelConfig, RedlineConfig
from redline.errors import InvalidRequest
from redline.types import GenerationRequest


def check(config: RedlineConfig, request: GenerationRequest) -> None:
    """Raise InvalidRequest for more than `max_n` choices, or for what the named model's
    embedded engine does not serve (a model not in the configuration, e.g. a test's
    fake, and `auto` are not checked here)."""
    if request.sampling.n > config.server.max_n:
        raise InvalidRequest(f"n is {request.sampling.n}; this server allows at most "
                             f"{config.server.max_n} choices.", param="n")
    model = next((m for m in config.models if m.name == request.model), None)
    if model is not None and model.backend == "local":
        _local(model, request)


def _local(model: ModelConfig, request: GenerationRequest) -> None:
    s = request.sampling
    refused = [("n", s.n > 1), ("logit_bias", bool(s.logit_bias)),
               ("presence_penalty", bool(s.presence_penalty)),
               ("frequency_penalty", bool(s.frequency_penalty))]
    refused += [(name, True) for name in request.extra]
    # earlier tool turns: the embedded engine's chat template renders text only
    refused.append(("messages", any(m.tool_calls or m.tool_call_id for m in request.messages or ())))
    for param, asked in refused:
        if asked:
            raise InvalidRequest(f"The model `{model.name}` (the embedded engine) does not "
                                 f"serve '{param}'.", param=param)
