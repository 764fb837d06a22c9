"""The layers of DESIGN.md as an import contract: a module imports only from its own
layer or a lower one. Imports under `if TYPE_CHECKING:` are annotations, not calls, and
are allowed upward (as in Starlette). Imports inside functions count: a deferred import is
still a dependency."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "redline"

# lowest first; DESIGN.md: types/errors -> store -> backends/engine ->
# cache/routing/streams/jobs -> api -> cli. The pipeline composes routing and the cache,
# and the jobs' worker runs the pipeline: jobs sit just above it, still below the api.
LAYERS: list[set[str]] = [
    {"types", "errors", "config", "breaker", "closing"},
    {"store", "telemetry"},
    {"backends", "engine", "models", "optimize"},
    {"cache", "routing", "streams", "experiments", "responses"},
    {"pipeline"},
    {"jobs"},
    {"api"},
    {"cli", "bench", "client", "tuning", "__main__"},
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}

# known upward edges, each with its reason; the list only shrinks
ALLOWED: dict[tuple[str, str], str] = {
    # the `weights:` field's validator asks models.py which GGUF types exist (a deferred
    # import inside the validator); the table belongs with the config (issue #23's files)
    ("redline/config.py", "models"): "config validates weights types from models.py",
}


def _part(module: str) -> str | None:
    """`redline.routing.router` -> "routing"; None outside the package."""
    parts = module.split(".")
    if parts[0] != "redline" or len(parts) < 2:
        return None
    return parts[1]


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                inside.update(id(n) for n in ast.walk(child))
    return inside


def imports(path: Path, root: Path = ROOT) -> list[tuple[str, int]]:
    """(top-level redline package imported, line) for every runtime import in `path`."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_nodes(tree)
    here = path.relative_to(root.parent).with_suffix("").parts
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this file's package
                base = list(here[:-1])  # the file's package (an __init__'s own)
                base = base[: len(base) - (node.level - 1)]
                modules = [".".join([*base, *([node.module] if node.module else [])])]
            elif node.module:
                modules = [node.module]
        for m in modules:
            part = _part(m)
            if part is not None:
                found.append((part, node.lineno))
    return found


def _own_part(path: Path, root: Path) -> str:
    rel = path.relative_to(root)
    return rel.parts[0].removesuffix(".py")


def violations(root: Path = ROOT) -> list[str]:
    out: list[str] = []
    for path in sorted(root.rglob("*.py")):
        own = _own_part(path, root)
        if own == "__init__":
            continue
        if own not in LAYER:
            out.append(f"{path.relative_to(root.parent)}: package `{own}` has no layer in LAYERS")
            continue
        for part, line in imports(path, root):
            if part == own:
                continue
            if part not in LAYER:
                out.append(f"{path.relative_to(root.parent)}:{line}: imports `{part}`, which has no layer")
            elif LAYER[part] > LAYER[own] and (str(path.relative_to(root.parent)), part) not in ALLOWED:
                out.append(f"{path.relative_to(root.parent)}:{line}: `{own}` (layer {LAYER[own]}) "
                           f"imports `{part}` (layer {LAYER[part]})")
    return out


def test_no_lower_layer_imports_a_higher_one() -> None:
    assert violations() == []


def test_the_allowed_exceptions_still_exist() -> None:
    """An allowance whose import is gone must go too (the list only shrinks)."""
    for (file, part) in ALLOWED:
        path = ROOT.parent / file
        assert path.exists(), file
        assert part in {p for p, _ in imports(path)}, f"{file} no longer imports {part}: drop it"


@pytest.mark.parametrize(("source", "bad"), [
    ("from redline.api.app import create_app\n", True),
    ("def f():\n    from redline.api import app\n", True),  # deferred: still a dependency
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from redline.api import app\n", False),
    ("from redline.errors import RedlineError\n", False),
    ("from ..api import app\n", True),  # relative, from redline/store/x.py
])
def test_the_checker_catches_an_upward_import(tmp_path: Path, source: str, bad: bool) -> None:
    root = tmp_path / "redline"
    (root / "store").mkdir(parents=True)
    (root / "api").mkdir()
    (root / "store" / "x.py").write_text(source)
    (root / "api" / "app.py").write_text("")
    found = violations(root)
    assert bool(found) is bad, found


_IGNORE = re.compile(r"#\s*type:\s*ignore(\[[^\]]*\])?(.*)$")


def unjustified_ignores(root: Path = ROOT) -> list[str]:
    """`file:line` of every `# type: ignore` in the package that names no error code or
    gives no reason after it (issue 24: each one justified, or gone)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            m = _IGNORE.search(line)
            if m and (not m.group(1) or not m.group(2).strip().startswith("#")):
                found.append(f"{path.relative_to(root.parent)}:{n}")
    return found


def test_every_type_ignore_is_justified() -> None:
    assert unjustified_ignores() == []


def test_an_unjustified_ignore_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "redline"
    pkg.mkdir()
    (pkg / "a.py").write_text("x: int = 'a'  # type: ignore[assignment]  # a reason\n"
                              "y: int = 'b'  # type: ignore[assignment]\n"
                              "z: int = 'c'  # type: ignore\n")
    assert unjustified_ignores(pkg) == ["redline/a.py:2", "redline/a.py:3"]
