"""Regular expressions as GBNF (redline/engine/regex.py), checked by llama.cpp's own grammar
engine over SmolLM2's vocabulary against Python's `re`: a text is taken (then the end of
text) exactly when the pattern matches it, for strings the pattern generates (hypothesis)
and random strings over the pattern's characters; inside a JSON string (JSON Schema's
`pattern`) the same holds for the string's JSON spelling, with `re.search`."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest
from grammar_oracle import grammar_takes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redline.engine import regex
from redline.engine.grammar import schema_grammar
from redline.errors import InvalidRequest

# what users constrain answers to: formats, enumerations, optional and nested parts, flags
PATTERNS = [
    r"\d{3}-\d{4}",
    r"[A-Z]{2}\d{2} ?\d{4}",
    r"\w+@\w+\.(com|org|net)",
    r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])",
    r"#[0-9a-fA-F]{6}",
    r"(yes|no|maybe)",
    r"(foo|bar)?x\.y",
    r"a{2,}b*?c{1,3}",
    r"(ab|c)*d+",
    r"(?i)hello,? (world|there)!?",
    r"[^\d\s]+",
    r"[\D][\W]\S",
    r"(?s)<.{0,5}>",
    r"<.{0,5}>",
    r"\(\d+(\.\d+)?\) [*+?]",
    r"(a|)b",
    r"",
    r"^(?:red|green|blue)$",
    r"(?x) \d+ \s* [a-c]  # verbose",
    r"[\]\-\\^]+q",
]
JSON_PATTERNS = [r"^\d{3}-\d{4}$", r"\d", r"^a.c", r'"[^"]*"$', r"^[\n\t\\]+$", r"^.{2}$",
                 r"x|^y"]


def alphabet(pattern: str) -> str:
    """The characters worth trying against `pattern`: its own, and a few it may refuse."""
    return "".join(sorted(set(pattern) - {"\\"})) + "aZ09 _-.\n\"'\\"


def random_texts(pattern: str, seed: int, count: int = 400) -> list[str]:
    rng = random.Random(seed)
    chars = alphabet(pattern)
    return [
        "".join(rng.choice(chars) for _ in range(rng.randint(0, 9))) for _ in range(count)]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_the_grammar_takes_exactly_what_the_regex_matches(smol_vocab: Any, pattern: str) -> None:
    takes = grammar_takes(smol_vocab, "root ::= " + regex.expression(pattern))
    rng = random.Random(pattern)
    matching = re.compile(pattern, re.ASCII)

    # strings the pattern generates: printable ASCII, tab and newline (the classes are
    # ASCII, as in xgrammar; SmolLM2's tokenizer drops some control characters)
    @settings(max_examples=60, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.from_regex(matching, fullmatch=True, alphabet=st.characters(
        min_codepoint=32, max_codepoint=126, include_characters="\t\n")))
    def generated(text: str) -> None:
        assert takes(text), text

    try:
        generated()
        mutated = [t[:i] + c + t[i + 1:] for t in random_texts(pattern, 1, 100)
                   for i, c in [(rng.randrange(len(t) + 1), rng.choice(alphabet(pattern)))]]
        for text in random_texts(pattern, 0) + mutated:
            assert takes(text) == bool(matching.fullmatch(text)), (pattern, text)
    finally:
        takes.free()  # type: ignore[attr-defined]


@pytest.mark.parametrize("pattern", JSON_PATTERNS)
def test_a_schema_pattern_takes_the_json_spelling_of_what_it_matches(smol_vocab: Any,
                                                                     pattern: str) -> None:
    """JSON Schema's `pattern`: the value is a JSON string whose decoded text the pattern
    matches anywhere unless anchored (re.search); `"`, backslash and controls escaped."""
    takes = grammar_takes(smol_vocab, schema_grammar({"type": "string", "pattern": pattern}, "p"))
    # a final `$` is the end of the text, as ECMA-262 (JSON Schema's regex) reads it; Python's
    # would also match before a final line break
    matching = re.compile(pattern[:-1] + r"\Z" if pattern.endswith("$") else pattern, re.ASCII)
    try:
        texts = random_texts(pattern, 2) + ["555-1234", "a\nc", '"q"', "\t\\\n", "ab", "xy"]
        taken = 0
        for text in texts:
            expected = bool(matching.search(text))
            assert takes(json.dumps(text)) == expected, (pattern, text)
            taken += expected
        assert taken  # the check saw both answers
        assert not takes('"\n"') and not takes('"a"b"')  # never invalid JSON
    finally:
        takes.free()  # type: ignore[attr-defined]


def test_control_characters_have_each_json_spelling(smol_vocab: Any) -> None:
    takes = grammar_takes(smol_vocab, schema_grammar({"type": "string", "pattern": "^.$"}, "p"))
    try:
        assert takes('"\\t"') and takes('"\\u0009"') and takes('"\\u001F"') and takes('"\\u001f"')
        assert not takes('"\\n"') and not takes('"\\u000A"')  # `.` is not a line break
        assert takes('"\\""') and takes('"\\\\"') and not takes('"\\q"')
    finally:
        takes.free()  # type: ignore[attr-defined]


@pytest.mark.parametrize(("pattern", "names"), [
    (r"(a)\1", "backreference"),
    (r"(?P<x>a)(?P=x)", "backreference"),
    (r"(?=a)a", "lookaround"),
    (r"a(?<!b)", "lookaround"),
    (r"\bword\b", "word boundary"),
    (r"a$b", "anchor"),
    (r"(?m)^a$", "multiline"),
    (r"a{1001}", "above 1000"),
    (r"a*+", "possessive"),
    (r"(?>a)", "atomic"),
    (r"[", "not a regular expression"),
    (r"(?i:a)(?m:b)", "multiline"),
    ("(" * 400 + "a" + ")" * 400, "nested too deeply"),  # Python's parser takes it
    ("(" * 2000 + "a" + ")" * 2000, "recursion"),  # Python's parser does not
])
def test_what_the_grammar_cannot_hold_is_refused(pattern: str, names: str) -> None:
    with pytest.raises(regex.RegexError, match=names):
        regex.expression(pattern)
    with pytest.raises(InvalidRequest) as err:  # in a schema: a 400 naming the field
        schema_grammar({"type": "object", "properties": {"p": {"pattern": pattern}}},
                       "response_format")
    assert err.value.param == "response_format" and names in str(err.value)


def test_the_translation_is_compact() -> None:
    assert regex.expression(r"^\d{3}-\d{4}$") == '[0-9]{3} "-" [0-9]{4}'
    assert regex.expression(r"(foo|bar)?x\.y") == '( "foo" | "bar" )? "x.y"'
    assert regex.expression(r"(?:ab){2}c*") == '( "ab" ){2} "c"*'
    assert regex.expression(r"(?i)ok") == "[Oo] [Kk]"
