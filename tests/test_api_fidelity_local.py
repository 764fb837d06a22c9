"""The embedded engine (the real SmolLM2) through the official `openai` client: logprobs
from its own logits, and a 400 with `param` for what it does not serve."""

from __future__ import annotations

import json
import math
import re
import uuid
from typing import Any

import httpx
import openai
import pytest
from conftest import SMOL

pytestmark = pytest.mark.slow

ASK = [{"role": "user", "content": "Name a fruit."}]


def client(server: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0)


def test_chat_logprobs_are_the_models_own(smol_server: Any) -> None:
    c = client(smol_server)
    r = c.chat.completions.create(model=SMOL, messages=ASK, max_tokens=6, temperature=0,
                                  logprobs=True, top_logprobs=3, extra_body={"cache": False})
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        tops = [o.logprob for o in t.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        assert math.isclose(t.logprob, tops[0], abs_tol=1e-5)  # greedy: the likeliest token
        assert bytes(t.bytes or []).decode() == t.token
    streamed = c.chat.completions.create(model=SMOL, messages=ASK, max_tokens=6, temperature=0,
                                         logprobs=True, top_logprobs=3, stream=True,
                                         extra_body={"cache": False})
    got = [t for ch in streamed for choice in ch.choices if choice.logprobs
           for t in choice.logprobs.content or ()]
    assert [(t.token, round(t.logprob, 4)) for t in got] == \
        [(t.token, round(t.logprob, 4)) for t in content]


def test_text_completion_logprobs(smol_server: Any) -> None:
    r = client(smol_server).completions.create(model=SMOL, prompt="The sky is", max_tokens=5,
                                               temperature=0, logprobs=2,
                                               extra_body={"cache": False})
    lp = r.choices[0].logprobs
    assert lp is not None and lp.tokens and "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    assert all(len(top) == 2 for top in lp.top_logprobs or ())


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"n": 9}, "n"), ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "string", "format": "email"}}}}, "response_format"),
    # fields of a message, a content part or a tool: the engine would drop them
    ({"messages": [{"role": "user", "content": "hi", "prefix": True}]}, "messages[0].prefix"),
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]},
     "messages[0].content[0].cache_control"),
    ({"tools": [{"type": "function", "function": {"name": "f", "deprecated": True}}]},
     "tools[0].function.deprecated"),
])
def test_what_the_engine_does_not_serve_is_a_400(smol_server: Any, extra: dict[str, Any],
                                                 param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(smol_server).chat.completions.create(model=SMOL, messages=ASK, max_tokens=2,
                                                    extra_body=extra)
    assert err.value.body["param"] == param  # type: ignore[index]


@pytest.mark.parametrize(("extra", "param"), [
    ({"service_tier": "flex"}, "service_tier"),
    ({"modalities": ["text", "audio"]}, "modalities"), ({"echo": "yes"}, "echo"),
    ({"skip_special_tokens": False}, "skip_special_tokens"),
    ({"stop_token_ids": [10 ** 7]}, "stop_token_ids"), ({"min_tokens": 9}, "min_tokens"),
    # an empty object is no default everywhere: this one turns search on
    ({"web_search_options": {}}, "web_search_options"),
    ({"verbosity": "high"}, "verbosity"),  # GPT-5's: only its default says nothing here
    ({"prompt_cache_retention": "forever"}, "prompt_cache_retention"),
])
def test_other_values_of_fields_taken_at_their_defaults_are_a_400(
        smol_server: Any, extra: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(smol_server).chat.completions.create(model=SMOL, messages=ASK, max_tokens=4,
                                                    extra_body=extra)
    assert err.value.body["param"] == param  # type: ignore[index]


def test_fields_at_the_value_every_engine_serves_are_taken(smol_server: Any) -> None:
    """What clients send at its default (OpenAI's `store: false`, `service_tier: "auto"`,
    `modalities: ["text"]`; vLLM's `skip_special_tokens: true`, `echo: false`) asks for
    what the embedded engine does: the answer is the same as without them."""
    c = client(smol_server)
    plain = c.chat.completions.create(model=SMOL, messages=ASK, max_tokens=6, temperature=0,
                                      extra_body={"cache": False})
    r = c.chat.completions.create(model=SMOL, messages=ASK, max_tokens=6, temperature=0,
                                  store=False, service_tier="auto", modalities=["text"],
                                  verbosity="medium", prompt_cache_retention="24h",
                                  extra_body={"cache": False, "skip_special_tokens": True,
                                              "echo": False, "chat_template_kwargs": {}})
    assert r.choices[0].message.content == plain.choices[0].message.content
    # the Responses API's own spellings of the same: text.verbosity, prompt_cache_retention
    for retention in ("in_memory", "24h"):
        got = c.responses.create(model=SMOL, input=ASK[0]["content"], max_output_tokens=6,
                                 temperature=0, text={"verbosity": "medium"},
                                 prompt_cache_retention=retention, extra_body={"cache": False})
        assert got.output_text == plain.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as err:
        c.responses.create(model=SMOL, input="hi", max_output_tokens=2,
                           text={"verbosity": "low"})
    assert err.value.body["param"] == "text.verbosity"  # type: ignore[index]


def test_a_stored_completion_of_the_embedded_engine(smol_server: Any) -> None:
    """`store: true` with metadata (what Qwen Code sends on every call) is kept by redline,
    whichever engine answers: read back as answered."""
    c = client(smol_server)
    r = c.chat.completions.create(model=SMOL, messages=ASK, max_tokens=6, temperature=0,
                                  store=True, metadata={"sessionId": "s1", "promptId": "p1"})
    got = c.chat.completions.retrieve(r.id)
    assert got.choices[0].message.content == r.choices[0].message.content
    assert r.id in [x.id for x in c.chat.completions.list(metadata={"sessionId": "s1"})]
    c.chat.completions.delete(r.id)


def test_vllm_sampling_fields_are_honoured(smol_server: Any) -> None:
    """vLLM's min_tokens, repetition_penalty and include_stop_str_in_output on the
    embedded engine, through the official client."""
    c = client(smol_server)
    ask = [{"role": "user", "content": "Reply with one word: yes or no. Is water wet?"}]
    base = {"model": SMOL, "messages": ask, "max_tokens": 30, "temperature": 0}
    short = c.chat.completions.create(**base, extra_body={"cache": False})
    assert short.usage is not None and short.usage.completion_tokens < 10
    held = c.chat.completions.create(**base, extra_body={"cache": False, "min_tokens": 10})
    assert held.usage is not None and held.usage.completion_tokens >= 10
    text = short.choices[0].message.content or ""
    stop = text.strip()[-1:]  # its last character ends it, kept or not
    cut = c.chat.completions.create(**base, stop=[stop], extra_body={"cache": False})
    kept = c.chat.completions.create(**base, stop=[stop], extra_body={
        "cache": False, "include_stop_str_in_output": True})
    assert kept.choices[0].message.content == (cut.choices[0].message.content or "") + stop
    # a strong repetition penalty changes a greedy answer that repeats its prompt's words
    echo = [{"role": "user", "content": "Repeat after me: the cat sat on the mat."}]
    same = c.chat.completions.create(model=SMOL, messages=echo, max_tokens=12, temperature=0,
                                     extra_body={"cache": False})
    penalised = c.chat.completions.create(model=SMOL, messages=echo, max_tokens=12,
                                          temperature=0,
                                          extra_body={"cache": False, "repetition_penalty": 3.0})
    assert penalised.choices[0].message.content != same.choices[0].message.content


def test_echo_with_logprobs_scores_the_prompt(smol_server: Any) -> None:
    """OpenAI's `echo` with `logprobs` (how lm-evaluation-harness scores a continuation):
    the text starts with the prompt, and every prompt token has its log-probability (the
    first's is null), for each prompt of a list; streamed, the first event echoes it."""
    c = client(smol_server)
    france = "The capital of France is"
    prompts = [f"{france} Paris", f"{france} London"]
    r = c.completions.create(model=SMOL, prompt=prompts, max_tokens=1, temperature=0,
                             logprobs=1, echo=True)
    scores = []
    for choice, prompt in zip(sorted(r.choices, key=lambda ch: ch.index), prompts, strict=True):
        lp = choice.logprobs
        assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
        assert choice.text.startswith(prompt) and "".join(lp.tokens) == choice.text
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert all(v is not None and v <= 0 for v in lp.token_logprobs[1:])
        for value, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:], strict=True):
            assert top and max(top.values()) >= value - 1e-5  # type: ignore[operator]
        n_prompt = len(lp.tokens) - 1  # one generated token
        scores.append(lp.token_logprobs[n_prompt - 1])  # the last prompt word's
    assert r.usage is not None and r.usage.completion_tokens == 2
    assert scores[0] > scores[1]  # " Paris" is likelier than " London" here
    plain = c.completions.create(model=SMOL, prompt=prompts[0], max_tokens=3, temperature=0,
                                 echo=True)
    assert plain.choices[0].text.startswith(prompts[0]) and plain.choices[0].logprobs is None
    events = list(c.completions.create(model=SMOL, prompt=prompts[0], max_tokens=3,
                                       temperature=0, echo=True, stream=True))
    assert events[0].choices[0].text.startswith(prompts[0])
    assert "".join(e.choices[0].text for e in events if e.choices) == plain.choices[0].text


