"""Reverse mode on diagrams: the vector-Jacobian product of a diagram, as a diagram.

``vjp(diagram)`` is a new diagram ``NAME_vjp`` that the evaluator, the printer, the cost
model and the lowerings treat like any other.  The convention:

- inputs: the original inputs in declared order, then one cotangent per output, typed as
  that output (named ``d`` + the output's binding name, or ``d_out``/``d_out0``, ... for an
  output that is an expression; a clash gets a ``_2`` suffix);
- outputs: one gradient per original input, typed as that input:
  ``Σ_outputs ⟨cotangent, ∂output/∂input⟩``.

It is built in three passes: calls are inlined (``ops.inlined``, so the woven axes
of a call flow through its boxes by name), every box is bound to a name (the forward
values the backward reads), then cotangents flow from the outputs to the inputs, one rule
per box written with catalogue boxes.  A cotangent carries a subset of its value's axes
(a value that is constant along an axis has a cotangent that lacks it, e.g. after
``sum``); it is summed over the axes its operand lacks (broadcasting's adjoint) and
repeated along the axes a reshape box needs.  Bindings the gradients do not read are
dropped.

Non-differentiable points take the one-sided values ``jax.grad`` gives:
``max(a, b)``/``min(a, b)`` at a tie give each side half (``lax.max``), so ``relu`` (which
is ``max(x, 0)``) has slope 1/2 at 0 as ``jnp.maximum(x, 0)`` does; ``abs`` has slope 1 at
0; ``max``/``min`` reductions split the cotangent equally among tied maxima
(``jnp.max``); ``sign``, ``floor`` (``jnp.floor``'s zero), ``onehot``, ``index`` and ``where``'s predicate have zero
derivative (they are piecewise constant).  ``l2norm``/``rmsnorm`` of an all-zero row, a
normalised contraction with a zero normaliser, and ``max``/``min`` of a row whose
extremum is infinite have no derivative: the gradient there is not finite.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from napkin_cat import ops
from napkin_cat.certify.accumulators import FLOAT_MAX
from napkin_cat.diagnostics import NapkinError, error
from napkin_cat.ops import inlined, typed_box
from napkin_cat.terms import (
    Axes,
    Axis,
    Box,
    Cmp,
    Const,
    Diagram,
    Expr,
    IBin,
    Idx,
    IInt,
    IndexExpr,
    Let,
    Logic,
    Module,
    Param,
    Pred,
    Size,
    Var,
    axes_in_order,
    fresh_name,
    repeated,
    walk,
)

__all__ = ["cotangent_names", "exp_normalised", "live", "vjp", "vjp_module"]


# ---- building boxes ------------------------------------------------------------------------------


def _box(op: str, *args: Expr, target: Axes = (), out: Axes = (), params: tuple[str, ...] = (),
         index: Pred | IndexExpr | None = None) -> Box:
    return typed_box(op, tuple(args), target, out, params, index)


def _c(value: float) -> Const:
    return Const(value)


def _mul(a: Expr, b: Expr) -> Expr:
    if isinstance(a, Const) and a.value == 1.0:
        return b
    if isinstance(b, Const) and b.value == 1.0:
        return a
    return _box("mul", a, b)


def _div(a: Expr, b: Expr) -> Box:
    return _box("div", a, b)


def _add(a: Expr, b: Expr) -> Box:
    return _box("add", a, b)


def _sub(a: Expr, b: Expr) -> Box:
    return _box("sub", a, b)


def _sum(value: Expr, axes: Axes) -> Expr:
    """Σ over those of ``axes`` the value has (summing over an axis it lacks is the caller's
    multiplication by its size, never needed here: cotangents are summed to their operand's axes)."""
    present = tuple(a for a in axes if a in value.axes)
    return _box("sum", value, target=present) if present else value


def _count(axes: Axes) -> Expr:
    """The number of positions of these axes, as a scalar."""
    total: Expr = _c(1.0)
    for a in axes:
        total = Size(a) if isinstance(total, Const) else _mul(total, Size(a))
    return total


def _expand(value: Expr, axes: Axes) -> Expr:
    """The value repeated along those of ``axes`` it lacks."""
    missing = tuple(a for a in axes if a not in value.axes)
    if not missing:
        return value
    return repeated(value, missing, ops.result_axes("where", (value.axes, value.axes), missing))


def _unbroadcast(cotangent: Expr, axes: Axes, broadcast: Axes = ()) -> Expr:
    """Broadcasting's adjoint: the cotangent summed over the axes the operand lacks.  An axis of
    ``broadcast`` (the value of an elementwise box, its operands broadcast to it) that the operand and
    the cotangent both lack is summed too: the cotangent is constant along it, so its sum is the
    cotangent times the axis's size (d/dc Σ_x (B + c) is |x|, not 1)."""
    summed = _sum(cotangent, tuple(a for a in cotangent.axes if a not in axes))
    constant = tuple(a for a in broadcast if a not in axes and a not in cotangent.axes)
    return _mul(summed, _count(constant)) if constant else summed


def _step(x: Expr, sign: float) -> Expr:
    """(1 ± sign(x)) / 2: the slope of max (+) or min (-) in its first argument, 1/2 at a tie."""
    return _mul(_c(0.5), _box("add" if sign > 0 else "sub", _c(1.0), _box("sign", x)))


def _weights(x: Expr, stat: Expr) -> Box:
    """exp(x - max(L, -FLOAT_MAX)) for a saved statistic L = logsumexp(x) over x's row: exp(x - L), and
    0 on a row every entry of which is masked (x and L both -inf, where exp(x - L) is exp(-inf + inf) =
    NaN), as the forward's softmax gives there (its shift reads a -inf maximum as 0) and the VJP's
    gradient does.  The guard is the online softmax's (``certify.accumulators``): every float64 but -inf
    is at least -FLOAT_MAX, so it is L itself wherever L is not -inf."""
    return _box("exp", _sub(x, _box("maximum", stat, _c(-FLOAT_MAX))))


def _equal(a: Expr, b: Expr) -> Expr:
    """1 where a == b, else 0, for finite values: 1 - sign(a - b)²."""
    return _sub(_c(1.0), _box("square", _box("sign", _sub(a, b))))


# ---- the rules: one per op kind ---------------------------------------------------------------------

Rule = Callable[[Box, Var, Expr], tuple[Expr | None, ...]]


def _unary(box: Box, y: Var, g: Expr) -> tuple[Expr | None, ...]:
    (x,) = box.args
    slope: dict[str, Callable[[], Expr]] = {
        "exp": lambda: y,
        "log": lambda: _box("recip", x),
        "neg": lambda: _c(-1.0),
        "sqrt": lambda: _div(_c(0.5), y),
        "rsqrt": lambda: _mul(_c(-0.5), _div(y, x)),
        "recip": lambda: _box("neg", _box("square", y)),
        "square": lambda: _mul(_c(2.0), x),
        # sign(x) + [x == 0]: slope 1 at 0, as jax's abs
        "abs": lambda: _add(_box("sign", x), _sub(_c(1.0), _box("square", _box("sign", x)))),
        "tanh": lambda: _sub(_c(1.0), _box("square", y)),
        "sigmoid": lambda: _mul(y, _sub(_c(1.0), y)),
        "relu": lambda: _step(x, 1.0),
        # Φ(x) + x φ(x), with Φ(x) = gelu(x) / x (1/2 at 0: the [x == 0] terms) and φ the normal density
        "gelu": lambda: _add(
            _div(_add(y, _mul(_c(0.5), _equal(x, _c(0.0)))), _add(x, _equal(x, _c(0.0)))),
            _mul(_mul(_c(0.3989422804014327), x), _box("exp", _mul(_c(-0.5), _box("square", x))))),
        "silu": lambda: _mul(_box("sigmoid", x), _add(_c(1.0), _mul(x, _sub(_c(1.0), _box("sigmoid", x))))),
    }
    if box.op in ("sign", "floor"):  # piecewise constant: zero almost everywhere, as jax.grad gives
        return (None,)
    if box.op == "neg":
        return (_box("neg", g),)
    return (_mul(g, slope[box.op]()),)


def _binary(box: Box, y: Var, g: Expr) -> tuple[Expr | None, ...]:
    a, b = box.args
    if box.op == "add":
        return g, g
    if box.op == "sub":
        return g, _box("neg", g)
    if box.op == "mul":
        return _mul(g, b), _mul(g, a)
    if box.op == "div":
        return _div(g, b), _box("neg", _div(_mul(g, y), b))
    sign = 1.0 if box.op == "maximum" else -1.0
    diff = _sub(a, b)
    return _mul(g, _step(diff, sign)), _mul(g, _step(diff, -sign))


def _reduce(box: Box, y: Var, g: Expr) -> tuple[Expr | None, ...]:
    (x,) = box.args
    axes = box.target
    if box.op == "sum":
        return (g,)
    if box.op == "mean":
        return (_div(g, _count(axes)),)
    if box.op == "logsumexp":
        return (_mul(g, _box("softmax", x, target=axes)),)
    if box.op in ("max", "min"):
        ties = _equal(x, y)
        return (_mul(g, _div(ties, _box("sum", ties, target=axes))),)
    raise AssertionError(box.op)  # prod: its rule reads the companion _others binds the rules run


def _scan(box: Box, y: Var, g: Expr) -> tuple[Expr | None, ...]:
    """cumsum: dX[s] = Σ_{t>=s} g[t], the reverse running sum, as Σ g - cumsum g + g (linrec's rule,
    which needs a fresh axis, is ``_linrec``)."""
    (axis,) = box.target
    g = _expand(g, (axis,))
    return (_add(_sub(_sum(g, (axis,)), _box("cumsum", g, target=(axis,))), g),)


def _linrec(box: Box, y: Var, g: Expr, names: _Names, axes: dict[str, Axis]) -> tuple[Expr | None, ...]:
    """h[t] = A[t]·h[t-1] + X[t]: its adjoint λ[s] = Σ_{t>=s} D[t, s]·g[t] runs backwards, which no box
    does, so it is written over a fresh copy s of the axis: D[t, s] = Π_{s<r<=t} A[r] is
    linrec[t](A, where[t s](t == s, 1, 0)) (0 before s), dX = λ, dA[t] = λ[t]·h[t-1] (h shifted by
    where[t s](s + 1 == t, 1, 0); the 0 is 0 · rename[t -> s](index[t](t)), which sizes s); exact at
    zeros of A, at a cost quadratic in |t| (as prod's)."""
    (t,) = box.target
    decay = box.args[0]
    s = names.fresh(t)
    axes[s] = Axis(s, axes[t].size if t in axes else None)
    # 0 along s, read from a renamed copy of t's positions, so that s has t's size wherever it is evaluated
    zero = _mul(_c(0.0), _box("rename", _box("index", target=(t,), index=Idx(t)), target=(t,), out=(s,)))
    pulse = _box("where", _c(1.0), zero, target=(t, s), index=Cmp("==", Idx(t), Idx(s)))
    lam = _box("rename", _box("contract", _box("linrec", decay, pulse, target=(t,)), g, target=(t,)),
               target=(s,), out=(t,))
    shift = _box("where", _c(1.0), zero, target=(t, s), index=Cmp("==", IBin("+", Idx(s), IInt(1)), Idx(t)))
    before = _box("contract", shift, _box("rename", y, target=(t,), out=(s,)), target=(s,))
    return _mul(lam, before), lam


def _normalise(box: Box, y: Var, g: Expr) -> tuple[Expr | None, ...]:
    (x,) = box.args
    axes = box.target
    along = _box("sum", _mul(g, y), target=axes)
    if box.op == "softmax":
        return (_mul(y, _sub(g, along)),)
    scale = _box("sqrt", _box("sum", _box("square", x), target=axes))
    if box.op == "rmsnorm":
        along = _div(along, _count(axes))
        scale = _box("sqrt", _div(_box("sum", _box("square", x), target=axes), _count(axes)))
    return (_div(_sub(g, _mul(y, along)), scale),)


def _contract(box: Box, y: Var, g: Expr) -> tuple[Expr | None, ...]:
    grads: list[Expr | None] = []
    for k, arg in enumerate(box.args):
        others = box.args[:k] + box.args[k + 1:]
        operands = (g, *others)
        everything = tuple(dict.fromkeys(a for o in operands for a in o.axes))
        target = tuple(a for a in everything if a not in arg.axes)
        grads.append(g if not others and not target else _box("contract", *operands, target=target))
    return tuple(grads)


def _where(box: Box, y: Var, g: Expr) -> tuple[Expr | None, ...]:
    zero = _c(0.0)
    return (_box("where", g, zero, target=box.target, index=box.index),  # type: ignore[arg-type]
            _box("where", zero, g, target=box.target, index=box.index))  # type: ignore[arg-type]


def _select(box: Box, y: Var, g: Expr) -> tuple[Expr | None, ...]:
    mask, zero = box.args[0], _c(0.0)
    return None, _box("select", mask, g, zero), _box("select", mask, zero, g)


def _gather(box: Box, y: Var, g: Expr) -> tuple[Expr | None, ...]:
    """The table's cotangent: each position's cotangent added where it was read,
    Σ over the positions' own axes of onehot[n](clamp(I)) · g (a scatter-add)."""
    table, at = box.args
    (n,) = box.target
    last = _box("sub", Size(n), _c(1.0))
    clamped = _box("maximum", _box("minimum", at, last), _c(0.0))
    hit = _box("onehot", clamped, target=(n,))
    target = tuple(a for a in dict.fromkeys(hit.axes + g.axes) if a not in table.axes)
    return _box("contract", hit, g, target=target), None


def _reshape(box: Box, y: Var, g: Expr) -> tuple[Expr | None, ...]:
    if box.op == "transpose":
        return (g,)
    if box.op == "rename":
        (new,) = box.out
        return (_box("rename", g, target=(new,), out=box.target) if new in g.axes else g,)
    inverse = "join" if box.op == "split" else "split"
    return (_box(inverse, _expand(g, box.out), target=box.out, out=box.target),)


def _constant(box: Box, y: Var, g: Expr) -> tuple[Expr | None, ...]:
    return tuple(None for _ in box.args)


#: the kinds of boxes whose operands broadcast to the value's axes (elementwise): ``_unbroadcast``
_ELEMENTWISE = frozenset({"unary", "binary", "compare", "where", "select"})

_RULES: dict[str, Rule] = {
    "unary": _unary, "binary": _binary, "reduce": _reduce, "normalise": _normalise, "scan": _scan,
    "contract": _contract, "where": _where, "split": _reshape, "join": _reshape, "rename": _reshape,
    "transpose": _reshape, "index": _constant, "onehot": _constant, "compare": _constant, "select": _select,
    "gather": _gather, "topk": _constant,  # a selection is piecewise constant: no gradient, as in every framework
}


# ---- forward rewrites the rules rely on ---------------------------------------------------------------


class _Names:
    """Fresh binding and axis names: ``base``, else ``base_2``, ``base_3``, ..."""

    def __init__(self, taken: set[str]):
        self.taken = taken

    def fresh(self, base: str) -> str:
        return fresh_name(base, self.taken)


def _ncontract(box: Box) -> Expr:
    """ncontract[T; a1, a2, b](S, V) = contract[T](W, V) with W its weights, written with the
    normalisation box they are where one is (softmax, l2norm, rmsnorm: the same values,
    masked and all-zero rows included), else a1(S) / b(Σ_T a2(S))."""
    s, v = box.args
    axes = box.target
    named = {("exp", "exp", "id"): "softmax", ("id", "square", "sqrt"): "l2norm", ("id", "square", "rms"): "rmsnorm"}
    if box.params in named:
        weights: Expr = _box(named[box.params], s, target=axes)
    else:
        a1, a2, b = box.params
        top = s if a1 == "id" else _box(a1, s)
        z: Expr = _box("sum", s if a2 == "id" else _box(a2, s), target=axes)
        bottom = {"id": lambda: z, "sqrt": lambda: _box("sqrt", z),
                  "rms": lambda: _box("sqrt", _div(z, _count(axes)))}[b]()
        weights = _div(top, bottom)
    return _box("contract", weights, v, target=axes)


def _others(box: Box, names: _Names, axes: dict[str, Axis]) -> Expr:
    """prod[T](x) and, for its gradient, Π_{j ≠ i} x_j at every position i: x renamed to fresh
    axes T', set to 1 on the diagonal T == T', multiplied over T'.  Exact at zeros (where
    prod / x is not), at a cost quadratic in |T|."""
    (x,) = box.args
    copy: Expr = x
    pred: Pred | None = None
    primed: list[str] = []
    for a in box.target:
        new = names.fresh(a)
        axes[new] = Axis(new, axes[a].size if a in axes else None)
        primed.append(new)
        copy = _box("rename", copy, target=(a,), out=(new,))
        same = Cmp("==", Idx(a), Idx(new))
        pred = same if pred is None else Logic("and", pred, same)
    assert pred is not None
    diagonal = _box("where", _c(1.0), copy, target=(*box.target, *primed), index=pred)
    return _box("prod", diagonal, target=tuple(primed))


# ---- the transform -----------------------------------------------------------------------------------------


def cotangent_names(diagram: Diagram) -> tuple[str, ...]:
    """The names of the cotangent inputs ``vjp(diagram)`` adds, one per output."""
    names = _Names({p.name for p in diagram.inputs} | {n for let in diagram.body for n in let.names})
    single = len(diagram.outputs) == 1
    return tuple(names.fresh(f"d{out.name}" if isinstance(out, Var) and out.name not in
                             {p.name for p in diagram.inputs} else "d_out" if single else f"d_out{i}")
                 for i, out in enumerate(diagram.outputs))


def exp_normalised(diagram: Diagram) -> tuple[tuple[Expr, Axes], ...]:
    """The exp-normalised reductions of the (inlined) diagram, each once, as (argument, axes):
    ``softmax[T](S)`` and ``ncontract[T; exp, exp, id](S, V)`` give (S, T).  Their row statistic
    ``logsumexp[T](S)`` is what a forward saves for ``vjp(..., statistics=...)``."""
    found: dict[tuple[Expr, Axes], None] = {}
    for expr in [*(let.expr for let in diagram.body), *diagram.outputs]:
        for node in walk(expr):
            if isinstance(node, Box) and (node.op == "softmax" or (node.op == "ncontract"
                                          and node.params == ("exp", "exp", "id"))):
                found[(node.args[0], node.target)] = None
    return tuple(found)


def vjp(diagram: Diagram, *, saved: tuple[str, ...] = (),
        statistics: Mapping[str, tuple[Expr, Axes]] | None = None) -> Diagram:
    """The vector-Jacobian product of ``diagram`` as the diagram ``NAME_vjp`` (module docstring).

    With ``saved`` and ``statistics``, the VJP reads values the forward saved instead of
    recomputing them (FlashAttention-2's backward), as extra inputs after the cotangents:
    ``saved`` names bindings of the inlined diagram, read as inputs of their names;
    ``statistics`` maps an input name to an exp-normalisation (S, T) of ``exp_normalised``,
    whose row statistic ``logsumexp[T](S)`` the input holds.  Each such ``softmax[T](S)`` is
    then ``exp(S - L)`` (no second softmax), and its VJP ``P·(g - D)`` takes ``D = Σ_T g·P``
    as ``Σ dO·O`` where P's one reader is a saved ``O = contract(P, V)`` summing P over T
    (``_row_term``); a saved ``logsumexp`` y's VJP reads ``exp(x - y)``.  Each such exp(x - L) is
    guarded, exp(x - max(L, -FLOAT_MAX)) (``_weights``), so that a row every entry of which is masked
    (L = -inf) gives 0, not NaN.  The values are the same in exact arithmetic
    (``certify.prove.prove_join`` proves a join of them)."""
    flat = inlined(diagram)
    axes = {a.name: a for a in flat.axes}
    seeds = cotangent_names(diagram)
    stats = dict(statistics or {})
    by_row = {row: Var(name, _box("logsumexp", row[0], target=row[1]).axes) for name, row in stats.items()}
    names = _Names({p.name for p in flat.inputs} | {n for let in flat.body for n in let.names} | set(seeds)
                   | set(axes) | set(stats))
    lets: list[Let] = []
    others: dict[str, Expr] = {}  # a prod binding's Π-of-the-others companion
    normalised: dict[str, tuple[Expr, Axes]] = {}  # a softmax read as exp(S - L): its bound argument and axes

    def atom(expr: Expr, name: str | None = None, companion: bool = False) -> Expr:
        """The expression with every box bound to a name; a box itself becomes its Var (a
        ``prod`` also binds its Π-of-the-others, unless it is one: ``companion``)."""
        if not isinstance(expr, Box):
            return expr
        if expr.op == "ncontract":
            return atom(_ncontract(expr), name)
        if expr.op == "softmax" and (expr.args[0], expr.target) in by_row:
            arg = atom(expr.args[0])
            bound = name or names.fresh("t")
            normalised[bound] = (arg, expr.target)
            lets.append(Let((bound,), _weights(arg, by_row[(expr.args[0], expr.target)])))
            return Var(bound, lets[-1].expr.axes)
        box = typed_box(expr.op, tuple(atom(a) for a in expr.args), expr.target, expr.out, expr.params, expr.index)
        bound = name or names.fresh("t")
        if box.op == "prod" and not companion:
            others[bound] = atom(_others(box, names, axes), companion=True)
        lets.append(Let((bound,), box))
        return Var(bound, box.axes)

    for let in flat.body:
        value = atom(let.expr, let.names[0])
        if not isinstance(value, Var) or value.name != let.names[0]:
            lets.append(Let(let.names, value))
    outputs = [atom(o) for o in flat.outputs]

    cotangents: dict[str, list[Expr]] = {}
    for out, t, seed in zip(outputs, diagram.out_types, seeds, strict=True):
        if isinstance(out, Var):
            cotangents.setdefault(out.name, []).append(Var(seed, t))
    backward: list[Let] = []
    totals: dict[str, Expr | None] = {}

    def total(name: str) -> Expr | None:
        if name in totals:
            return totals[name]
        parts = cotangents.get(name)
        if not parts:
            return None
        value = parts[0]
        for part in parts[1:]:
            value = _add(value, part)
        if not isinstance(value, Var):
            bound = names.fresh(f"d{name}")
            backward.append(Let((bound,), value))
            value = Var(bound, value.axes)
        totals[name] = value
        return value

    for let in reversed(lets):
        (name,) = let.names
        g = total(name)
        if g is None:
            continue
        expr = let.expr
        if not isinstance(expr, Box):
            grads: tuple[Expr | None, ...] = (g,)
            args: tuple[Expr, ...] = (expr,)
        elif name in normalised:
            arg, target = normalised[name]
            y = Var(name, expr.axes)
            row = _row_term(name, target, lets, outputs, saved, totals) or _box("sum", _mul(g, y), target=target)
            grads, args = (_mul(y, _sub(g, row)),), (arg,)
        elif expr.op == "logsumexp" and name in saved:
            (x,) = expr.args
            grads, args = (_mul(g, _weights(x, Var(name, expr.axes))),), expr.args
        elif expr.op == "prod":
            grads, args = (_mul(g, others[name]),), expr.args
        elif expr.op == "linrec":
            grads, args = _linrec(expr, Var(name, expr.axes), g, names, axes), expr.args
        else:
            grads, args = _RULES[ops.OPS[expr.op].kind](expr, Var(name, expr.axes), g), expr.args
        # the rules of boxes that broadcast their operands to their value give cotangents on the value's axes
        broadcast = expr.axes if isinstance(expr, Box) and ops.OPS[expr.op].kind in _ELEMENTWISE else ()
        for arg, grad in zip(args, grads, strict=True):
            if grad is not None and isinstance(arg, Var):
                cotangents.setdefault(arg.name, []).append(_unbroadcast(grad, arg.axes, broadcast))

    results: list[Expr] = []
    for param in flat.inputs:
        g = total(param.name)
        value = _expand(g if g is not None else _c(0.0), param.axes)
        results.append(value if value.axes == param.axes else _box("transpose", value, target=param.axes))
    kept = set(saved)
    body = live([let for let in lets if let.names[0] not in kept] + backward, results)
    read = {n.name for let in body for n in walk(let.expr) if isinstance(n, Var)} | \
        {n.name for r in results for n in walk(r) if isinstance(n, Var)}
    types = {let.names[0]: let.expr.axes for let in lets}
    inputs = flat.inputs + tuple(Param(s, t) for s, t in zip(seeds, diagram.out_types, strict=True)) + tuple(
        Param(n, types[n]) for n in saved if n in read and n in types) + tuple(
        Param(n, by_row[row].axes) for n, row in stats.items() if n in read)
    used = axes_in_order(inputs, [*(let.expr for let in body), *results])  # as elaboration orders them
    return Diagram(f"{diagram.name}_vjp", inputs, body, tuple(results), tuple(p.axes for p in flat.inputs),
                   tuple(axes[name] for name in used if name in axes))


def vjp_module(diagram: Diagram) -> Module:
    """A module holding ``vjp(diagram)`` and the axes it uses: printed, it parses and
    elaborates to the same diagram (the VJP calls no diagram, so it needs no ``use``).  A
    diagram without inputs is refused (``NapkinError``): its VJP would have no outputs, and
    a diagram returns at least one."""
    if not diagram.inputs:
        raise NapkinError(error("grad.no_inputs", diagram.span, diagram=diagram.name))
    result = vjp(diagram)
    return Module(f"{result.name}.ncd", (), result.axes, (result,))


def _row_term(name: str, target: Axes, lets: list[Let], outputs: list[Expr], saved: tuple[str, ...],
              totals: Mapping[str, Expr | None]) -> Expr | None:
    """Softmax's VJP term D = Σ_T g·P for P (``name``, normalised over ``target``) as Σ dO·O, or
    None: where P's one reader is a saved ``O = contract[C](P, V)`` with C ∩ axes(P) = T, the
    cotangent g of P is Σ dO·V and Σ_T g·P = Σ dO·Σ_C P·V = Σ_{axes(O) - axes(P)} dO·O, a
    reduction of the forward's output rather than of a q×x array."""
    readers = [let for let in lets if any(isinstance(n, Var) and n.name == name for n in walk(let.expr))]
    if len(readers) != 1 or any(isinstance(n, Var) and n.name == name for o in outputs for n in walk(o)):
        return None
    (reader,) = readers
    box, out = reader.expr, reader.names[0]
    if not isinstance(box, Box) or box.op != "contract" or len(box.args) != 2 or out not in saved:
        return None
    p_axes = next(a.axes for a in box.args if isinstance(a, Var) and a.name == name)
    if sum(isinstance(a, Var) and a.name == name for a in box.args) != 1 or \
            set(box.target) & set(p_axes) != set(target):
        return None
    d_out = totals.get(out)
    if d_out is None:
        return None
    rows = tuple(a for a in p_axes if a not in target)
    summed = tuple(a for a in box.axes if a not in rows)
    return _box("contract", d_out, Var(out, box.axes), target=summed)


def live(lets: list[Let], outputs: list[Expr]) -> tuple[Let, ...]:
    """The bindings the outputs read, in order."""
    needed = {n.name for o in outputs for n in walk(o) if isinstance(n, Var)}
    kept: list[Let] = []
    for let in reversed(lets):
        if needed & set(let.names):
            kept.append(let)
            needed |= {n.name for n in walk(let.expr) if isinstance(n, Var)}
    return tuple(reversed(kept))
