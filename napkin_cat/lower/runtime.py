"""Helpers every generated module needs at call time, copied into it verbatim.

The emitters put the source of these functions (via ``inspect``/``ast``) at the top of
each generated module, so a lowered kernel is one self-contained file that imports only
jax; they are ordinary functions here so they are tested once.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from napkin_cat.cost.launch import launch
from napkin_cat.schedule.layout import pow2_extent

__all__ = ["HELPERS", "argmax", "bind_sizes", "device_mesh", "erf", "helper_source", "index_range", "linrec",
           "linrec_rows", "live_chunks", "merge_tiles", "pad_to", "pair_kinds", "round_up", "shard", "split_tiles",
           "topk"]


def bind_sizes(arrays: Sequence[Any], signature: Sequence[tuple[str, tuple[str, ...]]],
               declared: Mapping[str, int], integers: Sequence[str] = ()) -> dict[str, int]:
    """Axis sizes from the inputs' shapes and the declared sizes; ValueError on a mismatch,
    TypeError for an input that is not real floating point (a complex input would lose its
    imaginary part, an integer one would be rounded in the kernel's dtype), or, for an input
    declared ``int`` (``integers``: ids, lengths, page tables, read as int32), neither integer
    nor real (a real array is converted as ``astype`` does: a fraction rounds toward zero)."""
    sizes = dict(declared)
    if len(arrays) != len(signature):
        raise ValueError(f"expected {len(signature)} inputs, got {len(arrays)}")
    for (name, axes), array in zip(signature, arrays, strict=True):
        kind = array.dtype if hasattr(array, "dtype") else jnp.asarray(array).dtype
        if name in integers:
            if not jnp.issubdtype(kind, jnp.integer) and not jnp.issubdtype(kind, jnp.floating):
                raise TypeError(f"input {name} is declared int but holds {kind} values; pass an integer array")
            # a concrete (numpy) array, read in its own dtype: int32 would wrap it (under jit, JAX converts
            # it at the boundary, before this sees it)
            if not isinstance(array, jax.Array) and hasattr(array, "min") and getattr(array, "size", 0) > 0:
                low, high = float(array.min()), float(array.max())
                if low < -2**31 or high >= 2**31:
                    raise ValueError(f"input {name} holds {low if low < -2**31 else high}, past int32, as which "
                                     "the kernel reads it (it would wrap)")
        elif not jnp.issubdtype(kind, jnp.floating):
            raise TypeError(f"input {name} holds {kind} values; this kernel takes real floating-point arrays")
        shape = tuple(jnp.shape(array))
        if len(shape) != len(axes):
            listed = " ".join(axes)
            raise ValueError(f"input {name} must have axes [{listed}], got an array of shape {shape}")
        for axis, size in zip(axes, shape, strict=True):
            if sizes.setdefault(axis, size) != size:
                raise ValueError(f"axis {axis} has size {sizes[axis]} but input {name} has {size} along it")
    return sizes


def index_range(sizes: Mapping[str, int], exprs: Sequence[tuple[str, Any]],
                padding: Mapping[str, int] | None = None) -> None:
    """ValueError where an index expression of the kernel may leave int32 at these sizes: each is
    ``(text, tree)``, a tree ``("pos", axis)``, ``("int", n)`` or ``(op, left, right)`` for ``+ - *``,
    every sub-expression bounded over the positions ``[0, |axis| - 1]``, or with ``padding`` (a
    kernel that pads its blocks, each axis's largest block) over ``[0, max(2·|axis|, |axis| +
    padding, 16) - 1]``, past every padded position, whose chunk bounds the kernel computes too.
    The kernel computes index arithmetic in int32 and the evaluator in int64, so past 2^31 they
    would part (``x * 65536 * 65536`` is 0 in int32 and 2^32 at x = 1 in int64)."""
    def span(tree: Any, text: str) -> tuple[int, int]:
        if tree[0] == "pos":
            size = sizes[tree[1]]
            lo, hi = 0, max(size if padding is None else max(2 * size, size + padding.get(tree[1], 0), 16), 1) - 1
        elif tree[0] == "int":
            lo = hi = tree[1]
        else:
            a, b = span(tree[1], text), span(tree[2], text)
            ends = ([x * y for x in a for y in b] if tree[0] == "*" else
                    [a[0] + b[0], a[1] + b[1]] if tree[0] == "+" else [a[0] - b[1], a[1] - b[0]])
            lo, hi = min(ends), max(ends)
        if lo < -2**31 or hi >= 2**31:
            raise ValueError(f"index expression {text} may reach {lo if lo < -2**31 else hi} at sizes {dict(sizes)}: "
                             "this kernel computes index arithmetic in int32, which wraps past 2^31 where the "
                             "evaluator's int64 does not")
        return lo, hi

    for text, tree in exprs:
        span(tree, text)


def round_up(size: int, tile: int) -> int:
    """The smallest positive multiple of ``tile`` that is at least ``size``: one tile for an
    empty axis (a kernel has at least one program and one chunk; its padding is masked and
    the outputs are sliced back to the empty axis)."""
    return max(1, -(-size // tile)) * tile


def pad_to(array: Any, extents: Sequence[int], dtype: Any) -> Any:
    """The array cast to ``dtype`` and zero-padded at the end of each axis to ``extents``."""
    array = jnp.asarray(array).astype(dtype)
    widths = [(0, extent - size) for extent, size in zip(extents, array.shape, strict=True)]
    return jnp.pad(array, widths) if any(w for _, w in widths) else array


def pair_kinds(kind: Callable[..., Any], shape: Sequence[int]) -> Any:
    """The block mask: ``kind(*program, chunk)`` (0 empty, 1 partial, 2 full; ``lower.dataskip``)
    of every pair of a grid of ``shape[:-1]`` programs and ``shape[-1]`` chunks, as an int32 array
    of ``shape``: one computation from the mask's integer inputs, before the kernel."""
    chunks = jnp.arange(shape[-1])
    if len(shape) == 1:  # one program
        return jax.vmap(kind)(chunks).astype(jnp.int32)
    ids = tuple(i.ravel() for i in jnp.meshgrid(*(jnp.arange(n) for n in shape[:-1]), indexing="ij"))
    # program by program (each its chunks at once): a block by a chunk per pair, one row in memory
    rows = jax.lax.map(lambda program: jax.vmap(lambda j: kind(*program, j))(chunks), ids)
    return rows.reshape(tuple(shape)).astype(jnp.int32)


