"""A scheduled diagram as a loop nest: the shared (untrusted) analysis for cost, lowering,
pseudocode and the schedule interpreter.

``flatten`` turns a diagram into SSA nodes, one per box, with diagrams used as boxes
inlined by the kernel's own inliner (``ops.inlined``: their woven axes added to every inner
box's type).  ``loop_nest`` then reads a
``Schedule``: group partitions become parallel loops (a grid), stream partitions become
sequential loops (a split's blocks too: each a program's partial state, combined in order; the
interpreter runs them so, cost and lowering read ``Schedule.split``), and every node is placed
relative to each stream, split or scan loop (paper R4/R5; a scan's scan boxes are ``chunk`` nodes
that carry their last value to the next chunk):

- ``before``: does not depend on the streamed axis; computed once per group (hoisted);
- ``chunk``: carries the streamed axis; computed per chunk (woven through the stream);
- ``accumulate``: consumes the streamed axis; its state is updated per chunk;
- ``after``: reads a consumed value; sees only the accumulator's final value.

The kernel decides whether a schedule is admissible; this module assumes it is and only
describes how it runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from napkin_cat import ops
from napkin_cat.terms import Apply, Axes, Box, Const, Diagram, Expr, Param, Partition, Schedule, Size, Var

__all__ = ["Loop", "LoopNest", "Node", "flatten", "loop_nest", "touches", "woven_axes"]


@dataclass(frozen=True)
class Node:
    """One box in SSA form: ``name = expr`` where every argument of ``expr`` is a Var.

    ``axes`` is the node's full type, woven axes of inlined diagrams included.
    """

    name: str
    expr: Expr
    axes: Axes

    @property
    def reads(self) -> tuple[str, ...]:
        args = self.expr.args if isinstance(self.expr, (Box, Apply)) else ()
        return tuple(a.name for a in args if isinstance(a, Var))


@dataclass(frozen=True)
class Flat:
    """A diagram as SSA nodes: inputs (name, axes), nodes in order, output names; ``params`` the
    diagram's inputs as declared (an array a chain's earlier kernel wrote carries how it was
    computed: ``terms.Param.written``)."""

    inputs: tuple[tuple[str, Axes], ...]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]
    sizes: tuple[tuple[str, int | None], ...]
    params: tuple[Param, ...] = ()

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def type_of(self, name: str) -> Axes:
        for inp, axes in self.inputs:
            if inp == name:
                return axes
        return self.node(name).axes


def flatten(diagram: Diagram) -> Flat:
    """SSA nodes for every box; let names are kept, inner boxes get ``t.k`` names.

    Diagrams used as boxes are inlined first, as the kernel's ``unfold`` does (``ops.inlined``:
    each inner box retyped to carry the axes its call is woven over); an alias let (``B = A``)
    or a scalar let adds no node.  Constants and sizes stay inline as arguments (scalars need
    no storage); an output that is not an array node gets a copy node so every output has a
    name.
    """
    diagram = ops.inlined(diagram)
    nodes: list[Node] = []
    counter = [0]

    def fresh(prefix: str) -> str:
        counter[0] += 1
        return f"{prefix}.{counter[0]}"

    def emit(expr: Expr, env: dict[str, Expr], name: str | None) -> Expr:
        """An argument expression (Var/Const/Size) for ``expr``."""
        if isinstance(expr, Var):
            return env[expr.name]
        if isinstance(expr, (Const, Size)):
            return expr
        assert isinstance(expr, Box), "calls are inlined"
        box = replace(expr, args=tuple(emit(a, env, None) for a in expr.args))
        node = Node(name or fresh("t"), box, expr.axes)
        nodes.append(node)
        return Var(node.name, node.axes)

    env: dict[str, Expr] = {p.name: Var(p.name, p.axes) for p in diagram.inputs}
    for let in diagram.body:
        (name,) = let.names  # inlining leaves one name per let
        env[name] = emit(let.expr, env, name)
    out_names = []
    for out in diagram.outputs:
        value = emit(out, env, None)
        if not isinstance(value, Var):  # a constant or a size (an alias of one too): copied from its value
            copy = Var(fresh("out"), out.axes)
            nodes.append(Node(copy.name, Box("mul", (value, Const(1.0)), out.axes), out.axes))
            value = copy
        out_names.append(value.name)
    inputs = tuple((p.name, p.axes) for p in diagram.inputs)
    return Flat(inputs, tuple(nodes), tuple(out_names), tuple((a.name, a.size) for a in diagram.axes), diagram.inputs)


@dataclass(frozen=True)
class Loop:
    """One partition as a loop: ``trips = ceil(size / tile)`` iterations."""

    partition: Partition

    @property
    def axis(self) -> str:
        return self.partition.axis

    @property
    def kind(self) -> str:
        return self.partition.kind

    @property
    def folds(self) -> bool:
        """A sequential fold of its axis into accumulator states: a stream, a split (whose
        blocks' states the combine step folds in order), or a scan (chunks in order, its
        scan boxes' carried values the state; no box consumes the axis)."""
        return self.kind in ("stream", "split", "scan")

    @property
    def tile(self) -> str | int:
        return self.partition.tile

    @property
    def level(self) -> str:
        return self.partition.level


@dataclass(frozen=True)
class LoopNest:
    """A flattened diagram with its loops and each node's phase per stream loop."""

    flat: Flat
    loops: tuple[Loop, ...]
    #: per stream loop index (into ``loops``): node name -> before|chunk|accumulate|after
    phases: tuple[tuple[int, tuple[tuple[str, str], ...]], ...]
    placements: tuple[tuple[str, str], ...]

    @property
    def groups(self) -> tuple[Loop, ...]:
        return tuple(lp for lp in self.loops if lp.kind == "group")

    @property
    def streams(self) -> tuple[Loop, ...]:
        return tuple(lp for lp in self.loops if lp.folds)

    def phase(self, loop: Loop, name: str) -> str:
        index = self.loops.index(loop)
        for i, table in self.phases:
            if i == index:
                return dict(table)[name]
        raise KeyError(loop)

    def consumers(self, loop: Loop) -> tuple[Node, ...]:
        """The nodes that consume the loop's axis (each needs an accumulator)."""
        return tuple(n for n in self.flat.nodes if self.phase(loop, n.name) == "accumulate")

    def level_of(self, name: str) -> str:
        """Where an array lives: its placement, else hbm for inputs/outputs, else the
        innermost partition level (intermediates of a fused region stay on chip)."""
        for array, level in self.placements:
            if array == name:
                return level
        if name in self.flat.outputs or any(name == i for i, _ in self.flat.inputs):
            return "hbm"
        return self.loops[-1].level if self.loops else "hbm"

    def tile_axes(self, axes: Axes, sizes: Mapping[str, object]) -> dict[str, object]:
        """The extent of each axis inside the innermost tile (tile size if partitioned)."""
        out: dict[str, object] = {}
        for axis in axes:
            extent = sizes.get(axis, axis)
            for lp in self.loops:
                if lp.axis == axis:
                    extent = lp.tile
            out[axis] = extent
        return out


def touches(node: Node, axis: str) -> str:
    """How a node treats an axis: weaves | positional | its op's kind (reduce, normalise, ...)."""
    expr = node.expr
    if not isinstance(expr, Box) or axis not in expr.target + expr.out:
        return "weaves"
    return "positional" if expr.op in ops.POSITIONAL else ops.OPS[expr.op].kind


def woven_axes(flat: Flat, partitioned: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The axes not in ``partitioned`` that are on every output and only ever woven or read
    positionally (batch and heads woven through the whole diagram).  A Pallas kernel puts
    them on its grid one position per program, as ``group AXIS by 1`` would (R3 admits it)."""
    out_types = [flat.type_of(o) for o in flat.outputs]
    if not out_types:
        return ()
    return tuple(a for a in out_types[0] if a not in partitioned and all(a in t for t in out_types)
                 and all(touches(n, a) in ("weaves", "positional") for n in flat.nodes))


def loop_nest(diagram: Diagram, schedule: Schedule) -> LoopNest:
    """The loop nest of a (checked) schedule over ``diagram``; loops outermost first."""
    flat = flatten(diagram)
    loops = tuple(Loop(p) for p in schedule.partitions)
    phases = []
    for index, lp in enumerate(loops):
        if lp.folds:
            phases.append((index, tuple(_phases(flat, lp.axis).items())))
    placements = tuple((name, p.level) for p in schedule.placements for name in p.names)
    return LoopNest(flat, loops, tuple(phases), placements)


def _phases(flat: Flat, axis: str) -> dict[str, str]:
    phase: dict[str, str] = {name: ("chunk" if axis in axes else "before") for name, axes in flat.inputs}
    for node in flat.nodes:
        reads = [phase.get(r, "before") for r in node.reads]
        expr = node.expr
        consuming = isinstance(expr, Box) and ops.is_consuming(expr.op) and axis in expr.target
        if any(r in ("accumulate", "after") for r in reads):
            phase[node.name] = "after"
        elif consuming:
            phase[node.name] = "accumulate"
        elif axis in node.axes or "chunk" in reads:
            phase[node.name] = "chunk"
        else:
            phase[node.name] = "before"
    return phase


def trips(size: int, tile: int) -> int:
    """Iterations of a loop over ``size`` in tiles of ``tile`` (the last may be ragged)."""
    return math.ceil(size / tile)
