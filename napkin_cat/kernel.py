"""TRUSTED: the proof kernel.  Only this module constructs a ``Theorem``.

A ``Theorem`` states source ≡ result under its schedule, over the reals (or, once a ``dtype`` step is taken, within
the recorded tolerances), and lists its trust basis.

Interface (each rule's inference rule is in its docstring; every refusal raises ``KernelError`` whose message
starts with the rule's name and names the failed condition and the box):

    refl(name, D)                        ⊢ D ≡ D
    unfold(thm)                          δ: inline every diagram used as a box
    trans(t1, t2)                        A ≡ B,  B ≡ C  ⊢  A ≡ C
    rewrite(thm, lemma, step, certified) instantiation of a certified lemma + congruence + trans
    group(thm, step)                     R3 group partition (tiling), R8 nesting, R9 divisibility; scan: in order
    stream(thm, step, accumulator)       R4 + R5 stream partition with certified accumulators
    split(thm, step, accumulator)        stream's conditions; blocks folded in parallel, states combined
    place(thm, step)                     R2 placement (recolouring)
    quantise(thm, step, measure)         R10 dtype change: a marked approximation, never an equality
    chain(thm, writes, kernels, span)    composition: each kernel proved, run in order through hbm
    match(pattern, term, vars, axes)     first-order matching (the search proposes rewrites with it)

It reads the op catalogue's typing rule (``ops.typed_box``) and how a box treats an axis (``ops.treatment``: weaves
| consumes | mixes | absent, as the ``ops`` docstring defines them).

The kernel imports only the IR, the op catalogue, diagnostics and the finiteness analysis. Certification is an input:
lemma names map to how they were certified, ``accumulator(box, axis, name, pad)`` answers how an accumulator's laws
were certified for that box, ``measure`` a dtype step's error. Each answer is ``proved`` (for every size) or
``tested``; ``Theorem.tested`` lists what a theorem rests on that is only tested. The trusted code: this module,
``terms`` (the IR, ``inline_calls``, ``run_diagram``, ``match``, ``cut``, ``contradiction``), ``ops``
(``result_axes``, ``typed_box``, ``treatment``), ``finiteness``, and for ``proved`` answers the symbolic prover
``certify.prove`` with its reduction and index atoms ``certify.atoms`` (README "Proofs")."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import InitVar, dataclass, fields, replace

from napkin_cat import ops, terms
from napkin_cat.diagnostics import NapkinError, Span, error
from napkin_cat.finiteness import finite_in, narrowed, signed_zero_writes, unsupported
from napkin_cat.terms import Box, Diagram, Expr, LemmaDecl, Partition, Schedule, Size, Var, match, walk

__all__ = ["DTYPE_ROUNDOFF", "KernelError", "Theorem", "chain", "group", "match", "place", "quantise", "refl",
           "rewrite", "split", "stream", "trans", "unfold"]

_TOKEN, _EMPTY = object(), Schedule()

#: unit roundoff of each number format a ``dtype`` step may name
DTYPE_ROUNDOFF: dict[str, float] = {"f64": 2.0**-53, "f32": 2.0**-24, "tf32": 2.0**-11, "f16": 2.0**-11,
                                    "bf16": 2.0**-8, "fp8e4m3": 2.0**-4, "fp8e5m2": 2.0**-3}

#: certify's answer for an accumulator: how it was certified ("proved: ..." or "tested: ..."), else why not
AccumulatorOracle = Callable[[Box, str, str, bool], str]
#: a quantised theorem's measured error and how it was measured, or (None, why it cannot be)
Measure = Callable[["Theorem"], "tuple[float | None, str]"]


class KernelError(NapkinError):
    """A refused proof step: ``rule``, the failed ``condition``, where, the term refused (``subject``)."""

    def __init__(self, rule: str, condition: str, span: Span | None = None, subject: Expr | None = None,
                 hint: str | None = None):
        self.rule, self.condition, self.subject = rule, condition, subject
        super().__init__(error("proof.refused", span, hint, rule=rule, reason=condition))


@dataclass(frozen=True)
class Theorem:
    """⊢ source ≡ result under ``schedule``; constructed only by this module.

    A chain (``kernels``) runs each kernel theorem's result under its schedule, in order.
    ``accumulators`` lists (axis, consuming box, accumulator) for every stream step; ``approximations`` the dtype
    steps (the theorem is exact iff it has none); ``tested`` what it rests on that is only tested, not proved
    (lemmas, accumulators, dtype claims)."""

    name: str
    source: Diagram
    result: Diagram
    schedule: Schedule = _EMPTY
    steps: tuple[terms.Step, ...] = ()
    trust: tuple[str, ...] = ()
    constraints: tuple[terms.Divides, ...] = ()
    accumulators: tuple[tuple[str, Box, str], ...] = ()
    approximations: tuple[terms.Quantise, ...] = ()
    tested: tuple[str, ...] = ()
    #: a chain's kernels (run in order, their sources ``terms.cut`` of ``result``) and the arrays each writes
    kernels: tuple[Theorem, ...] = ()
    writes: tuple[tuple[str, ...], ...] = ()
    token: InitVar[object] = None

    def __post_init__(self, token: object) -> None:
        if token is not _TOKEN:
            raise TypeError("Theorem: only napkin_cat.kernel constructs theorems; use the kernel's rules")

    @property
    def exact(self) -> bool:
        return not self.approximations

    @property
    def chosen(self) -> dict[tuple[str, str, tuple[str, ...], tuple[str, ...]], str]:
        """The accumulator per stream by (axis, op, target, params) of its box: how a backend finds it on its copy."""
        return {(a, b.op, b.target, b.params): name for a, b, name in self.accumulators}


def _extend(thm: Theorem, step: terms.Step | None, trust: tuple[str, ...], tested: tuple[str, ...] = (),
            **changes: object) -> Theorem:
    values = {f.name: getattr(thm, f.name) for f in fields(thm)} | changes
    values["trust"] = tuple(dict.fromkeys(thm.trust + trust))
    values["tested"] = tuple(dict.fromkeys(thm.tested + tested))
    values["steps"] = values["steps"] if step is None else (*thm.steps, step)
    return Theorem(**values, token=_TOKEN)  # type: ignore[arg-type,unused-ignore]


def _boxes(diagram: Diagram) -> list[tuple[str, Box]]:
    """Every box with the label refusals name it by: `op[target; params]` (binding `X`)."""
    out: list[tuple[str, Box]] = []
    for where, expr in [(f"binding `{let.names[0]}`", let.expr) for let in diagram.body] + \
            [("the returned expression", o) for o in diagram.outputs]:
        for n in (n for n in walk(expr) if isinstance(n, Box)):
            inside = " ".join((*n.target, *(("->", *n.out) if n.out else ())))  # as written: split[a -> b c]
            inside += "; " + ", ".join(n.params) if n.params else ""
            out.append((f"`{n.op}{f'[{inside}]' if n.target else ''}` ({where})", n))
    return out


def _no_schedule(thm: Theorem, rule: str, span: Span | None) -> None:
    if thm.schedule != _EMPTY:
        raise KernelError(rule, "the diagram already carries a schedule (group/stream/split/place/dtype); "
                                "rewrite first, then relabel", span)


def refl(name: str, diagram: Diagram) -> Theorem:
    """Reflexivity:   ─────────  (no side condition)
                       ⊢ D ≡ D"""
    return Theorem(name, diagram, diagram, trust=("refl",), token=_TOKEN)


def unfold(thm: Theorem) -> Theorem:
    """δ-unfolding:   ⊢ A ≡ D[f(X)]    f(P) = body      ─────  ⊢ A ≡ D[body[P := X]]

    A diagram used as a box means its body run on the arguments, woven over the extra axes by name (terms.Apply), so
    inlining it, with every inner box retyped to carry the woven axes (ops.inlined: terms.inline_calls with the
    kernel's typing rule), is an equality."""
    if not thm.result.uses_diagrams():
        return thm
    _no_schedule(thm, "unfold", None)
    result = ops.inlined(thm.result)
    return _extend(thm, None, ("unfold",), result=result)


def trans(first: Theorem, second: Theorem) -> Theorem:
    """Transitivity:   ⊢ A ≡ B    ⊢ B ≡ C  (neither carries a schedule)
                       ─────────────────────
                              ⊢ A ≡ C"""
    if first.result != second.source:
        raise KernelError("trans", f"the first theorem's result `{first.result.name}` is not the second's source")
    if first.schedule != _EMPTY or second.schedule != _EMPTY:  # a schedule was checked on first.result only
        raise KernelError("trans", "a theorem carries a schedule; relabel after the last rewrite")
    return _extend(first, None, second.trust, second.tested, result=second.result, steps=first.steps + second.steps)


def rewrite(thm: Theorem, lemma: LemmaDecl, step: terms.Rewrite, certified: Mapping[str, str]) -> Theorem:
    """Instantiation + congruence + transitivity:

        ⊢ A ≡ D[σ(lhs)]     lemma: lhs = rhs certified     σ maps the lemma's variables to
        ───────────────────────────────────────────────    sub-terms and its axes injectively
                    ⊢ A ≡ D[σ(rhs)]                        to the diagram's; extra axes woven

    The bindings named by ``at`` are inlined into the last of them (the root; with ``return``, the returned
    expressions) and the first sub-term matching ``lhs`` is replaced; named bindings left unused are dropped.
    Side conditions: the lemma is certified; σ binds every variable and axis of ``rhs``; an extra axis of a matched
    variable is not the image of a lemma axis (so every box of the pattern weaves it, R1); both sides get the same
    type; a variable the lemma needs finite (``when c finite``) is matched to a term ``finiteness.finite`` vouches
    for.  A proof covers the use only where no box of σ(rhs) may overflow in float64 (``finiteness.narrowed``).
    """
    if lemma.name not in certified:
        raise KernelError("instantiate", f"lemma `{lemma.name}` is not certified", step.span)
    _no_schedule(thm, "congruence", step.span)
    n = len(thm.result.body)  # the returned expressions follow the body as bindings named `return`
    lets = list(thm.result.body) + [terms.Let(("return",), o, None) for o in thm.result.outputs]
    names = [m for let in lets[:n] for m in let.names]
    if missing := [m for m in step.at if m not in [*names, "return"]]:
        raise KernelError("congruence", f"no binding `{missing[0]}` in `{thm.result.name}` (bindings: "
                          f"{', '.join(names)})", step.span)
    roots = [i for i, let in enumerate(lets) if set(let.names) & set(step.at)]
    roots = roots[n - len(lets):] if "return" in step.at else roots[-1:]
    top = lets[roots[0]].names[0]
    defs = {let.names[0]: let.expr for let in lets[:n] if len(let.names) == 1 and let.names[0] in step.at}
    for m in step.at:
        if m != top and not any(m in lets[i].names or _mentions(lets[i].expr, m, defs) for i in roots):
            raise KernelError("congruence", f"binding `{m}` is not used by `{top}`", step.span)
    inlined = [(i, _inline_named(lets[i].expr, defs, set(lets[i].names))) for i in roots]
    for index, expr in inlined:
        for node in walk(expr):
            vars_, axes = dict[str, Expr](), dict[str, str]()
            if match(lemma.lhs, node, vars_, axes):
                instance = _instantiate(lemma, vars_, axes, step.span)
                for c in (c for c in lemma.finite if not finite_in(thm.result, vars_[c])):
                    raise KernelError("instantiate", f"lemma `{lemma.name}` holds when `{c}` is finite, and the term "
                                      f"matched to `{c}` may not be (finiteness.finite cannot vouch for it)", step.span)
                if set(instance.axes) != set(node.axes):
                    raise KernelError("instantiate", f"lemma `{lemma.name}` gives type {list(instance.axes)} for "
                                                     f"{list(node.axes)} at `{top}`", step.span)
                lets[index] = terms.Let(lets[index].names, _replace(expr, node, instance), lets[index].span)
                while dead := [let for let in lets[:n] if len(let.names) == 1 and let.names[0] in step.at
                               and not any(_mentions(b.expr, let.names[0], {}) for b in lets)]:
                    lets, n = [let for let in lets if let not in dead], n - len(dead)
                how = narrowed(certified[lemma.name], thm.result, vars_, instance, lhs=node)
                result = replace(thm.result, body=tuple(lets[:n]), outputs=tuple(e.expr for e in lets[n:]))
                return _extend(thm, step, ("congruence", f"lemma {lemma.name} ({how})"),
                               () if how.startswith("proved") else (f"lemma {lemma.name}",), result=result)
    raise KernelError("instantiate", f"lemma `{lemma.name}`'s left side does not match `{top}` with "
                      f"{', '.join(m for m in step.at if m != top) or 'nothing'} inlined", step.span, inlined[0][1])


def _inline_named(expr: Expr, defs: Mapping[str, Expr], seen: set[str]) -> Expr:
    if isinstance(expr, Var) and expr.name in defs and expr.name not in seen:
        return _inline_named(defs[expr.name], defs, seen | {expr.name})
    if isinstance(expr, Box):
        return replace(expr, args=tuple(_inline_named(a, defs, seen) for a in expr.args))
    return expr


def _mentions(expr: Expr, name: str, defs: Mapping[str, Expr]) -> bool:
    return any(isinstance(n, Var) and (n.name == name or (n.name in defs and _mentions(defs[n.name], name, defs)))
               for n in walk(expr))


def _replace(expr: Expr, old: Expr, new: Expr) -> Expr:
    if expr is old or not isinstance(expr, Box):
        return new if expr is old else expr
    args = tuple(_replace(a, old, new) for a in expr.args)
    return expr if args == expr.args else ops.typed_box(expr.op, args, expr.target, expr.out, expr.params, expr.index,
                                                    expr.span)


def _instantiate(lemma: LemmaDecl, vars_: dict[str, Expr], axes: dict[str, str], span: Span | None) -> Expr:
    """σ(rhs), after checking that σ binds it and that every extra axis is woven (R1)."""
    image = set(axes.values())
    for param in (p for p in lemma.params if p.name in vars_):
        have = set(vars_[param.name].axes)
        if any(a not in axes for a in param.axes):
            raise KernelError("instantiate", f"lemma `{lemma.name}`: an axis of `{param.name}` is not fixed by "
                                             "the match", span)
        own = {axes[a] for a in param.axes}
        if not own <= have:
            raise KernelError("instantiate", f"lemma `{lemma.name}`: `{param.name}` needs axes {sorted(own)}, "
                                             f"the matched term has {sorted(have)}", span)
        if (have - own) & image:
            raise KernelError("instantiate", f"lemma `{lemma.name}`: `{param.name}` would carry axis "
                                             f"`{min((have - own) & image)}`, which the lemma's boxes act on, "
                                             "so it is not woven (R1)", span)
    for n in walk(lemma.rhs):
        if isinstance(n, terms.Apply):  # its arguments would escape σ: a lemma is stated on primitive boxes
            raise KernelError("instantiate", f"lemma `{lemma.name}` uses diagram `{n.diagram.name}` as a box; "
                                             "state lemmas on primitive boxes", span)
        names = (n.name,) if isinstance(n, Var) else (n.axis,) if isinstance(n, Size) else \
            n.target + n.out if isinstance(n, Box) else ()
        for name in names:
            if name not in (vars_ if isinstance(n, Var) else axes):
                raise KernelError("instantiate", f"lemma `{lemma.name}`'s right side uses `{name}`, "
                                                 "which its left side does not bind", span)

    def subst(expr: Expr) -> Expr:
        if not isinstance(expr, Box):  # Var, Size or Const
            return vars_[expr.name] if isinstance(expr, Var) else \
                Size(axes[expr.axis]) if isinstance(expr, Size) else expr
        named = tuple(axes[a] for a in expr.target + expr.out)
        return ops.typed_box(expr.op, tuple(subst(a) for a in expr.args), named[:len(expr.target)],
                         named[len(expr.target):], expr.params, _reindex(expr.index, axes))

    return subst(lemma.rhs)


def _reindex(index: terms.Pred | terms.IndexExpr | None,
             axes: Mapping[str, str]) -> terms.Pred | terms.IndexExpr | None:
    """σ on an index expression: its positions are along the box's axes, renamed with them."""
    if isinstance(index, (terms.IBin, terms.Cmp, terms.Logic)):
        return replace(index, left=_reindex(index.left, axes), right=_reindex(index.right, axes))  # type: ignore[arg-type]
    return terms.Idx(axes[index.axis]) if isinstance(index, terms.Idx) else index


def _nest(thm: Theorem, step: Partition) -> tuple[terms.Divides, ...]:
    """R8 nesting and R9 divisibility; returns the divisibility constraints to record, refused where no tile sizes
    satisfy them with those recorded before (``terms.contradiction``: `sx | 10, 4 | sx` would claim nothing).

    Partitions are listed outermost first: a level may not be larger than an earlier one; an axis is partitioned at
    most once per level; an inner tile divides the outer tile; the outermost tile divides the axis unless ``pad``
    declares a masked ragged tile, as may a stream inside a split (a block's last chunk masked: its padding law).
    """
    rule, diagram, span, axis = step.kind, thm.result, step.span, step.axis
    sizes = diagram.axis_sizes()
    if diagram.uses_diagrams():
        raise KernelError(rule, "the diagram uses a diagram as a box; unfold it first", span)
    if axis not in sizes or not (any(ops.treatment(b, axis) != "absent" for _, b in _boxes(diagram))
                                 or any(axis in p.axes for p in diagram.inputs)):
        raise KernelError(rule, f"axis `{axis}` does not occur in `{diagram.name}`", span)
    if isinstance(step.tile, str) and step.tile in sizes:
        raise KernelError(rule, f"tile `{step.tile}` is the name of an axis; name tile sizes apart", span)
    deepest = max((terms.LEVELS.index(p.level) for p in thm.schedule.partitions), default=0)
    if terms.LEVELS.index(step.level) < deepest:
        raise KernelError("nest", f"{rule} at `{step.level}` comes after a partition at `{terms.LEVELS[deepest]}`; "
                                  "list outer (larger) levels first (R8)", span)
    outer = [p for p in thm.schedule.partitions if p.axis == axis]
    if any(p.level == step.level for p in outer):
        raise KernelError("nest", f"axis `{axis}` is already partitioned at `{step.level}`", span)
    dividend: str | int = outer[-1].tile if outer else sizes[axis] or axis
    if step.tile == 1 or (step.pad and (not outer or (step.kind == "stream" and outer[-1].kind == "split"))):
        return ()
    if isinstance(step.tile, str) or isinstance(dividend, str):
        if why := terms.contradiction(thm.constraints + (new := (terms.Divides(step.tile, dividend),))):
            raise KernelError("nest" if outer else rule, why, span)  # R9: else it claims nothing at any tile
        return new
    if dividend % step.tile:
        what = f"the `{outer[-1].level}` tile {dividend}" if outer else f"axis `{axis}` of size {dividend}"
        raise KernelError("nest" if outer else rule, f"tile {step.tile} does not divide {what}"
                          + ("" if outer else "; declare `pad` to mask the ragged last tile"), span)
    return ()


def group(thm: Theorem, step: Partition) -> Theorem:
    """Group partition (R3); ``scan``: its tiles (chunks) run in order, each scan along a carrying its state:
        ⊢ A ≡ D    every box of D that axis a reaches weaves a (scan: or is cumsum[a], linrec[a])    g | |a| (or pad)
        ─────────────────────────────────────────────────────────────────────────────────────────────────────────
        ⊢ A ≡ D  with a ↦ (|a|/g groups) × g, independent tiles; scan: chunks in order, a scan's chunk started from
                 its value h at the position before it, X[first] + A[first]·h (cumsum: + h), then its recurrence
    Boxes that consume or mix a are refused: a consumed axis can only be streamed.  A scan is sound by its definition
    h[t] = A[t]·h[t-1] + X[t] (ops.OPS); other boxes read position t only at t (padded positions come last)."""
    if (rule := step.kind) not in ("group", "scan"):
        raise KernelError("group", f"a {step.kind} partition of `{step.axis}` is not a group step", step.span)
    constraints = _nest(thm, step)
    for label, box in _boxes(thm.result):  # a scan along the axis starts each chunk from its carried state:
        if (how := ops.treatment(box, step.axis)) in ("consumes", "mixes") and not (
                rule == "scan" and ops.scans_along(box, step.axis)):
            why = ("a consumed axis can only be streamed" if how == "consumes" else f"it moves the positions of "
                   f"`{' '.join(box.target)}` onto `{' '.join(box.out)}`; grouping `{step.axis}` tiles one side only"
                   if box.out else f"its outputs read every position along `{step.axis}`")
            raise KernelError(rule, f"box {label} {how} axis `{step.axis}`; {why} ("
                              f"{'R3' if rule == 'group' else 'only a scan along it carries a state'})", step.span)
    schedule = replace(thm.schedule, partitions=(*thm.schedule.partitions, step))
    return _extend(thm, step, (rule,), schedule=schedule, constraints=thm.constraints + constraints)


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
    return _stream(thm, step, accumulator, "stream")


def split(thm: Theorem, step: Partition, accumulator: AccumulatorOracle) -> Theorem:
    """Split reduction (flash-decoding's split-KV):

        ⊢ A ≡ D    the side conditions of ``stream`` for a (R4, R5, R8)    k | |a| (or pad)
        ─────────────────────────────────────────────────────────────────────────────────────
        ⊢ A ≡ D  with a cut in blocks of k, each folded from the identity in its own program,
                 the programs' states merged in order with the accumulator's combine, then finalised

    Sound by the certified law combine(lift(x), lift(y)) = lift(x ⊕ y): any fold or tree of them is lift(a).
    """
    return _stream(thm, step, accumulator, "split")


def _stream(thm: Theorem, step: Partition, accumulator: AccumulatorOracle, rule: str) -> Theorem:
    if step.kind != rule:
        raise KernelError(rule, f"a {step.kind} partition of `{step.axis}` is not a {rule} step", step.span)
    constraints = _nest(thm, step)
    axis, span, via = step.axis, step.span, step.via
    labels = {id(n): label for label, n in _boxes(thm.result)}
    consumers: list[tuple[str, tuple[str, ...], Box]] = []

    def visit(node: Expr, kids: tuple[bool, ...], env: Mapping[str, bool]) -> bool:
        """True for a value that needs the finished stream (computed after a consumption)."""
        if not isinstance(node, Box):
            return isinstance(node, Var) and env[node.name]
        how, label = ops.treatment(node, axis), labels[id(node)]
        if how == "mixes":
            raise KernelError(rule, f"box {label} mixes axis `{axis}` and has no accumulator; rewrite it "
                                    "with a certified lemma into a consuming box first (R4)", span)
        if how != "absent" and any(kids):
            raise KernelError(rule, f"box {label} reads a value computed from the whole of `{axis}` while "
                                    f"`{axis}` is still being streamed (a second pass)", span)
        if how == "consumes":
            consumers.append((label, ops.accumulators_for(node.op, node.params), node))
        return how == "consumes" or any(kids)

    terms.run_diagram(thm.result, [False for _ in thm.result.inputs], visit)
    if via is not None and not any(via in names for _, names, _ in consumers):
        raise KernelError(rule, f"accumulator `{via}` cannot stream {consumers[0][0]} along `{axis}`; admissible: "
                                f"{', '.join(consumers[0][1]) or 'none'}" if consumers else
                                f"`via {via}` names an accumulator but no box consumes `{axis}`", span)
    chosen: list[tuple[str, Box, str]] = []
    trust, tested = list[str](), list[str]()
    for label, names, box in consumers:
        if (prior := next((n for _, b, n in thm.accumulators if b == box), None)) and via in names and via != prior:
            raise KernelError("nest", f"{label} is streamed via `{prior}` at an outer level; a nested stream (of "
                                      f"any axis it consumes) continues that state (R8), not `{via}`", span)
        order = [prior] if prior else [via] if via in names else list(names)  # a named one is not swapped
        answers = {n: accumulator(box, axis, n, step.pad) for n in order}  # each: how certified, or why not
        found = next(((n, how) for n, how in answers.items() if how.startswith(("proved", "tested"))), None)
        if found is None:
            tried = "; ".join(f"{n}: {why}" for n, why in answers.items()) or "none"
            raise KernelError(rule, f"no certified accumulator{' with padding' if step.pad else ''} for "
                                    f"{label} (tried {tried})", span)
        operands = {f"X{k}": a for k, a in enumerate(box.args)}
        if why := unsupported(found[1], thm.result, operands):
            raise KernelError(rule, f"accumulator {found[0]} for {label}: {why}", span)
        how = narrowed(found[1], thm.result, operands, fold=box, accumulator=found[0])
        chosen.append((axis, box, found[0]))
        trust.append(f"accumulator {found[0]} for {label} ({how})")
        tested += [] if how.startswith("proved") else [f"accumulator {found[0]} for {label}"]
    via = via if via is not None else (chosen[0][2] if len({c[2] for c in chosen}) == 1 else None)
    schedule = replace(thm.schedule, partitions=(*thm.schedule.partitions, replace(step, via=via)))
    return _extend(thm, step, (rule, *trust), tuple(tested), schedule=schedule,
                   constraints=thm.constraints + constraints, accumulators=thm.accumulators + tuple(chosen))


def _arrays(thm: Theorem, names: tuple[str, ...], rule: str, span: Span | None) -> None:
    arrays = [p.name for p in thm.result.inputs] + [n for let in thm.result.body for n in let.names]
    for name in (n for n in names if n not in arrays):
        raise KernelError(rule, f"no array `{name}` in `{thm.result.name}` (arrays: {', '.join(arrays)})", span)


def place(thm: Theorem, step: terms.Place) -> Theorem:
    """Placement / recolouring (R2):   ⊢ A ≡ D    X an array of D   ─────  ⊢ A ≡ D[X @ ℓ]

    A level is a decoration: the value is the same wherever it is kept (the memory bound is the cost model's)."""
    _arrays(thm, step.names, "place", step.span)
    return _extend(thm, step, ("place",), schedule=replace(thm.schedule, placements=(*thm.schedule.placements, step)))


def quantise(thm: Theorem, step: terms.Quantise, measure: Measure) -> Theorem:
    """dtype change (R10), a marked approximation (never an equality):

        ⊢ A ≡ D    X an array of D, no integer input    roundoff of the format ≤ tol    measured error ≤ tol
        ──────────────────────────────────────────────────────────────────────────────────────────────────────
                              ⊢ A ≈_tol D[X : dtype]

    ``measure`` (an input, like certification) gives the error of the quantised theorem on seeded inputs, or None
    and why it cannot; the claim rests on that measurement (tested); an integer input is never approximated."""
    _arrays(thm, step.names, "dtype", step.span)
    for name in (p.name for p in thm.result.inputs if p.integer and p.name in step.names):
        raise KernelError("dtype", f"`{name}` is an integer input: every kernel keeps it exact (ids, lengths and "
                                   "page numbers are exact or wrong, never approximate)", step.span)
    if step.dtype not in DTYPE_ROUNDOFF:
        raise KernelError("dtype", f"unknown number format `{step.dtype}` (known: {', '.join(DTYPE_ROUNDOFF)})",
                          step.span)
    if not (roundoff := DTYPE_ROUNDOFF[step.dtype]) <= step.tol < math.inf:
        why = "below the unit roundoff" if step.tol < roundoff else "not a finite bound at least the unit roundoff"
        raise KernelError("dtype", f"tolerance {step.tol!r} is {why} {roundoff:g} of "
                                   f"{step.dtype}; an approximation cannot claim more than its format", step.span)
    schedule = replace(thm.schedule, quantisations=(*thm.schedule.quantisations, step))
    claim = f"{', '.join(step.names)} as {step.dtype} tol {step.tol!r}"
    out = _extend(thm, step, (), schedule=schedule, approximations=(*thm.approximations, step))
    error, how = measure(out)
    if error is None or not error <= step.tol:  # a NaN error is no bound either
        raise KernelError("dtype", f"the tolerance cannot be measured: {how}" if error is None else
                          f"tolerance {step.tol!r} is below the error the rounding causes: {how}", step.span,
                          hint="declare smaller sizes (the claim is measured on one set of sizes)" if error is None
                          else "declare a tolerance at least the measured error, or keep fewer arrays in the "
                               "narrow format")
    return _extend(out, None, (f"approximation: {claim} (tested: {how})",), (f"dtype {claim}",))


def chain(thm: Theorem, writes: tuple[tuple[str, ...], ...], kernels: tuple[Theorem, ...],
          span: Span | None) -> Theorem:
    """Chained kernels (composition through hbm):

        ⊢ A ≡ D    K_1, ..., K_n = terms.cut(D, writes)    ⊢ K_k ≡ K_k' under S_k for each k
        ─────────────────────────────────────────────────────────────────────────────────────
        ⊢ A ≡ D  run as K_1' ... K_n' in order, each written array kept in hbm for the later ones

    Sound by ``terms.cut``: each K_k computes the arrays it writes as D binds them from the inputs and the arrays
    written before, and K_n the outputs; over the reals only, where a zero has no sign: a kernel whose rewrites may
    give an array it writes a zero a later kernel divides by is only tested (``finiteness.signed_zero_writes``)."""
    _no_schedule(thm, "chain", span)
    try:
        expected = terms.cut(thm.result, writes, ops.integer_valued)
    except ValueError as exc:
        raise KernelError("chain", str(exc), span) from None
    if tuple(k.source for k in kernels) != expected or any(k.kernels for k in kernels):
        raise KernelError("chain", "a kernel's theorem is not about its piece of the diagram", span)
    zeros = signed_zero_writes(expected, writes, [k.steps for k in kernels])  # tested: a zero's sign read later
    if why := terms.contradiction(thm.constraints + tuple(c for k in kernels for c in k.constraints)):
        raise KernelError("chain", why, span)  # the kernels' tiles are one set of sizes
    return _extend(thm, None, ("chain", *(f"{k.name}: {t}" for k in kernels for t in k.trust if t != "refl")),
                   tuple(f"{k.name}: {t}" for k in kernels for t in k.tested) + zeros, kernels=kernels, writes=writes,
                   constraints=thm.constraints + tuple(c for k in kernels for c in k.constraints),
                   accumulators=thm.accumulators + tuple(a for k in kernels for a in k.accumulators),
                   approximations=thm.approximations + tuple(a for k in kernels for a in k.approximations))
