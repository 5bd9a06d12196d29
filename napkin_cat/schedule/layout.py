"""How a scheduled diagram maps onto a kernel: grid axes, the streamed axis, padding.

This reads ``loopnest.loop_nest`` (the one analysis of schedules) and decides, per axis,
where it lives in the emitted code:

- ``grid``: a group-partitioned axis (blocks of its tile), or, for Pallas, an axis woven
  through the whole diagram and present on every output (batch, heads: blocks of one,
  squeezed out of the kernel).  Grid programs run in parallel on a GPU (JAX Pallas docs:
  each program runs in parallel on its own threads), so a grid axis is never consumed or mixed;
- ``stream``: walked in chunks by an in-kernel loop whose carry holds accumulator states;
- ``whole``: every other axis, present in full inside the kernel.

A split (``split a by k``) is laid out as its programs' schedule (``Schedule.unsplit``), which
must stream ``a``, with ``split`` = (a, k): ``a`` is padded to whole blocks of k (masked like a
ragged tile), the plain-JAX target maps the blocks and combines their states (``lower.jax``),
the Pallas target gives each block a program of its own (``lower.pallas``).

It also refuses, with a diagnostic and before any code runs, what the targets cannot
serve: accumulation across a grid axis, several streamed axes, a value that needs the
whole streamed axis after the stream, padding with no neutral value, and (Pallas)
tiles that are not powers of two of at least 16 (the Triton backend's rule).

It holds the targets' facts that need no jax (``lower`` imports jax; ``search.derive`` screens
candidates with ``layout`` and prices them as ``realised_schedule`` says without it): which
targets there are, the schedule each one realises, the dtype it prices in, the hardware it
defaults to, its padded extents (``pow2_extent``) and fill values (``fill_values``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from napkin_cat import certify, ops
from napkin_cat.certify.accumulators import AccumulatorPlan, kernel_plan, plan
from napkin_cat.diagnostics import NapkinError, error
from napkin_cat.schedule.loopnest import Flat, LoopNest, Node, flatten, loop_nest, touches, woven_axes
from napkin_cat.terms import (
    INT_DTYPE,
    INTEGER_OUTPUT_DTYPE,
    Box,
    Diagram,
    Divides,
    Partition,
    Schedule,
    Size,
    integer_names,
)

__all__ = ["DEFAULT_HARDWARE", "FORMATS", "KERNEL_DTYPES", "KERNEL_TARGETS", "MIN_BLOCK", "MIX_FILL", "PRICED_DTYPE",
           "TARGETS", "TRITON_MISSING", "Layout", "broken_nesting", "fill_values", "grid_order", "integer_outputs",
           "layout", "padding_law", "pow2_extent", "realised_schedule"]

TARGETS = ("pallas", "mosaic", "jax")

#: the smallest block the Triton backend's dot accepts on every dimension (Triton's tl.dot needs >= 16)
MIN_BLOCK = 16

#: the targets that place a schedule onto a GPU kernel's grid, blocks and padding (Pallas's
#: Triton and Mosaic GPU backends); the plain-JAX target vectorises
KERNEL_TARGETS = ("pallas", "mosaic")

#: the number formats kernels are emitted in (``hardware.canonical_dtype`` names), as jax dtypes
KERNEL_DTYPES: dict[str, str] = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}

#: the hardware profile each target's default tiles and cost bound come from when none is
#: given: Pallas kernels are GPU kernels; the plain-JAX target is napkin's CPU path, priced on
#: the profile measured on this project's machine (``cost/hardware/cpu.toml``)
DEFAULT_HARDWARE: dict[str, str] = {"pallas": "h100", "mosaic": "h200", "jax": "cpu"}

#: the dtype a target's tiles are priced in where it fixes one: the plain-JAX target computes
#: every array in f32, its loaded chunks included, whatever its inputs' dtype
PRICED_DTYPE: dict[str, str] = {"jax": "f32"}

#: jnp dtype of each number format a ``dtype`` step may name (f64 needs jax_enable_x64: refused)
FORMATS: dict[str, str] = {"f32": "float32", "tf32": "float32", "bf16": "bfloat16", "f16": "float16",
                           "fp8e4m3": "float8_e4m3fn", "fp8e5m2": "float8_e5m2"}

#: boxes whose lowering needs a primitive the Pallas Triton backend lacks (measured by
#: cross-lowering every op, tests/test_crosslower.py)
TRITON_MISSING: dict[str, str] = {"prod": "reduce_prod"}


def pow2_extent(size: int, least: int = 16) -> int:
    """The power of two (at least ``least``) a whole axis is padded to (Triton's rule)."""
    return max(least, 1 << (size - 1).bit_length())


#: fill values of mixing boxes over padded positions (consuming boxes use their accumulator's)
MIX_FILL: dict[str, float] = {"softmax": -math.inf, "l2norm": 0.0, "rmsnorm": 0.0,
                              "argmax": -math.inf, "topk": -math.inf}  # padding ranks after every real entry


def fill_values(box: Box, axis: str) -> tuple[float, ...] | None:
    """Per operand, the value padded positions along ``axis`` must hold so that ``box``
    ignores them; None if there is none."""
    if box.op in MIX_FILL:
        return (MIX_FILL[box.op],)
    if not ops.is_consuming(box.op):
        return None
    try:
        return plan(box, axis).pad
    except ValueError:
        return None


def padding_law(box: Box, axis: str, via: str | None = None) -> str:
    """How the padding law of ``box`` along ``axis`` (``fill_values``: positions holding them change
    nothing) is certified: the kernel's oracle (``certify.accumulator`` with ``pad``) for the accumulators
    whose fills these are, ``via`` (the theorem's) first: ``proved: ...`` or ``tested: ...`` from the
    first that is; else ``not certified (...)`` with each one's answer, or ``not checked (...)`` for a
    mixing box (``MIX_FILL``: no accumulator states it).  A target that pads an axis the theorem
    does not (a tile that does not divide it, a whole axis raised to a power of two) rests on it."""
    fills = fill_values(box, axis)
    if fills is None:
        return "none: no fill leaves it unchanged"
    if box.op in MIX_FILL:
        return f"not checked (a kernel rule, MIX_FILL: {box.op} ignores entries of {fills[0]:g})"
    names = [n for n in dict.fromkeys([*([via] if via else []), *ops.accumulators_for(box.op, box.params)])
             if n in ops.accumulators_for(box.op, box.params) and plan(box, axis, n).pad == fills]
    answers = {n: certify.accumulator(box, axis, n, True) for n in names}
    found = next((f"{how.split(':')[0]} (accumulator {n}: {how})" for n, how in answers.items()
                  if how.startswith(("proved", "tested"))), None)
    return found or "not certified (" + ("; ".join(f"{n}: {how}" for n, how in answers.items()) or "none") + ")"


def integer_outputs(diagram: Diagram) -> frozenset[int]:
    """The outputs of ``diagram`` that hold integers (a position, an id, a ``floor``: ``ops.integer_valued``
    over ``terms.integer_names``).  Each is stored as ``INTEGER_OUTPUT_DTYPE`` whatever the kernel's dtype:
    the targets write it so (``Layout.output_dtype``) and the cost model prices it so (``cost``)."""
    integers = integer_names(diagram, ops.integer_valued)
    return frozenset(k for k, out in enumerate(diagram.outputs) if ops.integer_valued(out, integers))


@dataclass(frozen=True)
class Layout:
    """A scheduled diagram placed onto a kernel (see the module docstring).

    ``tiles`` maps every partitioned axis to its outermost tile (the block; inner levels are
    the compiler's tiling of it); ``grid`` lists the grid axes outermost first, ``squeezed``
    those among them with blocks of one; ``phase``
    gives each node's phase relative to the streamed axis (all ``before`` without one);
    ``plans`` the accumulator of every node that consumes the streamed axis;
    ``padded_tiles`` the grouped axes (Pallas) whose tile cannot be a Triton block (not a
    power of two, or below ``MIN_BLOCK`` where a dot needs it: ``_group_block_ok``):
    stored as (tiles, block) with each tile padded to a block;
    ``derived`` the sizes that reshapes determine (``_derive_sizes``); ``split`` the axis
    of a split and its block (``schedule`` keeps the split; ``nest`` is its programs').
    """

    name: str
    diagram: Diagram
    schedule: Schedule
    target: str
    nest: LoopNest
    tiles: Mapping[str, int]
    grid: tuple[str, ...]
    squeezed: frozenset[str]
    stream: str | None
    phase: Mapping[str, str]
    plans: Mapping[str, AccumulatorPlan]
    padded_tiles: frozenset[str] = frozenset()
    derived: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    split: tuple[str, int] | None = None
    #: the scan nodes along a scanned axis (``scan`` partition, walked as the stream): each chunk
    #: starts them from their carried value, the last of the chunk before (``fold.emit_step``)
    carried: tuple[str, ...] = ()

    @property
    def chunk_outputs(self) -> tuple[int, ...]:
        """Outputs that carry the streamed axis (no box consumes it on their way): each
        chunk of them is written as the stream passes: streaming an axis no box consumes is a
        sequential group partition."""
        if self.stream is None:
            return ()
        return tuple(k for k, t in enumerate(self.diagram.out_types) if self.stream in t)

    def stored_as(self, name: str) -> str | None:
        """The jnp dtype name a ``dtype`` step stores this array in (None: the kernel's); an
        integer input (declared ``int``) is ``INT_DTYPE`` whatever the kernel's dtype, and is
        computed on as such (``integer``); an integer-valued array an earlier kernel wrote is
        float32, as that kernel stored it (``output_dtype``)."""
        if self.integer(name):
            return INT_DTYPE
        if self.declared_integer(name):  # an integer-valued array a chain's kernel wrote (output_dtype)
            return INTEGER_OUTPUT_DTYPE
        for step in reversed(self.schedule.quantisations):
            if name in step.names:
                return FORMATS[step.dtype]
        return None

    def integer(self, name: str) -> bool:
        """Is ``name`` an input declared ``int`` (segment ids, lengths, page tables), stored and
        computed on as ``INT_DTYPE``?  Not an integer-valued array an earlier kernel of a chain
        wrote (``Param.written``): it holds what that kernel computed, in its arithmetic (f32 in
        a Pallas output), which may be ±inf or past int32 (``floor`` of a real); read as int32 it
        wrapped, so the reader takes it as a real (``declared_integer`` still admits the array)."""
        return any(p.name == name and p.integer and p.written is None for p in self.diagram.inputs)

    @cached_property
    def integer_outputs(self) -> frozenset[int]:
        """The integer-valued outputs (``integer_outputs``), found once per layout."""
        return integer_outputs(self.diagram)

    def output_dtype(self, k: int, dtype: str) -> str:
        """The jnp dtype name output ``k`` is stored in: ``INTEGER_OUTPUT_DTYPE`` for an integer-valued
        output (``integer_outputs``), ``dtype`` for the rest."""
        return INTEGER_OUTPUT_DTYPE if k in self.integer_outputs else dtype

    def declared_integer(self, name: str) -> bool:
        """Is ``name`` typed ``int`` (``integer``, or an integer-valued array an earlier kernel wrote)?"""
        return any(p.name == name and p.integer for p in self.diagram.inputs)

    def computed_as(self, name: str) -> str:
        """The jnp dtype name a kernel computes on an input in: ``INT_DTYPE`` for an integer
        input (exact at every id it can hold), float32 for the rest."""
        return INT_DTYPE if self.integer(name) else "float32"

    @property
    def ragged_split(self) -> bool:
        """Is the split's block no whole number of chunks (a padded stream inside it: every block's
        last chunk masked past the block's end)?"""
        return self.split is not None and self.split[1] % self.tiles[self.split[0]] != 0

    @property
    def flat(self) -> Flat:
        return self.nest.flat

    def declared(self, axis: str) -> int | None:
        return dict(self.flat.sizes).get(axis)

    def block(self, axis: str) -> int:
        """The in-kernel extent of a grouped or streamed axis (its tile, or padded tile)."""
        tile = self.tiles[axis]
        return pow2_extent(tile, MIN_BLOCK) if axis in self.padded_tiles else tile

    def kind(self, axis: str) -> str:
        """grid | stream | whole."""
        if axis in self.grid:
            return "grid"
        return "stream" if axis == self.stream else "whole"

    def may_pad(self, axis: str) -> bool:
        """Can the padded extent of this axis exceed its size (so consumers must mask)?"""
        if self.target not in KERNEL_TARGETS or axis in self.squeezed:
            return False
        size = self.declared(axis)
        if size is None:
            return True
        if self.split is not None and self.split[0] == axis:  # a ragged block's chunks pass its end
            return self.ragged_split or size % self.split[1] != 0
        if axis in self.tiles:
            return size % self.tiles[axis] != 0
        return size != pow2_extent(size, MIN_BLOCK)


def layout(name: str, diagram: Diagram, schedule: Schedule, tiles: Mapping[str, int], target: str,
           chosen: Mapping[tuple[str, str, tuple[str, ...], tuple[str, ...]], str] | None = None) -> Layout:
    """Place the schedule onto a ``target`` ("pallas", "mosaic" or "jax") kernel, or refuse.

    ``tiles`` binds every symbolic tile name of the schedule (and may override integers
    by axis name); the result's ``tiles`` is keyed by axis.  ``chosen`` names the accumulator
    the proof certified for each consuming box (``Theorem.chosen``); a box it does not name
    gets the stream's ``via``, else its first admissible one.
    """
    nest = loop_nest(diagram, schedule.unsplit())
    flat = nest.flat
    by_axis: dict[str, tuple[str, int]] = {}
    for loop in nest.loops:
        tile = _tile_value(loop.tile, loop.axis, tiles)
        if loop.axis in by_axis:
            # the outermost partition is the block (SMEM tile); inner (register) levels
            # are the compiler's own tiling of that block
            if by_axis[loop.axis][0] != loop.kind:
                raise NapkinError(error("lower.mixed_partition", axis=loop.axis))
            continue
        by_axis[loop.axis] = (loop.kind, tile)
    axis_tiles = {axis: tile for axis, (_, tile) in by_axis.items()}
    streams = [axis for axis, (kind, _) in by_axis.items() if kind in ("stream", "scan")]
    if len(streams) > 1:
        raise NapkinError(error("lower.streams", axes=", ".join(streams)))
    stream = streams[0] if streams else None
    groups = tuple(axis for axis, (kind, _) in by_axis.items() if kind == "group")
    if target in KERNEL_TARGETS and stream is not None and not _block_ok(axis_tiles[stream]):
        raise NapkinError(error("lower.tile_pow2", axis=stream, tile=axis_tiles[stream], least=MIN_BLOCK))
    out_types = list(diagram.out_types)
    for axis in groups:
        _check_grid_axis(flat, axis, out_types)
    derived = _derive_sizes(flat)
    if target in KERNEL_TARGETS:
        for node in flat.nodes:
            if isinstance(node.expr, Box) and node.expr.op in TRITON_MISSING:
                raise NapkinError(error("lower.triton_op", **_at(node), op=node.expr.op,
                                        missing=TRITON_MISSING[node.expr.op]))
    squeezed: tuple[str, ...] = ()
    if target in KERNEL_TARGETS and out_types:
        # woven axes and groups of one: one program per position, the axis squeezed away
        woven = woven_axes(flat, frozenset(by_axis))
        squeezed = tuple(a for a in out_types[0] if a in woven or (a in groups and axis_tiles[a] == 1))
    # groups whose tile the Triton backend cannot use as a block: each tile padded to one
    padded_tiles = tuple(a for a in groups if target in KERNEL_TARGETS and a not in squeezed
                         and not _group_block_ok(flat, a, axis_tiles, frozenset(squeezed)))
    grid = grid_order(out_types, groups, squeezed)
    if target in KERNEL_TARGETS and stream is not None:
        # The first grid axis varies fastest between programs launched together: put first the
        # axes that the streamed inputs lack (attention's query blocks), so the programs running
        # at once read the same streamed blocks (K and V of one head) and share them in L2.
        streamed = {a for name, axes in flat.inputs if stream in axes for a in axes}
        grid = tuple(sorted(grid, key=lambda a: a in streamed))
    phase = {n.name: "before" for n in flat.nodes}
    plans: dict[str, AccumulatorPlan] = {}
    carried: tuple[str, ...] = ()
    if stream is not None:
        loop = next(lp for lp in nest.loops if lp.axis == stream)
        phase = {n.name: nest.phase(loop, n.name) for n in flat.nodes}
        if loop.kind == "scan":
            carried = tuple(n.name for n in flat.nodes if touches(n, stream) == "scan")
        for node in flat.nodes:
            if phase[node.name] == "chunk" and touches(node, stream) not in ("weaves", "positional") \
                    and node.name not in carried:
                raise NapkinError(error("lower.stream_mixed", **_at(node), op=touches(node, stream),
                                        axis=stream))
            if phase[node.name] == "after" and stream in node.axes:
                raise NapkinError(error("lower.after_axis", **_at(node), axis=stream))
            if phase[node.name] == "accumulate":
                assert isinstance(node.expr, Box)
                box = node.expr
                via = (chosen or {}).get((stream, box.op, box.target, box.params), loop.partition.via)
                if via is not None and via not in ops.accumulators_for(box.op, box.params):
                    via = None
                # the proved plan, its state in a float-safe representation (l2/rms: a running scale)
                plans[node.name] = kernel_plan(box, stream, via)
    for step in schedule.quantisations:
        if step.dtype not in FORMATS:
            raise NapkinError(error("lower.dtype", dtype=step.dtype, known=", ".join(FORMATS)))
    split = None if schedule.split is None else _split(schedule, tiles, stream, axis_tiles, out_types, flat,
                                                       frozenset(padded_tiles), target)
    result = Layout(name, diagram, schedule, target, nest, axis_tiles, grid, frozenset(squeezed), stream, phase,
                    plans, frozenset(padded_tiles), derived, split, carried)
    _check_padding(result)
    return result


def _split(schedule: Schedule, tiles: Mapping[str, int], stream: str | None, axis_tiles: Mapping[str, int],
           out_types: Sequence[tuple[str, ...]], flat: Flat, padded_tiles: frozenset[str],
           target: str) -> tuple[str, int]:
    """The split's (axis, block), or a refusal of what the targets cannot run (module docstring).
    A block that is not a whole number of chunks (a padded stream inside the split: its last chunk
    masked) runs on plain JAX, whose blocks are slices of any width, and on Pallas, whose programs
    read the arrays along the axis whole and load whole chunks from their block's offset, the
    positions past the block's end masked (``Layout.ragged_split``); Mosaic GPU runs no split."""
    split = schedule.split
    assert split is not None
    axis = split.axis
    if len(splits := [p.axis for p in schedule.partitions if p.kind == "split"]) > 1:
        raise NapkinError(error("lower.split_many", axes=", ".join(splits)))
    if padded_tiles:
        raise NapkinError(error("lower.split_pallas", axis=axis, why=f"the tiles of {', '.join(sorted(padded_tiles))} "
                                "are not Triton blocks (its states would be stored tile by tile)"))
    if stream != axis:
        what = "streams nothing" if stream is None else f"streams `{stream}`"
        raise NapkinError(error("lower.split_stream", axis=axis, what=what))
    block = _tile_value(split.tile, axis, tiles)
    if block % axis_tiles[axis]:
        inner = [p for p in schedule.partitions if p.axis == axis and p.kind == "stream"]
        if not all(p.pad for p in inner):
            raise NapkinError(error("lower.split_tile", axis=axis, block=block, tile=axis_tiles[axis]))
    for index, axes in enumerate(out_types):
        if axis in axes:
            raise NapkinError(error("lower.split_output", index=index, axis=axis))
    for node in flat.nodes:  # the last block is padded: its consumers mask the padding
        box = node.expr
        if isinstance(box, Box) and axis in box.target and touches(node, axis) not in ("weaves", "positional") \
                and fill_values(box, axis) is None:
            raise NapkinError(error("lower.no_pad", node=node.name, op=box.op, axis=axis, span=box.span))
    return axis, block


def grid_order(out_types: Sequence[tuple[str, ...]], groups: Sequence[str],
               squeezed: Sequence[str] = ()) -> tuple[str, ...]:
    """The grid's axes before Pallas reorders them for the L2: the first output's grid axes in
    its order, then the other group axes in the schedule's."""
    grid = tuple(a for a in out_types[0] if a in squeezed or a in groups) if out_types else ()
    return grid + tuple(a for a in groups if a not in grid)


def realised_schedule(diagram: Diagram, schedule: Schedule, target: str) -> Schedule:
    """The schedule a ``target`` kernel runs, so that default tiles and the docstring's cost
    bound describe the kernel, not a placement it does not make.  For Pallas, the proved one
    with ``group AXIS by 1`` for each axis it puts on the grid unpartitioned
    (``loopnest.woven_axes``).  For plain JAX (``lower.jax``), only what it realises: the
    stream and, with one, the group of the first grid axis, whose blocks ``lax.map`` walks;
    every other group axis is vectorised whole, a kernel without a stream runs whole, and a
    nested partition or placement below the outer level is the compiler's; a split as proved."""
    if target == "jax":
        split = schedule.split
        if split is None:
            return _jax_realised(diagram, schedule)
        program = _jax_realised(diagram, schedule.unsplit())
        return replace(program, partitions=(*program.mesh, split, *program.device().partitions))
    if target not in KERNEL_TARGETS:
        return schedule
    top = () if schedule.split is None else (schedule.split,)  # a split's programs above the grid's
    device = schedule.device().unsplit().partitions
    partitioned = frozenset(p.axis for p in device)
    level = device[0].level if device else "smem"
    added = tuple(Partition("group", a, 1, level) for a in woven_axes(flatten(diagram), partitioned))
    return replace(schedule, partitions=(*schedule.mesh, *top, *added, *device)) if added else schedule


def _jax_realised(diagram: Diagram, schedule: Schedule) -> Schedule:
    device = schedule.device()
    if not device.partitions:
        return schedule
    level = device.partitions[0].level
    outer: dict[str, Partition] = {}
    for p in device.partitions:
        if p.level == level:
            outer.setdefault(p.axis, p)
    stream = next((p for p in outer.values() if p.kind in ("stream", "scan")), None)
    kept: set[Partition] = set()
    if stream is not None:
        grid = grid_order(diagram.out_types, [a for a, p in outer.items() if p.kind == "group"])
        kept = {stream} | ({outer[grid[0]]} if grid else set())
    partitions = tuple(p for p in device.partitions if p in kept)
    placements = tuple(pl for pl in schedule.placements if pl.level in ("mesh", "hbm", level))
    realised = Schedule(schedule.mesh + partitions, placements, schedule.quantisations)
    return schedule if realised == schedule else realised



def _at(node: Node) -> dict[str, Any]:
    """Where a diagnostic about ``node`` points: its source span, and a name the user wrote
    (a let binding, possibly inside an inlined diagram: ``attention.1.S``) or else the box
    as written (``prod[v]``) rather than a generated name such as ``t.2``."""
    expr = node.expr
    span = getattr(expr, "span", None)
    if not _GENERATED.match(node.name) or not isinstance(expr, Box):
        return {"node": node.name, "span": span}
    return {"node": f"{expr.op}[{' '.join(expr.target)}]" if expr.target else expr.op, "span": span}


#: names ``flatten`` makes up for unnamed boxes (``t.3``, ``out.4``, ``attention.2.t.5``)
_GENERATED = re.compile(r"^(.*\.)?(t|out)\.\d+$")


def _block_ok(tile: int) -> bool:
    """Can the Triton backend use this tile as a block (a power of two, at least MIN_BLOCK)?"""
    return tile >= MIN_BLOCK and not tile & (tile - 1)


def _group_block_ok(flat: Flat, axis: str, tiles: Mapping[str, int], squeezed: frozenset[str]) -> bool:
    """Can a grouped axis keep its tile as its block?  Blocks are powers of two; only a dot
    needs MIN_BLOCK, on each of its merged dimensions (rows, columns, contracted: jaxops
    merges the axes of each), so a small tile (two batch elements) is a block unless the
    dimension it is in has no other axis to reach MIN_BLOCK (a whole axis always does)."""
    tile = tiles[axis]
    if tile & (tile - 1):
        return False
    if tile >= MIN_BLOCK:
        return True
    for node in flat.nodes:
        box = node.expr
        if not (isinstance(box, Box) and box.op in ("contract", "ncontract") and len(box.args) == 2):
            continue
        first, second = (tuple(a for a in arg.axes if a not in squeezed) for arg in box.args)
        if axis not in first + second:
            continue
        target = set(box.target)
        dims = (tuple(a for a in first if a not in second), tuple(a for a in second if a not in first),
                tuple(a for a in first if a in target))
        for dim in dims:
            if axis in dim and math.prod(tiles.get(a, MIN_BLOCK) for a in dim) < MIN_BLOCK:
                return False
    return True


def broken_nesting(constraints: Sequence[Divides], partitions: Sequence[Partition],
                   values: Sequence[int]) -> tuple[str, int, int] | None:
    """The first nested tile assumption `inner | outer` of a theorem that the tile ``values`` (one per partition, in
    order) break, as (`inner | outer`, inner value, outer value), else None.  Which nested tiles the theorem assumes
    divide the tile outside them is the kernel's to say (R9, ``kernel._nest``, which records none for a tile of 1 or
    a padded stream inside a split): each is looked up in ``constraints`` (``Theorem.constraints``) and evaluated at
    ``values``.  A pair of integer tiles the kernel checked at the proof's integers (recording nothing) is evaluated
    again only where the outer tile takes another value (given by axis name).  The outermost tile's assumption on
    the axis (`sx | x`) is not read here: lowering pads a ragged last tile (README "Kernels")."""
    recorded = frozenset(constraints)
    seen: dict[str, tuple[Partition, int]] = {}
    for p, value in zip(partitions, values, strict=True):
        outer = seen.get(p.axis)
        seen[p.axis] = (p, value)
        if outer is None or min(value, outer[1]) <= 0:  # an unbound tile: refused as such (lower.tile_unbound)
            continue
        (o, above) = outer
        assumed = Divides(p.tile, o.tile) in recorded or (
            isinstance(p.tile, int) and isinstance(o.tile, int) and above != o.tile)
        if assumed and above % value:
            return f"{p.tile} | {o.tile}", value, above
    return None


def _tile_value(tile: str | int, axis: str, tiles: Mapping[str, int]) -> int:
    value = tiles.get(tile if isinstance(tile, str) else axis, tiles.get(axis, tile))
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise NapkinError(error("lower.tile_unbound", tile=tile, axis=axis))
    return value


def _derive_sizes(flat: Flat) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """How each axis gets its size: from an input or a declaration, or derived from a
    reshape in node order as (axis, "same" | "product" | "quotient", operand axes):
    rename[a -> b] gives |b| = |a|, join[b c -> a] |a| = |b|·|c|, split[a -> b c] with
    one part unknown |c| = |a| / |b|.  Refuses an axis none of these sizes."""
    known = {a for _, axes in flat.inputs for a in axes} | {a for a, n in flat.sizes if n is not None}
    derived: list[tuple[str, str, tuple[str, ...]]] = []
    for node in flat.nodes:
        expr = node.expr
        if isinstance(expr, Box) and expr.op in ("rename", "join", "split") and set(expr.target) <= known:
            unknown = [a for a in expr.out if a not in known]
            if expr.op == "rename" and unknown:
                derived.append((unknown[0], "same", expr.target))
            elif expr.op == "join" and unknown:
                derived.append((unknown[0], "product", expr.target))
            elif expr.op == "split" and len(unknown) == 1:
                derived.append((unknown[0], "quotient", expr.target + tuple(a for a in expr.out if a in known)))
            known.update(expr.out if len(unknown) <= 1 else ())
        sized = [a.axis for a in expr.args if isinstance(a, Size)] if isinstance(expr, Box) else []
        for axis in (*node.axes, *sized):
            if axis not in known:
                raise NapkinError(error("lower.unbound_axis", axis=axis, **_at(node)))
    return tuple(derived)


def _check_grid_axis(flat: Flat, axis: str, out_types: list[tuple[str, ...]]) -> None:
    for node in flat.nodes:
        how = touches(node, axis)
        if how not in ("weaves", "positional"):
            raise NapkinError(error("lower.grid_consumed", axis=axis, **_at(node), op=how))
    for index, axes in enumerate(out_types):
        if axis not in axes:
            raise NapkinError(error("lower.grid_output", axis=axis, index=index))


def _check_padding(lay: Layout) -> None:
    """Every box that consumes, mixes or reshapes a paddable axis must be able to mask it."""
    for node in lay.flat.nodes:
        expr = node.expr
        if not isinstance(expr, Box):
            continue
        for axis in expr.target + expr.out:
            how = touches(node, axis)
            if how in ("weaves", "positional", "rename") or not lay.may_pad(axis):  # a rename keeps the extent
                continue
            if expr.op == "gather" or ops.OPS[expr.op].kind == "scan":  # a gather's positions are clamped to the
                # true size, a scan's padded positions come after every real one: no padded position is read
                continue
            if how in ("split", "join"):
                raise NapkinError(error("lower.reshape_padded", **_at(node), op=expr.op, axis=axis, hint=(
                    f"declare the array with its axes already {'split' if expr.op == 'split' else 'joined'} "
                    "(a reshape outside the kernel), or use --target jax")))
            if fill_values(expr, axis) is None:
                raise NapkinError(error("lower.no_pad", **_at(node), op=expr.op, axis=axis))
