"""TRUSTED: a sound finiteness and sign analysis, to discharge a lemma's ``when c finite``
condition, decide what an accumulator's proof or test covers, and let a kernel skip a chunk.

Domain (README "Proofs"): every input entry is a finite real, every axis has at least one
position; ``±inf`` enters only through constants (masks) and what ops make of them.  The
analysis is abstract interpretation over the *classes* of an extended real::

    "-inf"   "-" (negative, finite)   "0" (either sign of zero)   "+"   "+inf"   "nan"

A term's abstract value is a set of classes that contains the class of every entry of its
value, for every input in the domain, over the reals with the evaluator's conventions
(``evaluate.py``).  Inputs are ``{-, 0, +}``, constants their class, sizes ``{+}``; a
binding is read through, anything else (a diagram used as a box, an unknown name, an op
without a rule) is ``TOP``, every class.  ``RULES`` holds one transfer rule per op of
``ops.OPS`` (a test checks that, and each rule against the evaluator):

- unary ops map class by class (``UNARY``): ``exp(-inf) = 0`` (so ``exp`` of a mask is
  ``{0, +}``, not positive), ``exp(+inf) = +inf``; ``log``: ``0 → -inf``, negative → nan;
  ``sqrt``/``rsqrt`` of a negative → nan, ``rsqrt``/``recip`` of 0 → ``±inf`` (the zero's sign);
  ``gelu``/``silu`` of ``-inf`` → nan (``-inf · 0``); nan stays nan;
- binary ops combine every pair of classes (``_PAIR``): ``+inf + -inf = nan``,
  ``0 · ±inf = nan``, signs multiply; ``a - b = a + (-b)``, ``a / b = a · (1/b)``; and one
  relational fact: the guarded divisor ``d + (1 - g)``, ``g`` = ``square(sign d)`` or
  ``abs(sign d)``, is 1 where d = 0 and d elsewhere;
- a reduction over n ≥ 1 positions folds its pair rule to a fixed point (every sum,
  product, maximum or minimum of one or more entries); ``mean`` as ``sum``; ``cumsum`` as
  ``sum`` (each prefix is a sum of one or more entries); ``linrec`` the least set holding X
  and closed under h ↦ A·h + X; ``logsumexp`` is finite (at least its maximum) unless its maximum is infinite or nan;
- a normalisation or normalised contraction ``a1(s) / b(Σ a2(s))`` (0 where the normaliser
  is 0) composes those rules, ``exp``'s weights on scores shifted by a finite maximum;
  ``contract`` is the sum of the product of its operands;
- ``where`` is either operand, ``index`` a finite integer, ``onehot`` 0 or 1, reshapes
  and renames keep their operand's classes.

``finite`` asks for ``{-, 0, +}``, ``masked`` also admits ``-inf`` (a mask).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from functools import reduce as fold

from napkin_cat import ops
from napkin_cat.terms import Box, Const, Diagram, Expr, Size, Var

__all__ = ["FINITE", "INFINITE", "MASKS", "MASKS_TESTED", "RULES", "TOP", "UNARY", "Value", "analyse", "class_of",
           "finite", "finite_in", "masked", "narrowed", "unsupported"]

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
    "gelu": {"-inf": "nan", "-": "-", "0": "0", "+": "+", "+inf": "+inf"},
    "silu": {"-inf": "nan", "-": "-", "0": "0", "+": "+", "+inf": "+inf"},
    "sign": {"-inf": "-", "-": "-", "0": "0", "+": "+", "+inf": "+"},
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


def _weights(params: tuple[str, ...], s: Value) -> Value:
    """a1(s) / b(Σ a2(s)), 0 where the normaliser is 0; exp's weights read s - max s, the
    maximum taken as 0 where it is not finite (evaluate.nweights)."""
    a1, a2, b = params
    if a1 == a2 == "exp":
        top = _folded("maximum", s)
        s = _pairs("sub", s, (top & FINITE) | (_v("0") if top - FINITE else frozenset()))
    z = _folded("add", _unary(a2, s))
    denom = z if b == "id" else _unary("sqrt", z)  # rms: sqrt(z / n), n ≥ 1, the same classes
    return _pairs("div", _unary(a1, s), denom - _v("0")) | (_v("0") if "0" in denom else frozenset())


def _recurrence(a: Value, x: Value) -> Value:
    """Every h of h[0] = x[0], h[t] = a[t]·h[t-1] + x[t]: the least set holding ``x`` and
    closed under h ↦ a·h + x (a fixed point, as ``_folded``)."""
    out = x
    while (grown := out | _pairs("add", _pairs("mul", a, out), x)) != out:
        out = grown
    return out


_REDUCE = {"sum": "add", "mean": "add", "prod": "mul", "max": "maximum", "min": "minimum"}

#: one transfer rule per op: (the box, its operands' values, the analysis) -> the box's value
Rule = Callable[[Box, list[Value], "_Analysis"], Value]


def _rule(op: str) -> Rule:
    kind = ops.OPS[op].kind
    if kind == "unary":
        return lambda box, vs, _: _unary(op, vs[0])
    if op == "add":
        return lambda box, vs, an: an.guarded(box) or _pairs("add", *vs)
    if kind == "binary":
        return lambda box, vs, _: _pairs(op, *vs)
    if op == "logsumexp":
        return lambda box, vs, _: _logsumexp(vs[0])
    if kind == "reduce":
        return lambda box, vs, _: _folded(_REDUCE[op], vs[0])
    if op == "cumsum":
        return lambda box, vs, _: _folded("add", vs[0])
    if op == "linrec":
        return lambda box, vs, _: _recurrence(vs[0], vs[1])
    if kind == "normalise":
        return lambda box, vs, _: _weights(ops.OPS[op].weights or ("", "", ""), vs[0])
    if kind == "ncontract":
        return lambda box, vs, _: _folded("add", _pairs("mul", _weights(box.params, vs[0]), vs[1]))
    if kind == "contract":
        return lambda box, vs, _: _folded("add", fold(lambda a, b: _pairs("mul", a, b), vs))
    if kind == "where":
        return lambda box, vs, _: vs[0] | vs[1]
    if kind == "compare":
        return lambda box, vs, _: _v("0 +")
    if kind == "select":
        return lambda box, vs, _: vs[1] | vs[2]
    if kind == "gather":
        return lambda box, vs, _: vs[0]
    if kind == "index":
        return lambda box, vs, _: FINITE
    if kind == "onehot":
        return lambda box, vs, _: _v("0 +")
    if kind in ("split", "join", "rename", "transpose"):
        return lambda box, vs, _: vs[0]
    return lambda box, vs, _: TOP  # an op of a kind without a rule could be anything


RULES: dict[str, Rule] = {op: _rule(op) for op in ops.OPS}


class _Analysis:
    """The abstract values of a diagram's terms: ``defs`` maps binding names to their
    expressions, ``inputs`` the inputs to their values (finite reals by the domain)."""

    def __init__(self, defs: Mapping[str, Expr], inputs: Mapping[str, Value]):
        self.defs, self.inputs, self.seen = defs, inputs, dict[str, Value]()

    def value(self, expr: Expr) -> Value:
        if isinstance(expr, Var):
            if expr.name in self.inputs:
                return self.inputs[expr.name]
            if expr.name not in self.defs:
                return TOP
            if expr.name not in self.seen:
                self.seen[expr.name] = TOP  # a cycle (none in a diagram) would read TOP
                self.seen[expr.name] = self.value(self.defs[expr.name])
            return self.seen[expr.name]
        if isinstance(expr, Const):
            return frozenset({class_of(expr.value)})
        if isinstance(expr, Size):
            return _v("+")
        if not isinstance(expr, Box) or expr.op not in RULES:
            return TOP
        return RULES[expr.op](expr, [self.value(a) for a in expr.args], self)

    def through(self, expr: Expr) -> Expr:
        while isinstance(expr, Var) and expr.name in self.defs and expr.name not in self.inputs:
            expr = self.defs[expr.name]
        return expr

    def guarded(self, box: Box) -> Value | None:
        """``d + (1 - g)`` with ``g`` = ``square(sign d)`` or ``abs(sign d)``: 1 where d = 0
        (the evaluator's and the VJP's guard of a divisor that may be 0), d elsewhere
        (g = 1 there, also where d is infinite); None for any other sum."""
        for d, rest in (box.args, box.args[::-1]):
            rest = self.through(rest)
            if isinstance(rest, Box) and rest.op == "sub" and rest.args[0] == Const(1.0):
                g = self.through(rest.args[1])
                inner = self.through(g.args[0]) if isinstance(g, Box) and g.op in ("square", "abs") else None
                if isinstance(inner, Box) and inner.op == "sign" and self.through(inner.args[0]) == self.through(d):
                    v = self.value(d)
                    return (v - _v("0")) | (_v("+") if "0" in v else frozenset())
        return None


def analyse(expr: Expr, defs: Mapping[str, Expr], inputs: Mapping[str, Value]) -> Value:
    """The abstract value of ``expr``, its inputs' values given by ``inputs``."""
    return _Analysis(defs, inputs).value(expr)


