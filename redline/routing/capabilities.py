"""What each model can serve, and what a request needs from it.

A model's capabilities come from its config (`ModelConfig.effective_capabilities()`:
a remote engine is asked for everything, a local model gets what the embedded engine
serves, a base model lists no `chat`). The router only chooses, orders and falls back
to models that have everything the request needs; a request naming a model that lacks
one is a 400, never an answer from the wrong kind of model: `param: "model"` for the
wrong kind (chat to a base model), else the field that asked (`tools`, ...).

This is the one capability check: the router runs it on every request it plans (live,
a job's run, a batch line, Responses, Messages), after an A/B arm may have changed the
model; the api adds only what is not a capability (n, the embedded engine's fields)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from redline.config import REMOTE_CAPABILITIES, ModelConfig
from redline.errors import InvalidRequest
from redline.types import GenerationRequest

_CHAT = frozenset(("chat",))
_KINDS = frozenset(("chat", "completions"))
# the request field that asks for each capability other than the kind, named in the 400
_PARAM = {"tools": "tools", "json_schema": "response_format", "vision": "messages",
          "logprobs": "logprobs"}
# the request's own fields that redline does not model (GenerationRequest.unmodelled):
# served only by an engine that is passed them, i.e. a remote one; the 400 names the field
FIELDS = "fields"


def required(request: GenerationRequest) -> frozenset[str]:
    """The capabilities a request needs: chat or completions, and tools, json_schema,
    vision, logprobs when it asks for them (`GenerationRequest.needs`)."""
    return request.needs()


class Capabilities:
    """Capabilities by model name; a model not listed is asked for everything (its
    backend decides, as a remote engine does)."""

    def __init__(self, by_model: Mapping[str, Iterable[str]] | None = None,
                 passes_fields: Iterable[str] = ()) -> None:
        """`passes_fields`: the models whose engine is sent fields redline does not model
        (remote ones); a model not listed in `by_model` is one of them."""
        passes = frozenset(passes_fields)
        self._by_model = {name: frozenset(caps) | ({FIELDS} if name in passes else set())
                          for name, caps in (by_model or {}).items()}

    @classmethod
    def of_models(cls, models: Iterable[ModelConfig]) -> Capabilities:
        """The configured models' capabilities (`ModelConfig.effective_capabilities`);
        the remote ones are sent the fields redline does not model."""
        models = list(models)
        return cls({m.name: m.effective_capabilities() for m in models},
                   [m.name for m in models if m.backend == "openai"])

    def of(self, model: str) -> frozenset[str]:
        return self._by_model.get(model, REMOTE_CAPABILITIES | {FIELDS})

    def serves(self, model: str, needs: frozenset[str]) -> bool:
        return needs <= self.of(model)

    def only(self, models: Iterable[str], needs: frozenset[str]) -> list[str]:
        """`models` in their order, less those that lack something `needs`."""
        return [m for m in models if self.serves(m, needs)]

    def check(self, model: str, needs: frozenset[str], fields: Sequence[str] = ()) -> None:
        """A 400 naming what `model` lacks, when it lacks anything `needs`; `fields`: the
        request's unmodelled fields, one of which is named when that is what it lacks."""
        missing = needs - self.of(model)
        if not missing:
            return
        has = self.of(model)
        if missing == {FIELDS}:
            raise _unserved(f"The model `{model}` (the embedded engine) does not serve", fields)
        missing -= {FIELDS}
        if not missing & _KINDS:  # the right kind of model, without a feature asked for
            lacking = sorted(missing)
            raise InvalidRequest(f"The model `{model}` does not support {', '.join(lacking)}.",
                                 param=_PARAM[lacking[0]])
        if missing == _CHAT and "completions" in has:
            raise InvalidRequest(
                f"The model `{model}` serves completions only (a base model: it has no chat "
                "capability). Send its prompt to /v1/completions, or use a chat model or `auto`.",
                param="model", code="model_not_supported")
        raise InvalidRequest(
            f"The model `{model}` does not support {', '.join(sorted(missing))} "
            f"(it serves: {', '.join(sorted(has)) or 'nothing'}).",
            param="model", code="model_not_supported")

    def none_serves(self, models: Iterable[str], needs: frozenset[str],
                    fields: Sequence[str] = ()) -> InvalidRequest:
        """The 400 for `auto` when none of `models` serves all of `needs`."""
        models = list(models)
        if FIELDS in needs and self.only(models, needs - {FIELDS}):
            return _unserved("Every model here that could answer this is embedded, and "
                             "none serves", fields)
        needs -= {FIELDS}
        lacking = sorted(needs - frozenset().union(*(self.of(m) for m in models)))
        if lacking and not _KINDS & set(lacking):  # a feature no model has: name its field
            return InvalidRequest(f"No model here serves {', '.join(lacking)}.",
                                  param=_PARAM[lacking[0]])
        return InvalidRequest(
            f"No configured model serves {', '.join(sorted(needs))}; name a model that does.",
            param="model", code="model_not_supported")


def _unserved(what: str, fields: Sequence[str]) -> InvalidRequest:
    name = fields[0] if fields else None
    return InvalidRequest(f"{what} '{name}': redline does not model it, so it is passed "
                          "on only to a remote engine.", param=name)
