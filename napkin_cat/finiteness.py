"""TRUSTED: a sound finiteness and sign analysis, to discharge a lemma's ``when c finite``
condition, decide what an accumulator's proof or test covers, and let a kernel skip a chunk.

Domain (README "The domain"): every input entry is a finite value of float32's range, 0 or
2^-149 ≤ |x| ≤ 2^128 (what every kernel reads), every axis has 1 to 2^62 positions; ``±inf``
enters only through constants (masks) and what ops make of them, and every op computes in
float64.  The analysis is abstract interpretation over the *classes* of a float64 value::

    "-inf"   "-" (negative, finite)   "0" (either sign of zero)   "+"   "+inf"   "nan"

with, for the finite non-zero entries, bounds ``lo ≤ log2 |x| ≤ hi`` (``Abstract``).  A
term's abstract value contains the class of every entry of its float64 value, for every
input in the domain, with the evaluator's conventions (``evaluate.py``).  Inputs are
``{-, 0, +}`` within ``DOMAIN`` (but an array a chain's earlier kernel wrote
holds what the diagram computing it gives: ``input_values``), constants their class and magnitude, sizes ``{+}`` up to
2^62; a binding is read through, anything else (a diagram used as a box, an unknown name,
an op without a rule) is ``TOP``, every class.  ``RULES`` holds one transfer rule per op of
``ops.OPS`` (a test checks that, and each rule against the evaluator).  Each rule gives the
classes over the extended reals and bounds the magnitude; ``_float64`` then adds what
float64 makes of the bounds: ``±inf`` where a finite result may reach 2^1024 (overflow:
``exp`` of a value past 709.8, ``x·y``, ``1/x`` of a subnormal, a product over many
positions), ``0`` where it may fall below 2^-1074 (underflow: ``exp`` past -745).

- unary ops map class by class (``UNARY``): ``exp(-inf) = 0`` (so ``exp`` of a mask is
  ``{0, +}``, not positive), ``exp(+inf) = +inf``; ``log``: ``0 → -inf``, negative → nan;
  ``sqrt``/``rsqrt`` of a negative → nan, ``rsqrt``/``recip`` of 0 → ``±inf`` (the zero's sign);
  ``gelu``/``silu`` of ``-inf`` → nan (``-inf · 0``), of a negative possibly 0 (float64's
  ``1 + erf`` cancels, ``expit`` underflows); ``log`` of a positive value whose magnitude
  bounds put it above 1 (below 1) is positive (negative): ``log(16)``; ``floor`` keeps ±inf and a negative's sign, and
  makes a positive value below 1 zero, its non-zero values at least 1 in magnitude; nan stays nan;
- binary ops combine every pair of classes (``_PAIR``): ``+inf + -inf = nan``,
  ``0 · ±inf = nan``, signs multiply; ``a - b = a + (-b)``, ``a / b = a · (1/b)``; and two
  relational facts: the guarded divisor ``d + (1 - g)``, ``g`` = ``square(sign d)`` or
  ``abs(sign d)``, is 1 where d = 0 and d elsewhere; gelu's slope term
  ``(gelu(x) + c·e) / (x + e)``, ``e = 1 - square(sign x)``, is Φ(x) = gelu(x)/x in [0, 2]
  (rounding included) where x ≠ 0 and c where x = 0, for a finite x (``_Analysis.gelu_ratio``);
- a reduction over n ≥ 1 positions (up to 2^62 per axis it reduces: ``_entries``) folds its
  pair rule to a fixed point (every sum,
  product, maximum or minimum of one or more entries); ``mean`` as ``sum``; ``cumsum`` as
  ``sum`` (each prefix is a sum of one or more entries); ``linrec`` the least set holding X
  and closed under h ↦ A·h + X; ``logsumexp`` is finite (at least its maximum) unless its maximum is infinite or nan;
- a normalisation or normalised contraction ``a1(s) / b(Σ a2(s))`` (0 where the normaliser
  is 0) composes those rules; exp's weights under ``id`` read scores shifted by their finite maximum, so
  are in [0, 1] (the relational fact s - max s ≤ 0); ``contract`` is the sum of the product
  of its operands (of three or more, every partial product bounded: ``_product``);
- input relations (``given L = logsumexp[x](s)``, ``terms.relations``: the diagram claims only
  inputs where L is that expression of its other inputs, a backward pass's saved statistic):
  ``exp(s - L)`` of the same term s (bindings read through) is in [0, 1], since the evaluator's
  logsumexp is at least its maximum and L is finite (``_Analysis.shifted``); no other use of a
  relation (an input it gives is otherwise any finite value, as every input); where a relation
  itself may be infinite or NaN (``relation_unbounded``, with one fact of index masks: a row of
  ``where(pred, A, -inf)`` keeps an entry when pred holds at position 0), the diagram has no input
  there, which ``--strict`` refuses (``proof._vacuous``);
- ``where`` is either operand, ``index`` a finite integer, ``onehot`` 0 or 1, reshapes
  and renames keep their operand's classes.

``finite`` asks for ``{-, 0, +}``, ``masked`` also admits ``-inf`` (a mask).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import reduce as fold
from typing import Union

from napkin_cat import ops
from napkin_cat.terms import (
    Apply,
    Box,
    Cmp,
    Const,
    Diagram,
    Expr,
    IBin,
    IInt,
    IndexExpr,
    Logic,
    Param,
    Pred,
    Rewrite,
    Size,
    Step,
    Var,
    relations,
    walk,
)

__all__ = ["DOMAIN", "EXTENDED", "FINITE", "INFINITE", "MASKS", "MASKS_TESTED", "RULES", "TOP", "UNARY", "Abstract",
           "Inputs", "Value", "abstract", "analyse", "cancelled_absorptions", "cancelling_sums", "class_of", "finite",
           "finite_in", "float_unsafe_box", "fold_overflows", "index_may_wrap", "input_values", "masked", "narrowed",
           "overflow_box",
           "relation_unbounded", "signed_zero_writes", "unsupported"]

Value = frozenset[str]
#: the classes in order (``maximum`` keeps the larger), nan apart
ORDER = ("-inf", "-", "0", "+", "+inf")
FINITE: Value = frozenset({"-", "0", "+"})
TOP: Value = frozenset({*ORDER, "nan"})


def class_of(v: float) -> str:
    """The class of one float: ``-inf``, ``-``, ``0`` (either sign), ``+``, ``+inf`` or ``nan``."""
    return "nan" if math.isnan(v) else "0" if v == 0 else ("-" if v < 0 else "+") + ("inf" if math.isinf(v) else "")


def _v(text: str) -> Value:
    return frozenset(text.split())


#: unary ops class by class (nan → nan for every op); ``id`` is a normalised contraction's activation
UNARY: dict[str, dict[str, str]] = {
    "id": {c: c for c in ORDER},
    "exp": {"-inf": "0", "-": "+", "0": "+", "+": "+", "+inf": "+inf"},
    "log": {"-inf": "nan", "-": "nan", "0": "-inf", "+": "- 0 +", "+inf": "+inf"},
    "neg": {"-inf": "+inf", "-": "+", "0": "0", "+": "-", "+inf": "-inf"},
    "sqrt": {"-inf": "nan", "-": "nan", "0": "0", "+": "+", "+inf": "+inf"},
    "rsqrt": {"-inf": "nan", "-": "nan", "0": "-inf +inf", "+": "+", "+inf": "0"},
    "recip": {"-inf": "0", "-": "-", "0": "-inf +inf", "+": "+", "+inf": "0"},
    "square": {"-inf": "+inf", "-": "+", "0": "0", "+": "+", "+inf": "+inf"},
    "abs": {"-inf": "+inf", "-": "+", "0": "0", "+": "+", "+inf": "+inf"},
    "tanh": {"-inf": "-", "-": "-", "0": "0", "+": "+", "+inf": "+"},
    "sigmoid": {"-inf": "0", "-": "+", "0": "+", "+": "+", "+inf": "+"},
    "relu": {"-inf": "0", "-": "0", "0": "0", "+": "+", "+inf": "+inf"},
    "gelu": {"-inf": "nan", "-": "- 0", "0": "0", "+": "+", "+inf": "+inf"},
    "silu": {"-inf": "nan", "-": "- 0", "0": "0", "+": "+", "+inf": "+inf"},
    "sign": {"-inf": "-", "-": "-", "0": "0", "+": "+", "+inf": "+"},
    # below 1 a positive value's floor is 0; a negative one's is at most -1
    "floor": {"-inf": "-inf", "-": "-", "0": "0", "+": "0 +", "+inf": "+inf"},
}


def _unary(op: str, a: Value) -> Value:
    if op not in UNARY:
        return TOP  # an op without a rule could be anything
    return frozenset().union(*(_v("nan") if c == "nan" else _v(UNARY[op][c]) for c in a))


def _add(a: str, b: str) -> Value:
    if "nan" in (a, b) or {a, b} == {"-inf", "+inf"}:
        return _v("nan")
    if a.endswith("inf") or b.endswith("inf"):
        return _v(a if a.endswith("inf") else b)
    return _v(b) if a == "0" else _v(a) if b in ("0", a) else FINITE  # a negative plus a positive: any


def _mul(a: str, b: str) -> Value:
    if "nan" in (a, b) or ({a, b} & {"-inf", "+inf"} and "0" in (a, b)):
        return _v("nan")
    if "0" in (a, b):
        return _v("0")
    negative = a.startswith("-") != b.startswith("-")
    infinite = a.endswith("inf") or b.endswith("inf")
    return _v(("-" if negative else "+") + ("inf" if infinite else ""))


def _extremum(pick: Callable[..., int]) -> Callable[[str, str], Value]:
    return lambda a, b: _v("nan") if "nan" in (a, b) else _v(ORDER[pick(ORDER.index(a), ORDER.index(b))])


#: binary ops on one class of each operand
_PAIR: dict[str, Callable[[str, str], Value]] = {
    "add": _add,
    "sub": lambda a, b: frozenset().union(*(_add(a, n) for n in _unary("neg", _v(b)))),
    "mul": _mul,
    "div": lambda a, b: frozenset().union(*(_mul(a, r) for r in _unary("recip", _v(b)))),
    "maximum": _extremum(max),
    "minimum": _extremum(min),
}


def _pairs(op: str, a: Value, b: Value) -> Value:
    return frozenset().union(*(_PAIR[op](x, y) for x in a for y in b))


def _folded(op: str, a: Value) -> Value:
    """Every ``op``-fold of one or more entries of ``a`` (a reduction over n ≥ 1 positions)."""
    out = a
    while (grown := out | _pairs(op, out, a)) != out:
        out = grown
    return out


def _logsumexp(a: Value) -> Value:
    """m + log Σ exp(x - m) with m the maximum: at least m where m is finite, else m."""
    top = _folded("maximum", a)
    finite_max = [c for c in ORDER[1:4] if c in top]
    return (top - FINITE) | (frozenset(ORDER[ORDER.index(finite_max[0]):4]) if finite_max else frozenset())


#: float64's range in log2: the largest finite value is just below 2^1024 (a result from
#: 2^1023.99 up may round to inf), the smallest non-zero one 2^-1074
OVERFLOW, UNDERFLOW = 1023.99, -1074.0
#: the largest finite float64: a backward's guarded shift max(L, -GUARD) (``grad._weights``,
#: ``certify.accumulators.FLOAT_MAX``) is L wherever L is not -inf
GUARD = sys.float_info.max
#: the inputs' magnitudes (log2 |x| of a non-zero entry): float32's range, subnormals included
DOMAIN = (-149.0, 128.0)
#: an axis's positions at most, in log2 (2^62 entries of 4 bytes fill 2^64 bytes)
POSITIONS = 62.0
#: an index expression's value at most, in log2: positions and constants in int64 arithmetic,
#: which wraps past 2^63 (``evaluate._index``), so a product of positions is still within it
INDEX = 63.0
#: |log x| of a float64 x ≠ 1 is at least about 2^-53
LOG_FLOOR = -53.0
#: how far from 0 log2 bounds must put a value for ``log`` to take its side of 1: a product's
#: or quotient's bounds are the reals' (``_bin``), and its rounding may bring a value bounded just
#: above 1 down to 1 (log 0); 2^-20 in log2 is past 2^30 roundings of 2^-53 each
SIDE = 2.0 ** -20
LOG2E, LN2 = math.log2(math.e), math.log(2.0)
#: log2 of (1 + 2^-53)^(2^62), what the roundings of a product over an axis can add
ROUNDING = 2.0 ** (POSITIONS - 53.0) * LOG2E


@dataclass(frozen=True)
class Abstract:
    """A term's classes, and ``lo ≤ log2 |x| ≤ hi`` for its finite non-zero entries; ``given``, for
    an input a relation gives (``terms.relations``), the expression of the other inputs it equals."""

    classes: Value
    lo: float = UNDERFLOW
    hi: float = OVERFLOW
    given: Expr | None = field(default=None, compare=False)


def _float64(classes: Value, lo: float, hi: float, rounds: bool) -> Abstract:
    """The value of a rule whose extended-real classes are ``classes`` and whose finite
    non-zero entries are within 2^lo..2^hi over the reals: float64 rounds those past 2^1024
    to ±inf and those below 2^-1074 to 0 (where ``rounds``; the analysis's ``rounds``, false
    for the boxes ``_ExactAt`` takes over the extended reals, rounds nothing)."""
    signs = classes & _v("- +") if rounds else frozenset()
    if signs and hi >= OVERFLOW:
        classes = classes | {f"{c}inf" for c in signs}
    if signs and lo < UNDERFLOW:
        classes = classes | _v("0")
    return Abstract(classes, max(min(lo, OVERFLOW), UNDERFLOW), min(max(hi, UNDERFLOW), OVERFLOW))


def _exp2(log: float) -> float:
    """2^log, capped where it is past any exponent float64's exp survives."""
    return 2.0 ** min(log, 20.0)


