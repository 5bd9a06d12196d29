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
  is not run (``lax.cond``); a mask read from data skips nothing here (the pipeline's chunk
  indices come from its step, not from a block mask, ``lower.dataskip``): every chunk runs
  with its masks, exact but unskipped;
- every two-operand contraction that is a matrix product is ``plgpu.wgmma`` into a register
  accumulator (``plgpu.ACC``, f32): an operand that is a chunk or block in shared memory as
  loaded is read from there, any other value is staged into shared memory first;
- outputs are written to shared memory and copied out by TMA (``plgpu.copy_smem_to_gmem``), each in
  the dtype the Pallas target stores it in (``Layout.output_dtype``: an integer-valued output, such as
  a count of compares, in float32, where bf16 rounded 598 to 600);
- exp is exp2 with log2(e) folded in, as on the Triton path;
- shared memory is counted as Mosaic GPU counts it (``SmemCount``, ``smem_count``): before it
  launches, the kernel takes the deepest pipeline (at most ``max_concurrent_steps``) whose count
  at its sizes fits the profile's ``smem`` level, or raises a ValueError naming the bytes.

What Mosaic GPU cannot express is refused before anything is emitted (``lower.mosaic``): f32
kernels (wgmma has no IEEE f32), a split (its per-block states), a table read only at the rows a
gather names (a paged pool: TMA copies whole blocks), a selection, ``floor`` (no Mosaic GPU
lowering rule in jax), a tile padded to a block, an
output written chunk by chunk, a scalar input or one whose last axis is one position per
program (TMA's 16-byte minimum), a kernel with no matrix product (nothing anchors Mosaic's
register layouts), tiles off the machine model (``check_tiles``:
wgmma ``m`` a multiple of 64, TMA boxes of at most 256 per dimension), and tiles whose kernel
overflows shared memory at any size (one buffer deep, whole axes at their least extent).
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from napkin_cat import ops
from napkin_cat.cost import hardware as hw
from napkin_cat.diagnostics import NapkinError, error
from napkin_cat.lower import codegen as cg
from napkin_cat.lower.fold import emit_after, emit_before, emit_identity, emit_step, slots
from napkin_cat.lower.jax import all_axes, bind_inputs, rounded_nodes, size_of
from napkin_cat.lower.pallas import extent_of, padded_extent
from napkin_cat.lower.runtime import pow2_extent, round_up
from napkin_cat.lower.skip import cut_at_full, ordered_runs, stream_runs
from napkin_cat.lower.values import Scope, Value, transpose_to
from napkin_cat.schedule.datamask import gathered_tables
from napkin_cat.schedule.layout import FORMATS, MIN_BLOCK, Layout
from napkin_cat.terms import Box

__all__ = ["MOSAIC_STEPS", "WGMMA_SOURCE", "SmemCount", "check_tiles", "emit_function", "extents_at", "fits_smem",
           "least_extents", "mosaic_rules", "smem_count"]

#: TMA copies in flight per streamed input (``emit_pipeline``'s ``max_concurrent_steps``) when
#: the profile's [mosaic] table gives none
MOSAIC_STEPS = 2

#: Mosaic GPU's shared-memory accounting (jax 0.11.2, ``jax._src.pallas.mosaic_gpu.lowering``'s
#: resource estimator): every allocation rounded up to ``SMEM_ALIGN`` bytes (``SMEM_ALIGNMENT``),
#: each reduction's cross-warp scratch (``CompilerParams.reduction_scratch_bytes``' default,
#: 128 * 4 * 4), and ``BARRIER_BYTES`` per mbarrier (``mosaic.gpu.utils.MBARRIER_BYTES``)
SMEM_ALIGN = 1024
REDUCTION_SCRATCH = 2048
BARRIER_BYTES = 8

#: bytes per value of each jnp dtype a kernel stores
_BYTES = {name: hw.bytes_per_value(kind) for kind, name in FORMATS.items() if kind != "tf32"} | {
    hw.INT_DTYPE: hw.INT_BYTES}

#: the reductions Mosaic GPU gives a cross-warp scratch (``_reduce_resource_estimator``)
_REDUCTIONS = frozenset({"jnp.sum", "jnp.max", "jnp.min"})

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


