"""How far bounded certification must sweep a lemma: its reach in sizes, its scale in values.

``certify`` checks a lemma at finitely many sizes and inputs, so it must know where the
two sides could still part.  This module reads that off the lemma's syntax alone:

- ``reach(lemma)``: an axis size up to which every size must be checked (each axis
  independently).  Sizes enter values only through ``Size`` scalars, reductions and
  normalisations, index predicates, and the branch points of piecewise boxes; see
  ``reach`` for the argument.  ``UNBOUNDED`` when a piecewise box compares a size
  non-polynomially, so no bound exists.
- ``scale(lemma)``: how large inputs must get to cross the values the lemma's piecewise
  boxes compare with (``relu(max[x](X) - 4)`` is invisible to standard normal draws).

Both are pure functions of the lemma, read through the diagrams it calls
(``unfolded``): a size or constant inside a callee counts like one in the lemma.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import fields, is_dataclass, replace
from functools import cache
from typing import Any

import sympy

from napkin_cat.evaluate import FLOAT64, INDEX_ARITH, SYMBOLIC, evaluate_named
from napkin_cat.ops import inlined
from napkin_cat.terms import (
    Box,
    Const,
    Diagram,
    Expr,
    IBin,
    Idx,
    IInt,
    IndexExpr,
    LemmaDecl,
    Size,
    Var,
    fold_index,
    walk,
)

__all__ = ["UNBOUNDED", "reach", "scale", "unfolded"]

UNBOUNDED = -1  #: ``reach``'s answer when no size bounds where the lemma's branches switch
_PIECEWISE = ("relu", "abs", "sign", "maximum", "minimum", "onehot")  # boxes that switch branch at a point


def reach(lemma: LemmaDecl) -> int:
    """The largest axis size a bounded check of ``lemma`` must reach to see how sizes enter it.

    Sizes enter values only through ``Size`` scalars, reductions and normalisations (each
    a sum of |axis| terms, or a division by |axis|) and index expressions.  Two sides that
    are rational in a size with k such sources agree at more than k sizes only if they are
    equal, and an index predicate with integer coefficients c_i changes truth only at
    positions below 1 + Σ|c_i| (Cauchy's root bound); a size-dependent value compared with
    a constant c by a piecewise box (``relu(x - 10)``) changes only near c, where a constant
    is any closed scalar term (``exp(exp(2))`` counts as 1619), and more generally below
    the Cauchy bound of the box's argument (``_step_bound``: ``relu(x * 0.04 - 1)`` steps
    at 25 with no constant above 1).  So a side can be
    made to agree up to a size n only with n sources or constants as large as n:
    ``(x-1)(x-2)(x-3)(x-4)``, ``where[x](x < 5, X, 0)``, ``relu(x - 10)``.  The check covers
    every size up to 2 + sources + the largest constant (scalar constants count when the
    lemma has a size source); ``UNBOUNDED`` when a step has no polynomial reading.
    """
    sources, constants = 0, 0
    for node in _nodes(lemma):
        sources += isinstance(node, Size) or (isinstance(node, Box) and bool(node.target))
        if isinstance(node, Box) and node.index is not None:
            constants = max(constants, 1 + sum(abs(v) for v in _index_ints(node.index)))
    # a size compared with a constant by a piecewise box (relu(x - 10), min(x, 10)) is a step there
    largest = max(constants, math.ceil(max([0.0, *_closed_scalars(lemma)]))) if sources else constants
    if (steps := _step_bound(lemma, 2 + sources + largest)) == math.inf:
        return UNBOUNDED
    return 2 + sources + max(largest, math.ceil(steps) if sources else 0)


def scale(lemma: LemmaDecl) -> float:
    """How large the inputs must get to cross the values the lemma compares with.

    A piecewise box compares a value with the lemma's constants (``relu(max[x](X) - 4)``,
    ``relu(X * 0.01 - 5)``); inputs of standard size never reach 4, let alone 500.  The
    scale is 2 plus the product over the distinct constants c of max(|c|, 1/|c|), capped
    at 1e6: 0.01 · X - 5 weighs 100 · 5, so inputs scaled by 502 cross its step at 500."""
    weights = {max(v, 1 / v) for v in _closed_scalars(lemma) if v > 0}
    return min(2 + math.prod(weights), 1e6)


@cache
def unfolded(lemma: LemmaDecl) -> tuple[Expr, ...]:
    """Both sides of ``lemma`` with every diagram call replaced by the callee's body (as
    the kernel's unfold rule does, ``ops.inlined``), each one tree of primitive
    boxes: the bindings inlining introduces are substituted back into the sides."""
    both = Diagram(lemma.name, lemma.params, (), (lemma.lhs, lemma.rhs), (lemma.lhs.axes, lemma.rhs.axes),
                   lemma.axes)
    flat = inlined(both)
    bound = {name: let.expr for let in flat.body for name in let.names}

    def expand(expr: Expr) -> Expr:
        if isinstance(expr, Var) and expr.name in bound:
            return expand(bound[expr.name])
        if isinstance(expr, Box):
            return replace(expr, args=tuple(expand(a) for a in expr.args))
        return expr

    return tuple(expand(side) for side in flat.outputs)


def _nodes(lemma: LemmaDecl) -> Iterator[Expr]:
    """Every node of both sides of ``lemma``, calls unfolded."""
    return (n for side in unfolded(lemma) for n in walk(side))


def _step_bound(lemma: LemmaDecl, others: int) -> float:
    """A size past which no piecewise box of ``lemma`` changes branch because of sizes.

    ``relu(p)``, ``abs(p)``, ``max(p, r)``, ``min(p, r)`` switch where p (p - r) crosses 0,
    ``onehot[v](p)`` where p crosses a position (first 1: p - 1).  Read on one element
    (``_scalar``: variables, sizes |a| and positions #a symbols), p is a rational function;
    its numerator's roots lie below 1 + max|c| / min|c| over its numeric coefficients
    (Cauchy's bound; in a coefficient that involves a variable, its numbers), so
    ``relu(x * 0.04 - 1)`` steps by 26.  With several sizes, the bound in each is taken
    with the others at ``others`` (the reach without steps): ``relu(x - y^4)`` steps at
    x = 82 once y reaches 3.  Where p reduces the data, the draws cover it; one not
    polynomial in the sizes and positions (``sqrt(x) - 5``) counts as unbounded
    (``math.inf``): bounded certification cannot place its step; so does ``floor`` of any
    value that depends on a size or a position (``floor(x / 30)`` steps at every multiple of 30).
    """
    bound = 0.0
    for node in _nodes(lemma):
        if isinstance(node, Box) and node.op == "floor" and _reads_sizes(node.args[0]):
            return math.inf  # floor steps wherever its argument crosses an integer: at no bounded size
        if not isinstance(node, Box) or node.op not in _PIECEWISE:
            continue
        try:
            value = _scalar(node.args[0]) - (1 if node.op == "onehot" else _scalar(node.args[1])
                                             if len(node.args) == 2 else 0)
        except _Opaque:
            continue
        except _Unbounded:
            return math.inf
        gens = sorted((g for g in sympy.sympify(value).free_symbols if g.name[0] in "|#"), key=str)
        if not gens:
            continue
        try:
            poly = sympy.Poly(sympy.expand(sympy.numer(sympy.together(value))), *gens)
        except sympy.PolynomialError:
            return math.inf
        if any(g.has(*gens) for g in poly.free_symbols_in_domain):
            return math.inf  # a size inside a coefficient: not polynomial in it (sqrt(x), exp(x))
        if poly.total_degree() == 0:
            continue
        for gen in gens:  # the others at their largest swept value: the step in gen moves out with them
            at = poly.as_expr().subs({g: others for g in gens if g != gen})
            weights = [float(abs(k)) for c in sympy.Poly(at, gen).coeffs() for k in _numbers(c)]
            weights = [w for w in weights if w > 0]
            bound = max(bound, 1 + max(weights) / min(weights)) if weights else bound
    return bound if math.isfinite(bound) else math.inf


def _reads_sizes(expr: Expr) -> bool:
    """Does ``expr``'s value on one element (``_scalar``) depend on a size or a position?  A
    reduction of the data (``_Opaque``) is covered by the draws; any other reduction of sizes
    counts as depending on them."""
    try:
        value = _scalar(expr)
    except _Opaque:
        return False
    except _Unbounded:
        return True
    return any(g.name[0] in "|#" for g in sympy.sympify(value).free_symbols)


class _Opaque(Exception):
    """A term whose value depends on the data through a reduction: the draws cover it."""


class _Unbounded(Exception):
    """A size- or position-dependent term with no polynomial reading."""


def _scalar(expr: Expr | IndexExpr) -> Any:
    """``expr`` on one element, over sympy: variables real symbols, each size |a| and each
    position #a (of an index box, or summed over) a positive symbol; a sum, mean or
    contraction of a term free of variables (after sympy's reading: ``X * 0`` is) is its
    sum over the positions (Faulhaber).  Raises ``_Opaque`` for a reduction of the data,
    ``_Unbounded`` for any other reduction of sizes or positions."""
    if isinstance(expr, Var):
        return sympy.Symbol(expr.name, real=True)
    if isinstance(expr, Size):
        return sympy.Symbol(f"|{expr.axis}|", positive=True)
    if isinstance(expr, Const):
        return SYMBOLIC.asarray(expr.value).item()
    if isinstance(expr, (Idx, IInt, IBin)):
        return fold_index(expr, lambda axis: sympy.Symbol(f"#{axis}", nonnegative=True), sympy.Integer,
                          lambda op, a, b: INDEX_ARITH[op](a, b))
    assert isinstance(expr, Box), f"calls are unfolded before reading: {expr}"
    if expr.op == "index":
        return _scalar(expr.index)  # type: ignore[arg-type]
    if not expr.target:
        args = [_scalar(a) for a in expr.args]
        return SYMBOLIC.binary[expr.op](*args) if expr.op in SYMBOLIC.binary else SYMBOLIC.unary[expr.op](args[0])
    body = sympy.sympify(math.prod((_scalar(a) for a in expr.args), start=sympy.Integer(1)))
    if any(sym.name[0] not in "|#" for sym in body.free_symbols):
        raise _Opaque  # it reduces the data (X * 0 does not: sympy reads it as 0)
    if expr.op not in ("sum", "mean", "contract"):
        raise _Unbounded
    for axis in expr.target:
        size = sympy.Symbol(f"|{axis}|", positive=True)
        body = sympy.summation(body, (sympy.Symbol(f"#{axis}", nonnegative=True), 0, size - 1))
        body = body / size if expr.op == "mean" else body
    return body


def _numbers(coefficient: Any) -> list[Any]:
    """The numeric coefficients of a coefficient that may involve variables (``25*X - 25``)."""
    if coefficient.is_number:
        return [coefficient]
    try:
        return [k for k in sympy.Poly(coefficient, *sorted(coefficient.free_symbols, key=str)).coeffs() if k.is_number]
    except sympy.PolynomialError:
        return [sympy.Integer(1)]


def _closed_scalars(lemma: LemmaDecl) -> list[float]:
    """|value| of every closed scalar term of ``lemma`` (no variable, size or axis), finite ones."""
    values = [abs(_closed_value(node)) for node in _nodes(lemma)
              if not any(n.axes or isinstance(n, (Var, Size)) or (isinstance(n, Box) and n.target) for n in walk(node))]
    return [v for v in values if math.isfinite(v)]


def _closed_value(expr: Expr) -> float:
    """The float64 value of a term with no variables and no sizes (``exp(exp(2))``)."""
    (value,) = evaluate_named(Diagram("closed", (), (), (expr,), ((),), ()), [], {}, FLOAT64)
    return float(value.data)


def _index_ints(node: object) -> Iterator[int]:
    """Every integer literal inside an index expression or predicate."""
    if isinstance(node, IInt):
        yield node.value
    for f in fields(node) if is_dataclass(node) else ():
        yield from _index_ints(getattr(node, f.name))
