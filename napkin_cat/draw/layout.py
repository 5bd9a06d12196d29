"""The horizontal half of the layout: every coordinate of a drawing, derived from the term.

``draw_columns`` decides which column each box is in and its height; this module sizes
each column and the gap after it (save markers, the labels of the arrays leaving the
column, the S-curves, load markers with the labels of relabelled wires) and emits the
primitives ``draw`` styles: wire pieces at a memory level, boxes, labels, markers,
tuple separators and fork dots.  Memory levels come from a ``Decor``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from napkin_cat.draw.columns import HEAD, WIRE_GAP, Columns, Item, bundle_height
from napkin_cat.draw.graph import Edge, Graph, Node, Port
from napkin_cat.terms import Axes

__all__ = ["Decor", "Label", "Layout", "Marker", "PlacedBox", "Residency", "Run", "layout", "text_width", "triangle"]

MARK_W = 12.0  # width of a load or save marker
AXIS_FONT = 12.0
NAME_FONT = 12.0
BOX_FONT = 13.0


def text_width(text: str, size: float) -> float:
    """A generous estimate of the rendered width of ``text`` in DejaVu Sans / Verdana."""
    narrow, wide = set("ijlrtf.,:;!|()[] ·'"), set("mwMW—ΣΠ◁")
    total = 0.0
    for ch in text:
        total += 0.36 if ch in narrow else 0.95 if ch in wide else 0.74 if ch.isupper() else 0.66
    return total * size


@dataclass(frozen=True)
class Residency:
    """The memory levels an edge's array passes through (empty: no levels drawn).

    ``up``: from where it is produced to where it is stored (one save per step);
    ``down``: from where it is stored to where it is consumed (one load per step).
    """

    up: tuple[str, ...] = ()
    down: tuple[str, ...] = ()

    @property
    def produced(self) -> str | None:
        return self.up[0] if self.up else None

    @property
    def stored(self) -> str | None:
        return self.up[-1] if self.up else None

    @property
    def consumed(self) -> str | None:
        return self.down[-1] if self.down else None

    @property
    def save(self) -> bool:
        return len(self.up) > 1


class Decor(Protocol):
    """What a drawing adds to the bare graph: memory levels and wire labels."""

    def residency(self, graph: Graph, edge: Edge) -> Residency: ...

    def box_level(self, node: Node) -> str | None: ...

    def label(self, axis: str, level: str | None) -> str: ...


@dataclass(frozen=True)
class Piece:
    """A straight or S-curved stretch of one wire at one memory level."""

    x0: float
    y0: float
    x1: float
    y1: float
    level: str | None


@dataclass(frozen=True)
class Run:
    """One wire (one axis of one array) as pieces; ``over``: woven over a box."""

    axis: str
    pieces: tuple[Piece, ...]
    over: bool = False


@dataclass(frozen=True)
class Label:
    x: float
    y: float  # the text baseline
    text: str
    anchor: str  # "start" | "end"
    level: str | None
    kind: str  # "axis" | "name"


@dataclass(frozen=True)
class Marker:
    """A load (``stored -> consumed``) or save (``produced -> stored``) across one array."""

    kind: str
    x: float
    y0: float
    y1: float


@dataclass(frozen=True)
class PlacedBox:
    node: Node
    x: float
    y: float
    w: float
    h: float
    level: str | None


def triangle(box: PlacedBox) -> tuple[float, float, float]:
    """The softmax triangle ◁ in a box: its apex x, top and bottom (its base is the right edge)."""
    y0, y1 = box.y + HEAD - 1, box.y + box.h
    return box.x + max(box.w - 1.1 * (y1 - y0), 0.0), y0, y1


@dataclass
class Layout:
    width: float = 0.0
    height: float = 0.0
    boxes: list[PlacedBox] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    labels: list[Label] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    separators: list[tuple[float, float, float]] = field(default_factory=list)  # x0, x1, y
    forks: list[tuple[float, float]] = field(default_factory=list)
    #: the x-range of each column of boxes (the first: inputs, the last: outputs)
    columns: list[tuple[float, float]] = field(default_factory=list)


def layout(graph: Graph, decor: Decor, margin: float = 16.0, top: float = 0.0,
           min_widths: Mapping[int, float] | None = None) -> Layout:
    """Place every box, wire, label and marker of ``graph``; ``top`` reserves room above,
    ``min_widths`` widens columns (by index) to fit what is drawn under them."""
    cols = Columns(graph)
    cols.arrange()
    return _Placer(graph, decor, cols, margin, top, min_widths or {}).place()


class _Placer:
    """The horizontal pass: column widths, gap strips, and the drawing primitives."""

    def __init__(self, graph: Graph, decor: Decor, cols: Columns, margin: float, top: float,
                 min_widths: Mapping[int, float]) -> None:
        self.g, self.decor, self.c, self.margin, self.top = graph, decor, cols, margin, top
        self.min_widths = min_widths
        self.res = [decor.residency(graph, e) for e in graph.edges]
        self.out = Layout()

    def labels(self, axes: Axes, level: str | None) -> list[str]:
        return [self.decor.label(a, level) for a in axes] if axes else [""]

    def box_width(self, node: Node) -> float:
        w = text_width(node.label + node.suffix, BOX_FONT) + 0.8 * text_width(node.sub, BOX_FONT) + 18
        return max(w, 44.0 if node.shape == "triangle" else 30.0)

    def start_ports(self, col: int) -> list[Port]:
        """Ports of boxes in ``col`` whose arrays get labels right after the box."""
        ports = {self.g.edges[k].src for k, step in self.c.hops(col) if step == 0}
        return sorted((p for p in ports if self.g.nodes[p.node].kind == "box"), key=lambda p: (p.node, p.index))

    def strip_width(self, port: Port) -> float:
        res = next(self.res[k] for k, e in enumerate(self.g.edges) if e.src == port)
        name = self.g.names.get(port, "")
        texts = self.labels(self.g.axes(port), res.stored)
        return (text_width(name, NAME_FONT) + 6 if name else 0) + max(text_width(t, AXIS_FONT) for t in texts) + 10

    def load_plan(self, k: int) -> list[tuple[str, list[str] | None]]:
        """Each load of edge ``k``: the level loaded into, and labels if they say something new."""
        res, axes = self.res[k], self.g.axes(self.g.edges[k].src)
        plan, seen = [], self.labels(axes, res.stored)
        for level in res.down[1:]:
            texts = self.labels(axes, level)
            plan.append((level, texts if texts != seen else None))
            seen = texts
        return plan

    def load_width(self, k: int) -> float:
        return sum(MARK_W + 4 + (max(text_width(t, AXIS_FONT) for t in texts) + 10 if texts else 0.0)
                   for _, texts in self.load_plan(k))

    def place(self) -> Layout:
        g, c, out = self.g, self.c, self.out
        for item in (it for col in c.cols for it in col):
            item.y += self.top + self.margin
        inputs = [n for n in g.nodes if n.kind == "input"]
        outputs = [n for n in g.nodes if n.kind == "output"]
        left = self.margin + max((self.side_width(n.outputs[0], n.name, self.stored_of_input(n)) for n in inputs),
                                 default=0.0)
        zones: list[tuple[float, float]] = []
        #: per gap between columns: start, end of saves, end of labels, end of curves, end
        gaps: list[tuple[float, float, float, float, float]] = []
        x = left
        for col in range(c.n):
            boxes = [it.node for it in c.cols[col] if it.node is not None and it.node.kind == "box"]
            w = max([self.box_width(n) for n in boxes] + [self.min_widths.get(col, 0.0)])
            zones.append((x, x + w))
            x += w
            if col == c.n - 1:
                break
            hops = c.hops(col)
            save = max((max(len(self.res[k].up) - 1, 0) * (MARK_W + 4) for k, step in hops if step == 0), default=0.0)
            strip = max((self.strip_width(p) for p in self.start_ports(col)), default=0.0)
            strip = max(strip, 22.0)
            dy = max((abs(c.in_y(k, s + 1) - c.out_y(k, s)) for k, s in hops), default=0.0)
            curve = min(max(36.0, 0.45 * dy), 110.0)
            load = max((self.load_width(k) for k, s in hops if s == len(c.chain[k]) - 2), default=0.0)
            gaps.append((x, x + save, x + save + strip, x + save + strip + curve, x + save + strip + curve + load))
            x = gaps[-1][4]
        out.columns = zones
        for k in range(len(g.edges)):
            self.edge(k, zones, gaps)
        for col in range(c.n - 1):
            self.strip(col, gaps[col])
        for item in (it for col in c.cols for it in col if it.node is not None and it.node.kind == "box"):
            assert item.node is not None
            self.box(item, item.node, zones[c.layer[item.node.id]])
        for node in inputs:
            self.side(node.outputs[0], node.name, self.stored_of_input(node), left, c.item_of[node.id].y, "end")
        for node in outputs:
            src = node.inputs[0]
            res = self.res[next(k for k, e in enumerate(g.edges) if e.dst == node.id)]
            self.side(g.axes(src), node.name, res.stored, x, c.item_of[node.id].y, "start")
        for col_nodes, x_side, anchor in ((inputs, left, "end"), (outputs, x, "start")):
            bundles = [(c.item_of[n.id].y, c.item_of[n.id].height) for n in col_nodes]
            xs = (x_side - 40, x_side - 4) if anchor == "end" else (x_side + 4, x_side + 40)
            self.separate(bundles, *xs)
        right = max((self.side_width(g.axes(n.inputs[0]), n.name, None) for n in outputs), default=0.0)
        out.width = x + right + self.margin
        out.height = max(it.y + it.height for col in c.cols for it in col) + self.margin + 12
        return out

    def stored_of_input(self, node: Node) -> str | None:
        ks = [k for k, e in enumerate(self.g.edges) if e.src.node == node.id]
        return self.res[ks[0]].stored if ks else None

    def side_width(self, axes: Axes, name: str | None, level: str | None) -> float:
        texts = self.labels(axes, level)
        return max(text_width(t, AXIS_FONT) for t in texts) + (text_width(name, NAME_FONT) + 10 if name else 0) + 10

    def side(self, axes: Axes, name: str | None, level: str | None, x: float, y: float, anchor: str) -> None:
        """Labels beside a diagram input (left, ``end``) or output (right, ``start``)."""
        sign = -1 if anchor == "end" else 1
        texts = self.labels(axes, level)
        for i, text in enumerate(texts):
            self.out.labels.append(Label(x + sign * 5, y + i * WIRE_GAP + 4, text, anchor, level, "axis"))
        if name:
            width = max(text_width(t, AXIS_FONT) for t in texts)
            mid = y + bundle_height(axes) / 2 + 4
            self.out.labels.append(Label(x + sign * (width + 14), mid, name, anchor, level, "name"))

    def separate(self, bundles: list[tuple[float, float]], x0: float, x1: float) -> None:
        """Dashed tuple separators between consecutive arrays stacked in one column."""
        bundles = sorted(bundles)
        for (y0, h0), (y1, _) in itertools.pairwise(bundles):
            self.out.separators.append((x0, x1, (y0 + h0 + y1) / 2))

    def strip(self, col: int, gap: tuple[float, ...]) -> None:
        """Labels of the arrays leaving column ``col`` and the separators between them."""
        c, g = self.c, self.g
        labelled = len(self.out.labels)
        for port in self.start_ports(col):
            ks = [k for k, e in enumerate(g.edges) if e.src == port]
            item = c.item_of[port.node]
            y = item.y + item.out_off[port.index]
            level = self.res[ks[0]].stored
            if all(g.nodes[g.edges[k].dst].kind == "output" and len(c.chain[k]) == 2 for k in ks):
                continue  # labelled at the right edge instead
            name = g.names.get(port)
            texts = self.labels(g.axes(port), level)
            x_axis = gap[1] + 4 + (text_width(name, NAME_FONT) + 6 if name else 0)
            if name:
                self.out.labels.append(Label(gap[1] + 4, y - 4, name, "start", level, "name"))
            for i, text in enumerate(texts):
                self.out.labels.append(Label(x_axis, y + i * WIRE_GAP - 4, text, "start", level, "axis"))
        if len(self.out.labels) == labelled:
            return  # no array is labelled here: the column of arrays is shown elsewhere
        bundles: dict[tuple[int, int], tuple[float, float]] = {}
        for k, step in c.hops(col):
            bundles[(c.chain[k][step].node.id, g.edges[k].src.index) if step == 0 else (-1, k)] = (  # type: ignore[union-attr]
                c.out_y(k, step), bundle_height(g.axes(g.edges[k].src)))
        self.separate(list(bundles.values()), gap[0] + 2, gap[2])

    def edge(self, k: int, zones: Sequence[tuple[float, float]], gaps: Sequence[tuple[float, ...]]) -> None:
        """The wires of edge ``k``, hop by hop, with its save and load markers."""
        c, g, res, out = self.c, self.g, self.res[k], self.out
        edge, chain = g.edges[k], self.c.chain[k]
        axes = g.axes(edge.src)
        first = c.layer[edge.src.node]
        src_item, dst_item = chain[0], chain[-1]
        dst_box = dst_item.node if dst_item.node and dst_item.node.kind == "box" else None
        for i, axis in enumerate(axes or ("",)):
            pieces: list[Piece] = []
            dy = i * WIRE_GAP
            y = c.out_y(k, 0) + dy
            if src_item.node is not None and src_item.node.kind == "box":
                x_start = self.box_right(src_item)
                pieces.append(Piece(x_start, y, zones[first][1], y, res.produced))
            for step in range(len(chain) - 1):
                gap = gaps[first + step]
                y0, y1 = c.out_y(k, step) + dy, c.in_y(k, step + 1) + dy
                x = gap[0]
                for level in res.up[1:] if step == 0 else ():
                    mid = x + 2 + MARK_W / 2
                    pieces.append(Piece(x, y0, mid, y0, pieces[-1].level if pieces else res.produced))
                    x = mid
                    pieces.append(Piece(x, y0, x + MARK_W / 2 + 2, y0, level))
                    x += MARK_W / 2 + 2
                pieces.append(Piece(x, y0, gap[2], y0, res.stored))
                pieces.append(Piece(gap[2], y0, gap[3], y1, res.stored))
                x = gap[3]
                if step == len(chain) - 2:
                    for level, _ in self.load_plan(k):
                        pieces.append(Piece(x, y1, x + 2 + MARK_W / 2, y1, pieces[-1].level))
                        x += 2 + MARK_W / 2
                        x_next = x + self.load_step_width(k, level) - 2 - MARK_W / 2
                        pieces.append(Piece(x, y1, x_next, y1, level))
                        x = x_next
                    pieces.append(Piece(x, y1, gap[4], y1, res.consumed or res.stored))
                else:
                    pieces.append(Piece(x, y1, gap[4], y1, res.stored))
                    zone = zones[first + step + 1]
                    pieces.append(Piece(zone[0], y1, zone[1], y1, res.stored))
            if dst_box is not None:
                y_end = c.in_y(k, len(chain) - 1) + dy
                x_end = self.box_left(dst_item, y_end)
                pieces.append(Piece(zones[c.layer[dst_box.id]][0], y_end, x_end, y_end, res.consumed))
            out.runs.append(Run(axis, tuple(p for p in pieces if p.x1 > p.x0 + 1e-6)))
        self.markers(k, gaps)

    def load_step_width(self, k: int, level: str) -> float:
        texts = dict(self.load_plan(k))[level]
        return MARK_W + 4 + (max(text_width(t, AXIS_FONT) for t in texts) + 10 if texts else 0.0)

    def markers(self, k: int, gaps: Sequence[tuple[float, ...]]) -> None:
        """The save and load markers of edge ``k``, the labels after its loads, its fork dots."""
        c, g, res, out = self.c, self.g, self.res[k], self.out
        edge, axes = g.edges[k], g.axes(g.edges[k].src)
        first, chain = c.layer[edge.src.node], c.chain[k]
        height = bundle_height(axes)
        if edge == g.consumers(edge.src)[0]:
            y = c.out_y(k, 0)
            for j in range(len(res.up) - 1):
                out.markers.append(Marker("save", gaps[first][0] + 2 + j * (MARK_W + 4), y - 6, y + height + 6))
        y_in = c.in_y(k, len(chain) - 1)
        x = gaps[first + len(chain) - 2][3]
        for level, texts in self.load_plan(k):
            out.markers.append(Marker("load", x + 2, y_in - 6, y_in + height + 6))
            for i, text in enumerate(texts or ()):
                out.labels.append(Label(x + MARK_W + 8, y_in + i * WIRE_GAP - 4, text, "start", level, "axis"))
            x += self.load_step_width(k, level)
        if len(g.consumers(edge.src)) > 1 and edge == g.consumers(edge.src)[0]:
            for i in range(max(len(axes), 1)):
                out.forks.append((gaps[first][2], c.out_y(k, 0) + i * WIRE_GAP))

    def box_geometry(self, item: Item) -> tuple[float, float]:
        assert item.node is not None
        zone = self.out.columns[self.c.layer[item.node.id]]
        w = self.box_width(item.node)
        return (zone[0] + zone[1] - w) / 2, w

    def box_right(self, item: Item) -> float:
        x, w = self.box_geometry(item)
        return x + w

    def box_left(self, item: Item, y: float) -> float:
        """Where a wire at height ``y`` meets the box: its left edge, or the triangle's side."""
        x, w = self.box_geometry(item)
        assert item.node is not None
        if item.node.shape != "triangle":
            return x
        x0, y0, y1 = triangle(PlacedBox(item.node, x, item.y, w, item.height, None))
        half = (y1 - y0) / 2
        return x0 + (x + w - x0) * abs(y - (y0 + half)) / half

    def box(self, item: Item, node: Node, zone: tuple[float, float]) -> None:
        """The box and the wires woven over it (drawn above it: weaving)."""
        x, w = self.box_geometry(item)
        level = self.decor.box_level(node)
        self.out.boxes.append(PlacedBox(node, x, item.y, w, item.height, level))
        in_axes = [self.g.axes(p) for p in node.inputs]
        passing = node.passing(in_axes)
        for slot, axes in enumerate(in_axes):
            for i, axis in enumerate(axes):
                if axis not in passing:
                    continue
                y0 = item.y + item.in_off[slot] + i * WIRE_GAP
                for o, out_axes in enumerate(node.outputs):
                    if axis in out_axes:
                        y1 = item.y + item.out_off[o] + out_axes.index(axis) * WIRE_GAP
                        self.out.runs.append(Run(axis, (Piece(x, y0, x + w, y1, level),), over=True))
