"""The kernels' float-safe accumulator state proved to compute the proved plan's value
(``accumulators.float_safe``; README "Kernels").

A float-safe plan carries the state (m, s1, s2, ...) where the proved plan carries
(t1, t2, ...), related by the map φ(m, s) = (k^p1·s1, k^p2·s2, ...) with k = scale(m, 1) and
(p1, p2, ...) the plan's ``degrees``.  If identity, lift, combine, update and final commute
with φ,

    φ(identity') = identity                      φ(lift'(x)) = lift(x)
    φ(combine'(s, t)) = combine(φ s, φ t)        φ(update'(s, x)) = combine(φ s, lift(x))
    final'(s) = final(φ s)

then any fold of chunks by the float-safe plan finishes with the proved plan's value (by
induction on the chunks), and so, by the proved plan's own laws, with the box's.

Proved (``prove_representation``), symbolically at every chunk length on finite real inputs
(the prover's reductions, ``prove._Semantics``), in every case of the class of each running
maximum m: ``usable`` (0 < m < inf: k is m clamped, here an opaque positive function k'(m)
of m, so each law holds for EVERY scale k > 0, the clamp included), ``zero`` (m = ±0: every
score of the state 0, so its other entries are 0; k is the fallback) and ``overflow``
(m = +inf or NaN: some score ±inf or NaN, k = 1; the identity proved is then the one over
the reals with k = 1, and the floats run the proved plan's operations times 1).  A state's
class is its m's; a merged maximum's class is read from its operands' (``_join``), a
chunk's from its scores; that a state of class zero is all 0 is checked on every state the
laws build (identity, lift, combine and update preserve it).  The activations and the
normaliser applied to data are opaque functions u with homogeneity u(c·y) = c^p·u'(y) for
every c > 0 (p = ``DEGREE[u]``), and u(0) = 0 where p > 0: the proof holds for every such
function, and each degree in ``DEGREE`` is itself checked on the evaluator's symbolic
algebra (``_degrees_hold``: y positive, 0 and negative, c positive).  The finaliser is
proved in two cases of the normaliser's entry (the last state entry): nonzero (the
unguarded forms, which equal the guarded ones there) and 0 (the guarded ones, the
evaluator's 0).

Tested (``_classes_hold``, float64 and float32, the kernels' precision): that the terms
decide the classes as the proof reads them: ``scale`` picks the clamp, within
``SCALE_RANGE``, for a usable m whatever the fallback, and the fallback for ±0, +inf and
NaN; ``maximum`` of two classes is their ``_join`` (NaN and +inf absorb, a usable one
beats ±0); max|s| of a chunk is zero, usable or overflow as its scores are all ±0, finite
and not all 0, or hold ±inf or NaN; on representatives of each class (IEEE comparisons and
max are exact, so a class's members go alike).  Rounding is not covered, as for every
proved accumulator (README "Proofs"); the float-safe state's range in float32 is tested by
tests/test_accumulators.py.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import numpy as np
import sympy

from napkin_cat.certify import accumulators as acc
from napkin_cat.certify.atoms import _i, _MaxOf, _Reduction
from napkin_cat.certify.base import Certificate
from napkin_cat.certify.prove import Unproved, _all_equal, _constant, _input, _Semantics
from napkin_cat.evaluate import FLOAT32, FLOAT64, SYMBOLIC, Named, evaluate_named
from napkin_cat.ops import typed_box
from napkin_cat.terms import Axis, Box, Const, Diagram, Expr, Param, Size, Var

__all__ = ["CLASSES", "prove_representation"]

#: the classes of a running max m (the module docstring)
CLASSES = ("usable", "zero", "overflow")
#: the scale of a usable m: any positive function of m
_K = sympy.Function("k'", positive=True)


def _join(a: str, b: str) -> str:
    """The class of maximum(m1, m2) from theirs: overflow absorbs, a usable one beats zero."""
    return next(c for c in ("overflow", "usable", "zero") if c in (a, b))


@cache
def prove_representation(box: Box, axis: str, name: str) -> Certificate | None:
    """None where the kernels run the proved plan of ``name`` itself; else whether its
    float-safe plan represents it (the module docstring): ``proved: ...; tested: ...``, or
    refused with the first law and case that fails."""
    exact, guarded = acc.plan(box, axis, name, guard=False), acc.plan(box, axis, name, guard=True)
    run = acc.float_safe(guarded)
    if run is guarded:
        return None
    try:
        problem = _degrees_hold() or _laws(exact, guarded, acc.float_safe(exact), run) or _classes_hold()
    except Unproved as exc:
        problem = f"outside the proved fragment: {exc}"
    if problem:
        return Certificate(False, "represent", problem)
    state = ", ".join(n + "'" * (i > 0) for i, (n, _) in enumerate(run.state))
    powers = ", ".join(f"k^{p:g}·{n}'" for p, (n, _) in zip(run.degrees, run.state[1:], strict=True))
    return Certificate(True, f"proved: ({state}) stands for ({powers}), k = scale(m); identity, lift, combine, "
                             f"update and final commute with that map for every k > 0 in each class of m "
                             f"({', '.join(CLASSES)}) at every chunk length; tested: the classes scale and maximum "
                             f"pick, on float64 and float32 representatives")


class _Scaled:
    """A float-safe or proved plan's terms -> sympy values in one case of the classes of the
    running maxima (the module docstring); the rest is the prover's semantics."""

    def __init__(self, classes: Mapping[Any, str], chunk: str, divides: bool = False):
        self.sem = _Semantics()
        self.classes, self.chunk, self.divides = dict(classes), chunk, divides

    def cls(self, m: Any) -> str:
        if m == 0:
            return "zero"
        if isinstance(m, _MaxOf):
            return functools.reduce(_join, (self.cls(a) for a in m.args))
        if isinstance(m, _Reduction) and m.kind == "Max":  # a chunk's max|s|
            return self.chunk
        if m in self.classes:
            return self.classes[m]
        raise Unproved(f"the class of the running max `{m}`")

    def run(self, diagram: Diagram, inputs: Sequence[Any]) -> tuple[Any, ...]:
        env = {p.name: v for p, v in zip(diagram.inputs, inputs, strict=True)}
        for let in diagram.body:
            (bound,) = let.names
            env[bound] = self.value(let.expr, env)
        return tuple(self.value(o, env) for o in diagram.outputs)

    def value(self, e: Expr, env: Mapping[str, Any]) -> Any:
        if isinstance(e, Var):
            return env[e.name]
        if isinstance(e, Const):
            return _constant(e.value)
        if isinstance(e, Size):
            return self.sem.size(e.axis)
        if (operands := acc.scale_operands(e)) is not None:  # the case split: k'(m) where m is usable
            m = self.value(operands[0], env)
            return _K(m) if self.cls(m) == "usable" else self.value(operands[1], env)
        if not isinstance(e, Box):
            raise Unproved(f"`{e}` in an accumulator term")
        kids = tuple(self.value(a, env) for a in e.args)
        on_data = not (kids[0].is_number or kids[0].is_positive) if kids else False
        if e.op in acc.DEGREE and (on_data or (kids[0] == 0 and acc.DEGREE[e.op] > 0)):
            return self.homogeneous(e.op, kids[0])  # u(c·y) = c^p·u'(y), u(0) = 0
        if e.op == "div" and self.divides:  # the finaliser where its normaliser is not 0
            if kids[1] == 0:
                raise Unproved("a division by 0")
            return kids[0] / kids[1]
        return self.sem.box(e, kids)

    def homogeneous(self, op: str, x: Any) -> Any:
        """u(x) for u = ``op`` of degree p: c^p·u'(y) for x = c·y, c its positive factors, u' opaque."""
        p = sympy.Rational(acc.DEGREE[op])
        if x == 0 and p > 0:
            return sympy.Integer(0)
        factors = sympy.Mul.make_args(x)
        c = sympy.Mul(*(f for f in factors if f.is_positive))
        rest = sympy.Mul(*(f for f in factors if not f.is_positive))
        return c**p * sympy.Function(f"{op}'")(rest)

    def mapped(self, state: Sequence[Any], degrees: Sequence[float]) -> tuple[Any, ...]:
        """φ(m, s) = (k^p1·s1, ...) with k = scale(m, 1), read as the terms read it."""
        k = self.value(acc.scale(Var("m", ()), Const(1.0)), {"m": state[0]})
        return tuple(k ** sympy.Rational(p) * s for p, s in zip(degrees, state[1:], strict=True))


