"""Which stream chunks a program can skip: those that a mask fills entirely with padding.

A chunk whose every position of an accumulating box's operand holds that operand's
padding value (``AccumulatorPlan.pad``, the neutral fill certified by the padding law)
lifts to the accumulator's identity, so leaving it out changes nothing.  The one shape
recognised is a ``where[...](pred, A, fill)`` node that feeds the operand directly, with
``fill`` equal to the operand's pad and ``pred`` a conjunction of affine comparisons
between the streamed axis' index and grid axes' indices (``q >= x``, ``q - x < 256``).
Over the program's index box each conjunct bounds the stream index on one side (interval
arithmetic: the other indices at their most permissive corner), and the intersection gives
the chunks ``[lo, hi)`` that can hold a true position.  Anything else (a disjunction, a
negation, ``!=``, a non-affine index, an axis that is neither streamed nor a grid axis, an
accumulator with no such operand, an output written chunk by chunk) keeps the full loop.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

from napkin_cat.lower import codegen as cg
from napkin_cat.lower.layout import Layout
from napkin_cat.terms import Box, Cmp, Const, IBin, Idx, IInt, IndexExpr, Logic, Pred, Var

__all__ = ["chunk_range"]

#: an affine index expression: coefficient per axis, and a constant
Affine = tuple[dict[str, int], int]


def chunk_range(lay: Layout, offsets: Mapping[str, ast.expr], trips: ast.expr) -> tuple[ast.expr, ast.expr] | None:
    """``(lo, hi)`` chunk bounds of the stream loop for one program, or None for ``(0, trips)``.

    ``offsets`` holds each grid axis' first index in this program (code); ``trips`` the
    number of chunks.  Each accumulating node must have a recognised masked operand; the
    loop runs over the hull of their ranges (chunks inside it but outside one node's range
    lift to that node's identity, so running them is harmless).
    """
    axis = lay.stream
    if axis is None or lay.chunk_outputs or not lay.plans:
        return None
    wheres = {n.name: n.expr for n in lay.flat.nodes if isinstance(n.expr, Box) and n.expr.op == "where"}
    ranges: list[tuple[ast.expr, ast.expr]] = []
    for node in lay.flat.nodes:
        plan = lay.plans.get(node.name)
        if plan is None:
            continue
        assert isinstance(node.expr, Box)
        found = None
        for arg, fill in zip(node.expr.args, plan.pad or (), strict=False):
            mask = wheres.get(arg.name) if isinstance(arg, Var) else None
            if mask is None or not isinstance(mask.args[-1], Const) or mask.args[-1].value != fill:
                continue
            if isinstance(mask.index, (Cmp, Logic)):
                found = _bounds(mask.index, lay, axis, offsets, trips)
            if found is not None:
                break
        if found is None:
            return None
        ranges.append(found)
    if len(ranges) == 1:
        return ranges[0]
    return _fold("jnp.minimum", [lo for lo, _ in ranges]), _fold("jnp.maximum", [hi for _, hi in ranges])


def _bounds(pred: Pred, lay: Layout, axis: str, offsets: Mapping[str, ast.expr],
            trips: ast.expr) -> tuple[ast.expr, ast.expr] | None:
    """Chunk bounds from a conjunction of affine comparisons (None: not recognised)."""
    conjuncts = _conjuncts(pred)
    if conjuncts is None:
        return None
    tile = lay.tiles[axis]
    lows: list[ast.expr] = []
    highs: list[ast.expr] = []
    for form in conjuncts:
        coeffs = {k: v for k, v in form[0].items() if v != 0}
        const = form[1]
        a = coeffs.pop(axis, 0)
        if any(other not in lay.grid for other in coeffs):
            return None
        if a == 0:
            continue  # bounds no stream index: keep every chunk
        # a·x + g + const >= 0 somewhere in the box needs a·x >= -(max g + const) over it
        sign = 1 if a < 0 else -1  # a > 0: the lower bound a·x >= need, need = -(max g) - const
        terms: list[tuple[int, ast.expr]] = []
        for other, b in coeffs.items():
            span = 0 if other in lay.squeezed else lay.block(other) - 1
            corner = offsets[other] if b < 0 or span == 0 else cg.binop(offsets[other], "+", cg.const(span))
            terms.append((sign * b, corner))
        bound = _linear(terms, sign * const)
        if a > 0:  # x >= ceil(need / a): chunks from that one on
            first = bound if a == 1 else cg.binop(cg.binop(bound, "+", cg.const(a - 1)), "//", cg.const(a))
            lows.append(cg.binop(first, "//", cg.const(tile)))
        else:  # x <= floor(top / -a): chunks up to and including that one
            last = bound if a == -1 else cg.binop(bound, "//", cg.const(-a))
            highs.append(cg.binop(cg.binop(last, "//", cg.const(tile)), "+", cg.const(1)))
    if not lows and not highs:
        return None
    lo = cg.call("jnp.maximum", cg.const(0), _fold("jnp.maximum", lows)) if lows else cg.const(0)
    hi = cg.call("jnp.minimum", trips, _fold("jnp.minimum", highs)) if highs else trips
    return lo, hi  # hi <= lo: fori_loop runs no trip (a program whose rows mask every key)


def _linear(terms: list[tuple[int, ast.expr]], const: int) -> ast.expr:
    """``Σ c·e + const`` as code (unit coefficients and a zero constant left out)."""
    out: ast.expr | None = None
    for c, e in terms:
        if c == 0:
            continue
        term = e if abs(c) == 1 else cg.binop(cg.const(abs(c)), "*", e)
        out = (term if c > 0 else cg.binop(cg.const(0), "-", term)) if out is None else \
            cg.binop(out, "+" if c > 0 else "-", term)
    if out is None:
        return cg.const(const)
    return out if const == 0 else cg.binop(out, "+" if const > 0 else "-", cg.const(abs(const)))


def _fold(fn: str, items: list[ast.expr]) -> ast.expr:
    out = items[0]
    for item in items[1:]:
        out = cg.call(fn, out, item)
    return out


def _conjuncts(pred: Pred) -> list[Affine] | None:
    """Each conjunct as an affine form ``f`` meaning ``f >= 0`` (None: not recognised)."""
    if isinstance(pred, Logic):
        if pred.op != "and" or pred.right is None:
            return None
        first, rest = _conjuncts(pred.left), _conjuncts(pred.right)
        return None if first is None or rest is None else first + rest
    left, right = _affine(pred.left), _affine(pred.right)
    if left is None or right is None:
        return None
    diff = _combine(left, right, -1)  # left - right
    minus = _combine(({}, 0), diff, -1)  # right - left
    by_op: dict[str, list[Affine]] = {
        ">=": [diff], ">": [_shift(diff, -1)], "<=": [minus], "<": [_shift(minus, -1)], "==": [diff, minus]}
    return by_op.get(pred.op)


def _shift(form: Affine, by: int) -> Affine:
    return dict(form[0]), form[1] + by


def _combine(left: Affine, right: Affine, sign: int) -> Affine:
    coeffs = dict(left[0])
    for k, v in right[0].items():
        coeffs[k] = coeffs.get(k, 0) + sign * v
    return coeffs, left[1] + sign * right[1]


def _affine(expr: IndexExpr) -> Affine | None:
    """An integer index expression as coefficients and constant (None: not affine)."""
    if isinstance(expr, Idx):
        return {expr.axis: 1}, 0
    if isinstance(expr, IInt):
        return {}, expr.value
    assert isinstance(expr, IBin)
    left, right = _affine(expr.left), _affine(expr.right)
    if left is None or right is None:
        return None
    if expr.op in ("+", "-"):
        return _combine(left, right, 1 if expr.op == "+" else -1)
    if expr.op == "*" and (not left[0] or not right[0]):
        scale, form = (left[1], right) if not left[0] else (right[1], left)
        return {k: scale * v for k, v in form[0].items()}, scale * form[1]
    return None
