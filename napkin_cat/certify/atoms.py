"""TRUSTED (for ``proved`` answers, with prove.py): the prover's atoms and their normal forms.

Values are sympy expressions in one index symbol ``i_a`` per axis (``j_a`` where a reduction
binds it), each ranging over 0 ≤ i_a < n_a.  A reduction over axes A is an opaque atom
``Sum_A``, ``Max_A``, ``Min_A`` or ``Prod_A`` of its body, built in a normal form by identities
over finite reals (n_a ≥ 1 everywhere):

- Σ: linearity, a factor free of ``i_a`` leaves Σ_a, Σ_a 1 = n_a, and the exchange
  Σ_a (u · Σ_B v) = Σ_{a∪B} (u·v) for a ∉ B;
- max, min, Π: an index-free body c gives c (max, min) or c^n (Π), and nested reductions of
  one kind merge: max_a max_B u = max_{a∪B} u (likewise min, Π);
- max and min of values are commutative, associative, idempotent atoms with identities -oo
  and +oo (``maximum``, ``minimum``), each absorbing the other infinity, and NaN absorbing both.

Reshapes read positions through the split bijection i = q·n + r (0 ≤ r < n): an index is an
integer expression in index symbols, sizes and ``Quo(e, n)`` = ⌊e/n⌋, ``Rem(e, n)`` = e mod n,
normalised by ``index``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import sympy

__all__ = ["Quo", "Rem", "index", "maximum", "minimum", "reduce"]


class _Reduction(sympy.Function):
    """A reduction of ``kind`` (Sum, Max, Min, Prod) over ``axes`` of its one argument (bound
    symbols j_a); subclasses per (kind, axes).  Its sign at every length n ≥ 1: a sum, maximum
    or minimum keeps its body's (positive, non-negative, and by sympy's inference from them
    non-positive or negative); a product is positive or non-negative where its body is, and
    of unknown sign otherwise (Π(-1 - X²) is negative at odd lengths, positive at even ones)."""

    kind = ""
    axes: tuple[str, ...] = ()

    def _eval_is_real(self) -> bool | None:
        return self.args[0].is_real  # type: ignore[no-any-return]

    def _eval_is_positive(self) -> bool | None:
        return self._sign(self.args[0].is_positive)

    def _eval_is_nonnegative(self) -> bool | None:
        return self._sign(self.args[0].is_nonnegative)

    def _sign(self, body: bool | None) -> bool | None:
        """The body's answer, or for a product only a True one (False tells nothing at even n)."""
        return body if self.kind != "Prod" or body else None


@cache
def _atom(kind: str, axes: tuple[str, ...]) -> type[_Reduction]:
    return type(f"{kind}_{'_'.join(axes)}", (_Reduction,), {"kind": kind, "axes": axes})


def _i(a: str) -> sympy.Symbol:
    return sympy.Symbol(f"i_{a}", integer=True)


def _j(a: str) -> sympy.Symbol:
    return sympy.Symbol(f"j_{a}", integer=True)


def _n(a: str) -> sympy.Symbol:
    return sympy.Symbol(f"n_{a}", integer=True, positive=True)


def _expand(e: Any) -> Any:
    return sympy.expand(e, power_exp=True, power_base=False, log=False, multinomial=True, mul=True)


def reduce(kind: str, body: Any, axes: tuple[str, ...]) -> Any:
    """The reduction ``kind`` over ``axes`` of ``body`` (free in i_a) in normal form."""
    if kind == "Sum":
        return _reduce_sum(body, axes)
    bound = {_i(a): _j(a) for a in axes}
    if not set(bound) & body.free_symbols:  # n ≥ 1 equal terms
        return body ** sympy.Mul(*[_n(a) for a in axes]) if kind == "Prod" else body
    if isinstance(body, _Reduction) and body.kind == kind:  # nested: one reduction over the union
        return _atom(kind, tuple(sorted(set(axes) | set(body.axes))))(body.args[0].xreplace(bound))
    return _atom(kind, tuple(sorted(axes)))(body.xreplace(bound))


def _reduce_sum(body: Any, axes: tuple[str, ...]) -> Any:
    out = sympy.Integer(0)
    for term in sympy.Add.make_args(_expand(body)):
        free, dep, bound = sympy.Integer(1), [], set(axes)
        for f in sympy.Mul.make_args(term):
            if not any(_i(a) in f.free_symbols for a in axes):
                free *= f
            elif isinstance(f, _Reduction) and f.kind == "Sum" and not set(f.axes) & bound:
                bound |= set(f.axes)  # exchange: Σ_a (u · Σ_B v) = Σ_{a∪B} (u·v)
                dep.append(f.args[0])
            else:
                dep.append(f)
        inner = sympy.Mul(*dep).xreplace({_i(a): _j(a) for a in axes})
        if not dep:
            out += free * sympy.Mul(*[_n(a) for a in axes])
        else:
            out += free * _atom("Sum", tuple(sorted(bound)))(inner)
    return out


