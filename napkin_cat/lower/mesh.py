"""Lowering past one device: a schedule's ``mesh`` partitions as one ``jax.shard_map``.

``group a by t at mesh`` shards ``a``: the wrapper pads it to a multiple of the device count N
and places a block of ⌈|a|/N⌉ positions on each device (``runtime.shard``); every output
carries it, so each device writes its block of every output.  ``stream a by t at mesh`` is a
ring: the inputs carrying ``a`` are split the same way, and each device folds the block it
holds into its accumulator state with the device's own stream of ``a`` (R8: the nested stream
continues the state, through ``fold.emit_step``'s lift and combine), sends the block on with
``lax.ppermute`` and takes the one arriving; the send does not depend on the fold, so XLA may
overlap the transfer with the compute.  After N blocks the finals and the nodes after the
stream run on each device.  A ring needs a sharded axis as well (the queries each device keeps).
A mesh tile is realised as ⌈|a|/N⌉, whatever the proof names it: neither R3 nor R4
depends on the tile's size, only on how the boxes treat the axis (padding is masked); but where the
theorem assumes the device's tile of ``a`` divides it (R9 records `gq | mq`, `sx | mx`:
``Theorem.constraints``), each block is rounded up to whole tiles (``MeshPlan.whole``), so the
assumption holds on the realised blocks as the outermost `sx | x` holds on a padded extent.  The
block is ``schedule.mesh.device_block`` of the axes ``schedule.mesh.whole_tiles`` names: the cost
of the mesh (``cost.mesh``) prices the same blocks.

Each device runs the device schedule (``Schedule.device``): the plain-JAX body of
``lower.jax`` with the mesh axes at their block extents and global offsets (masks see global
positions; a ring's padded positions are masked with the accumulator's padding value), or, for
a sharding without a ring, the Pallas kernel of ``lower.pallas`` on each device's blocks.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from napkin_cat.diagnostics import NapkinError, error
from napkin_cat.lower import codegen as cg
from napkin_cat.lower import pallas as pallas_target
from napkin_cat.lower.fold import emit_after, emit_identity, slots
from napkin_cat.lower.jax import all_axes, bind_inputs, emit_body, emit_chunks, emit_dot_operand, rounded_nodes, size_of
from napkin_cat.lower.values import Scope, Value
from napkin_cat.schedule.layout import Layout, fill_values
from napkin_cat.schedule.loopnest import touches
from napkin_cat.schedule.mesh import device_block
from napkin_cat.schedule.mesh import whole_tiles as shared_whole_tiles
from napkin_cat.terms import MAX_MESH_DEVICES, Axes, Box, Divides, Schedule

__all__ = ["MESH_AXIS", "MeshPlan", "describe", "emit_functions", "mesh_plan", "whole_tiles"]

#: the name of the device axis of the emitted ``jax.sharding.Mesh`` (``runtime.device_mesh``)
MESH_AXIS = "mesh"


@dataclass(frozen=True)
class MeshPlan:
    """How a schedule uses ``devices`` devices: the axis it shards (``group``), the one it rings."""

    devices: int
    group: str | None
    ring: str | None
    #: per mesh axis, the tile its device blocks are whole numbers of (``whole_tiles``; absent: 1)
    whole: tuple[tuple[str, int], ...] = ()

    def tile(self, axis: str) -> int:
        return dict(self.whole).get(axis, 1)

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(a for a in (self.group, self.ring) if a is not None)


def mesh_plan(name: str, schedule: Schedule, devices: int) -> MeshPlan:
    """The mesh partitions of ``schedule`` on a one-axis mesh of ``devices``, or a refusal."""
    if not 1 <= devices <= MAX_MESH_DEVICES:
        raise NapkinError(error("lower.mesh_devices", devices=devices, limit=MAX_MESH_DEVICES))
    parts = schedule.mesh
    if not parts:
        raise NapkinError(error("lower.mesh_none", devices=devices, name=name))
    for part in (p for p in parts if p.kind == "scan"):
        raise NapkinError(error("lower.mesh_scan", name=name, axis=part.axis))
    groups = [p.axis for p in parts if p.kind == "group"]
    rings = [p.axis for p in parts if p.kind == "stream"]
    for kind, axes in (("groups", groups), ("streams", rings)):
        if len(axes) > 1:
            raise NapkinError(error("lower.mesh_axes", name=name, what=f"{kind} {', '.join(axes)}"))
    return MeshPlan(devices, groups[0] if groups else None, rings[0] if rings else None)


def whole_tiles(schedule: Schedule, constraints: Sequence[Divides],
                tiles: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """Per mesh axis whose device tile the theorem assumes divides the mesh tile (``schedule.mesh``'s
    ``whole_tiles``, the rule cost prices by too), that tile's value (``tiles``, by axis:
    ``Layout.tiles``): each device's block is rounded up to whole tiles (``device_block``)."""
    return tuple((axis, tiles[axis]) for axis in shared_whole_tiles(schedule, constraints) if tiles.get(axis, 1) > 1)