#: elementwise boxes jax's Mosaic GPU backend has no lowering rule for
_NO_MOSAIC = frozenset({"floor"})


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
    selections = sorted({n.expr.op for n in lay.flat.nodes
                         if isinstance(n.expr, Box) and ops.OPS[n.expr.op].kind == "topk"})
    if selections:
        raise refuse(f"a selection ({', '.join(selections)}: ranks by compares over a three-axis broadcast) is not "
                     "lowered for Mosaic GPU; use --target pallas or jax")
    if any(isinstance(n.expr, Box) and n.expr.op in _NO_MOSAIC for n in lay.flat.nodes):
        raise refuse(f"{', '.join(sorted(_NO_MOSAIC))} has no Mosaic GPU lowering in jax; use --target pallas or jax")
    for node in lay.flat.nodes:  # wgmma takes matrices: a product's free axes are not merged and split back
        product = node.expr
        if isinstance(product, Box) and ops.OPS[product.op].kind == "contract" and len(product.args) == 2:
            a, b = (tuple(x for x in arg.axes if x not in lay.squeezed and x not in product.target)
                    for arg in product.args)
            wide = next((f for f in (tuple(x for x in a if x not in b), tuple(x for x in b if x not in a))
                         if len(f) > 1), None)
            if wide is not None:
                raise refuse(f"the matrix product `{node.name}` has several free axes on one operand "
                             f"({' '.join(wide)}): wgmma's result is not split back into them; use --target pallas")
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


@dataclass(frozen=True)
class SmemCount:
    """The shared memory one program of a Mosaic GPU kernel allocates, in bytes, counted as
    Mosaic GPU counts it (``SMEM_ALIGN``, ``REDUCTION_SCRATCH``, ``BARRIER_BYTES``) over what
    ``emit_function`` allocates: the kernel's scratch (each TMA'd whole block, each output's
    staging buffer) and its barriers, plus the larger of what is scoped beside the pipelines (the
    operands a ``wgmma`` stages, a reduction's scratch) and one pipeline (``steps`` buffers per
    streamed input and their barriers, plus the largest scoped in its body).

    ``code`` is that count as an expression of the padded extents ``p`` and ``steps``: the
    emitted kernel evaluates it before it launches (module docstring) and ``at`` evaluates the
    same expression here.  A static pipeline of fewer chunks than ``steps`` is shrunk by
    ``emit_pipeline``, so there the count is an upper bound; elsewhere it is Mosaic GPU's."""

    code: ast.expr
    #: the count's parts, for messages: (what, bytes per value, axes)
    parts: tuple[tuple[str, int, tuple[str, ...]], ...]

    def at(self, extents: Mapping[str, int], steps: int) -> int:
        """The count at these padded extents (``p``) with ``steps`` buffers per streamed input."""
        code = compile(ast.fix_missing_locations(ast.Expression(self.code)), "<smem>", "eval")
        return int(eval(code, {"__builtins__": {"max": max}, "round_up": round_up},  # napkin's own code
                        {"p": dict(extents), "steps": steps}))


def smem_count(lay: Layout, dtype: str) -> SmemCount:
    """The shared memory ``lay``'s Mosaic GPU kernel allocates (``SmemCount``), from emitting it."""
    namer = cg.Namer()
    params = [namer.fresh(p) for p, _ in lay.flat.inputs]
    whole = [name for name, t in lay.flat.inputs if lay.stream not in t]
    return _emit_kernel(lay, params, whole, dtype, namer, cg.name("steps"))[1]


def fits_smem(place: Callable[[], Layout], dtype: str, capacity: int, steps: int) -> bool:
    """Whether the layout ``place`` builds is one whose kernel fits ``capacity`` bytes of shared
    memory ``steps`` pipeline buffers deep with every whole axis at its least extent (the
    default tiles: the cost model prices a pipeline that overlaps its copies with compute);
    False for one napkin refuses to place or emit."""
    try:
        lay = place()
        return smem_count(lay, dtype).at(least_extents(lay), steps) <= capacity
    except NapkinError:
        return False


