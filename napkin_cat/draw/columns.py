"""The vertical half of the layout: columns of a box-and-wire graph and where each item sits.

Each box sits in the column of its topological depth (inputs in the first column,
outputs in the last, a box without inputs just before its first use); an edge that
skips columns occupies a slot in each column it passes (horizontal placement is sequential
composition in a neural circuit diagram).  Each column is a tuple of arrays stacked top to
bottom, separated by dashed lines.

Nothing is placed by hand: the items of each column are ordered by the barycentre of
their neighbours (fewer crossings), then placed as close to their neighbours' ports as
possible without overlapping, which is an isotonic regression per column
(pool-adjacent-violators), swept left to right and back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from napkin_cat.draw.graph import Graph, Node, Port
from napkin_cat.terms import Axes

__all__ = ["HEAD", "PAD", "WIRE_GAP", "Columns", "Item", "bundle_height", "depths"]

WIRE_GAP = 16.0  # between the wires of one array
ITEM_GAP = 30.0  # between arrays or boxes in one column (room for a label above a wire)
PORT_GAP = 18.0  # between the arrays entering (or leaving) one box
HEAD = 22.0  # the band at the top of a box that holds its label
PAD = 9.0  # box padding around its ports


def bundle_height(axes: Axes) -> float:
    """From the first wire to the last; a scalar is drawn as one wire."""
    return (max(len(axes), 1) - 1) * WIRE_GAP


@dataclass
class Item:
    """Something occupying vertical space in one column: a node, or an edge passing through."""

    node: Node | None
    edge: int | None
    height: float
    in_off: list[float]
    out_off: list[float]
    y: float = 0.0


def depths[K](reads: Mapping[K, Sequence[K]], sources: Iterable[K]) -> dict[K, int]:
    """The column of each node: sources 0, a node 1 + its deepest read, and a node that
    reads nothing just before its first reader.  ``reads`` is in topological order.

    The one rule for columns, shared by the picture and the cost rows under it.
    """
    depth = dict.fromkeys(sources, 0)
    for node, rs in reads.items():
        depth[node] = 1 + max((depth[r] for r in rs), default=0)
    for node in reversed(list(reads)):
        if not reads[node]:
            depth[node] = min((depth[n] for n, rs in reads.items() if node in rs), default=depth[node] + 1) - 1
    return depth


def _layers(graph: Graph) -> list[int]:
    boxes = {n.id: [p.node for p in n.inputs] for n in graph.nodes if n.kind == "box"}
    depth = depths(boxes, (n.id for n in graph.nodes if n.kind == "input"))
    last = 1 + max((depth[b] for b in boxes), default=0)
    for node in graph.nodes:
        if node.kind == "output":
            depth[node.id] = last
    for node in graph.nodes:  # a box read only by outputs sits just before them
        if node.kind == "box" and not node.inputs and all(e.dst not in boxes for e in graph.consumers(Port(node.id))):
            depth[node.id] = last - 1
    return [depth[n.id] for n in graph.nodes]


def _stack(axes_list: Sequence[Axes]) -> tuple[list[float], float]:
    offsets, y = [], 0.0
    for axes in axes_list:
        offsets.append(y)
        y += bundle_height(axes) + PORT_GAP
    return offsets, max(y - PORT_GAP, 0.0)


def _node_item(graph: Graph, node: Node) -> Item:
    if node.kind == "input":
        return Item(node, None, bundle_height(node.outputs[0]), [], [0.0])
    if node.kind == "output":
        return Item(node, None, bundle_height(graph.axes(node.inputs[0])), [0.0], [])
    ins, in_h = _stack([graph.axes(p) for p in node.inputs])
    outs, out_h = _stack(node.outputs)
    inner = max(in_h, out_h)
    top = HEAD + PAD
    return Item(node, None, top + inner + PAD,
                 [top + (inner - in_h) / 2 + o for o in ins], [top + (inner - out_h) / 2 + o for o in outs])


def _isotonic(desired: list[float], weights: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``desired`` in weighted least squares."""
    blocks: list[list[float]] = []  # [value, weight, count]
    for d, w in zip(desired, weights, strict=True):
        blocks.append([d, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [v for v, _, n in blocks for _ in range(int(n))]


def _place_column(items: list[Item], desired: list[float | None]) -> None:
    """Move items towards ``desired`` tops keeping their order and ``ITEM_GAP`` apart."""
    offsets, c = [], 0.0
    for item in items:
        offsets.append(c)
        c += item.height + ITEM_GAP
    targets = [(d if d is not None else item.y) - off for item, d, off in zip(items, desired, offsets, strict=True)]
    weights = [1.0 if d is not None else 0.05 for d in desired]
    for item, z, off in zip(items, _isotonic(targets, weights), offsets, strict=True):
        item.y = z + off


class Columns:
    """The items of each column and the hops of each edge between consecutive columns."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.layer = _layers(graph)
        self.n = max(self.layer) + 1
        self.cols: list[list[Item]] = [[] for _ in range(self.n)]
        self.item_of: dict[int, Item] = {}
        for node in graph.nodes:
            item = _node_item(graph, node)
            self.item_of[node.id] = item
            self.cols[self.layer[node.id]].append(item)
        #: per edge, the items it passes from its source to its destination
        self.chain: list[list[Item]] = []
        for k, edge in enumerate(graph.edges):
            chain = [self.item_of[edge.src.node]]
            h = bundle_height(graph.axes(edge.src))
            for col in range(self.layer[edge.src.node] + 1, self.layer[edge.dst]):
                dummy = Item(None, k, h, [0.0], [0.0])
                self.cols[col].append(dummy)
                chain.append(dummy)
            chain.append(self.item_of[edge.dst])
            self.chain.append(chain)
        for column in self.cols:
            _place_column(column, [None] * len(column))

    def out_y(self, k: int, step: int) -> float:
        """The top wire of edge ``k`` leaving the ``step``-th item of its chain."""
        item = self.chain[k][step]
        return item.y + (item.out_off[self.graph.edges[k].src.index] if item.node else 0.0)

    def in_y(self, k: int, step: int) -> float:
        item = self.chain[k][step]
        return item.y + (item.in_off[self.graph.edges[k].slot] if item.node else 0.0)

    def hops(self, col: int) -> list[tuple[int, int]]:
        """(edge, step) for every edge leaving column ``col`` at that step of its chain."""
        out = []
        for k, chain in enumerate(self.chain):
            step = col - self.layer[self.graph.edges[k].src.node]
            if 0 <= step < len(chain) - 1:
                out.append((k, step))
        return out

    def neighbours(self, col: int, forward: bool) -> dict[int, list[float]]:
        """For each item of ``col`` (by id), where its neighbours want its top to be."""
        want: dict[int, list[float]] = {}
        for k, step in self.hops(col - 1 if forward else col):
            a, b = self.chain[k][step], self.chain[k][step + 1]
            if forward:
                want.setdefault(id(b), []).append(self.out_y(k, step) - (self.in_y(k, step + 1) - b.y))
            else:
                want.setdefault(id(a), []).append(self.in_y(k, step + 1) - (self.out_y(k, step) - a.y))
        return want

    def arrange(self, sweeps: int = 6) -> None:
        for _ in range(3):  # order by barycentre, keeping inputs and outputs in declared order
            for col in range(1, self.n - 1):
                want = self.neighbours(col, True)
                self.cols[col].sort(key=lambda it: _mean(want.get(id(it))) or it.y)
                _place_column(self.cols[col], [None] * len(self.cols[col]))
        for _ in range(sweeps):
            for cols, forward in ((range(1, self.n), True), (range(self.n - 2, -1, -1), False)):
                for col in cols:
                    want = self.neighbours(col, forward)
                    _place_column(self.cols[col], [_mean(want.get(id(it))) for it in self.cols[col]])
        top = min(it.y for column in self.cols for it in column)
        for column in self.cols:
            for it in column:
                it.y -= top


def _mean(values: list[float] | None) -> float | None:
    return sum(values) / len(values) if values else None