def test_a_predicted_answer_is_the_same_and_usage_counts_the_prediction(
        smol_server: Any) -> None:
    """OpenAI's Predicted Outputs on the embedded engine: the prediction only drafts, so
    the answer is the one given without it, and usage says how much of it was taken."""
    c = client(smol_server)
    ask = [{"role": "user", "content": "Repeat exactly: the harbour master kept a log of "
                                       "every ship that came in."}]
    plain = c.chat.completions.create(model=SMOL, messages=ask, max_tokens=30, temperature=0,
                                      extra_body={"cache": False})
    text = plain.choices[0].message.content or ""
    got = c.chat.completions.create(model=SMOL, messages=ask, max_tokens=30, temperature=0,
                                    prediction={"type": "content", "content": text},
                                    extra_body={"cache": False})
    assert got.choices[0].message.content == text
    details = got.usage.completion_tokens_details  # type: ignore[union-attr]
    assert details is not None and (details.accepted_prediction_tokens or 0) > 0
    assert details.rejected_prediction_tokens is not None
    # text parts, streamed: the same text again
    parts = {"type": "content", "content": [{"type": "text", "text": text[:10]},
                                            {"type": "text", "text": text[10:]}]}
    streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model=SMOL, messages=ask, max_tokens=30, temperature=0, prediction=parts,  # type: ignore[arg-type]
        stream=True, extra_body={"cache": False}) if ch.choices)
    assert streamed == text
    # n = 2: each choice drafts from it, and usage adds both choices' counts
    two = c.chat.completions.create(model=SMOL, messages=ask, max_tokens=30, temperature=0,
                                    n=2, prediction={"type": "content", "content": text},
                                    extra_body={"cache": False})
    assert len(two.choices) == 2 and all(ch.message.content for ch in two.choices)
    both = two.usage.completion_tokens_details  # type: ignore[union-attr]
    assert both is not None
    assert (both.accepted_prediction_tokens or 0) > (details.accepted_prediction_tokens or 0)
    for bad, param in (({"type": "text", "content": "x"}, "prediction"),
                       ({"type": "content", "content": 3}, "prediction.content")):
        with pytest.raises(openai.BadRequestError) as err:
            c.chat.completions.create(model=SMOL, messages=ask, max_tokens=2, prediction=bad)  # type: ignore[arg-type]
        assert err.value.body["param"] == param  # type: ignore[index]


