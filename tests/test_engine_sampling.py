"""The sampler chain on the real SmolLM2's logits: logit_bias, presence and frequency
penalties (OpenAI's formula), and the grammar checked after the draw."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from redline.engine.llama import BatchEntry, LlamaModel, LlamaRunner
from redline.engine.sampling import GrammarError, Sampler, check_grammar
from redline.models import bundled_path
from redline.types import Message, SamplingParams

pytestmark = pytest.mark.slow


@dataclass
class Ready:
    model: LlamaModel
    runner: LlamaRunner
    logits: np.ndarray
    index: int  # the batch entry that holds them


@pytest.fixture(scope="module")
def ready() -> Iterator[Ready]:
    """The model, a runner whose batch entry 0 holds the logits after a short prompt, and
    a copy of those logits."""
    model = LlamaModel(str(bundled_path("smollm2-135m-instruct", Path(".redline/models"))))
    runner = LlamaRunner(model, 256, 1, 64, 2)
    text = model.render_chat((Message("user", "Answer yes or no: is the sky blue?"),))
    prompt = model.tokenize(text, add_special=False)
    runner.decode([BatchEntry(t, i, 0, i == len(prompt) - 1) for i, t in enumerate(prompt)])
    last = len(prompt) - 1
    yield Ready(model, runner, runner.logits(last).copy(), last)
    runner.close()
    model.close()


def draw(ready: Ready, params: SamplingParams,
         times: int = 1) -> list[int]:
    """`times` tokens from the prompt's logits through one sampler (its history grows)."""
    runner, index = ready.runner, ready.index
    sampler = Sampler(params)
    try:
        return [sampler.sample(runner.ctx, index, runner.logits(index)) for _ in range(times)]
    finally:
        sampler.close()


GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


def test_greedy_is_the_argmax(ready: Ready) -> None:
    assert draw(ready, GREEDY) == [int(ready.logits.argmax())]


def test_logit_bias_bans_and_forces_tokens(ready: Ready) -> None:
    logits = ready.logits
    order = np.argsort(-logits)
    best, second = int(order[0]), int(order[1])
    banned = SamplingParams(max_tokens=8, temperature=0.0, logit_bias=((str(best), -100.0),))
    assert draw(ready, banned) == [second]
    rare = int(order[5000])
    forced = SamplingParams(max_tokens=8, temperature=0.0, logit_bias=((str(rare), 100.0),))
    assert draw(ready, forced) == [rare]
    # a small bias adds to the logit: it wins exactly when it closes the gap
    gap = float(logits[best] - logits[second])
    for bias, want in ((gap + 0.5, second), (gap - 0.5, best)):
        params = SamplingParams(max_tokens=8, temperature=0.0, logit_bias=((str(second), bias),))
        assert draw(ready, params) == [want], bias
    # sampled too: a banned token never comes, whatever the seed
    for seed in range(5):
        params = SamplingParams(max_tokens=8, temperature=1.0, seed=seed,
                                logit_bias=((str(best), -100.0),))
        assert draw(ready, params, 3)[0] != best


def test_presence_and_frequency_penalties(ready: Ready) -> None:
    logits = ready.logits
    order = np.argsort(-logits)
    best, second = int(order[0]), int(order[1])
    gap = float(logits[best] - logits[second])
    # without penalties the same logits give the same token every time
    assert draw(ready, GREEDY, 3) == [best] * 3
    # presence: once seen, the token loses `presence`, however often it was seen
    small = SamplingParams(max_tokens=8, temperature=0.0, presence_penalty=min(gap * 0.9, 2.0))
    if gap * 0.9 <= 2.0:
        assert draw(ready, small, 3) == [best] * 3
    if gap < 2.0:
        large = SamplingParams(max_tokens=8, temperature=0.0, presence_penalty=2.0)
        got = draw(ready, large, 2)
        assert got[0] == best and got[1] != best
    # frequency: the penalty grows with the count, so the best token comes back fewer times
    freq = SamplingParams(max_tokens=8, temperature=0.0, frequency_penalty=2.0)
    got = draw(ready, freq, 4)
    expected: list[int] = []
    counts: dict[int, int] = {}
    for _ in range(4):
        adjusted = logits.copy()
        for token, count in counts.items():
            adjusted[token] -= 2.0 * count
        choice = int(adjusted.argmax())
        expected.append(choice)
        counts[choice] = counts.get(choice, 0) + 1
    assert got == expected
    assert got.count(best) < 4


