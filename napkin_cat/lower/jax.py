"""The plain-JAX target: the schedule as a streamed, vectorised, differentiable function.

A streamed kernel realises its first group partition: ``lax.map`` runs one block of
``min(tile, size)`` positions of that axis at a time (inputs zero-padded to whole blocks,
outputs sliced back; the axis is woven through every box, so padded rows touch nothing
else), so a chunk's values stay the size the schedule says (for attention, a query block by
a key chunk in cache instead of every query by a key chunk).  Other group partitions, and
groups without a stream, need no code: groups are independent, so the function is vectorised
over them.  The streamed axis becomes a ``lax.fori_loop`` over full chunks whose carry is the accumulator state,
plus one last ragged chunk when the tile does not divide the size, so no padding or
masking is needed and memory stays O(chunk) instead of O(whole axis).  ``fori_loop``
with static bounds lowers to ``scan``, so ``jax.grad`` works through it; the step is
``jax.checkpoint``-ed, so the backward pass stores one carry per chunk and recomputes
the chunk's intermediates (as FlashAttention's backward recomputes the scores).  A mask read
from data computes its block's kinds of chunks before the loop (``dataskip``) and each step
switches on its chunk's: skipped, masked, or unmasked.

A split (``split a by k``, ``Layout.split``) replaces the stream of ``a``: the inputs carrying
``a`` are zero-padded to ⌈|a|/k⌉ blocks of k, ``jax.vmap`` folds every block from the
accumulators' identity with the program's stream (chunks of the stream's tile; the padded
positions masked with the accumulators' padding values, as a ragged tile is), and a
``lax.fori_loop`` merges the blocks' partial states in order with the accumulators' lowered
``combine`` from the identity (``fold.emit_combine``) before the finals and the nodes after.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence

from napkin_cat.cost import hardware as hw
from napkin_cat.lower import codegen as cg
from napkin_cat.lower.dataskip import ChunkLoad, DataSkip, data_skip, emit_kind, emit_steps
from napkin_cat.lower.fold import emit_after, emit_before, emit_combine, emit_identity, emit_step, slots
from napkin_cat.lower.skip import stream_runs
from napkin_cat.lower.values import Scope, Value, transpose_to
from napkin_cat.printer import print_index
from napkin_cat.schedule.layout import KERNEL_TARGETS, Layout
from napkin_cat.terms import Axes, Box, Cmp, IBin, IInt, IndexExpr, Logic, Pred, fold_index, fold_pred, walk

__all__ = ["all_axes", "bind_inputs", "emit_body", "emit_chunks", "emit_dot_operand", "emit_function", "load",
           "rounded_nodes", "size_of"]


def sizes_dict(lay: Layout) -> ast.expr:
    return cg.dict_([(a, cg.const(n)) for a, n in lay.flat.sizes if n is not None])


def bind_inputs(lay: Layout, params: Sequence[str], block: cg.Block) -> None:
    """``n = bind_sizes(...)``: every axis size from the inputs, checked against declarations."""
    signature = cg.tuple_([cg.tuple_([cg.const(name), cg.tuple_([cg.const(a) for a in axes])])
                           for name, axes in lay.flat.inputs])
    arrays = cg.tuple_([cg.name(p) for p in params])
    integers = [cg.const(name) for name, _ in lay.flat.inputs if lay.declared_integer(name)]
    block.emit(cg.assign("n", cg.call("bind_sizes", arrays, signature, sizes_dict(lay),
                                      *([cg.tuple_(integers)] if integers else []))))
    for axis, how, operands in lay.derived:  # sizes that reshapes determine
        value = size_of(operands[0])
        for other in operands[1:]:
            value = cg.binop(value, "*" if how == "product" else "//", size_of(other))
        target = ast.Subscript(cg.name("n"), cg.const(axis), ast.Store())
        block.emit(ast.Assign([target], value, lineno=0))
    if exprs := index_exprs(lay):  # computed in int32 by the kernel: refused at sizes where one may wrap
        padding = {a: 2 * (lay.block(a) + (lay.split[1] if lay.split is not None and lay.split[0] == a else 0))
                   for a in lay.tiles}
        block.emit(ast.Expr(cg.call("index_range", cg.name("n"), cg.tuple_(
            [cg.tuple_([cg.const(print_index(e)), _index_tree(e)]) for e in exprs]),
            *([cg.dict_([(a, cg.const(k)) for a, k in padding.items()])] if lay.target in KERNEL_TARGETS else []))))


def index_exprs(lay: Layout) -> list[IndexExpr]:
    """The index expressions of the layout's boxes (``index``'s, and both sides of each comparison
    of a ``where``'s predicate), each once; with each comparison's difference of sides, minus 1 both
    ways: a mask's chunk bounds (``masks.Side``) compute its grid terms summed, each partial sum a
    value of that difference at some positions (q·150000000 - x >= 0 - q·150000000 has sides within
    int32 at q ≤ 9, and a bound 3·10^8·q that wraps)."""
    found: list[IndexExpr] = []

    def compare(a: IndexExpr, b: IndexExpr) -> None:
        found.extend((a, b, IBin("-", IBin("-", a, b), IInt(1)), IBin("-", IBin("-", b, a), IInt(1))))

    def visit(i: Pred | IndexExpr | None) -> None:
        if isinstance(i, (Cmp, Logic)):
            fold_pred(i, lambda op, a, b: compare(a, b), lambda op, a, b: None)
        elif i is not None:
            found.append(i)

    for node in lay.flat.nodes:
        for box in (b for b in walk(node.expr) if isinstance(b, Box)):
            visit(box.index)
    return list(dict.fromkeys(found))


def _index_tree(e: IndexExpr) -> ast.expr:
    return fold_index(e, lambda axis: cg.tuple_([cg.const("pos"), cg.const(axis)]),
                      lambda n: cg.tuple_([cg.const("int"), cg.const(n)]),
                      lambda op, a, b: cg.tuple_([cg.const(op), a, b]))


def all_axes(lay: Layout) -> tuple[str, ...]:
    axes = [a for _, t in lay.flat.inputs for a in t] + [a for node in lay.flat.nodes for a in node.axes]
    axes += [a for a, n in lay.flat.sizes if n is not None]  # declared, maybe only read by Size
    return tuple(dict.fromkeys(axes))


def size_of(axis: str) -> ast.expr:
    return cg.subscript(cg.name("n"), cg.const(axis))


def load(param: str, dtype: str) -> ast.expr:
    """An input in the kernel dtype (its storage precision), computed on in f32; an integer
    input (stored as ``hw.INT_DTYPE``, ``Layout.stored_as``) is computed on as stored."""
    if dtype in ("float32", hw.INT_DTYPE):
        return cg.call("jnp.asarray", cg.name(param), cg.attr(f"jnp.{dtype}"))
    stored = cg.call(ast.Attribute(cg.call("jnp.asarray", cg.name(param)), "astype", ast.Load()),
                     cg.attr(f"jnp.{dtype}"))
    return cg.call(ast.Attribute(stored, "astype", ast.Load()), cg.attr("jnp.float32"))


def rounded_nodes(lay: Layout) -> dict[str, str]:
    """Intermediates (not inputs) that ``dtype`` steps store in a narrower format."""
    inputs = {name for name, _ in lay.flat.inputs}
    return {n.name: fmt for n in lay.flat.nodes if n.name not in inputs and (fmt := lay.stored_as(n.name))}


def emit_function(lay: Layout, fname: str, params: Sequence[str], doc: str, dtype: str,
                  namer: cg.Namer) -> ast.FunctionDef:
    """``def fname(*inputs)``: the whole scheduled diagram in plain JAX."""
    block = cg.Block(namer)
    dot_operand = emit_dot_operand(block, dtype)
    bind_inputs(lay, params, block)
    sizes = {a: size_of(a) for a in all_axes(lay)}
    scope = Scope(block, sizes, dict(sizes), dot_dtype=dtype, dot_operand=dot_operand, rounded=rounded_nodes(lay))
    groups = [a for a in lay.grid if a != lay.stream]
    stream = None if lay.split is None else _emit_split
    if lay.stream is not None and groups:
        _emit_blocks(lay, params, scope, groups[0], stream)
    else:
        emit_body(lay, params, scope, stream)
    return cg.function(fname, params, block.stmts, doc)


def _emit_blocks(lay: Layout, params: Sequence[str], scope: Scope, axis: str,
                 stream: Callable[[Layout, dict[str, Value], Scope], None] | None = None) -> None:
    """The body under ``lax.map`` over the whole blocks of ``axis``, then once over the ragged
    last block (module docstring; no padding, whose rows could put NaN into a backward pass
    through the inputs they share), then ``return`` of the outputs put back together."""
    block, namer = scope.block, scope.block.namer
    size, tile = size_of(axis), cg.const(lay.tiles[axis])
    program, first, rows = namer.fresh("program"), namer.fresh(f"{axis}_first"), namer.fresh("rows")
    body = block.child()
    inner = []
    for (_, axes), param in zip(lay.flat.inputs, params, strict=True):
        if axis in axes:
            sliced = cg.call("lax.dynamic_slice_in_dim", cg.call("jnp.asarray", cg.name(param)), cg.name(first),
                             cg.name(rows), keywords=[cg.kw("axis", cg.const(axes.index(axis)))])
            param = body.bind(f"{param}_rows", sliced).id
        inner.append(param)
    emit_body(lay, inner, scope.with_block(body, extents={**scope.extents, axis: cg.name(rows)},
                                           offsets={**scope.offsets, axis: cg.name(first)}), stream)
    block.emit(cg.function(program, [first, rows], body.stmts))
    full = block.bind("full_blocks", cg.binop(size, "//", tile))
    tail = cg.binop(size, "%", tile)
    many = len(lay.diagram.out_types) > 1
    pieces = namer.fresh("pieces")
    block.emit(cg.assign(pieces, ast.List([], ast.Load())))
    b, blocks, piece = namer.fresh("b"), namer.fresh("blocks"), namer.fresh("piece")
    mapped = cg.call("lax.map", ast.Lambda(_args(b), cg.call(program, cg.binop(cg.name(b), "*", tile), tile)),
                     cg.call("jnp.arange", full))
    whole = []
    for k, t in enumerate(lay.diagram.out_types):
        value: ast.expr = cg.subscript(cg.name(blocks), cg.const(k)) if many else cg.name(blocks)
        if t.index(axis):
            value = cg.call("jnp.moveaxis", value, cg.const(0), cg.const(t.index(axis)))
        whole.append(cg.call("jnp.reshape", value, cg.tuple_([cg.binop(full, "*", tile) if a == axis else size_of(a)
                                                             for a in t])))
    block.emit(ast.If(full, [cg.assign(blocks, mapped),
                             _append(pieces, cg.tuple_(whole))], []))  # sizes are static: a Python `if`
    last = cg.call(program, cg.binop(full, "*", tile), tail)
    # the ragged block, or one empty block when the axis is empty (the outputs then have no rows)
    some = ast.BoolOp(ast.Or(), [tail, ast.UnaryOp(ast.Not(), full)])
    block.emit(ast.If(some, [_append(pieces, last if many else cg.tuple_([last]))], []))
    outs = [cg.call("jnp.concatenate", ast.ListComp(cg.subscript(cg.name(piece), cg.const(k)), [ast.comprehension(
        ast.Name(piece, ast.Store()), cg.name(pieces), [], 0)]), keywords=[cg.kw("axis", cg.const(t.index(axis)))])
        for k, t in enumerate(lay.diagram.out_types)]
    block.emit(ast.Return(outs[0] if len(outs) == 1 else cg.tuple_(outs)))


def _args(*names: str) -> ast.arguments:
    return ast.arguments(posonlyargs=[], args=[ast.arg(n) for n in names], vararg=None, kwonlyargs=[],
                         kw_defaults=[], kwarg=None, defaults=[])


def _append(target: str, value: ast.expr) -> ast.stmt:
    return ast.Expr(cg.call(ast.Attribute(cg.name(target), "append", ast.Load()), value))


def emit_dot_operand(block: cg.Block, dtype: str) -> str | None:
    """For a narrow ``dtype``, the variable naming the dtype dots compute in (``Scope.dot_operand``)."""
    if dtype == "float32":
        return None
    # on CPU: round to the dot dtype, multiply in f32 (XLA:CPU lacks bf16 x bf16 -> f32)
    dot_operand = block.namer.fresh("dot_operand")
    on_cpu = cg.binop(cg.call("jax.default_backend"), "==", cg.const("cpu"))
    block.emit(cg.assign(dot_operand, ast.IfExp(on_cpu, cg.attr("jnp.float32"), cg.attr(f"jnp.{dtype}"))))
    return dot_operand


def emit_body(lay: Layout, params: Sequence[str], scope: Scope,
              stream: Callable[[Layout, dict[str, Value], Scope], None] | None = None) -> None:
    """Into ``scope.block``: the inputs ``params`` loaded, the nodes before the stream, the
    stream (``stream``, by default from the accumulators' identity), the nodes after it and
    ``return`` of the outputs in the kernel dtype (``scope.dot_dtype``)."""
    block, dtype = scope.block, scope.dot_dtype
    env: dict[str, Value] = {}
    for (name, axes), param in zip(lay.flat.inputs, params, strict=True):
        env[name] = Value(block.bind(param, load(param, lay.stored_as(name) or dtype)), axes)
    emit_before(lay, env, scope)
    if lay.stream is not None:
        (stream or _emit_stream)(lay, env, scope)
    results = [transpose_to(env[o], t) for o, t in zip(lay.flat.outputs, lay.diagram.out_types, strict=True)]
    if dtype != "float32":  # outputs in the kernel dtype (integer-valued ones in f32), like the Pallas target's
        results = [cg.call(ast.Attribute(r, "astype", ast.Load()), cg.attr(f"jnp.{lay.output_dtype(k, dtype)}"))
                   for k, r in enumerate(results)]
    block.emit(ast.Return(results[0] if len(results) == 1 else cg.tuple_(results)))


def _emit_stream(lay: Layout, env: dict[str, Value], scope: Scope) -> None:
    """The stream from the accumulators' identity, then their finals and the nodes after it."""
    initial = emit_identity(lay, scope)
    for k in lay.chunk_outputs:
        dims = cg.tuple_([scope.extents[a] for a in lay.diagram.out_types[k]])
        initial.elts.append(cg.call("jnp.zeros", dims, cg.attr("jnp.float32")))
    state = emit_chunks(lay, env, scope, initial)
    finals, written = state[:len(state) - len(lay.chunk_outputs)], state[len(state) - len(lay.chunk_outputs):]
    emit_after(lay, env, scope, finals)
    for k, value in zip(lay.chunk_outputs, written, strict=True):
        env[lay.flat.outputs[k]] = value


def _emit_split(lay: Layout, env: dict[str, Value], scope: Scope) -> None:
    """The split of the streamed axis (module docstring): blocks folded under ``jax.vmap``, their
    states merged in order, then the finals and the nodes after."""
    assert lay.split is not None
    axis, tile = lay.split
    block, namer = scope.block, scope.block.namer
    size, width = scope.extents[axis], cg.const(tile)
    count = block.bind("split_blocks", cg.binop(cg.binop(cg.binop(size, "+", width), "-", cg.const(1)), "//", width))
    padded: dict[str, ast.expr] = {}
    for name, axes in lay.flat.inputs:
        if axis in axes:
            widths: list[ast.expr] = [cg.tuple_([cg.const(0), cg.binop(cg.binop(count, "*", width), "-", size)
                                                 if a == axis else cg.const(0)]) for a in axes]
            pad = cg.call("jnp.pad", env[name].expr, ast.List(widths, ast.Load()))
            padded[name] = block.bind(f"{name}_padded", pad)
    fold, b = namer.fresh("split_fold"), namer.fresh("b")
    body = block.child()
    start = body.bind("split_start", cg.binop(cg.name(b), "*", width))
    inner = scope.with_block(body, extents={**scope.extents, axis: width},
                             offsets={**scope.offsets, axis: start}, padded=scope.padded | {axis})
    blocks = {name: Value(body.bind(f"{name}_split", cg.call("lax.dynamic_slice_in_dim", value, start, width,
                                                                keywords=[cg.kw("axis", cg.const(
                                                                    env[name].axes.index(axis)))])),
                          env[name].axes) for name, value in padded.items()}
    state = emit_chunks(lay, {**env, **blocks}, inner, emit_identity(lay, inner))
    body.emit(ast.Return(cg.tuple_([v.expr for v in state])))
    block.emit(cg.function(fold, [b], body.stmts))
    partial = block.bind("partial_states", cg.call(cg.call("jax.vmap", cg.name(fold)), cg.call("jnp.arange", count)))
    merge, i, carry = namer.fresh("split_merge"), namer.fresh("i"), namer.fresh("carry")
    body = block.child()
    slot_list = slots(lay, scope)
    held = [namer.fresh(s.hint) for s in slot_list]
    body.emit(cg.assign(held, cg.name(carry)))
    earlier = [Value(cg.name(n), s.axes) for n, s in zip(held, slot_list, strict=True)]
    arrived = [Value(cg.subscript(cg.subscript(partial, cg.const(k)), cg.name(i)), s.axes)
               for k, s in enumerate(slot_list)]
    body.emit(ast.Return(cg.tuple_(emit_combine(lay, scope.with_block(body), earlier, arrived))))
    block.emit(cg.function(merge, [i, carry], body.stmts))
    merged = block.bind("merged", cg.call("lax.fori_loop", cg.const(0), count, cg.name(merge),
                                          emit_identity(lay, scope)))
    finals = [namer.fresh(s.hint) for s in slot_list]
    block.emit(cg.assign(finals, merged))
    emit_after(lay, env, scope, [Value(cg.name(n), s.axes) for n, s in zip(finals, slot_list, strict=True)])


def emit_chunks(lay: Layout, env: dict[str, Value], scope: Scope, initial: ast.expr) -> list[Value]:
    """``step(carry, start, size)`` over the full chunks of the streamed axis's extent in
    ``scope`` with ``fori_loop``, then the ragged tail, from the carry ``initial`` (the
    accumulator states in ``fold.slots`` order, then one buffer per chunk output); returns
    the last carry.  A chunk's global offset is its start plus the axis's offset in ``scope``
    (a ring's block, ``lower.mesh``)."""
    axis = lay.stream
    assert axis is not None
    tile = cg.const(lay.tiles[axis])
    block = scope.block
    namer = block.namer
    base = scope.offsets.get(axis)
    state = slots(lay, scope)
    skip = data_skip(lay)
    step = _emit_step(lay, env, scope, frozenset(), skip)
    extent = scope.extents[axis]
    full = block.bind("full_chunks", cg.binop(extent, "//", tile))
    j, c = namer.fresh("j"), namer.fresh("c")
    tail = cg.binop(extent, "%", tile)
    # a data mask's block mask: the kind of each chunk of this block, before the loop (dataskip.py)
    kinds = _emit_kinds(lay, skip, env, scope, full, tail) if skip is not None else None
    # chunks a mask fills with an absorbing operand's padding lift to the identity (skip.py): with
    # the block axis' offset known (``_emit_blocks``), they are skipped by a ``lax.cond``, not the
    # loop bounds, which must stay static for reverse mode; chunks on which the where masks hold
    # everywhere run a step without them (``Runs.full``), chosen by a ``lax.cond`` too; a
    # disjunction's chunk runs when it lies in any of its ranges
    grid = [a for a in lay.grid if a in scope.offsets and a != axis]
    trips = cg.binop(cg.binop(cg.binop(extent, "+", tile), "-", cg.const(1)), "//", tile)
    spans = {a: scope.extents[a] for a in grid}  # a program's rows: a block, or a mesh device's whole shard
    runs = stream_runs(lay, scope.offsets, trips, grid, spans) if grid and base is None and kinds is None else None
    kept = _emit_step(lay, env, scope, runs.unmasked) if runs is not None and runs.full is not None else None

    def within(index: ast.expr, ranges: tuple[tuple[ast.expr, ast.expr], ...]) -> ast.expr:
        tests = [cg.call("jnp.logical_and", cg.binop(index, ">=", lo), cg.binop(index, "<", hi)) for lo, hi in ranges]
        out = tests[0]
        for test in tests[1:]:
            out = cg.call("jnp.logical_or", out, test)
        return out

    def run(index: ast.expr, state: ast.expr, start: ast.expr, length: ast.expr) -> ast.expr:
        def masked(carry: ast.expr) -> ast.expr:
            if kinds is not None:  # the step switches on the chunk's kind
                return cg.call(step, carry, start, length, cg.subscript(kinds, index))
            if runs is None or not runs.skips:
                return cg.call(step, carry, start, length)
            return cg.call("lax.cond", within(index, runs.live),
                           ast.Lambda(_args(c), cg.call(step, cg.name(c), start, length)),
                           ast.Lambda(_args(c), cg.name(c)), carry)

        if runs is None or runs.full is None or kept is None:
            return masked(state)
        k = namer.fresh("k")
        return cg.call("lax.cond", within(index, runs.full),
                       ast.Lambda(_args(k), cg.call(kept, cg.name(k), start, length)),
                       ast.Lambda(_args(k), masked(cg.name(k))), state)

    lam = ast.Lambda(_args(j, c), run(cg.name(j), cg.name(c), cg.binop(cg.name(j), "*", tile), tile))
    state_name = namer.fresh("state")
    block.emit(cg.assign(state_name, initial))
    loop = cg.call("lax.fori_loop", cg.const(0), full, lam, cg.name(state_name))
    block.emit(ast.If(full, [cg.assign(state_name, loop)], []))  # sizes are static: a Python `if`
    ragged = run(full, cg.name(state_name), cg.binop(full, "*", tile), tail)
    block.emit(ast.If(tail, [cg.assign(state_name, ragged)], []))
    finals = [namer.fresh(s.hint) for s in state]
    written = [namer.fresh(f"out{k}") for k in lay.chunk_outputs]
    block.emit(cg.assign(finals + written, cg.name(state_name)))
    return [Value(cg.name(n), s.axes) for n, s in zip(finals, state, strict=True)] + \
        [Value(cg.name(name), lay.diagram.out_types[k]) for k, name in zip(lay.chunk_outputs, written, strict=True)]


def _emit_kinds(lay: Layout, skip: DataSkip, env: dict[str, Value], scope: Scope, full: ast.expr,
                tail: ast.expr) -> ast.expr:
    """The block mask of this block (``lower.dataskip``): the kind of each of its chunks (the
    ``full`` chunks of the tile, vectorised, then the ragged ``tail``), as an int32 array bound
    before the loop; ``def chunk_kind(start, size)`` slices the inputs the masks read."""
    axis = lay.stream
    assert axis is not None
    block, namer = scope.block, scope.block.namer
    tile = cg.const(lay.tiles[axis])
    fn, name = block.child(), namer.fresh("chunk_kind")
    start, size = namer.fresh("start"), namer.fresh("size")
    base = scope.offsets.get(axis)
    inner = scope.with_block(fn, extents={**scope.extents, axis: cg.name(size)},
                             offsets={**scope.offsets,
                                      axis: cg.name(start) if base is None else cg.binop(base, "+", cg.name(start))})
    pair = dict(env)
    for input_name, axes in lay.flat.inputs:
        if input_name in skip.reads and axis in axes:
            sliced = cg.call("lax.dynamic_slice_in_dim", env[input_name].expr, cg.name(start), cg.name(size),
                             keywords=[cg.kw("axis", cg.const(axes.index(axis)))])
            pair[input_name] = Value(fn.bind(f"{input_name}_pair", sliced), axes)
    fn.emit(ast.Return(emit_kind(skip, lay, pair, inner)))
    block.emit(cg.function(name, [start, size], fn.stmts))
    kinds = namer.fresh("kinds")
    block.emit(cg.assign(kinds, cg.call("jnp.zeros", cg.tuple_([cg.const(0)]), cg.attr("jnp.int32"))))
    s = namer.fresh("s")
    each = cg.call(cg.call("jax.vmap", ast.Lambda(_args(s), cg.call(name, cg.name(s), tile))),
                   cg.binop(cg.call("jnp.arange", full), "*", tile))
    block.emit(ast.If(full, [cg.assign(kinds, cg.call("jnp.asarray", each, cg.attr("jnp.int32")))], []))
    last = cg.subscript(cg.call("jnp.asarray", cg.call(name, cg.binop(full, "*", tile), tail), cg.attr("jnp.int32")),
                        cg.const(None))
    # no concatenation with the empty array when the tile has no full chunk: eager jax.shard_map on CPU
    # (jax 0.11) segfaults on jnp.concatenate([jnp.zeros((0,)), x[None]]) of a device-varying x (a
    # data-masked ring whose device block is shorter than a chunk crashed the process)
    joined = cg.call("jnp.concatenate", ast.List([cg.name(kinds), last], ast.Load()))
    block.emit(ast.If(tail, [cg.assign(kinds, ast.IfExp(full, joined, last))], []))
    return cg.name(kinds)


def _chunk_load(name: str, axes: Axes, sliced: ast.expr) -> ChunkLoad:
    """Code binding ``sliced``, the chunk of input ``name``, in a block."""
    return lambda block: Value(block.bind(f"{name}_chunk", sliced), axes)


def _emit_step(lay: Layout, env: dict[str, Value], scope: Scope, unmasked: frozenset[str],
               skip: DataSkip | None = None) -> str:
    """``def step(carry, start, size)``: one chunk of the stream (the where nodes ``unmasked``
    left out), checkpointed; returns its name.  With a data skip, ``step(carry, start, size,
    kind)`` switches on the chunk's kind (``lower.dataskip``): the carry unchanged (nothing
    loaded), the step with every mask, or without the mask chain."""
    axis = lay.stream
    assert axis is not None
    block = scope.block
    namer = block.namer
    step, carry, start, size = namer.fresh("step"), namer.fresh("carry"), namer.fresh("start"), namer.fresh("size")
    kind = namer.fresh("kind")
    body = block.child()
    base = scope.offsets.get(axis)
    inner = scope.with_block(body, extents={**scope.extents, axis: cg.name(size)},
                             offsets={**scope.offsets,
                                      axis: cg.name(start) if base is None else cg.binop(base, "+", cg.name(start))},
                             unmasked=unmasked)
    state = slots(lay, scope)
    names = [namer.fresh(s.hint) for s in state]
    buffers = [namer.fresh(f"out{k}") for k in lay.chunk_outputs]  # outputs written chunk by chunk
    body.emit(cg.assign(names + buffers, cg.name(carry)))
    chunk_env = dict(env)
    loads = {name: _chunk_load(name, axes, cg.call("lax.dynamic_slice_in_dim", env[name].expr, cg.name(start),
                                                   cg.name(size), keywords=[cg.kw("axis", cg.const(axes.index(axis)))]))
             for name, axes in lay.flat.inputs if axis in axes}
    carried = [Value(cg.name(n), s.axes) for n, s in zip(names, state, strict=True)]
    guarded: ast.expr
    if skip is not None:  # an empty chunk keeps the carry (dataskip.py; no output is chunked then)
        partial, full = emit_steps(skip, lay, chunk_env, inner, carried, loads)
        unchanged = ast.Lambda(_args(), cg.name(carry))
        guarded = cg.call("lax.switch", cg.name(kind), ast.List([unchanged, cg.name(partial), cg.name(full)],
                                                               ast.Load()))
    else:
        chunk_env |= {name: load(body) for name, load in loads.items()}
        updated = emit_step(lay, chunk_env, inner, carried)
        for k, buffer in zip(lay.chunk_outputs, buffers, strict=True):
            out_type = lay.diagram.out_types[k]
            value = transpose_to(chunk_env[lay.flat.outputs[k]], out_type)
            updated.append(cg.call("lax.dynamic_update_slice_in_dim", cg.name(buffer), value, cg.name(start),
                                   keywords=[cg.kw("axis", cg.const(out_type.index(axis)))]))
        guarded = cg.tuple_(updated)
    body.emit(ast.Return(guarded))
    block.emit(cg.function(step, [carry, start, size] + ([kind] if skip is not None else []), body.stmts))
    # rematerialise each chunk in the backward pass: jax.grad keeps one carry per chunk,
    # not the chunk's intermediates (O(q·x) for attention scores)
    static = cg.kw("static_argnums", cg.tuple_([cg.const(2)]))
    checkpointed = cg.call("jax.checkpoint", cg.name(step), keywords=[static])
    block.emit(cg.assign(step, checkpointed))
    return step
