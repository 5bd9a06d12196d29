"""The Mosaic GPU target: one ``plgpu.kernel`` for Pallas's Mosaic GPU backend (Hopper and
newer; JAX's supported GPU backend, the Triton one being deprecated in jax 0.11).

It places a schedule exactly as the Pallas (Triton) target does (``lower.pallas``: the same
``Layout``, grid, padding and masks, the same phases through ``lower.fold`` and ``jaxops``), and
differs in how a program moves data and multiplies:

- the grid is ``plgpu.kernel``'s, one warpgroup (128 threads) per program, its axes named
  ``i_<axis>`` and read with ``lax.axis_index``;
- each input block the program reads whole is copied by TMA (``plgpu.copy_gmem_to_smem``) into
  shared memory, waited on through one barrier each, then read into registers;
- the streamed inputs are a ``plgpu.emit_pipeline`` over the chunks the program does not skip
  (``skip.stream_runs``, each disjoint range in order; runs where every where mask holds, ``Runs.full``, are a pipeline
  of their own without the masks): TMA copies into ``MOSAIC_STEPS`` shared-memory buffers in
  flight, the accumulator states in the pipeline's carry (registers); a pipeline of no steps
  is not run (``lax.cond``);
- every two-operand contraction that is a matrix product is ``plgpu.wgmma`` into a register
  accumulator (``plgpu.ACC``, f32): an operand that is a chunk or block in shared memory as
  loaded is read from there, any other value is staged into shared memory first;
- outputs are written to shared memory and copied out by TMA (``plgpu.copy_smem_to_gmem``);
- exp is exp2 with log2(e) folded in, as on the Triton path.

What Mosaic GPU cannot express is refused before anything is emitted (``lower.mosaic``): f32
kernels (wgmma has no IEEE f32), a split (its per-block states), a table read only at the rows a
gather names (a paged pool: TMA copies whole blocks), a tile padded to a block, an
output written chunk by chunk, a scalar input or one whose last axis is one position per
program (TMA's 16-byte minimum), a kernel with no matrix product (nothing anchors Mosaic's
register layouts), and tiles off the machine model (``check_tiles``:
wgmma ``m`` a multiple of 64, TMA boxes of at most 256 per dimension).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from typing import Any

from napkin_cat.diagnostics import NapkinError, error
from napkin_cat.lower import codegen as cg
from napkin_cat.lower.fold import emit_after, emit_before, emit_identity, emit_step, slots
from napkin_cat.lower.jax import all_axes, bind_inputs, rounded_nodes, size_of
from napkin_cat.lower.layout import Layout
from napkin_cat.lower.pallas import extent_of, padded_extent
from napkin_cat.lower.skip import cut_at_full, ordered_runs, stream_runs
from napkin_cat.lower.values import Scope, Value, transpose_to
from napkin_cat.schedule.datamask import gathered_tables

__all__ = ["MOSAIC_STEPS", "WGMMA_SOURCE", "check_tiles", "emit_function", "mosaic_rules"]

#: TMA copies in flight per streamed input (``emit_pipeline``'s ``max_concurrent_steps``) when
#: the profile's [mosaic] table gives none
MOSAIC_STEPS = 2

#: squeezed (one program per position) axes are padded in HBM to a multiple of this many
#: elements, so every stride but the last is a multiple of 16 bytes (TMA's rule) in 16-bit formats
STRIDE_ALIGN = 8

#: the emitted module's matrix product on tensor cores (``jaxops`` calls it for a contraction
#: where ``Scope.wgmma``): ``a`` [m, k] (``a_k`` = 1; 0: stored [k, m]) times ``b`` [k, n]
#: (``b_k`` = 0; 1: stored [n, k]); ``a_ref``/``b_ref``: the operand is a shared-memory ref
#: already (a TMA'd block or chunk), else a value staged into shared memory here
WGMMA_SOURCE = '''
def wgmma(a, b, a_k, b_k, a_ref, b_ref, dtype):
    """a @ b on tensor cores (plgpu.wgmma, f32 accumulator); see napkin_cat.lower.mosaic."""
    staged = [plgpu.SMEM(x.shape, dtype) for x, is_ref in ((a, a_ref), (b, b_ref)) if not is_ref]

    def run(*smem):
        free = iter(smem)
        views = []
        for x, is_ref, k, at in ((a, a_ref, a_k, 1), (b, b_ref, b_k, 0)):
            if not is_ref:
                ref = next(free)
                ref[...] = x.astype(dtype)
                x = ref
            views.append(x if k == at else x.transpose((1, 0)))
        plgpu.commit_smem()
        m, n = views[0].shape[0], views[1].shape[1]
        if m % 64 or n % 8:
            raise ValueError(f"wgmma needs m a multiple of 64 and n of 8; got m={m}, n={n}")

        def product(acc):
            plgpu.wgmma(acc, views[0], views[1])
            return acc[...]
        return pl.run_scoped(product, plgpu.ACC((m, n), jnp.float32))
    return pl.run_scoped(run, *staged)
'''


def mosaic_rules(hardware: Any) -> dict[str, int]:
    """The machine model's Mosaic GPU rules (``Hardware.mosaic``, the profile's [mosaic] table)."""
    return dict(getattr(hardware, "mosaic", {}) or {})


def check_tiles(lay: Layout, rules: Mapping[str, int]) -> None:
    """Refuse (``lower.mosaic``) a layout Mosaic GPU cannot run (module docstring)."""
    def refuse(reason: str) -> NapkinError:
        return NapkinError(error("lower.mosaic", name=lay.name, reason=reason))

    if lay.split is not None:
        raise refuse(f"a split of `{lay.split[0]}` (per-block states and a combine after the kernel) "
                     "is not lowered for Mosaic GPU; use --target pallas")
    gathered = sorted(gathered_tables(lay.flat))
    if gathered:
        raise refuse(f"tables read only at the rows a gather names ({', '.join(f'`{t}`' for t in gathered)}: a "
                     "paged pool) are not served by Mosaic GPU's whole-block copies; use --target pallas")
    if lay.padded_tiles:
        axis = sorted(lay.padded_tiles)[0]
        raise refuse(f"tile {lay.tiles[axis]} of `{axis}` is not a power of two of at least 16 (padded to a block); "
                     "give a tile of 64, 128 or 256")
    if lay.chunk_outputs:
        raise refuse("an output carries the streamed axis (written chunk by chunk); use --target pallas")
    for name, axes in lay.flat.inputs:
        if not axes:
            raise refuse(f"input `{name}` is a scalar (TMA copies arrays of rank 1 to 5)")
        if axes[-1] in lay.squeezed:
            raise refuse(f"input `{name}`'s last axis `{axes[-1]}` is one position per program (a TMA copy moves "
                         "at least 16 bytes along the last dimension)")
    box = int(rules.get("tma_box", 256))
    least = int(rules.get("wgmma_m", 64))
    for axis in (*lay.grid, *((lay.stream,) if lay.stream else ())):
        if axis in lay.squeezed:
            continue
        tile = lay.tiles[axis]
        if tile % least or tile > box:
            raise refuse(f"tile {tile} of `{axis}`: Mosaic GPU blocks here are multiples of {least} (wgmma m) "
                         f"of at most {box} (a TMA box dimension)")


def emit_function(lay: Layout, fname: str, params: Sequence[str], doc: str, dtype: str,
                  namer: cg.Namer, rules: Mapping[str, int] | None = None) -> ast.FunctionDef:
    """``def fname(*inputs, interpret=None)``: pad, one ``plgpu.kernel``, slice back.
    ``interpret`` None runs Mosaic GPU's interpreter (``plgpu.InterpretGPUParams``) off a GPU."""
    rules = rules or {}
    if dtype == "float32":
        raise NapkinError(error("lower.mosaic", name=lay.name, reason="an f32 kernel: wgmma multiplies f16/bf16 "
                                "(f32 only as TF32); lower with --dtype bf16 or f16, or use --target pallas"))
    check_tiles(lay, rules)
    block = cg.Block(namer)
    auto = cg.binop(cg.call("jax.default_backend"), "!=", cg.const("gpu"))
    block.emit(ast.If(cg.binop(cg.name("interpret"), "is", cg.const(None)), [cg.assign("interpret", auto)], []))
    bind_inputs(lay, params, block)
    axes = all_axes(lay)
    # squeezed axes padded to a multiple of STRIDE_ALIGN: TMA needs 16-byte strides (the padding is
    # never read: one program per true position)
    block.emit(cg.assign("p", cg.dict_([(a, cg.call("round_up", size_of(a), cg.const(STRIDE_ALIGN))
                                         if a in lay.squeezed else padded_extent(lay, a)) for a in axes])))
    storage = cg.attr(f"jnp.{dtype}")
    padded = []
    for (name, in_axes), param in zip(lay.flat.inputs, params, strict=True):
        dims = cg.tuple_([extent_of(a) for a in in_axes])
        stored = cg.attr(f"jnp.{lay.stored_as(name)}") if lay.stored_as(name) else storage
        padded.append(block.bind(f"{param}_padded", cg.call("pad_to", cg.name(param), dims, stored)))
    out_types = list(lay.diagram.out_types)
    whole = [name for name, t in lay.flat.inputs if lay.stream not in t]
    scratch: list[ast.expr] = []
    for name, t in lay.flat.inputs:
        if name in whole:
            stored = cg.attr(f"jnp.{lay.stored_as(name)}") if lay.stored_as(name) else storage
            scratch.append(cg.call("plgpu.SMEM", _block_shape(lay, t), stored))
    scratch += [cg.call("plgpu.SMEM", _block_shape(lay, t), storage) for t in out_types]
    if whole:
        scratch.append(cg.call("plgpu.Barrier", keywords=[cg.kw("num_barriers", cg.const(len(whole)))]))
    kernel = _emit_kernel(lay, params, whole, dtype, namer, int(rules.get("max_concurrent_steps", MOSAIC_STEPS)))
    if not any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "wgmma"
               for n in ast.walk(kernel)):
        raise NapkinError(error("lower.mosaic", name=lay.name, reason="no matrix product for wgmma: Mosaic GPU "
                                "infers register layouts from its wgmma accumulators, and without one jax 0.11.2's "
                                "inference fails (after minutes, on cross_entropy_forward); use --target pallas"))
    block.emit(kernel)
    shapes: list[ast.expr] = [cg.call("jax.ShapeDtypeStruct", cg.tuple_([extent_of(a) for a in t]), storage)
                              for t in out_types]
    mode = ast.IfExp(cg.name("interpret"), cg.call("plgpu.InterpretGPUParams"), cg.const(None))
    grid = [size_of(a) if a in lay.squeezed else cg.binop(extent_of(a), "//", cg.const(lay.tiles[a]))
            for a in lay.grid]
    call = cg.call("plgpu.kernel", cg.name(kernel.name), keywords=[
        cg.kw("out_type", ast.List(shapes, ast.Load())),
        cg.kw("grid", cg.tuple_(grid or [cg.const(1)])),
        cg.kw("grid_names", cg.tuple_([cg.const(f"i_{a}") for a in lay.grid] or [cg.const("i_")])),
        cg.kw("scratch_types", ast.List(scratch, ast.Load())),
        cg.kw("interpret", mode),
    ])
    outs = block.bind("outs", ast.Call(call, list(padded), []))
    results = []
    for k, t in enumerate(out_types):
        index = [ast.Slice(None, size_of(a)) for a in t]
        value = cg.subscript(cg.name(outs.id), cg.const(k))
        results.append(cg.subscript(value, index) if index else value)
    block.emit(ast.Return(results[0] if len(results) == 1 else cg.tuple_(results)))
    return cg.function(fname, params, block.stmts, doc, kwonly=[("interpret", cg.const(None))])


