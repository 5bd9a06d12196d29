"""Diagrams and theorems as pictures in the Neural Circuit Diagram style (Abbott, TMLR 2024).

``draw_svg(diagram)`` draws a diagram: wires are axes (labelled with their names and
sizes), each column of stacked wires an array, dashed lines separate the arrays of a
tuple, boxes sit between columns, and an axis a box is woven over passes over it.
``draw_svg(theorem)`` draws the theorem's result under its schedule: wires are coloured
by the memory level where the array lives, loads and saves are marked where the colour
changes, partitioned axes carry their tile (``g``) or stream (``s``) size below the level
they are partitioned at, and a row under each column gives the cost model's memory M and
transfers H when ``napkin_cat.cost`` is available.

The geometry comes from ``draw_graph`` (term -> graph) and ``draw_layout`` (graph ->
coordinates); this module only styles it.  SVG is written with drawsvg, PNG converted with
cairosvg.
"""

from __future__ import annotations

import contextlib
import html
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import drawsvg as dw

from napkin_cat.draw.cost import CELL_FONT, CostTable, cost_table, crowded
from napkin_cat.draw.graph import Edge, Graph, Node, build_graph
from napkin_cat.draw.layout import (
    AXIS_FONT,
    BOX_FONT,
    MARK_W,
    NAME_FONT,
    Layout,
    Piece,
    Residency,
    layout,
    text_width,
    triangle,
)
from napkin_cat.files import Outputs
from napkin_cat.printer import print_step
from napkin_cat.schedule.loopnest import loop_nest
from napkin_cat.terms import LEVELS, Diagram, Schedule

__all__ = ["LEVEL_COLOURS", "TheoremLike", "draw_steps", "draw_svg", "save", "svg_to_png"]

#: wire colour per memory level: the Napkin paper colours ℓ0 arrays black and ℓ1 arrays orange
LEVEL_COLOURS: dict[str, str] = {"hbm": "#1a1a1a", "l2": "#7b3fa0", "smem": "#e07000", "reg": "#1769c2"}
#: load and save regions (shaded in the Napkin paper's Fig. 8), in the teal and magenta of
#: torchlette's rendering of that figure (github.com/vinhowe/torchlette)
MARK_COLOURS: dict[str, str] = {"load": "#1a9e8f", "save": "#c2185b"}
#: where boxes run when the schedule names no level: the paper's ℓ1, one kernel per box
DEFAULT_COMPUTE = "smem"
SANS = "DejaVu Sans, Verdana, sans-serif"
SERIF = "DejaVu Serif, Georgia, serif"


class TheoremLike(Protocol):
    """What drawing needs of a ``kernel.Theorem``."""

    @property
    def name(self) -> str: ...

    @property
    def source(self) -> Diagram: ...

    @property
    def result(self) -> Diagram: ...

    @property
    def schedule(self) -> Schedule: ...

    @property
    def steps(self) -> tuple[Any, ...]: ...


class PlainDecor:
    """A diagram without a schedule: black wires, labelled ``axis`` or ``axis=size``."""

    def __init__(self, diagram: Diagram):
        self.sizes = diagram.axis_sizes()

    def residency(self, graph: Graph, edge: Edge) -> Residency:
        return Residency()

    def box_level(self, node: Node) -> str | None:
        return None

    def label(self, axis: str, level: str | None) -> str:
        size = self.sizes.get(axis)
        return axis if size is None else f"{axis}={size}"


