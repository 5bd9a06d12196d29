"""The op table: every box of ``ops.OPS`` as ``jax.numpy`` code, shared by both targets.

Each emitter takes a box and its emitted operands (``values.Value``: an expression and
its axis names), aligns them by name exactly as the evaluator broadcasts, and returns
the result with its axes.  ``emit_node``/``emit_diagram`` bind results to names, so an
accumulator's lift/combine/final diagrams lower through the same table as any box.

Numerics (documented conventions, identical in both targets):

- all arithmetic is f32; contractions use ``jnp.einsum`` on operands cast to the
  kernel's dot dtype with ``preferred_element_type=float32`` (f32 accumulation);
- in Pallas kernels exp(x) is computed as exp2(x·log2 e) (``unary``; Triton's exp2 is the
  hardware's base-2 exponential, its exp libdevice's expf): within a few f32 ulps times
  |x|·log2 e, exact at 0 and ±inf (|x| ≤ 104 where the result is neither 0 nor inf);
  exp(a - b) as exp2((a - b)·log2 e), the difference first: within a few ulps times
  |a - b|·log2 e whatever |a| and |b| are (exp2(a·log2 e - b·log2 e), FlashAttention's
  one-FMA form, rounds b·log2 e: an error of ulp(|b|·log2 e) in the exponent, 9% at
  |b| = 10⁶), 0 where a = -inf and b is finite;
- a box on constants alone is folded in float64 first (``folded``), and constants keep
  their value in f32 or are refused (``values.saturate``): ±inf stay infinite and
  the guarded stable forms keep their meaning;
- a box that consumes or mixes an axis that may be padded first replaces the padded
  positions of its operands by fill values whose contribution is neutral
  (``schedule.layout.fill_values``: the accumulator's ``pad``, or -inf for softmax, 0 for l2/rms norms).
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Mapping, Sequence

from napkin_cat import ops
from napkin_cat.certify.accumulators import DEGREE, NORMALISER_DEGREE
from napkin_cat.evaluate import evaluate_named
from napkin_cat.lower import codegen as cg
from napkin_cat.lower.values import (
    Scope,
    Value,
    align,
    count,
    index_expr,
    position,
    positions,
    predicate,
    rounded,
    saturate,
    shape,
    transpose_to,
)
from napkin_cat.schedule.layout import fill_values
from napkin_cat.schedule.loopnest import flatten
from napkin_cat.terms import Axes, Box, Const, Diagram, Expr, IBin, Idx, IInt, IndexExpr, Size, Var

__all__ = ["BINARY", "LOG2E", "TABLE", "UNARY", "argument", "emit_box", "emit_diagram", "emit_node", "last",
           "mask_padded", "started", "unary"]


# ---- the table ------------------------------------------------------------------------------

UNARY: dict[str, Callable[[ast.expr], ast.expr]] = {
    "exp": lambda x: cg.call("jnp.exp", x),
    "log": lambda x: cg.call("jnp.log", x),
    "neg": lambda x: ast.UnaryOp(ast.USub(), x),
    "sqrt": lambda x: cg.call("jnp.sqrt", x),
    "rsqrt": lambda x: cg.call("lax.rsqrt", x),
    "recip": lambda x: cg.binop(cg.const(1.0), "/", x),
    "square": lambda x: cg.binop(x, "*", x),
    "abs": lambda x: cg.call("jnp.abs", x),
    "tanh": lambda x: cg.call("jnp.tanh", x),
    "sigmoid": lambda x: cg.call("jax.nn.sigmoid", x),
    "relu": lambda x: cg.call("jnp.maximum", x, cg.const(0.0)),
    # the exact (erf) form with the module's polynomial erf (runtime.erf): Triton lowers no erf
    "gelu": lambda x: cg.binop(cg.binop(cg.const(0.5), "*", x), "*", cg.binop(
        cg.const(1.0), "+", cg.call("erf", cg.binop(x, "*", cg.const(0.7071067811865476))))),
    "silu": lambda x: cg.call("jax.nn.silu", x),
    "sign": lambda x: cg.call("jnp.sign", x),
    "floor": lambda x: cg.call("jnp.floor", x),
    "id": lambda x: x,
}

BINARY: dict[str, Callable[[ast.expr, ast.expr], ast.expr]] = {
    "add": lambda a, b: cg.binop(a, "+", b),
    "sub": lambda a, b: cg.binop(a, "-", b),
    "mul": lambda a, b: cg.binop(a, "*", b),
    "div": lambda a, b: cg.binop(a, "/", b),
    "maximum": lambda a, b: cg.call("jnp.maximum", a, b),
    "minimum": lambda a, b: cg.call("jnp.minimum", a, b),
}

#: log2(e): ``exp`` in a Pallas kernel is exp2(x·log2 e) (module docstring)
LOG2E = 1.4426950408889634


def unary(op: str, x: ast.expr, scope: Scope) -> ast.expr:
    """``op`` applied to ``x``: the table's code, except exp as exp2(x·log2 e) where
    ``scope.exp2`` (one multiply and the hardware's base-2 exponential instead of libdevice's
    expf, about six FMAs per value).  exp(a - b) is exp2((a - b)·log2 e), the difference
    first (module docstring): the exponent's error is relative to |a - b|, not |a| + |b|."""
    if op == "exp" and scope.exp2:
        return cg.call("jnp.exp2", cg.binop(x, "*", cg.const(LOG2E)))
    return UNARY[op](x)


