"""A numpy interpreter of a checked schedule: loops over groups and chunks as a kernel would.

This is the end-to-end check of the kernel's side conditions (numerically, at random sizes): a
theorem's schedule is run literally, tile by tile, and compared with the plain evaluator
on the same inputs.  A side condition the kernel forgot shows up as a mismatch.

Execution follows ``loopnest`` (loops outermost first, each node's phase per stream):
- a **group** loop runs the nodes once per tile of its axis, each tile seeing only its
  slice (and its offset, for index-dependent boxes); results are written back into their
  slice.  With ``pad`` a ragged last tile is padded with zeros to the full tile size and
  the padded positions are dropped when written back (a masked store);
- a **stream** loop runs the ``before`` nodes once, then per chunk the ``chunk`` nodes and,
  for each consumer, the accumulator's ``lift`` of the chunk folded into the running
  state with ``combine`` (from ``identity``); after the last chunk, ``final`` gives the
  consumer's value and the ``after`` nodes run.  With ``pad`` a ragged chunk is padded
  and the consumers' operands are masked with the accumulator's padding values.
  A stream nested inside a stream of the same axis (R8) returns its state, not its final
  value, to the enclosing stream, which combines it;
- a **split** loop runs as a stream loop: each block is folded from the identity (by the
  nested stream, or lifted whole), as its own program would, and the blocks' partial states
  are merged in order with ``combine`` before ``final`` (the combine step of ``kernel.split``).
``Size`` always means the whole axis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Union

import numpy as np

from napkin_cat import ops
from napkin_cat.certify import accumulators as acc
from napkin_cat.evaluate import Named, bind_sizes, evaluate_named, union_axes
from napkin_cat.kernel import Theorem
from napkin_cat.schedule.layout import broken_nesting
from napkin_cat.schedule.loopnest import Loop, LoopNest, Node, loop_nest
from napkin_cat.terms import Box, Const, Diagram, Expr, Param, Size, Var

__all__ = ["run_schedule"]

State = tuple[Named, ...]
Value = Union[Named, State]


@dataclass(frozen=True)
class _Tile:
    """Where the current tile sits: extents, offsets, valid (unpadded) lengths, whole sizes."""

    extents: dict[str, int]
    offsets: dict[str, int]
    valid: dict[str, int]
    full: dict[str, int]
    partial: frozenset[str] = field(default=frozenset())

    def enter(self, axis: str, start: int, extent: int, valid: int) -> _Tile:
        return _Tile(self.extents | {axis: extent}, self.offsets | {axis: self.offsets.get(axis, 0) + start},
                     self.valid | {axis: valid}, self.full, self.partial)


def run_schedule(theorem: Theorem, arrays: Sequence[Any], sizes: Mapping[str, int] | None = None,
                 tiles: Mapping[str, int] | None = None) -> tuple[Any, ...]:
    """Run ``theorem.result`` under ``theorem.schedule`` on float64 arrays (declared input order).

    ``tiles`` gives a value to every symbolic tile size; ``sizes`` to axes no input carries.
    Returns one array per output, in the declared axis order.  A chain runs its kernels in order,
    each on the inputs and the arrays the kernels before it wrote.
    """
    if theorem.kernels:
        return _run_chain(theorem, arrays, sizes, tiles)
    diagram = theorem.result
    data = [np.asarray(a, dtype=np.float64) for a in arrays]
    full = bind_sizes(diagram, [d.shape for d in data], sizes)
    partitions = []
    for p in theorem.schedule.partitions:
        if isinstance(p.tile, str):
            if p.tile not in (tiles or {}):
                raise ValueError(f"tile `{p.tile}` of axis `{p.axis}` is symbolic: give it in tiles=")
            p = replace(p, tile=int((tiles or {})[p.tile]))
        partitions.append(p)
    if broken := broken_nesting(theorem.constraints, theorem.schedule.partitions, [int(p.tile) for p in partitions]):
        raise ValueError(f"tiles break `{theorem.name}`'s assumption `{broken[0]}`: {broken[1]} does not divide "
                         f"{broken[2]} (R9); the theorem claims nothing at these tiles")
    nest = loop_nest(diagram, replace(theorem.schedule, partitions=tuple(partitions)))
    env: dict[str, Value] = {p.name: Named(p.axes, d) for p, d in zip(diagram.inputs, data, strict=True)}
    tile = _Tile(dict(full), {}, dict(full), dict(full))
    values = _Runner(theorem, nest).run(list(nest.flat.nodes), list(nest.loops), env, tile)
    outs = []
    for name, axes in zip(nest.flat.outputs, diagram.out_types, strict=True):
        value = values.get(name, env.get(name))
        assert isinstance(value, Named)
        outs.append(value.to(axes))
    return tuple(outs)


def _run_chain(theorem: Theorem, arrays: Sequence[Any], sizes: Mapping[str, int] | None,
               tiles: Mapping[str, int] | None) -> tuple[Any, ...]:
    """A chain's kernels in order, each on the inputs and the arrays written before it.  The chain's sizes
    come from all its inputs (and ``sizes``), so a kernel that reads no array along an axis it uses
    (``onehot[v](L)`` in a first kernel, the table along v read by a later one) gets that size from them."""
    whole = bind_sizes(theorem.result, [np.shape(a) for a in arrays], sizes)
    written = dict(zip((p.name for p in theorem.result.inputs), arrays, strict=True))
    outs: tuple[Any, ...] = ()
    for kernel, writes in zip(theorem.kernels, theorem.writes, strict=True):
        carried = {a for p in kernel.result.inputs for a in p.axes}
        given = {a.name: whole[a.name] for a in kernel.result.axes if a.name not in carried and a.name in whole}
        outs = run_schedule(kernel, [written[p.name] for p in kernel.result.inputs], given, tiles)
        if writes != ("return",):  # the last kernel's outputs are the chain's, however many
            written.update(zip(writes, outs, strict=True))
    return outs


class _Runner:
    def __init__(self, theorem: Theorem, nest: LoopNest):
        self.theorem = theorem
        self.nest = nest

    def run(self, nodes: list[Node], loops: list[Loop], env: dict[str, Value], tile: _Tile) -> dict[str, Value]:
        if not nodes:
            return {}
        if not loops:
            out: dict[str, Value] = {}
            for node in nodes:
                out[node.name] = self.node(node, env | out, tile)
            return out
        loop, inner = loops[0], loops[1:]
        tile_size = loop.tile
        if not isinstance(tile_size, int):
            raise ValueError(f"tile `{tile_size}` of axis `{loop.axis}` is symbolic; substitute an integer")
        if loop.kind == "group":
            return self.group(loop, tile_size, nodes, inner, env, tile)
        if loop.kind == "scan":
            return self.scan(loop, tile_size, nodes, inner, env, tile)
        return self.stream(loop, tile_size, nodes, inner, env, tile)

    def tiles(self, loop: Loop, size: int, tile: _Tile) -> list[tuple[int, int, int]]:
        """(start, extent, valid) per tile along the loop's axis in the current tile."""
        n = tile.extents[loop.axis]
        out = []
        for start in range(0, n, size):
            valid = min(start + size, n, tile.valid[loop.axis]) - start
            out.append((start, size if loop.partition.pad else min(size, n - start), max(valid, 0)))
        return out

    def slice_env(self, env: Mapping[str, Value], axis: str, start: int, extent: int) -> dict[str, Value]:
        def cut(v: Named) -> Named:
            part = acc.chunk(v, axis, start, start + extent)
            return acc.padded(part, axis, extent, 0.0)

        return {k: (cut(v) if isinstance(v, Named) else tuple(cut(s) for s in v)) for k, v in env.items()}

    def group(self, loop: Loop, size: int, nodes: list[Node], inner: list[Loop], env: dict[str, Value],
              tile: _Tile) -> dict[str, Value]:
        pieces: list[tuple[int, dict[str, Value]]] = []
        for start, extent, valid in self.tiles(loop, size, tile):
            sub = self.run(nodes, inner, self.slice_env(env, loop.axis, start, extent),
                           tile.enter(loop.axis, start, extent, valid))
            pieces.append((valid, sub))
        return {name: _join([(v, p[name]) for v, p in pieces], loop.axis) for name in pieces[0][1]}

    def scan(self, loop: Loop, size: int, nodes: list[Node], inner: list[Loop], env: dict[str, Value],
             tile: _Tile) -> dict[str, Value]:
        """A group loop whose tiles run in order: each scan node along the axis starts a chunk from
        its value at the last real position before it, passed in as ``NAME@carry`` (``kernel.group``)."""
        axis = loop.axis
        scans = [n.name for n in nodes if isinstance(n.expr, Box) and ops.scans_along(n.expr, axis)]
        carries: dict[str, Value] = {}
        pieces: list[tuple[int, dict[str, Value]]] = []
        for start, extent, valid in self.tiles(loop, size, tile):
            sub = self.run(nodes, inner, self.slice_env(env | carries, axis, start, extent),
                           tile.enter(axis, start, extent, valid))
            pieces.append((valid, sub))
            if valid:
                carries = {f"{n}{CARRY}": _at(sub[n], axis, valid - 1) for n in scans}
        return {name: _join([(v, p[name]) for v, p in pieces], loop.axis) for name in pieces[0][1]}

    def stream(self, loop: Loop, size: int, nodes: list[Node], inner: list[Loop], env: dict[str, Value],
               tile: _Tile) -> dict[str, Value]:
        axis = loop.axis
        phase = {n.name: self.nest.phase(loop, n.name) for n in nodes}
        values = self.run([n for n in nodes if phase[n.name] == "before"], inner, env, tile)
        consumers = [n for n in nodes if phase[n.name] == "accumulate"]
        plans = {n.name: self.plan(n, axis) for n in consumers}
        states: dict[str, State] = {n: tuple(Named((), np.float64(v)) for v in p.identity) for n, p in plans.items()}
        body = [n for n in nodes if phase[n.name] in ("chunk", "accumulate")]
        partial = tile.partial | {axis}
        pieces: list[tuple[int, dict[str, Value]]] = []
        for start, extent, valid in self.tiles(loop, size, tile):
            sub_tile = tile.enter(axis, start, extent, valid)
            sub_tile = _Tile(sub_tile.extents, sub_tile.offsets, sub_tile.valid, sub_tile.full, partial)
            chunk = self.run(body, inner, self.slice_env(env | values, axis, start, extent), sub_tile)
            pieces.append((valid, {n: v for n, v in chunk.items() if phase[n] == "chunk"}))
            for name, p in plans.items():
                lifted = chunk[name]
                assert isinstance(lifted, tuple)
                states[name] = evaluate_named(p.combine, states[name] + lifted, dict(tile.full))
        for name in pieces[0][1] if pieces else ():  # chunk values (outputs among them) written back
            values[name] = _join([(v, p[name]) for v, p in pieces], axis)
        targets = {n.name: n.expr.target for n in consumers if isinstance(n.expr, Box)}
        for name, p in plans.items():
            if tile.partial & set(targets[name]):
                values[name] = states[name]  # an enclosing stream (this axis at an outer level, or another
                # axis the box consumes) combines it
            else:
                values[name] = evaluate_named(p.final, states[name], dict(tile.full))[0]
        after = [n for n in nodes if phase[n.name] == "after"]
        values.update(self.run(after, inner, env | values, tile))
        return values

    def plan(self, node: Node, axis: str) -> acc.AccumulatorPlan:
        box = node.expr
        assert isinstance(box, Box)
        return acc.plan(box, axis, self.theorem.chosen.get((axis, box.op, box.target, box.params)))

    def node(self, node: Node, env: Mapping[str, Value], tile: _Tile) -> Value:
        box = node.expr
        streamed = [a for a in tile.partial if isinstance(box, Box) and ops.is_consuming(box.op) and a in box.target]
        if streamed:  # a consumer inside a chunk: its accumulator's lift, operands masked
            p = self.plan(node, streamed[0])  # one accumulator per box across its streams (the kernel's rule)
            operands = [self.operand(a, env, tile) for a in box.args]  # type: ignore[union-attr]
            for axis in (a for a in streamed if tile.valid[a] < tile.extents[a]):
                assert p.pad is not None, "the kernel refuses padding without a padding law"
                operands = [_mask(x, axis, tile.valid[axis], fill) for x, fill in zip(operands, p.pad, strict=True)]
            return evaluate_named(p.lift, operands, dict(tile.extents), offsets=tile.offsets, full_sizes=tile.full)
        reads = list(dict.fromkeys(a.name for a in _args(box) if isinstance(a, Var)))
        inputs = [env[r] for r in reads]
        if (carry := env.get(f"{node.name}{CARRY}")) is not None:  # a scan's chunk after the first
            assert isinstance(box, Box) and isinstance(carry, Named)
            operands = [self.operand(a, env, tile) for a in box.args]
            operands[-1] = _started(box, operands, carry)
            reads, inputs = [f"X{k}" for k in range(len(operands))], list(operands)
            box = replace(box, args=tuple(Var(r, v.axes) for r, v in zip(reads, operands, strict=True)))
        params = tuple(Param(r, _axes(v)) for r, v in zip(reads, inputs, strict=True))
        single = Diagram(node.name, params, (), (box,), (node.axes,), ())
        (value,) = evaluate_named(single, inputs, dict(tile.extents),  # type: ignore[arg-type]
                                  offsets=tile.offsets, full_sizes=tile.full)
        return value

    def operand(self, expr: Expr, env: Mapping[str, Value], tile: _Tile) -> Named:
        if isinstance(expr, Var):
            value = env[expr.name]
            assert isinstance(value, Named)
            return value
        if isinstance(expr, Const):
            return Named((), np.float64(expr.value))
        assert isinstance(expr, Size), expr
        return Named((), np.float64(tile.full[expr.axis]))