@pytest.mark.parametrize("extra", [
    {"structured_outputs": {"choice": ["positive", "negative", "neutral"]}},
    {"guided_choice": ["positive", "negative", "neutral"]},
])
def test_vllm_choice_constrains_the_answer_to_one_of_them(smol_server: Any,
                                                         extra: dict[str, Any]) -> None:
    c = client(smol_server)
    ask = [{"role": "user", "content": "Is this review positive or negative? 'I loved it.'"}]
    for seed in range(3):
        r = c.chat.completions.create(model=SMOL, messages=ask, max_tokens=8, temperature=1.0,
                                      seed=seed, extra_body={"cache": False, **extra})
        assert r.choices[0].message.content in ("positive", "negative", "neutral")


@pytest.mark.parametrize("extra", [
    {"structured_outputs": {"regex": r"\(\d{3}\) \d{3}-\d{4}"}},
    {"guided_regex": r"\(\d{3}\) \d{3}-\d{4}"},
])
def test_vllm_regex_constrains_the_whole_answer(smol_server: Any, extra: dict[str, Any]) -> None:
    c = client(smol_server)
    ask = [{"role": "user", "content": "Make up a US phone number."}]
    for seed in range(3):
        r = c.chat.completions.create(model=SMOL, messages=ask, max_tokens=24, temperature=1.0,
                                      seed=seed, extra_body={"cache": False, **extra})
        text = r.choices[0].message.content or ""
        assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", text), text
        assert r.choices[0].finish_reason == "stop"