def _unary(box: Box, args: Sequence[Value], scope: Scope) -> Value:
    (x,) = args
    return Value(unary(box.op, x.expr, scope), x.axes)


def _binary(box: Box, args: Sequence[Value], scope: Scope) -> Value:
    a, b = args
    axes = tuple(dict.fromkeys(a.axes + b.axes))
    left, right = align(a, axes), align(b, axes)
    return Value(BINARY[box.op](left, right), axes)


def _reduce(box: Box, args: Sequence[Value], scope: Scope) -> Value:
    (x,) = args
    target = scope.keep(box.target)
    out = tuple(a for a in x.axes if a not in target)
    where = positions(x.axes, target)
    axis_kw = [cg.kw("axis", where)]
    if box.op == "logsumexp":
        shift = _shift(x, where, scope)
        total = cg.call("jnp.sum", unary("exp", cg.binop(x.expr, "-", shift), scope),
                        keywords=axis_kw)
        rows = cg.call("jnp.max", shift, keywords=axis_kw) if scope.wgmma else cg.call("jnp.squeeze", shift, where)
        return Value(cg.binop(rows, "+", cg.call("jnp.log", total)), out)
    if box.op == "mean":
        return Value(cg.binop(cg.call("jnp.sum", x.expr, keywords=axis_kw), "/", count(box.target, scope)), out)
    if box.op == "prod":  # a row of finite entries holding a zero is a signed zero: its other entries
        # multiply as their signs, so no f32 partial product overflows to inf and meets the 0 (NaN at
        # entries of 1e4 where the evaluator's product is 0)
        def every(test: ast.expr) -> ast.expr:
            return _kept_dims(cg.call("jnp.all", test, keywords=axis_kw), x, where, scope)
        zero = cg.binop(x.expr, "==", cg.const(0.0))
        zeroed = cg.binop(cg.call("jnp.logical_not", every(cg.call("jnp.logical_not", zero))), "&",
                          every(cg.call("jnp.isfinite", x.expr)))
        signs = cg.call("jnp.where", zero, x.expr, cg.call("jnp.sign", x.expr))
        product = cg.call("jnp.where", zeroed, signs, x.expr)
        return Value(cg.call("jnp.prod", product, keywords=axis_kw), out)
    return Value(cg.call(f"jnp.{box.op}", x.expr, keywords=axis_kw), out)


def _scan(box: Box, args: Sequence[Value], scope: Scope) -> Value:
    """``cumsum`` as ``jnp.cumsum``; ``linrec`` as the module's ``linrec`` helper (runtime.linrec:
    an associative scan of the pairs (A, X)), or for the Triton backend (``Scope.batched_dot``
    False), which lowers no slice, ``linrec_rows`` (a loop over positions); along the named axis."""
    axes = tuple(dict.fromkeys(a for v in args for a in v.axes))
    where = cg.const(axes.index(box.target[0]))
    if box.op == "cumsum":
        return Value(cg.call("jnp.cumsum", align(args[0], axes), keywords=[cg.kw("axis", where)]), axes)
    decay, x = args
    full = shape(axes, scope)
    helper = "linrec" if scope.batched_dot else "linrec_rows"
    return Value(cg.call(helper, cg.call("jnp.broadcast_to", align(decay, axes), full),
                         cg.call("jnp.broadcast_to", align(x, axes), full), where), axes)


def _first_rows(axes: Axes, axis: str, scope: Scope) -> ast.expr:
    """The chunk's local positions along ``axis`` as an int array shaped like ``axes``."""
    return cg.call("lax.broadcasted_iota", cg.attr("jnp.int32"), shape(axes, scope), cg.const(axes.index(axis)))


def started(box: Box, args: Sequence[Value], carry: Value, scope: Scope) -> Value:
    """A scan's X on a chunk, started from ``carry`` (its value just before the chunk): X plus
    A·carry (cumsum: carry) at the chunk's first position, by the recurrence's definition
    (``kernel.group``'s scan); a select, so the other positions are X exactly (a zero's sign kept).  The first chunk
    takes nothing: h[0] is X[0] by definition, where A[0]·0 would be NaN for an A[0] of ±inf or NaN."""
    (axis,) = box.target
    x = args[-1]
    push = carry
    if box.op == "linrec":
        both = tuple(dict.fromkeys(args[0].axes + carry.axes))
        push = Value(cg.binop(align(args[0], both), "*", align(carry, both)), both)
    axes = tuple(dict.fromkeys(x.axes + push.axes))
    first = cg.binop(_first_rows(axes, axis, scope), "==", cg.const(0))
    first = cg.binop(first, "&", cg.binop(scope.offsets[axis], ">", cg.const(0)))
    # the other positions are X itself, not X + 0.0 (which turns X's -0.0 into +0.0, where the evaluator's
    # h[0] = X[0] keeps it: recip of a running sum was +inf where the evaluator says -inf)
    return Value(cg.call("jnp.where", first, cg.binop(align(x, axes), "+", align(push, axes)), align(x, axes)), axes)


