"""Running error bounds of the float64 evaluation: how far ``evaluate``'s float64 value of a
diagram may lie from its exact value, entry by entry, so that the join test
(``lower.backward``) tells a backward that rounds differently from the VJP from one that is
wrong.

``evaluate_bounded`` runs the evaluator's own fold (``evaluate.Interpreter``: the values are
``evaluate``'s, bit for bit) and beside each value a bound ``e ≥ |computed - exact|``, the
standard first-order forward error analysis (Higham, *Accuracy and Stability of Numerical
Algorithms*, §3): with u = 2^-53 and γ_n = n·u / (1 - n·u),

- an input is exact, or carries the bound it was computed with (a forward's saved outputs:
  the backward reads FlashAttention's row statistic L rounded, and ``exp(S - L)`` turns L's
  absolute error into a relative one of P);
- a sum of n terms errs by the terms' errors plus γ_{n-1}·Σ|terms| (any order of summation),
  a contraction of K operands by Σ_k Σ|other operands|·e_k plus γ_{n+K-1}·Σ|products|: a
  cancelling sum keeps the bound of the terms it cancelled;
- ``a·b`` by |a|·e_b + |b|·e_a + e_a·e_b, ``a/b`` by (e_a + |a/b|·e_b) / (|b| - e_b) (no
  bound where e_b ≥ |b|), each plus u of the result;
- a function f by |f'(a)|·e_a plus its own error (``SLOPES``, ``ULPS``);
- ``max``/``min`` by the largest error of what they compare, ``logsumexp`` by the largest
  error of its terms plus γ_{n+4} and 2u of the result; a normalisation as the normalised
  contraction it is (``a1(s) / b(Σ a2(s))``, composed of the rules above);
- a decision (``compare``, ``sign``, ``floor``, ``topk``, ``onehot``, ``index``) is taken as exact, as
  are the masks ``select`` and ``where`` read and the positions ``gather`` reads: the two
  sides of a join compute them alike;
- where a value is not finite its bound is 0 (such entries compare by equality); a bound that
  comes out NaN (an infinite operand) accepts nothing but equality.

The bound is first order (products of two errors are dropped, except in ``a·b``): a caller
compares against a multiple of it (``lower.backward.SAFETY``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from napkin_cat import ops
from napkin_cat.evaluate import (
    FLOAT64,
    Interpreter,
    Named,
    bind_sizes,
    einsum_spec,
    exp_shift,
    refuse_too_large,
    special,
)
from napkin_cat.ops import inlined
from napkin_cat.terms import Apply, Box, Const, Diagram, Expr, Size, Var, run_diagram

__all__ = ["RULES", "SLOPES", "ULPS", "Bounded", "U", "evaluate_bounded", "gamma"]

#: float64's unit roundoff
U = 2.0**-53
#: the standard model's underflow term, fl(a op b) = (a op b)(1 + δ) + η with |η| <= 2^-1075, taken as
#: the subnormal spacing 2^-1074 (2^-1075 is no float64): a bound relative to |v| alone is 0 at a
#: subnormal result, which gradients at 2^-60 cotangents reach (dy·exp(X - 700)·(X + 1): 4.9e-324
#: apart from the VJP, the bound 0, so a right backward was refused)
ETA = 2.0**-1074
#: the kinds of boxes that round (each result, or each of a reduction's terms, errs by ETA more)
_ROUNDING = frozenset({"unary", "binary", "reduce", "normalise", "scan", "contract", "ncontract"})
#: each unary op's own error, in units of u times its result's magnitude (libm's and scipy's
#: functions are within a few ulps; the exact ones, 0); gelu's ``1 + erf`` also errs by u·|x|
ULPS: dict[str, float] = {
    "exp": 4, "log": 4, "neg": 0, "sqrt": 1, "rsqrt": 2, "recip": 1, "square": 1, "abs": 0, "tanh": 4,
    "sigmoid": 4, "relu": 0, "gelu": 8, "silu": 6, "sign": 0, "id": 0, "floor": 0,
}


def _phi(x: Any) -> Any:
    return 0.5 * (1.0 + special.erf(x / math.sqrt(2.0)))


#: each unary op's |f'| at its operand a (its value v given too): how an error of a grows
SLOPES: dict[str, Callable[[Any, Any], Any]] = {
    "exp": lambda a, v: np.abs(v), "log": lambda a, v: 1.0 / np.abs(a), "neg": lambda a, v: 1.0,
    "sqrt": lambda a, v: 0.5 / np.abs(v), "rsqrt": lambda a, v: 0.5 * np.abs(v) / np.abs(a),
    "recip": lambda a, v: np.square(v), "square": lambda a, v: 2.0 * np.abs(a), "abs": lambda a, v: 1.0,
    "tanh": lambda a, v: 1.0 - np.square(v), "sigmoid": lambda a, v: np.abs(v * (1.0 - v)),
    "relu": lambda a, v: 1.0,
    "gelu": lambda a, v: np.abs(_phi(a) + a * np.exp(-0.5 * np.square(a)) / math.sqrt(2 * math.pi)),
    "silu": lambda a, v: np.abs(special.expit(a) * (1.0 + a * (1.0 - special.expit(a)))),
    "sign": lambda a, v: 0.0, "id": lambda a, v: 1.0, "floor": lambda a, v: 0.0,
}


def gamma(n: int) -> float:
    """γ_n = n·u / (1 - n·u): the relative error of n roundings."""
    return n * U / (1.0 - n * U)


@dataclass(frozen=True)
class Bounded:
    """A value and its error bound (an array of its shape, in the same axis order)."""

    value: Named
    err: Any

    def errors(self) -> Named:
        return Named(self.value.axes, self.err)

    def aligned(self, axes: tuple[str, ...]) -> tuple[Any, Any]:
        return self.value.aligned(axes), self.errors().aligned(axes)


def _times(slope: Any, err: Any) -> Any:
    """slope·err, 0 where either is 0 (an exact operand where f' is infinite, an error of an
    operand that does not matter there, as an infinite one behind exp(-inf) = 0)."""
    with np.errstate(all="ignore"):
        return np.where((err == 0) | (slope == 0), 0.0, slope * err)


def _finite(err: Any, value: Any) -> Any:
    """``err`` where ``value`` is finite, else 0 (a non-finite entry is compared by equality)."""
    return np.where(np.isfinite(value), err, 0.0)


def _unary_err(op: str, a: Any, ea: Any, v: Any) -> Any:
    with np.errstate(all="ignore"):
        own = ULPS[op] * U * (np.abs(v) + (np.abs(a) if op == "gelu" else 0.0))
        return _times(SLOPES[op](a, v), ea) + own


def _div_err(a: Any, ea: Any, b: Any, eb: Any, v: Any) -> Any:
    with np.errstate(all="ignore"):
        room = np.abs(b) - eb
        return np.where(room > 0, (ea + _times(np.abs(v), eb)) / np.where(room > 0, room, 1.0), np.inf) + U * np.abs(v)


def _unary(it: Interpreter, node: Box, kids: tuple[Bounded, ...], v: Named) -> Any:
    (a,) = kids
    return _unary_err(node.op, a.value.to(v.axes), a.errors().to(v.axes), v.data)


def _binary(it: Interpreter, node: Box, kids: tuple[Bounded, ...], v: Named) -> Any:
    (a, ea), (b, eb) = (k.aligned(v.axes) for k in kids)
    with np.errstate(all="ignore"):
        if node.op in ("add", "sub"):
            return ea + eb + U * np.abs(v.data)
        if node.op == "mul":
            return _times(np.abs(a), eb) + _times(np.abs(b), ea) + ea * eb + U * np.abs(v.data)
        if node.op == "div":
            return _div_err(a, ea, b, eb, v.data)
        assert node.op in ("maximum", "minimum"), node.op
        return np.broadcast_to(np.maximum(ea, eb), v.data.shape)


def _sum_err(data: Any, err: Any, axis: tuple[int, ...]) -> Any:
    """The bound of a sum over ``axis`` (kept, of length 1): the terms' errors plus γ_{n-1}·Σ|terms|."""
    n = math.prod(data.shape[i] for i in axis)
    return np.sum(err, axis=axis, keepdims=True) + gamma(max(n - 1, 0)) * np.sum(np.abs(data), axis=axis,
                                                                                 keepdims=True)


