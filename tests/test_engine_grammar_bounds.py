"""Numeric bounds as a language (redline/engine/numerals.py): the range's regex checked
against exact arithmetic on every numeral near the bounds and thousands of random ones, and
the GBNF the schema gives checked against the same truth by llama.cpp's own grammar engine."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterator
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any

import pytest
from grammar_oracle import grammar_takes

from redline.engine import numerals
from redline.engine.grammar import schema_grammar
from redline.engine.numerals import Bound

# (schema bounds, type): one- and two-sided, inclusive and exclusive, negative, decimal,
# bounds with more fraction digits than a numeral may have, bounds past 15 digits
CASES: list[tuple[dict[str, Any], str]] = [
    ({"minimum": 1}, "integer"),
    ({"maximum": -3}, "integer"),
    ({"minimum": 0, "maximum": 100}, "integer"),
    ({"exclusiveMinimum": -1000, "exclusiveMaximum": -7}, "integer"),
    ({"exclusiveMinimum": 1.5, "maximum": 3.5}, "integer"),
    ({"minimum": -99999, "maximum": 123456789012}, "integer"),
    ({"minimum": 10**17, "maximum": 10**17 + 250}, "integer"),
    ({"minimum": -(10**20), "exclusiveMaximum": 0}, "integer"),
    ({"minimum": 0.5, "maximum": 99.95}, "number"),
    ({"exclusiveMinimum": 0.5, "exclusiveMaximum": 9.75}, "number"),
    ({"minimum": -1.25, "exclusiveMaximum": 3.5}, "number"),
    ({"exclusiveMaximum": -2.5}, "number"),
    ({"exclusiveMinimum": 0}, "number"),
    ({"minimum": 0}, "number"),
    ({"minimum": -0.001, "maximum": 0.001}, "number"),
    ({"minimum": 2, "maximum": 2}, "number"),
    ({"exclusiveMinimum": 1e-15, "maximum": 1}, "number"),
    ({"minimum": 123456.789, "exclusiveMaximum": 123456.7891}, "number"),
    ({"minimum": -3.14159, "maximum": -3.14}, "number"),
    ({"minimum": 0.1, "maximum": 0.3, "exclusiveMaximum": 0.3}, "number"),
    ({"minimum": 99.5, "maximum": 100.5, "exclusiveMinimum": 99.75}, "number"),
    ({"exclusiveMinimum": -5, "maximum": 5}, "number"),
]
IDS = [f"{kind}-{'-'.join(f'{k}={v}' for k, v in bounds.items())}" for bounds, kind in CASES]
NUMERAL = re.compile(r"(-?)(0|[1-9][0-9]*)(?:\.([0-9]+))?")


def _exact(v: int | float) -> Decimal:
    return Decimal(v) if isinstance(v, int) else Decimal(repr(v))


def truth(text: str, bounds: dict[str, Any], integer: bool) -> bool:
    """The module docstring's language, written out plainly: the form, the digit limits
    and the value compared exactly."""
    m = NUMERAL.fullmatch(text)
    if m is None or (integer and m[3] is not None):
        return False
    width = min(numerals.MAX_WIDTH, max(numerals.DIGITS, *(
        len(str(abs(math.floor(_exact(v))))) for v in bounds.values())))
    whole, fraction = m[2], m[3]
    if len(whole) > width or (fraction is not None
                              and len(fraction) > numerals.DIGITS - len(whole)):
        return False
    value = Decimal(text)
    if m[1] and value == 0:
        return False  # no "-0"
    b = {k: _exact(v) for k, v in bounds.items()}
    return (("minimum" not in b or value >= b["minimum"])
            and ("maximum" not in b or value <= b["maximum"])
            and ("exclusiveMinimum" not in b or value > b["exclusiveMinimum"])
            and ("exclusiveMaximum" not in b or value < b["exclusiveMaximum"]))


def node(bounds: dict[str, Any], integer: bool) -> numerals.Node:
    """The range's tree from the bounds, the tighter of each pair taken by hand here."""
    def tight(keys: tuple[str, str], pick: Any) -> Bound | None:
        found = [(Fraction(_exact(bounds[k])), k == keys[0]) for k in keys if k in bounds]
        return Bound(*pick(found)) if found else None
    low = tight(("minimum", "exclusiveMinimum"), lambda f: max(f, key=lambda b: (b[0], not b[1])))
    high = tight(("maximum", "exclusiveMaximum"), lambda f: min(f, key=lambda b: (b[0], b[1])))
    built = numerals.numerals(low, high, integer)
    assert built is not None
    return built


def spellings(value: Decimal, places: int, rng: random.Random) -> Iterator[str]:
    """`value` rounded to `places` fraction digits, written plainly, with and without
    extra trailing zeros and a sign on zero."""
    plain = format(value.quantize(Decimal(1).scaleb(-places)), "f") if places else \
        format(value.to_integral_value(), "f")
    yield plain
    yield plain + ("0" * rng.randint(1, 3) if "." in plain else "." + "0" * rng.randint(1, 3))
    yield plain.lstrip("-") if plain.startswith("-") else "-" + plain


