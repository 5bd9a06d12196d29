"""The import rule (README: imports flow downstream only), checked on the whole package with ``ast``.

Imports flow downstream only: every module belongs to one stage of the pipeline
(``STAGES``, in README's order) and imports only from its own stage or earlier ones; the
graph has no cycle, counting imports inside functions; the trusted kernel imports only the
IR, the op catalogue, diagnostics and the finiteness analysis; nothing but ``__main__``
imports the CLI.  Function-level imports are the few listed in ``LAZY`` with their reasons.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "napkin_cat"

#: the pipeline's stages, upstream first; a module's stage is its longest listed prefix
STAGES: tuple[str, ...] = (
    "napkin_cat.limits", "napkin_cat.files", "napkin_cat.cache", "napkin_cat.diagnostics", "napkin_cat.terms",
    "napkin_cat.ops", "napkin_cat.syntax", "napkin_cat.elaborate", "napkin_cat.printer", "napkin_cat.evaluate",
    "napkin_cat.finiteness", "napkin_cat.kernel",
    "napkin_cat.certify", "napkin_cat.proof", "napkin_cat.grad", "napkin_cat.schedule", "napkin_cat.cost",
    "napkin_cat.pseudo", "napkin_cat.draw", "napkin_cat.lower", "napkin_cat.search", "napkin_cat.fused", "napkin_cat",
    "napkin_cat.verbs", "napkin_cat.cli",
    "napkin_cat.__main__",
)
#: modules held to a narrower list than their stage allows; the empty set means none at all
ALLOWED: dict[str, set[str]] = {
    "napkin_cat.limits": set(),
    "napkin_cat.files": set(),
    "napkin_cat.cache": {"napkin_cat.files"},  # entries are written as every output is
    "napkin_cat.diagnostics": {"napkin_cat.files"},  # source lines for carets, read as the elaborator reads them
    "napkin_cat.terms": {"napkin_cat.diagnostics", "napkin_cat.limits"},  # Span: a type every term carries
    # the trusted base: the kernel, the IR it reads, and the finiteness analysis that discharges side conditions
    "napkin_cat.kernel": {"napkin_cat.terms", "napkin_cat.ops", "napkin_cat.diagnostics", "napkin_cat.finiteness"},
    "napkin_cat.finiteness": {"napkin_cat.terms", "napkin_cat.ops"},
}
#: every function-level import of the package, (importer, imported) -> why it is deferred
LAZY: dict[tuple[str, str], str] = {
    ("napkin_cat", "napkin_cat.draw"): "drawing (drawsvg, cairosvg) is loaded only inside a notebook shell",
    ("napkin_cat.__main__", "napkin_cat.cli"): "Ctrl-C while the CLI's modules load is caught (exit 130)",
    ("napkin_cat.certify", "napkin_cat.certify.tiers"): "the tiers load sympy: imported on a certificate cache miss",
    ("napkin_cat.verbs.check", "napkin_cat.certify.prove"): "sympy: loaded by `check --certify` only, not `check`",
    ("napkin_cat.verbs.derive", "napkin_cat.lower"): "jax: loaded by `derive --lower` only, not `derive`",
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
MODULES = {module_name(p): p for p in SOURCES}


def stage(module: str) -> int:
    prefixes = [s for s in STAGES if module == s or (s != "napkin_cat" and module.startswith(s + "."))]
    assert prefixes, f"{module} belongs to no stage: add it to STAGES"
    return STAGES.index(max(prefixes, key=len))


def graph() -> dict[str, dict[str, tuple[int, bool]]]:
    """importer -> imported package module -> (line, at module level?)."""
    edges: dict[str, dict[str, tuple[int, bool]]] = {}
    for module, path in MODULES.items():
        for target, line, top in package_imports(path):
            if target != module and target in MODULES:
                edges.setdefault(module, {})[target] = (line, top)
    return edges


def test_the_resolver_sees_the_known_imports() -> None:
    imports = {target for target, _, _ in package_imports(PACKAGE / "elaborate" / "__init__.py")}
    assert {"napkin_cat.ops", "napkin_cat.diagnostics", "napkin_cat.syntax", "napkin_cat.terms"} <= imports
    edges = graph()
    assert edges["napkin_cat.cost"]["napkin_cat.schedule.loopnest"][1]  # a package's __init__ is its module
    assert not edges["napkin_cat"]["napkin_cat.draw"][1]  # a function-level import is seen as one


@pytest.mark.parametrize("path", SOURCES, ids=[module_name(p) for p in SOURCES])
def test_imports_flow_downstream(path: Path) -> None:
    importer = module_name(path)
    allowed = ALLOWED.get(importer)
    for target, line, _ in package_imports(path):
        where = f"{path.name}:{line}: {importer} imports {target}"
        if importer != "napkin_cat.__main__":  # `python -m napkin_cat` is the CLI
            assert target != "napkin_cat.cli", f"{where}: nothing may import the CLI"
        if target == importer or target not in MODULES:
            continue
        assert stage(target) <= stage(importer), f"{where}: {STAGES[stage(target)]} is downstream of its stage"
        if allowed is not None:
            assert target in allowed, f"{where}: {importer} may import only {sorted(allowed) or 'nothing'}"


def test_no_import_cycle_counting_function_level_imports() -> None:
    edges = graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in edges.get(module, {}):
            assert state.get(target) != 1, f"import cycle: {' -> '.join([*path, module, target])}"
            if target not in state:
                visit(target, [*path, module])
        state[module] = 2

    for module in MODULES:
        if module not in state:
            visit(module, [])


def test_function_level_imports_are_the_listed_few() -> None:
    found = {(importer, target) for importer, targets in graph().items()
             for target, (_, top) in targets.items() if not top}
    assert found == set(LAZY), f"unlisted: {sorted(found - set(LAZY))}; stale: {sorted(set(LAZY) - found)}"
    assert len(LAZY) <= 5


def test_the_cli_dispatches_verbs_to_light_modules_by_the_import_rule() -> None:
    """The CLI imports a verb's module by name when the verb runs (``cli.VERBS``, so that
    ``--help`` and ``parse`` load nothing heavy); those edges obey the rule of written imports:
    each names a module of ``napkin_cat.verbs`` that defines the verb's function, and the
    modules the CLI imports at its top are light (no numpy, sympy, lark or jax below them)."""
    from napkin_cat import cli

    for verb, module in cli.VERBS.items():
        name = f"napkin_cat.verbs.{module}"
        assert name in MODULES, f"cli.VERBS[{verb!r}]: no module {name}"
        assert stage(name) <= stage("napkin_cat.cli")
        assert f"def cmd_{verb}(" in MODULES[name].read_text(encoding="utf-8"), f"{name} has no cmd_{verb}"
    light = {"napkin_cat", "napkin_cat.diagnostics", "napkin_cat.files", "napkin_cat.limits", "napkin_cat.verbs",
             "napkin_cat.verbs.replay", "napkin_cat.cache"}
    edges = graph()
    assert {t for t, (_, top) in edges["napkin_cat.cli"].items() if top} <= light
    for module in light:
        for target in edges.get(module, {}):
            assert target in light or not edges[module][target][1], f"{module} imports {target} at its top"


_LOADED = """import contextlib, io, sys
from napkin_cat.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main(sys.argv[1:])
print(sorted(m for m in ("numpy", "sympy", "scipy", "lark", "jax") if m in sys.modules))
"""


def test_help_loads_nothing_heavy_and_a_stored_check_no_sympy(tmp_path: Path) -> None:
    """What the verbs load (README "Command line"): ``--help`` none of numpy, sympy, scipy, lark,
    jax; ``check`` no jax, and with its certificates stored (the second run) no sympy or scipy."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NAPKIN_CACHE_DIR=str(tmp_path), PYTHONPATH=str(PACKAGE.parent))

    def loaded(*argv: str) -> str:
        ran = subprocess.run([sys.executable, "-c", _LOADED, *argv], capture_output=True, text=True, env=env,
                             timeout=600, check=True)
        return ran.stdout.strip().splitlines()[-1]

    assert loaded("--help") == "[]"
    proof = str(PACKAGE.parent / "proofs" / "flash_attention.ncd")
    assert "jax" not in loaded("check", proof)
    assert loaded("check", proof) == "['lark', 'numpy']"


def test_derive_loads_no_jax(tmp_path: Path) -> None:
    """``derive`` screens candidates with ``schedule.layout`` and prices them without the
    lowering (README "Command line"): jax is loaded by ``derive --lower`` only."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NAPKIN_CACHE_DIR=str(tmp_path), PYTHONPATH=str(PACKAGE.parent))
    matmul = str(PACKAGE.parent / "examples" / "matmul.ncd")
    argv = ["derive", matmul, "matmul", "--size=a=64", "--size=b=64", "--size=c=64", "--budget", "3",
            "-o", str(tmp_path / "d.ncd")]
    ran = subprocess.run([sys.executable, "-c", _LOADED, *argv], capture_output=True, text=True, env=env,
                         timeout=600, check=True)
    assert (tmp_path / "d.ncd").exists()
    assert "jax" not in ran.stdout.strip().splitlines()[-1]