def _unary_magnitude(op: str, x: Abstract) -> tuple[float, float]:
    """Bounds of log2 |op(x)| over the reals for x's finite non-zero entries."""
    lo, hi = x.lo, x.hi
    negative, positive = "-" in x.classes, "+" in x.classes
    big = _exp2(hi) * LOG2E  # |x| ≤ 2^hi: exp(x) within 2^±big
    if op in ("id", "neg", "abs", "relu"):
        return lo, hi
    if op == "sign":
        return 0.0, 0.0
    if op == "floor":  # a non-zero integer, |floor x| ≤ |x| + 1 (x negative), ≤ |x| (x positive)
        return 0.0, max(hi, 0.0) + (1.0 if negative else 0.0)
    if op in ("square", "sqrt", "rsqrt", "recip"):
        k = {"square": 2.0, "sqrt": 0.5, "rsqrt": -0.5, "recip": -1.0}[op]
        return min(k * lo, k * hi), max(k * lo, k * hi)
    if op == "exp":
        return (-big if negative else 0.0), (big if positive else 0.0)
    if op == "log":
        return LOG_FLOOR, math.log2(max(abs(lo), abs(hi), 2.0 ** LOG_FLOOR) * LN2)
    if op == "tanh":
        return min(lo, 0.0) - 1.0, min(hi, 0.0)
    if op == "sigmoid":  # in (0, 1]; exp(x)/2 at least for a negative x
        return (-big - 1.0 if negative else -1.0), 0.0
    if op == "gelu":  # x·(1 + erf(x/√2))/2: a non-zero 1 + erf in float64 is at least 2^-53
        return lo - (55.0 if negative else 1.0), hi
    if op == "silu":  # x·expit(x), expit(x) ≥ exp(x)/2 for x < 0
        return lo - (big + 1.0 if negative else 1.0), hi
    return UNDERFLOW - 1.0, OVERFLOW  # an op without a magnitude rule: anything finite


def _un(op: str, x: Abstract, rounds: bool) -> Abstract:
    if op not in UNARY:
        return Abstract(TOP)  # an op without a rule could be anything
    classes = _unary(op, x.classes)
    if op == "log" and (x.lo > SIDE or x.hi < -SIDE):  # |x| > 1 (< 1): a finite log has the sign of log |x|
        classes = (classes - FINITE) | (_v("+" if x.lo > SIDE else "-") if "+" in x.classes else frozenset())
    lo, hi = _unary_magnitude(op, x)  # of the finite non-zero entries' images
    if any(UNARY[op][c] in FINITE - _v("0") for c in x.classes & _v("-inf +inf")):
        # an infinite entry's finite image (tanh, sigmoid, sign of ±inf) is ±1 (test_finiteness checks it): tanh of a
        # term whose finite entries are below 1e-40 but which may be +inf is 1 there, not below 1e-40
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    return _float64(classes, lo, hi, rounds)


def _bin(op: str, a: Abstract, b: Abstract, rounds: bool) -> Abstract:
    classes = _pairs(op, a.classes, b.classes)
    if op in ("add", "sub"):  # a sum of floats that does not cancel to 0 is at least the smaller ulp; one of
        # operands of opposite signs (a difference of one sign: c - 5 for c ≥ 0) is at most the larger, rounded too
        signs = [v.classes & _v("- +") for v in (a, b)]
        apart = signs[0] == signs[1] if op == "sub" else signs[0].isdisjoint(signs[1])
        grow = 0.0 if apart and all(len(x) == 1 for x in signs) and not (a.classes | b.classes) - FINITE else 1.0
        # operands of one direction (a sum of non-negatives: mean(X²) + eps) cannot cancel (rounding is
        # monotone and each operand is a float): a non-zero sum is one of three cases, its bound the least
        lo = min(a.lo, b.lo) - 53.0
        direction = signs[0] | (frozenset({"-": "+", "+": "-"}[c] for c in signs[1]) if op == "sub" else signs[1])
        if len(direction) == 1:
            both = max(a.lo, b.lo) if signs[0] and signs[1] else None  # both non-zero: at least the larger
            b_alone = b.lo if "0" in a.classes and signs[1] else None  # a is 0: the sum is ±b
            a_alone = a.lo if "0" in b.classes and signs[0] else None  # b is 0: the sum is a
            lo = min((c for c in (both, b_alone, a_alone) if c is not None), default=lo)
        return _float64(classes, max(lo, UNDERFLOW), max(a.hi, b.hi) + grow, rounds)
    if op == "mul":
        return _float64(classes, a.lo + b.lo, a.hi + b.hi, rounds)
    if op == "div":
        return _float64(classes, a.lo - b.hi, a.hi - b.lo, rounds)
    return _float64(classes, min(a.lo, b.lo), max(a.hi, b.hi), rounds)  # maximum, minimum


def _entries(box: Box) -> float:
    """log2 of the most entries ``box`` reduces: 2^62 per axis of its target (a reduction over k
    axes folds up to 2^(62k) entries of operands it need not hold: ``sum[x y](A * B)``)."""
    return POSITIONS * max(1, len(box.target))