def _states(run: acc.AccumulatorPlan, suffix: str, cls: str, classes: dict[Any, str]) -> list[Any]:
    """A symbolic state of class ``cls`` (registered in ``classes``): zero is the all-0 state."""
    (_, m_axes), *rest = run.state
    if cls == "zero":
        return [sympy.Integer(0)] * len(run.state)
    sign = {"positive": True} if cls == "usable" else {}  # an overflow m (+inf, NaN): only its class is read
    m = sympy.Function(f"m{suffix}", **sign)(*map(_i, m_axes)) if m_axes else sympy.Symbol(f"m{suffix}", **sign)
    classes[m] = cls
    return [m, *(_input(f"{n}{suffix}", t) for n, t in rest)]


def _chunk(box: Box, cls: str) -> list[Any]:
    """A chunk's operands: its scores (the first) all 0 in the zero case."""
    xs = [_input(f"X{k}", a.axes) for k, a in enumerate(box.args)]
    return [sympy.Integer(0), *xs[1:]] if cls == "zero" else xs


def _laws(exact: acc.AccumulatorPlan, guarded: acc.AccumulatorPlan, run_exact: acc.AccumulatorPlan,
          run: acc.AccumulatorPlan) -> str | None:
    """The first law and case where the float-safe plan does not commute with the map, or None."""
    box, p = guarded.box, run.degrees
    assert run.update is not None

    def shown(*classes: str) -> str:
        return "m " + " and ".join(classes)

    def commutes(ev: _Scaled, state: tuple[Any, ...], proved: tuple[Any, ...]) -> bool:
        """φ(state) = proved, and a state of m zero is all 0 (what its cases assume)."""
        zero = ev.cls(state[0]) != "zero" or _all_equal(state[1:], (sympy.Integer(0),) * len(state[1:]))
        return zero and _all_equal(ev.mapped(state, p), proved)

    ev = _Scaled({}, "usable")
    if not commutes(ev, tuple(map(_constant, run.identity)), tuple(map(_constant, guarded.identity))):
        return "identity: φ(identity') != identity"
    for chunk in CLASSES:
        ev = _Scaled({}, chunk)
        xs = _chunk(box, chunk)
        if not commutes(ev, ev.run(run.lift, xs), ev.run(guarded.lift, xs)):
            return f"lift: φ(lift'(x)) != lift(x) for a chunk of {shown(chunk)}"
    for one, two in itertools.product(CLASSES, repeat=2):
        classes: dict[Any, str] = {}
        s1, s2 = _states(run, "1", one, classes), _states(run, "2", two, classes)
        ev = _Scaled(classes, "usable")
        if not commutes(ev, ev.run(run.combine, [*s1, *s2]),
                        ev.run(guarded.combine, [*ev.mapped(s1, p), *ev.mapped(s2, p)])):
            return f"combine: φ(combine'(s, t)) != combine(φ s, φ t) for states of {shown(one, two)}"
    for one, chunk in itertools.product(CLASSES, repeat=2):
        classes = {}
        s1 = _states(run, "1", one, classes)
        ev = _Scaled(classes, chunk)
        xs = _chunk(box, chunk)
        if not commutes(ev, ev.run(run.update, [*s1, *xs]),
                        ev.run(guarded.combine, [*ev.mapped(s1, p), *ev.run(guarded.lift, xs)])):
            return f"update: φ(update'(s, x)) != combine(φ s, lift(x)) for a state of {shown(one)}, a chunk of " \
                   f"{shown(chunk)}"
    for one, normaliser in itertools.product(CLASSES, ("nonzero", "zero")):
        if one == "zero" and normaliser == "nonzero":
            continue  # the zero state's normaliser is 0
        classes = {}
        s1 = _states(run, "", one, classes)
        if normaliser == "zero":  # the normaliser's entry (the last) 0: the guarded finalisers' 0
            s1[-1] = sympy.Integer(0)
        ev = _Scaled(classes, "usable", divides=normaliser == "nonzero")
        final, finish = (run_exact.final, exact.final) if normaliser == "nonzero" else (run.final, guarded.final)
        if not _all_equal(ev.run(final, s1), ev.run(finish, list(ev.mapped(s1, p)))):
            return f"final: final'(s) != final(φ s) for a state of {shown(one)}, its normaliser {normaliser}"
    return None