def least_extents(lay: Layout) -> dict[str, int]:
    """The smallest padded extent each axis of ``lay`` can have (``p`` at the smallest sizes): a
    grouped or streamed axis one tile, a whole axis its declared size padded, or ``MIN_BLOCK``."""
    least: dict[str, int] = {}
    for axis in all_axes(lay):
        size = lay.declared(axis)
        if axis in lay.squeezed:
            least[axis] = round_up(size or 1, STRIDE_ALIGN)
        elif lay.kind(axis) in ("grid", "stream"):
            least[axis] = round_up(size or 1, lay.tiles[axis])
        else:
            least[axis] = pow2_extent(size or 1, MIN_BLOCK)
    return least


def extents_at(lay: Layout, sizes: Mapping[str, int]) -> dict[str, int]:
    """``p``, the padded extents the emitted kernel computes for these axis sizes."""
    code = compile(ast.fix_missing_locations(ast.Expression(_extents(lay))), "<extents>", "eval")
    return dict(eval(code, {"__builtins__": {}, "round_up": round_up, "pow2_extent": pow2_extent},
                     {"n": dict(sizes)}))


def _extents(lay: Layout) -> ast.Dict:
    """``p``: every axis's padded extent (squeezed axes to a multiple of STRIDE_ALIGN: TMA needs
    16-byte strides; the padding is never read, one program per true position)."""
    return cg.dict_([(a, cg.call("round_up", size_of(a), cg.const(STRIDE_ALIGN))
                      if a in lay.squeezed else padded_extent(lay, a)) for a in all_axes(lay)])


def _check_smem(lay: Layout, count: SmemCount, capacity: int) -> None:
    """Refuse (``lower.mosaic``) tiles whose kernel overflows shared memory at any size: one
    pipeline buffer, every whole axis at its least extent."""
    least = least_extents(lay)
    need = count.at(least, 1)
    if need <= capacity:
        return
    parts = "; ".join(f"{what} {' x '.join(str(least[a]) for a in axes) or '1'} x {size} B"
                      for what, size, axes in count.parts)
    tiles = ", ".join(f"{a}={lay.tiles[a]}" for a in (*lay.grid, *((lay.stream,) if lay.stream else ()))
                      if a not in lay.squeezed)
    raise NapkinError(error("lower.mosaic", name=lay.name, reason=(
        f"at tiles {tiles} a program needs at least {need} bytes of shared memory ({parts}; each rounded up to "
        f"{SMEM_ALIGN} B; one pipeline buffer, whole axes at their least extent), more than the {capacity} per "
        "block of the hardware profile's [levels.smem]; give smaller tiles")))


def emit_function(lay: Layout, fname: str, params: Sequence[str], doc: str, dtype: str,
                  namer: cg.Namer, rules: Mapping[str, int] | None = None,
                  smem_capacity: int | None = None) -> ast.FunctionDef:
    """``def fname(*inputs, interpret=None)``: pad, one ``plgpu.kernel``, slice back.
    ``interpret`` None runs Mosaic GPU's interpreter (``plgpu.InterpretGPUParams``) off a GPU.
    With ``smem_capacity`` (bytes per block), tiles that overflow it at any size are refused
    here, and the kernel picks its pipeline depth, the most of ``max_concurrent_steps`` down to
    one whose ``SmemCount`` fits, or raises a ValueError before it lowers."""
    rules = rules or {}
    if dtype == "float32":
        raise NapkinError(error("lower.mosaic", name=lay.name, reason="an f32 kernel: wgmma multiplies f16/bf16 "
                                "(f32 only as TF32); lower with --dtype bf16 or f16, or use --target pallas"))
    check_tiles(lay, rules)
    block = cg.Block(namer)
    auto = cg.binop(cg.call("jax.default_backend"), "!=", cg.const("gpu"))
    block.emit(ast.If(cg.binop(cg.name("interpret"), "is", cg.const(None)), [cg.assign("interpret", auto)], []))
    bind_inputs(lay, params, block)
    block.emit(cg.assign("p", _extents(lay)))
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
    stored_outputs = [cg.attr(f"jnp.{lay.output_dtype(k, dtype)}") for k in range(len(out_types))]
    scratch += [cg.call("plgpu.SMEM", _block_shape(lay, t), stored) for t, stored in zip(out_types, stored_outputs,
                                                                                        strict=True)]
    if whole:
        scratch.append(cg.call("plgpu.Barrier", keywords=[cg.kw("num_barriers", cg.const(len(whole)))]))
    deepest = int(rules.get("max_concurrent_steps", MOSAIC_STEPS))
    steps = namer.fresh("steps") if smem_capacity is not None else None
    kernel, count = _emit_kernel(lay, params, whole, dtype, namer,
                                 cg.name(steps) if steps else cg.const(deepest))
    if not any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "wgmma"
               for n in ast.walk(kernel)):
        raise NapkinError(error("lower.mosaic", name=lay.name, reason="no matrix product for wgmma: Mosaic GPU "
                                "infers register layouts from its wgmma accumulators, and without one jax 0.11.2's "
                                "inference fails (after minutes, on cross_entropy_forward); use --target pallas"))
    if steps is not None and smem_capacity is not None:
        _check_smem(lay, count, smem_capacity)
        _emit_depth(lay, block, count, steps, deepest, smem_capacity)
    block.emit(kernel)
    shapes: list[ast.expr] = [cg.call("jax.ShapeDtypeStruct", cg.tuple_([extent_of(a) for a in t]), stored)
                              for t, stored in zip(out_types, stored_outputs, strict=True)]
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