def last(value: Value, axis: str, scope: Scope) -> Value:
    """``value`` at the chunk's last real position along ``axis`` (the padded ones follow it), the
    axis dropped: a select and a sum of zeros, which every target lowers."""
    valid = cg.binop(scope.limit(axis), "-", scope.offsets[axis]) if axis in scope.offsets else scope.limit(axis)
    end = cg.call("jnp.minimum", scope.extents[axis], valid)
    hit = cg.binop(_first_rows(value.axes, axis, scope), "==", cg.binop(end, "-", cg.const(1)))
    kept = cg.call("jnp.where", hit, value.expr, cg.const(0.0))
    return Value(cg.call("jnp.sum", kept, keywords=[cg.kw("axis", cg.const(value.axes.index(axis)))]),
                 tuple(a for a in value.axes if a != axis))


def _shift(x: Value, where: ast.expr, scope: Scope, keep: bool = True, weights: bool = False) -> ast.expr:
    """The maximum with kept dimensions (``keep``; else the reduced axes dropped), bound to a name,
    or 0 where it is -inf (a fully masked row gives exp(-inf) = 0, not exp(-inf + inf) = NaN).  For
    logsumexp and the weights under a square root also 0 where it is +inf, so such a row gives
    log(inf) = inf, never exp(inf - inf) = NaN (found by the differential run); the ``weights`` of
    softmax keep it, as the evaluator (``evaluate.exp_shift``): NaN throughout.  Mosaic GPU lowers
    no ``is_finite``: there it is |m| < inf (false for ±inf and NaN alike)."""
    reduced = cg.call("jnp.max", x.expr, keywords=[cg.kw("axis", where)])
    m = scope.block.bind("top", _kept_dims(reduced, x, where, scope) if keep else reduced)
    if weights:
        kept = cg.binop(m, "!=", ast.UnaryOp(ast.USub(), cg.name("INF")))
    else:
        kept = cg.binop(cg.call("jnp.abs", m), "<", cg.name("INF")) if scope.wgmma else cg.call("jnp.isfinite", m)
    return scope.block.bind("shift", cg.call("jnp.where", kept, m, cg.const(0.0)))


def _scale(x: Value, where: ast.expr, scope: Scope) -> ast.expr:
    """The largest |s| along the normalised axes where it is finite and non-zero, else 1, bound
    to a name: weights invariant under scaling (l2, rms) are computed on s divided by it, so
    Σ s² neither underflows (l2-normalised scores near 1e-20 gave 0 where the evaluator's
    weights are of order 1) nor overflows in f32; a row holding ±inf or NaN, or all zeros, is
    computed as written (the evaluator's NaN and 0)."""
    a = scope.block.bind("top", _kept_dims(cg.call("jnp.max", cg.call("jnp.abs", x.expr),
                                                   keywords=[cg.kw("axis", where)]), x, where, scope))
    usable = cg.binop(cg.binop(a, ">", cg.const(0.0)), "&", cg.binop(a, "<", cg.name("INF")))
    return scope.block.bind("scale", cg.call("jnp.where", usable, a, cg.const(1.0)))


def _per_row(x: ast.expr, row: ast.expr, scope: Scope) -> ast.expr:
    """x / row for ``row`` a statistic of the row broadcast against x (its z, its scale), both
    quartered where |row| > 2^126: XLA divides by a broadcast as x·(1/row), a reciprocal that is
    subnormal there and flushed to 0 on XLA:CPU (weights of scores near 1e38 under an l2
    normaliser, or of gelu scores near 3e36 under ``id``, were 0 where the evaluator's are of order 1)."""
    past = cg.binop(cg.call("jnp.abs", row), ">", cg.const(2.0**126))
    quarter = scope.block.bind("quarter", cg.call("jnp.where", past, cg.const(0.25), cg.const(1.0)))
    return cg.binop(cg.binop(x, "*", quarter), "/", cg.binop(row, "*", quarter))


def _kept_dims(reduced: ast.expr, x: Value, where: ast.expr, scope: Scope) -> ast.expr:
    """A reduction of ``x`` over ``where`` shaped to broadcast against it: the reduced axes kept
    as 1s, or on Mosaic GPU (``scope.wgmma``) broadcast back to ``x``'s shape, as its layouts
    need (a [rows, 1] array has no wgmma row layout; ``lax.broadcast_in_dim`` of a row vector does).
    ``reduced`` is the reduction's call, or a name bound to its value (expanded by indexing)."""
    assert isinstance(where, ast.Tuple)
    gone = [e.value for e in where.elts if isinstance(e, ast.Constant)]
    if scope.wgmma:
        kept = cg.tuple_([cg.const(i) for i in range(len(x.axes)) if i not in gone])
        return cg.call("lax.broadcast_in_dim", reduced, shape(x.axes, scope), kept)
    if isinstance(reduced, ast.Name):
        return cg.subscript(reduced, [cg.const(None) if i in gone else ast.Slice() for i in range(len(x.axes))])
    assert isinstance(reduced, ast.Call)
    return ast.Call(reduced.func, reduced.args, [*reduced.keywords, cg.kw("keepdims", cg.const(True))])