def _fold(op: str, a: Abstract, rounds: bool, entries: float = POSITIONS) -> Abstract:
    """Every ``op``-fold of 1 to 2^entries entries of ``a`` (a reduction)."""
    classes = _folded(op, a.classes)
    if op == "add":  # a rounded partial sum s + x that grows past s + x grows by at most x: 2·Σ|x|
        return _float64(classes, max(a.lo - 53.0, UNDERFLOW), a.hi + entries + 1.0, rounds)
    if op == "mul":  # |x| ≤ 2^hi over 2^entries factors, each rounding by at most (1 + 2^-53)
        rounding = 2.0 ** (entries - 53.0) * LOG2E
        return _float64(classes, (a.lo * 2.0 ** entries if a.lo < 0 else a.lo) - rounding,
                        (a.hi * 2.0 ** entries if a.hi > 0 else a.hi) + rounding, rounds)
    return _float64(classes, a.lo, a.hi, rounds)  # maximum, minimum


#: an axis's size
SIZE = Abstract(_v("+"), 0.0, POSITIONS)


def _weights(params: tuple[str, ...], s: Abstract, rounds: bool, entries: float, vanish: bool = True) -> Abstract:
    """a1(s) / b(Σ a2(s)), 0 where the normaliser is 0.  exp's weights read s - max s
    (evaluate.exp_shift): where the maximum is finite, s - max s ≤ 0 (``-inf`` where masked), its
    exponential in [0, 1] (0 where it underflows), and the normaliser at least the maximum's
    exp(0) = 1, so the weights are in [0, 1]; where it is -inf (every entry is) they are 0, where
    it is +inf or NaN NaN throughout (exp(inf - inf) = NaN in the sum).  Only
    under ``id``: the weights are shift invariant under no other normaliser, and the evaluator
    reads exp(s) unshifted there (composed: exp(s) may overflow).  Without ``vanish`` a finite
    score's weight is positive, as over the extended reals (``_underflows``: exp(s - max s) > 0)."""
    if params[0] == params[1] == "exp" and params[2] == "id":
        top = _fold("maximum", s, rounds, entries)
        finite = _v("0 +" if vanish else "+")
        weights = frozenset().union(*({"-inf": _v("0"), "nan": _v("nan")}.get(c, finite if c in FINITE else
                                                                               frozenset()) for c in s.classes))
        # at most 1
        bounded = Abstract(weights if top.classes & FINITE else frozenset(), UNDERFLOW, 0.0)
        if not (rest := top.classes - FINITE):
            return bounded
        # the maximum not finite: 0 where it is -inf (a fully masked row), NaN where it is +inf or NaN
        return _join(bounded, Abstract((_v("0") if "-inf" in rest else frozenset())
                                       | (_v("nan") if rest - _v("-inf") else frozenset()), UNDERFLOW, 0.0))
    return _composed(params, s, rounds, entries)


def _composed(params: tuple[str, ...], s: Abstract, rounds: bool, entries: float) -> Abstract:
    a1, a2, b = params
    z = _fold("add", _un(a2, s, rounds), rounds, entries)
    count = Abstract(_v("+"), 0.0, entries)
    denom = z if b == "id" else _un("sqrt", z if b == "sqrt" else _bin("div", z, count, rounds), rounds)
    nonzero = Abstract(denom.classes - _v("0"), denom.lo, denom.hi)
    out = _bin("div", _un(a1, s, rounds), nonzero, rounds)
    return _join(out, Abstract(_v("0"), out.lo, out.hi)) if "0" in denom.classes else out


def _join(a: Abstract, b: Abstract) -> Abstract:
    if not a.classes:
        return b
    if not b.classes:
        return a
    return Abstract(a.classes | b.classes, min(a.lo, b.lo), max(a.hi, b.hi))


def _recurrence(a: Value, x: Value) -> Value:
    """Every h of h[0] = x[0], h[t] = a[t]·h[t-1] + x[t]: the least set holding ``x`` and
    closed under h ↦ a·h + x (a fixed point, as ``_folded``)."""
    out = x
    while (grown := out | _pairs("add", _pairs("mul", a, out), x)) != out:
        out = grown
    return out


def _linrec(a: Abstract, x: Abstract, rounds: bool) -> Abstract:
    """linrec: h[t] = Σ_{s ≤ t} (Π_{s < r ≤ t} a[r])·x[s] over up to 2^62 positions: its
    classes the fixed point of ``_recurrence``; within 2^62 times the largest x while |a| ≤ 1,
    else a product of up to 2^62 factors past 1 (``_fold``'s bound for ``mul``), with the
    roundings of both; a non-zero entry may underflow."""
    grow = a.hi * 2.0 ** POSITIONS if a.hi > 0 else 0.0
    return _float64(_recurrence(a.classes, x.classes), UNDERFLOW - 1.0, x.hi + grow + POSITIONS + 1.0 + ROUNDING,
                    rounds)


def _product(vs: list[Abstract], rounds: bool) -> Abstract:
    """A contraction's product of its operands at one position, in whatever order the evaluator
    multiplies them (einsum picks a pairwise path by cost: of X^5 [x], 1e-300·sign(Z) [q x] and
    Y^5 [x] it multiplies the two vectors first, 2^1100 = inf, where the left-to-right order stays
    near 2^200): every partial product of a subset lies within 2^(Σ min(lo, 0))..2^(Σ max(hi, 0));
    where one may overflow or underflow, a later factor 0 or ±inf may also make it NaN."""
    ordered = fold(lambda a, b: _bin("mul", a, b, rounds), vs)
    if len(vs) < 3:
        return ordered
    lo, hi = sum(min(v.lo, 0.0) for v in vs), sum(max(v.hi, 0.0) for v in vs)
    partial = _float64(ordered.classes, lo, hi, rounds)
    nan = _v("nan") if partial.classes != ordered.classes else frozenset()
    return _join(ordered, replace(partial, classes=partial.classes | nan))


_REDUCE = {"sum": "add", "mean": "add", "prod": "mul", "max": "maximum", "min": "minimum"}

#: one transfer rule per op: (the box, its operands' values, the analysis) -> the box's value
Rule = Callable[[Box, list[Abstract], "_Analysis"], Abstract]


def _lse(a: Abstract, rounds: bool, entries: float) -> Abstract:
    """logsumexp of up to 2^entries entries: within log(2^entries) (43 per axis) above its maximum,
    so |lse| ≤ 2^hi + k ≤ 2·max(2^hi, k), k = entries·ln 2 + 1 (not capped as ``_exp2`` caps an
    exponent: the maximum itself may be as large as 2^hi)."""
    return _float64(_logsumexp(a.classes), UNDERFLOW, max(a.hi, math.log2(entries * LN2 + 1.0)) + 1.0, rounds)


def _rule(op: str) -> Rule:
    kind = ops.OPS[op].kind
    if op == "exp":
        return lambda box, vs, an: an.shifted(box) or _un(op, vs[0], an.rounds)
    if kind == "unary":
        return lambda box, vs, an: _un(op, vs[0], an.rounds)
    if op == "add":
        return lambda box, vs, an: an.guarded(box, vs) or _bin("add", vs[0], vs[1], an.rounds)
    if op == "div":
        return lambda box, vs, an: an.gelu_ratio(box) or _bin("div", vs[0], vs[1], an.rounds)
    if kind == "binary":
        return lambda box, vs, an: _bin(op, vs[0], vs[1], an.rounds)
    if op == "logsumexp":
        return lambda box, vs, an: _lse(vs[0], an.rounds, _entries(box))
    if op == "mean":
        return lambda box, vs, an: _bin("div", _fold("add", vs[0], an.rounds, _entries(box)),
                                        Abstract(_v("+"), 0.0, _entries(box)), an.rounds)
    if kind == "reduce":
        return lambda box, vs, an: _fold(_REDUCE[op], vs[0], an.rounds, _entries(box))
    if op == "cumsum":  # each entry a sum of 1 to 2^62 entries
        return lambda box, vs, an: _fold("add", vs[0], an.rounds)
    if op == "linrec":
        return lambda box, vs, an: _linrec(vs[0], vs[1], an.rounds)
    if kind == "normalise":
        return lambda box, vs, an: _weights(ops.OPS[op].weights or ("", "", ""), vs[0], an.rounds, _entries(box))
    if kind == "ncontract":
        return lambda box, vs, an: _fold("add", _bin("mul", _weights(box.params, vs[0], an.rounds, _entries(box),
                                                                     an.vanish), vs[1], an.rounds), an.rounds,
                                         _entries(box))
    if kind == "contract":
        return lambda box, vs, an: _fold("add", _product(vs, an.rounds), an.rounds, _entries(box))
    if kind == "where":
        return lambda box, vs, an: _join(vs[0], vs[1])
    if kind == "compare":
        return lambda box, vs, an: Abstract(_v("0 +"), 0.0, 0.0)
    if kind == "select":
        return lambda box, vs, an: _join(vs[1], vs[2])
    if kind == "gather":  # an entry of the table; a NaN position (inf - inf of integers) reads NaN
        return lambda box, vs, an: _join(vs[0], Abstract(_v("nan"))) if "nan" in vs[1].classes else vs[0]
    if kind == "topk":  # a position along the axis: 0 <= p < 2^62
        return lambda box, vs, an: Abstract(_v("0 +"), 0.0, POSITIONS)
    if kind == "index":  # an integer the evaluator computes in int64 (wrapping): |value| ≤ 2^63
        return lambda box, vs, an: Abstract(FINITE, 0.0, INDEX)
    if kind == "onehot":
        return lambda box, vs, an: Abstract(_v("0 +"), 0.0, 0.0)
    if kind in ("split", "join", "rename", "transpose"):
        return lambda box, vs, an: vs[0]
    return lambda box, vs, an: Abstract(TOP)  # an op of a kind without a rule could be anything


