"""Pictures: structural checks on the SVG of every example diagram and of checked theorems.

Each drawing must be valid XML, show every axis and every box, keep box shapes apart,
colour wires by memory level under a schedule with loads and saves where the colour
changes, and convert to PNG; ``napkin draw --steps`` must write the derivation strip.
"""

from __future__ import annotations

import itertools
import re
import struct
import sys
import types
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path

import pytest
import sympy
from hypothesis import example, given

import napkin_cat
from napkin_cat import cost, ops, proof
from napkin_cat.cli import main
from napkin_cat.draw import LEVEL_COLOURS, MARK_COLOURS, draw_steps, draw_svg, save
from napkin_cat.draw.graph import GLYPHS
from napkin_cat.elaborate import load, loads
from napkin_cat.kernel import Theorem
from napkin_cat.terms import (
    Apply,
    Box,
    Diagram,
    Expr,
    Let,
    Module,
    Var,
    inline_calls,
    walk,
)
from tests.strategies import modules

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.ncd"))
SVG = "{http://www.w3.org/2000/svg}"


def _prove(name: str, *steps: str) -> Theorem:
    """The theorem ``name: attention { steps }`` over examples/attention.ncd, checked by the kernel."""
    lines = "\n".join(steps)
    module = loads(f'use "{ROOT / "examples" / "attention.ncd"}"\ntheorem {name}: attention {{\n{lines}\n}}\n')
    return proof.prove(module, name)


FLASH_STEPS = ("rewrite softmax_contract at P, O", "group q by gq at smem", "stream x by sx at smem via online_softmax")


def _texts(root: ET.Element) -> list[str]:
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def _box_shapes(root: ET.Element) -> list[tuple[float, float, float, float]]:
    """(x0, y0, x1, y1) of every box outline: rectangles and the softmax triangles."""
    shapes = []
    for el in root.iter():
        if el.get("class") != "box-shape":
            continue
        if el.tag == f"{SVG}rect":
            x, y, w, h = (float(el.get(k, "0")) for k in ("x", "y", "width", "height"))
            shapes.append((x, y, x + w, y + h))
        else:
            nums = [float(v) for v in el.get("d", "").replace("M", " ").replace("L", " ").replace("Z", " ")
                    .replace(",", " ").split()]
            xs, ys = nums[0::2], nums[1::2]
            shapes.append((min(xs), min(ys), max(xs), max(ys)))
    return shapes


def _strokes(root: ET.Element, kind: str = "wire") -> set[str]:
    return {el.get("stroke", "") for el in root.iter() if kind in (el.get("class") or "").split()}


def _drawn_boxes(diagram: Diagram, expand: bool) -> tuple[list[Box | Apply], int]:
    """The boxes a drawing must show, and how many constant outputs it draws as boxes too.

    A box over constants only (``rsqrt(d)``) is not a box of the picture: it is written into
    the label of the box that uses it; bindings no output depends on are not drawn.
    """
    found: list[Box | Apply] = []

    def is_constant(expr: Expr, consts: set[str]) -> bool:
        if isinstance(expr, Var):
            return expr.name in consts
        if isinstance(expr, Box):
            return not expr.axes and all(is_constant(a, consts) for a in expr.args)
        return not isinstance(expr, Apply)

    def live_lets(d: Diagram) -> list[Let]:
        needed = {v.name for out in d.outputs for v in walk(out) if isinstance(v, Var)}
        live: list[Let] = []
        for let in reversed(d.body):
            if needed & set(let.names):
                live.insert(0, let)
                needed |= {v.name for v in walk(let.expr) if isinstance(v, Var)}
        return live

    def visit(d: Diagram, consts: set[str]) -> set[str]:
        seen: set[int] = set()  # a shared sub-expression is one box
        lets = live_lets(d)
        for let in lets:
            if is_constant(let.expr, consts):
                consts = consts | set(let.names)
        for node in (n for r in [let.expr for let in lets] + list(d.outputs) for n in walk(r)):
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, (Box, Apply)) and not is_constant(node, consts):
                found.append(node)
        return consts

    if expand:  # drawn as the kernel unfolds it: every diagram used as a box inlined
        diagram = inline_calls(diagram, lambda box, args: replace(
            box, args=args, axes=ops.result_axes(box.op, tuple(a.axes for a in args), box.target, box.out)))
    consts = visit(diagram, set())
    return found, sum(is_constant(out, consts) for out in diagram.outputs)