def finite(expr: Expr, defs: Mapping[str, Expr], inputs: frozenset[str] | set[str] = frozenset()) -> bool:
    """Is ``expr`` finite wherever it is evaluated on finite inputs?  ``defs`` maps binding
    names to their expressions, ``inputs`` names the diagram's inputs (finite by the domain)."""
    return analyse(expr, defs, dict.fromkeys(inputs, FINITE)) <= FINITE


def masked(expr: Expr, defs: Mapping[str, Expr], inputs: frozenset[str] | set[str] = frozenset()) -> bool:
    """Is every entry of ``expr`` finite or ``-inf`` (a mask) on finite inputs?"""
    return analyse(expr, defs, dict.fromkeys(inputs, FINITE)) <= FINITE | _v("-inf")


#: how a proof names the parameters it also covers with -inf masks (prove.py writes it)
MASKS = re.compile(r"\[-inf masks: ([\w, ]+)\]")


#: how a proved accumulator's answer names the operands it was also tested on with -inf
#: entries (masks), and with ±inf entries (certify.infinite_tested writes both)
MASKS_TESTED = re.compile(r"\[-inf tested: ([\w, ]+)\]")
INFINITE = re.compile(r"\[infinite: ([\w, ]+)\]")


def _listed(how: str, marker: re.Pattern[str]) -> set[str]:
    """The parameter names a certification answer lists after ``marker``."""
    found = marker.search(how)
    return {m.strip() for m in found.group(1).split(",")} if found else set()