RULES: dict[str, Rule] = {op: _rule(op) for op in ops.OPS}


class _Analysis:
    """The abstract values of a diagram's terms: ``defs`` maps binding names to their
    expressions, ``inputs`` the inputs to their values (finite values within ``DOMAIN``).
    ``rounds``: the rules it passes itself to add what float64's rounding makes of their
    bounds (overflow to ±inf, underflow to 0); false, the extended reals (``_ExactAt``).  ``vanish``: a
    normalised contraction's weight of a finite score may be 0 (float64's underflow; false only in
    ``_underflows``, which asks whether its products underflow)."""

    def __init__(self, defs: Mapping[str, Expr], inputs: Mapping[str, Abstract], rounds: bool = True,
                 vanish: bool = True):
        self.defs, self.inputs, self.seen, self.rounds = defs, inputs, dict[str, Abstract](), rounds
        self.vanish = vanish

    def value(self, expr: Expr) -> Abstract:
        if isinstance(expr, Var):
            if expr.name in self.inputs:
                return self.inputs[expr.name]
            if expr.name not in self.defs:
                return Abstract(TOP)
            if expr.name not in self.seen:
                self.seen[expr.name] = Abstract(TOP)  # a cycle (none in a diagram) would read TOP
                self.seen[expr.name] = self.value(self.defs[expr.name])
            return self.seen[expr.name]
        if isinstance(expr, Const):
            v = expr.value
            exact = math.log2(abs(v)) if math.isfinite(v) and v != 0 else 0.0
            return Abstract(frozenset({class_of(v)}), exact, exact)
        if isinstance(expr, Size):
            return SIZE
        if not isinstance(expr, Box) or expr.op not in RULES:
            return Abstract(TOP)
        return RULES[expr.op](expr, [self.value(a) for a in expr.args], self)

    def through(self, expr: Expr) -> Expr:
        while isinstance(expr, Var) and expr.name in self.defs and expr.name not in self.inputs:
            expr = self.defs[expr.name]
        return expr

    def shifted(self, box: Box) -> Abstract | None:
        """``exp(s - L)`` with ``L`` an input given as ``logsumexp[x](s)`` (``given``; the same term
        s, bindings read through, reduced over any axes): in [0, 1], or NaN on a row that L's value
        (its relation's, ``input_values``) may give ``-inf``.  The evaluator's logsumexp is
        m + log1p(k - 1 + Σ exp(s - m)) ≥ m, the maximum, so where L is finite every entry of s is
        ``-inf`` or finite and at most L: s - L is ``-inf`` or ≤ 0, its exp 0 or in (0, 1] (0 where it
        underflows); where L is ``-inf`` every entry of its row is (a row with a +inf or a NaN has L
        +inf or NaN), and -inf - -inf is NaN (a relation over a row a mask may empty), unless L is
        guarded, ``exp(s - max(L, -GUARD))`` (``grad._weights``): a finite L is at least -GUARD (so the
        guard is L), and at L = -inf the row's s - (-GUARD) is -inf, its exp 0.  None for any other exp,
        and where L may be +inf or NaN."""
        arg = self.through(box.args[0])
        if not (isinstance(arg, Box) and arg.op == "sub"):
            return None
        stat, guarded = self.through(arg.args[1]), False
        if isinstance(stat, Box) and stat.op == "maximum" and self.through(stat.args[1]) == Const(-GUARD):
            stat, guarded = stat.args[0], True
        shift = self.inputs.get(stat.name) if isinstance(stat, Var) else None
        relation = shift.given if shift is not None and shift.classes <= FINITE | {"-inf"} else None
        if not (isinstance(relation, Box) and relation.op == "logsumexp" and self.same(arg.args[0], relation.args[0])):
            return None
        assert shift is not None
        return Abstract(_v("0 +") | ({"nan"} if "-inf" in shift.classes and not guarded else set()), UNDERFLOW, 0.0)

    def gelu_ratio(self, box: Box) -> Abstract | None:
        """``(gelu(x) + c·e) / (x + e)`` with ``e = 1 - square(sign x)`` (x or ``x - 0`` under the
        sign; ``grad``'s slope of gelu, Φ(x)): for a finite x, e is exactly 0 where x ≠ 0, so the
        value is gelu(x) / x = (1 + erf(x/√2)) / 2 as float64 rounds it, in [0, 2] (0.5·x of a
        subnormal may round up); and c where x = 0 (e = 1).  None for any other division."""
        n, d = (self.through(a) for a in box.args)
        if not (isinstance(n, Box) and n.op == "add" and isinstance(d, Box) and d.op == "add"):
            return None
        (x, e), (g, scaled) = d.args, (self.through(a) for a in n.args)
        if not (isinstance(scaled, Box) and scaled.op == "mul" and isinstance(c := self.through(scaled.args[0]), Const)
                and math.isfinite(c.value) and self.same(scaled.args[1], e) and isinstance(g, Box)
                and g.op == "gelu" and self.same(g.args[0], x) and self.is_zero_test(e, x)
                and self.value(x).classes <= FINITE):
            return None
        exact = math.log2(abs(c.value)) if c.value else 0.0
        return _join(Abstract(_v("0 +"), UNDERFLOW, 1.0), Abstract(frozenset({class_of(c.value)}), exact, exact))

    def is_zero_test(self, e: Expr, x: Expr) -> bool:
        """Is ``e`` the term ``1 - square(sign x)`` (or of ``x - 0``), bindings read through?"""
        terms = [self.through(e)]
        for op in ("sub", "square", "sign"):
            last = terms[-1]
            if not (isinstance(last, Box) and last.op == op):
                return False
            if op == "sub" and self.through(last.args[0]) != Const(1.0):
                return False
            terms.append(self.through(last.args[-1] if op == "sub" else last.args[0]))
        inner = terms[-1]
        return self.same(inner, x) or (isinstance(inner, Box) and inner.op == "sub" and self.same(inner.args[0], x)
                                       and self.through(inner.args[1]) == Const(0.0))

    def same(self, a: Expr, b: Expr) -> bool:
        """Are ``a`` and ``b`` the same term, bindings read through?  Memoised per call, so that a
        binding used twice is compared once (a DAG is not unfolded); a zero's sign counts."""
        memo: dict[tuple[int, int], bool] = {}

        def equal(a: Expr, b: Expr) -> bool:
            a, b = self.through(a), self.through(b)
            if a is b:
                return True
            if not (isinstance(a, (Box, Apply)) and type(a) is type(b)):
                return a == b and not (isinstance(a, Const) and isinstance(b, Const)
                                       and math.copysign(1.0, a.value) != math.copysign(1.0, b.value))
            if (id(a), id(b)) not in memo:
                memo[id(a), id(b)] = len(a.args) == len(b.args) and replace(a, args=()) == replace(b, args=()) \
                    and all(equal(x, y) for x, y in zip(a.args, b.args, strict=True))
            return memo[id(a), id(b)]

        return equal(a, b)

    def guarded(self, box: Box, values: list[Abstract]) -> Abstract | None:
        """``d + (1 - g)`` with ``g`` = ``square(sign d)`` or ``abs(sign d)``: 1 where d = 0
        (the evaluator's and the VJP's guard of a divisor that may be 0), d elsewhere
        (g = 1 there, also where d is infinite); None for any other sum.  The same d, a zero's sign
        in a constant counted (``same``): ``exp(recip(-0.0))`` is 0, ``exp(recip(0.0))`` inf."""
        for (d, rest), v in zip((box.args, box.args[::-1]), values, strict=True):
            rest = self.through(rest)
            if isinstance(rest, Box) and rest.op == "sub" and rest.args[0] == Const(1.0):
                g = self.through(rest.args[1])
                inner = self.through(g.args[0]) if isinstance(g, Box) and g.op in ("square", "abs") else None
                if isinstance(inner, Box) and inner.op == "sign" and self.same(inner.args[0], d):
                    classes = (v.classes - _v("0")) | (_v("+") if "0" in v.classes else frozenset())
                    return Abstract(classes, min(v.lo, 0.0), max(v.hi, 0.0))
        return None


def abstract(expr: Expr, defs: Mapping[str, Expr], inputs: Mapping[str, Value]) -> Abstract:
    """``expr``'s abstract value (its classes and the log2 bounds of its finite non-zero
    entries), its inputs' classes given by ``inputs`` (their finite entries within ``DOMAIN``)."""
    return _Analysis(defs, {n: Abstract(v, *DOMAIN) for n, v in inputs.items()}).value(expr)


class _ExactAt(_Analysis):
    """The analysis with the boxes ``own`` (by id) computed over the extended reals, without
    float64's overflow and underflow (``_float64`` rounds nothing there); every other term, the
    operands of those boxes included, as float64 computes it."""

    def __init__(self, defs: Mapping[str, Expr], inputs: Mapping[str, Abstract], own: Collection[int]):
        super().__init__(defs, inputs)
        self.own = own
        #: what the rules of the boxes ``own`` receive: the same terms, nothing rounded
        self.exact = _Analysis(defs, inputs, rounds=False)

    def value(self, expr: Expr) -> Abstract:
        if not (isinstance(expr, Box) and id(expr) in self.own and expr.op in RULES):
            return super().value(expr)
        return RULES[expr.op](expr, [self.value(a) for a in expr.args], self.exact)