def _block(axis: str, plan: MeshPlan) -> str:
    """A device's block of ``axis``, in words."""
    tile = plan.tile(axis)
    return f"⌈{axis}/{plan.devices}⌉" + (f" rounded up to whole tiles of {tile}" if tile > 1 else "")


def describe(plan: MeshPlan, lay: Layout) -> str:
    """The docstring's line on the mesh."""
    parts = [f"{plan.devices} devices (jax.shard_map over one mesh axis)"]
    if plan.group is not None:
        parts.append(f"{plan.group} sharded in blocks of {_block(plan.group, plan)}, one per device")
    if plan.ring is not None:
        accs = ", ".join(sorted({p.name for p in lay.plans.values()}))
        parts.append(f"{plan.ring} in blocks of {_block(plan.ring, plan)} passed around the ring (lax.ppermute), "
                     f"each folded into {accs} on arrival")
    return "; ".join(parts)


def _check(plan: MeshPlan, lay: Layout) -> frozenset[str]:
    """Refuse what the mesh cannot run; returns the mesh axes that may be padded and need masks."""
    out_types = lay.diagram.out_types
    if plan.ring is not None:
        if plan.group is None:
            raise NapkinError(error("lower.mesh_ring_alone", axis=plan.ring))
        if lay.stream != plan.ring:
            raise NapkinError(error("lower.mesh_ring_device", axis=plan.ring))
        for index, axes in enumerate(out_types):
            if plan.ring in axes:
                raise NapkinError(error("lower.mesh_ring_output", index=index, axis=plan.ring))
        if lay.target == "pallas":
            raise NapkinError(error("lower.mesh_pallas_ring", axis=plan.ring))
    if plan.group is not None:
        for index, axes in enumerate(out_types):
            if plan.group not in axes:
                raise NapkinError(error("lower.mesh_output", index=index, axis=plan.group))
    for name, axes in lay.flat.inputs:
        if plan.ring in axes and plan.group in axes:
            raise NapkinError(error("lower.mesh_both", name=name, group=plan.group, ring=plan.ring))
    declared = dict(lay.flat.sizes)
    padded = frozenset(a for a in plan.axes if (size := declared.get(a)) is None
                       or device_block(size, plan.devices, plan.tile(a)) * plan.devices != size)
    for node in lay.flat.nodes:
        box = node.expr
        if not isinstance(box, Box):
            continue
        for axis in plan.axes:
            how = touches(node, axis)
            if lay.target == "pallas" and how == "positional":
                raise NapkinError(error("lower.mesh_pallas_offset", node=node.name, axis=axis, span=box.span))
            if axis in padded and how not in ("weaves", "positional") and fill_values(box, axis) is None:
                raise NapkinError(error("lower.no_pad", node=node.name, op=box.op, axis=axis, span=box.span))
    return padded