def _block_shape(lay: Layout, axes: Sequence[str]) -> ast.Tuple:
    """The shape of one program's block of an array (squeezed grid axes dropped)."""
    return cg.tuple_([cg.const(lay.tiles[a]) if lay.kind(a) in ("grid", "stream") else extent_of(a)
                      for a in axes if a not in lay.squeezed])


def _window(lay: Layout, ref: str, axes: Sequence[str], offsets: Mapping[str, ast.expr]) -> ast.expr:
    """``ref.at[...]``: this program's window of a GMEM array (every grid axis fixed; the
    streamed and whole axes entire)."""
    index: list[ast.expr] = []
    for a in axes:
        if a in lay.squeezed:
            index.append(offsets[a])
        elif a in lay.grid:
            index.append(cg.call("pl.ds", offsets[a], cg.const(lay.tiles[a])))
        else:
            index.append(ast.Slice())
    if all(isinstance(i, ast.Slice) for i in index):
        return cg.name(ref)
    return cg.subscript(ast.Attribute(cg.name(ref), "at", ast.Load()), index)


def _load(ref: str, dtype: str) -> ast.expr:
    """All of ``ref`` as ``dtype`` (``Layout.computed_as``)."""
    return cg.call(ast.Attribute(ast.Subscript(cg.name(ref), ast.Constant(Ellipsis), ast.Load()), "astype",
                                 ast.Load()), cg.attr(f"jnp.{dtype}"))