def _against(value: Value, axes: Axes, scope: Scope) -> ast.expr:
    """``value`` broadcast against ``axes`` (a superset of its axes): ``align``, or on Mosaic GPU
    ``lax.broadcast_in_dim`` of it (``_kept_dims``)."""
    if not scope.wgmma:
        return align(value, axes)
    present = tuple(a for a in axes if a in value.axes)
    return cg.call("lax.broadcast_in_dim", transpose_to(value, present), shape(axes, scope),
                   cg.tuple_([cg.const(axes.index(a)) for a in present]))


def _weights(params: Sequence[str], x: Value, target: Axes, scope: Scope) -> tuple[ast.expr, Value | None]:
    """a1(s) / b(Σ a2(s)) along ``target``, and None; where a1 = a2 = exp, computed on s less the
    row's maximum m (``_shift``): exp(s - m)/b(Σ exp(s - m)) is the weights under an ``id``
    normaliser (the one they are invariant under; evaluate.nweights) and exp(-r·m) times them
    under one of degree r (sqrt, rms: 1/2), returned with exp(r·m/2) per row (``target``'s axes
    dropped), by which the caller multiplies its contraction twice (``_contract``): the weights
    themselves, of order exp(s/2), overflow f32 past s = 177 where small values times them need not."""
    a1, a2, b = params
    where = positions(x.axes, target)
    s = x.expr
    factor = None
    bounded = True  # is |z| at most n·b(1) (below 2^126): exp of shifted scores, a non-negative degree of scaled ones
    if a1 == a2 == "exp":
        if b == "id":
            shift = _shift(x, where, scope, weights=True)
        else:
            row = _shift(x, where, scope, keep=False)
            half = unary("exp", cg.binop(row, "*", cg.const(NORMALISER_DEGREE[b] / 2)), scope)
            factor = Value(scope.block.bind("half", half), tuple(a for a in x.axes if a not in target))
            shift = _kept_dims(row, x, where, scope)
        s = scope.block.bind("shifted", cg.binop(s, "-", shift))
    elif a1 in DEGREE and a2 in DEGREE and DEGREE[a1] == DEGREE[a2] * NORMALISER_DEGREE[b]:
        s = scope.block.bind("scaled", _per_row(s, _scale(x, where, scope), scope))
        bounded = DEGREE[a2] >= 0
    else:
        bounded = False
    top = scope.block.bind("top", unary(a1, s, scope))
    bottom = top if a2 == a1 else unary(a2, s, scope)
    z: ast.expr = _kept_dims(cg.call("jnp.sum", bottom, keywords=[cg.kw("axis", where)]), x, where, scope)
    z = scope.block.bind("z", cg.binop(z, "/", count(target, scope)) if b == "rms" else z)
    # as the evaluator: weight 0 where the denominator is 0, else a plain divide; the root is taken of
    # z where z ≠ 0, else of 1: jax.grad's slope of sqrt at 0 is inf, and inf times the zero cotangent
    # a masked row's z gets made its scores' gradient NaN (0 under an id normaliser)
    zero = cg.binop(z, "==", cg.const(0.0))
    divisor: ast.expr = cg.call("jnp.where", zero, cg.const(1.0), z)
    divisor = divisor if b == "id" else cg.call("jnp.sqrt", divisor)
    divided = cg.binop(top, "/", divisor) if bounded else _per_row(top, scope.block.bind("divisor", divisor), scope)
    return cg.call("jnp.where", zero, cg.const(0.0), divided), factor


def _normalise(box: Box, args: Sequence[Value], scope: Scope) -> Value:
    (x,) = args
    params = ops.OPS[box.op].weights
    assert params is not None, f"{box.op} is a normalisation without its weights"
    weights, factor = _weights(params, x, scope.keep(box.target), scope)
    assert factor is None, f"{box.op}'s weights are relative to a factor"  # no normalisation has exp under a root
    return Value(weights, x.axes)


def _contract(box: Box, args: Sequence[Value], scope: Scope) -> Value:
    operands = list(args)
    target = scope.keep(box.target)
    if box.op != "ncontract":
        return _product(operands, target, scope)
    s = operands[0]
    weights, factor = _weights(box.params, s, target, scope)
    operands[0] = Value(scope.block.bind("weights", weights), s.axes)
    if factor is None:
        return _product(operands, target, scope)
    # (r·e)·e for r the contraction of weights relative to e² (``_weights``): each product lies
    # between r and the output, so it overflows only where the output does (up to e = inf, past
    # s = 355, where an output f32 holds has r = 0 or subnormal); r where r = 0 and e = inf (not
    # 0·inf = NaN; only there, or jax.grad's slope at r = 0 is 1, not e²), as the streamed final
    # (``accumulators.stable_final``)
    r = _product(operands, target, scope)
    r = Value(scope.block.bind("relative", r.expr), r.axes)
    e = _against(factor, r.axes, scope)
    scaled = cg.binop(cg.binop(r.expr, "*", e), "*", e)
    lost = cg.binop(cg.binop(r.expr, "==", cg.const(0.0)), "&", cg.binop(e, "==", cg.name("INF")))
    return Value(cg.call("jnp.where", lost, r.expr, scaled), r.axes)