def live_chunks(kinds: Any) -> tuple[Any, Any]:
    """Each program's live chunks from its kinds (the last axis): ``[count, c_1, .., c_count, ..]``,
    the chunks that are not empty in ascending order after their count, and ``[0, f_1, ..,
    f_count, ..]``, 1 where chunk ``c_k`` is full; int32, the last axis padded to a power of two
    of at least 16 (a Triton block)."""
    chunks = kinds.shape[-1]
    width = max(16, 1 << chunks.bit_length())  # > chunks: room for the count
    live = kinds > 0
    order = jnp.argsort(jnp.logical_not(live), axis=-1, stable=True).astype(jnp.int32)
    count = jnp.sum(live, axis=-1, keepdims=True, dtype=jnp.int32)
    full = (jnp.take_along_axis(kinds, order, axis=-1) == 2).astype(jnp.int32)
    widths = [(0, 0)] * (kinds.ndim - 1) + [(0, width - chunks - 1)]
    return (jnp.pad(jnp.concatenate([count, order], axis=-1), widths),
            jnp.pad(jnp.concatenate([jnp.zeros_like(count), full], axis=-1), widths))


def split_tiles(array: Any, axis: int, tile: int, block: int) -> Any:
    """Axis ``axis`` (a multiple of ``tile`` long) as (tiles, block): each tile zero-padded to a block."""
    shape = array.shape
    tiles = array.reshape((*shape[:axis], shape[axis] // tile, tile, *shape[axis + 1:]))
    widths = [(0, 0)] * tiles.ndim
    widths[axis + 1] = (0, block - tile)
    return jnp.pad(tiles, widths)


def merge_tiles(array: Any, axis: int, tile: int) -> Any:
    """The inverse of ``split_tiles``: drop each block's padding and join the tiles."""
    kept = array[(slice(None),) * (axis + 1) + (slice(0, tile),)]
    shape = kept.shape
    return kept.reshape((*shape[:axis], shape[axis] * tile, *shape[axis + 2:]))


def erf(x: Any) -> Any:
    """erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7, below f32 resolution near 1).

    The Triton backend lowers neither ``erf`` nor ``erfc`` (so not ``jax.nn.gelu``);
    this uses only exp, abs, sign and arithmetic, which every target lowers.
    """
    t = 1.0 / (1.0 + 0.3275911 * jnp.abs(x))
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return jnp.sign(x) * (1.0 - poly * jnp.exp(-x * x))


def linrec(a: Any, x: Any, axis: int) -> Any:
    """h[0] = x[0], h[t] = a[t]·h[t-1] + x[t] along ``axis`` (a and x of one shape): an
    associative scan of the pairs (a, x) under (a1, x1) ∘ (a2, x2) = (a1·a2, a2·x1 + x2) where
    every a[t] (t > 0) and x[t] is finite, else the recurrence in the evaluator's order (a
    ``lax.scan``).  The scan reassociates a2·(a1·h + x1) as (a1·a2)·h + a2·x1, which is not the
    same with infinities: at a masked a[t] = -inf it gave inf - inf = NaN where the recurrence
    gives ±inf (issue 28, red team rtdeep)."""
    def combine(first: Any, second: Any) -> Any:
        return first[0] * second[0], second[0] * first[1] + second[1]

    rows = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis)
    decay = jnp.where(rows > 0, a, 0.0)  # position 0's decay is never read: h[0] is x[0]

    def ordered(decay: Any, x: Any) -> Any:
        def step(h: Any, pair: Any) -> tuple[Any, Any]:
            h = pair[0] * h + pair[1]
            return h, h
        start = jnp.zeros(x.shape[:axis] + x.shape[axis + 1:], x.dtype)
        pairs = (jnp.moveaxis(decay, axis, 0), jnp.moveaxis(x, axis, 0))
        return jnp.moveaxis(jax.lax.scan(step, start, pairs)[1], 0, axis)

    def scanned(decay: Any, x: Any) -> Any:
        return jax.lax.associative_scan(combine, (decay, x), axis=axis)[1]

    finite = jnp.all(jnp.isfinite(decay)) & jnp.all(jnp.isfinite(x))
    return jax.lax.cond(finite, scanned, ordered, decay, x)


def linrec_rows(a: Any, x: Any, axis: int) -> Any:
    """``linrec`` for the Triton backend, which lowers no slice (so no ``associative_scan``): the
    recurrence one position at a time in a loop, each position's A and X picked and its h written
    by a select and a sum of zeros along ``axis`` (exact), in the evaluator's order.  h[0] is x[0]
    by definition, not a[0]·0 + x[0] (NaN where a[0] is ±inf): position 0's decay reads as 0."""
    rows = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis)

    def step(i: Any, carry: Any) -> Any:
        h, out = carry
        pick = rows == i
        decay = jnp.sum(jnp.where(pick & (rows > 0), a, 0.0), axis=axis)
        h = decay * h + jnp.sum(jnp.where(pick, x, 0.0), axis=axis)
        return h, jnp.where(pick, jnp.expand_dims(h, axis), out)

    start = jnp.zeros(x.shape[:axis] + x.shape[axis + 1:], x.dtype)
    return jax.lax.fori_loop(0, x.shape[axis], step, (start, jnp.zeros_like(x)))[1]