def _emit_depth(lay: Layout, block: cg.Block, count: SmemCount, steps: str, deepest: int, capacity: int) -> None:
    """``steps``: the deepest pipeline of at most ``deepest`` buffers whose shared memory
    (``count``, at this call's extents) fits ``capacity``; else a ValueError naming the bytes."""
    smem = block.namer.fresh("smem_bytes")
    body: list[ast.stmt] = [ast.Return(count.code)]
    block.emit(cg.function(smem, ["steps"], body, "Shared memory per block with `steps` pipeline buffers "
                           "(napkin_cat.lower.mosaic.SmemCount)."))
    s = block.namer.fresh("s")
    depths = cg.call("range", cg.const(deepest), cg.const(0), cg.const(-1))
    fits = ast.GeneratorExp(cg.name(s), [ast.comprehension(ast.Name(s, ast.Store()), depths,
                                                           [cg.binop(cg.call(smem, cg.name(s)), "<=",
                                                                     cg.const(capacity))], 0)])
    block.emit(cg.assign(steps, cg.call("next", fits, cg.const(0))))
    message = cg.call(ast.Attribute(cg.const(
        f"`{lay.name}` cannot be lowered for Mosaic GPU at sizes {{}}: a program needs {{}} bytes of shared memory "
        f"(one pipeline buffer), more than the {capacity} per block of the hardware profile; give smaller sizes "
        "or tiles, or use --target pallas"), "format", ast.Load()), cg.name("n"), cg.call(smem, cg.const(1)))
    block.emit(ast.If(cg.binop(cg.name(steps), "==", cg.const(0)),
                      [ast.Raise(cg.call("ValueError", message), None)], []))


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
                 steps: ast.expr) -> tuple[ast.FunctionDef, SmemCount]:
    """The kernel body: grid offsets, TMA'd blocks, the phases, the pipelined stream (``steps``
    buffers deep), stores; and the shared memory it allocates."""
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
                  rounded=rounded_nodes(lay), exp2=True, wgmma=True, refs=refs, staged=[])
    bodies: dict[str, list[tuple[tuple[str, ...], ...]]] = {}
    emit_before(lay, env, scope)
    if lay.stream is not None:
        finals = _emit_stream(lay, env, scope, in_refs, steps, bodies)
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
    kernel = cg.function(kname, [*in_refs, *out_refs, *scratch], block.stmts)
    assert scope.staged is not None
    return kernel, _smem(lay, dtype, whole, extents, kernel, scope.staged, bodies)