def candidates(bounds: dict[str, Any], seed: int) -> list[str]:
    """Every numeral of up to three fraction digits within 3 of a bound or of zero, and a
    few thousand random ones near the bounds at every scale, in many spellings; with
    malformed ones (leading zeros, exponents, a bare point, a plus)."""
    rng = random.Random(seed)
    out = {"0", "-0", "-0.0", "0.", ".5", "+1", "1e2", "01", "-01.5", "1.5E0", "00", "1..2"}
    centres = [_exact(v) for v in bounds.values()] + [Decimal(0)]
    with localcontext() as exact:
        exact.prec = 200  # bounds of 20 digits with 17 fraction digits: no rounding
        for centre in centres:
            for places, reach in ((0, 30), (1, 30), (3, 3000)):
                for i in range(-reach, reach + 1):
                    out.update(spellings(centre + i * Decimal(1).scaleb(-places), places, rng))
        for _ in range(4000):
            centre = rng.choice(centres)
            scale = Decimal(10) ** rng.randint(-17, 17)
            value = centre + Decimal(rng.uniform(-1, 1)).quantize(Decimal("1e-17")) * scale
            out.update(spellings(value, rng.randint(0, 17), rng))
    return sorted(out)


@pytest.mark.parametrize(("bounds", "kind"), CASES, ids=IDS)
def test_the_regex_is_exactly_the_numerals_in_range(bounds: dict[str, Any], kind: str) -> None:
    pattern = re.compile(numerals.regex(node(bounds, kind == "integer")))
    ins = outs = 0
    for text in candidates(bounds, seed=len(str(bounds))):
        expected = truth(text, bounds, kind == "integer")
        assert (pattern.fullmatch(text) is not None) == expected, (text, expected)
        ins, outs = ins + expected, outs + (not expected)
    assert ins > 0 and outs > 0  # neither side vacuous


def test_the_exact_truth_at_the_edges() -> None:
    """The oracle above, and the regex, on hand-picked spellings."""
    def admits(bounds: dict[str, Any], kind: str, text: str) -> bool:
        regex = numerals.regex(node(bounds, kind == "integer"))
        assert (re.fullmatch(regex, text) is not None) == truth(text, bounds, kind == "integer")
        return truth(text, bounds, kind == "integer")
    two = {"minimum": 0.5, "exclusiveMaximum": 2}
    assert all(admits(two, "number", t) for t in ("0.5", "0.50", "0.500", "1", "1.0",
                                                  "1.99999999999999"))
    assert not any(admits(two, "number", t) for t in ("0.4999", "2", "2.0", "2.00", "-1",
                                                      "1.999999999999999", "01", "1e0"))
    assert admits({"maximum": 0}, "number", "0") and admits({"maximum": 0}, "number", "-0.5")
    assert not admits({"maximum": 0}, "number", "-0.0")  # no "-0"
    assert not admits({"exclusiveMaximum": 0}, "number", "0.0")
    assert admits({"minimum": 1}, "integer", "999999999999999")
    assert not admits({"minimum": 1}, "integer", "1000000000000000")  # 16 digits
    assert admits({"minimum": 10**17}, "integer", str(10**17 + 5))  # the bound's width


def test_the_grammar_stays_small() -> None:
    sizes = {name: len(numerals.gbnf(node(bounds, kind == "integer")))
             for name, (bounds, kind) in zip(IDS, CASES, strict=True)}
    assert sizes["integer-minimum=0-maximum=100"] < 60
    assert sizes["number-minimum=0.5-maximum=99.95"] < 300
    assert max(sizes.values()) < 1500, sizes
    wide = {"minimum": -(10**60) + 7, "maximum": 10**60 - 3}
    assert len(numerals.gbnf(node(wide, True))) < 4000  # ~50 characters a digit


@pytest.mark.slow
@pytest.mark.parametrize(("bounds", "kind"), CASES, ids=IDS)
def test_llama_cpp_takes_exactly_the_numerals_in_range(
        smol_vocab: Any, bounds: dict[str, Any], kind: str) -> None:
    """The schema's whole grammar, compiled by llama.cpp and fed as SmolLM2's tokens: it
    takes a text (then the end of text) exactly when the truth does, with or without the
    one space the JSON grammar allows after a value."""
    takes = grammar_takes(smol_vocab, schema_grammar({"type": kind, **bounds}, "r"))
    try:
        texts = candidates(bounds, seed=len(str(bounds)))
        sample = random.Random(7).sample(texts, min(len(texts), 600))
        for text in sample:
            expected = truth(text, bounds, kind == "integer")
            assert takes(text) == expected, (text, expected)
            assert takes(text + " ") == expected, (text + " ", expected)
            assert not takes(text + "  ")
    finally:
        takes.free()  # type: ignore[attr-defined]
