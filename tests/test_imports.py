"""The import rule of architecture.md §2, checked on the source with ``ast``.

Imports flow downstream only: ``files`` imports nothing of the package, ``diagnostics``
only ``files``, ``terms`` only ``diagnostics``, ``kernel`` (the trusted core) imports only
``terms``, ``ops`` and ``diagnostics``, and nothing but ``__main__`` imports ``cli``.
Imports inside functions count too; the one sanctioned exception is listed in
``LAZY_EXCEPTIONS`` with its reason.  Modules that do not exist yet are skipped.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "napkin_cat"

#: module -> package modules it may import (None: any); the empty set means none at all
ALLOWED: dict[str, set[str] | None] = {
    # files (reading sources as the elaborator does, for the caret line) is a leaf below it
    "napkin_cat.diagnostics": {"napkin_cat.files"},
    "napkin_cat.files": set(),
    "napkin_cat.terms": {"napkin_cat.diagnostics"},  # Span only: a type every term carries
    "napkin_cat.kernel": {"napkin_cat.terms", "napkin_cat.ops", "napkin_cat.diagnostics"},
}
#: function-level imports that convenience methods on the IR are allowed to make
LAZY_EXCEPTIONS: dict[str, set[str]] = {
    # Diagram.evaluate (the public API of issue 2) and Diagram._repr_svg_ (notebook display)
    "napkin_cat.terms": {"napkin_cat.evaluate", "napkin_cat.draw"},
    # Theorem._repr_svg_ (notebook display); drawing never feeds back into checking
    "napkin_cat.kernel": {"napkin_cat.draw"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def package_imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported napkin_cat module, line, at module level?) for every import in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    importer = module_name(path)
    top_level = {id(node) for node in tree.body}
    found: list[tuple[str, int, bool]] = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, importer, path.name == "__init__.py")
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                is_module = (PACKAGE.parent / Path(*sub.split("."))).with_suffix(".py").exists() or (
                    PACKAGE.parent / Path(*sub.split("."))).is_dir()
                targets.append(sub if is_module else base)
        for target in targets:
            if target == "napkin_cat" or target.startswith("napkin_cat."):
                found.append((target, node.lineno, id(node) in top_level))
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_the_resolver_sees_the_known_imports() -> None:
    imports = {target for target, _, _ in package_imports(PACKAGE / "elaborate.py")}
    assert {"napkin_cat.ops", "napkin_cat.diagnostics", "napkin_cat.syntax", "napkin_cat.terms"} <= imports
    lazy = {(target, top) for target, _, top in package_imports(PACKAGE / "terms.py")}
    assert ("napkin_cat.diagnostics", True) in lazy


@pytest.mark.parametrize("path", SOURCES, ids=[module_name(p) for p in SOURCES])
def test_imports_flow_downstream(path: Path) -> None:
    importer = module_name(path)
    allowed = ALLOWED.get(importer)
    for target, line, top in package_imports(path):
        where = f"{path.name}:{line}: {importer} imports {target}"
        # `python -m napkin_cat` is the CLI's entry point, as the `napkin` script is
        assert target != "napkin_cat.cli" or importer == "napkin_cat.__main__", f"{where}: nothing may import the CLI"
        if allowed is None or target == importer:
            continue
        if not top and target in LAZY_EXCEPTIONS.get(importer, set()):
            continue
        assert target in allowed, f"{where}: {importer} may import only {sorted(allowed) or 'nothing of the package'}"
