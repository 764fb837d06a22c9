"""GGUF variants through llama.cpp's own quantize API (llama_model_quantize).

The bundled models are already quantized (SmolLM2 Q4_1, Gemma3 Q4_K_M), so their
variants are *requantized* from the shipped file (allow_requantize): the shipped file is
the reference, F16 is an exact up-conversion of it, and every lower type loses more.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as ll

# reference first, then from most to least precise
LADDER = ("F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K")
_FLOAT_TYPES = {"ALL_F32", "MOSTLY_F16", "MOSTLY_BF16"}
_LOG_LOCK = threading.Lock()


def ftype_code(name: str) -> int:
    try:
        return int(getattr(ll, f"LLAMA_FTYPE_MOSTLY_{name}"))
    except AttributeError as exc:
        raise ValueError(f"unknown GGUF type {name!r}; try one of {', '.join(LADDER)}") from exc


def ftype_name(code: int) -> str:
    for attr in dir(ll):
        if attr.startswith("LLAMA_FTYPE_") and getattr(ll, attr) == code and attr != "LLAMA_FTYPE_GUESSED":
            return attr.removeprefix("LLAMA_FTYPE_")
    return f"type {code}"


def file_type(model: ll.llama_model_p) -> str:
    """The weights' type as the file declares it (general.file_type), e.g. MOSTLY_Q4_1."""
    buf = ctypes.create_string_buffer(32)
    n = ll.llama_model_meta_val_str(model, b"general.file_type", buf, 32)
    return ftype_name(int(buf.value.decode())) if n > 0 else "unknown"


def is_quantized(ftype: str) -> bool:
    return ftype not in _FLOAT_TYPES


@dataclass(frozen=True)
class Quantized:
    path: Path
    fallbacks: int  # tensors llama.cpp had to store in another type (rows not a multiple of 256)


def quantize(src: Path, dst: Path, name: str, n_threads: int = 0) -> Quantized:
    """Write `src` as GGUF type `name` at `dst`. Raises RuntimeError if llama.cpp refuses."""
    params = ll.llama_model_quantize_default_params()
    params.ftype = ftype_code(name)
    params.allow_requantize = True  # the source may itself be quantized (both bundled ones are)
    params.nthread = n_threads
    lines: list[str] = []

    @ll.llama_log_callback
    def collect(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        lines.append(text.decode("utf-8", errors="replace"))

    dst.parent.mkdir(parents=True, exist_ok=True)
    with _LOG_LOCK:  # the log callback is process-wide
        ll.llama_log_set(collect, ctypes.c_void_p())
        try:
            rc = ll.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
        finally:
            _restore_log()
    if rc != 0:
        tail = "".join(lines)[-400:]
        raise RuntimeError(f"llama_model_quantize to {name} failed ({rc}): {tail}")
    return Quantized(dst, sum("falling back" in line for line in lines))


def _restore_log() -> None:
    from redline.engine import llama as engine_llama

    engine_llama._BACKEND_READY = False  # re-install its quiet callback
    engine_llama._quiet_logs()