def _product(operands: list[Value], target: Axes, scope: Scope) -> Value:
    """Σ over ``target`` of the operands' product: an einsum (or wgmma) where it is a matrix product."""
    everything = tuple(dict.fromkeys(a for v in operands for a in v.axes))
    out = tuple(a for a in everything if a not in target)
    if _is_matmul(operands, target, scope):
        operands, merged = _as_matrices(operands, target, scope)
        everything = tuple(dict.fromkeys(a for v in operands for a in v.axes))
        letters = {a: chr(ord("a") + i) for i, a in enumerate(everything)}
        contracted = set(target) | {name for name, group in merged.items() if set(group) <= set(target)}
        dot_out = tuple(a for a in everything if a not in contracted)
        spec = ",".join("".join(letters[a] for a in v.axes) for v in operands) + "->" + \
            "".join(letters[a] for a in dot_out)
        dtype = cg.attr(f"jnp.{scope.dot_dtype}")
        if scope.wgmma:
            return Value(_wgmma(operands, target, scope, merged), dot_out)
        keywords = [cg.kw("preferred_element_type", cg.attr("jnp.float32"))]
        if scope.dot_dtype == "float32":  # IEEE f32: on GPU an f32 dot defaults to TF32
            keywords.append(cg.kw("precision", cg.attr("lax.Precision.HIGHEST")))
        cast = [v.expr if scope.dot_dtype == "float32" else cg.call(ast.Attribute(v.expr, "astype", ast.Load()), dtype)
                for v in operands]
        if scope.dot_operand and scope.dot_dtype != "float32":
            cast = [cg.call(ast.Attribute(c, "astype", ast.Load()), cg.name(scope.dot_operand)) for c in cast]
        product_expr = cg.call("jnp.einsum", cg.const(spec), *cast, keywords=keywords)
        if not merged:
            return Value(product_expr, out)
        unmerged = tuple(a for group in (merged.get(x, (x,)) for x in dot_out) for a in group)
        if unmerged == dot_out:  # only the contracted axes were merged
            return Value(product_expr, dot_out)
        return Value(_reshaped(product_expr, unmerged, scope), unmerged)
    product = align(operands[0], everything)
    for v in operands[1:]:
        product = cg.binop(product, "*", align(v, everything))
    if not target:
        return Value(product, everything)
    return Value(cg.call("jnp.sum", product, keywords=[cg.kw("axis", positions(everything, target))]), out)


def _wgmma(operands: Sequence[Value], target: Axes, scope: Scope, merged: Mapping[str, Axes]) -> ast.expr:
    """``wgmma(a, b, a_k, b_k, a_ref, b_ref, dtype)`` (``lower.mosaic.WGMMA_SOURCE``) for two
    matrices contracting one axis: an operand held in shared memory as loaded is passed as its ref;
    the others are staged into shared memory by the call, their axes (``merged`` dimensions as
    the axes they stand for) recorded in ``scope.staged``."""
    a, b = operands
    shared = [x for x in a.axes if x in target]
    assert len(a.axes) == 2 and len(b.axes) == 2 and len(shared) == 1, (a.axes, b.axes, target)
    k = shared[0]

    def in_smem(v: Value) -> bool:
        return isinstance(v.expr, ast.Name) and v.expr.id in scope.refs

    def operand(v: Value) -> tuple[ast.expr, ast.expr]:
        if in_smem(v):
            assert isinstance(v.expr, ast.Name)
            return cg.name(scope.refs[v.expr.id]), cg.const(True)
        return v.expr, cg.const(False)

    (ea, ra), (eb, rb) = operand(a), operand(b)
    if scope.staged is not None:
        scope.staged.append(tuple(tuple(x for n in v.axes for x in merged.get(n, (n,)))
                                  for v in (a, b) if not in_smem(v)))
    return cg.call("wgmma", ea, eb, cg.const(a.axes.index(k)), cg.const(b.axes.index(k)), ra, rb,
                   cg.attr(f"jnp.{scope.dot_dtype}"))