def _check_picture(diagram: Diagram, svg: str, expand: bool) -> ET.Element:
    root = ET.fromstring(svg)  # valid XML
    texts = _texts(root)
    sizes = diagram.axis_sizes()
    axes = {a for p in diagram.inputs for a in p.axes} | {a for t in diagram.out_types for a in t}
    for box in _drawn_boxes(diagram, expand)[0]:
        axes |= set(box.axes if isinstance(box, Box) else ())
    for axis in axes:
        label = axis if sizes.get(axis) is None else f"{axis}={sizes[axis]}"
        assert label in texts, f"{diagram.name}: no wire labelled {label!r}"
    groups = [g for g in root.iter(f"{SVG}g") if g.get("class") == "box"]
    boxes, constants = _drawn_boxes(diagram, expand)
    assert len(groups) == len(boxes) + constants, f"{diagram.name}: {len(groups)} boxes drawn, {len(boxes)} in the term"
    drawn = ["".join(t for el in g.iter(f"{SVG}text") for t in el.itertext()) for g in groups]
    for box in boxes:
        glyph = box.diagram.name if isinstance(box, Apply) else GLYPHS[box.op][1]
        assert any(glyph in text for text in drawn), f"{diagram.name}: no box labelled {glyph!r} in {drawn}"
    for a, b in itertools.combinations(_box_shapes(root), 2):
        assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], f"{diagram.name}: boxes overlap"
    return root


def _example_diagrams() -> list[tuple[str, Diagram]]:
    return [(f"{p.stem}:{d.name}", d) for p in EXAMPLES for d in load(p).diagrams]


@pytest.mark.parametrize(("name", "diagram"), _example_diagrams(), ids=[n for n, _ in _example_diagrams()])
def test_every_example_draws_with_all_its_labels(name: str, diagram: Diagram) -> None:
    for expand in (False, True):
        _check_picture(diagram, draw_svg(diagram, expand), expand)


def test_weaving_draws_woven_axes_over_the_inner_box() -> None:
    mha = load(ROOT / "examples" / "attention.ncd").diagram("mha")
    root = ET.fromstring(draw_svg(mha))
    woven = [el for el in root.iter() if "woven" in (el.get("class") or "").split()]
    # b and h of Q, K and V pass over the attention box into b and h of the output
    assert len(woven) == 6
    expanded = ET.fromstring(draw_svg(mha, expand=True))
    titles = {"".join(t.itertext()) for t in expanded.iter(f"{SVG}title")}
    assert "attention" not in titles and any(t.startswith("softmax") for t in titles)


def test_tuples_are_separated_and_copies_fork() -> None:
    layernorm = load(ROOT / "examples" / "layernorm.ncd").diagram("layernorm")
    root = ET.fromstring(draw_svg(layernorm))
    separators = [el for el in root.iter() if el.get("class") == "separator"]
    assert len(separators) >= 2  # X | G | B at least
    assert any(el.tag == f"{SVG}circle" for el in root.iter())  # X feeds two boxes


def test_drawing_is_deterministic() -> None:
    diagram = load(ROOT / "examples" / "attention.ncd").diagram("causal_attention")
    assert draw_svg(diagram) == draw_svg(diagram)


def test_theorem_wires_take_the_colour_of_their_level() -> None:
    thm = _prove("flash_attention", *FLASH_STEPS)
    flash = thm.result
    svg = draw_svg(thm)
    # the plain labels are on the HBM side of each wire, the tiled ones after the loads
    root = _check_picture(flash, svg, False)
    assert _strokes(root) == {LEVEL_COLOURS["hbm"], LEVEL_COLOURS["smem"]}
    texts = _texts(root)
    assert {"q g=gq", "x s=sx", "hbm", "smem", "load", "save"} <= set(texts)
    markers = [el.get("class") for el in root.iter() if el.get("class") in MARK_COLOURS]
    # Q, K and V are loaded into their first box; only O is saved (S stays on chip)
    assert markers.count("load") == 3 and markers.count("save") == 1
    assert "group q by gq at smem" in svg


def test_unfused_schedule_saves_and_loads_every_intermediate() -> None:
    root = ET.fromstring(draw_svg(_prove("naive")))
    markers = [el.get("class") for el in root.iter() if el.get("class") in MARK_COLOURS]
    # four boxes, each its own kernel: 4 saves; loads: Q, K, the scores, S, P and V
    assert markers.count("save") == 4 and markers.count("load") == 6
    root = ET.fromstring(draw_svg(_prove("fused", "place S, P at smem")))
    markers = [el.get("class") for el in root.iter() if el.get("class") in MARK_COLOURS]
    assert markers.count("save") == 2 and markers.count("load") == 4  # the unnamed scores still go to HBM