class _Extremum(sympy.Function):
    """The larger (``_MaxOf``) or smaller (``_MinOf``) of its (at least two, symbolic,
    canonically ordered) arguments."""

    def _eval_is_real(self) -> bool | None:
        return all(a.is_real for a in self.args) or None


class _MaxOf(_Extremum):
    def _eval_is_positive(self) -> bool | None:
        return any(a.is_positive for a in self.args) or None


class _MinOf(_Extremum):
    def _eval_is_positive(self) -> bool | None:
        return all(a.is_positive for a in self.args) or None


def _lattice(cls: type[_Extremum], pick: Callable[[list[Any]], Any], top: Any, values: tuple[Any, ...]) -> Any:
    """``cls`` of ``values`` with absorbing element ``top`` and identity ``-top`` (sympy's
    Max/Min compare their arguments at every construction, which dominated the prover's time);
    a NaN argument (sympy's ``nan``, e.g. -oo - -oo on a fully masked row) gives NaN, as the
    evaluator's ``maximum``/``minimum`` do, ``top`` included: max(NaN, +inf) is NaN, not +inf."""
    flat: list[Any] = []
    for v in values:
        flat.extend(v.args if isinstance(v, cls) else (v,))
    if sympy.nan in flat:
        return sympy.nan
    if top in flat:
        return top
    numbers = [v for v in flat if v.is_number and v != -top]
    rest = {v for v in flat if not v.is_number}
    args = sorted(rest | ({pick(numbers)} if numbers else set()), key=sympy.default_sort_key)
    return -top if not args else args[0] if len(args) == 1 else cls(*args)


def maximum(*values: Any) -> Any:
    return _lattice(_MaxOf, max, sympy.oo, values)


def minimum(*values: Any) -> Any:
    return _lattice(_MinOf, min, -sympy.oo, values)


class Quo(sympy.Function):
    """⌊e / n⌋ of an integer e and a size n ≥ 1."""

    def _eval_is_integer(self) -> bool:
        return True


class Rem(sympy.Function):
    """e - n·⌊e / n⌋, in [0, n)."""

    def _eval_is_integer(self) -> bool:
        return True


def index(e: Any, size: Callable[[Any], Any]) -> Any:
    """The index expression ``e`` normalised by the split bijection, where ``size(s)`` is the
    range n of an index symbol s (0 ≤ s < n; None: not an index symbol):
    Quo(q·n + r, n) = q and Rem(q·n + r, n) = r for n | q and 0 ≤ r < n, and
    n·Quo(e, n) + Rem(e, n) = e (both for every integer e and n ≥ 1)."""
    return _recombine(e.replace(lambda f: isinstance(f, (Quo, Rem)), lambda f: _digit(f, size)))


def _digit(f: Any, size: Callable[[Any], Any]) -> Any:
    e, n = _recombine(f.args[0]), f.args[1]
    q: list[Any] = []
    r: list[Any] = []
    for t in sympy.Add.make_args(_expand(e)):
        (q if (t / n).is_integer else r).append(t)
    bounds = _bounds(sympy.Add(*r), size)
    if bounds is None or _expand(bounds[0]).is_nonnegative is not True or \
            _expand(n - 1 - bounds[1]).is_nonnegative is not True:
        return type(f)(e, n)
    return _expand(sympy.Add(*q) / n) if isinstance(f, Quo) else sympy.Add(*r)


def _bounds(e: Any, size: Callable[[Any], Any]) -> tuple[Any, Any] | None:
    """(lo, hi) with lo ≤ e ≤ hi over the index ranges, or None: for integers, index symbols,
    remainders, positive multiples and sums of these."""
    if e.is_Integer:
        return e, e
    if isinstance(e, Rem):
        return sympy.Integer(0), e.args[1] - 1
    if e.is_Symbol and (n := size(e)) is not None:
        return sympy.Integer(0), n - 1
    if e.is_Add:
        parts = [b for t in e.args if (b := _bounds(t, size)) is not None]
        if len(parts) < len(e.args):
            return None
        return sympy.Add(*(p[0] for p in parts)), sympy.Add(*(p[1] for p in parts))
    varying = [f for f in sympy.Mul.make_args(e) if f.is_positive is not True]
    if e.is_Mul and len(varying) == 1 and (b := _bounds(varying[0], size)) is not None:
        c = e / varying[0]  # a positive factor keeps the order
        return c * b[0], c * b[1]
    return None


def _recombine(e: Any) -> Any:
    """n·Quo(u, n)·c + Rem(u, n)·c → u·c wherever both terms occur."""
    terms = list(sympy.Add.make_args(_expand(e)))
    for t in terms:
        for r in (f for f in sympy.Mul.make_args(t) if isinstance(f, Rem)):
            partner = _expand(t / r * r.args[1] * Quo(*r.args))
            if partner in terms and partner != t:
                rest = [u for u in terms if u not in (t, partner)]
                return _recombine(sympy.Add(*rest, t / r * r.args[0]))
    return sympy.Add(*terms)
