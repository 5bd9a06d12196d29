"""The cases certification evaluates, and how it decides that two sides agree on them.

Cases: ``grid`` (every assignment of sizes up to a bound, smallest first), ``symbols``
(an array of distinct real sympy symbols, the symbolic tier's input), ``edges`` (inputs
scaled past a lemma's constants, and the all-zero and ``-inf`` inputs whose values the
evaluator's conventions decide).

Decisions: ``symbolic_equal`` (sympy: each difference must simplify to 0; where
``Max``/``Min`` occur, in every ordering of the scalars inside them, see
``symbolic_equal``; raises ``TooLarge`` past ``MAX_ORDERED`` such scalars) and
``numeric_equal`` (float64 to 1e-9).  ``flat`` lines up evaluated outputs for them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import sympy

from napkin_cat.evaluate import Named
from napkin_cat.terms import LemmaDecl

__all__ = ["MAX_ORDERED", "TOLERANCE", "TooLarge", "edges", "flat", "grid", "numeric_equal", "partial_masks",
           "show_sizes", "symbolic_equal", "symbols", "zero_sum"]

MAX_ORDERED = 5  #: at most 5! orderings per symbolic case
TOLERANCE = 1e-9  #: relative and absolute tolerance of ``numeric_equal``


class TooLarge(Exception):
    """More scalars inside ``Max``/``Min`` than ``symbolic_equal`` splits cases for."""


# ---- cases ---------------------------------------------------------------------------------------


def grid(axes: Sequence[str], bound: int) -> list[dict[str, int]]:
    """Every assignment of sizes 1..``bound`` to ``axes``, smallest total first.

    Equal sizes alone are not enough: a difference such as ``relu(x - y*z - 2)`` or
    ``(x - y) * ...`` vanishes wherever the axes are equal."""
    points = itertools.product(range(1, bound + 1), repeat=len(axes))
    return [dict(zip(axes, p, strict=True)) for p in sorted(points, key=lambda p: (sum(p), p))]


def symbols(prefix: str, axes: tuple[str, ...], sizes: dict[str, int]) -> Named:
    """An array of distinct real symbols ``prefix[i,j]``, one per entry.

    The brackets keep names apart that a plain suffix would merge (entry 1 of ``A`` and a
    scalar named ``A1``): equal names would be one symbol, and the check a special case."""
    shape = tuple(sizes[a] for a in axes)
    data = np.empty(shape, dtype=object)
    for index in np.ndindex(*shape):
        data[index] = sympy.Symbol(f"{prefix}[{','.join(map(str, index))}]", real=True)
    return Named(axes, data)


def edges(lemma: LemmaDecl, values: Sequence[Any], scale: float) -> Iterator[tuple[str, list[Any]]]:
    """(description, inputs) past the standard draws ``values``: every input times
    ``scale``, then where the evaluator's conventions decide values (evaluate.py), per
    parameter: all zeros (normalising an all-zero row gives 0), rows summing to 0 though not
    0 (``zero_sum``: a zero normaliser Σ a2(S) of an odd a2), all ``-inf`` (a fully
    masked row: softmax gives 0), partly ``-inf`` (``partial_masks``: a partly masked row,
    its masked weights exactly 0) and all ``+inf`` (a shift by the negated maximum of a
    masked row); the infinite ones only for a parameter the lemma does not declare finite
    (``when c finite``)."""
    yield f" with the inputs times {scale:g}", [np.asarray(v) * scale for v in values]
    for i, param in enumerate(lemma.params):
        infinite = [("-inf", np.full_like(values[i], -math.inf)), *partial_masks(values[i]),
                    ("+inf", np.full_like(values[i], math.inf))]
        zeros = [("0", np.zeros_like(values[i]))] + ([("rows summing to 0", zero_sum(values[i]))] if param.axes else [])
        for what, value in zeros + ([] if param.name in lemma.finite else infinite):
            yield f" with `{param.name}` = {what}", [value if j == i else v for j, v in enumerate(values)]


def partial_masks(value: Any) -> list[tuple[str, np.ndarray]]:
    """``value`` with some of its entries (in row-major order, k = 0..n-1) ``-inf``, in the
    shapes masks take: every other entry, a prefix (k < n/2: keys before a window), a suffix
    (k ≥ n/2: a causal row's future keys), all but one entry (a single key kept), all but a band
    (|k - n/2| ≤ 1, a sliding window) and a seeded arbitrary predicate that keeps at least one
    entry (the positions a mask removes depend on the index in every way)."""
    v = np.asarray(value, dtype=float)
    n = v.size
    k = np.arange(n)
    arbitrary = np.random.default_rng(n).random(n) < 0.5
    arbitrary[n // 3] = False
    shapes = [("at every other entry", k % 2 == 0), ("on a prefix", k < (n + 1) // 2), ("on a suffix", k >= n // 2),
              ("but at one entry", k != n // 2), ("outside a band", np.abs(k - n // 2) > 1),
              ("at arbitrary entries", arbitrary)]
    out = []
    for what, mask in shapes:
        masked = v.copy()
        masked.reshape(-1)[mask] = -math.inf
        out.append((f"-inf {what}", masked))
    return out


def zero_sum(value: Any) -> np.ndarray:
    """Nonzero integers in ± pairs along every axis (the last position of an odd-sized axis
    0), so that every row, along any axis, sums to exactly 0 in any order of summation: a
    normaliser Σ a2(S) of an odd activation (id, tanh, sign) is then 0 though S is not, where
    the evaluator's convention gives 0 and a guard on the row being 0 (or a ``sqrt``
    normaliser's ``max(·, TINY)``) does not."""
    v = np.asarray(value, dtype=float)
    if v.ndim == 0:
        return np.zeros_like(v)
    index = np.indices(v.shape)
    magnitude = 1.0 + np.floor(4.0 * np.abs(np.nan_to_num(v[tuple(2 * (index // 2))], posinf=0.0, neginf=0.0)))
    sign = np.ones(v.shape)
    for k, n in enumerate(v.shape):
        sign = sign * np.where(index[k] % 2 == 0, 1.0, -1.0) * np.where((n % 2 == 1) & (index[k] == n - 1), 0.0, 1.0)
    return sign * magnitude + 0.0  # no -0.0: a signed zero is not what this case is about


def show_sizes(sizes: dict[str, int]) -> str:
    """``x=2, y=3`` (or ``no axes``), as certificates name the sizes of a case."""
    return ", ".join(f"{a}={n}" for a, n in sizes.items()) or "no axes"


# ---- decisions -----------------------------------------------------------------------------------


def flat(values: Sequence[Named], order: Sequence[tuple[str, ...]] | None = None) -> list[Any]:
    """The entries of ``values`` in one list, each transposed to ``order[i]`` when given
    (so that two sides' outputs line up entry by entry)."""
    out: list[Any] = []
    for i, v in enumerate(values):
        data = v.to(order[i]) if order is not None else v.data
        out.extend(np.asarray(data, dtype=object).ravel().tolist())
    return out


def numeric_equal(left: Sequence[Any] | np.ndarray, right: Sequence[Any] | np.ndarray) -> bool:
    """Do two flat lists or arrays of floats agree to ``TOLERANCE`` (NaN equal to NaN)?"""
    return bool(np.allclose(np.asarray(left, dtype=float), np.asarray(right, dtype=float), rtol=TOLERANCE,
                            atol=TOLERANCE, equal_nan=True))


def symbolic_equal(left: Sequence[Any], right: Sequence[Any]) -> bool:
    """Does every difference ``left[i] - right[i]`` of sympy scalars simplify to 0?

    A difference with ``Max``/``Min`` is decided by cases: for every ordering of the
    scalars inside them, the scalars are rewritten as t, t - p1, t - p1 - p2, ... with
    p_i >= 0, which decides every Max/Min and covers ties.  Raises ``TooLarge`` with more
    than ``MAX_ORDERED`` such scalars."""
    diffs = [sympy.sympify(a) - sympy.sympify(b) for a, b in zip(left, right, strict=True)]
    split = [d for d in diffs if d.has(sympy.Max, sympy.Min)]
    if not all(_zero(d) for d in diffs if not d.has(sympy.Max, sympy.Min)):
        return False
    return all(_zero(d.subs(sub)) for sub in _orderings(split) for d in split)


def _zero(d: Any) -> bool:
    """Does ``d`` simplify to 0?  Cheap normal forms first (exponentials combined), then simplify."""
    for step in (sympy.expand, lambda e: sympy.powsimp(e, combine="exp"),
                 lambda e: sympy.expand(sympy.powsimp(sympy.together(e), combine="exp")), sympy.cancel):
        d = step(d)
        if d == 0:
            return True
    try:
        return bool(sympy.simplify(d) == 0)
    except (AttributeError, TypeError, ValueError):  # sympy's Piecewise simplification fails on some forms
        return False  # (sign of |sign(A - B)|'s difference): not shown 0, so not certified equal


def _orderings(exprs: Sequence[Any]) -> list[dict[Any, Any]]:
    """Substitutions covering every ordering of the scalars inside Max/Min (see ``symbolic_equal``).

    The new symbols are named ``t'`` and ``p'i``, names no input symbol has (``symbols``
    names entries ``A[i]``, the lemma's parameters are identifiers), so a substitution
    never replaces inside a replacement."""
    inside: set[Any] = set()
    for e in exprs:
        for atom in sympy.sympify(e).atoms(sympy.Max, sympy.Min):
            inside |= atom.free_symbols
    if not inside:
        return [{}]
    names = sorted(inside, key=str)
    if len(names) > MAX_ORDERED:
        raise TooLarge
    top = sympy.Symbol("t'", real=True)
    gaps = [sympy.Symbol(f"p'{i}", nonnegative=True) for i in range(1, len(names))]
    cases = []
    for order in itertools.permutations(names):
        value: Any = top
        sub = {order[0]: top}
        for sym, gap in zip(order[1:], gaps, strict=True):
            value = value - gap
            sub[sym] = value
        cases.append(sub)
    return cases