#: the suffix of a scan node's carried state in the environment of its chunks (no binding name has one)
CARRY = "@carry"


def _at(value: Value, axis: str, position: int) -> Named:
    """``value`` at one position along ``axis``, the axis dropped."""
    assert isinstance(value, Named)
    index: list[slice | int] = [slice(None)] * len(value.axes)
    index[value.axes.index(axis)] = position
    return Named(tuple(a for a in value.axes if a != axis), value.data[tuple(index)])


def _started(box: Box, operands: list[Named], carry: Named) -> Named:
    """A scan's X started from ``carry`` (its value just before the chunk): X[first] + A[first]·carry
    (cumsum: X[first] + carry), by the recurrence's definition (``kernel.group``)."""
    (axis,) = box.target
    if box.op == "linrec":
        decay = _at(operands[0], axis, 0) if axis in operands[0].axes else operands[0]
        both = union_axes(decay.axes, carry.axes)
        carry = Named(both, decay.aligned(both) * carry.aligned(both))
    x = operands[-1]
    axes = union_axes(x.axes, carry.axes)
    data = np.array(np.broadcast_to(x.aligned(axes), np.broadcast_shapes(x.aligned(axes).shape,
                                                                          carry.aligned(axes).shape)))
    first = [slice(None)] * len(axes)
    first[axes.index(axis)] = slice(0, 1)
    data[tuple(first)] += carry.aligned(axes)
    return Named(axes, data)


