"""Streaming accumulators as IR terms (paper R4-R7; 2505.09326 Def. 1, Lemma 2).

A stream partition walks a consumed axis in chunks.  The box that consumes it is
replaced by an accumulator: ``lift`` computes the partial state of one chunk, ``combine``
merges two states, ``identity`` is the state of an empty chunk, and ``final`` turns the
state into the box's value.  The recomposition law B(F(x), y) = F(x ⊕ y) reads here as

    combine(lift(x), lift(y)) = lift(x ⊕ y)         (⊕: concatenation along the axis)
    combine(identity, s) = s                          final(lift(x)) = box(x)

and ``certify`` checks all three for every plan.  Because lift, combine and final are
ordinary ``Diagram`` terms, the numpy evaluator, the sympy certifier and the JAX/Pallas
lowering evaluate them with their own folds, and extra (woven) axes of the consuming
box flow through by name-broadcasting.

Floating point (evaluate.py's conventions): the stable forms shift exponentials by a
running maximum m.  A fully masked chunk has m = -inf, and exp(s - m) would be
exp(-inf + inf) = NaN, so with ``guard=True`` the shift is ``max(m, -FLOAT_MAX)``: for
any finite m it is m itself, and for m = -inf it is a finite number, so the chunk's
exponentials are exp(-inf) = 0 and its state is the identity.  Finalisers divide by
``max(z, TINY)`` (TINY the smallest normal float64): z is 0 only when every term is
masked, where the numerator is 0 too, giving the 0 that evaluate.py documents.  The
normalised state's normaliser b(z) can be 0 where its numerator is not (relu weights all 0,
a Σ of signed weights that cancels) or negative (an ``id`` normaliser), so its finaliser is
guarded by the normaliser's sign instead (``quotient``: 0 exactly where b(z) = 0).  Over
the reals the guards are the identity wherever the box is defined; ``certify`` checks the
unguarded forms symbolically (``guard=False``) and the guarded ones numerically.

Padding (ragged tiles): ``pad`` gives, per lift input, the value that fills the padded
positions of a ragged chunk so that the chunk's state is unchanged (0 for sums, -inf for
max and exponentials, +inf for min, 1 for products); ``None`` when no value works, in
which case the kernel refuses a padded stream through this box.

Absorption (skipped chunks): ``absorbing`` names the lift inputs each of which, holding
its padding value at every position of a chunk, makes that chunk's lift the identity
whatever finite values the other inputs hold.  Every factor of a contraction does (0·v =
0), but of the exponential and normalised states only the scores do: a chunk of zero
values still adds exp(s - m) (or a2(s)) to the normaliser.  Padding fills all inputs
together, so it needs no absorbing input; skipping a chunk (``masks.stream_masks``) fills
none, so it needs one.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from napkin_cat import ops
from napkin_cat.evaluate import FLOAT64, Algebra, Named, evaluate_named
from napkin_cat.ops import typed_box
from napkin_cat.terms import Axes, Axis, Box, Const, Diagram, Expr, Let, Param, Size, Var

__all__ = ["DEGREE", "FLOAT_MAX", "NORMALISER_DEGREE", "SCALE_RANGE", "TINY", "AccumulatorPlan", "accumulators_for",
           "chunk", "float_safe", "kernel_plan", "padded", "plan", "scale", "scale_operands", "stream_fold"]

FLOAT_MAX = sys.float_info.max
TINY = sys.float_info.min

#: the degree p of the positively homogeneous weights, a(c·s) = c^p·a(s) for c > 0, and of the
#: normalisers b: where a1's degree is a2's times b's, a1(s)/b(Σ a2(s)) is the same at s/c
DEGREE = {"id": 1.0, "neg": 1.0, "abs": 1.0, "relu": 1.0, "square": 2.0, "sign": 0.0, "sqrt": 0.5,
          "rsqrt": -0.5, "recip": -1.0}
NORMALISER_DEGREE = {"id": 1.0, "sqrt": 0.5, "rms": 0.5}
#: c^p as a unary op (None: c^0 = 1, nothing to multiply), for the degrees a rescaled state takes
_POWER: dict[float, str | None] = {0.0: None, 0.5: "sqrt", 1.0: "id", 2.0: "square"}
#: the range of a float-safe state's scale k (``scale``): 1/k a normal f32
SCALE_RANGE = (2.0**-126, 2.0**126)


@dataclass(frozen=True)
class AccumulatorPlan:
    """How one consuming box streams one axis.

    ``lift`` takes the box's operands restricted to one chunk along ``axis`` (operands
    that lack the axis are passed whole) and returns the chunk's state; ``combine`` takes
    two states (the first's variables, then the second's) and returns one; ``final``
    takes a state and returns the box's value, using ``Size`` of the FULL axis where it
    needs one (mean, rms).  ``pad`` is one fill value per lift input, or None;
    ``absorbing`` the positions of the inputs that absorb a chunk (module docstring; empty
    without ``pad``).  ``update``, where there is one, folds a chunk into a state in one
    step: it takes a state, then the lift's inputs, and equals combine(state, lift(chunk))
    (a certified law); the stable states' update shifts the chunk by the new running
    maximum at once, one correction per chunk instead of one per state (FlashAttention-2).
    ``degrees``, empty but for a float-safe plan (``float_safe``), is the map from its state
    (m, s1, s2, ...) to the proved plan's: entry j is k^degrees[j]·s_(j+1) at the scale
    k = ``scale(m, 1)`` (``certify.represent`` proves the laws commute with it).
    """

    name: str
    box: Box
    axis: str
    state: tuple[tuple[str, Axes], ...]
    lift: Diagram
    combine: Diagram
    identity: tuple[float, ...]
    final: Diagram
    pad: tuple[float, ...] | None
    absorbing: tuple[int, ...]
    update: Diagram | None = None
    degrees: tuple[float, ...] = ()


def float_safe(proved: AccumulatorPlan) -> AccumulatorPlan:
    """The plan a kernel runs for ``proved``: the proved plan itself, except for the normalised
    state (o, z) = (Σ a1(s)·v, Σ a2(s)) of weights invariant under scaling the scores (``DEGREE``:
    l2 and rms normalisation), which f32 cannot hold as written (Σ s² underflows at scores near
    1e-21 and overflows near 1e19).  That state is carried as (m, o', z'), m the running max|s|,
    with o = k^p1·o' and z = k^p2·z' for the scale k = m where 0 < m < inf (clamped into
    [2^-126, 2^126]), else 1 (``scale``): the proved state in another representation.
    A chunk is summed on s·(1/k), so the chunk holding the maximum adds a2(±1) to z'; states of
    scales k1, k2 merge as online softmax's running max does, o' = (k1/k)^p1·o1' + (k2/k)^p1·o2'
    at the merged max's k (z' likewise, p2); the finaliser is the proved one on (o', z'), as
    o/b(z) = o'/b(z') at every k > 0 (b has degree p1/p2).  A state of m = 0 (every score ±0,
    so o' = o and z' = z = 0, up to a NaN value) merges at factor 1, and one of ±inf or NaN
    scores is summed as written (k = 1), so the evaluator's inf and NaN come out as the proved
    plan's.  Per score the kernel adds |s|, its running max and one multiply; per state entry
    and chunk, one rescaling multiply (as online softmax's; the cost model prices them).  Its
    laws are the proved ones under the map (o, z) = (k^p1·o', k^p2·z') (``degrees`` (p1, p2)):
    ``certify.represent`` proves that identity, lift, combine, update and final commute with it
    for every k > 0, per class of m, and the accumulator's certificate says so;
    tests/test_accumulators.py also folds it in float64 and float32."""
    if proved.name != "normalised":
        return proved
    a1, a2, b = proved.box.params
    if a1 not in DEGREE or a2 not in DEGREE or DEGREE[a1] != DEGREE[a2] * NORMALISER_DEGREE[b] \
            or DEGREE[a1] not in _POWER or DEGREE[a2] not in _POWER or DEGREE[a2] == 0.0:
        return proved
    return _Builder(proved.box, proved.axis, True).scaled(proved)


def kernel_plan(box: Box, axis: str, name: str | None = None) -> AccumulatorPlan:
    """The plan the kernels run for accumulator ``name`` of ``box`` (``float_safe`` of ``plan``)."""
    return float_safe(plan(box, axis, name))


def scale(m: Expr, fallback: Expr) -> Expr:
    """m clamped into ``SCALE_RANGE`` where 0 < m < inf, else ``fallback``: a scale whose
    reciprocal is a normal f32 (no inf past 1/2.9e-39, no subnormal a GPU flushes to 0)."""
    usable = _bin("mul", _bin("gt", m, Const(0.0)), _bin("lt", m, Const(math.inf)))
    clamped = _bin("minimum", _bin("maximum", m, Const(SCALE_RANGE[0])), Const(SCALE_RANGE[1]))
    return typed_box("select", (usable, clamped, fallback))


def scale_operands(expr: Expr) -> tuple[Expr, Expr] | None:
    """(m, fallback) where ``expr`` is ``scale(m, fallback)``, else None."""
    if not (isinstance(expr, Box) and expr.op == "select" and isinstance(expr.args[1], Box) and expr.args[1].args
            and isinstance(expr.args[1].args[0], Box) and expr.args[1].args[0].args):
        return None
    m, fallback = expr.args[1].args[0].args[0], expr.args[2]
    return (m, fallback) if expr == scale(m, fallback) else None


def accumulators_for(box: Box, axis: str) -> tuple[str, ...]:
    """The accumulators that can stream ``axis`` through ``box`` (empty if it does not consume it)."""
    if not isinstance(box, Box) or not ops.is_consuming(box.op) or axis not in box.target:
        return ()
    return ops.accumulators_for(box.op, box.params)


def plan(box: Box, axis: str, name: str | None = None, guard: bool = True) -> AccumulatorPlan:
    """The accumulator ``name`` (default: the first admissible) for ``box`` streaming ``axis``.

    Raises ``ValueError`` if the box does not consume the axis or the accumulator is
    not admissible for it (the kernel reports these to users; this is the library call).
    """
    admissible = accumulators_for(box, axis)
    if not admissible:
        raise ValueError(f"{box.op}[{' '.join(box.target)}] does not consume axis `{axis}`")
    chosen = name or admissible[0]
    if chosen not in admissible:
        raise ValueError(f"accumulator `{chosen}` cannot stream {box.op}; admissible: {', '.join(admissible)}")
    return _Builder(box, axis, guard).build(chosen)


# ---- construction helpers ---------------------------------------------------------------


def _axis_table(*types: Axes) -> tuple[Axis, ...]:
    return tuple(Axis(a) for a in dict.fromkeys(a for t in types for a in t))


def _unary(op: str, x: Expr) -> Expr:
    return x if op == "id" else typed_box(op, (x,))


def _bin(op: str, a: Expr, b: Expr) -> Expr:
    return typed_box(op, (a, b))


class _Builder:
    """Builds lift/combine/final for one box; every helper returns typed terms."""

    def __init__(self, box: Box, axis: str, guard: bool):
        self.box = box
        self.axis = axis
        self.guard = guard
        self.operands = tuple(Param(f"X{i}", a.axes) for i, a in enumerate(box.args))
        self.x = tuple(Var(p.name, p.axes) for p in self.operands)

    def diagram(self, kind: str, inputs: tuple[Param, ...], body: list[tuple[str, Expr]],
                outputs: tuple[Expr, ...]) -> Diagram:
        lets = tuple(Let((n,), e) for n, e in body)
        types = tuple(o.axes for o in outputs)
        axes = _axis_table(*(p.axes for p in inputs), *types, *(e.axes for _, e in body), self.box.target)
        return Diagram(kind, inputs, lets, outputs, types, axes)  # lowering prefixes generated names with it

    def shift(self, m: Expr) -> Expr:
        return _bin("maximum", m, Const(-FLOAT_MAX)) if self.guard else m

    def safe(self, z: Expr) -> Expr:
        return _bin("maximum", z, Const(TINY)) if self.guard else z

    def quotient(self, o: Expr, denom: Expr) -> Expr:
        """o / b(z), 0 where the normaliser is 0 (the evaluator's convention, whatever o is:
        relu weights all 0 leave o = Σ s·v non-zero).  Guarded, o·|sign d| / (d + 1 − |sign d|)
        for d = b(z): exactly o / d where d ≠ 0 and 0 where d = 0, for an ``id`` normaliser that
        can be negative (Σ log, Σ of signed weights) as for a square root."""
        if not self.guard:
            return _bin("div", o, denom)
        nonzero = _unary("abs", _unary("sign", denom))
        return _bin("div", _bin("mul", o, nonzero), _bin("add", denom, _bin("sub", Const(1.0), nonzero)))

    def count(self) -> Expr:
        """The number of positions the box consumes, over the FULL axes."""
        out: Expr = Size(self.box.target[0])
        for a in self.box.target[1:]:
            out = _bin("mul", out, Size(a))
        return out

    def states(self, state: tuple[tuple[str, Axes], ...], suffix: str) -> tuple[Param, ...]:
        return tuple(Param(f"{n}{suffix}", t) for n, t in state)

    def build(self, name: str) -> AccumulatorPlan:
        box = self.box
        target = box.target
        if name == "prod":
            return self.product()
        if name in ("sum", "max", "min"):
            return self.monoid(name)
        if name == "logsumexp":
            (x,) = self.x
            m = typed_box("max", (x,), target)
            mv = Var("m", m.axes)
            l_ = typed_box("sum", (_unary("exp", _bin("sub", x, self.shift(mv))),), target)
            return self.stable(name, [("m", m), ("l", l_)], pad=(-math.inf,),
                               final=lambda st: _bin("add", st[0], _unary("log", st[1])))
        a1, a2, b = box.params
        s, v = self.x
        if name == "online_softmax":
            m = typed_box("max", (s,), target)
            mv = Var("m", m.axes)
            p = _unary("exp", _bin("sub", s, self.shift(mv)))
            return self.stable(name, [("m", m), ("l", typed_box("sum", (p,), target)),
                                      ("o", typed_box("contract", (p, v), target))],
                               pad=(-math.inf, 0.0), final=lambda st: self.stable_final(b, st))
        assert name == "normalised", name
        o = typed_box("contract", (_unary(a1, s), v), target)
        z = typed_box("sum", (_unary(a2, s),), target)
        state = (("o", o.axes), ("z", z.axes))
        lift = self.diagram("lift", self.operands, [("o", o), ("z", z)], (Var("o", o.axes), Var("z", z.axes)))
        one, two = self.states(state, "1"), self.states(state, "2")
        merged = tuple(_bin("add", Var(p.name, p.axes), Var(q.name, q.axes)) for p, q in zip(one, two, strict=True))
        combine = self.diagram("combine", one + two, [], merged)
        zs = Var("z", z.axes)
        denom = {"id": zs, "sqrt": _unary("sqrt", zs),
                 "rms": _unary("sqrt", _bin("div", zs, self.count()))}[b]
        final = self.diagram("final", self.states(state, ""), [], (self.quotient(Var("o", o.axes), denom),))
        fill = _pad_for(a1, a2)
        if fill is None:
            return AccumulatorPlan(name, box, self.axis, state, lift, combine, (0.0, 0.0), final, None, ())
        # scores at the fill make a1 and a2 zero; zero values leave a2(s) in z
        return AccumulatorPlan(name, box, self.axis, state, lift, combine, (0.0, 0.0), final, (fill, 0.0), (0,))

    def product(self) -> AccumulatorPlan:
        """prod: the state is the partial product p and a flag w = Π sign(x)·(1 + (x - x)), the
        product of the entries' signs where they are finite: ±1 where they hold no zero, the signed
        zero of their product where they hold one (IEEE multiplies signs exactly, -0 included), NaN
        where one is ±inf or NaN (x - x is NaN there); over the reals w = Π sign x.

        Guarded, the combine gives p1·p2 except where w1·w2 = 0, where it gives w1·w2, that signed
        zero: so a state holding a zero stays the signed zero whatever the other state's f32 product
        did (1.2e4 ^ 16 overflows to inf, inf · 0 NaN where the evaluator's product is 0; a chunk of
        1e-5 underflowing to 0 times one of 1e5 is 0·inf = NaN with no zero among its entries, so the
        signs of the p's are lost, red team rtmerge2), while a ±inf entry meeting a zero is still
        NaN (w is NaN, so the plain product inf · 0), as numpy's product.  Over the reals (unguarded)
        it is p1·p2: the select's branches agree wherever w1·w2 = 0 (then p1 or p2 is 0)."""
        box = self.box
        (x,) = self.x
        part = typed_box("prod", (x,), box.target)
        flag = _bin("mul", _unary("sign", x), _bin("add", Const(1.0), _bin("sub", x, x)))
        w = typed_box("prod", (flag,), box.target)
        state = (("p", part.axes), ("w", w.axes))
        lift = self.diagram("lift", self.operands, [("p", part), ("w", w)],
                            (Var("p", part.axes), Var("w", w.axes)))
        one, two = self.states(state, "1"), self.states(state, "2")
        (p1, w1), (p2, w2) = ([Var(q.name, q.axes) for q in qs] for qs in (one, two))
        merged_w = _bin("mul", w1, w2)
        wv = Var("w", merged_w.axes)
        merged_p: Expr = _bin("mul", p1, p2)
        if self.guard:
            merged_p = typed_box("select", (_bin("eq", wv, Const(0.0)), wv, merged_p))
        combine = self.diagram("combine", one + two, [("w", merged_w)], (merged_p, wv))
        final = self.diagram("final", self.states(state, ""), [], (Var("p", part.axes),))
        # a padded position at 1 leaves p and w (sign(1)·(1 + 0) = 1): a chunk of ones lifts to the identity
        return AccumulatorPlan("prod", box, self.axis, state, lift, combine, (1.0, 1.0), final, (1.0,), (0,))

    def scaled(self, proved: AccumulatorPlan) -> AccumulatorPlan:
        """The normalised state as (m, o', z') (``float_safe``)."""
        a1, a2, _ = self.box.params
        target = self.box.target
        s, v = self.x
        powers = (_POWER[DEGREE[a1]], _POWER[DEGREE[a2]])

        def terms(m: Expr, body: list[tuple[str, Expr]], suffix: str = "") -> tuple[Var, Var]:
            """The chunk's Σ a1(s/k)·v and Σ a2(s/k) at k = safe(m), appended to ``body``."""
            body.append((f"k{suffix}", scale(m, Const(1.0))))
            k = Var(f"k{suffix}", m.axes)
            body.append((f"r{suffix}", _unary("recip", k)))
            scaled = _bin("mul", s, Var(f"r{suffix}", m.axes))
            body.append((f"t{suffix}", scaled))
            t = Var(f"t{suffix}", scaled.axes)
            o = typed_box("contract", (_unary(a1, t), v), target)
            z = typed_box("sum", (_unary(a2, t),), target)
            body += [(f"o{suffix}", o), (f"z{suffix}", z)]
            return Var(f"o{suffix}", o.axes), Var(f"z{suffix}", z.axes)

        def rescaled(c: Var, power: str | None, x: Expr) -> Expr:
            return x if power is None else _bin("mul", _unary(power, c), x)

        top = typed_box("max", (_unary("abs", s),), target)
        mv = Var("m", top.axes)
        lift_body: list[tuple[str, Expr]] = [("m", top)]
        o, z = terms(mv, lift_body)
        state = (("m", top.axes), ("o", o.axes), ("z", z.axes))
        lift = self.diagram("lift", self.operands, lift_body, (mv, o, z))
        one, two = self.states(state, "1"), self.states(state, "2")
        (m1, o1, z1), (m2, o2, z2) = ([Var(p.name, p.axes) for p in ps] for ps in (one, two))
        merged = _bin("maximum", m1, m2)
        body: list[tuple[str, Expr]] = [("m", merged), ("k", scale(mv, Const(1.0)))]
        k = Var("k", mv.axes)
        outs: list[Expr] = [mv]
        for i, mi in enumerate((m1, m2), 1):
            body.append((f"c{i}", _bin("div", scale(mi, k), k)))
        c1, c2 = Var("c1", mv.axes), Var("c2", mv.axes)
        for name, power, x1, x2 in (("o", powers[0], o1, o2), ("z", powers[1], z1, z2)):
            body.append((name, _bin("add", rescaled(c1, power, x1), rescaled(c2, power, x2))))
            outs.append(Var(name, x1.axes))
        combine = self.diagram("combine", one + two, body, tuple(outs))
        # update(state, chunk): the new running max at once, the state rescaled once per chunk
        body = [("top", top), ("m", _bin("maximum", m1, Var("top", top.axes)))]
        o_chunk, z_chunk = terms(mv, body, "_chunk")
        k = Var("k_chunk", mv.axes)
        body.append(("c", _bin("div", scale(m1, k), k)))
        c = Var("c", mv.axes)
        body += [("o", _bin("add", rescaled(c, powers[0], o1), o_chunk)),
                 ("z", _bin("add", rescaled(c, powers[1], z1), z_chunk))]
        update = self.diagram("update", one + self.operands, body, (mv, Var("o", o.axes), Var("z", z.axes)))
        final = replace(proved.final, inputs=(Param("m", top.axes), *proved.final.inputs))
        return replace(proved, state=state, lift=lift, combine=combine, identity=(0.0, 0.0, 0.0), final=final,
                       update=update, degrees=(DEGREE[a1], DEGREE[a2]))

    def monoid(self, name: str) -> AccumulatorPlan:
        """sum (sum, mean, contract), max, min: the state is the box's own partial value."""
        box = self.box
        if box.op == "mean":
            part: Expr = typed_box("sum", self.x, box.target)
        else:
            part = typed_box(box.op, self.x, box.target, params=box.params)
        state = (("s", part.axes),)
        lift = self.diagram("lift", self.operands, [("s", part)], (Var("s", part.axes),))
        merge = {"sum": "add", "max": "maximum", "min": "minimum"}[name]
        one, two = self.states(state, "1"), self.states(state, "2")
        combine = self.diagram("combine", one + two, [],
                               (_bin(merge, Var(one[0].name, part.axes), Var(two[0].name, part.axes)),))
        sv = Var("s", part.axes)
        value = _bin("div", sv, self.count()) if box.op == "mean" else sv
        final = self.diagram("final", self.states(state, ""), [], (value,))
        identity = {"sum": 0.0, "max": -math.inf, "min": math.inf}[name]
        fill = identity
        # a contraction is padded by zeroing every operand that carries the axis, and any one
        # zero factor already zeroes the product
        pad = tuple(fill for _ in self.x)
        return AccumulatorPlan(name, box, self.axis, state, lift, combine, (identity,), final, pad,
                               tuple(range(len(self.x))))

    def stable_final(self, b: str, st: list[Var]) -> Expr:
        """The online state's value, (m, l, o) with l and o relative to exp(m): o / l under an ``id``
        normaliser; under a square root exp(s)/sqrt(Σ exp(s)) = exp(s - m)·exp(m/2)/sqrt(l), so
        (o / sqrt(l))·exp(m/2), l divided by the count first for ``rms`` (no state reads exp(s)
        itself, which overflows float32 at s = 89 where the weights, of order exp(s/2), do not).
        exp(m/2) is applied as exp(m/4) twice, r·exp(m/4)·exp(m/4) for r = o / sqrt(l): exp(m/2)
        alone overflows f32 past m = 177 where the output, small values times it, need not; each
        product lies between r and the output, so it overflows only where the output does, up to
        m = 355, past which an output that f32 holds has r = 0 or subnormal.  Guarded, r where r = 0
        and exp(m/4) = inf (0·inf = NaN there, where the output is 0); only there, so that elsewhere
        jax.grad of the lowered final has the slope exp(m/2) at r = 0, not the select's 1.  The guard
        keeps l (l / n) from 0 under the root, not the root from 0: the slope of sqrt at 0 is inf."""
        m, l_, o = st
        if b == "id":
            return _bin("div", o, self.safe(l_))
        # the root of l guarded, not the root guarded: l is 0 (masked row) or at least 1/n, and sqrt's
        # slope at 0 is inf, which made jax.grad of the lowered final NaN at a masked row's scores
        r = _bin("div", o, _unary("sqrt", self.safe(l_ if b == "sqrt" else _bin("div", l_, self.count()))))
        quarter = _unary("exp", _bin("mul", self.shift(m), Const(0.25)))
        out = _bin("mul", _bin("mul", r, quarter), quarter)
        if not self.guard:
            return out
        lost = _bin("mul", _bin("eq", r, Const(0.0)), _bin("eq", quarter, Const(math.inf)))
        return typed_box("select", (lost, r, out))

    def stable(self, name: str, parts: list[tuple[str, Expr]], pad: tuple[float, ...],
               final: Callable[[list[Var]], Expr]) -> AccumulatorPlan:
        """States (m, l[, o]) with a running max m; l and o are relative to exp(m).

        combine: m = max(m1, m2); c_i = exp(m_i - shift(m)); l = c1 l1 + c2 l2; o likewise.
        """
        state = tuple((n, e.axes) for n, e in parts)
        lift = self.diagram("lift", self.operands, parts, tuple(Var(n, e.axes) for n, e in parts))
        one, two = self.states(state, "1"), self.states(state, "2")
        v1 = {p.name[:-1]: Var(p.name, p.axes) for p in one}
        v2 = {p.name[:-1]: Var(p.name, p.axes) for p in two}
        m = _bin("maximum", v1["m"], v2["m"])
        mv = Var("m", m.axes)
        c1 = _unary("exp", _bin("sub", v1["m"], self.shift(mv)))
        c2 = _unary("exp", _bin("sub", v2["m"], self.shift(mv)))
        body: list[tuple[str, Expr]] = [("m", m), ("c1", c1), ("c2", c2)]
        cv1, cv2 = Var("c1", c1.axes), Var("c2", c2.axes)
        outs: list[Expr] = [mv]
        for n, _ in parts[1:]:
            merged = _bin("add", _bin("mul", cv1, v1[n]), _bin("mul", cv2, v2[n]))
            body.append((n, merged))
            outs.append(Var(n, merged.axes))
        combine = self.diagram("combine", one + two, body, tuple(outs))
        finals = self.states(state, "")
        final_d = self.diagram("final", finals, [], (final([Var(p.name, p.axes) for p in finals]),))
        identity = (-math.inf,) + (0.0,) * (len(parts) - 1)
        # scores at -inf: m = -inf and every exp(s - shift(m)) is 0; values at 0 leave l
        return AccumulatorPlan(name, self.box, self.axis, state, lift, combine, identity, final_d, pad, (0,),
                               self.stable_update(parts, one))

    def stable_update(self, parts: list[tuple[str, Expr]], one: tuple[Param, ...]) -> Diagram:
        """update(m1, l1[, o1], chunk): m = max(m1, max of the chunk); the lift's terms, which
        shift by ``Var("m")``, now shift by the new maximum; c = exp(m1 - shift(m)) rescales the
        state once: l = c·l1 + Σ exp(s - shift(m)), o likewise."""
        v1 = {p.name[:-1]: Var(p.name, p.axes) for p in one}
        (_, chunk_max), rest = parts[0], parts[1:]
        m = _bin("maximum", v1["m"], chunk_max)
        mv = Var("m", m.axes)
        c = _unary("exp", _bin("sub", v1["m"], self.shift(mv)))
        cv = Var("c", c.axes)
        body: list[tuple[str, Expr]] = [("m", m), ("c", c)]
        outs: list[Expr] = [mv]
        for n, term in rest:
            body.append((f"{n}_chunk", term))
            merged = _bin("add", _bin("mul", cv, v1[n]), Var(f"{n}_chunk", term.axes))
            body.append((n, merged))
            outs.append(Var(n, merged.axes))
        return self.diagram("update", one + self.operands, body, tuple(outs))


#: the score values at which each activation is exactly 0 (in float64, -inf included)
_ZEROS: dict[str, frozenset[float]] = {
    "id": frozenset({0.0}), "square": frozenset({0.0}), "abs": frozenset({0.0}), "tanh": frozenset({0.0}),
    "relu": frozenset({0.0, -math.inf}), "silu": frozenset({0.0}), "gelu": frozenset({0.0}),
    "sigmoid": frozenset({-math.inf}), "exp": frozenset({-math.inf}),
}


def _pad_for(a1: str, a2: str) -> float | None:
    """A score value at which a1 and a2 are both 0, so padded positions add nothing."""
    common = _ZEROS.get(a1, frozenset()) & _ZEROS.get(a2, frozenset())
    return min(common) if common else None


def chunk(value: Named, axis: str, start: int, stop: int) -> Named:
    """Positions ``start:stop`` of ``value`` along ``axis`` (the whole value if it lacks the axis)."""
    if axis not in value.axes:
        return value
    index = [slice(None)] * len(value.axes)
    index[value.axes.index(axis)] = slice(start, stop)
    return Named(value.axes, value.data[tuple(index)])


def padded(value: Named, axis: str, length: int, fill: float) -> Named:
    """``value`` extended along ``axis`` to ``length`` positions with ``fill``."""
    if axis not in value.axes:
        return value
    position = value.axes.index(axis)
    missing = length - value.data.shape[position]
    if missing <= 0:
        return value
    shape = list(value.data.shape)
    shape[position] = missing
    extra = np.full(shape, fill, dtype=value.data.dtype)
    return Named(value.axes, np.concatenate([value.data, extra], axis=position))


def stream_fold(acc: AccumulatorPlan, operands: Sequence[Named], tile: int, sizes: Mapping[str, int],
                algebra: Algebra = FLOAT64, pad: bool = False) -> Named:
    """The box's value computed as a kernel would: identity, then lift and combine per chunk, then final.

    ``sizes`` are the full sizes (the final uses them); with ``pad`` a ragged last chunk is
    filled to ``tile`` positions with the plan's padding values.
    """
    n = sizes[acc.axis]
    state = tuple(Named((), algebra.asarray(v)) for v in acc.identity)
    for start in range(0, n, tile):
        parts = [chunk(x, acc.axis, start, min(start + tile, n)) for x in operands]
        if pad and start + tile > n:
            assert acc.pad is not None, "the kernel refuses padding without a padding law"
            parts = [padded(x, acc.axis, tile, fill) for x, fill in zip(parts, acc.pad, strict=True)]
        local = {**sizes, acc.axis: tile if pad else min(start + tile, n) - start}
        lifted = evaluate_named(acc.lift, parts, local, algebra)
        state = evaluate_named(acc.combine, state + lifted, dict(sizes), algebra)
    (value,) = evaluate_named(acc.final, state, dict(sizes), algebra)
    return value
