"""TRUSTED: the proof kernel.  Only this module constructs a ``Theorem``.

A ``Theorem`` states  source ≡ result  under its schedule, over the reals (or, once a
``dtype`` step is taken, within the recorded tolerances), and lists its trust basis.

Interface (each rule's inference rule is in its docstring; every refusal raises
``KernelError`` whose message starts with the rule's name and names the failed condition
and the box):

    refl(name, D)                        ⊢ D ≡ D
    unfold(thm)                          δ: inline every diagram used as a box
    trans(t1, t2)                        A ≡ B,  B ≡ C  ⊢  A ≡ C
    rewrite(thm, lemma, step, certified) instantiation of a certified lemma + congruence + trans
    group(thm, step)                     R3 group partition (tiling), R8 nesting, R9 divisibility
    stream(thm, step, accumulator)       R4 + R5 stream partition with certified accumulators
    place(thm, step)                     R2 placement (recolouring)
    quantise(thm, step)                  R10 dtype change: a marked approximation, never an equality
    typed_box(op, args, ...)             the typing rule of a primitive box (shared with rules)
    treatment(box, axis)                 weaves | consumes | mixes | absent (architecture §3.1)

The kernel imports only the IR, the op catalogue and diagnostics.  Certification is an
input: lemma names map to how they were certified, and ``accumulator(box, axis, name,
pad)`` answers whether (and how) an accumulator's laws were certified for that box.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import InitVar, dataclass, replace

from napkin_cat import ops
from napkin_cat.diagnostics import NapkinError, Span, error
from napkin_cat.terms import (
    LEVELS,
    Apply,
    Axes,
    Axis,
    Box,
    Const,
    Diagram,
    Expr,
    IndexExpr,
    LemmaDecl,
    Let,
    Partition,
    Place,
    Pred,
    Quantise,
    Rewrite,
    Schedule,
    Size,
    Step,
    Var,
    run_diagram,
    walk,
)

__all__ = [
    "DTYPE_ROUNDOFF",
    "Divides",
    "KernelError",
    "Theorem",
    "group",
    "place",
    "quantise",
    "refl",
    "rewrite",
    "stream",
    "trans",
    "treatment",
    "typed_box",
    "unfold",
]

_TOKEN = object()
_EMPTY = Schedule()

#: unit roundoff of each number format a ``dtype`` step may name
DTYPE_ROUNDOFF: dict[str, float] = {
    "f64": 2.0**-53, "f32": 2.0**-24, "tf32": 2.0**-11, "f16": 2.0**-11, "bf16": 2.0**-8,
    "fp8e4m3": 2.0**-4, "fp8e5m2": 2.0**-3,
}

#: certify's answer for an accumulator: how it was certified, or None if its laws fail
AccumulatorOracle = Callable[[Box, str, str, bool], "str | None"]


class KernelError(NapkinError):
    """A refused proof step: ``rule``, the failed ``condition``, where it was written."""

    def __init__(self, rule: str, condition: str, span: Span | None = None):
        self.rule = rule
        self.condition = condition
        super().__init__(error("proof.refused", span, rule=rule, reason=condition))


@dataclass(frozen=True)
class Divides:
    """A side condition ``divisor | dividend`` (a tile divides its axis or outer tile)."""

    divisor: str | int
    dividend: str | int

    def __str__(self) -> str:
        return f"{self.divisor} | {self.dividend}"


@dataclass(frozen=True)
class Theorem:
    """⊢ source ≡ result under ``schedule``; constructed only by this module.

    ``accumulators`` lists (axis, consuming box, accumulator) for every stream step;
    ``approximations`` the dtype steps (the theorem is exact iff it has none).
    """

    name: str
    source: Diagram
    result: Diagram
    schedule: Schedule = _EMPTY
    steps: tuple[Step, ...] = ()
    trust: tuple[str, ...] = ()
    constraints: tuple[Divides, ...] = ()
    accumulators: tuple[tuple[str, Box, str], ...] = ()
    approximations: tuple[Quantise, ...] = ()
    token: InitVar[object] = None

    def __post_init__(self, token: object) -> None:
        if token is not _TOKEN:
            raise TypeError("Theorem: only napkin_cat.kernel constructs theorems; use the kernel's rules")

    @property
    def exact(self) -> bool:
        return not self.approximations

    def accumulator_of(self, box: Box, axis: str) -> str | None:
        """The accumulator chosen for ``box`` streaming ``axis``, if any."""
        for a, b, name in self.accumulators:
            if a == axis and b == box:
                return name
        return None

    def _repr_svg_(self) -> str:  # notebook display: the picture, not a kernel concern
        from napkin_cat.draw import draw_svg  # untrusted, imported only when displayed

        return draw_svg(self)


def _extend(thm: Theorem, step: Step | None, trust: tuple[str, ...], **changes: object) -> Theorem:
    fields = {f: getattr(thm, f) for f in ("name", "source", "result", "schedule", "steps", "trust", "constraints",
                                           "accumulators", "approximations")}
    fields.update(changes)
    fields["trust"] = tuple(dict.fromkeys(thm.trust + trust))
    if step is not None:
        fields["steps"] = (*thm.steps, step)
    return Theorem(**fields, token=_TOKEN)  # type: ignore[arg-type,unused-ignore]


# ---- typing of boxes (the same rules as the elaborator) -------------------------------------


def typed_box(op: str, args: tuple[Expr, ...], target: Axes = (), out: Axes = (), params: tuple[str, ...] = (),
              index: Pred | IndexExpr | None = None, span: Span | None = None) -> Box:
    """A primitive box with its result type from ``ops.result_axes`` (the one typing rule)."""
    axes = ops.result_axes(op, tuple(a.axes for a in args), target, out)
    return Box(op, args, axes, target, out, params, index, span)


def treatment(box: Box, axis: str) -> str:
    """How a box treats an axis (architecture §3.1): weaves | consumes | mixes | absent.

    Index-dependent boxes (where, index, onehot) and transpose keep positions apart, so
    they weave their named axes (a tile passes its offset); split/join/rename mix.
    """
    if axis not in box.axes and axis not in box.target and all(axis not in a.axes for a in box.args):
        return "absent"
    kind = ops.OPS[box.op].kind
    if axis in box.out:
        return "mixes"
    if axis not in box.target or kind in ("where", "index", "onehot", "transpose"):
        return "weaves"
    return "consumes" if ops.is_consuming(box.op) else "mixes"


def _label(box: Box, let: Let | None) -> str:
    inside = f"[{' '.join(box.target)}{'; ' + ', '.join(box.params) if box.params else ''}]" if box.target else ""
    where = f"binding `{let.names[0]}`" if let is not None else "the returned expression"
    return f"`{box.op}{inside}` ({where})"


def _boxes(diagram: Diagram) -> list[tuple[Let | None, Box]]:
    out: list[tuple[Let | None, Box]] = []
    for let in diagram.body:
        out.extend((let, n) for n in walk(let.expr) if isinstance(n, Box))
    for o in diagram.outputs:
        out.extend((None, n) for n in walk(o) if isinstance(n, Box))
    return out


# ---- reflexivity, unfolding, transitivity ------------------------------------------------


def refl(name: str, diagram: Diagram) -> Theorem:
    """Reflexivity:   ─────────  (no side condition)
                       ⊢ D ≡ D"""
    return Theorem(name, diagram, diagram, trust=("refl",), token=_TOKEN)


def unfold(thm: Theorem) -> Theorem:
    """δ-unfolding:   ⊢ A ≡ D[f(X)]    f(P) = body      ─────  ⊢ A ≡ D[body[P := X]]

    A diagram used as a box means its body run on the arguments, woven over the extra
    axes by name (terms.Apply), so inlining it, with every inner box retyped to carry the
    woven axes, is an equality.  Inner names are kept unless they clash.
    """
    if not any(isinstance(n, Apply) for let in thm.result.body for n in walk(let.expr)) and \
            not any(isinstance(n, Apply) for o in thm.result.outputs for n in walk(o)):
        return thm
    _no_schedule(thm, "unfold", None)
    taken = {p.name for p in thm.result.inputs} | {n for let in thm.result.body for n in let.names}
    lets: list[Let] = []

    def fresh(name: str) -> str:
        candidate, k = name, 1
        while candidate in taken:
            k += 1
            candidate = f"{name}_{k}"
        taken.add(candidate)
        return candidate

    def inline(expr: Expr, env: dict[str, Expr]) -> Expr | tuple[Expr, ...]:
        if isinstance(expr, Var):
            return env.get(expr.name, expr)
        if isinstance(expr, Box):
            args = tuple(_single(inline(a, env)) for a in expr.args)
            return typed_box(expr.op, args, expr.target, expr.out, expr.params, expr.index, expr.span)
        if isinstance(expr, Apply):
            inner: dict[str, Expr] = {}
            for param, arg in zip(expr.diagram.inputs, expr.args, strict=True):
                value = _single(inline(arg, env))
                if not isinstance(value, (Var, Const, Size)):
                    name = fresh(param.name)
                    lets.append(Let((name,), value, expr.span))
                    value = Var(name, value.axes)
                inner[param.name] = value
            for let in expr.diagram.body:
                value_or_tuple = inline(let.expr, inner)
                parts = value_or_tuple if isinstance(value_or_tuple, tuple) else (value_or_tuple,)
                for n, part in zip(let.names, parts, strict=True):
                    name = fresh(n)
                    lets.append(Let((name,), part, let.span))
                    inner[n] = Var(name, part.axes)
            outs = tuple(_single(inline(o, inner)) for o in expr.diagram.outputs)
            return outs if len(outs) > 1 else outs[0]
        return expr

    env: dict[str, Expr] = {}
    for let in thm.result.body:
        value = inline(let.expr, env)
        parts = value if isinstance(value, tuple) else (value,)
        for n, part in zip(let.names, parts, strict=True):
            lets.append(Let((n,), part, let.span))
            env[n] = Var(n, part.axes)
    outputs = tuple(_single(inline(o, env)) for o in thm.result.outputs)
    axes = tuple(dict.fromkeys(thm.result.axes + tuple(a for _, b in _apply_axes(thm.result) for a in b)))
    result = replace(thm.result, body=tuple(lets), outputs=outputs, axes=axes)
    return _extend(thm, None, ("unfold",), result=result)


def _apply_axes(diagram: Diagram) -> list[tuple[str, tuple[Axis, ...]]]:
    found: list[tuple[str, tuple[Axis, ...]]] = []
    for expr in [let.expr for let in diagram.body] + list(diagram.outputs):
        for n in walk(expr):
            if isinstance(n, Apply):
                found.append((n.diagram.name, n.diagram.axes))
                found.extend(_apply_axes(n.diagram))
    return found


def _single(value: Expr | tuple[Expr, ...]) -> Expr:
    assert not isinstance(value, tuple), "a multi-output diagram is bound by a multi-name let"
    return value


def trans(first: Theorem, second: Theorem) -> Theorem:
    """Transitivity:   ⊢ A ≡ B    ⊢ B ≡ C  (second carries no schedule)
                       ─────────────────────
                              ⊢ A ≡ C"""
    if first.result != second.source:
        raise KernelError("trans", f"the first theorem's result `{first.result.name}` is not the second's source")
    if second.schedule != _EMPTY:
        raise KernelError("trans", "the second theorem carries a schedule; relabel after the last rewrite")
    return _extend(first, None, second.trust, result=second.result, steps=first.steps + second.steps)


def _no_schedule(thm: Theorem, rule: str, span: Span | None) -> None:
    if thm.schedule != _EMPTY:
        raise KernelError(rule, "the diagram already carries a schedule (group/stream/place/dtype); "
                                "rewrite first, then relabel", span)


# ---- instantiation of a certified lemma, under congruence ---------------------------------


def rewrite(thm: Theorem, lemma: LemmaDecl, step: Rewrite, certified: Mapping[str, str]) -> Theorem:
    """Instantiation + congruence + transitivity:

        ⊢ A ≡ D[σ(lhs)]     lemma: lhs = rhs certified     σ maps the lemma's variables to
        ───────────────────────────────────────────────    sub-terms and its axes injectively
                    ⊢ A ≡ D[σ(rhs)]                        to the diagram's; extra axes woven

    The bindings named by ``at`` are inlined into the last of them (the root) and the
    first sub-term matching ``lhs`` is replaced; named bindings left unused are dropped.
    Side conditions: the lemma is certified; an extra axis of a matched variable is not
    the image of a lemma axis (so every box of the pattern weaves it, R1).
    """
    rule = "instantiate"
    if lemma.name not in certified:
        raise KernelError(rule, f"lemma `{lemma.name}` is not certified", step.span)
    _no_schedule(thm, "congruence", step.span)
    diagram = thm.result
    names = [n for let in diagram.body for n in let.names]
    for n in step.at:
        if n not in names:
            raise KernelError("congruence", f"no binding `{n}` in `{diagram.name}` (bindings: {', '.join(names)})",
                              step.span)
    root_index = max(names.index(n) for n in step.at)
    root = diagram.body[root_index]
    defs = {let.names[0]: let.expr for let in diagram.body if len(let.names) == 1 and let.names[0] in step.at}
    inlined = _inline_named(root.expr, defs, set(root.names))
    unused = [n for n in step.at if n not in root.names and not _mentions(root.expr, n, defs)]
    if unused:
        raise KernelError("congruence", f"binding `{unused[0]}` is not used by `{root.names[0]}`", step.span)
    for node in walk(inlined):
        sigma = _Match()
        if sigma.expr(lemma.lhs, node):
            sigma.check_weaving(lemma, rule, step.span)
            instance = sigma.instantiate(lemma.rhs, lemma.name)
            if set(instance.axes) != set(node.axes):
                raise KernelError(rule, f"lemma `{lemma.name}` gives type {list(instance.axes)} for "
                                        f"{list(node.axes)} at `{root.names[0]}`", step.span)
            new_root = Let(root.names, _replace(inlined, node, instance), root.span)
            body = list(diagram.body)
            body[root_index] = new_root
            result = replace(diagram, body=tuple(_drop_unused(body, diagram.outputs, set(step.at))))
            return _extend(thm, step, ("congruence", f"lemma {lemma.name} ({certified[lemma.name]})"), result=result)
    raise KernelError(rule, f"lemma `{lemma.name}`'s left side does not match `{root.names[0]}` "
                            f"with {', '.join(n for n in step.at if n not in root.names) or 'nothing'} inlined",
                      step.span)


def _inline_named(expr: Expr, defs: Mapping[str, Expr], seen: set[str]) -> Expr:
    if isinstance(expr, Var) and expr.name in defs and expr.name not in seen:
        return _inline_named(defs[expr.name], defs, seen | {expr.name})
    if isinstance(expr, Box):
        return replace(expr, args=tuple(_inline_named(a, defs, seen) for a in expr.args))
    return expr


def _mentions(expr: Expr, name: str, defs: Mapping[str, Expr]) -> bool:
    for n in walk(expr):
        if isinstance(n, Var) and (n.name == name or (n.name in defs and _mentions(defs[n.name], name, defs))):
            return True
    return False


def _replace(expr: Expr, old: Expr, new: Expr) -> Expr:
    if expr is old:
        return new
    if isinstance(expr, Box):
        args = tuple(_replace(a, old, new) for a in expr.args)
        return expr if args == expr.args else typed_box(expr.op, args, expr.target, expr.out, expr.params,
                                                        expr.index, expr.span)
    return expr


def _drop_unused(body: list[Let], outputs: tuple[Expr, ...], candidates: set[str]) -> list[Let]:
    while True:
        used = {n.name for e in [let.expr for let in body] + list(outputs) for n in walk(e) if isinstance(n, Var)}
        dead = [let for let in body if len(let.names) == 1 and let.names[0] in candidates and let.names[0] not in used]
        if not dead:
            return body
        body = [let for let in body if let not in dead]


class _Match:
    """A first-order match of a lemma side against a diagram term, with an axis map."""

    def __init__(self) -> None:
        self.vars: dict[str, Expr] = {}
        self.axes: dict[str, str] = {}

    def axis(self, pattern: str, actual: str) -> bool:
        if pattern in self.axes:
            return self.axes[pattern] == actual
        if actual in self.axes.values():
            return False
        self.axes[pattern] = actual
        return True

    def axes_list(self, pattern: Axes, actual: Axes) -> bool:
        return len(pattern) == len(actual) and all(self.axis(p, a) for p, a in zip(pattern, actual, strict=True))

    def expr(self, pattern: Expr, actual: Expr) -> bool:
        if isinstance(pattern, Var):
            if pattern.name in self.vars:
                return self.vars[pattern.name] == actual
            self.vars[pattern.name] = actual
            return True
        if isinstance(pattern, Const):
            return isinstance(actual, Const) and (pattern.value == actual.value)
        if isinstance(pattern, Size):
            return isinstance(actual, Size) and self.axis(pattern.axis, actual.axis)
        if isinstance(pattern, Box):
            return (isinstance(actual, Box) and pattern.op == actual.op and pattern.params == actual.params
                    and pattern.index is None and actual.index is None and len(pattern.args) == len(actual.args)
                    and self.axes_list(pattern.target, actual.target) and self.axes_list(pattern.out, actual.out)
                    and all(self.expr(p, a) for p, a in zip(pattern.args, actual.args, strict=True)))
        return False

    def check_weaving(self, lemma: LemmaDecl, rule: str, span: Span | None) -> None:
        image = set(self.axes.values())
        for param in lemma.params:
            if param.name not in self.vars:
                continue
            value = self.vars[param.name]
            own = {self.axes.get(a, a) for a in param.axes}
            if any(a not in self.axes for a in param.axes):
                raise KernelError(rule, f"lemma `{lemma.name}`: axis of `{param.name}` is not fixed by the match",
                                  span)
            if not own <= set(value.axes):
                raise KernelError(rule, f"lemma `{lemma.name}`: `{param.name}` needs axes {sorted(own)}, "
                                        f"the matched term has {list(value.axes)}", span)
            clash = (set(value.axes) - own) & image
            if clash:
                raise KernelError(rule, f"lemma `{lemma.name}`: `{param.name}` would carry axis `{min(clash)}`, "
                                        "which the lemma's boxes act on, so it is not woven (R1)", span)

    def instantiate(self, expr: Expr, lemma: str) -> Expr:
        """σ(expr); a variable or axis the match did not bind is refused (no invented terms)."""
        unbound = [n.name for n in walk(expr) if isinstance(n, Var) and n.name not in self.vars] + \
            [a for n in walk(expr) for a in _axes_named(n) if a not in self.axes]
        if unbound:
            raise KernelError("instantiate", f"lemma `{lemma}`'s right side uses `{unbound[0]}`, "
                                             "which its left side does not bind")
        return self._subst(expr)

    def _subst(self, expr: Expr) -> Expr:
        if isinstance(expr, Var):
            return self.vars[expr.name]
        if isinstance(expr, Size):
            return Size(self.axes[expr.axis])
        if isinstance(expr, Box):
            args = tuple(self._subst(a) for a in expr.args)
            target = tuple(self.axes[a] for a in expr.target)
            out = tuple(self.axes[a] for a in expr.out)
            return typed_box(expr.op, args, target, out, expr.params, expr.index)
        return expr


def _axes_named(node: Expr) -> Axes:
    if isinstance(node, Box):
        return node.target + node.out
    return (node.axis,) if isinstance(node, Size) else ()


# ---- relabellings: partitions (R3, R4, R5, R8, R9), placement (R2), dtype (R10) -----------


def _axis_size(diagram: Diagram, axis: str) -> int | None:
    return diagram.axis_sizes().get(axis)


def _nest(thm: Theorem, step: Partition) -> tuple[Divides, ...]:
    """R8 nesting and R9 divisibility; returns the divisibility constraints to record.

    Partitions are listed outermost first: a level may not be larger than an earlier one;
    an axis is partitioned at most once per level; an inner tile divides the outer tile;
    the outermost tile divides the axis unless ``pad`` declares a masked ragged tile.
    """
    rule = step.kind
    diagram = thm.result
    sizes = diagram.axis_sizes()
    if step.axis not in sizes or (not any(step.axis in b.axes or step.axis in b.target for _, b in _boxes(diagram)) \
            and not any(step.axis in p.axes for p in diagram.inputs)):
        raise KernelError(rule, f"axis `{step.axis}` does not occur in `{diagram.name}`", step.span)
    if isinstance(step.tile, str) and step.tile in sizes:
        raise KernelError(rule, f"tile `{step.tile}` is the name of an axis; name tile sizes apart", step.span)
    deepest = max((LEVELS.index(p.level) for p in thm.schedule.partitions), default=0)
    if LEVELS.index(step.level) < deepest:
        raise KernelError("nest", f"{rule} at `{step.level}` comes after a partition at `{LEVELS[deepest]}`; "
                                  "list outer (larger) levels first (R8)", step.span)
    outer = [p for p in thm.schedule.partitions if p.axis == step.axis]
    if any(p.level == step.level for p in outer):
        raise KernelError("nest", f"axis `{step.axis}` is already partitioned at `{step.level}`", step.span)
    dividend: str | int | None = outer[-1].tile if outer else sizes[step.axis]
    what = f"the `{outer[-1].level}` tile {outer[-1].tile}" if outer else f"axis `{step.axis}`"
    if dividend is None:
        dividend = step.axis
    if step.tile == 1:
        return ()
    if isinstance(step.tile, int) and isinstance(dividend, int):
        if dividend % step.tile == 0:
            return ()
        if step.pad and not outer:
            return ()
        raise KernelError("nest" if outer else rule,
                          f"tile {step.tile} does not divide {what} of size {dividend}"
                          + ("" if outer else "; declare `pad` to mask the ragged last tile"), step.span)
    if step.pad and not outer:
        return ()
    return (Divides(step.tile, dividend),)


def group(thm: Theorem, step: Partition) -> Theorem:
    """Group partition (R3):

        ⊢ A ≡ D    every box of D that axis a reaches weaves a    g | |a| (or pad)
        ─────────────────────────────────────────────────────────────────────────
                    ⊢ A ≡ D  with  a ↦ (|a|/g groups) × g   (tiles independent)

    Boxes that consume or mix a are refused: a consumed axis can only be streamed.
    """
    assert step.kind == "group"
    constraints = _nest(thm, step)
    _no_applications(thm, step)
    for let, box in _boxes(thm.result):
        how = treatment(box, step.axis)
        if how == "consumes":
            raise KernelError("group", f"box {_label(box, let)} consumes axis `{step.axis}`; "
                                       "a consumed axis can only be streamed (R3)", step.span)
        if how == "mixes":
            raise KernelError("group", f"box {_label(box, let)} mixes axis `{step.axis}`: its outputs read "
                                       f"every position along `{step.axis}` (R3)", step.span)
    schedule = replace(thm.schedule, partitions=(*thm.schedule.partitions, step))
    return _extend(thm, step, ("group",), schedule=schedule, constraints=thm.constraints + constraints)


@dataclass(frozen=True)
class _Flow:
    """Per value during a stream check: does it carry the axis, does it need the finished stream."""

    carries: bool
    after: bool


def stream(thm: Theorem, step: Partition, accumulator: AccumulatorOracle) -> Theorem:
    """Stream partition (R4 with the Fusion Theorem R5):

        ⊢ A ≡ D    every box a reaches before its consumption weaves a    no box mixes a
        each box consuming a has an accumulator (named by ``via`` or found) whose laws
        B(F(x), y) = F(x ⊕ y), identity and finaliser are certified for that box
        no box reads a value that needs the finished stream while a is still live
        s | |a|, or pad with a certified padding law
        ───────────────────────────────────────────────────────────────────────────
                ⊢ A ≡ D  with a walked in chunks of s, consumers accumulating

    Boxes after the consumption see only the accumulator's final value (post-composition).
    """
    assert step.kind == "stream"
    constraints = _nest(thm, step)
    _no_applications(thm, step)
    axis = step.axis
    chosen: list[tuple[str, Box, str]] = []
    trust: list[str] = []
    candidates: list[tuple[Let | None, Box, tuple[str, ...]]] = []

    def visit(node: Expr, kids: tuple[_Flow, ...], env: Mapping[str, _Flow]) -> _Flow:
        if isinstance(node, Var):
            return env[node.name]
        if not isinstance(node, Box):
            return _Flow(False, False)
        let = lets_of[id(node)]
        after = any(k.after for k in kids)
        how = treatment(node, axis)
        if how == "absent":
            return _Flow(False, after)
        if how == "mixes":
            raise KernelError("stream", f"box {_label(node, let)} mixes axis `{axis}` and has no accumulator; "
                                        "rewrite it with a certified lemma into a consuming box first (R4)", step.span)
        if after:
            raise KernelError("stream", f"box {_label(node, let)} reads a value computed from the whole of "
                                        f"`{axis}` while `{axis}` is still being streamed (a second pass)", step.span)
        if how == "weaves":
            return _Flow(axis in node.axes, False)
        candidates.append((let, node, ops.accumulators_for(node.op, node.params)))
        return _Flow(False, True)

    lets_of = {id(n): let for let, n in _boxes(thm.result)}
    run_diagram(thm.result, [_Flow(axis in p.axes, False) for p in thm.result.inputs], visit)
    if step.via is not None and not candidates:
        raise KernelError("stream", f"`via {step.via}` names an accumulator but no box consumes `{axis}`", step.span)
    if step.via is not None and not any(step.via in names for _, _, names in candidates):
        let, box, names = candidates[0]
        raise KernelError("stream", f"accumulator `{step.via}` cannot stream {_label(box, let)} along `{axis}`; "
                                    f"admissible: {', '.join(names) or 'none'}", step.span)
    for let, box, names in candidates:
        if not names:
            raise KernelError("stream", f"box {_label(box, let)} consumes `{axis}` but has no accumulator", step.span)
        order = ((step.via,) if step.via in names else ()) + tuple(n for n in names if n != step.via)
        how_certified = None
        for name in order:
            how_certified = accumulator(box, axis, name, step.pad)
            if how_certified is not None:
                chosen.append((axis, box, name))
                trust.append(f"accumulator {name} for {_label(box, let)} ({how_certified})")
                break
        if how_certified is None:
            pad = " with padding" if step.pad else ""
            raise KernelError("stream", f"no certified accumulator{pad} for {_label(box, let)} "
                                        f"(tried {', '.join(order)})", step.span)
    via = step.via if step.via is not None else (chosen[0][2] if len({c[2] for c in chosen}) == 1 else None)
    schedule = replace(thm.schedule, partitions=(*thm.schedule.partitions, replace(step, via=via)))
    return _extend(thm, step, ("stream", *trust), schedule=schedule, constraints=thm.constraints + constraints,
                   accumulators=thm.accumulators + tuple(chosen))


def _no_applications(thm: Theorem, step: Partition) -> None:
    for expr in [let.expr for let in thm.result.body] + list(thm.result.outputs):
        if any(isinstance(n, Apply) for n in walk(expr)):
            raise KernelError(step.kind, "the diagram uses a diagram as a box; unfold it first", step.span)


def _arrays(diagram: Diagram) -> list[str]:
    return [p.name for p in diagram.inputs] + [n for let in diagram.body for n in let.names]


def place(thm: Theorem, step: Place) -> Theorem:
    """Placement / recolouring (R2):   ⊢ A ≡ D    X an array of D   ─────  ⊢ A ≡ D[X @ ℓ]

    A level is a decoration: the value is the same wherever it is kept.  The memory bound
    is the cost model's concern, not an equality's.
    """
    arrays = _arrays(thm.result)
    for name in step.names:
        if name not in arrays:
            raise KernelError("place", f"no array `{name}` in `{thm.result.name}` (arrays: {', '.join(arrays)})",
                              step.span)
    schedule = replace(thm.schedule, placements=(*thm.schedule.placements, step))
    return _extend(thm, step, ("place",), schedule=schedule)


def quantise(thm: Theorem, step: Quantise) -> Theorem:
    """dtype change (R10), a marked approximation:

        ⊢ A ≡ D    X an array of D    tol ≥ unit roundoff of the format
        ────────────────────────────────────────────────────────────────
                 ⊢ A ≈_tol D[X : dtype]      (never an equality)
    """
    arrays = _arrays(thm.result)
    for name in step.names:
        if name not in arrays:
            raise KernelError("dtype", f"no array `{name}` in `{thm.result.name}`", step.span)
    if step.dtype not in DTYPE_ROUNDOFF:
        raise KernelError("dtype", f"unknown number format `{step.dtype}` (known: {', '.join(DTYPE_ROUNDOFF)})",
                          step.span)
    roundoff = DTYPE_ROUNDOFF[step.dtype]
    if not math.isfinite(step.tol) or step.tol < roundoff:
        raise KernelError("dtype", f"tolerance {step.tol:g} is below the unit roundoff {roundoff:g} of "
                                   f"{step.dtype}; an approximation cannot claim more than its format", step.span)
    schedule = replace(thm.schedule, quantisations=(*thm.schedule.quantisations, step))
    return _extend(thm, step, (f"approximation: {', '.join(step.names)} as {step.dtype} tol {step.tol:g}",),
                   schedule=schedule, approximations=(*thm.approximations, step))