def test_two_levels_load_through_smem_into_registers() -> None:
    thm = _prove("two_level", *FLASH_STEPS, "group q by wq at reg", "stream x by rx at reg via online_softmax")
    root = ET.fromstring(draw_svg(thm))
    assert _strokes(root) == {LEVEL_COLOURS[lv] for lv in ("hbm", "smem", "reg")}
    texts = set(_texts(root))
    assert {"q g=gq", "q g=wq", "x s=sx", "x s=rx"} <= texts
    markers = [el.get("class") for el in root.iter() if el.get("class") in MARK_COLOURS]
    assert markers.count("load") == 6 and markers.count("save") == 2


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_png_output(tmp_path: Path) -> None:
    diagram = load(ROOT / "examples" / "attention.ncd").diagram("attention")
    out = save(diagram, tmp_path / "attention.png")
    width, height = _png_size(out.read_bytes())
    root = ET.fromstring(draw_svg(diagram))
    assert width == pytest.approx(2 * float(root.get("width", "0")), abs=2)
    assert height == pytest.approx(2 * float(root.get("height", "0")), abs=2)


def test_png_is_not_written_through_a_python_callback_inside_cairo(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C while cairo wrote the PNG to a Python stream was swallowed in cairo's write callback and came
    out as OSError (a traceback where `napkin draw` promises exit 130; found by benchmarks/fuzz_verbs.py).
    Cairo now writes to a file by name: a stream writer that is interrupted is never called."""
    import cairocffi.surfaces

    def interrupted(target: object) -> object:
        @cairocffi.ffi.callback("cairo_write_func_t", error=cairocffi.constants.STATUS_WRITE_ERROR)
        def write(_closure: object, data: object, length: int) -> int:
            raise KeyboardInterrupt
        return write

    monkeypatch.setattr(cairocffi.surfaces, "_make_write_func", interrupted)
    diagram = load(ROOT / "examples" / "attention.ncd").diagram("attention")
    _png_size(save(diagram, tmp_path / "attention.png").read_bytes())


def test_draw_steps_writes_the_strip(tmp_path: Path) -> None:
    states = [_prove("flash", *FLASH_STEPS[:k]) for k in range(3)]
    written = draw_steps(states, tmp_path / "strip")
    assert [p.name for p in written] == ["step00.svg", "step01.svg", "step02.svg", "index.html"]
    page = written[-1].read_text()
    assert page.index("step00.svg") < page.index("step01.svg") < page.index("step02.svg")
    assert "rewrite softmax_contract at P, O" in page and "group q by gq at smem" in page
    for path in written[:-1]:
        ET.fromstring(path.read_text())


def test_cli_draws_diagrams_and_refuses_bad_requests(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    example = str(ROOT / "examples" / "attention.ncd")
    assert main(["draw", example, "mha", "-o", str(tmp_path / "mha.svg"), "--expand"]) == 0
    ET.fromstring((tmp_path / "mha.svg").read_text())
    assert main(["draw", example, "attention", "-o", str(tmp_path / "a.png")]) == 0
    _png_size((tmp_path / "a.png").read_bytes())
    assert main(["draw", example, "nothing", "-o", str(tmp_path / "x.svg")]) == 2
    assert main(["draw", example, "attention", "-o", str(tmp_path / "x.pdf")]) == 2
    assert main(["draw", example, "attention", "--steps", "-o", str(tmp_path / "dir")]) == 2
    assert "not a theorem" in capsys.readouterr().err


def test_cli_draws_a_checked_theorem_and_its_steps(tmp_path: Path) -> None:
    proofs = ROOT / "proofs" / "flash_attention.ncd"
    assert main(["draw", str(proofs), "flash_attention", "-o", str(tmp_path / "flash.svg")]) == 0
    root = ET.fromstring((tmp_path / "flash.svg").read_text())
    assert LEVEL_COLOURS["smem"] in _strokes(root)
    assert main(["draw", str(proofs), "flash_attention", "--steps", "-o", str(tmp_path / "strip")]) == 0
    pages = sorted(p.name for p in (tmp_path / "strip").iterdir())
    assert "index.html" in pages and len([p for p in pages if p.endswith(".svg")]) >= 4


def test_readme_draw_commands_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the README's commands run from the repository root
    commands = re.findall(r"\.venv/bin/napkin (draw [^\n]+)", (ROOT / "README.md").read_text())
    assert len(commands) >= 3
    for command in commands:
        args = command.split()
        out = args.index("-o") + 1
        args[out] = str(tmp_path / Path(args[out]).name)  # not over the committed pictures
        assert main(args) == 0, command
        assert (tmp_path / Path(args[out]).name).exists()


def test_diagrams_and_theorems_display_in_notebooks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside an IPython shell, napkin registers an SVG formatter for diagrams and theorems."""
    registered: dict[type, object] = {}
    formatter = types.SimpleNamespace(for_type=registered.__setitem__)
    shell = types.SimpleNamespace(display_formatter=types.SimpleNamespace(formatters={"image/svg+xml": formatter}))
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    assert napkin_cat.show_in_notebooks()
    diagram = load(ROOT / "examples" / "matmul.ncd").diagram("matmul")
    thm = proof.theorem(ROOT / "proofs" / "matmul.ncd", "tiled_matmul")
    show = registered[type(diagram)]
    assert show(diagram) == draw_svg(diagram)  # type: ignore[operator]
    assert "b s=" in registered[type(thm)](thm)  # type: ignore[operator]
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: None))
    assert not napkin_cat.show_in_notebooks()  # outside a shell nothing is registered