def argmax(x: Any, axis: int) -> Any:
    """The first position of the largest entry along ``axis`` (a NaN counts as the largest), as
    f32 (what masks and gathers read): a max, a compare and a min, which every target lowers."""
    rows = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis)
    nan = jnp.isnan(x)
    top = jnp.max(jnp.where(nan, jnp.inf, x), axis=axis, keepdims=True)
    any_nan = jnp.max(jnp.where(nan, 1.0, 0.0), axis=axis, keepdims=True) > 0.0
    hit = jnp.where(any_nan, nan, x == top)
    return jnp.min(jnp.where(hit, rows, x.shape[axis]), axis=axis).astype(jnp.float32)


def topk(x: Any, axis: int, count: int) -> Any:
    """The positions of the ``count`` largest entries along ``axis``, largest first, on a new axis
    of length ``count`` in its place (f32).  Position e's rank is the number of positions above it:
    a larger value (a NaN above every number) or an equal one (-0 = +0, NaN = NaN) at a smaller
    position, so ranks are 0..n-1 once each; output j is the position of rank j.  Quadratic in the
    axis (an expert axis: a few dozen), compares and sums only, which every target lowers."""
    mine, other = jnp.expand_dims(x, axis + 1), jnp.expand_dims(x, axis)  # [.. e 1 ..], [.. 1 e' ..]
    both = jnp.broadcast_shapes(mine.shape, other.shape)
    here = jax.lax.broadcasted_iota(jnp.int32, both, axis)
    there = jax.lax.broadcasted_iota(jnp.int32, both, axis + 1)
    nan_mine, nan_other = jnp.isnan(mine), jnp.isnan(other)
    above = (other > mine) | (nan_other & ~nan_mine)
    tied = ((other == mine) | (nan_other & nan_mine)) & (there < here)
    rank = jnp.sum(jnp.where(above | tied, 1, 0), axis=axis + 1)  # [.. e ..]
    ranks = jnp.expand_dims(rank, axis + 1)  # [.. e 1 ..]
    shape = (*ranks.shape[:axis + 1], count, *ranks.shape[axis + 2:])
    wanted = jax.lax.broadcasted_iota(jnp.int32, shape, axis + 1)
    places = jax.lax.broadcasted_iota(jnp.int32, shape, axis)
    return jnp.sum(jnp.where(ranks == wanted, places, 0), axis=axis).astype(jnp.float32)


