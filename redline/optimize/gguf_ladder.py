"""The GGUF candidates: the source file as the reference, and requantized variants."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

from redline.optimize import gguf
from redline.optimize.evalset import EvalSet
from redline.optimize.gate import Gate
from redline.optimize.gguf_runner import GgufRunner
from redline.optimize.ladder import Candidate, Report, run_ladder


class GgufReference:
    def __init__(self, path: Path, n_threads: int = 0) -> None:
        self.path, self.n_threads = path, n_threads
        runner = GgufRunner(path, n_threads)
        self.kind = runner.file_type()
        runner.close()
        self.name = f"reference ({self.kind.removeprefix('MOSTLY_')})"

    def open(self) -> GgufRunner:
        return GgufRunner(self.path, self.n_threads)

    def file_bytes(self) -> int:
        return self.path.stat().st_size

    def write(self, out_dir: Path) -> Path:
        return self.path

    def discard(self) -> None:
        return None


class GgufVariant:
    def __init__(self, src: Path, name: str, work_dir: Path, n_threads: int = 0) -> None:
        gguf.ftype_code(name)  # unknown names fail before any work
        self.src, self.name, self.n_threads = src, name, n_threads
        self.kind = f"MOSTLY_{name}"
        self.path = work_dir / f"{src.stem}.{name}.gguf"
        self.fallbacks = 0

    def open(self) -> GgufRunner:
        if not self.path.exists():
            self.fallbacks = gguf.quantize(self.src, self.path, self.name, self.n_threads).fallbacks
        return GgufRunner(self.path, self.n_threads)

    def file_bytes(self) -> int:
        return self.path.stat().st_size

    def write(self, out_dir: Path) -> Path:
        dest = out_dir / self.path.name
        if dest != self.path:
            shutil.move(self.path, dest)
        self.path = dest
        return dest

    def discard(self) -> None:
        if self.path.parent.name == ".variants":
            self.path.unlink(missing_ok=True)


def gguf_candidates(src: Path, out_dir: Path, names: list[str],
                    n_threads: int = 0) -> tuple[GgufReference, list[Candidate], list[str]]:
    """The reference, the variants to try, and notes for the report."""
    ref = GgufReference(src, n_threads)
    work = out_dir / ".variants"
    notes = []
    if gguf.is_quantized(ref.kind):
        notes.append(f"The source file is already quantized ({ref.kind}); it is the reference, and "
                     "every variant is requantized from it (allow_requantize), so F16 and Q8_0 "
                     "cannot be better than the reference, only bigger or faster.")
    variants: list[Candidate] = []
    for name in names:
        if f"MOSTLY_{name}" == ref.kind:
            notes.append(f"{name} skipped: it is the reference's own type.")
            continue
        variants.append(GgufVariant(src, name, work, n_threads))
    return ref, variants, notes


def optimize_gguf(src: Path, out_dir: Path, gate: Gate, ev: EvalSet, names: list[str],
                  model: str | None = None, n_threads: int = 0) -> Report:
    ref, variants, notes = gguf_candidates(src, out_dir, names, n_threads)
    report = run_ladder(model or src.stem, ref, variants, ev, gate, out_dir, notes, str(src))
    fell_back = [f"{v.name} ({v.fallbacks})" for v in variants
                 if isinstance(v, GgufVariant) and v.fallbacks]
    if fell_back:
        report.notes.append("llama.cpp kept some tensors in another type because their rows are "
                            "not a multiple of the k-quant block (256): " + ", ".join(fell_back))
    with contextlib.suppress(OSError):
        (out_dir / ".variants").rmdir()
    return report