def _as_matrices(operands: Sequence[Value], target: Axes, scope: Scope) -> tuple[list[Value], dict[str, Axes]]:
    """For a backend whose dot takes 2-D operands (``scope.batched_dot`` false: Triton), the
    two operands with each of their free and contracted axis groups merged into one dimension
    where the group has several axes (a grouped batch tile [b t d] times [d f] is rows b*t),
    and which merged dimension stands for which axes (none: the operands as they are)."""
    a, b = operands
    batch = tuple(x for x in a.axes if x in b.axes and x not in target)
    groups = (batch, tuple(x for x in a.axes if x not in b.axes), tuple(target),
              tuple(x for x in b.axes if x not in a.axes))
    if scope.batched_dot or all(len(g) <= 1 for g in groups):
        return list(operands), {}
    merged = {"*".join(g): g for g in groups if len(g) > 1}

    def matrix(value: Value, parts: tuple[Axes, ...]) -> Value:
        if all(len(g) <= 1 for g in parts):
            return value
        order = tuple(x for g in parts for x in g)
        names = tuple("*".join(g) for g in parts if g)
        return Value(_reshaped(transpose_to(value, order), names, scope, merged), names)

    batch_g, free_a, contracted, free_b = groups
    return [matrix(a, (batch_g, free_a, contracted)), matrix(b, (batch_g, contracted, free_b))], merged


def _reshaped(expr: ast.expr, names: Axes, scope: Scope, merged: Mapping[str, Axes] | None = None) -> ast.expr:
    """``expr.reshape`` to the extents of ``names``, a name of ``merged`` standing for the
    product of its axes' extents."""
    dims = []
    for name in names:
        extents = [scope.extents[a] for a in (merged or {}).get(name, (name,))]
        dim = extents[0]
        for extent in extents[1:]:
            dim = cg.binop(dim, "*", extent)
        dims.append(dim)
    return cg.call(ast.Attribute(expr, "reshape", ast.Load()), cg.tuple_(dims))


def _is_matmul(operands: Sequence[Value], target: Axes, scope: Scope) -> bool:
    """A two-operand contraction where each operand keeps a free axis: a dot_general."""
    if len(operands) != 2 or not target:
        return False
    a, b = operands
    if not all(t in a.axes and t in b.axes for t in target):
        return False
    batch = [x for x in a.axes if x in b.axes and x not in target]
    free_a = [x for x in a.axes if x not in b.axes]
    free_b = [x for x in b.axes if x not in a.axes]
    return bool(free_a) and bool(free_b) and (scope.batched_dot or not batch)


def _where(box: Box, args: Sequence[Value], scope: Scope) -> Value:
    a, b = args
    assert box.index is not None and not isinstance(box.index, (Idx, IInt, IBin))
    axes = tuple(dict.fromkeys(a.axes + b.axes + scope.keep(box.target)))
    mask = predicate(box.index, axes, scope)
    value = cg.call("jnp.where", mask, align(a, axes), align(b, axes))
    return Value(_broadcast(value, axes, a.axes + b.axes, scope), axes)


def _kept(box: Box, args: Sequence[Value], scope: Scope) -> Value:
    """``where`` (or ``select``) on a chunk where its predicate (its mask) holds everywhere
    (``Scope.unmasked``): its value operand, with the axes the masked node has."""
    if box.op == "select":
        mask, a, b = args
        axes = tuple(dict.fromkeys(mask.axes + a.axes + b.axes))
    else:
        a, b = args
        axes = tuple(dict.fromkeys(a.axes + b.axes + scope.keep(box.target)))
    return Value(_broadcast(align(a, axes), axes, a.axes, scope), axes)


def _broadcast(value: ast.expr, axes: Axes, carried: Axes, scope: Scope) -> ast.expr:
    """The value broadcast to ``axes`` when some come only from a box's brackets (a
    predicate or index expression that does not mention them)."""
    if all(a in carried for a in axes):
        return value
    return cg.call("jnp.broadcast_to", value, shape(axes, scope))


def _index(box: Box, args: Sequence[Value], scope: Scope) -> Value:
    assert box.index is not None and isinstance(box.index, (Idx, IInt, IBin))
    axes = scope.keep(box.target)
    value = cg.call("jnp.asarray", index_expr(box.index, axes, scope), cg.attr("jnp.float32"))
    mentioned = tuple(n.axis for n in _walk_index(box.index) if isinstance(n, Idx) and n.axis not in scope.squeezed)
    return Value(_broadcast(value, axes, mentioned, scope), axes)


def _walk_index(expr: IndexExpr) -> list[IndexExpr]:
    if isinstance(expr, IBin):
        return [expr, *_walk_index(expr.left), *_walk_index(expr.right)]
    return [expr]


def _onehot(box: Box, args: Sequence[Value], scope: Scope) -> Value:
    (labels,) = args
    axes = labels.axes + scope.keep(box.target)
    where = position(box.target[0], axes, scope)
    hit = cg.binop(align(labels, axes), "==", cg.call("jnp.asarray", where, cg.attr("jnp.float32")))
    return Value(cg.call("jnp.where", hit, cg.const(1.0), cg.const(0.0)), axes)


def _compare(box: Box, args: Sequence[Value], scope: Scope) -> Value:
    a, b = args
    axes = tuple(dict.fromkeys(a.axes + b.axes))
    hit = cg.binop(align(a, axes), ops.COMPARE[box.op], align(b, axes))
    return Value(cg.call("jnp.where", hit, cg.const(1.0), cg.const(0.0)), axes)