class ScheduleDecor(PlainDecor):
    """Levels from a schedule, by the residency rule shared with cost and lowering.

    An array lives where ``loopnest.LoopNest.level_of`` says (its placement; else HBM for
    inputs and outputs; else the innermost partition's level).  Boxes run at the deepest
    level the schedule names (``DEFAULT_COMPUTE`` if none).  An array is loaded down, one
    level at a time through the levels the schedule uses (R8), into every box that reads
    it, and saved up the same way from the box that makes it.
    """

    def __init__(self, diagram: Diagram, schedule: Schedule):
        super().__init__(diagram)
        self.nest = loop_nest(diagram, schedule)
        named = {p.level for p in schedule.partitions} | {p.level for p in schedule.placements}
        self.compute = max(named, key=LEVELS.index) if named else DEFAULT_COMPUTE
        self.used = sorted(named | {self.compute}, key=LEVELS.index)
        self.partitions = schedule.partitions

    def path(self, high: str, low: str) -> tuple[str, ...]:
        """``high``, then every level the schedule uses strictly below it, down to ``low``."""
        depth = LEVELS.index
        return (high, *(lv for lv in self.used if depth(high) < depth(lv) <= depth(low)))

    def residency(self, graph: Graph, edge: Edge) -> Residency:
        src = graph.nodes[edge.src.node]
        name = graph.names.get(edge.src)
        if name is None and any(graph.nodes[e.dst].kind == "output" for e in graph.consumers(edge.src)):
            stored = "hbm"  # an unnamed output, like every output
        else:
            stored = self.nest.level_of(name or "")  # unnamed: an intermediate of the region
        up = (stored,) if src.kind == "input" else tuple(reversed(self.path(stored, self.compute)))
        down = (stored,) if graph.nodes[edge.dst].kind == "output" else self.path(stored, self.compute)
        return Residency(up, down)

    def box_level(self, node: Node) -> str | None:
        return self.compute

    def label(self, axis: str, level: str | None) -> str:
        text = super().label(axis, level)
        depth = LEVELS.index(level) if level in LEVELS else -1
        inner = [p for p in self.partitions if p.axis == axis and LEVELS.index(p.level) <= depth]
        if inner:
            part = max(inner, key=lambda p: LEVELS.index(p.level))
            text += f" {part.kind[0]}={part.tile}"
        return text


def _is_theorem(obj: object) -> bool:
    return all(hasattr(obj, f) for f in ("name", "source", "result", "schedule", "steps"))


def draw_svg(obj: Diagram | TheoremLike, expand: bool = False) -> str:
    """An SVG picture of a diagram, or of a theorem's result under its schedule.

    ``expand`` draws diagrams used as boxes inline instead of as boxes.
    """
    if isinstance(obj, Diagram):
        return _render(obj, PlainDecor(obj), expand, obj.name, [], None)
    if not _is_theorem(obj):
        raise TypeError(f"draw_svg draws a Diagram or a Theorem, not {type(obj).__name__}")
    if getattr(obj, "kernels", ()):
        return _chain_svg(obj, expand)
    diagram = obj.result
    steps = [print_step(s) for s in obj.steps]
    title = f"{obj.name}: {obj.source.name}" if obj.source.name == diagram.name else \
        f"{obj.name}: {obj.source.name} ≡ {diagram.name}"
    return _render(diagram, ScheduleDecor(diagram, obj.schedule), expand, title, steps, cost_table(obj))


def _chain_svg(obj: TheoremLike, expand: bool) -> str:
    """A chain (``kernel.chain``): a title naming its kernels and the arrays each writes to hbm, then each
    kernel's picture (as ``draw_svg`` draws a theorem) below the one before, in the order they run."""
    kernels: Sequence[TheoremLike] = obj.kernels  # type: ignore[attr-defined]
    writes: Sequence[tuple[str, ...]] = obj.writes  # type: ignore[attr-defined]
    pictures = [draw_svg(k, expand) for k in kernels]
    sizes = [tuple(float(v) for v in re.search(r'width="([0-9.]+)" height="([0-9.]+)"', svg).groups())  # type: ignore[union-attr]
             for svg in pictures]
    lines = [f"{obj.name}: {obj.source.name} as {len(kernels)} kernels run in order",
             *(f"kernel {k}: {kernel.name} writes {'the outputs' if w == ('return',) else ', '.join(w) + ' to hbm'}"
               for k, (kernel, w) in enumerate(zip(kernels, writes, strict=True), start=1))]
    top = 30.0 + 18.0 * len(lines)
    width = max(*(w for w, _ in sizes), *(text_width(t, 15) + 32 for t in lines))
    d = dw.Drawing(width, top + sum(h for _, h in sizes))
    d.append(dw.Rectangle(0, 0, width, top + sum(h for _, h in sizes), fill="white"))
    _text(d, 16, 22, lines[0], _Text(15, weight="bold"))
    for i, line in enumerate(lines[1:]):
        _text(d, 16, 42 + 18 * i, line, _Text(12, family=SERIF))
    outer = str(d.as_svg())
    y, nested = top, []
    for svg, (_, h) in zip(pictures, sizes, strict=True):
        body = svg[svg.index("<svg"):]
        nested.append(f'<svg x="0" y="{y:.1f}"' + body[len("<svg"):])
        y += h
    return outer.replace("</svg>", "".join(nested) + "</svg>")