def _absorbs(an: _Analysis, box: Box) -> bool:
    """May float64's sum or difference ``box`` drop one of its non-zero operands whole (rounding
    it away: the smaller's magnitude may lie more than 2^53 below the larger's)?"""
    a, b = (an.value(x) for x in box.args)
    if not (a.classes & _v("- +") and b.classes & _v("- +")):
        return False
    return min(a.lo, b.lo) < max(a.hi, b.hi) - 53.0


def _underflows(box: Box, floats: _Analysis, extended: _Analysis, source: Expr | None = None) -> bool:
    """May float64 round ``box``'s value at non-zero operands to 0 where the extended reals give no 0
    (an underflow the class comparison misses when a zero operand gives the box 0 anyway)?  Its
    operands as float64 computes them, each without its zeros; its rule with and without rounding,
    for a contraction the product at one position (a sum of products may cancel to 0 over the
    reals, so its classes hold 0 whether or not a product underflows: A·B·c with A, B of 1e-200
    and c = 1e200, contracted as c·Σ A·B, is 0 where Σ (c·A)·B is 1e-200).  A normalised contraction's
    scores also without -inf, whose weight is 0 over the extended reals too (a mask): a score that may
    be -inf must not hide the underflow of the other positions' products.  With ``source`` (the left side
    of a lemma whose right side ``box`` is in), an exp-weighted contraction's products are exempt only where
    the source's value is a multiple of one weighting the same values (``_weighs_alike``)."""
    zero = _v("0 -inf") if ops.OPS[box.op].kind == "ncontract" else _v("0")
    values = [replace(v, classes=v.classes - (zero if i == 0 else _v("0")))
              for i, v in enumerate(floats.value(a) for a in box.args)]
    if any(not v.classes for v in values):
        return False
    if ops.OPS[box.op].kind == "contract":
        return "0" in _product(values, True).classes - _product(values, False).classes
    if ops.OPS[box.op].kind == "ncontract" and _weight_underflows(
            box.params, values, _entries(box), source is None or _weighs_alike(source, box.args[1], floats)):
        return True
    rule = RULES[box.op]
    return "0" in rule(box, values, floats).classes - rule(box, values, extended).classes


def _scales_a_vanished_weight(box: Box, an: _Analysis, own: Collection[int]) -> bool:
    """Is ``box`` a product (``mul``, ``contract``) of a softmax box of ``own`` (by id), or of a product,
    quotient or reshape of ``own`` that carries one (``(softmax(S) * 1) * K``), with factors whose
    magnitude may pass 1, or a quotient of one by a divisor whose magnitude may be below 1?
    A weight rounded to 0 (its real value below 2^-1075) then stands for a value float64 could hold."""
    if box.op not in ("mul", "div", "contract"):
        return False
    def weight(e: Expr) -> bool:  # a softmax of ``own``, or a product, quotient or reshape of ``own`` carrying one
        if not (isinstance(e, Box) and id(e) in own):
            return False
        return e.op == "softmax" or any(weight(a) for a in (e.args[:1] if e.op == "div" else e.args if e.op in (
            "mul", "neg", "contract", "rename", "transpose", "split", "join") else ()))

    for k, w in enumerate(box.args):
        if not weight(w) or (box.op == "div" and k != 0):
            continue
        others = [an.value(a) for j, a in enumerate(box.args) if j != k]
        nonzero = [o for o in others if o.classes & _v("- +")]
        if (box.op == "div" and any(o.lo < 0.0 for o in nonzero)) or \
                (box.op != "div" and len(nonzero) == len(others) and sum(max(o.hi, 0.0) for o in nonzero) > 0.0):
            return True
    return False


def _weighs_alike(source: Expr, v: Expr, an: _Analysis) -> bool:
    """Is ``source``'s value a multiple (through ``neg``, ``mul``, a quotient's numerator, renaming and
    reshaping) of an exp-weighted contraction of ``v`` (``ncontract[exp, exp, id]`` or a ``contract`` of a
    softmax with it)?  Then its weight-value products are those of a right side's ``ncontract(S, v)``, and
    underflow where they do: ``softmax_contract``.  A sum is no multiple: ``ncontract(S, V) + (ncontract(S,
    V·C) - ncontract(S, V))`` keeps the products of V·C where those of V may round to 0."""
    e = an.through(source)
    if not isinstance(e, Box):
        return False
    if e.op == "ncontract" and e.params[:3] == ("exp", "exp", "id"):
        return an.same(e.args[1], v)
    if e.op == "contract" and len(e.args) == 2:
        for k in (0, 1):
            w = an.through(e.args[k])
            if isinstance(w, Box) and w.op == "softmax" and an.same(e.args[1 - k], v):
                return True
    carried = e.args if e.op in ("neg", "mul", "rename", "transpose", "split", "join") else \
        e.args[:1] if e.op == "div" else ()
    return any(_weighs_alike(a, v, an) for a in carried)


def _weight_underflows(params: tuple[str, ...], values: list[Abstract], entries: float, alike: bool = True) -> bool:
    """May a normalised contraction's weight a1(s) / b(Σ a2(s)), or its product with v, be 0 in float64 at
    non-zero s and v where the extended reals give no 0, one position at a time (its sum may cancel to 0
    over the reals, so the sum's classes hold 0 either way: l2 weights of s = [2^-537, 0] are [0, 0] where
    Σ s² = 2^-1074 halves below 2^-1074 under rms)?  exp's weights (of ``id``) may underflow on both sides
    of a lemma (s - max s past -745), so there only a weight 0 the extended reals with that underflow lack, and
    their products with v only where the source weighs other values (not ``alike``): Σ w·(V·C) = (Σ w·V)·C at
    S = [0, -690], V = [0, 1], C = 1e200 is 1e-300·1 on the left, 1e-300·1e-200 = 0 on the right."""
    (s, v), exp = values, params[0] == params[1] == "exp" and params[2] == "id"
    weights, exact = _weights(params, s, True, entries), _weights(params, s, False, entries)
    if "0" in weights.classes - exact.classes:
        return True
    nonzero = [replace(weights, classes=weights.classes - _v("0")), v]
    return not (exp and alike) and "0" in _product(nonzero, True).classes - _product(nonzero, False).classes


class _FiniteAt(_Analysis):
    """The analysis with the terms ``finite`` (by id) taken at their finite entries only."""

    def __init__(self, defs: Mapping[str, Expr], inputs: Mapping[str, Abstract], finite: Collection[int]):
        super().__init__(defs, inputs)
        self.finite = finite

    def value(self, expr: Expr) -> Abstract:
        v = super().value(expr)
        return replace(v, classes=v.classes & FINITE) if id(expr) in self.finite else v


def float_unsafe_box(expr: Expr, operands: Iterable[Expr], diagram: Diagram, rewritten: bool = True,
                     source: Expr | None = None) -> Box | None:
    """The first box of ``expr`` (a term of ``diagram``), outside its ``operands`` (sub-terms it
    takes as they are), that float64 may make ±inf, NaN or 0 where the extended reals would not,
    its operands as float64 computes them: an overflow (``exp`` past 709.8), an underflow to 0
    (which a ``sign``, or a ``log`` or division outside the lemma, turns into a different value),
    or a division, ``log``, ``recip`` or ``rsqrt`` of a value that underflowed or cancelled to 0
    in another such box (at finite operands a proved right side is finite, so any infinity the
    analysis admits there is counted, as the class rules may admit it over the reals too), and, on
    the rewritten side (``rewritten``), an underflow to 0 at non-zero operands where the box's
    classes hold 0 anyway (``_underflows``), and a softmax weight, which may be 0 on both sides,
    scaled up (``_scales_a_vanished_weight``); None where there is none.  A lemma's right side
    instantiated at a use (``kernel.rewrite``: the operands are the terms its variables matched)
    is float-safe there when none of its boxes does so (README "The domain"): it computes what the
    extended reals do, which the lemma's proof covers, so it is finite wherever the left side is."""
    operands = tuple(operands)
    matched = {id(m) for t in operands for m in walk(t)}
    own = [b for b in walk(expr) if isinstance(b, Box) and id(b) not in matched and b.op in RULES]
    defs, inputs = diagram.bindings(), input_values(diagram.inputs)
    floats, exact = _Analysis(defs, inputs), _ExactAt(defs, inputs, {id(b) for b in own})
    bad = _v("-inf +inf nan")
    finite = _FiniteAt(defs, inputs, {id(t) for t in operands})
    plain = _Analysis(defs, inputs, rounds=False, vanish=False)  # the extended reals' weights of finite scores are > 0
    ids = {id(b) for b in own}
    for b in own:
        # an underflow to 0 the extended reals do not make: exp(U)·exp(V) at U = -760, V = 700 is 0 where
        # exp(U + V) = 8.7e-27, and a log, division or sign outside the lemma turns that into -inf or 0 vs 1
        if (floats.value(b).classes & (bad | _v("0"))) - exact.value(b).classes:
            return b
        # on finite operands a proved right side is finite over the reals, so an infinity here is float64's,
        # which the extended-real analysis, less precise, may also admit: recip((exp(X) + 1) - 1) is inf at
        # X = -40 (the sum rounds to 1), and the class rules give the difference every sign
        if finite.value(b).classes & bad:
            return b
        # an underflow of a non-zero value to 0 where the box's classes hold 0 anyway (an operand may be 0):
        # tanh(S) · 1e-300 / 1e-300 is 0 at S = 1e-30, and a log after it -inf where the source's is -138
        if rewritten and _underflows(b, floats, plain, source):
            return b
        # a softmax weight of a finite score rounds to 0 below 2^-1075, as the source's may (``_weights``' vanish);
        # scaled up on the rewritten side, the value it stood for may be one the source keeps: softmax(S)·K at
        # S = [0, -750], K = 2^23 is 0 where p·(p·K), p = softmax(S/2), is 2^-1059
        if rewritten and _scales_a_vanished_weight(b, floats, ids):
            return b
        # sign jumps at 0: where the analysis cannot tell its operand's sign, float64 may have rounded or
        # cancelled it to 0 or the other sign (sign(exp(tanh X) + C - C) is 0 at C = 1e20, 1 over the reals)
        if b.op == "sign" and len(finite.value(b.args[0]).classes & FINITE) > 1:
            return b
        # a sum or difference of a sum that may drop an operand whole (their magnitudes 2^53 apart): the
        # dropped part is an error as large as what a cancellation leaves ((exp(tanh X) + C) - C - 1 is -1
        # at C = 1e20, exp(tanh X) - 1 over the reals, of either sign), through any box of the lemma's: a
        # log or exp carries it too (exp(log(exp(tanh X) + exp(46)) - 46) - 1 is 0, and a log after it -inf)
        if _cancelled_absorption(floats, b, ids, every=True):
            return b
        # a softmax, logsumexp or exp-normalised contraction subtracts its scores' maximum, a difference too:
        # softmax(R - C) at C = 2^62 (an index, or 1e20) is uniform in float64, R dropped whole, where the
        # reals give softmax(R), the right side of softmax_shift
        if _shifts(b) and _reached(floats, b.args[0], ids, every=True):
            return b
    return None