def _select(box: Box, args: Sequence[Value], scope: Scope) -> Value:
    mask, a, b = args
    axes = tuple(dict.fromkeys(mask.axes + a.axes + b.axes))
    value = cg.call("jnp.where", cg.binop(align(mask, axes), "!=", cg.const(0)), align(a, axes), align(b, axes))
    return Value(value, axes)


def _gather(box: Box, args: Sequence[Value], scope: Scope) -> Value:
    """The table along n at the positions, clamped into [0, |n| - 1] then rounded down (as the
    evaluator: the same element for every position); |n| is the true size, so a padded table's
    padding is never read.  Positions that share no axis with the table are one indexed load of
    the rows they name (``T[rows]``: through the ref of a table left in memory, a paged KV pool in
    Pallas, or ``jnp.take``); otherwise ``take_along_axis`` on the broadcast table, or where the
    backend has no gather, a select and sum along n."""
    table, at = args
    (n,) = box.target
    last = cg.binop(scope.sizes[n], "-", cg.const(1))
    if not set(at.axes) & set(table.axes):  # one indexed load of the rows the positions name
        rows = cg.call("jnp.asarray", cg.call("jnp.clip", at.expr, cg.const(0), last), cg.attr("jnp.int32"))
        k = table.axes.index(n)
        if table.ref is not None:  # a Pallas ref, n its first axis (datamask.gathered_tables): ref[rows, :, ...]
            assert k == 0, table
            rows_read = ast.Subscript(table.expr, cg.tuple_([rows, *(ast.Slice() for _ in table.axes[1:])]), ast.Load())
            return Value(cg.call(ast.Attribute(rows_read, "astype", ast.Load()), cg.attr(f"jnp.{table.ref}")),
                         at.axes + table.axes[1:])
        if scope.take:
            taken = cg.call("jnp.take", table.expr, rows, keywords=[cg.kw("axis", cg.const(k))])
            return Value(taken, table.axes[:k] + at.axes + table.axes[k + 1:])
    axes = ops.result_axes("gather", (table.axes, at.axes), box.target)
    clamped = cg.call("jnp.clip", align(at, axes), cg.const(0), last)
    index = cg.call("jnp.asarray", clamped, cg.attr("jnp.int32"))
    full = (*axes, n)
    if not scope.take:  # Σ_n where(n == position, T, 0): exact (one term; no 0·inf), no gather primitive
        hit = cg.binop(cg.call("jnp.expand_dims", index, cg.const(-1)), "==", position(n, full, scope))
        picked = cg.call("jnp.where", hit, align(table, full), cg.const(0.0))
        return Value(cg.call("jnp.sum", picked, keywords=[cg.kw("axis", cg.const(-1))]), axes)
    source = cg.call("jnp.broadcast_to", align(table, full), shape(full, scope))
    index = cg.call("jnp.broadcast_to", cg.call("jnp.expand_dims", index, cg.const(-1)),
                    cg.tuple_([*(scope.extents[a] for a in axes), cg.const(1)]))
    value = cg.call("jnp.take_along_axis", source, index, keywords=[cg.kw("axis", cg.const(-1))])
    return Value(cg.call("jnp.squeeze", value, cg.const(-1)), axes)


def _topk(box: Box, args: Sequence[Value], scope: Scope) -> Value:
    """argmax and topk by the module's helpers (runtime.argmax, runtime.topk: the evaluator's
    order, NaN above every number, ties to the smaller position)."""
    (x,) = args
    (axis,) = box.target
    where = cg.const(x.axes.index(axis))
    if not box.out:
        return Value(cg.call("argmax", x.expr, where), tuple(a for a in x.axes if a != axis))
    count = scope.extents[box.out[0]]
    return Value(cg.call("topk", x.expr, where, count), tuple(box.out[0] if a == axis else a for a in x.axes))


def _reshape(box: Box, args: Sequence[Value], scope: Scope) -> Value:
    (x,) = args
    if box.op == "transpose":  # axes are tracked by name: only the declared order changes
        return x
    if box.op == "rename":
        return Value(x.expr, tuple(box.out[0] if a == box.target[0] else a for a in x.axes))
    old, new = box.target, box.out
    at = min(x.axes.index(a) for a in old)
    kept = [a for a in x.axes if a not in old]
    order = tuple(kept[:at]) + old + tuple(kept[at:])
    expr = align(x, order)
    axes = tuple(kept[:at]) + new + tuple(kept[at:])
    return Value(cg.call("jnp.reshape", expr, shape(axes, scope)), axes)


TABLE: dict[str, Callable[[Box, Sequence[Value], Scope], Value]] = {
    "unary": _unary, "binary": _binary, "reduce": _reduce, "normalise": _normalise, "scan": _scan,
    "contract": _contract, "ncontract": _contract, "where": _where, "index": _index, "onehot": _onehot,
    "split": _reshape, "join": _reshape, "rename": _reshape, "transpose": _reshape, "compare": _compare,
    "select": _select, "gather": _gather, "topk": _topk,
}


# ---- boxes, nodes and whole diagrams ---------------------------------------------------------