@dataclass(frozen=True)
class _Text:
    size: float
    family: str = SANS
    weight: str = "normal"
    style: str = "normal"


def _text(d: dw.Drawing | dw.Group, x: float, y: float, label: str | Sequence[tuple[str, bool]], font: _Text,
          anchor: str = "start", fill: str = "#1a1a1a") -> None:
    """Text at (x, y); ``label`` may be (text, is_subscript) parts, as box labels are."""
    parts = [(label, False)] if isinstance(label, str) else [p for p in label if p[0]]
    if not parts or not parts[0][0]:
        return
    plain = len(parts) == 1 and not parts[0][1]
    if not plain and anchor == "middle":  # renderers differ on anchoring tspans: place it ourselves
        x -= sum(text_width(t, font.size) * (0.8 if sub else 1.0) for t, sub in parts) * 0.45
        anchor = "start"
    text = dw.Text(parts[0][0] if plain else "", font.size, x, y, text_anchor=anchor,
                   font_family=font.family, font_weight=font.weight, font_style=font.style, fill=fill)
    if not plain:
        shift = 0.0
        for part, sub in parts:
            dy = (4.0 if sub else 0.0) - shift
            shift += dy
            text.append(dw.TSpan(part, dy=dy, font_size=font.size * (0.78 if sub else 1.0)))
    d.append(text)


def box_parts(node: Node) -> list[tuple[str, bool]]:
    """A box's label as (text, is_subscript) parts."""
    return [(node.label, False), (node.sub, True), (node.suffix, False)]


def _path(piece: Piece) -> str:
    if abs(piece.y1 - piece.y0) < 0.01:
        return f"M{piece.x0:.1f},{piece.y0:.1f} L{piece.x1:.1f},{piece.y1:.1f}"
    mid = (piece.x0 + piece.x1) / 2
    return (f"M{piece.x0:.1f},{piece.y0:.1f} C{mid:.1f},{piece.y0:.1f} {mid:.1f},{piece.y1:.1f} "
            f"{piece.x1:.1f},{piece.y1:.1f}")


def _colour(level: str | None) -> str:
    return LEVEL_COLOURS.get(level or "hbm", "#1a1a1a")


def _render(diagram: Diagram, decor: PlainDecor, expand: bool, title: str, steps: Sequence[str],
            table: CostTable | None) -> str:
    graph = build_graph(diagram, expand)
    step_lines = _wrap(steps, 900.0)
    header = 30.0 + 18.0 * len(step_lines)
    widths: dict[int, float] = {}
    lay = layout(graph, decor, top=header)
    if table and any(col >= len(lay.columns) for _, row in table.rows for col in row):
        # the cost model's columns (of the unfolded program) can outnumber the picture's: keep the totals
        table = CostTable((), (*table.totals, f"(per-column costs omitted: the cost model has more columns than "
                                              f"the picture's {len(lay.columns)})"))
    for _ in range(2 * len(lay.columns)):  # widen columns until the cost cells fit
        tight = crowded(lay, table) if table else {}
        if not tight:
            break
        for col, need in tight.items():
            widths[col] = lay.columns[col][1] - lay.columns[col][0] + need
        lay = layout(graph, decor, top=header, min_widths=widths)
    levels = sorted({p.level for r in lay.runs for p in r.pieces if p.level}, key=LEVELS.index)
    table_h = 10.0 + 17.0 * (len(table.rows) + len(table.totals)) if table else 0.0
    legend_h = 30.0 if levels else 0.0
    lines = [title, *step_lines, *(table.totals if table else ())]
    cells = [((x0 + x1) / 2 + text_width(t, CELL_FONT) / 2 + 16) for _, row in (table.rows if table else ())
             for col, t in row.items() for x0, x1 in [lay.columns[col]]]
    width = max(lay.width, *cells, *(text_width(t, 15) + 32 for t in lines))
    d = dw.Drawing(width, lay.height + table_h + legend_h)
    d.append(dw.Rectangle(0, 0, width, lay.height + table_h + legend_h, fill="white"))
    _text(d, 16, 22, title, _Text(15, weight="bold"))
    for i, line in enumerate(step_lines):
        _text(d, 16, 42 + 18 * i, line, _Text(12, family=SERIF))
    _draw_body(d, lay)
    if table:
        _table(d, lay, table, width)
    if levels:
        _legend(d, 16, lay.height + table_h + 6, levels, any(True for _ in lay.markers))
    return str(d.as_svg())