def _emit_kernel(lay: Layout, params: Sequence[str], whole: Sequence[str], dtype: str, namer: cg.Namer,
                 steps: int) -> ast.FunctionDef:
    """The kernel body: grid offsets, TMA'd blocks, the phases, the pipelined stream, stores."""
    block = cg.Block(namer)
    kname = namer.fresh("kernel")
    in_refs = [namer.fresh(f"{p}_gmem") for p in params]
    out_types = list(lay.diagram.out_types)
    out_refs = [namer.fresh(f"out{k}_gmem") for k in range(len(out_types))]
    in_smem = {name: namer.fresh(f"{name}_smem") for name in whole}
    out_smem = [namer.fresh(f"out{k}_smem") for k in range(len(out_types))]
    barrier = namer.fresh("barrier") if whole else None
    offsets: dict[str, ast.expr] = {}
    for axis in lay.grid:
        pid = cg.call("lax.axis_index", cg.const(f"i_{axis}"))
        first = pid if axis in lay.squeezed else cg.binop(pid, "*", cg.const(lay.tiles[axis]))
        offsets[axis] = block.bind(f"{axis}_first", first)
    extents = {a: cg.const(lay.block(a)) if lay.kind(a) in ("grid", "stream") else extent_of(a)
               for a in all_axes(lay) if a not in lay.squeezed}
    refs: dict[str, str] = {}
    env: dict[str, Value] = {}
    for k, (name, ref) in enumerate((n, r) for (n, _), r in zip(lay.flat.inputs, in_refs, strict=True) if n in whole):
        t = dict(lay.flat.inputs)[name]
        assert barrier is not None
        at = cg.subscript(ast.Attribute(cg.name(barrier), "at", ast.Load()), cg.const(k))
        block.emit(ast.Expr(cg.call("plgpu.copy_gmem_to_smem", _window(lay, ref, t, offsets),
                                    cg.name(in_smem[name]), at)))
    for k, name in enumerate(whole):
        assert barrier is not None
        at = cg.subscript(ast.Attribute(cg.name(barrier), "at", ast.Load()), cg.const(k))
        block.emit(ast.Expr(cg.call("plgpu.barrier_wait", at)))
        loaded = block.bind(f"{name}_block", _load(in_smem[name], lay.computed_as(name)))
        if lay.stored_as(name) in (None, dtype):
            refs[loaded.id] = in_smem[name]
        env[name] = Value(loaded, tuple(a for a in dict(lay.flat.inputs)[name] if a not in lay.squeezed),
                          zero_padded=True)
    sizes = {a: size_of(a) for a in all_axes(lay)}
    scope = Scope(block, sizes, extents, offsets, lay.squeezed,
                  frozenset(a for a in all_axes(lay) if lay.may_pad(a)), dtype, None, batched_dot=False,
                  rounded=rounded_nodes(lay), exp2=True, wgmma=True, refs=refs)
    emit_before(lay, env, scope)
    if lay.stream is not None:
        finals = _emit_stream(lay, env, scope, in_refs, steps)
        emit_after(lay, env, scope, finals)
    for k, (out, t) in enumerate(zip(lay.flat.outputs, out_types, strict=True)):
        value = transpose_to(env[out], scope.keep(t))
        cast = cg.call(ast.Attribute(value, "astype", ast.Load()),
                       ast.Attribute(cg.name(out_smem[k]), "dtype", ast.Load()))
        block.emit(ast.Assign([ast.Subscript(cg.name(out_smem[k]), ast.Constant(Ellipsis), ast.Store())], cast,
                              lineno=0))
    block.emit(ast.Expr(cg.call("plgpu.commit_smem")))
    for k, t in enumerate(out_types):
        block.emit(ast.Expr(cg.call("plgpu.copy_smem_to_gmem", cg.name(out_smem[k]),
                                    _window(lay, out_refs[k], t, offsets))))
    block.emit(ast.Expr(cg.call("plgpu.wait_smem_to_gmem", cg.const(0))))
    scratch = [in_smem[n] for n in whole] + out_smem + ([barrier] if barrier else [])
    return cg.function(kname, [*in_refs, *out_refs, *scratch], block.stmts)


