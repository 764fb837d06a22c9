"""The transformers path on a tiny randomly initialised model built here (none is
bundled): every variant is built, measured, gated and reported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from redline.optimize.evalset import DATA_DIR, load_evalset  # noqa: E402
from redline.optimize.gate import Gate  # noqa: E402
from redline.optimize.hf import optimize_hf  # noqa: E402
from redline.optimize.report import markdown, write  # noqa: E402


def tiny_model(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train([str(DATA_DIR / "heldout.txt")],
              trainers.WordLevelTrainer(special_tokens=["[UNK]", "<s>", "</s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>",
                                   eos_token="</s>")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(path)
    fast.save_pretrained(path)
    return path


def test_transformers_ladder_on_a_tiny_random_model(tmp_path: Path) -> None:
    src = tiny_model(tmp_path / "tiny")
    ev = load_evalset(max_windows=2)
    out = tmp_path / "out"
    report = optimize_hf(src, out, Gate(0.01), ev, ["bf16", "int8-dynamic"], "tiny")
    names = [r.name for r in report.results]
    assert names == ["fp32", "bf16", "int8-dynamic"]
    ref = report.results[0]
    assert ref.reference and ref.passed and ref.quality.perplexity > 1
    for r in report.results[1:]:
        assert r.quality.top1_agreement is not None and 0 <= r.quality.top1_agreement <= 1
        assert r.speed.decode_tok_s > 0 and r.memory_bytes > 0 and r.file_bytes > 0
        # every verdict carries its numbers: refused ones say what failed by how much
        assert r.passed or all("allowed" in f or "required" in f for f in r.failures)
    # int8 weights take less memory than fp32 ones
    assert report.results[2].memory_bytes < ref.memory_bytes
    assert report.chosen in names
    md, js = write(report, out)
    assert "| fp32 |" in md.read_text() and json.loads(js.read_text())["chosen"] == report.chosen
    # the chosen variant is written out unless the reference itself won (nothing to write)
    chosen = next(r for r in report.results if r.name == report.chosen)
    assert chosen.passed
    if chosen.reference:
        assert report.output is None
    else:
        assert report.output is not None and Path(report.output).exists()
    assert not (out / ".variants").exists()
    # the report names every refused variant, with its reasons, and only those
    text = markdown(report)
    for r in report.results:
        row = next(line for line in text.splitlines() if line.startswith(f"| {r.name} |"))
        assert ("**refused**" in row) is (not r.passed), row
        for failure in r.failures:
            assert failure in row
    refused = [r.name for r in report.results if not r.passed]
    assert (f"Refused: {', '.join(refused)}." in text) is bool(refused)