def mask_padded(box: Box, args: Sequence[Value], scope: Scope) -> list[Value]:
    """Operands with padded positions of every consumed/mixed axis set to neutral fills."""
    out = list(args)
    if ops.OPS[box.op].kind not in ("reduce", "normalise", "contract", "ncontract", "topk"):
        return out
    for axis in box.target:
        if axis not in scope.padded:
            continue
        fills = fill_values(box, axis)
        assert fills is not None, (box.op, axis)  # layout refused this before emitting
        for i, (v, fill) in enumerate(zip(out, fills, strict=False)):
            if axis in v.axes:
                if fill == 0.0 and v.zero_padded:
                    continue
                axes = v.axes
            elif axis in scope.squeezed or _finite_number(v):
                continue
            else:
                # an operand without the axis meets the padded positions of the others: the
                # padding law needs it at its own fill there too (0 · -inf would be NaN)
                axes = (*v.axes, axis)
            valid = cg.binop(position(axis, axes, scope), "<", scope.limit(axis))
            masked: ast.expr = cg.call("jnp.where", valid, align(v, axes), saturate(fill))
            extent = scope.pad_extents.get(axis)
            if extent is not None and axes == v.axes and axis not in scope.limits:  # sizes are Python ints
                # when traced: no mask (and no compare in the kernel's loop) where the size fills the tiles
                masked = ast.IfExp(cg.binop(scope.sizes[axis], "<", extent), masked, v.expr)
            out[i] = Value(scope.block.bind("masked", masked), axes)
    return out


def _finite_number(v: Value) -> bool:
    """A Python number (a size or constant) or a folded constant that is finite."""
    if v.constant is not None:
        return math.isfinite(v.constant)
    return v.python


def emit_box(box: Box, args: Sequence[Value], scope: Scope) -> Value:
    """The code of one box applied to emitted operands (padded axes masked first).

    A box on Python numbers only (``recip(0.0)``) gets an f32 operand, so it computes
    with f32 semantics (inf, not ZeroDivisionError) like every other box.
    """
    if args and all(a.python for a in args):
        args = [Value(cg.call("jnp.float32", args[0].expr), ()), *args[1:]]
    return TABLE[ops.OPS[box.op].kind](box, mask_padded(box, args, scope), scope)


def argument(expr: Expr, env: Mapping[str, Value], scope: Scope) -> Value:
    """An SSA argument: a variable, a saturated constant or an axis size."""
    if isinstance(expr, Var):
        return env[expr.name]
    if isinstance(expr, Const):
        return Value(saturate(expr.value, expr.span), (), python=True, constant=expr.value)
    assert isinstance(expr, Size), expr
    return Value(cg.call("float", scope.sizes[expr.axis]), (), python=True)


def folded(box: Box, env: Mapping[str, Value]) -> float | None:
    """The value of a scalar box whose operands are all constants (written, or folded
    before it), computed in float64 by the evaluator; None for any other box."""
    if box.axes or box.target or not box.args:
        return None
    values: list[float] = []
    for a in box.args:
        known = a.value if isinstance(a, Const) else env[a.name].constant if isinstance(a, Var) else None
        if known is None:
            return None
        values.append(known)
    one = Box(box.op, tuple(Const(v) for v in values), (), (), box.out, box.params, box.index, box.span)
    (out,) = evaluate_named(Diagram("constant", (), (), (one,), ((),), ()), [], {})
    return float(out.data)


def emit_node(name: str, box: Box, env: dict[str, Value], scope: Scope, hint: str | None = None,
              args: Sequence[Value] | None = None) -> Value:
    """Emit ``name = box(args)`` (the Python name derived from ``hint`` or ``name``) into ``env``;
    a box on constants alone is folded (``folded``), its value bound as an f32 scalar.  ``args``
    replaces the box's own emitted operands (a scan started from its carry: ``started``)."""
    constant = None if args is not None else folded(box, env)
    if constant is not None:
        value = Value(cg.call("jnp.float32", saturate(constant, box.span)), (), constant=constant)
    else:
        args = [argument(a, env, scope) for a in box.args] if args is None else args
        value = _kept(box, args, scope) if name in scope.unmasked else emit_box(box, args, scope)
    if name in scope.rounded:  # a marked approximation (R10): round to the format, compute on in f32
        value = Value(rounded(value.expr, scope.rounded[name]), value.axes)
    bound = Value(scope.block.bind(hint or name, value.expr), value.axes, constant=value.constant)
    env[name] = bound
    return bound


def emit_diagram(diagram: Diagram, args: Sequence[Value], scope: Scope) -> list[Value]:
    """Inline a whole diagram (an accumulator's lift/combine/final) on emitted arguments (its
    node names are its own: none is one of the kernel's ``Scope.unmasked`` nodes)."""
    flat = flatten(diagram)
    scope = scope.with_block(scope.block, unmasked=frozenset())
    env = {p: v for (p, _), v in zip(flat.inputs, args, strict=True)}
    for node in flat.nodes:
        assert isinstance(node.expr, Box)
        emit_node(node.name, node.expr, env, scope, hint=f"{diagram.name}_{node.name}")
    return [env[o] for o in flat.outputs]