def _reduce(it: Interpreter, node: Box, kids: tuple[Bounded, ...], v: Named) -> Any:
    (x,) = kids
    pos = tuple(x.value.axes.index(a) for a in node.target)
    data, err = x.value.data, x.err
    n = math.prod(data.shape[i] for i in pos)
    with np.errstate(all="ignore"):
        if node.op == "sum":
            return np.squeeze(_sum_err(data, err, pos), axis=pos)
        if node.op == "mean":
            return np.squeeze(_sum_err(data, err, pos), axis=pos) / max(n, 1) + U * np.abs(v.data)
        if node.op == "prod":  # Π(|x| + e) - Π|x| bounds the product's error to every order
            mag = np.prod(np.abs(data), axis=pos)
            return np.prod(np.abs(data) + err, axis=pos) - mag + gamma(2 * n + 1) * mag
        if node.op in ("max", "min"):
            return np.max(err, axis=pos, initial=0.0)
        assert node.op == "logsumexp", node.op  # Σ softmax·e ≤ max e; then exp, Σ, log1p and the add
        return np.max(err, axis=pos, initial=0.0) + gamma(n + 4) + 2 * U * np.abs(v.data)


def _exact(it: Interpreter, node: Box, kids: tuple[Bounded, ...], v: Named) -> Any:
    return np.zeros(np.shape(v.data))


