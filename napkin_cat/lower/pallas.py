"""The Pallas target: one ``pallas_call`` for Pallas's Triton backend on GPU (JAX Pallas docs).

- grid: the layout's grid axes (woven batch/head axes and groups of one squeezed out of
  the block; other groups in blocks of their tile); every grid axis is parallel (on a GPU
  each program runs in parallel), so no program accumulates into another's output;
- every input and output is padded in the wrapper to whole blocks: grouped and streamed
  axes to a multiple of their tile, whole axes to a power of two of at least 16 (the Triton
  backend needs power-of-two arrays, and its dot at least 16 on every dimension),
  and outputs are sliced back; padded positions are masked where a box consumes or mixes
  them (jaxops), so they never reach a result; a table read only at the rows its gathers
  name (``datamask.gathered_tables``: a paged pool) is never loaded as a block: the kernel reads
  the rows through its ref (``jaxops.gather``), and its rows axis is not padded (a pool whose
  other axes are powers of two is passed as it is, not copied);
- integer inputs are int32 in the wrapper and the kernel (``Layout.computed_as``);
- the streamed axis is a ``lax.fori_loop`` inside the kernel over ``pl.ds`` chunks of the
  block, the accumulator states in the carry (the Triton backend has no scratch memory);
  chunks that a mask fills with the accumulator's padding value are skipped (``skip.stream_runs``:
  a loop per disjoint range of live chunks, one for a conjunction, several for a disjunction),
  and chunks on which the where masks hold everywhere run without them (``Runs.full``); a mask
  read from data is a block mask computed in the wrapper (``dataskip``): each program loops
  over its live chunks, read from two extra inputs (their count and indices, their FULL flags);
- other values are f32 inside the kernel, dots accumulate in f32, masks are finite;
- a split (``Layout.split``: blocks of k of the streamed axis) is one more grid axis, the last:
  each program streams its block of k and writes its unfinalised accumulator states to f32
  outputs with one row per block; after the ``pallas_call``, plain JAX merges the rows in order
  with the accumulators' ``combine`` (``fold.emit_combine``), then runs the finals and the nodes
  after the stream, and slices the outputs back;
- a ragged split (``Layout.ragged_split``: a block of k that is no whole number of chunks of t,
  the stream inside it padded) gives every program the arrays along the axis whole (one
  BlockSpec block of the padded extent, padded in the wrapper so that the last block's last
  chunk lies inside it): program b loads whole chunks at b·k + j·t, and every position at or past
  min(|a|, (b+1)·k) is padding (``Scope.limits``): masked with the accumulators' padding law
  like a ragged tile's, never assumed zero (it holds the next block's data).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy

from napkin_cat.lower import codegen as cg
from napkin_cat.lower.dataskip import ChunkLoad, DataSkip, data_skip, emit_kind, emit_steps
from napkin_cat.lower.fold import Slot, emit_after, emit_before, emit_combine, emit_identity, emit_step, slots
from napkin_cat.lower.jax import all_axes, bind_inputs, rounded_nodes, size_of
from napkin_cat.lower.skip import cut_at_full, ordered_runs, stream_runs
from napkin_cat.lower.values import Scope, Value, transpose_to
from napkin_cat.schedule.datamask import gathered_tables
from napkin_cat.schedule.layout import MIN_BLOCK, Layout
from napkin_cat.terms import Axes

__all__ = ["emit_function"]

#: the index of a split's block in the grid (its last axis)
SPLIT_INDEX = "i_split"


def padded_extent(lay: Layout, axis: str) -> ast.expr:
    """The extent an axis is padded to in HBM (see module docstring)."""
    kind = lay.kind(axis)
    if axis in lay.squeezed:
        return size_of(axis)
    if lay.split is not None and axis == lay.split[0]:  # whole blocks of the split
        whole = cg.call("round_up", size_of(axis), cg.const(lay.split[1]))
        if not lay.ragged_split:
            return whole
        block, tile = lay.split[1], lay.tiles[axis]  # and the last block's last chunk
        return cg.binop(whole, "+", cg.const(-(-block // tile) * tile - block))
    if kind in ("grid", "stream"):
        return cg.call("round_up", size_of(axis), cg.const(lay.tiles[axis]))
    carriers = {name for name, axes in lay.flat.inputs if axis in axes}
    if carriers and carriers <= gathered_tables(lay.flat) and not any(axis in n.axes for n in lay.flat.nodes):
        return size_of(axis)  # the rows of tables read only by indexed loads: never a block, never copied
    return cg.call("pow2_extent", size_of(axis), cg.const(MIN_BLOCK))


def extent_of(axis: str) -> ast.expr:
    return cg.subscript(cg.name("p"), cg.const(axis))


def split_blocks(lay: Layout) -> ast.expr:
    """The number of blocks of the split (its programs, the rows of its states): ⌈|a| / k⌉."""
    assert lay.split is not None
    axis, block = lay.split
    return cg.binop(cg.call("round_up", size_of(axis), cg.const(block)), "//", cg.const(block))


def block_spec(lay: Layout, axes: Axes, per_block: bool = False) -> ast.expr:
    """``pl.BlockSpec(block_shape, index_map)`` for an array with these axes (``per_block``: a
    split's state, one leading row per block of the split, squeezed)."""
    dims: list[ast.expr] = [cg.const(None)] if per_block else []
    index: list[ast.expr] = [cg.name(SPLIT_INDEX)] if per_block else []
    for axis in axes:
        if lay.split is not None and axis == lay.split[0] and lay.ragged_split and not per_block:
            dims.append(extent_of(axis))  # whole: the program loads its chunks from its block's offset
            index.append(cg.const(0))
            continue
        if lay.split is not None and axis == lay.split[0]:  # this program's block of the split
            dims.append(cg.const(lay.split[1]))
            index.append(cg.name(SPLIT_INDEX))
            continue
        if axis in lay.padded_tiles:  # stored as (tiles, block): one tile, squeezed, per program
            dims += [cg.const(None), cg.const(lay.block(axis))]
            index += [cg.name(f"i_{axis}"), cg.const(0)]
            continue
        if axis in lay.squeezed:
            dims.append(cg.const(None))
        elif lay.kind(axis) == "grid":
            dims.append(cg.const(lay.tiles[axis]))
        else:
            dims.append(extent_of(axis))
        index.append(cg.name(f"i_{axis}") if axis in lay.grid else cg.const(0))
    args = [f"i_{a}" for a in lay.grid] + ([SPLIT_INDEX] if lay.split is not None else [])
    lam = ast.Lambda(ast.arguments(posonlyargs=[], args=[ast.arg(a) for a in args], vararg=None, kwonlyargs=[],
                                   kw_defaults=[], kwarg=None, defaults=[]), cg.tuple_(index))
    return cg.call("pl.BlockSpec", cg.tuple_(dims), lam)


def stored_dims(lay: Layout, axes: Axes) -> list[ast.expr]:
    """The shape of an array as the kernel reads it from HBM (tile-padded axes split in two)."""
    dims: list[ast.expr] = []
    for axis in axes:
        if axis in lay.padded_tiles:
            dims += [cg.binop(extent_of(axis), "//", cg.const(lay.tiles[axis])), cg.const(lay.block(axis))]
        else:
            dims.append(extent_of(axis))
    return dims


@dataclass(frozen=True)
class LaunchRule:
    """What ``cost.launch.launch`` reads for one kernel: its on-chip needs (``Cost.on_chip``:
    register values, bytes loaded outside and inside the stream, the rows its warps split;
    sympy expressions in the axis sizes, the tiles substituted), the profile's rule and its
    shared memory."""

    values: sympy.Expr
    fixed: sympy.Expr
    staged: sympy.Expr
    rows: sympy.Expr
    rule: Mapping[str, Any]
    smem: float


def _size_code(expr: sympy.Expr) -> ast.expr:
    """A sympy expression in axis-size symbols as code over the padded extents ``p[axis]``
    (the blocks the kernel holds)."""
    tree = ast.parse(str(expr), mode="eval").body

    class Sizes(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.expr:
            if node.id in ("Max", "Min"):
                return cg.name(node.id.lower())
            return cg.subscript(cg.name("p"), cg.const(node.id))

    return Sizes().visit(tree)  # type: ignore[no-any-return]


def _compiler_params(launch: LaunchRule, block: cg.Block) -> ast.keyword:
    """``compiler_params`` with num_warps and num_stages chosen at trace time by
    ``cost.launch.launch`` on the kernel's actual blocks."""
    rule = launch.rule
    chosen = block.bind("launched", cg.call(
        "launch", _size_code(launch.values), _size_code(launch.staged), _size_code(launch.rows),
        cg.const(rule["registers_per_thread"]), cg.tuple_([cg.const(w) for w in rule["warps"]]),
        cg.const(rule["register_budget"]), cg.const(rule["rows_per_warp"]),
        cg.tuple_([cg.const(s) for s in rule["stages"]]),
        cg.binop(cg.const(launch.smem), "-", _size_code(launch.fixed))))
    return cg.kw("compiler_params", cg.call("plgpu.CompilerParams", keywords=[
        cg.kw("num_warps", cg.subscript(chosen, cg.const(0))), cg.kw("num_stages", cg.subscript(chosen, cg.const(1)))]))


def emit_function(lay: Layout, fname: str, params: Sequence[str], doc: str, dtype: str,
                  namer: cg.Namer, launch: LaunchRule | None = None,
                  given: Mapping[str, str] | None = None) -> ast.FunctionDef:
    """``def fname(*inputs, interpret=None)``: pad, one ``pallas_call`` (launched with the
    warps and stages ``launch`` chooses, else Triton's defaults), slice back.

    ``given`` maps axes whose true size is not their extent in the inputs (a mesh device's
    blocks: ``lower.mesh``) to a keyword-only parameter that holds it; the kernel reads
    ``Size(a)`` from that parameter, and everything else (padding, grid, blocks) from the
    inputs."""
    block = cg.Block(namer)
    auto = cg.binop(cg.call("jax.default_backend"), "!=", cg.const("gpu"))
    block.emit(ast.If(cg.binop(cg.name("interpret"), "is", cg.const(None)), [cg.assign("interpret", auto)], []))
    dot_operand = None
    if dtype != "float32":  # interpret mode on CPU: round to the dot dtype, multiply in f32
        choice = ast.IfExp(cg.name("interpret"), cg.attr("jnp.float32"), cg.attr(f"jnp.{dtype}"))
        dot_operand = namer.fresh("dot_operand")
        block.emit(cg.assign(dot_operand, choice))
    bind_inputs(lay, params, block)
    axes = all_axes(lay)
    block.emit(cg.assign("p", cg.dict_([(a, padded_extent(lay, a)) for a in axes])))
    storage = cg.attr(f"jnp.{dtype}")
    padded = []
    skip = data_skip(lay)
    whole: dict[str, ast.expr] = {}  # the padded inputs the block mask reads, tiles not split
    for (name, in_axes), param in zip(lay.flat.inputs, params, strict=True):
        dims = cg.tuple_([extent_of(a) for a in in_axes])
        stored = cg.attr(f"jnp.{lay.stored_as(name)}") if lay.stored_as(name) else storage
        value: ast.expr = cg.call("pad_to", cg.name(param), dims, stored)
        if skip is not None and name in skip.reads and any(a in lay.padded_tiles for a in in_axes):
            value = whole[name] = block.bind(f"{param}_whole", value)
        for k in reversed(range(len(in_axes))):  # right to left: earlier positions stay put
            if in_axes[k] in lay.padded_tiles:
                value = cg.call("split_tiles", value, cg.const(k), cg.const(lay.tiles[in_axes[k]]),
                                cg.const(lay.block(in_axes[k])))
        padded.append(block.bind(f"{param}_padded", value))
        whole.setdefault(name, padded[-1])
    out_types = list(lay.diagram.out_types)
    states = [Slot(n.name, plan, i, t) for n in lay.flat.nodes if (plan := lay.plans.get(n.name))
              for i, (_, t) in enumerate(plan.state)]
    written = [s.axes for s in states] if lay.split is not None else out_types  # a split writes its states
    plans = _block_mask(lay, skip, block, whole, dtype, given or {}) if skip is not None else []
    kernel = _emit_kernel(lay, params, written, dtype, namer, dot_operand, given or {}, skip)
    block.emit(kernel)
    blocks = [] if lay.split is None else [split_blocks(lay)]
    shapes: list[ast.expr] = [cg.call("jax.ShapeDtypeStruct", cg.tuple_(stored_dims(lay, t)),
                                      cg.attr(f"jnp.{lay.output_dtype(k, dtype)}"))
                              for k, t in enumerate(out_types)] if lay.split is None else \
        [cg.call("jax.ShapeDtypeStruct", cg.tuple_(blocks + stored_dims(lay, t)), cg.attr("jnp.float32"))
         for t in written]
    grid = cg.tuple_([_grid_extent(lay, a) for a in lay.grid] + blocks)
    call = cg.call("pl.pallas_call", cg.name(kernel.name), keywords=[
        cg.kw("out_shape", ast.List(shapes, ast.Load())),
        cg.kw("grid", grid),
        cg.kw("in_specs", ast.List([block_spec(lay, t) for _, t in lay.flat.inputs]
                                   + [_plan_spec(lay, plan) for plan in plans], ast.Load())),
        cg.kw("out_specs", ast.List([block_spec(lay, t, lay.split is not None) for t in written], ast.Load())),
        cg.kw("interpret", cg.name("interpret")),
        *([_compiler_params(launch, block)] if launch is not None else []),
    ])
    outs = block.bind("outs", ast.Call(call, list(padded) + plans, []))
    if lay.split is not None:
        outs = _combine(lay, block, outs, states, padded, dtype, dot_operand)
    results = []
    for k, t in enumerate(out_types):
        index = [ast.Slice() if a in lay.squeezed else ast.Slice(None, size_of(a)) for a in t]
        while index and isinstance(index[-1], ast.Slice) and index[-1].upper is None:
            index.pop()
        value = cg.subscript(cg.name(outs.id), cg.const(k))
        for i in range(len(t)):  # left to right: the axes before i are already merged back
            if t[i] in lay.padded_tiles:
                value = cg.call("merge_tiles", value, cg.const(i), cg.const(lay.tiles[t[i]]))
        results.append(cg.subscript(value, index) if index else value)
    block.emit(ast.Return(results[0] if len(results) == 1 else cg.tuple_(results)))
    return cg.function(fname, params, block.stmts, doc, kwonly=[
        ("interpret", cg.const(None)), *((name, cg.const(None)) for name in (given or {}).values())])


def _block_mask(lay: Layout, skip: DataSkip, block: cg.Block, whole: Mapping[str, ast.expr], dtype: str,
                given: Mapping[str, str]) -> list[ast.expr]:
    """The block mask (``lower.dataskip``), in plain jnp before the ``pallas_call``: the kind of
    every (program, chunk) pair from the padded inputs the masks read (``runtime.pair_kinds``;
    each pair sliced as the kernel loads it), then each program's live chunks and their FULL
    flags (``runtime.live_chunks``); returns the two arrays, the kernel's last inputs."""
    axis = lay.stream
    assert axis is not None
    namer = block.namer
    fn, name = block.child(), namer.fresh("chunk_kind")
    ids, j = [namer.fresh(f"i_{a}") for a in lay.grid], namer.fresh("j")
    offsets: dict[str, ast.expr] = {}
    for a, i in zip(lay.grid, ids, strict=True):
        offsets[a] = cg.name(i) if a in lay.squeezed else \
            fn.bind(f"{a}_first", cg.binop(cg.name(i), "*", cg.const(lay.tiles[a])))
    offsets[axis] = fn.bind(f"{axis}_first", cg.binop(cg.name(j), "*", cg.const(lay.tiles[axis])))
    axes = all_axes(lay)
    extents = {a: cg.const(lay.tiles[a]) if a in offsets else extent_of(a) for a in axes if a not in lay.squeezed}
    sizes = {a: cg.name(given[a]) if a in given else size_of(a) for a in axes}
    scope = Scope(fn, sizes, extents, offsets, lay.squeezed, frozenset(a for a in axes if lay.may_pad(a)), dtype,
                  rounded=rounded_nodes(lay))  # the mask's nodes as the kernel computes them
    env: dict[str, Value] = {}
    for input_name, in_axes in lay.flat.inputs:
        if input_name not in skip.reads:
            continue
        value = whole[input_name]
        for k in reversed(range(len(in_axes))):  # right to left: earlier positions stay put
            a = in_axes[k]
            if a in lay.squeezed:
                value = cg.call("lax.dynamic_index_in_dim", value, offsets[a], cg.const(k),
                                keywords=[cg.kw("keepdims", cg.const(False))])
            elif a in offsets:
                value = cg.call("lax.dynamic_slice_in_dim", value, offsets[a], cg.const(lay.tiles[a]), cg.const(k))
        env[input_name] = Value(fn.bind(f"{input_name}_pair", value), scope.keep(in_axes), zero_padded=True)
    fn.emit(ast.Return(emit_kind(skip, lay, env, scope)))
    block.emit(cg.function(name, [*ids, j], fn.stmts))
    grid = [_grid_extent(lay, a) for a in lay.grid] + [cg.binop(extent_of(axis), "//", cg.const(lay.tiles[axis]))]
    kinds = block.bind("kinds", cg.call("pair_kinds", cg.name(name), cg.tuple_(grid)))
    plans = [namer.fresh("live_plan"), namer.fresh("full_plan")]
    block.emit(cg.assign(plans, cg.call("live_chunks", kinds)))
    return [cg.name(p) for p in plans]


def _plan_spec(lay: Layout, plan: ast.expr) -> ast.expr:
    """``pl.BlockSpec`` of a block mask's array: the program's row, whole."""
    width = cg.subscript(ast.Attribute(plan, "shape", ast.Load()), cg.const(-1))
    args = [f"i_{a}" for a in lay.grid]
    lam = ast.Lambda(ast.arguments(posonlyargs=[], args=[ast.arg(a) for a in args], vararg=None, kwonlyargs=[],
                                   kw_defaults=[], kwarg=None, defaults=[]),
                     cg.tuple_([cg.name(a) for a in args] + [cg.const(0)]))
    return cg.call("pl.BlockSpec", cg.tuple_([cg.const(None)] * len(lay.grid) + [width]), lam)


def _grid_extent(lay: Layout, axis: str) -> ast.expr:
    """Programs along a grid axis: one per position if squeezed, else one per block."""
    if axis in lay.squeezed:
        return size_of(axis)
    return cg.binop(extent_of(axis), "//", cg.const(lay.tiles[axis]))


def _emit_kernel(lay: Layout, params: Sequence[str], out_types: list[Axes], dtype: str,
                 namer: cg.Namer, dot_operand: str | None = None,
                 given: Mapping[str, str] | None = None, skip: DataSkip | None = None) -> ast.FunctionDef:
    """The kernel body: grid offsets, block loads, the phases, the stream loop, stores (with a
    data skip, the block mask's two arrays are its last inputs: ``_block_mask``)."""
    block = cg.Block(namer)
    kname = namer.fresh("kernel")
    in_refs = [namer.fresh(f"{p}_ref") for p in params]
    plan_refs = [namer.fresh("live_ref"), namer.fresh("full_ref")] if skip is not None else []
    out_refs = [namer.fresh(f"out{k}_ref") for k in range(len(out_types))]
    offsets: dict[str, ast.expr] = {}
    for k, axis in enumerate(lay.grid):
        pid = cg.call("pl.program_id", cg.const(k))
        first = pid if axis in lay.squeezed else cg.binop(pid, "*", cg.const(lay.tiles[axis]))
        offsets[axis] = block.bind(f"{axis}_first", first)
    if lay.split is not None:  # where this program's block of the split starts
        pid = cg.call("pl.program_id", cg.const(len(lay.grid)))
        offsets[lay.split[0]] = block.bind(f"{lay.split[0]}_block", cg.binop(pid, "*", cg.const(lay.split[1])))
    extents = {a: cg.const(lay.block(a)) if lay.kind(a) in ("grid", "stream") else extent_of(a)
               for a in all_axes(lay) if a not in lay.squeezed}
    sizes = {a: cg.name(given[a]) if given and a in given else size_of(a) for a in all_axes(lay)}
    limits: dict[str, ast.expr] = {}
    if lay.split is not None and lay.ragged_split:  # padding from the block's end (module docstring)
        axis, size = lay.split
        end = cg.binop(offsets[axis], "+", cg.const(size))
        limits[axis] = block.bind(f"{axis}_end", cg.call("jnp.minimum", sizes[axis], end))
    scope = Scope(block, sizes, extents, offsets, lay.squeezed,
                  frozenset(a for a in all_axes(lay) if lay.may_pad(a)), dtype, dot_operand, batched_dot=False,
                  rounded=rounded_nodes(lay), exp2=True, take=False,
                  pad_extents={a: extent_of(a) for a in all_axes(lay) if lay.may_pad(a) and not (given and a in given)},
                  limits=limits)
    env: dict[str, Value] = {}
    gathered = gathered_tables(lay.flat)
    for (name, axes), ref in zip(lay.flat.inputs, in_refs, strict=True):
        if name in gathered:  # read only at the rows its gathers name, through its ref
            env[name] = Value(cg.name(ref), scope.keep(axes), ref=lay.computed_as(name))
        elif lay.stream not in axes:
            env[name] = Value(block.bind(f"{name}_block", _load(ref, (), lay.computed_as(name))), scope.keep(axes),
                              zero_padded=True)
    emit_before(lay, env, scope)
    if lay.stream is not None:
        finals = _emit_loop(lay, env, scope, in_refs, out_refs, skip, plan_refs)
        if lay.split is not None:  # the block's states, finalised after the combine
            for state, ref in zip(finals, out_refs, strict=True):
                block.emit(ast.Assign([ast.Subscript(cg.name(ref), ast.Constant(Ellipsis), ast.Store())],
                                      state.expr, lineno=0))
            return cg.function(kname, [*in_refs, *plan_refs, *out_refs], block.stmts)
        emit_after(lay, env, scope, finals)
    for k, (out, t, ref) in enumerate(zip(lay.flat.outputs, out_types, out_refs, strict=True)):
        if k in lay.chunk_outputs:
            continue  # written chunk by chunk inside the loop
        value = transpose_to(env[out], scope.keep(t))
        cast = cg.call(ast.Attribute(value, "astype", ast.Load()), ast.Attribute(cg.name(ref), "dtype", ast.Load()))
        block.emit(ast.Assign([ast.Subscript(cg.name(ref), ast.Constant(Ellipsis), ast.Store())], cast, lineno=0))
    return cg.function(kname, [*in_refs, *plan_refs, *out_refs], block.stmts)


def _load(ref: str, index: Sequence[ast.expr], dtype: str) -> ast.expr:
    """``ref[index]`` (all of the block when ``index`` is empty) as ``dtype`` (``Layout.computed_as``)."""
    slot: ast.expr = cg.tuple_(list(index)) if index else ast.Constant(Ellipsis)
    return cg.call(ast.Attribute(ast.Subscript(cg.name(ref), slot, ast.Load()), "astype", ast.Load()),
                   cg.attr(f"jnp.{dtype}"))


def _chunk_load(name: str, ref: str, index: list[ast.expr], axes: Axes, dtype: str,
                zero_padded: bool = True) -> ChunkLoad:
    """Code loading ``ref[index]``, the chunk of input ``name``, into a block (``zero_padded``: its
    padded positions hold the wrapper's zeros; not so in a ragged split's, past the block's end)."""
    return lambda block: Value(block.bind(f"{name}_chunk", _load(ref, index, dtype)), axes, zero_padded=zero_padded)


def _emit_loop(lay: Layout, env: dict[str, Value], scope: Scope, in_refs: Sequence[str],
               out_refs: Sequence[str], skip: DataSkip | None = None, plan_refs: Sequence[str] = ()) -> list[Value]:
    """``lax.fori_loop`` over the chunks of the padded stream axis; the carry is the states.
    Chunks a mask fills with padding are skipped (``skip.stream_runs``: a disjunction's union of
    ranges runs as disjoint ranges in order); where the where
    masks hold on a whole run of chunks (``Runs.full``: a causal mask below the
    diagonal), that run is a loop of its own whose body leaves them out.  Returns the states;
    a split's block is ``Layout.split``'s, at its offset, and skips nothing.  With a data skip
    (``lower.dataskip``), the loop runs over the program's live chunks, their count and indices
    read from the block mask (``plan_refs``), each FULL one without its mask chain."""
    axis = lay.stream
    assert axis is not None
    tile = cg.const(lay.tiles[axis])
    block = scope.block
    namer = block.namer
    # a split's block in whole chunks (a ragged one's last chunk passes its end: masked)
    trips = cg.binop(extent_of(axis), "//", tile) if lay.split is None else \
        cg.const(-(-lay.split[1] // lay.tiles[axis]))
    state = slots(lay, scope)
    finals = [namer.fresh(s.hint) for s in state]
    if skip is not None:
        body = _emit_body(lay, env, scope, in_refs, out_refs, frozenset(), (skip, plan_refs[0], plan_refs[1]))
        count = block.bind("live_count", cg.subscript(cg.name(plan_refs[0]), cg.const(0)))
        loop: ast.expr = cg.call("lax.fori_loop", cg.const(0), count, cg.name(body), emit_identity(lay, scope))
        block.emit(cg.assign(finals, loop) if finals else ast.Expr(loop))
        return [Value(cg.name(n), s.axes) for n, s in zip(finals, state, strict=True)]
    # chunks a mask fills with padding are skipped: the loop runs over each disjoint live range
    runs = stream_runs(lay, scope.offsets, trips) if lay.split is None else None
    pieces = ordered_runs(block, runs) if runs is not None else [((cg.const(0), trips), None)]
    bounded = [(lo if isinstance(lo, ast.Constant) else block.bind("first_chunk", lo),
                hi if hi is trips else block.bind("end_chunk", hi), full) for (lo, hi), full in pieces]
    body = _emit_body(lay, env, scope, in_refs, out_refs, frozenset())
    kept = _emit_body(lay, env, scope, in_refs, out_refs, runs.unmasked) \
        if runs is not None and runs.full is not None else None
    carry: ast.expr = emit_identity(lay, scope)
    for k, (lo, hi, full) in enumerate(bounded):
        loop = _emit_run(block, body, kept, lo, hi, full, trips, carry)
        if k + 1 < len(bounded):
            carry = block.bind("carry", loop)
    block.emit(cg.assign(finals, loop) if finals else ast.Expr(loop))
    return [Value(cg.name(n), s.axes) for n, s in zip(finals, state, strict=True)]


def _emit_run(block: cg.Block, body: str, kept: str | None, lo: ast.expr, hi: ast.expr,
              full: tuple[ast.expr, ast.expr] | None, trips: ast.expr, carry: ast.expr) -> ast.expr:
    """The loops over chunks ``[lo, hi)`` from ``carry`` (their last call, as code): ``body``
    on each, or, with a ``full`` range, ``kept`` (the masks left out) on the chunks inside it
    and ``body`` on those before and after (``skip.cut_at_full``)."""
    pieces = [(lo, hi, False)] if full is None or kept is None else cut_at_full(block, lo, hi, full, trips)
    loop = carry
    for k, (start, stop, unmasked) in enumerate(pieces):
        loop = cg.call("lax.fori_loop", start, stop, cg.name(kept if unmasked and kept else body), carry)
        if k + 1 < len(pieces):
            carry = block.bind("carry", loop)
    return loop


def _combine(lay: Layout, block: cg.Block, outs: ast.Name, states: Sequence[Slot], inputs: Sequence[ast.Name],
             dtype: str, dot_operand: str | None) -> ast.Name:
    """After the ``pallas_call`` of a split (module docstring): the blocks' states merged in order
    from the identity, the finals and the nodes after the stream, in plain JAX on the padded
    extents; returns the outputs (a tuple, in the kernel dtype) for the wrapper to slice."""
    assert lay.split is not None
    axes = all_axes(lay)
    scope = Scope(block, {a: size_of(a) for a in axes}, {a: extent_of(a) for a in axes}, dot_dtype=dtype,
                  dot_operand=dot_operand, rounded=rounded_nodes(lay))
    namer = block.namer
    merge, i, carry = namer.fresh("split_merge"), namer.fresh("i"), namer.fresh("carry")
    body = block.child()
    held = [namer.fresh(s.hint) for s in states]
    body.emit(cg.assign(held, cg.name(carry)))
    earlier = [Value(cg.name(n), s.axes) for n, s in zip(held, states, strict=True)]
    arrived = [Value(cg.subscript(cg.subscript(outs, cg.const(k)), cg.name(i)), s.axes) for k, s in enumerate(states)]
    body.emit(ast.Return(cg.tuple_(emit_combine(lay, scope.with_block(body), earlier, arrived))))
    block.emit(cg.function(merge, [i, carry], body.stmts))
    merged = block.bind("merged", cg.call("lax.fori_loop", cg.const(0), split_blocks(lay), cg.name(merge),
                                          emit_identity(lay, scope)))
    finals = [namer.fresh(s.hint) for s in states]
    block.emit(cg.assign(finals, merged))
    env: dict[str, Value] = {}  # the nodes after the stream may read inputs and nodes before it
    for (name, t), stored in zip(lay.flat.inputs, inputs, strict=True):
        if lay.split[0] not in t:  # padded as the kernel reads it
            whole = cg.call(ast.Attribute(stored, "astype", ast.Load()), cg.attr(f"jnp.{lay.computed_as(name)}"))
            env[name] = Value(block.bind(f"{name}_whole", whole), t, zero_padded=True)
    emit_before(lay, env, scope)
    emit_after(lay, env, scope, [Value(cg.name(n), s.axes) for n, s in zip(finals, states, strict=True)])
    results = [cg.call(ast.Attribute(transpose_to(env[o], t), "astype", ast.Load()),
                       cg.attr(f"jnp.{lay.output_dtype(k, dtype)}"))
               for k, (o, t) in enumerate(zip(lay.flat.outputs, lay.diagram.out_types, strict=True))]
    return block.bind("outs", cg.tuple_(results))


def _emit_body(lay: Layout, env: dict[str, Value], scope: Scope, in_refs: Sequence[str], out_refs: Sequence[str],
               unmasked: frozenset[str], plan: tuple[DataSkip, str, str] | None = None) -> str:
    """``def body(j, carry)``: chunk ``j`` of the stream, the where nodes ``unmasked`` left out;
    with a block mask (``plan``: the data skip and the refs of its two arrays), the ``j``-th live
    chunk, run with its masks or, where it is FULL, without its mask chain; returns its name."""
    axis = lay.stream
    assert axis is not None
    tile = cg.const(lay.tiles[axis])
    block = scope.block
    namer = block.namer
    body_name, j, carry = namer.fresh("body"), namer.fresh("j"), namer.fresh("carry")
    body = block.child()
    index: ast.expr = cg.name(j)
    if plan is not None:  # the j-th live chunk (after the count)
        index = body.bind("chunk", cg.subscript(cg.name(plan[1]), cg.binop(cg.const(1), "+", cg.name(j))))
    start = body.bind(f"{axis}_first", cg.binop(index, "*", tile))  # in the block; past a split's offset:
    base = scope.offsets.get(axis)
    at = start if base is None else body.bind(f"{axis}_at", cg.binop(base, "+", start))
    inner = scope.with_block(body, offsets={**scope.offsets, axis: at}, unmasked=unmasked)
    state = slots(lay, scope)
    names = [namer.fresh(s.hint) for s in state]
    if names:
        body.emit(cg.assign(names, cg.name(carry)))
    chunk_env = dict(env)
    whole = lay.ragged_split  # the arrays along the axis are whole: chunks load at their global offset
    loads = {name: _chunk_load(name, ref, [cg.call("pl.ds", at if whole else start, tile) if a == axis
                                           else ast.Slice() for a in scope.keep(axes)], scope.keep(axes),
                               lay.computed_as(name), zero_padded=not whole)
             for (name, axes), ref in zip(lay.flat.inputs, in_refs, strict=True) if axis in axes}
    carried = [Value(cg.name(n), s.axes) for n, s in zip(names, state, strict=True)]
    guarded: ast.expr
    if plan is not None:  # a live chunk: masked, or FULL and unmasked (dataskip.py; no output is chunked then)
        # loaded before the branch, at the loop body's top level, where Triton pipelines the loads
        chunk_env |= {name: load(body) for name, load in loads.items()}
        partial, full = emit_steps(plan[0], lay, chunk_env, inner, carried, {})
        flag = cg.subscript(cg.name(plan[2]), cg.binop(cg.const(1), "+", cg.name(j)))
        guarded = cg.call("lax.cond", cg.binop(flag, "!=", cg.const(0)), cg.name(full), cg.name(partial))
    else:
        chunk_env |= {name: load(body) for name, load in loads.items()}
        updated = emit_step(lay, chunk_env, inner, carried)
        for k in lay.chunk_outputs:  # a sequential group: store this chunk of the output
            kept = scope.keep(lay.diagram.out_types[k])
            value = transpose_to(chunk_env[lay.flat.outputs[k]], kept)
            where = cg.tuple_([cg.call("pl.ds", start, tile) if a == axis else ast.Slice() for a in kept])
            cast = cg.call(ast.Attribute(value, "astype", ast.Load()),
                           ast.Attribute(cg.name(out_refs[k]), "dtype", ast.Load()))
            body.emit(ast.Assign([ast.Subscript(cg.name(out_refs[k]), where, ast.Store())], cast, lineno=0))
        guarded = cg.tuple_(updated)
    body.emit(ast.Return(guarded))
    block.emit(cg.function(body_name, [j, carry], body.stmts))
    return body_name