def _uncovered(diagram: Diagram, terms: Mapping[str, Expr], masks: set[str], infinite: set[str]) -> str | None:
    """The first parameter whose matched term is neither finite, nor a -inf mask where the
    parameter is in ``masks``, nor anything where it is in ``infinite``; None when all are."""
    defs = {let.names[0]: let.expr for let in diagram.body if len(let.names) == 1}
    inputs = {p.name for p in diagram.inputs}
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
    n = _uncovered(diagram, terms, masks | _listed(how, MASKS_TESTED), _listed(how, INFINITE))
    if n is None:
        return None
    which = ("first", "second", "third")[int(n[1:])] if n[1:].isdigit() and int(n[1:]) < 3 else n
    return (f"its {which} operand may be infinite here, and it is {'proved' if proved else 'tested'} for finite "
            f"operands{' and -inf masks' if masks else ''}, not tested with infinite ones")


def narrowed(how: str, diagram: Diagram, terms: Mapping[str, Expr]) -> str:
    """Certification's ``how`` for one use, its parameters matched to ``terms``: a proof
    (``proved: ...``) covers finite inputs, and -inf masks in the parameters it names in
    ``[-inf masks: S]``; applied to anything else the use is only tested."""
    if not how.startswith("proved") or _uncovered(diagram, terms, _listed(how, MASKS), set()) is None:
        return how
    return f"tested here (proved for finite terms, applied to one that may be infinite): {how[len('proved: '):]}"


def finite_in(diagram: Diagram, expr: Expr) -> bool:
    """``finite`` for a term of ``diagram`` (its bindings and inputs in scope)."""
    defs = {let.names[0]: let.expr for let in diagram.body if len(let.names) == 1}
    return finite(expr, defs, {p.name for p in diagram.inputs})