def _wrap(steps: Sequence[str], width: float) -> list[str]:
    """The proof steps as ``;``-separated lines no wider than ``width`` (one step may exceed it)."""
    lines: list[str] = []
    for step in steps:
        if lines and text_width(f"{lines[-1]}; {step}", 12) <= width:
            lines[-1] = f"{lines[-1]}; {step}"
        else:
            lines.append(step)
    return lines


def _table(d: dw.Drawing, lay: Layout, table: CostTable, width: float) -> None:
    """The cost rows, each cell centred under its column, then the totals per level."""
    y = lay.height
    d.append(dw.Line(16, y, width - 16, y, stroke="#b0b0b0", stroke_width=0.8))
    group = dw.Group(class_="cost")
    for header, cells in table.rows:
        y += 17
        _text(group, 16, y, header, _Text(CELL_FONT, weight="bold"))
        for col, text in sorted(cells.items()):
            x0, x1 = lay.columns[col]
            _text(group, (x0 + x1) / 2, y, text, _Text(CELL_FONT, SERIF), anchor="middle")
    for total in table.totals:
        y += 17
        _text(group, 16, y, total, _Text(CELL_FONT, SERIF))
    d.append(group)


def _draw_body(d: dw.Drawing, lay: Layout) -> None:
    for x0, x1, y in lay.separators:
        d.append(dw.Line(x0, y, x1, y, stroke="#8a8a8a", stroke_width=1, stroke_dasharray="4,3",
                         class_="separator"))
    for run in (r for r in lay.runs if not r.over):
        for piece in run.pieces:
            d.append(dw.Path(_path(piece), stroke=_colour(piece.level), stroke_width=1.7, fill="none",
                             class_="wire"))
    for box in lay.boxes:
        group = dw.Group(class_="box")
        group.append(dw.Title(box.node.title))
        if box.node.shape == "triangle":
            x0, y0, y1 = triangle(box)
            group.append(dw.Lines(x0, (y0 + y1) / 2, box.x + box.w, y0, box.x + box.w, y1, close=True,
                                  fill="#fdf6e3", stroke="#1a1a1a", stroke_width=1.4, class_="box-shape"))
        else:
            group.append(dw.Rectangle(box.x, box.y, box.w, box.h, rx=4, fill="#fdf6e3", stroke="#1a1a1a",
                                      stroke_width=1.4, class_="box-shape"))
            if box.node.shape == "inner":
                group.append(dw.Rectangle(box.x + 3, box.y + 3, box.w - 6, box.h - 6, rx=3, fill="none",
                                          stroke="#1a1a1a", stroke_width=0.8))
        _text(group, box.x + box.w / 2, box.y + 15, box_parts(box.node), _Text(BOX_FONT), anchor="middle")
        d.append(group)
    for run in (r for r in lay.runs if r.over):
        for piece in run.pieces:
            d.append(dw.Path(_path(piece), stroke="white", stroke_width=6, fill="none"))
            d.append(dw.Path(_path(piece), stroke=_colour(piece.level), stroke_width=1.7, fill="none",
                             class_="wire woven"))
    for marker in lay.markers:
        d.append(dw.Rectangle(marker.x, marker.y0, MARK_W, marker.y1 - marker.y0, rx=3,
                              fill=MARK_COLOURS[marker.kind], fill_opacity=0.35, stroke=MARK_COLOURS[marker.kind],
                              stroke_width=1, class_=marker.kind))
    for x, y in lay.forks:
        d.append(dw.Circle(x, y, 2.6, fill="#1a1a1a"))
    for label in lay.labels:
        font = _Text(NAME_FONT, weight="bold") if label.kind == "name" else _Text(AXIS_FONT, SERIF, style="italic")
        fill = "#1a1a1a" if label.kind == "name" else _colour(label.level)
        _text(d, label.x, label.y, label.text, font, anchor=label.anchor, fill=fill)