@cache
def _degrees_hold() -> str | None:
    """The first op whose ``DEGREE`` the evaluator's symbolic algebra contradicts: u(c·y) =
    c^p·u(y) at y positive, 0 and negative, c positive, and u(0) = 0 where p > 0 (which
    homogeneity gives only for a finite u(0)); None where all hold."""
    c, y = sympy.Symbol("c", positive=True), sympy.Symbol("y", positive=True)
    for op, p in acc.DEGREE.items():
        u = SYMBOLIC.unary[op]
        if p > 0 and u(sympy.Integer(0)) != 0:
            return f"`{op}` of degree {p:g} is {u(sympy.Integer(0))} at 0, not 0"
        for x in (y, sympy.Integer(0), -y):
            left, right = u(c * x), c ** sympy.Rational(p) * u(x)
            if not (left == right or sympy.simplify(left - right) == 0):
                return f"`{op}` is not of degree {p:g}: {op}(c·{x}) = {left}, c^{p:g}·{op}({x}) = {right}"
    return None


#: representatives of each class of a running max (the module docstring), float32's range inside
_REPRESENTATIVES = {"zero": (0.0, -0.0), "usable": (1e-45, 2.0**-130, 2.0**-126, 1.0, 2.0**126, 2.0**127, 3e38),
                    "overflow": (math.inf, math.nan)}


