"""The per-token SSE chunk is built from a template; it must be byte for byte what
encoding the chunk's dict gives (the JSON an OpenAI client parses)."""

from __future__ import annotations

import json

import pytest

from redline.api.openai_routes import _ChatShape, _TextShape

TEXTS = ["Hello", " world", "quote \" and \\ backslash", "line\nbreak\ttab", "naïve — 日本語 🙂",
         "\x00\x1f control", '{"not": "json"}', "}]},", "\x00redline-text\x00"]


@pytest.mark.parametrize("shape_cls", [_ChatShape, _TextShape])
@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("progress", [None, {"tokens": 3, "expected_tokens": 40, "eta_ms": 812},
                                      {"tokens": 1, "expected_tokens": 64, "eta_ms": None}])
def test_template_chunk_equals_the_encoded_dict(shape_cls, include_usage, progress):
    shape = shape_cls("req-ab\"c", 'model "q" ü')
    encode = shape.encoder(include_usage)
    for text in TEXTS:
        redline = None if progress is None else {"progress": progress}
        want = json.dumps(shape.piece(text, None, include_usage, redline=redline),
                          separators=(",", ":"))
        got = encode(text, progress)
        assert got == want
        choice = json.loads(got)["choices"][0]
        assert (choice["delta"]["content"] if shape_cls is _ChatShape else choice["text"]) == text