def _legend(d: dw.Drawing, x: float, y: float, levels: Sequence[str], marks: bool) -> None:
    for level in levels:
        d.append(dw.Line(x, y + 10, x + 22, y + 10, stroke=_colour(level), stroke_width=2.5))
        _text(d, x + 27, y + 14, level, _Text(12))
        x += 36 + text_width(level, 12)
    if marks:
        for kind in ("load", "save"):
            d.append(dw.Rectangle(x, y + 3, MARK_W, 14, rx=3, fill=MARK_COLOURS[kind], fill_opacity=0.35,
                                  stroke=MARK_COLOURS[kind], stroke_width=1))
            _text(d, x + MARK_W + 5, y + 14, kind, _Text(12))
            x += MARK_W + 18 + text_width(kind, 12)


def svg_to_png(svg: str, scale: float = 2.0) -> bytes:
    """PNG bytes of an SVG (cairosvg), at ``scale`` pixels per SVG unit.  Cairo writes them to a
    file by its name, not to a Python stream: a stream is written from a callback inside cairo,
    where an interrupt (Ctrl-C) is swallowed and comes out as cairo's OSError (a write error)."""
    import cairosvg

    with tempfile.TemporaryDirectory(prefix="napkin-png-") as folder:
        target = Path(folder) / "picture.png"
        cairosvg.svg2png(bytestring=svg.encode(), write_to=str(target), scale=scale)
        return target.read_bytes()


def save(obj: Diagram | TheoremLike, path: str | Path, expand: bool = False, outputs: Outputs | None = None) -> Path:
    """Write the picture to ``path``: ``.svg`` or ``.png`` by its suffix (atomically, through
    ``outputs``, which may refuse the path: ``files.OutputRefused``)."""
    path = Path(path)
    if path.suffix not in (".svg", ".png"):
        raise ValueError(f"cannot write a picture to {path}: use .svg or .png")
    outputs = outputs or Outputs()
    outputs.check(path)
    svg = draw_svg(obj, expand)
    return outputs.write(path, svg if path.suffix == ".svg" else svg_to_png(svg))


def draw_steps(states: Sequence[TheoremLike], folder: str | Path, expand: bool = False,
               outputs: Outputs | None = None) -> list[Path]:
    """The derivation strip: one picture per proof state, and an ``index.html`` in order.

    ``states[k]`` is the theorem after its first ``k`` steps (``states[0]``: reflexivity);
    each picture is captioned with the rule of the step that produced it.  The folder is
    created if missing (its parent must exist); the files are written through ``outputs``,
    all or none (``Outputs.write_all``), and a folder created for them is removed if they
    are not.
    """
    folder = Path(folder)
    pictures, rows = [], []
    for k, state in enumerate(states):
        name = f"step{k:02d}.svg"
        pictures.append((folder / name, draw_svg(state, expand)))
        rule = print_step(state.steps[-1]) if state.steps else f"the diagram {state.source.name} (reflexivity)"
        rows.append(f'<figure><figcaption>{k}. {html.escape(rule)}</figcaption>'
                    f'<img src="{name}" alt="{html.escape(rule)}"></figure>')
    title = html.escape(states[0].name) if states else "derivation"
    page = (f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{title}</title>\n'
            '<style>body{font-family:sans-serif;margin:2em} figure{margin:0 0 2em 0} '
            'figcaption{font-weight:bold;margin-bottom:.5em} img{max-width:100%}</style></head>\n'
            f'<body><h1>{title}: the derivation, step by step</h1>\n' + "\n".join(rows) + "\n</body></html>\n")
    outputs = outputs or Outputs()
    created = outputs.folder(folder)
    try:
        return outputs.write_all([*pictures, (folder / "index.html", page)])
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