def _select(it: Interpreter, node: Box, kids: tuple[Bounded, ...], v: Named) -> Any:
    mask, a, b = kids
    return it.select(node, (mask.value, a.errors(), b.errors())).to(v.axes)


def _where(it: Interpreter, node: Box, kids: tuple[Bounded, ...], v: Named) -> Any:
    return it.indexed(node, tuple(k.errors() for k in kids)).to(v.axes)


def _gather(it: Interpreter, node: Box, kids: tuple[Bounded, ...], v: Named) -> Any:
    table, at = kids
    return it.gather(node, (table.errors(), at.value)).to(v.axes)


def _reshape(it: Interpreter, node: Box, kids: tuple[Bounded, ...], v: Named) -> Any:
    return it.reshape(node, (kids[0].errors(),)).to(v.axes)


def _scan(it: Interpreter, node: Box, kids: tuple[Bounded, ...], v: Named) -> Any:
    """cumsum: the prefix sums' bounds; linrec: h_t = A_t·h_{t-1} + X_t step by step, reading
    h_{t-1} from the computed value."""
    axes = v.axes
    at = axes.index(node.target[0])
    h = np.moveaxis(v.data, at, 0)
    x, ex = (np.moveaxis(np.broadcast_to(d, v.data.shape), at, 0) for d in kids[-1].aligned(axes))
    if node.op == "cumsum":
        return np.moveaxis(np.cumsum(ex, axis=0) + gamma(h.shape[0]) * np.cumsum(np.abs(x), axis=0), 0, at)
    a, ea = (np.moveaxis(d, at, 0) for d in kids[0].aligned(axes))
    err = [ex[0]]
    with np.errstate(all="ignore"):
        for t in range(1, h.shape[0]):
            i = t if a.shape[0] > 1 else 0
            err.append(_times(np.abs(a[i]), err[-1]) + _times(np.abs(h[t - 1]), ea[i]) + ea[i] * err[-1] + ex[t]
                       + U * (np.abs(a[i] * h[t - 1]) + np.abs(h[t])))
    return np.moveaxis(np.stack(np.broadcast_arrays(*err)), 0, at)


def _weights(params: tuple[str, ...], s: Bounded, pos: tuple[int, ...], n: int) -> tuple[Any, Any]:
    """The weights a1(s) / b(Σ a2(s)) (``evaluate.Algebra.nweights``) and their bound."""
    a1, a2, b = params
    data, err = s.value.data, s.err
    with np.errstate(all="ignore"):
        if a1 == a2 == "exp" and b == "id":  # the evaluator shifts by the maximum, whose error is the largest
            data = data - exp_shift(data, pos)
            err = _finite(err + np.max(err, axis=pos, keepdims=True, initial=0.0) + U * np.abs(data), data)
        top = FLOAT64.unary[a1](data)
        e_top = _finite(_unary_err(a1, data, err, top), top)
        w = FLOAT64.unary[a2](data)
        z = np.sum(w, axis=pos, keepdims=True)
        e_z = _finite(_sum_err(w, _finite(_unary_err(a2, data, err, w), w), pos), z)
        if b == "id":
            denom, e_d = z, e_z
        else:
            scaled, e_s = (z, e_z) if b == "sqrt" else (z / n, e_z / n + U * np.abs(z / n))
            denom = np.sqrt(scaled)
            e_d = _unary_err("sqrt", scaled, e_s, denom)
        v = FLOAT64.nweights(params, s.value.data, pos, n)
        e = np.where(denom == 0, 0.0, _div_err(top, e_top, denom, _finite(e_d, denom), v))
    return v, _finite(e, v)


def _normalise(it: Interpreter, node: Box, kids: tuple[Bounded, ...], v: Named) -> Any:
    (s,) = kids
    pos = tuple(s.value.axes.index(a) for a in node.target)
    weights = ops.OPS[node.op].weights
    assert weights is not None
    return Named(s.value.axes, _weights(weights, s, pos, math.prod(s.value.data.shape[i] for i in pos))[1]).to(v.axes)