def emit_functions(lay: Layout, plan: MeshPlan, fname: str, params: Sequence[str], doc: str, dtype: str,
                   namer: cg.Namer) -> list[ast.stmt]:
    """The module's functions: ``def fname(*inputs)`` placing the inputs on the mesh and
    running the device function under ``jax.shard_map`` (for Pallas, ``fname_device`` before it)."""
    padded = _check(plan, lay)
    block = cg.Block(namer)
    out: list[ast.stmt] = []
    pallas = lay.target == "pallas"
    if pallas:
        block.emit(ast.If(cg.binop(cg.name("interpret"), "is", cg.const(None)), [cg.assign(
            "interpret", cg.binop(cg.call("jax.default_backend"), "!=", cg.const("gpu")))], []))
    bind_inputs(lay, params, block)
    mesh = block.bind("mesh", cg.call("device_mesh", cg.const(plan.devices)))
    count = cg.const(plan.devices)
    extents = {}
    for a in plan.axes:  # device_block at run time: ⌈|a|/N⌉, in whole tiles where the theorem assumes them
        share = cg.binop(cg.call("round_up", size_of(a), count), "//", count)
        extents[a] = block.bind(f"shard_{a}", share if plan.tile(a) == 1 else
                                cg.call("round_up", share, cg.const(plan.tile(a))))
    placed = []
    for (_, axes), param in zip(lay.flat.inputs, params, strict=True):
        axis = next((k for k, a in enumerate(axes) if a in extents), None)
        extent = cg.const(0) if axis is None else cg.binop(extents[axes[axis]], "*", count)
        placed.append(block.bind(f"{param}_shards", cg.call("shard", cg.name(param), mesh, cg.const(axis), extent)))
    device = namer.fresh(f"{fname}_device")
    if pallas:
        given = {a: namer.fresh(f"size_{a}") for a in plan.axes}
        out.append(_pallas_device(lay, plan, device, params, dtype, namer, given))
        mapped = namer.fresh("on_device")
        inner = [namer.fresh(p) for p in params]
        call = cg.call(device, *[cg.name(p) for p in inner], keywords=[
            cg.kw("interpret", cg.name("interpret")), *(cg.kw(k, size_of(a)) for a, k in given.items())])
        block.emit(cg.function(mapped, inner, [ast.Return(call)]))
    else:
        mapped = device
        block.emit(_jax_device(lay, plan, device, [namer.fresh(f"{p}_block") for p in params], dtype, namer,
                               extents, padded))
    in_specs = cg.tuple_([_spec(axes, plan.axes) for _, axes in lay.flat.inputs])
    out_types = lay.diagram.out_types
    specs = [_spec(t, plan.axes) for t in out_types]
    shard_map = cg.call("jax.shard_map", cg.name(mapped), keywords=[
        cg.kw("mesh", mesh), cg.kw("in_specs", in_specs),
        cg.kw("out_specs", specs[0] if len(specs) == 1 else cg.tuple_(specs)), cg.kw("check_vma", cg.const(False))])
    outs = block.bind("outs", ast.Call(shard_map, list(placed), []))
    results = [outs] if len(out_types) == 1 else [cg.subscript(outs, cg.const(k)) for k in range(len(out_types))]
    names = []
    for t, result in zip(out_types, results, strict=True):
        value = block.bind("out", result)
        if plan.group is not None:  # the padding of the sharded axis, sliced off
            whole = cg.binop(cg.binop(extents[plan.group], "*", count), "!=", size_of(plan.group))
            sliced = cg.call("lax.slice_in_dim", value, cg.const(0), size_of(plan.group),
                             keywords=[cg.kw("axis", cg.const(t.index(plan.group)))])
            block.emit(ast.If(whole, [cg.assign(value.id, sliced)], []))
        names.append(value)
    block.emit(ast.Return(names[0] if len(names) == 1 else cg.tuple_(list(names))))
    out.append(cg.function(fname, params, block.stmts, doc, kwonly=[("interpret", cg.const(None))] if pallas else ()))
    return out


def _spec(axes: Axes, sharded: tuple[str, ...]) -> ast.expr:
    return cg.call("jax.sharding.PartitionSpec", *[cg.const(MESH_AXIS if a in sharded else None) for a in axes])


def _jax_device(lay: Layout, plan: MeshPlan, name: str, params: Sequence[str], dtype: str, namer: cg.Namer,
                extents: dict[str, ast.Name], padded: frozenset[str]) -> ast.FunctionDef:
    """``def name(*blocks)``: the device schedule on one device's blocks (module docstring)."""
    block = cg.Block(namer)
    dot_operand = emit_dot_operand(block, dtype)
    me = block.bind("me", cg.call("lax.axis_index", cg.const(MESH_AXIS)))
    sizes = {a: size_of(a) for a in all_axes(lay)}
    offsets: dict[str, ast.expr] = {} if plan.group is None else {plan.group: cg.binop(me, "*", extents[plan.group])}
    scope = Scope(block, sizes, {**sizes, **extents}, offsets, padded=padded, dot_dtype=dtype,
                  dot_operand=dot_operand, rounded=rounded_nodes(lay))
    emit_body(lay, params, scope, None if plan.ring is None else _ring(plan, me))
    return cg.function(name, params, block.stmts)


