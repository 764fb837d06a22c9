"""The accuracy gate: a variant passes only if it loses no more quality than allowed
against the reference, on every measure. A refusal names the numbers that failed it."""

from __future__ import annotations

from dataclasses import dataclass

from redline.optimize.quality import Quality


@dataclass(frozen=True)
class Gate:
    """`max_quality_loss` (0.01 = 1%) bounds the relative perplexity increase and, unless
    `max_accuracy_drop` is given, the drop in question accuracy (as a share of all
    questions: with 40 questions one lost answer is 2.5%, so a 1% gate allows none);
    `min_top1_agreement` bounds how often the greedy next token may differ."""

    max_quality_loss: float
    min_top1_agreement: float = 0.0
    max_accuracy_drop: float | None = None

    @property
    def accuracy_drop(self) -> float:
        return self.max_quality_loss if self.max_accuracy_drop is None else self.max_accuracy_drop

    def __post_init__(self) -> None:
        if not 0 <= self.max_quality_loss < 1:
            raise ValueError("max_quality_loss must be in [0, 1)")
        if not 0 <= self.accuracy_drop <= 1:
            raise ValueError("max_accuracy_drop must be in [0, 1]")
        if not 0 <= self.min_top1_agreement <= 1:
            raise ValueError("min_top1_agreement must be in [0, 1]")

    def failures(self, reference: Quality, variant: Quality) -> list[str]:
        out = []
        rise = variant.perplexity / reference.perplexity - 1
        if rise > self.max_quality_loss:
            out.append(f"perplexity {variant.perplexity:.3f} vs {reference.perplexity:.3f}: "
                       f"{rise:+.2%} > {self.max_quality_loss:.2%} allowed")
        drop = reference.accuracy - variant.accuracy
        if drop > self.accuracy_drop + 1e-9:
            out.append(f"question accuracy {variant.accuracy:.1%} vs {reference.accuracy:.1%}: "
                       f"-{drop:.1%} > {self.accuracy_drop:.2%} allowed")
        agree = variant.top1_agreement
        if agree is not None and agree < self.min_top1_agreement:
            out.append(f"greedy-token agreement {agree:.1%} < {self.min_top1_agreement:.1%} required")
        return out


def parse_loss(text: str) -> float:
    """A percentage, with or without the sign: '1%' and '1' are both 0.01."""
    value = text.strip().removesuffix("%")
    try:
        pct = float(value)
    except ValueError as exc:
        raise ValueError(f"not a percentage: {text!r} (e.g. 1%)") from exc
    return pct / 100