def _evaluated(expr: Expr, values: Mapping[str, tuple[tuple[str, ...], np.ndarray]], algebra: Any) -> np.ndarray:
    params = tuple(Param(n, axes) for n, (axes, _) in values.items())
    diagram = Diagram("classes", params, (), (expr,), (expr.axes,), (Axis("x"),))
    with np.errstate(all="ignore"):
        (out,) = evaluate_named(diagram, [Named(axes, v) for axes, v in values.values()], {"x": 2}, algebra)
    return np.asarray(out.data, dtype=float)


@cache
def _classes_hold() -> str | None:
    """The first class fact (the module docstring) the terms contradict, or None."""
    m, other = Var("m", ()), Var("f", ())
    low, high = acc.SCALE_RANGE
    for algebra, dtype in ((FLOAT64, np.float64), (FLOAT32, np.float32)):
        for cls, values in _REPRESENTATIVES.items():
            for v in values:
                value = dtype(v)
                for fallback in (1.0, 7.0):
                    k = float(_evaluated(acc.scale(m, other), {"m": ((), np.asarray(value)),
                                                                "f": ((), np.asarray(dtype(fallback)))}, algebra))
                    want = min(max(float(value), low), high) if cls == "usable" else fallback
                    if k != want:
                        return f"scale({v:g}, {fallback:g}) is {k:g} in {dtype.__name__}, not {want:g} ({cls})"
                scores = np.asarray([-value, dtype(0.5) if cls == "overflow" else dtype(0.0)], dtype=dtype)
                top = _evaluated(typed_box("max", (typed_box("abs", (Var("s", ("x",)),)),), ("x",)),
                                 {"s": (("x",), scores)}, algebra)
                if _class_of(float(top)) != cls:
                    return f"max|s| of a chunk {scores.tolist()} is {float(top):g} in {dtype.__name__}, not {cls}"
        pairs = [(a, b, ca, cb) for ca, cb in itertools.product(CLASSES, repeat=2)
                 for a, b in itertools.product(_REPRESENTATIVES[ca], _REPRESENTATIVES[cb])]
        for a, b, ca, cb in pairs:
            got = float(_evaluated(typed_box("maximum", (m, other)), {"m": ((), np.asarray(dtype(a))),
                                                                      "f": ((), np.asarray(dtype(b)))}, algebra))
            if _class_of(got) != _join(ca, cb):
                return f"maximum({a:g}, {b:g}) is {got:g} in {dtype.__name__}, not {_join(ca, cb)}"
    return None


def _class_of(m: float) -> str:
    return "zero" if m == 0 else "usable" if 0 < m < math.inf else "overflow" if m == math.inf or math.isnan(m) \
        else "negative"