def _args(expr: Expr) -> tuple[Expr, ...]:
    return expr.args if isinstance(expr, Box) else ()


def _axes(value: Value) -> tuple[str, ...]:
    assert isinstance(value, Named)
    return value.axes


def _mask(value: Named, axis: str, valid: int, fill: float) -> Named:
    if axis not in value.axes:
        return value
    data = np.array(value.data, dtype=np.float64, copy=True)
    index = [slice(None)] * data.ndim
    index[value.axes.index(axis)] = slice(valid, None)
    data[tuple(index)] = fill
    return Named(value.axes, data)


def _join(parts: list[tuple[int, Value]], axis: str) -> Value:
    """Tile results written back: concatenated along the axis (padding dropped), else the first."""
    first = parts[0][1]
    if isinstance(first, tuple):
        return tuple(_join([(v, p[i]) for v, p in parts], axis) for i in range(len(first)))  # type: ignore[misc,index]
    if axis not in first.axes:
        return first
    pos = first.axes.index(axis)
    pieces = []
    for valid, value in parts:
        assert isinstance(value, Named)
        data = value.to(first.axes)
        index = [slice(None)] * data.ndim
        index[pos] = slice(0, valid)
        pieces.append(data[tuple(index)])
    return Named(first.axes, np.concatenate(pieces, axis=pos))