def overflow_box(expr: Expr, diagram: Diagram, zeros: bool = False) -> Box | None:
    """The first box of ``expr`` (a term of ``diagram``) that float64 may make ±inf or NaN where the
    extended reals would not, its operands as float64 computes them (``exp`` past 709.8, a product or
    sum past float64's largest value), ``float_unsafe_box``'s first check without its underflows to 0;
    None where there is none.  A box the extended reals make ±inf or NaN too (a division by a
    denominator the analysis cannot tell non-zero) is no overflow: where a term is not vouched finite
    (``finite``) and this finds no box, the analysis's imprecision may be the reason, not float64.
    ``zeros``: an underflow to 0 the extended reals do not make counts too (``float_unsafe_box``'s
    first check whole: log(Σ exp(S)) is -inf at S = -800 where the reals' value is -800)."""
    own = [b for b in walk(expr) if isinstance(b, Box) and b.op in RULES]
    defs, inputs = diagram.bindings(), input_values(diagram.inputs)
    floats, exact = _Analysis(defs, inputs), _ExactAt(defs, inputs, {id(b) for b in own})
    bad = _v("-inf +inf nan") | (_v("0") if zeros else _v(""))
    return next((b for b in own if (floats.value(b).classes & bad) - exact.value(b).classes), None)


#: the boxes whose value carries an operand's value along, scaled, summed, shifted or moved (which
#: operands): what float64 drops in a sum below one of them, a sum above it may cancel to
_CARRY: dict[str, slice] = {"neg": slice(None), "mul": slice(None), "div": slice(0, 1), "sum": slice(None),
                            "mean": slice(None), "max": slice(None), "min": slice(None), "cumsum": slice(None),
                            "contract": slice(None), "where": slice(None), "select": slice(1, None),
                            "maximum": slice(None), "minimum": slice(None), "logsumexp": slice(None),
                            "linrec": slice(None), "ncontract": slice(1, None), "split": slice(None),
                            "join": slice(None), "rename": slice(None), "transpose": slice(None)}


def _reached(an: _Analysis, e: Expr, own: Collection[int], every: bool = False) -> list[Box]:
    """The sums and differences (of ``own``, by id) that may drop an operand whole (``_absorbs``)
    and that ``e`` is or carries along through boxes of ``own`` (``_CARRY``: ``logsumexp(S + C) - C`` is
    0 where the reals give logsumexp S; with ``every``, through any box: f(S + C) - f(C) is 0 where the
    reals give f'(C)·S, and ``exp(log(exp(tanh X) + exp(46)) - 46) - 1`` is 0 where they give
    exp(tanh X - 46)), every one of them."""
    if not (isinstance(e, Box) and id(e) in own):
        return []
    if e.op in ("add", "sub"):
        return [e] if _absorbs(an, e) else []
    carried = e.args if every else e.args[_CARRY[e.op]] if e.op in _CARRY else ()
    return [r for a in carried for r in _reached(an, a, own, every)]


def _cancelled_absorption(an: _Analysis, box: Box, own: Collection[int], every: bool = False) -> list[Box]:
    """The sums and differences that may drop an operand whole and that ``box``, a sum or difference,
    reads directly or through boxes of ``own`` that carry their value along (``_reached``, ``every``),
    every one of them: what the dropped operand was, ``box`` may cancel to: ``(S + C) - C`` is 0 at
    C = exp(46.5), S over the reals, and so are ``(S + C) * 1.0 - C`` and ``sum[t](X + C) - sum[t](C + 0.0 * X)``."""
    if box.op not in ("add", "sub"):
        return []
    return [r for o in box.args for r in _reached(an, o, own, every)]


def _shifts(box: Box) -> bool:
    """Does ``box`` subtract its first operand's maximum from it before an exp (softmax, logsumexp, a
    normalised contraction weighting by exp): a difference, as a backward's ``S - L`` is?"""
    return box.op in ("softmax", "logsumexp") or (ops.OPS[box.op].kind == "ncontract"
                                                  and tuple(box.params[:2]) == ("exp", "exp"))


def cancelling_sums(expr: Expr, diagram: Diagram) -> list[Box]:
    """The sums and differences of ``expr`` (a term of ``diagram``) that float64 may round to their
    larger operand alone (``_absorbs``) and that a sum or difference above them then cancels
    (``_cancelled_absorption``), or a softmax, logsumexp or exp-normalised contraction shifts by its
    maximum (``_shifts``): where their error reaches the value as a cancellation's does."""
    own = [b for b in walk(expr) if isinstance(b, Box)]
    an, ids = _Analysis(diagram.bindings(), input_values(diagram.inputs)), {id(b) for b in own}
    return [r for b in own for r in (_cancelled_absorption(an, b, ids) if b.op in ("add", "sub") else
                                     _reached(an, b.args[0], ids) if _shifts(b) else [])]


def cancelled_absorptions(expr: Expr, diagram: Diagram) -> list[tuple[Box, Box]]:
    """The absorptions then cancelled of ``expr`` (a term of ``diagram``) that ``float_unsafe_box``
    refuses (``_cancelled_absorption``): each sum or difference that reads one float64 may round to
    its larger operand alone, with that one.  A backward join (``certify.prove.prove_join``) refuses
    a gradient with one whose absorbing sum its VJP's gradient does not also cancel (``cancelling_sums``)."""
    own = [b for b in walk(expr) if isinstance(b, Box)]
    an, ids = _Analysis(diagram.bindings(), input_values(diagram.inputs)), {id(b) for b in own}
    return [(b, inner) for b in own for inner in _cancelled_absorption(an, b, ids)]


def absorbing_sums(expr: Expr, diagram: Diagram) -> list[Box]:
    """The sums and differences of ``expr`` (a term of ``diagram``) that float64 may round to their
    larger operand alone (``_absorbs``), whatever reads them: a reduction whose weights sum to 0
    cancels what one of them keeps as a difference does (``certify.prove``'s backward join looks
    for those whose operand's share of the value cancels over the reals)."""
    an = _Analysis(diagram.bindings(), input_values(diagram.inputs))
    return [b for b in walk(expr) if isinstance(b, Box) and b.op in ("add", "sub") and _absorbs(an, b)]


def analyse(expr: Expr, defs: Mapping[str, Expr], inputs: Mapping[str, Value]) -> Value:
    """The classes of ``expr``'s entries (``abstract``)."""
    return abstract(expr, defs, inputs).classes


def input_values(params: Iterable[Param]) -> dict[str, Abstract]:
    """Each input's value: finite within ``DOMAIN`` (the domain), except an array an earlier kernel
    of a chain wrote (``Param.written``, ``terms.cut``), which holds what the diagram computing it
    gives (``exp`` of an input may be ``+inf`` there), and an input a relation gives, which holds
    its relation's values as the analysis bounds them, ``-inf`` or NaN included where the relation
    may be (``--strict`` refuses such a relation: ``relation_unbounded``; ``_Kept``; the input knows the
    expression it equals: ``_Analysis.shifted``): what every tester and ``napkin eval`` feed it
    (``evaluate.related``), which DOMAIN need not bound (``tanh(S) * 1e300`` is past float32's range
    wherever S is not 0, and ``L * L`` of it overflows: ``tests/unsound/rtgiven_*``)."""
    out: dict[str, Abstract] = {}
    params = tuple(params)
    given = relations(params)
    for p in params:
        w = p.written
        out[p.name] = Abstract(FINITE, *DOMAIN) if w is None else Abstract(TOP) \
            if len(w.outputs) != 1 else _Analysis(w.bindings(), input_values(w.inputs)).value(w.outputs[0])
    free = dict(out)
    for name, relation in given.items():
        value = _Kept({}, {n: v for n, v in free.items() if n not in given}).value(relation)
        out[name] = Abstract(value.classes, value.lo, value.hi, relation)
    return out