def _emit_stream(lay: Layout, env: dict[str, Value], scope: Scope, in_refs: Sequence[str],
                 steps: int) -> list[Value]:
    """The pipelines over the chunks of the streamed axis (module docstring); returns the states."""
    axis = lay.stream
    assert axis is not None
    block = scope.block
    namer = block.namer
    trips = cg.binop(extent_of(axis), "//", cg.const(lay.tiles[axis]))
    live = stream_runs(lay, scope.offsets, trips)
    pieces = ordered_runs(block, live) if live is not None else [((cg.const(0), trips), None)]
    streamed = [(name, t, ref) for (name, t), ref in zip(lay.flat.inputs, in_refs, strict=True) if axis in t]
    windows = [_window(lay, ref, t, scope.offsets) for _, t, ref in streamed]
    carry: ast.expr = emit_identity(lay, scope)
    runs: list[tuple[ast.expr, ast.expr, frozenset[str]]] = []
    for (lo, hi), full in pieces:  # each disjoint live range in order, its full chunks unmasked
        lo = lo if isinstance(lo, ast.Constant) else block.bind("first_chunk", lo)
        hi = hi if hi is trips else block.bind("end_chunk", hi)
        if full is None or live is None or live.full is None:
            runs.append((lo, hi, frozenset()))
            continue
        runs += [(a, b, live.unmasked if unmasked else frozenset())
                 for a, b, unmasked in cut_at_full(block, lo, hi, full, trips)]
    for start, stop, unmasked in runs:
        body = _emit_body(lay, env, scope, streamed, start, unmasked)
        specs: list[ast.expr] = []
        j = namer.fresh("j")
        for _, t, _ in streamed:
            index = [cg.binop(start, "+", cg.name(j)) if a == axis else cg.const(0) for a in t if a not in lay.squeezed]
            lam = ast.Lambda(ast.arguments(posonlyargs=[], args=[ast.arg(j)], vararg=None, kwonlyargs=[],
                                           kw_defaults=[], kwarg=None, defaults=[]), cg.tuple_(index))
            specs.append(cg.call("plgpu.BlockSpec", _block_shape(lay, t), lam))
        count = block.bind("chunks", cg.binop(stop, "-", start))
        pipeline = cg.call("plgpu.emit_pipeline", cg.name(body), keywords=[
            cg.kw("grid", cg.tuple_([count])), cg.kw("in_specs", ast.List(specs, ast.Load())),
            cg.kw("max_concurrent_steps", cg.const(steps)), cg.kw("init_carry", cg.name("carry"))])
        run = namer.fresh("run")
        runner = block.child()
        runner.emit(ast.Return(ast.Call(pipeline, list(windows), [])))
        block.emit(cg.function(run, ["carry"], runner.stmts))
        skip = ast.Lambda(ast.arguments(posonlyargs=[], args=[ast.arg("carry")], vararg=None, kwonlyargs=[],
                                        kw_defaults=[], kwarg=None, defaults=[]), cg.name("carry"))
        carry = block.bind("carry", cg.call("lax.cond", cg.binop(count, ">", cg.const(0)), cg.name(run), skip,
                                            carry))
    state = slots(lay, scope)
    finals = [namer.fresh(s.hint) for s in state]
    if finals:
        block.emit(cg.assign(finals, carry))
    return [Value(cg.name(n), s.axes) for n, s in zip(finals, state, strict=True)]