def test_vllm_json_and_grammar_constrain_the_answer(smol_server: Any) -> None:
    c = client(smol_server)
    ask = [{"role": "user", "content": "Give a city and its country as JSON."}]
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                               "country": {"type": "string", "maxLength": 12}},
              "required": ["city", "country"], "additionalProperties": False}
    for extra in ({"structured_outputs": {"json": schema}}, {"guided_json": json.dumps(schema)}):
        r = c.chat.completions.create(model=SMOL, messages=ask, max_tokens=60, temperature=0,
                                      extra_body={"cache": False, **extra})
        got = json.loads(r.choices[0].message.content or "")
        assert set(got) == {"city", "country"}
    gbnf = 'root ::= "yes" | "no" | "maybe " [0-9]'
    for extra in ({"structured_outputs": {"grammar": gbnf}}, {"guided_grammar": gbnf}):
        r = c.chat.completions.create(model=SMOL, messages=ask, max_tokens=8, temperature=1.0,
                                      seed=1, extra_body={"cache": False, **extra})
        text = r.choices[0].message.content or ""
        assert text in ("yes", "no") or (text[:-1] == "maybe " and text[-1].isdigit()), text
    r = c.completions.create(model=SMOL, prompt="A JSON object:", max_tokens=40, temperature=0,
                             extra_body={"structured_outputs": {"json_object": True}})
    assert isinstance(json.loads(r.choices[0].text), dict)