#: the diagram's inputs: their names (finite within ``DOMAIN``), or each one's value (``input_values``)
Inputs = Union[Collection[str], Mapping[str, Abstract]]


def _classes(expr: Expr, defs: Mapping[str, Expr], inputs: Inputs) -> Value:
    given = inputs if isinstance(inputs, Mapping) else dict.fromkeys(inputs, Abstract(FINITE, *DOMAIN))
    return _Analysis(defs, given).value(expr).classes


def finite(expr: Expr, defs: Mapping[str, Expr], inputs: Inputs = frozenset()) -> bool:
    """Is ``expr`` finite wherever it is evaluated on finite inputs?  ``defs`` maps binding
    names to their expressions, ``inputs`` names the diagram's inputs (finite by the domain)
    or gives their values (``input_values``: an array a chain's earlier kernel wrote)."""
    return _classes(expr, defs, inputs) <= FINITE


def masked(expr: Expr, defs: Mapping[str, Expr], inputs: Inputs = frozenset()) -> bool:
    """Is every entry of ``expr`` finite or ``-inf`` (a mask) on finite inputs?"""
    return _classes(expr, defs, inputs) <= FINITE | _v("-inf")


#: how a proof names the parameters it also covers with -inf masks (prove.py writes it)
MASKS = re.compile(r"\[-inf masks: ([\w, ]+)\]")


#: how a proved accumulator's answer names the operands it was also tested on with -inf
#: entries (masks), and with ±inf entries (certify.infinite_tested writes both)
MASKS_TESTED = re.compile(r"\[-inf tested: ([\w, ]+)\]")
INFINITE = re.compile(r"\[infinite: ([\w, ]+)\]")
#: how a proof names the operands its laws are also proved for at every float64 value, ±inf
#: and NaN included (prove.extended writes it: a fold of +, max or min)
EXTENDED = re.compile(r"\[extended: ([\w, ]+)\]")


def _listed(how: str, marker: re.Pattern[str]) -> set[str]:
    """The parameter names a certification answer lists after ``marker``."""
    found = marker.search(how)
    return {m.strip() for m in found.group(1).split(",")} if found else set()


def _uncovered(diagram: Diagram, terms: Mapping[str, Expr], masks: set[str], infinite: set[str]) -> str | None:
    """The first parameter whose matched term is neither finite, nor a -inf mask where the
    parameter is in ``masks``, nor anything where it is in ``infinite``; None when all are."""
    defs, inputs = diagram.bindings(), input_values(diagram.inputs)
    return next((n for n, t in terms.items() if not (finite(t, defs, inputs) or n in infinite
                                                      or (n in masks and masked(t, defs, inputs)))), None)


def unsupported(how: str, diagram: Diagram, terms: Mapping[str, Expr]) -> str | None:
    """Why an accumulator use is backed by nothing, or None: its proof (``proved: ...``) or
    its bounded tests (``tested: ...``, on finite inputs) cover finite operands, a proof also
    the -inf masks it names, and its float64 test with infinities the operands it names
    ``[-inf tested: ...]`` (masks) and ``[infinite: ...]`` (±inf); an operand ``terms`` matches
    that may be infinite otherwise (a +inf mask streamed via logsumexp, whose state gives NaN
    where the box gives +inf) is neither proved nor tested."""
    proved = how.startswith("proved")
    masks = _listed(how, MASKS) if proved else set()
    anything = _listed(how, INFINITE) | (_listed(how, EXTENDED) if proved else set())
    n = _uncovered(diagram, terms, masks | _listed(how, MASKS_TESTED), anything)
    if n is None:
        return None
    which = ("first", "second", "third")[int(n[1:])] if n[1:].isdigit() and int(n[1:]) < 3 else n
    return (f"its {which} operand may be infinite here, and it is {'proved' if proved else 'tested'} for finite "
            f"operands{' and -inf masks' if masks else ''}, not tested with infinite ones")


def fold_overflows(box: Box, diagram: Diagram, accumulator: str = "") -> bool:
    """May ``box`` (a reduction of ``diagram`` that a stream or split folds chunk by chunk)
    overflow in float64 on the finite entries of its operands, as they are in ``diagram``?
    Then the order of the fold decides its class: the box's sequential sum of a, a, a, -a
    (a = 8e307) passes 2^1024 and stays inf, the chunks' (a + a) + (a + -a) = 1.6e308; a
    product likewise.  A proof of the accumulator's laws (over the reals, or at ±inf and NaN
    operands: ``[extended: ...]``) says nothing of where float64 overflows.  The ``normalised``
    accumulator of a normalised contraction folds its state (Σ a1(s)·v, Σ a2(s)) before it
    divides, so those sums must not overflow either: with s = 1e45·sign(X), v = Y^7 the box's
    weights are ±1/√n and its value finite, but Σ s·v passes 2^1024."""
    an = _Analysis(diagram.bindings(), input_values(diagram.inputs))
    finite_parts = [Abstract(v.classes & FINITE, v.lo, v.hi) for v in (an.value(a) for a in box.args)]
    if box.op not in RULES:
        return True
    values = [RULES[box.op](box, finite_parts, an)]
    if accumulator == "normalised" and box.op == "ncontract":
        (a1, a2, _), (s, v), entries = box.params, finite_parts, _entries(box)
        values += [_fold("add", _bin("mul", _un(a1, s, True), v, True), True, entries),
                   _fold("add", _un(a2, s, True), True, entries)]
    return any(value.classes - FINITE for value in values)


def narrowed(how: str, diagram: Diagram, terms: Mapping[str, Expr], rhs: Expr | None = None,
             fold: Box | None = None, accumulator: str = "", lhs: Expr | None = None) -> str:
    """Certification's ``how`` for one use, its parameters matched to ``terms``: a proof
    (``proved: ...``) covers finite inputs, -inf masks in the parameters it names in
    ``[-inf masks: S]`` and every value in those it names in ``[extended: X0]``; applied to
    anything else the use is only tested.  A lemma's proof is over the reals: with ``rhs``,
    its right side instantiated on ``terms``, it covers the use only where float64 computes
    that as the extended reals do (``float_unsafe_box``: no box of the lemma's overflows
    there, as ``exp(c)`` of ``exp(c - 5) = exp(c) · exp(-5)`` does at c = 712, where the left
    side is 1.1e307), so the right side is finite wherever the left side is.  With ``fold``, the
    box an accumulator streams, it covers the use only where that box's fold cannot overflow on
    the finite entries of its operands (``fold_overflows``: chunked, it could stay finite where
    the box is inf; ``accumulator``, its name, adds what its state folds), whether or not they
    may also be infinite: ``[extended: ...]`` covers an
    operand's ±inf and NaN entries, not large finite ones overflowing in another order
    (``sum[x](exp(A) - exp(B))``: a, a, a, -a with a = 8.2e307 is inf in order, 1.6e308 in pairs)."""
    if not how.startswith("proved"):
        return how
    if _uncovered(diagram, terms, _listed(how, MASKS), _listed(how, EXTENDED)) is not None:
        return f"tested here (proved for finite terms, applied to one that may be infinite): {how[len('proved: '):]}"
    if fold is not None and fold_overflows(fold, diagram, accumulator):
        return (f"tested here (proved over the reals, but float64 may overflow inside `{fold.op}` at these operands, "
                f"where the order of the chunks decides whether it does): {how[len('proved: '):]}")
    if rhs is not None and lhs is not None and (wider := _wider(rhs, lhs, diagram)):
        return (f"tested here (proved over the reals, but in float64 the right side may be {', '.join(sorted(wider))} "
                f"at these operands, where the left side is not): {how[len('proved: '):]}")
    if rhs is not None and lhs is not None and (box := index_may_wrap(lhs, rhs)) is not None:
        return (f"tested here (proved over the integers, but float64's evaluator computes `{box.op}`'s index "
                f"arithmetic in int64, which may wrap past 2^63 at some size): {how[len('proved: '):]}")
    if rhs is not None and lhs is not None and (box := _zero_sign_read(diagram, lhs, rhs)) is not None:
        return (f"tested here (proved over the reals, which have one zero: float64's `{box.op}` may read a zero whose "
                f"sign the rewrite may change, 1/0 and 1/-0 being +inf and -inf): {how[len('proved: '):]}")
    sides = (("left", lhs), ("right", rhs)) if lhs is not None else (("right", rhs),)
    for side, term in sides:
        if term is None or (box := float_unsafe_box(term, terms.values(), diagram, side == "right", lhs)) is None:
            continue
        return (f"tested here (proved over the reals, but float64 may give the {side} side's `{box.op}` a class the "
                f"extended reals do not, by an overflow, underflow or cancellation at these operands, which the "
                f"proof does not cover): {how[len('proved: '):]}")
    return how


#: the operands a box divides by: where one is 0, its sign decides the sign of the infinity
_DIVISORS: dict[str, Callable[[Box], tuple[Expr, ...]]] = {
    "recip": lambda b: b.args, "rsqrt": lambda b: b.args, "div": lambda b: b.args[1:],
    "ncontract": lambda b: b.args[:1] if {"recip", "rsqrt"} & set(b.params[:2]) else ()}


