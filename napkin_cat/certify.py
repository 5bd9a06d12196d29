"""Certification of lemmas and accumulator laws (verification tiers T1 and T2).

T1, symbolic: both sides are evaluated with the evaluator's own fold over sympy
scalars (``evaluate.SYMBOLIC``) on symbolic inputs, at every assignment of axis sizes up
to a bound, and each entry of the difference must simplify to 0.  Where ``Max``/``Min``
occur (running maxima) the check splits into cases: for every ordering of the scalars
inside them, the scalars are rewritten as t, t - p1, t - p1 - p2, ... with p_i >= 0,
which decides every Max/Min and covers ties.
T1½, exact (lemmas): the smallest combinations of sizes up to the lemma's reach
(``_reach``; every axis swept independently, ``_grid``) on random rational inputs, every
other combination scaled past the lemma's constants (``_scale``), evaluated over sympy
and compared to 50 digits.
T2, numeric: float64 evaluation at every combination of sizes up to the lemma's reach,
then on seeded random sizes and values (with fully masked rows for the accumulators with
a running max) must agree to 1e-9.  Lemmas are also evaluated on scaled inputs and on
the inputs where the evaluator's conventions decide values (all-zero and fully or partly
``-inf`` arguments, ``_edges``): wherever the left side is finite the right side must
equal it.

Accumulators are certified per consuming box signature (op, target, parameters,
operand types, streamed axis): the recomposition law combine(lift(x), lift(y)) =
lift(x ⊕ y), the identity law combine(identity, s) = s, the finaliser law
final(lift(x)) = box(x), and with padding lift(x ⊕ fill) = lift(x).  The symbolic tier
uses the unguarded forms (exact over the reals), the numeric tier the guarded ones.

Results are cached; ``napkin check`` uses the ``quick`` level, ``napkin check
--certify`` the ``full`` one.  Every certificate says what was checked.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields, is_dataclass
from functools import cache
from typing import Any

import numpy as np
import sympy

from napkin_cat import accumulators as acc
from napkin_cat.diagnostics import NapkinError
from napkin_cat.evaluate import FLOAT64, SYMBOLIC, Algebra, Named, evaluate_named
from napkin_cat.kernel import typed_box
from napkin_cat.terms import (
    Axis,
    Box,
    Const,
    Diagram,
    Expr,
    IBin,
    Idx,
    IInt,
    IndexExpr,
    LemmaDecl,
    Param,
    Size,
    Var,
    walk,
)

__all__ = ["LEVELS", "Certificate", "accumulator", "certify_lemma", "representative_boxes"]

#: (symbolic size bound, random float64 cases) per level
LEVELS: dict[str, tuple[int, int]] = {"quick": (2, 12), "full": (3, 60)}
_MAX_ORDERED = 5  # at most 5! orderings per symbolic case
_EXACT_ENTRIES = 512  # the exact tier's largest input (entries over all parameters)
_MAX_REACH = 24  # the largest size the float64 tier sweeps a lemma to (see _reach)
_MAX_GRID = 4096  # the most size combinations (reach ** axes) the float64 tier sweeps
_UNBOUNDED = -1  # _reach's answer when no size bounds where the lemma's branches switch
_EXACT_CASES = 120  # the most size combinations the exact tier evaluates (the smallest first)


@dataclass(frozen=True)
class Certificate:
    """The outcome of certifying one lemma or accumulator: ``ok``, how, or a counterexample."""

    ok: bool
    how: str
    counterexample: str | None = None


# ---- deciding equality of sympy scalars -------------------------------------------------------


def _zero(d: Any) -> bool:
    """Does ``d`` simplify to 0?  Cheap normal forms first (exponentials combined), then simplify."""
    for step in (sympy.expand, lambda e: sympy.powsimp(e, combine="exp"),
                 lambda e: sympy.expand(sympy.powsimp(sympy.together(e), combine="exp")), sympy.cancel):
        d = step(d)
        if d == 0:
            return True
    return bool(sympy.simplify(d) == 0)


def _ordered(exprs: Sequence[Any]) -> list[dict[Any, Any]]:
    """Substitutions covering every ordering of the scalars inside Max/Min (see module doc)."""
    inside: set[Any] = set()
    for e in exprs:
        for atom in sympy.sympify(e).atoms(sympy.Max, sympy.Min):
            inside |= atom.free_symbols
    if not inside:
        return [{}]
    names = sorted(inside, key=str)
    if len(names) > _MAX_ORDERED:
        raise _TooLarge
    top = sympy.Symbol("t", real=True)
    gaps = [sympy.Symbol(f"p{i}", nonnegative=True) for i in range(1, len(names))]
    cases = []
    for order in itertools.permutations(names):
        value: Any = top
        sub = {order[0]: top}
        for sym, gap in zip(order[1:], gaps, strict=True):
            value = value - gap
            sub[sym] = value
        cases.append(sub)
    return cases


class _TooLarge(Exception):
    pass


def _symbolic_equal(left: Sequence[Any], right: Sequence[Any]) -> bool:
    pairs = list(zip(left, right, strict=True))
    if all(_zero(a - b) for a, b in pairs if not (a - b).has(sympy.Max, sympy.Min)) and \
            all(not (a - b).has(sympy.Max, sympy.Min) for a, b in pairs):
        return True
    for sub in _ordered([a for p in pairs for a in p]):
        if not all(_zero(sympy.sympify(a).subs(sub) - sympy.sympify(b).subs(sub)) for a, b in pairs):
            return False
    return True


def _flat(values: Sequence[Named], order: Sequence[tuple[str, ...]] | None = None) -> list[Any]:
    out: list[Any] = []
    for i, v in enumerate(values):
        data = v.to(order[i]) if order is not None else v.data
        out.extend(np.asarray(data, dtype=object).ravel().tolist())
    return out


def _symbols(prefix: str, axes: tuple[str, ...], sizes: dict[str, int]) -> Named:
    shape = tuple(sizes[a] for a in axes)
    data = np.empty(shape, dtype=object)
    for index in np.ndindex(*shape):
        data[index] = sympy.Symbol(f"{prefix}{'_'.join(map(str, index))}", real=True)
    return Named(axes, data)


# ---- lemmas ------------------------------------------------------------------------------------


def _side(lemma: LemmaDecl, side: Expr) -> Diagram:
    return Diagram(lemma.name, lemma.params, (), (side,), (side.axes,), lemma.axes)


def _size_cases(axes: Sequence[str], bound: int) -> list[dict[str, int]]:
    return [dict(zip(axes, sizes, strict=True)) for sizes in itertools.product(range(1, bound + 1), repeat=len(axes))]


def _reach(lemma: LemmaDecl) -> int:
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
    lemma has a size source).
    """
    sources, constants = 0, 0
    for node in (n for side in (lemma.lhs, lemma.rhs) for n in walk(side)):
        sources += isinstance(node, Size) or (isinstance(node, Box) and bool(node.target))
        if isinstance(node, Box) and node.index is not None:
            constants = max(constants, 1 + sum(abs(v) for v in _index_ints(node.index)))
    # a size compared with a constant by a piecewise box (relu(x - 10), min(x, 10)) is a step there
    largest = max(constants, math.ceil(max([0.0, *_closed_scalars(lemma)]))) if sources else constants
    if (steps := _step_bound(lemma, 2 + sources + largest)) == math.inf:
        return _UNBOUNDED
    return 2 + sources + max(largest, math.ceil(steps) if sources else 0)


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
    polynomial in the sizes and positions (``sqrt(x) - 5``) counts as unbounded:
    bounded certification cannot place its step.
    """
    bound = 0.0
    for node in (n for side in (lemma.lhs, lemma.rhs) for n in walk(side)):
        if not isinstance(node, Box) or node.op not in ("relu", "abs", "maximum", "minimum", "onehot"):
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


class _Opaque(Exception):
    """A term whose value depends on the data through a reduction: the draws cover it."""


class _Unbounded(Exception):
    """A size- or position-dependent term with no polynomial reading."""


def _scalar(expr: Expr | IndexExpr) -> Any:
    """``expr`` on one element, over sympy: variables real symbols, each size |a| and each
    position #a (of an index box, or summed over) a positive symbol; a sum, mean or
    contraction of a term free of variables (after sympy's reading: ``X * 0`` is) is its
    sum over the positions (Faulhaber)."""
    if isinstance(expr, Var):
        return sympy.Symbol(expr.name, real=True)
    if isinstance(expr, Size):
        return sympy.Symbol(f"|{expr.axis}|", positive=True)
    if isinstance(expr, Const):
        return SYMBOLIC.asarray(expr.value).item()
    if isinstance(expr, Idx):
        return sympy.Symbol(f"#{expr.axis}", nonnegative=True)
    if isinstance(expr, IInt):
        return sympy.Integer(expr.value)
    if isinstance(expr, IBin):
        left, right = _scalar(expr.left), _scalar(expr.right)
        return left + right if expr.op == "+" else left - right if expr.op == "-" else left * right
    assert isinstance(expr, Box), expr
    if expr.op == "index":
        return _scalar(expr.index)  # type: ignore[arg-type]
    if not expr.target:
        args = [_scalar(a) for a in expr.args]
        binary: dict[str, Callable[[Any, Any], Any]] = {
            "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
            "div": lambda a, b: a / b, "maximum": sympy.Max, "minimum": sympy.Min}
        return binary[expr.op](*args) if expr.op in binary else SYMBOLIC.unary[expr.op](args[0])
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
    values = [abs(_closed_value(node)) for side in (lemma.lhs, lemma.rhs) for node in walk(side)
              if not any(n.axes or isinstance(n, (Var, Size)) or (isinstance(n, Box) and n.target) for n in walk(node))]
    return [v for v in values if math.isfinite(v)]


def _scale(lemma: LemmaDecl) -> float:
    """How large the inputs must get to cross the values the lemma compares with.

    A piecewise box compares a value with the lemma's constants (``relu(max[x](X) - 4)``,
    ``relu(X * 0.01 - 5)``); inputs of standard size never reach 4, let alone 500.  The
    scale is 2 plus the product over the distinct constants c of max(|c|, 1/|c|) (1000 for
    both 0.01 and 5 with 0.01 · X - 5: 500 is reached), capped at 1e6."""
    weights = {max(v, 1 / v) for v in _closed_scalars(lemma) if v > 0}
    return min(2 + math.prod(weights), 1e6)


def _closed_value(expr: Expr) -> float:
    """The float64 value of a term with no variables and no sizes (``exp(exp(2))``)."""
    (value,) = evaluate_named(Diagram("closed", (), (), (expr,), ((),), ()), [], {}, FLOAT64)
    return float(value.data)


def _index_ints(node: object) -> Iterator[int]:
    if isinstance(node, IInt):
        yield node.value
    for f in fields(node) if is_dataclass(node) else ():
        yield from _index_ints(getattr(node, f.name))


@cache
def certify_lemma(lemma: LemmaDecl, level: str = "quick") -> Certificate:
    """Check ``lemma`` symbolically up to the level's size bound and numerically at random.

    The float64 tier also checks every size up to the lemma's reach (``_reach``): all axes
    at each size 1..reach, then random sizes up to it.  A lemma reaching past
    ``_MAX_REACH`` is refused: bounded certification cannot vouch for it.  A lemma with a
    ``onehot`` box (a value read as a position) has no symbolic tier (a symbol is never
    equal to a position, so sympy would see only rows of zeros); its float64 tier draws
    integer-valued inputs in every other case, so both branches of the box are exercised.
    A lemma whose sides sympy cannot evaluate (``max(X, recip(0))``: complex infinity is
    not comparable) is refused.
    """
    try:
        return _certify_lemma(lemma, level)
    except ValueError as exc:  # raised by sympy on values it cannot order (complex infinity)
        return Certificate(False, "sympy", f"the sides cannot be evaluated exactly: {exc}")


def _certify_lemma(lemma: LemmaDecl, level: str) -> Certificate:
    bound, cases = LEVELS[level]
    lhs, rhs = _side(lemma, lemma.lhs), _side(lemma, lemma.rhs)
    axes = [a.name for a in lemma.axes]
    reach = _reach(lemma)
    if reach == _UNBOUNDED:
        return Certificate(False, "reach", "a piecewise box (relu, abs, max, min) compares a size non-polynomially "
                                           "(`relu(sqrt(x) - 5)`): bounded certification cannot place its step")
    if reach > _MAX_REACH:
        return Certificate(False, "reach", f"its sizes and constants reach {reach}, past the {_MAX_REACH} "
                                           "that bounded certification checks")
    if reach ** len(lemma.axes) > _MAX_GRID:
        return Certificate(False, "reach", f"its {len(lemma.axes)} axes, each swept to size {reach}, make "
                                           f"{reach ** len(lemma.axes)} size combinations, past the {_MAX_GRID} that "
                                           "bounded certification checks; state it on fewer axes")
    labels = any(isinstance(n, Box) and n.op == "onehot" for side in (lemma.lhs, lemma.rhs) for n in walk(side))
    checked, skipped = 0, 0
    for sizes in [] if labels else _size_cases(axes, bound):
        inputs = [_symbols(p.name, p.axes, sizes) for p in lemma.params]
        try:
            left = evaluate_named(lhs, inputs, dict(sizes), SYMBOLIC)
            right = evaluate_named(rhs, inputs, dict(sizes), SYMBOLIC)
        except NapkinError:
            continue  # sizes the lemma's reshapes do not admit (e.g. |x| != |y|·|z|)
        try:
            same = _symbolic_equal(_flat(left), _flat(right, [v.axes for v in left]))
        except _TooLarge:
            skipped += 1
            continue
        if not same:
            return Certificate(False, "sympy", _witness(lemma, lhs, rhs, sizes))
        checked += 1
    exact, problem = _exact_tier(lemma, lhs, rhs, reach, labels)
    if problem is not None:
        return Certificate(False, "exact", problem)
    numeric, problem = _float64_tier(lemma, lhs, rhs, reach, cases, labels)
    if problem is not None:
        return Certificate(False, "float64", problem)
    if (checked == 0 and not labels) or numeric == 0:
        return Certificate(False, "none", "no admissible sizes to check")
    extra = f", {skipped} too large for case splitting" if skipped else ""
    symbolic = "no sympy (onehot)" if labels else f"sympy {checked} size cases ≤{bound}{extra}"
    return Certificate(True, f"{symbolic}; exact {exact} sizes; float64 {numeric} cases, sizes ≤{reach}")


def _grid(axes: Sequence[str], reach: int) -> list[dict[str, int]]:
    """Every assignment of sizes 1..``reach`` to ``axes``, smallest total first.

    Equal sizes alone are not enough: a difference such as ``relu(x - y*z - 2)`` or
    ``(x - y) * ...`` vanishes wherever the axes are equal."""
    points = itertools.product(range(1, reach + 1), repeat=len(axes))
    return [dict(zip(axes, p, strict=True)) for p in sorted(points, key=lambda p: (sum(p), p))]


def _exact_tier(lemma: LemmaDecl, lhs: Diagram, rhs: Diagram, reach: int, labels: bool) -> tuple[int, str | None]:
    """(sizes checked, first disagreement): the smallest ``_EXACT_CASES`` size combinations
    up to ``reach`` (``_grid``) on random rational inputs (integers for onehot lemmas; every
    other combination's scaled by ``_scale``), evaluated exactly: a rational difference must
    be 0, any other is compared to 50 digits, so a difference far below float64's tolerance
    (``1e-10 * relu(x - 3)``, or 1e-35) is seen; sizes
    whose inputs exceed ``_EXACT_ENTRIES`` entries are left to float64."""
    rng = np.random.default_rng(3)
    checked, scale = 0, sympy.Integer(math.ceil(_scale(lemma)))
    for sizes in _grid([a.name for a in lemma.axes], reach):
        shapes = [[sizes[a] for a in p.axes] for p in lemma.params]
        if sum(math.prod(shape) for shape in shapes) > _EXACT_ENTRIES:
            continue
        if checked == _EXACT_CASES:
            break
        factor = scale if checked % 2 else sympy.Integer(1)  # every other point at the lemma's _scale
        inputs = [Named(p.axes, np.array([sympy.Integer(k) if labels else sympy.Rational(k, 8) * factor for k in
                                          rng.integers(-16, 17, math.prod(shape)).tolist()], dtype=object)
                        .reshape(shape)) for p, shape in zip(lemma.params, shapes, strict=True)]
        try:
            left = evaluate_named(lhs, inputs, dict(sizes), SYMBOLIC)
            right = evaluate_named(rhs, inputs, dict(sizes), SYMBOLIC)
        except NapkinError:
            continue
        for a, b in zip(_flat(left), _flat(right, [v.axes for v in left]), strict=True):
            exact = sympy.sympify(a) - sympy.sympify(b)
            d = sympy.N(exact, 50)  # rational when every operation was: then it must be 0
            if not (a == b or (exact == 0 if exact.is_Rational else d.is_number and d.is_finite and abs(d) < 1e-30)):
                return checked, (f"sizes {_fmt(sizes)} on rational inputs: {sympy.N(a, 12)} vs {sympy.N(b, 12)} "
                                 f"(difference {sympy.N(d, 3)})")
        checked += 1
    return checked, None


def _float64_tier(lemma: LemmaDecl, lhs: Diagram, rhs: Diagram, reach: int, cases: int,
                  labels: bool) -> tuple[int, str | None]:
    """(cases checked, first disagreement): every combination of sizes up to ``reach`` (the
    grid, not only equal sizes: ``relu(x - y*z*w - 2)`` is 0 wherever the axes are equal),
    then random sizes; with ``labels``, every other case draws integers in [-1, reach]
    instead of normals.  At each equal size the edge inputs (``_edges``) are checked too."""
    rng = np.random.default_rng(0)
    axes = [a.name for a in lemma.axes]
    grid = _grid(axes, reach)
    numeric, scale = 0, _scale(lemma)
    for draw in itertools.count():
        if draw >= len(grid) + 40 * cases or numeric >= cases + len(grid):
            break  # draws the lemma's reshapes do not admit are redrawn
        sizes = grid[draw] if draw < len(grid) else {a: int(rng.integers(1, max(5, reach + 1))) for a in axes}
        shapes = [[sizes[a] for a in p.axes] for p in lemma.params]
        values = [rng.integers(-1, reach + 1, s).astype(float) if labels and draw % 2 else rng.standard_normal(s)
                  for s in shapes]
        equal_sizes = len(set(sizes.values())) <= 1
        for edge, inputs in [("", values)] + (list(_edges(lemma, values, scale)) if equal_sizes else []):
            try:
                left = evaluate_named(lhs, _named(lemma, inputs), dict(sizes), FLOAT64)
                right = evaluate_named(rhs, _named(lemma, inputs), dict(sizes), FLOAT64)
            except NapkinError:
                break
            a, b = left[0].data, right[0].data if not left[0].axes else right[0].to(left[0].axes)
            if edge:  # a rewrite must keep every value the left side defines (a finite one)
                a, b = np.where(np.isfinite(a), a, 0.0), np.where(np.isfinite(a), b, 0.0)
            if not np.allclose(a, b, rtol=1e-9, atol=1e-9, equal_nan=True):
                return numeric, f"sizes {_fmt(sizes)}{edge}: {np.ravel(a)[:3]} vs {np.ravel(b)[:3]}"
        else:
            numeric += 1
    return numeric, None


def _named(lemma: LemmaDecl, values: Sequence[Any]) -> list[Named]:
    return [Named(p.axes, v) for p, v in zip(lemma.params, values, strict=True)]


def _edges(lemma: LemmaDecl, values: Sequence[Any], scale: float) -> Iterator[tuple[str, list[Any]]]:
    """Inputs past the standard draws: every input times the lemma's ``_scale``, then where
    the evaluator's conventions decide values (evaluate.py), per parameter: all zeros
    (normalising an all-zero row gives 0), all ``-inf`` (a fully masked row: softmax gives
    0) and half its entries ``-inf`` (a partly masked row)."""
    yield f" with the inputs times {scale:g}", [np.asarray(v) * scale for v in values]
    for i, param in enumerate(lemma.params):
        masked = np.array(values[i], dtype=float, copy=True)
        masked.reshape(-1)[::2] = -math.inf
        for what, value in (("0", np.zeros_like(values[i])), ("-inf", np.full_like(values[i], -math.inf)),
                            ("-inf at every other entry", masked)):
            yield f" with `{param.name}` = {what}", [value if j == i else v for j, v in enumerate(values)]


def _fmt(sizes: dict[str, int]) -> str:
    return ", ".join(f"{a}={n}" for a, n in sizes.items()) or "no axes"


def _witness(lemma: LemmaDecl, lhs: Diagram, rhs: Diagram, sizes: dict[str, int]) -> str:
    """Concrete float64 inputs at ``sizes`` on which the sides differ, if random ones find it."""
    rng = np.random.default_rng(2)
    for _ in range(20):
        inputs = [Named(p.axes, rng.standard_normal([sizes[a] for a in p.axes]).round(2)) for p in lemma.params]
        (left,) = evaluate_named(lhs, inputs, dict(sizes), FLOAT64)
        (right,) = evaluate_named(rhs, inputs, dict(sizes), FLOAT64)
        a, b = np.ravel(left.data), np.ravel(right.to(left.axes))
        if not np.allclose(a, b, rtol=1e-9, atol=1e-9, equal_nan=True):
            shown = ", ".join(f"{p.name}={np.ravel(x.data).tolist()}"
                              for p, x in zip(lemma.params, inputs, strict=True))
            return f"{_fmt(sizes)}, {shown}: left side {a.tolist()}, right side {b.tolist()}"
    return f"{_fmt(sizes)}: the sides differ symbolically"


# ---- accumulators ------------------------------------------------------------------------------


def _canonical(box: Box, axis: str) -> Box:
    """The box on typed variables, woven axes dropped: all that the laws depend on.

    Woven axes only broadcast every term of lift, combine and final, so the laws hold
    with them iff they hold without them.
    """
    keep = set(box.target) | {axis}
    args = tuple(Var(f"X{i}", tuple(a for a in x.axes if a in keep)) for i, x in enumerate(box.args))
    return typed_box(box.op, args, box.target, box.out, box.params)


def accumulator(box: Box, axis: str, name: str, pad: bool) -> str | None:
    """The kernel's oracle: how ``name`` was certified for ``box`` along ``axis``, or None."""
    cert = certify_accumulator(_canonical(box, axis), axis, name, pad, "quick")
    return cert.how if cert.ok else None


def _box_diagram(box: Box) -> Diagram:
    params = tuple(Param(a.name, a.axes) for a in box.args if isinstance(a, Var))
    axes = tuple(Axis(a) for a in dict.fromkeys(a for p in params for a in p.axes))
    return Diagram(box.op, params, (), (box,), (box.axes,), axes)


@cache
def certify_accumulator(box: Box, axis: str, name: str, pad: bool, level: str = "quick") -> Certificate:
    """Check the accumulator laws for a canonical box (see the module docstring)."""
    try:
        exact, guarded = acc.plan(box, axis, name, guard=False), acc.plan(box, axis, name, guard=True)
    except ValueError as exc:
        return Certificate(False, "plan", str(exc))
    if pad and exact.pad is None:
        return Certificate(False, "padding", f"no padding value leaves `{name}` unchanged")
    others = [a for a in dict.fromkeys(a for x in box.args for a in x.axes) if a != axis]
    splits = [(1, 1), (1, 2), (2, 1)] if level == "quick" else [(1, 1), (1, 2), (2, 1), (2, 2), (1, 3)]
    for n1, n2 in splits:
        sizes = dict.fromkeys(others, 1) | {axis: n1 + n2}
        problem = _laws(exact, box, sizes, n1, pad, SYMBOLIC, lambda i, s: _symbols(f"x{i}_", s.axes, s.sizes),
                        _symbolic_equal)
        if problem:
            return Certificate(False, "sympy", problem)
    rng = np.random.default_rng(1)
    cases = LEVELS[level][1]
    for case in range(cases):
        sizes = {a: int(rng.integers(1, 4)) for a in others}
        n1, n2 = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        sizes[axis] = n1 + n2
        masked = case % 4 == 3 and name in ("max", "logsumexp", "online_softmax")

        def draw(i: int, spec: _Spec, masked: bool = masked) -> Named:
            data = rng.standard_normal([spec.sizes[a] for a in spec.axes])
            if masked and i == 0 and data.ndim > 1:
                data[(0,) * (data.ndim - 1)] = -math.inf  # one fully masked row
            return Named(spec.axes, data)

        problem = _laws(guarded, box, sizes, n1, pad, FLOAT64, draw, _numeric_equal)
        if problem:
            return Certificate(False, "float64", problem)
    return Certificate(True, f"laws: sympy {len(splits)} splits; float64 {cases} random")


@dataclass(frozen=True)
class _Spec:
    axes: tuple[str, ...]
    sizes: dict[str, int]


def _numeric_equal(left: Sequence[Any], right: Sequence[Any]) -> bool:
    return bool(np.allclose(np.asarray(left, dtype=float), np.asarray(right, dtype=float), rtol=1e-9, atol=1e-9,
                            equal_nan=True))


def _laws(plan: acc.AccumulatorPlan, box: Box, sizes: dict[str, int], n1: int, pad: bool, algebra: Algebra,
          draw: Callable[[int, _Spec], Named], equal: Callable[[Sequence[Any], Sequence[Any]], bool]) -> str | None:
    """The first law that fails on one drawn input, or None."""
    axis = plan.axis
    n = sizes[axis]
    xs = [draw(i, _Spec(a.axes, sizes)) for i, a in enumerate(box.args)]
    part1 = [acc.chunk(x, axis, 0, n1) for x in xs]
    part2 = [acc.chunk(x, axis, n1, n) for x in xs]

    def lift(parts: list[Named], size: int) -> tuple[Named, ...]:
        return evaluate_named(plan.lift, parts, sizes | {axis: size}, algebra)

    def flat(values: Sequence[Named]) -> list[Any]:
        return _flat(values, [t for _, t in plan.state])

    whole = lift(xs, n)
    merged = evaluate_named(plan.combine, lift(part1, n1) + lift(part2, n - n1), dict(sizes), algebra)
    if not equal(flat(merged), flat(whole)):
        return f"combine(lift(x), lift(y)) != lift(x ⊕ y) at {_fmt(sizes)}"
    identity = tuple(Named((), algebra.asarray(v)) for v in plan.identity)
    unit = evaluate_named(plan.combine, identity + whole, dict(sizes), algebra)
    if not equal(flat(unit), flat(whole)):
        return f"combine(identity, s) != s at {_fmt(sizes)}"
    (final,) = evaluate_named(plan.final, whole, dict(sizes), algebra)
    (value,) = evaluate_named(_box_diagram(box), xs, dict(sizes), algebra)
    if not equal(_flat([final], [value.axes]), _flat([value])):
        return f"final(lift(x)) != {box.op}(x) at {_fmt(sizes)}"
    if pad and plan.pad is not None:
        filled = [acc.padded(x, axis, n + 1, fill) for x, fill in zip(xs, plan.pad, strict=True)]
        if algebra is SYMBOLIC:
            filled = [Named(f.axes, np.asarray(algebra.asarray(f.data.astype(object)))) for f in filled]
        if not equal(flat(lift(filled, n + 1)), flat(whole)):
            return f"lift(x ⊕ padding) != lift(x) at {_fmt(sizes)}"
    return None


def representative_boxes() -> list[tuple[Box, str]]:
    """One canonical box per accumulator family, for ``napkin check --certify``."""
    s, v = Var("X0", ("q", "x")), Var("X1", ("x", "d"))
    boxes: list[tuple[Box, str]] = []
    for op in ("sum", "mean", "max", "min", "prod", "logsumexp"):
        boxes.append((Box(op, (s,), ("q",), ("x",)), "x"))
    boxes.append((Box("contract", (s, v), ("q", "d"), ("x",)), "x"))
    for params in (("exp", "exp", "id"), ("id", "square", "sqrt"), ("id", "square", "rms")):
        boxes.append((Box("ncontract", (s, v), ("q", "d"), ("x",), (), params), "x"))
    return boxes