@pytest.mark.parametrize(("extra", "param"), [
    ({"structured_outputs": {"regex": "(a)\\1"}}, "structured_outputs.regex"),
    ({"guided_regex": "(?=a)b"}, "guided_regex"),
    ({"guided_regex": 7}, "guided_regex"),
    ({"structured_outputs": {"choice": ["a"], "json": {}}}, "structured_outputs"),
    ({"guided_choice": ["a"], "guided_json": {}}, "guided_json"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_json": "{not json"}, "guided_json"),
    ({"guided_grammar": "root ::= missing"}, "guided_grammar"),
    ({"guided_choice": ["a"], "response_format": {"type": "json_object"}}, "guided_choice"),
])
def test_vllm_structured_outputs_it_cannot_serve_are_a_400(smol_server: Any,
                                                          extra: dict[str, Any],
                                                          param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(smol_server).chat.completions.create(model=SMOL, messages=ASK, max_tokens=4,
                                                    extra_body=extra)
    assert err.value.body["param"] == param  # type: ignore[index]


def test_an_answer_sent_back_as_it_came_is_taken(smol_server: Any) -> None:
    """An assistant message a client got from an answer and sends back holds fields that
    say nothing (`refusal: null`, `annotations: []`) and, from a reasoning engine, its
    reasoning, which no engine here is given back: none of them is a 400."""
    r = client(smol_server).chat.completions.create(model=SMOL, max_tokens=2, messages=[
        *ASK, {"role": "assistant", "content": "Apple.", "refusal": None, "annotations": [],
               "reasoning_content": "A fruit: apple."},  # type: ignore[list-item]
        {"role": "user", "content": "Another?"}], extra_body={"cache": False})
    assert r.choices[0].message.content


def test_usage_reports_the_engines_cached_prompt_tokens(smol_server: Any) -> None:
    c = client(smol_server)
    # a fresh prefix (the nonce comes first): only the template's opening can be cached
    system = f"{uuid.uuid4().hex} " + "You answer questions about fruit, briefly. " * 30

    def ask(question: str, **kw: Any) -> Any:
        return c.chat.completions.create(
            model=SMOL, max_tokens=3, temperature=0, extra_body={"cache": False},
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            **kw)

    first = ask("Name a fruit.").usage
    assert first is not None and first.prompt_tokens > 200
    assert first.prompt_tokens_details is not None
    assert (first.prompt_tokens_details.cached_tokens or 0) < 8
    second = ask("Name a red fruit.").usage
    assert second is not None and second.prompt_tokens_details is not None
    assert second.prompt_tokens_details.cached_tokens is not None
    assert first.prompt_tokens - 8 <= second.prompt_tokens_details.cached_tokens < \
        second.prompt_tokens
    chunks = list(ask("Name a green fruit.", stream=True,
                      stream_options={"include_usage": True}))
    streamed = chunks[-1].usage
    assert streamed is not None and streamed.prompt_tokens_details is not None
    assert first.prompt_tokens - 8 <= (streamed.prompt_tokens_details.cached_tokens or 0) < \
        streamed.prompt_tokens
    several = ask("Name a yellow fruit.", n=3).usage  # the prompt computed once, by choice 0
    assert several is not None and several.prompt_tokens_details is not None
    assert first.prompt_tokens - 8 <= (several.prompt_tokens_details.cached_tokens or 0) < \
        several.prompt_tokens


PROMPTS = ["1, 2, 3, 4, 5,", "Monday, Tuesday, Wednesday,", "The capital of France is"]


def test_a_list_of_prompts_is_one_choice_per_prompt_and_n(smol_server: Any) -> None:
    c = client(smol_server)

    def complete(prompt: Any, **kw: Any) -> Any:
        return c.completions.create(model=SMOL, prompt=prompt, max_tokens=6, temperature=0,
                                    extra_body={"cache": False}, **kw)

    alone = [complete(p) for p in PROMPTS]
    r = complete(PROMPTS)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    assert all(ch.finish_reason in ("stop", "length") for ch in r.choices)
    # each choice answers its own prompt (greedy: the first words are the prompt's own)
    for ch, one in zip(r.choices, alone, strict=True):
        assert ch.text.split()[:1] == one.choices[0].text.split()[:1]
    assert r.usage is not None
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert r.usage.completion_tokens == sum(a.usage.completion_tokens for a in alone)
    # n for each prompt: prompt i's choices are i*n .. i*n+n-1, streamed as well
    texts: dict[int, str] = {}
    finished: dict[int, str] = {}
    usage = None
    for chunk in complete(PROMPTS[:2], n=2, stream=True, stream_options={"include_usage": True}):
        usage = chunk.usage or usage
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
            if ch.finish_reason:
                finished[ch.index] = ch.finish_reason
    assert sorted(finished) == [0, 1, 2, 3]
    for i in range(4):
        assert texts[i].split()[:1] == alone[i // 2].choices[0].text.split()[:1]
    assert usage is not None and usage.prompt_tokens == \
        alone[0].usage.prompt_tokens + alone[1].usage.prompt_tokens


@pytest.mark.parametrize(("prompt", "n", "says", "param"), [
    ([], 1, "empty", "prompt"), (PROMPTS, 3, "9 choices", "prompt"),  # max_n is 8
    ([[1, 2], []], 1, "non-empty", "prompt[1]"), ([1, "a"], 1, "Invalid value", "prompt"),
    ([10 ** 7], 1, "vocabulary", "prompt"),
])
def test_prompt_lists_redline_cannot_serve_are_a_400(smol_server: Any, prompt: Any, n: int,
                                                     says: str, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(smol_server).completions.create(model=SMOL, prompt=prompt, max_tokens=2, n=n)
    assert err.value.body["param"] == param  # type: ignore[index]
    assert says in err.value.body["message"]  # type: ignore[index]


@pytest.mark.parametrize(("extra", "says"), [
    ({"suffix": "x"}, "no fill-in-the-middle tokens"),  # SmolLM2 has none
    ({"suffix": "x", "echo": True}, "no echo"),
])
def test_a_suffix_the_model_cannot_fill_is_a_400(smol_server: Any, extra: dict[str, Any],
                                                 says: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(smol_server).completions.create(model=SMOL, prompt="def f():", max_tokens=2,
                                               extra_body=extra)
    assert err.value.body["param"] == "suffix"  # type: ignore[index]
    assert says in err.value.body["message"]  # type: ignore[index]


def test_a_prompt_of_token_ids_is_the_same_prompt_as_its_text(smol_server: Any) -> None:
    """vLLM's token-id prompts (what lm-evaluation-harness sends by default): the same
    answer as the text they tokenize from, one choice per list, echo as their text; `auto`
    is a 400 (ids mean a token only in one model's vocabulary)."""
    c = client(smol_server)
    text = "The capital of France is"
    ids = httpx.post(f"{smol_server.url}/tokenize",
                     json={"model": SMOL, "prompt": text}).json()["tokens"]
    plain = c.completions.create(model=SMOL, prompt=text, max_tokens=5, temperature=0,
                                 extra_body={"cache": False})
    by_ids = c.completions.create(model=SMOL, prompt=ids, max_tokens=5, temperature=0)
    assert by_ids.choices[0].text == plain.choices[0].text
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == len(ids)
    two = c.completions.create(model=SMOL, prompt=[ids, ids[:3]], max_tokens=5, temperature=0,
                               logprobs=1, echo=True)
    first = next(ch for ch in two.choices if ch.index == 0)
    assert first.text == text + plain.choices[0].text
    assert first.logprobs is not None and len(first.logprobs.tokens or []) == len(ids) + 5
    with pytest.raises(openai.BadRequestError) as err:
        c.completions.create(model="auto", prompt=ids, max_tokens=2)
    assert err.value.body["param"] == "model"  # type: ignore[index]


COUNT = [{"role": "user", "content": "List the numbers from 1 to 10, separated by commas."}]


def _tokens(server: Any, **body: Any) -> list[int]:
    r = httpx.post(f"{server.url}/tokenize", json={"model": SMOL, **body}, timeout=30)
    assert r.status_code == 200, r.text
    return list(r.json()["tokens"])


def test_the_model_template_and_vllms_template_fields(smol_server: Any) -> None:
    """The chat is rendered in the GGUF's own Jinja template (SmolLM2's adds its default
    system turn, as vLLM and llama-server render it); `add_generation_prompt: false` leaves
    the assistant turn unopened; `continue_final_message` leaves the final message open,
    and the answer goes on from it."""
    opened = _tokens(smol_server, messages=COUNT)
    strs = httpx.post(f"{smol_server.url}/tokenize", timeout=30, json={
        "model": SMOL, "messages": COUNT, "return_token_strs": True}).json()["token_strs"]
    assert "".join(strs).startswith("<|im_start|>system\nYou are a helpful AI assistant named "
                                    "SmolLM")
    # llama.cpp's server's /apply-template: the text those tokens are
    shown = httpx.post(f"{smol_server.url}/apply-template", timeout=30,
                       json={"model": SMOL, "messages": COUNT}).json()["prompt"]
    assert shown == "".join(strs) and shown.endswith("<|im_start|>assistant\n")
    closed = _tokens(smol_server, messages=COUNT, add_generation_prompt=False)
    assert opened[:len(closed)] == closed
    opener = httpx.post(f"{smol_server.url}/detokenize", timeout=30,
                        json={"model": SMOL, "tokens": opened[len(closed):]}).json()
    assert opener == {"prompt": "<|im_start|>assistant\n"}
    c = client(smol_server)
    whole = c.chat.completions.create(model=SMOL, messages=COUNT, max_tokens=24, temperature=0,
                                      extra_body={"cache": False})
    text = whole.choices[0].message.content or ""
    start = text[:text.index(",", text.index(",") + 1) + 1]  # the first two numbers
    assert 0 < len(start) < len(text)
    partial = [*COUNT, {"role": "assistant", "content": start}]
    cont = c.chat.completions.create(
        model=SMOL, messages=partial, max_tokens=24, temperature=0,  # type: ignore[arg-type]
        extra_body={"cache": False, "continue_final_message": True,
                    "add_generation_prompt": False})
    rest = cont.choices[0].message.content or ""
    n = len(_tokens(smol_server, messages=partial, continue_final_message=True,
                    add_generation_prompt=False))
    assert cont.usage is not None and cont.usage.prompt_tokens == n
    # greedy: the same prefix goes on as the whole answer went on
    assert (start + rest)[:len(text)] == text[:len(start + rest)]
    assert len(rest) > 0
    # vLLM's echo: the whole message, the client's part and the model's, streamed too
    body: Any = {"model": SMOL, "messages": partial, "max_tokens": 24, "temperature": 0,
                 "extra_body": {"cache": False, "continue_final_message": True,
                                "add_generation_prompt": False, "echo": True}}
    assert c.chat.completions.create(**body).choices[0].message.content == start + rest
    streamed = "".join(ch.choices[0].delta.content or "" for ch in
                       c.chat.completions.create(**body, stream=True) if ch.choices)
    assert streamed == start + rest
    asked = c.chat.completions.create(model=SMOL, messages=COUNT, max_tokens=24, temperature=0,
                                      extra_body={"cache": False, "echo": True})
    assert asked.choices[0].message.content == text  # the last message is the user's


@pytest.mark.parametrize(("extra", "param"), [
    ({"continue_final_message": True}, "continue_final_message"),  # and the assistant turn opened
    ({"chat_template_kwargs": "x"}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}},
     "chat_template_kwargs.add_generation_prompt"),
    ({"add_generation_prompt": "no"}, "add_generation_prompt"),
])
def test_template_fields_a_chat_cannot_take_are_a_400(smol_server: Any, extra: dict[str, Any],
                                                       param: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(smol_server).chat.completions.create(model=SMOL, messages=ASK, max_tokens=2,
                                                    extra_body={"cache": False, **extra})
    assert err.value.body["param"] == param  # type: ignore[index]


def test_a_text_completion_has_no_template(smol_server: Any) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client(smol_server).completions.create(
            model=SMOL, prompt="Hi", max_tokens=2,
            extra_body={"cache": False, "chat_template_kwargs": {"enable_thinking": False}})
    assert err.value.body["param"] == "chat_template_kwargs"  # type: ignore[index]