def _contract(it: Interpreter, node: Box, kids: tuple[Bounded, ...], v: Named) -> Any:
    values, errs = [k.value.data for k in kids], [k.err for k in kids]
    axes = [k.value.axes for k in kids]
    if node.op == "ncontract":
        s = kids[0]
        pos = tuple(s.value.axes.index(a) for a in node.target)
        values[0], errs[0] = _weights(node.params, s, pos, math.prod(s.value.data.shape[i] for i in pos))
    spec, out = einsum_spec(axes, node.target)
    length = {a: size for k, d in zip(axes, values, strict=True) for a, size in zip(k, np.shape(d), strict=True)}
    n = math.prod(length[a] for a in node.target)  # the terms of each entry's sum
    mags = [np.abs(d) for d in values]
    many = len(values) > 2
    with np.errstate(all="ignore"):
        total = gamma(n + len(values) - 1) * np.einsum(spec, *mags, optimize=many)
        for k in range(len(values)):
            if np.any(errs[k]):
                total = total + np.einsum(spec, *[errs[k] if j == k else m for j, m in enumerate(mags)], optimize=many)
    return Named(out, np.asarray(total)).to(v.axes)


#: the error rule of each kind of box (``ops.OpInfo.kind``), as ``evaluate.BY_KIND`` evaluates it
RULES: dict[str, Callable[[Interpreter, Box, tuple[Bounded, ...], Named], Any]] = {
    "unary": _unary, "binary": _binary, "reduce": _reduce, "compare": _exact, "select": _select, "gather": _gather,
    "topk": _exact, "normalise": _normalise, "scan": _scan, "contract": _contract, "ncontract": _contract,
    "where": _where, "index": _exact, "onehot": _exact, "split": _reshape, "join": _reshape, "rename": _reshape,
    "transpose": _reshape,
}


def _visitor(it: Interpreter) -> Callable[[Expr, tuple[Bounded, ...], Mapping[str, Bounded]], Bounded]:
    def visit(node: Expr, kids: tuple[Bounded, ...], env: Mapping[str, Bounded]) -> Bounded:
        if isinstance(node, Var):
            return env[node.name]
        if isinstance(node, (Const, Size)):
            value = it.visit(node, (), {})
            assert isinstance(value, Named)
            return Bounded(value, np.zeros(np.shape(value.data)))
        assert not isinstance(node, Apply), "evaluate_bounded reads an inlined diagram"
        assert isinstance(node, Box)
        value = it.box(node, tuple(k.value for k in kids))
        with np.errstate(all="ignore"):
            kind = ops.OPS[node.op].kind
            err = np.broadcast_to(RULES[kind](it, node, kids, value), np.shape(value.data))
            if kind in _ROUNDING:  # η per result, per term of a reduction (its products, or a scan's steps)
                extents = {a: n for k in kids for a, n in zip(k.value.axes, np.shape(k.value.data), strict=True)}
                err = err + ETA * math.prod(n for a, n in extents.items() if a not in value.axes or kind == "scan")
            return Bounded(value, _finite(err, value.data))
    return visit


def evaluate_bounded(diagram: Diagram, arrays: Sequence[Any], errors: Sequence[Any] | None = None,
                     sizes: Mapping[str, int] | None = None) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``evaluate(diagram, arrays, sizes)`` in float64 (its outputs, always a tuple) and a bound
    on each output entry's distance from the exact value, the inputs off their exact values by
    at most ``errors`` (None: exact)."""
    flat = inlined(diagram)
    data = [FLOAT64.asarray(a) for a in arrays]
    errs = [np.zeros(np.shape(d)) if errors is None else np.broadcast_to(np.asarray(e, np.float64), np.shape(d))
            for d, e in zip(data, errors if errors is not None else data, strict=True)]
    bound = bind_sizes(flat, [np.shape(d) for d in data], sizes)
    refuse_too_large(flat, bound)
    it = Interpreter(FLOAT64, dict(bound))
    inputs = [Bounded(Named(p.axes, d), e) for p, d, e in zip(flat.inputs, data, errs, strict=True)]
    outs = run_diagram(flat, inputs, _visitor(it))
    values = tuple(o.value.to(t) for o, t in zip(outs, flat.out_types, strict=True))
    bounds = tuple(o.errors().to(t) for o, t in zip(outs, flat.out_types, strict=True))
    return values, bounds
