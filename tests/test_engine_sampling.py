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