def _ring(plan: MeshPlan, me: ast.expr) -> Callable[[Layout, dict[str, Value], Scope], None]:
    """The stream of the ring axis: N - 1 steps of (send the block on, fold it), a last fold."""
    axis, count = plan.ring, plan.devices
    assert axis is not None

    def emit(lay: Layout, env: dict[str, Value], scope: Scope) -> None:
        block = scope.block
        namer = block.namer
        travelling = [name for name, axes in lay.flat.inputs if axis in axes]
        state = slots(lay, scope)
        # ring_fold(source, carry): the blocks that started on device `source` folded into the state
        fold, source, carry = namer.fresh("ring_fold"), namer.fresh("source"), namer.fresh("carry")
        body = block.child()
        names = [namer.fresh(s.hint) for s in state]
        held = [namer.fresh(f"{t}_held") for t in travelling]
        body.emit(cg.assign(names + held, cg.name(carry)))
        inner = scope.with_block(body, offsets={**scope.offsets,
                                                axis: cg.binop(cg.name(source), "*", scope.extents[axis])})
        arrived = {t: Value(cg.name(b), env[t].axes) for t, b in zip(travelling, held, strict=True)}
        folded = emit_chunks(lay, {**env, **arrived}, inner, cg.tuple_([cg.name(n) for n in names]))
        body.emit(ast.Return(cg.tuple_([v.expr for v in folded])))
        block.emit(cg.function(fold, [source, carry], body.stmts))
        # ring_step(i, carry): fold the blocks held and send them on (independent: they may overlap)
        step, i = namer.fresh("ring_step"), namer.fresh("i")
        body = block.child()
        perm = body.bind("ring_perm", _ring_permutation(namer, count))
        sent = [cg.call("lax.ppermute", cg.subscript(cg.name(carry), cg.const(len(state) + k)), cg.const(MESH_AXIS),
                        perm) for k in range(len(travelling))]
        origin = cg.binop(cg.binop(me, "-", cg.name(i)), "%", cg.const(count))
        body.emit(ast.Return(cg.tuple_([ast.Starred(cg.call(fold, origin, cg.name(carry)), ast.Load()), *sent])))
        block.emit(cg.function(step, [i, carry], body.stmts))
        initial = emit_identity(lay, scope)
        start = cg.tuple_(list(initial.elts) + [env[t].expr for t in travelling])
        ring = block.bind("ring", cg.call("lax.fori_loop", cg.const(0), cg.const(count - 1), cg.name(step), start))
        last = cg.binop(cg.binop(me, "+", cg.const(1)), "%", cg.const(count))  # (me - (N - 1)) mod N
        finals = [namer.fresh(s.hint) for s in state]
        block.emit(cg.assign(finals, cg.call(fold, last, ring)))
        emit_after(lay, env, scope, [Value(cg.name(n), s.axes) for n, s in zip(finals, state, strict=True)])

    return emit


def _ring_permutation(namer: cg.Namer, count: int) -> ast.expr:
    """``[(j, (j + 1) % count) for j in range(count)]``: each device sends to the next, computed
    when the kernel runs, so the code's size does not grow with the devices (issue 33)."""
    j = namer.fresh("j")
    pair = cg.tuple_([cg.name(j), cg.binop(cg.binop(cg.name(j), "+", cg.const(1)), "%", cg.const(count))])
    loop = ast.comprehension(ast.Name(j, ast.Store()), cg.call("range", cg.const(count)), [], 0)
    return ast.ListComp(pair, [loop])


def _pallas_device(lay: Layout, plan: MeshPlan, name: str, params: Sequence[str], dtype: str,
                   namer: cg.Namer, given: dict[str, str]) -> ast.FunctionDef:
    """The Pallas kernel on one device's blocks: the sharded axis's declared size (if any) is
    not the block's, so its extent is read from the blocks, and its size (``Size(a)`` in the
    diagram: ``rsqrt(q)``) from the keyword ``given[a]``, which the caller passes the global
    size (every box weaves a sharded axis (R3), so no mask reads its size)."""
    sizes = tuple((a, None if a in plan.axes else n) for a, n in lay.flat.sizes)
    local = replace(lay, nest=replace(lay.nest, flat=replace(lay.flat, sizes=sizes)))
    return pallas_target.emit_function(local, name, params, "", dtype, namer, given=given)