def _emit_body(lay: Layout, env: dict[str, Value], scope: Scope, streamed: Sequence[tuple[str, tuple[str, ...], str]],
               start: ast.expr, unmasked: frozenset[str]) -> str:
    """``def body(indices, *chunk_smem, carry)``: one chunk of the stream (``indices[0]`` counted
    from ``start``), the where nodes ``unmasked`` left out; returns its name."""
    axis = lay.stream
    assert axis is not None
    block = scope.block
    namer = block.namer
    body_name, indices, carry = namer.fresh("body"), namer.fresh("indices"), namer.fresh("carry")
    chunk_refs = [namer.fresh(f"{name}_chunk_smem") for name, _, _ in streamed]
    body = block.child()
    j = body.bind("chunk", cg.binop(start, "+", cg.subscript(cg.name(indices), cg.const(0))))
    at = body.bind(f"{axis}_first", cg.binop(j, "*", cg.const(lay.tiles[axis])))
    refs = dict(scope.refs)
    chunk_env = dict(env)
    for (name, t, _), ref in zip(streamed, chunk_refs, strict=True):
        value = body.bind(f"{name}_chunk", _load(ref, lay.computed_as(name)))
        if lay.stored_as(name) in (None, scope.dot_dtype):
            refs[value.id] = ref
        chunk_env[name] = Value(value, scope.keep(t), zero_padded=True)
    inner = scope.with_block(body, offsets={**scope.offsets, axis: at}, unmasked=unmasked, refs=refs)
    state = slots(lay, scope)
    names = [namer.fresh(s.hint) for s in state]
    if names:
        body.emit(cg.assign(names, cg.name(carry)))
    carried = [Value(cg.name(n), s.axes) for n, s in zip(names, state, strict=True)]
    updated = emit_step(lay, chunk_env, inner, carried)
    body.emit(ast.Return(cg.tuple_(updated)))
    block.emit(cg.function(body_name, [indices, *chunk_refs, carry], body.stmts))
    return body_name