def _zero_sign_read(diagram: Diagram, lhs: Expr, rhs: Expr) -> Box | None:
    """A box that divides by a value that may be 0 (``_DIVISORS``; 1/±0 = ±inf), in the rewritten
    sides or, where either side may be 0, anywhere in ``diagram``.  The analysis has one class for
    ±0, as the reals have one zero, and lemmas such as ``X - Y = -(Y - X)`` turn +0 into -0 (at
    X = Y), so a step's proof covers its use only where no such box may read a zero:
    ``exp(1/(X - Y))`` is inf at X = Y, its rewrite 0; ``tanh(1/(X - Y))`` is never 0, yet 1 and -1."""
    an = _Analysis(diagram.bindings(), input_values(diagram.inputs))
    scope = [lhs, rhs]
    if "0" in an.value(lhs).classes | an.value(rhs).classes:
        scope += [let.expr for let in diagram.body] + list(diagram.outputs)
    for box in (n for e in scope for n in walk(e) if isinstance(n, Box) and n.op in _DIVISORS):
        if any("0" in an.value(d).classes for d in _DIVISORS[box.op](box)):
            return box
    return None


def _index_range(e: IndexExpr, first: Collection[str] = ()) -> tuple[int, int] | None:
    """The integers an index expression may take, positions in [0, 2^POSITIONS) (those along the axes
    ``first``: 0); None where it or a part of it may leave int64, where the evaluator's arithmetic wraps
    (``evaluate._index``)."""
    if isinstance(e, IInt):
        return e.value, e.value
    if not isinstance(e, IBin):
        return (0, 0) if e.axis in first else (0, 2 ** int(POSITIONS) - 1)
    a, b = _index_range(e.left, first), _index_range(e.right, first)
    if a is None or b is None:
        return None
    ends = [x * y for x in a for y in b] if e.op == "*" else \
        [a[0] + b[0], a[1] + b[1]] if e.op == "+" else [a[0] - b[1], a[1] - b[0]]
    lo, hi = min(ends), max(ends)
    return (lo, hi) if lo >= -2 ** 63 and hi < 2 ** 63 else None


def _decided(pred: Pred, first: Collection[str]) -> tuple[bool, bool]:
    """Whether ``pred`` holds at every position (its first component) or at none (its second), the
    positions along the axes ``first`` being 0 and the others anywhere in [0, 2^62); both False where
    neither is shown (``_index_range``: also where int64 may wrap)."""
    if isinstance(pred, Logic):
        a = _decided(pred.left, first)
        if pred.right is None:
            return a[1], a[0]
        b = _decided(pred.right, first)
        return (a[0] and b[0], a[1] or b[1]) if pred.op == "and" else (a[0] or b[0], a[1] and b[1])
    left, right = _index_range(pred.left, first), _index_range(pred.right, first)
    if left is None or right is None:
        return False, False
    lo, hi = left[0] - right[1], left[1] - right[0]  # left - right
    holds = {">=": (lo >= 0, hi < 0), ">": (lo > 0, hi <= 0), "<=": (hi <= 0, lo > 0), "<": (hi < 0, lo >= 0),
             "==": (lo == hi == 0, hi < 0 or lo > 0), "!=": (hi < 0 or lo > 0, lo == hi == 0)}
    return holds[pred.op]


#: the reductions whose identity a mask fills in: a row keeping one entry folds only kept entries
_IDENTITY = {"max": -math.inf, "logsumexp": -math.inf, "min": math.inf}


class _Kept(_Analysis):
    """The analysis, and one fact of index masks for ``relation_unbounded``: ``max``, ``logsumexp`` or
    ``min`` over axes T of ``where[...](pred, A, e)``, e the reduction's identity (``-inf`` for the
    first two), where ``pred`` holds at position 0 of every axis of T, whatever the other positions
    (``q >= x`` at x = 0), folds 1 to n entries of A and none of e: every axis has a position 0, so
    every row keeps one (``q > x`` keeps none at q = 0, and its logsumexp is ``-inf`` there)."""

    def value(self, expr: Expr) -> Abstract:
        if isinstance(expr, Box) and expr.op in _IDENTITY and isinstance(w := self.through(expr.args[0]), Box) \
                and w.op == "where" and isinstance(fill := self.through(w.args[1]), Const) \
                and fill.value == _IDENTITY[expr.op] and isinstance(w.index, (Cmp, Logic)) \
                and _decided(w.index, expr.target)[0]:
            return RULES[expr.op](expr, [self.value(w.args[0])], self)
        return super().value(expr)


def relation_unbounded(params: Sequence[Param]) -> dict[str, Value]:
    """Each input a relation gives (``terms.relations``: ``given L = logsumexp[x](s)``) whose relation
    the analysis does not show finite at every value of the other inputs, with the classes it may
    take beyond the finite ones.  A given input is finite, as every input, so where its relation is
    ``-inf`` (a row of s that a mask empties), ``+inf`` or NaN the diagram has no input at all, and a
    theorem about it claims nothing there: ``logsumexp[x](where[q x](q > x, S, -inf))`` is ``-inf``
    at q = 0 for every S, and ``tanh(T) + exp(M - L) * 0 = tanh(T)`` was proved, NaN and finite at
    what ``napkin eval`` feeds it (``tests/unsound/rtgiven_*``)."""
    given = relations(params)
    values = {n: v for n, v in input_values(params).items() if n not in given}
    out = {n: _Kept({}, values).value(e).classes - FINITE for n, e in given.items()}
    return {n: v for n, v in out.items() if v}


def index_may_wrap(*sides: Expr) -> Box | None:
    """A box of ``sides`` whose index expression (``index``'s, or one compared in ``where``'s predicate)
    may wrap in int64 at some size: the proof reads it over the integers, where x⁴·x⁴ - x⁸ is 0 at every
    position; the evaluator's x⁸ wraps at x = 236, and ``tanh`` of the difference is 1 there.  A join's
    proof reads its masks so too (``certify.prove.prove_join``: q·3037000500² ≥ x holds at x = 0 for
    every q over the integers, and at no x for q = 1 in int64)."""
    def exprs(i: Pred | IndexExpr | None) -> list[IndexExpr]:
        if isinstance(i, Cmp):
            return [i.left, i.right]
        if isinstance(i, Logic):
            return [*exprs(i.left), *exprs(i.right)]
        return [] if i is None else [i]

    for b in (n for side in sides for n in walk(side) if isinstance(n, Box) and n.index is not None):
        if any(_index_range(e) is None for e in exprs(b.index)):
            return b
    return None


def _wider(rhs: Expr, lhs: Expr, diagram: Diagram) -> Value:
    """The classes the analysis gives the instantiated right side ``rhs`` and not the matched left
    side ``lhs`` (both terms of ``diagram``): a rewrite may not make a term's float64 value leave the
    classes the source's has, which the diagram around it may rely on (``log`` of a sum of
    exponentials, finite where ``(exp(tanh X) + C) - C`` with C = 1e20 cancels to 0, and -inf there)."""
    an = _Analysis(diagram.bindings(), input_values(diagram.inputs))
    return an.value(rhs).classes - an.value(lhs).classes


def signed_zero_writes(pieces: Sequence[Diagram], writes: Sequence[tuple[str, ...]],
                       steps: Sequence[Sequence[Step]]) -> tuple[str, ...]:
    """What a chain (``kernel.chain``) rests on beyond its kernels' proofs: a kernel's rewrite is
    proved on its piece (``terms.cut``), where the arrays it writes are outputs and no division reads
    a zero's sign (``_zero_sign_read``); a later kernel dividing by a value that may be 0 and that
    reads one of them (or an array computed from one in a kernel between) may read the other sign
    (1/±0 is ±inf).  Each such earlier kernel with a rewrite step is only tested there: one entry
    naming it and the divisor."""
    writer = {n: k for k, names in enumerate(writes) for n in names}
    flagged: dict[int, Box] = {}
    for piece in pieces:
        an = _Analysis(piece.bindings(), input_values(piece.inputs))
        for expr in [*(let.expr for let in piece.body), *piece.outputs]:
            for box in (n for n in walk(expr) if isinstance(n, Box) and n.op in _DIVISORS):
                for d in (d for d in _DIVISORS[box.op](box) if "0" in an.value(d).classes):
                    stack = [(piece, d)]
                    while stack:
                        where, term = stack.pop()
                        for k in (writer[n] for n in _written_reads(where, term) if writer[n] not in flagged):
                            flagged[k] = box
                            stack += [(pieces[k], Var(n, ())) for n in writes[k]]
    return tuple(f"{writes[k][0]}'s kernel: its rewrites, whose zeros a later kernel's `{box.op}` may read with the "
                 "other sign" for k, box in sorted(flagged.items()) if any(isinstance(s, Rewrite) for s in steps[k]))


def _written_reads(piece: Diagram, expr: Expr) -> set[str]:
    """The arrays written by earlier kernels (``Param.written``) that ``expr`` reads in ``piece``, through
    its bindings."""
    defs, written = piece.bindings(), {p.name for p in piece.inputs if p.written is not None}
    seen: set[str] = set()
    stack = [expr]
    while stack:
        for n in (n for n in walk(stack.pop()) if isinstance(n, Var) and n.name not in seen):
            seen.add(n.name)
            stack += [defs[n.name]] if n.name in defs else []
    return seen & written


def finite_in(diagram: Diagram, expr: Expr) -> bool:
    """``finite`` for a term of ``diagram`` (its bindings and inputs in scope)."""
    return finite(expr, diagram.bindings(), input_values(diagram.inputs))