def device_mesh(count: int) -> Any:
    """A one-axis mesh named ``mesh`` over the first ``count`` devices; ValueError if jax has fewer."""
    devices = jax.devices()
    if len(devices) < count:
        raise ValueError(f"the mesh needs {count} devices and jax has {len(devices)} ({jax.default_backend()}); on "
                         f"CPU, set XLA_FLAGS=--xla_force_host_platform_device_count={count} before jax starts")
    return jax.sharding.Mesh(devices[:count], ("mesh",))


def shard(array: Any, mesh: Any, axis: int | None, extent: int) -> Any:
    """The array on the devices of ``mesh`` (one axis): zero-padded at the end of axis ``axis``
    to ``extent`` (a multiple of the device count) and split along it, one block per device;
    with ``axis`` None, a copy on every device."""
    array = jnp.asarray(array)
    spec = [None] * array.ndim
    if axis is not None:
        widths = [(0, extent - size if k == axis else 0) for k, size in enumerate(array.shape)]
        array = jnp.pad(array, widths) if extent != array.shape[axis] else array
        spec[axis] = mesh.axis_names[0]
    return jax.device_put(array, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec)))


HELPERS: dict[str, Callable[..., Any]] = {
    "bind_sizes": bind_sizes, "round_up": round_up, "pow2_extent": pow2_extent, "pad_to": pad_to, "erf": erf,
    "linrec": linrec, "linrec_rows": linrec_rows, "split_tiles": split_tiles, "merge_tiles": merge_tiles,
    "device_mesh": device_mesh, "shard": shard, "launch": launch, "argmax": argmax, "topk": topk,
    "pair_kinds": pair_kinds, "live_chunks": live_chunks, "index_range": index_range,
}


def helper_source(names: Sequence[str]) -> list[ast.stmt]:
    """The definitions of the named helpers, annotations dropped, as statements."""
    out: list[ast.stmt] = []
    for helper in names:
        tree = ast.parse(inspect.getsource(HELPERS[helper]))
        fn = tree.body[0]
        assert isinstance(fn, ast.FunctionDef)
        for each in (n for n in ast.walk(fn) if isinstance(n, ast.FunctionDef)):  # nested ones too
            each.returns = None
            for arg in each.args.args:
                arg.annotation = None
        out.append(fn)
    return out
