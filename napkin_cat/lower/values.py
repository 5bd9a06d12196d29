"""Emitted values and the scope they live in, shared by the op table and both targets.

A value being emitted is a ``Value``: a Python expression (usually a name) and the axis
names of its dimensions, in order.  Boxes broadcast by axis name, exactly as the
evaluator does: ``align`` transposes an operand and adds ``None`` dimensions.  ``Scope``
says what the surrounding code knows: true sizes, in-code extents, each axis's global
offset (a grid program's or a chunk's first position), axes squeezed out by the grid,
which axes may be padded, the dot dtype and the arrays a ``dtype`` step rounds.

Constants keep their value (``saturate``).  A box on constants alone is folded first, in
float64 by the evaluator itself (``jaxops.emit_node``), so ``A * (1e-39 * 1e38)`` multiplies
by 0.1.  A constant then becomes f32 code: a value in f32's normal range as itself (rounded
to f32 precision), ±inf as ±``INF`` = ``jnp.inf`` (an infinite constant is a value like any
other: ``log(inf)`` is inf; the online softmax of a row whose first chunk is fully masked does
not compute exp(-inf - -inf) = NaN because its running maximum is guarded, below, and padded
stream positions hold the padding law's finite fills, ``jaxops.mask_padded``), and the
accumulators' guards as their f32 stand-ins: ±``FLOAT_MAX`` (the guarded shift) as ±``BIG`` =
the f32 maximum, so that ``max(m, -BIG)`` is m for every finite f32 m as ``max(m, -FLOAT_MAX)``
is in float64 (a smaller stand-in turned a row whose scores all lie below it, finite inputs
given exactly, into a masked one: logsumexp -inf and softmax weights 0 where the evaluator's
are finite; the shifted score s - max(m, -BIG) is at most 0 since m is the running maximum), and
``TINY`` (the guarded divisor) as the smallest normal f32, so the guarded
stable forms keep their meaning (a fully masked row gives 0 from softmax, as in evaluate.py).
Any other value f32 cannot hold (beyond its maximum, or non-zero below its smallest normal,
which f32 kernels flush or lose precision on) is refused with ``lower.constant``: a kernel
would compute with another number.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from napkin_cat.certify.accumulators import FLOAT_MAX
from napkin_cat.certify.accumulators import TINY as GUARD_TINY
from napkin_cat.diagnostics import NapkinError, Span, error
from napkin_cat.lower import codegen as cg
from napkin_cat.terms import Axes, IndexExpr, Pred, fold_index, fold_pred

__all__ = ["BIG", "INF", "TINY", "Scope", "Value", "align", "count", "index_expr", "position", "positions",
           "predicate", "rounded", "saturate", "shape", "transpose_to"]

F32 = np.finfo(np.float32)
INF = math.inf
BIG = float(F32.max)
TINY = float(F32.tiny)


@dataclass(frozen=True)
class Value:
    """An emitted array: a Python expression and the names of its dimensions."""

    expr: ast.expr
    axes: Axes
    #: a Python number (a constant or a size), not yet a jax value
    python: bool = False
    #: an input block the wrapper zero-padded: its padded positions already hold 0
    zero_padded: bool = False
    #: a constant folded at lowering time: its exact (float64) value, as the evaluator has it
    constant: float | None = None
    #: an input left in memory (``datamask.gathered_tables``): ``expr`` names its Pallas ref, read
    #: only at the rows a gather names (``jaxops.gather``), as this jnp dtype (``Layout.computed_as``)
    ref: str | None = None


@dataclass(frozen=True)
class Scope:
    """What emitted code can refer to at one point of a kernel (see module docstring)."""

    block: cg.Block
    sizes: Mapping[str, ast.expr]
    extents: Mapping[str, ast.expr]
    offsets: Mapping[str, ast.expr] = field(default_factory=dict)
    squeezed: frozenset[str] = frozenset()
    padded: frozenset[str] = frozenset()
    dot_dtype: str = "float32"
    #: the name of a runtime variable holding the dtype that dot operands, once rounded to
    #: ``dot_dtype``, are computed in (f32 when interpreting Pallas or running plain JAX on CPU,
    #: where XLA:CPU has no bf16 x bf16 -> f32 dot for every layout; the products are the same,
    #: exact in f32) or None to dot in ``dot_dtype``
    dot_operand: str | None = None
    #: the backend's dot takes batch axes and several free or contracted axes per operand
    #: (XLA); False: 2-D operands only (the Triton backend), so multi-axis groups are merged
    batched_dot: bool = True
    #: intermediate arrays a ``dtype`` step stores in a narrower format: name -> jnp dtype
    rounded: Mapping[str, str] = field(default_factory=dict)
    #: exp as exp2(x·log2 e) (Pallas kernels: ``jaxops.unary``)
    exp2: bool = False
    #: the backend has a gather (XLA: ``jnp.take_along_axis``); False in Pallas kernels (the
    #: Triton backend has none), where ``gather`` selects and sums along its axis instead
    take: bool = True
    #: where nodes that hold on every position of this chunk (``skip.Runs.full``), and selects
    #: whose mask is nonzero there (a FULL chunk of a block mask, ``dataskip``): each is
    #: computed as its value operand
    unmasked: frozenset[str] = frozenset()
    #: a padded axis's whole padded extent (code), where the kernel is traced at its size: the
    #: masks of its padding are then left out when that size fills the extent (``jaxops.mask_padded``)
    pad_extents: Mapping[str, ast.expr] = field(default_factory=dict)
    #: a matrix product is ``wgmma(...)`` on tensor cores (the Mosaic GPU target, ``lower.mosaic``)
    wgmma: bool = False
    #: values that are a shared-memory block or chunk as loaded: value name -> its ref's name
    #: (``wgmma`` reads such an operand in place)
    refs: Mapping[str, str] = field(default_factory=dict)
    #: where ``wgmma`` records, per call, the base axes of each operand it stages into shared
    #: memory (one entry per call; ``lower.mosaic.smem_count`` counts them); None: not recorded
    staged: list[tuple[Axes, ...]] | None = None
    #: where an axis's padding starts when not at its true size (code): a ragged split block's end,
    #: min(size, the block's end), past which its whole chunks read the next block's positions
    #: (``lower.pallas``); masks compare positions with ``limit``, ``Size`` still reads ``sizes``
    limits: Mapping[str, ast.expr] = field(default_factory=dict)

    def limit(self, axis: str) -> ast.expr:
        """The first position along ``axis`` that this code treats as padding."""
        return self.limits.get(axis, self.sizes[axis])

    def keep(self, axes: Axes) -> Axes:
        """The axes an in-kernel value has: the type less the squeezed grid axes."""
        return tuple(a for a in axes if a not in self.squeezed)

    def with_block(self, block: cg.Block, **changes: object) -> Scope:
        return replace(self, block=block, **changes)  # type: ignore[arg-type]


#: the accumulators' guard constants and the f32 names that stand for them (module docstring)
GUARDS = {FLOAT_MAX: "BIG", -FLOAT_MAX: "BIG", GUARD_TINY: "TINY"}


def saturate(value: float, span: Span | None = None) -> ast.expr:
    """A constant as f32 code (see module docstring); raises ``NapkinError`` (pointing at
    ``span``) for a value f32 cannot hold that is neither infinite nor a guard."""
    if math.isinf(value):
        return cg.name("INF") if value > 0 else ast.UnaryOp(ast.USub(), cg.name("INF"))
    if value in GUARDS:
        return cg.name(GUARDS[value]) if value > 0 else ast.UnaryOp(ast.USub(), cg.name(GUARDS[value]))
    if abs(value) > float(F32.max) or (value != 0 and abs(value) < TINY):
        raise NapkinError(error("lower.constant", span, value=f"{value:g}", low=f"{TINY:.4g}", high=f"{F32.max:.4g}"))
    return cg.const(float(value))


# ---- shapes and positions ----------------------------------------------------------------


def align(value: Value, axes: Axes) -> ast.expr:
    """The value transposed and expanded to broadcast against ``axes`` (a superset)."""
    if not value.axes:
        return value.expr
    present = tuple(a for a in axes if a in value.axes)
    expr = value.expr
    if present != value.axes:
        perm = cg.tuple_([cg.const(value.axes.index(a)) for a in present])
        expr = cg.call("jnp.transpose", expr, perm)
    if len(present) < len(axes):
        index = [ast.Slice() if a in value.axes else cg.const(None) for a in axes]
        expr = cg.subscript(expr, index)
    return expr


def shape(axes: Axes, scope: Scope) -> ast.expr:
    return cg.tuple_([scope.extents[a] for a in axes])


def position(axis: str, axes: Axes, scope: Scope) -> ast.expr:
    """Global positions along ``axis`` as an int array shaped like ``axes`` (a scalar if squeezed)."""
    offset = scope.offsets.get(axis)
    if axis in scope.squeezed:
        assert offset is not None, axis
        return offset
    iota = cg.call("lax.broadcasted_iota", cg.attr("jnp.int32"), shape(axes, scope), cg.const(axes.index(axis)))
    return iota if offset is None else cg.binop(iota, "+", offset)


def index_expr(expr: IndexExpr, axes: Axes, scope: Scope) -> ast.expr:
    return fold_index(expr, lambda axis: position(axis, axes, scope), cg.const,
                      lambda op, left, right: cg.binop(left, op, right))


def predicate(pred: Pred, axes: Axes, scope: Scope) -> ast.expr:
    def logic(op: str, left: ast.expr, right: ast.expr | None) -> ast.expr:
        if right is None:
            return cg.call("jnp.logical_not", left)
        return cg.call("jnp.logical_and" if op == "and" else "jnp.logical_or", left, right)

    return fold_pred(pred, lambda op, a, b: cg.binop(index_expr(a, axes, scope), op, index_expr(b, axes, scope)),
                     logic)


def positions(axes: Axes, target: Axes) -> ast.expr:
    return cg.tuple_([cg.const(axes.index(a)) for a in target])


def count(target: Axes, scope: Scope) -> ast.expr:
    """The number of positions over the TRUE sizes of ``target`` (a float)."""
    total: ast.expr = cg.call("float", scope.sizes[target[0]])
    for a in target[1:]:
        total = cg.binop(total, "*", scope.sizes[a])
    return total


def rounded(expr: ast.expr, dtype: str) -> ast.expr:
    """``expr.astype(jnp.DTYPE).astype(jnp.float32)``: the value as the format stores it."""
    narrow = cg.call(ast.Attribute(expr, "astype", ast.Load()), cg.attr(f"jnp.{dtype}"))
    return cg.call(ast.Attribute(narrow, "astype", ast.Load()), cg.attr("jnp.float32"))


def transpose_to(value: Value, axes: Axes) -> ast.expr:
    """The value with exactly the axes ``axes`` in that order (a permutation)."""
    assert sorted(value.axes) == sorted(axes), (value.axes, axes)
    return align(value, axes)