def test_theorems_carry_the_cost_models_row() -> None:
    thm = _prove("flash_attention", *FLASH_STEPS)
    root = ET.fromstring(draw_svg(thm))
    table = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "cost")
    texts = ["".join(t.itertext()) for t in table.iter(f"{SVG}text")]
    assert texts[0] == "M smem" and "H smem" in texts
    smem = cost.cost(thm).level("smem")
    total = next(t for t in texts if t.startswith("smem: M = "))
    memory, transfers = re.fullmatch(r"smem: M = (.*), H = (.*) \(from hbm\)", total).groups()  # type: ignore[union-attr]
    symbols = {s.name: s for s in smem.transfers.free_symbols | smem.memory.free_symbols}
    assert sympy.simplify(sympy.sympify(transfers, locals=symbols) - smem.transfers) == 0
    assert sympy.simplify(sympy.sympify(memory, locals=symbols) - smem.memory) == 0
    # one M and one H cell per column of boxes (Σ_d, · × rsqrt(d), ◁Σ_x), under its box
    boxes = [g for g in root.iter(f"{SVG}g") if g.get("class") == "box"]
    assert len([t for t in texts if t not in ("M smem", "H smem") and not t.startswith("smem:")]) == 2 * len(boxes)


# found by this test in CI: a call woven over b whose output is a constant, then split along b
CONSTANT_WOVEN_CALL = """
axis a, b, p0, p1
diagram g0(X0: [a]) -> [] {
  return a
}
diagram g2(X0: [a b]) -> [p0 p1] {
  return split[b -> p0 p1](g0(X0))
}
"""


@given(module=modules(max_diagrams=3))
@example(module=loads(CONSTANT_WOVEN_CALL))
def test_random_diagrams_draw_with_all_labels_and_no_overlaps(module: Module) -> None:
    for diagram in module.diagrams:
        for expand in (False, True):
            _check_picture(diagram, draw_svg(diagram, expand), expand)


def test_draw_steps_of_a_chain_draws_each_kernels_steps(tmp_path: Path) -> None:
    """A chain's derivation strip: the whole diagram's steps, then each kernel's piece from
    reflexivity through its own steps, kernel by kernel (not only the steps before the kernels)."""
    proofs = ROOT / "proofs" / "chains.ncd"
    assert main(["draw", str(proofs), "attention_then_projection", "--steps", "-o", str(tmp_path / "strip")]) == 0
    page = (tmp_path / "strip" / "index.html").read_text()
    captions = re.findall(r"<figcaption>\d+\. ([^<]*)</figcaption>", page)
    assert captions == ["the diagram attention_projected (reflexivity)",
                        "the diagram attention_projected_k1 (reflexivity)", "rewrite softmax_contract at P, O",
                        "group q by gq at smem", "stream x by sx at smem via online_softmax",
                        "the diagram attention_projected_k2 (reflexivity)", "group q by gp at smem",
                        "group f by gf at smem", "stream d by sd at smem via sum"]
    for path in (tmp_path / "strip").glob("*.svg"):
        ET.fromstring(path.read_text())