def test_grammar_constrains_the_draw(ready: Ready) -> None:
    model = ready.model
    gbnf = 'root ::= "maybe" | "perhaps"'
    for seed in range(4):
        params = SamplingParams(max_tokens=8, temperature=1.0, seed=seed, grammar=gbnf)
        token = draw(ready, params)[0]
        piece = model.piece(token).decode()
        assert piece and ("maybe".startswith(piece) or "perhaps".startswith(piece)), piece
    # greedy and constrained: the likeliest token the grammar allows
    token = draw(ready, SamplingParams(max_tokens=8, temperature=0.0, grammar=gbnf))[0]
    allowed = [t for t in range(len(ready.logits)) if (p := model.piece(t).decode("utf-8", "replace"))
               and ("maybe".startswith(p) or "perhaps".startswith(p))]
    assert token == max(allowed, key=lambda t: ready.logits[t])


def test_a_grammar_llama_cpp_refuses_is_an_error_before_sampling(
        ready: Ready) -> None:
    with pytest.raises(GrammarError):
        check_grammar(ready.model.vocab, "root ::= missing-rule")
    check_grammar(ready.model.vocab, 'root ::= "ok"')


def test_repetition_penalty_counts_the_prompt_and_the_output(ready: Ready) -> None:
    """vLLM's repetition penalty: every token seen in the prompt or the output has its
    logit divided by the penalty when positive, multiplied when negative (once, however
    often it was seen)."""
    logits = ready.logits
    order = np.argsort(-logits)
    prompt = [int(order[0]), int(order[3]), int(order[0])]
    penalty = 1.8
    params = SamplingParams(max_tokens=8, temperature=0.0, repetition_penalty=penalty)
    sampler = Sampler(params, prompt)
    try:
        got = [sampler.sample(ready.runner.ctx, ready.index, ready.runner.logits(ready.index))
               for _ in range(4)]
    finally:
        sampler.close()
    seen, expected = set(prompt), []
    for _ in range(4):
        adjusted = logits.astype(np.float64).copy()
        for t in seen:
            adjusted[t] = adjusted[t] / penalty if adjusted[t] > 0 else adjusted[t] * penalty
        choice = int(adjusted.argmax())
        expected.append(choice)
        seen.add(choice)
    assert got == expected
    assert got[0] != int(order[0]) or logits[order[0]] / penalty > logits[order[1]]
    # a penalty of 1 changes nothing
    assert draw(ready, SamplingParams(max_tokens=8, temperature=0.0,
                                      repetition_penalty=1.0)) == [int(order[0])]


def test_min_p_keeps_only_tokens_near_the_likeliest(ready: Ready) -> None:
    """vLLM's min_p on the tempered distribution: a token is drawn only if its probability
    is at least min_p × the likeliest token's."""
    logits = ready.logits.astype(np.float64)
    temperature = 1.5
    probs = np.exp((logits - logits.max()) / temperature)
    for min_p in (0.3, 1.0):
        allowed = set(np.flatnonzero(probs >= min_p * probs.max() - 1e-9).tolist())
        drawn = set()
        for seed in range(12):
            params = SamplingParams(max_tokens=8, temperature=temperature, seed=seed, min_p=min_p)
            drawn.add(draw(ready, params)[0])
        assert drawn <= allowed, (min_p, drawn - allowed)
    # without it the same seeds reach beyond what min_p 0.3 allows
    wide = {draw(ready, SamplingParams(max_tokens=8, temperature=temperature, seed=s))[0]
            for s in range(12)}
    assert not wide <= set(np.flatnonzero(probs >= probs.max() - 1e-9).tolist())