def _smem(lay: Layout, dtype: str, whole: Sequence[str], extents: Mapping[str, ast.expr], kernel: ast.FunctionDef,
          staged: Sequence[tuple[tuple[str, ...], ...]],
          bodies: Mapping[str, Sequence[tuple[tuple[str, ...], ...]]]) -> SmemCount:
    """``SmemCount`` of the emitted ``kernel``: its scratch (as ``emit_function`` declares it),
    the operands its wgmma calls stage (``staged`` at kernel level, ``bodies`` per pipeline body
    by name) and its reductions."""
    parts: list[tuple[str, int, tuple[str, ...]]] = []

    def alloc(what: str, size: int, axes: Sequence[str], times: ast.expr | None = None) -> ast.expr:
        kept = tuple(a for a in axes if a not in lay.squeezed)
        parts.append((what, size, kept))
        total: ast.expr = cg.const(size)
        for a in kept:
            total = cg.binop(total, "*", extents[a])
        return cg.call("round_up", total if times is None else cg.binop(times, "*", total), cg.const(SMEM_ALIGN))

    def added(terms: Sequence[ast.expr]) -> ast.expr:
        total = terms[0] if terms else cg.const(0)
        for term in terms[1:]:
            total = cg.binop(total, "+", term)
        return total

    def largest(terms: Sequence[ast.expr]) -> ast.expr:
        return cg.call("max", *terms) if len(terms) > 1 else terms[0] if terms else cg.const(0)

    def scoped(calls: Sequence[tuple[tuple[str, ...], ...]], region: Sequence[ast.AST], what: str) -> list[ast.expr]:
        terms = [added([alloc(f"{what} staged wgmma operand", _BYTES[dtype], axes) for axes in call])
                 for call in calls if call]
        if any(isinstance(n, ast.Call) and ast.unparse(n.func) in _REDUCTIONS for node in region
               for n in _walk_here(node)):
            terms.append(cg.const(REDUCTION_SCRATCH))
        return terms

    types = dict(lay.flat.inputs)
    scratch = [alloc(f"block of {name}", _BYTES[lay.stored_as(name) or dtype], types[name]) for name in whole]
    scratch += [alloc(f"output {k} staging", _BYTES[lay.output_dtype(k, dtype)], t)
                for k, t in enumerate(lay.diagram.out_types)]
    steps = cg.name("steps")
    streamed = [(name, t) for name, t in lay.flat.inputs if lay.stream is not None and lay.stream in t]
    buffers = [alloc(f"pipeline buffer of {name} (x steps)", _BYTES[lay.stored_as(name) or dtype], t, steps)
               for name, t in streamed]
    functions = {f.name: f for f in ast.walk(kernel) if isinstance(f, ast.FunctionDef)}
    body_terms = [t for name, calls in bodies.items() for t in scoped(calls, functions[name].body, "body")]
    pipeline = [added([*buffers, largest(body_terms)])] if bodies else []
    beside = largest([*scoped(staged, kernel.body, "kernel-level"), *pipeline])
    barriers = cg.binop(cg.const(BARRIER_BYTES), "*", added(
        [cg.const(len(whole)), *([steps] if bodies and streamed else [])]))
    return SmemCount(added([*scratch, beside, barriers]), tuple(parts))


def _walk_here(node: ast.AST) -> list[ast.AST]:
    """``node`` and what it contains, not looking into the functions it defines (each is a
    scope of its own: a pipeline's body, a ``run`` under ``lax.cond``)."""
    if isinstance(node, ast.FunctionDef):
        return []
    return [node, *(n for child in ast.iter_child_nodes(node) for n in _walk_here(child))]


def _emit_stream(lay: Layout, env: dict[str, Value], scope: Scope, in_refs: Sequence[str], steps: ast.expr,
                 bodies: dict[str, list[tuple[tuple[str, ...], ...]]]) -> list[Value]:
    """The pipelines over the chunks of the streamed axis (module docstring), ``steps`` buffers
    deep; returns the states, and records in ``bodies`` what each body's wgmma calls stage."""
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
        staged: list[tuple[tuple[str, ...], ...]] = []
        body = _emit_body(lay, env, scope.with_block(block, staged=staged), streamed, start, unmasked)
        bodies[body] = staged
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
            cg.kw("max_concurrent_steps", steps), cg.kw("init_carry", cg.name("carry"))])
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
