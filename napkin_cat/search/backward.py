"""A derived streamed backward: FlashAttention-2's plan for any proved forward, without a
hand-written backward diagram (``napkin lower FILE THEOREM --backward derived``,
``fuse(..., backward="derived")``).

``derived(module, theorem)`` builds what examples/attention_backward.ncd and
proofs/flash_attention_backward.ncd write by hand:

1. the forward (``saving``): the theorem's diagram, inlined, returning beside its outputs the
   row statistic ``L = logsumexp[T](S)`` of each exp-normalised reduction
   (``grad.exp_normalised``: ``softmax[T](S)``, ``ncontract[T; exp, exp, id](S, V)``) and the
   output ``O = contract(P, V)`` each softmax feeds; it is proved by the theorem's own steps
   (or, where they do not apply to it, by ``derive``'s search);
2. the VJP reading them (``grad.vjp(..., saved=, statistics=)``): ``P = exp(S - L)`` (guarded,
   ``exp(S - max(L, -FLOAT_MAX))``, so that a row a mask empties gives 0: ``grad._weights``), no
   second softmax, and softmax's VJP term ``D = Σ dO·O`` from the saved output;
3. split into passes (``passes``), one per set of input gradients of the same axes (dK and
   dV together, dQ alone), so that each pass's ``derive`` search can group its gradients' own
   axes and stream the others, summing on chip: no gradient is summed across programs;
4. each pass scheduled by ``derive``'s search (the cost model at ``sizes``, the target's
   lowering screen), a value its schedule recomputes in every program (``D = Σ dO·O`` in the
   key pass, which streams the queries) hoisted into a first kernel of a chain where the model
   prices that cheaper, launch included (``search.chains.hoisted``), and proved as a file's
   theorem is (``proof.check_theorem``, strict: only
   proved accumulators); the join is proved by ``lower``'s ``link``
   (``certify.prove.prove_join``), refused where it cannot be unless ``allow_tested_join``.

The search prices each pass at ``sizes`` (by default ``LONG`` for every axis the forward's
theorem partitions, ``SHORT`` for its other symbolic axes); the theorems hold for every size,
the sizes only choose among schedules.  ``DerivedBackward.text`` prints the derived diagrams
and theorems as an .ncd file a reader can check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from napkin_cat import kernel, proof
from napkin_cat.certify import rules
from napkin_cat.cost import hardware as hw
from napkin_cat.diagnostics import NapkinError, error
from napkin_cat.grad import exp_normalised, live, vjp
from napkin_cat.ops import inlined, typed_box
from napkin_cat.printer import print_diagram, print_step
from napkin_cat.search.chains import exposed, hoisted
from napkin_cat.search.derive import lowering_screen, model_cost
from napkin_cat.search.rewrite import Costed, search
from napkin_cat.terms import Box, Diagram, Expr, Let, Module, Step, TheoremDecl, Var, expanded, fresh_name, walk

__all__ = ["DERIVED", "LONG", "SHORT", "DerivedBackward", "derived", "passes", "saving"]

#: the name that asks for a derived backward (``--backward derived``, ``fuse(..., backward="derived")``)
DERIVED = "derived"
#: the size at which a pass is priced along an axis the forward's theorem partitions
LONG = 4096
#: the size along its other symbolic axes (a head dimension)
SHORT = 64


@dataclass(frozen=True)
class Saving:
    """The forward that saves what the backward reads, and how the backward reads it."""

    #: the inlined forward returning its outputs, then the saved outputs and statistics
    diagram: Diagram
    #: how many of its outputs are the original diagram's
    primal: int
    #: the saved bindings (forward outputs the backward reads by name)
    saved: tuple[str, ...]
    #: a statistic's name -> the exp-normalisation (S, T) whose logsumexp it is
    statistics: Mapping[str, tuple[Expr, tuple[str, ...]]]


@dataclass(frozen=True)
class DerivedBackward:
    """A proved forward that saves its statistics, and the proved backward passes."""

    forward: kernel.Theorem
    backward: tuple[kernel.Theorem, ...]
    #: the derived diagrams and theorems as .ncd text (``use`` of nothing: everything inlined)
    text: str


def saving(diagram: Diagram, name: str) -> Saving:
    """The forward ``name``: ``diagram`` inlined, its box outputs bound to names, returning its
    outputs, then each exp-normalisation's output ``O = contract(P, V)`` (where it is a binding
    and not already returned) and row statistic ``logsumexp[T](S)`` (module docstring)."""
    flat = inlined(diagram)
    taken = {p.name for p in flat.inputs} | {n for let in flat.body for n in let.names} | {a.name for a in flat.axes}
    body = list(flat.body)
    outputs: list[Expr] = []
    for out, declared in zip(flat.outputs, flat.out_types, strict=True):
        if isinstance(out, Box) or out.axes != declared:  # bound, in the declared order (a call's may differ)
            value = out if out.axes == declared else typed_box("transpose", (out,), declared)
            bound = fresh_name("out", taken)
            body.append(Let((bound,), value))
            out = Var(bound, value.axes)
        outputs.append(out)
    rows = exp_normalised(flat)
    inputs = {p.name for p in flat.inputs}
    saved = [o.name for o in outputs if isinstance(o, Var) and o.name not in inputs]
    extra: list[Expr] = []
    for let in flat.body:
        if let.names[0] not in saved and _feeds(let.expr, rows, flat):
            saved.append(let.names[0])
            extra.append(Var(let.names[0], let.expr.axes))
    statistics: dict[str, tuple[Expr, tuple[str, ...]]] = {}
    for s, target in rows:
        stat = fresh_name("L", taken)
        value = typed_box("logsumexp", (s,), target)
        body.append(Let((stat,), value))
        extra.append(Var(stat, value.axes))
        statistics[stat] = (s, target)
    every = (*outputs, *extra)
    forward = replace(flat, name=name, body=tuple(body), outputs=every, out_types=tuple(o.axes for o in every))
    return Saving(forward, len(outputs), tuple(dict.fromkeys(saved)), statistics)


def _feeds(expr: Expr, rows: Sequence[tuple[Expr, tuple[str, ...]]], flat: Diagram) -> bool:
    """Is ``expr`` a contraction of an exp-normalisation's weights (``contract(softmax(S), V)``,
    the softmax as a box or a binding, or ``ncontract[T; exp, exp, id](S, V)``)?"""
    if not isinstance(expr, Box):
        return False
    if expr.op == "ncontract":
        return (expr.args[0], expr.target) in rows and expr.params == ("exp", "exp", "id")
    if expr.op != "contract" or len(expr.args) != 2:
        return False
    bound = {let.names[0]: let.expr for let in flat.body}
    for arg in expr.args:
        weights = bound.get(arg.name) if isinstance(arg, Var) else arg
        if isinstance(weights, Box) and weights.op == "softmax" and (weights.args[0], weights.target) in rows:
            return True
    return False


def passes(forward: Saving, name: str) -> tuple[Diagram, ...]:
    """The backward diagrams of ``forward``: its VJP reading the saved values (``grad.vjp``),
    one diagram ``NAME_k`` per set of input gradients with the same axes, each returning
    ``dX`` for its inputs X and reading only what it needs.  Inputs whose gradient is zero
    (labels, indices) have none (``lower``'s join gives them zeros).  Each statistic ``L`` is
    given as the forward's ``logsumexp[T](S)`` over the inputs (``Param.given``): the passes are
    claimed for the forward's saved values, where their guarded ``exp(S - L)`` is in [0, 1]."""
    primal = replace(forward.diagram, outputs=forward.diagram.outputs[:forward.primal],
                     out_types=forward.diagram.out_types[:forward.primal])
    full = vjp(primal, saved=forward.saved, statistics=forward.statistics)
    groups: dict[frozenset[str], list[int]] = {}
    for i, (param, result) in enumerate(zip(primal.inputs, full.outputs, strict=True)):
        if any(isinstance(n, Var) for n in walk(result)):  # a gradient that reads nothing is zero
            groups.setdefault(frozenset(param.axes), []).append(i)
    names = {p.name for p in full.inputs}
    taken = names | {n for let in full.body for n in let.names} | {f"d{p.name}" for p in primal.inputs}
    body = list(full.body)
    results = list(full.outputs)
    for i, p in enumerate(primal.inputs):  # a binding called as another gradient is renamed out of its way
        grad = f"d{p.name}"
        if grad in names:
            raise NapkinError(error("lower.backward_derived", diagram=primal.name,
                                    why=f"the gradient's name `{grad}` is taken by an input"))
        if results[i] != Var(grad, p.axes) and any(grad in let.names for let in body):
            new = fresh_name(grad, taken)
            body = [Let(tuple(new if n == grad else n for n in let.names), _rebound(let.expr, grad, new))
                    for let in body]
            results = [_rebound(r, grad, new) for r in results]
    # each statistic is the forward's logsumexp of its scores, over the inputs (README "Proofs": relations)
    defs = forward.diagram.bindings()
    given = {stat: typed_box("logsumexp", (expanded(s, defs),), target)
             for stat, (s, target) in forward.statistics.items()}
    built = []
    for k, members in enumerate(groups.values(), start=1):
        lets = list(body)
        outs: list[Expr] = []
        for i in members:
            named = Var(f"d{primal.inputs[i].name}", results[i].axes)
            if results[i] != named:
                lets.append(Let((named.name,), results[i]))
            outs.append(named)
        kept = live(lets, outs)
        read = {n.name for let in kept for n in walk(let.expr) if isinstance(n, Var)}
        stated = {n: g for n, g in given.items() if all(v.name in read for v in walk(g) if isinstance(v, Var))}
        inputs = tuple(replace(p, given=stated[p.name]) if p.name in stated else p
                       for p in full.inputs if p.name in read or p.name in _sizing(full, kept, outs, read, members,
                                                                                   primal))
        built.append(replace(full, name=f"{name}_{k}", inputs=inputs,
                             body=kept, outputs=tuple(outs),
                             out_types=tuple(o.axes for o in outs)))
    if not built:
        raise NapkinError(error("lower.backward_derived", diagram=primal.name, why="no input has a gradient"))
    return tuple(built)


def _sizing(full: Diagram, kept: Sequence[Let], outs: Sequence[Expr], read: set[str], members: Sequence[int],
            primal: Diagram) -> set[str]:
    """Inputs a pass reads for their sizes alone: an axis of the pass that no input it reads
    carries and no declaration sizes (the table axis of a gather's gradient, a scatter-add that
    reads the positions and the cotangent, not the table) takes its size from an input that
    carries it, the one whose gradient the pass computes first."""
    carried = {a for p in full.inputs if p.name in read for a in p.axes}
    sized = {a.name for a in full.axes if a.size is not None}
    used = {a for let in kept for n in walk(let.expr) for a in n.axes} | {a for o in outs for a in o.axes}
    unbound = used - carried - sized
    own = [primal.inputs[i].name for i in members]
    order = sorted(full.inputs, key=lambda p: p.name not in own)  # stable: the pass's own inputs first
    found: set[str] = set()
    for axis in sorted(unbound):
        found |= {next(p.name for p in order if axis in p.axes)} if any(axis in p.axes for p in order) else set()
    return found


def _summed_across(thm: kernel.Theorem) -> str | None:
    """Why a pass's schedule is not wanted: a ``split`` sums a gradient across programs (each
    pass groups its gradients' own axes instead, FlashAttention-2's split of the backward)."""
    split = next((p for p in proof.partitions(thm) if p.kind == "split"), None)
    return None if split is None else f"split {split.axis} sums a gradient across programs"


def _rebound(expr: Expr, old: str, new: str) -> Expr:
    """``expr`` reading the binding ``old`` as ``new``."""
    if isinstance(expr, Var):
        return Var(new, expr.axes) if expr.name == old else expr
    if isinstance(expr, Box):
        return replace(expr, args=tuple(_rebound(a, old, new) for a in expr.args))
    return expr


def derived(module: Module, theorem: str, *, target: str = "jax", sizes: Mapping[str, int] | None = None,
            hardware: str | hw.Hardware = "h100", dtype: str = "bf16", strict: bool = True, seconds: float = 30.0,
            budget: int = 2000) -> DerivedBackward:
    """The forward of ``theorem`` saving its statistics, proved, and its derived backward
    passes, each scheduled by ``derive``'s search for ``target`` and proved (module
    docstring); ``lower(result.forward, backward=result.backward)`` joins them, proving the
    join.  ``theorem`` may name a diagram without a theorem: its forward is then searched too,
    every symbolic axis priced at ``LONG`` (unless ``sizes`` says), and its theorem is called
    ``DIAGRAM_derived``.  Each search (the forward's where it is searched, each pass's, and each
    piece of a hoisting chain, which gets an eighth, as in ``derive``'s fusion-boundary phase) stops
    after ``budget`` candidates or ``seconds``, whichever comes first (``rewrite.search``); with
    ``seconds=math.inf`` the plans depend on ``budget`` alone, not on the machine's speed or load.
    Raises ``NapkinError`` where a step fails (``lower.backward_derived``) or for a name that is
    neither (``name.unknown``)."""
    names = {d.name for d in module.scope_diagrams or module.diagrams} | {t.name for t in module.theorems}
    if any(t.name == theorem for t in module.theorems):
        decl = module.theorem(theorem)
        long: set[str] | None = {p.axis for p in proof.partitions(proof.prove(module, theorem))}
    elif theorem in names:  # a diagram without a theorem: its forward is searched too, every symbolic axis long
        decl = TheoremDecl(fresh_name(f"{theorem}_derived", names), theorem, ())
        long = None
    else:
        known = ", ".join(sorted(names)) or "none"
        raise NapkinError(error("name.unknown", None, f"theorems and diagrams here: {known}", kind="theorem or diagram",
                                name=theorem))
    fwd_name = fresh_name(f"{decl.diagram}_forward", names)
    forward = saving(module.diagram(decl.diagram), fwd_name)
    backs = list(passes(forward, fresh_name(f"{decl.diagram}_backward", names | {fwd_name})))
    lemmas = rules.lemmas_in_scope(_with(module, forward.diagram, backs))
    priced = {a.name: (sizes or {}).get(a.name, LONG if long is None or a.name in long else SHORT)
              for d in (forward.diagram, *backs) for a in d.axes if a.size is None}
    cost_fn = model_cost(hardware, dtype, priced, target)
    profile = hardware if isinstance(hardware, hw.Hardware) else hw.load(hardware)

    def screen(thm: kernel.Theorem, costed: Costed) -> str | None:
        if strict and thm.tested:  # the passes are checked --strict below: a plan resting on a test is no plan
            return f"it rests on {', '.join(thm.tested)}, only tested"
        return _summed_across(thm) or lowering_screen(thm, costed, target)

    def scheduled(diagram: Diagram, own: tuple[Step, ...] | None) -> tuple[TheoremDecl, Diagram]:
        """The theorem scheduling ``diagram`` and the diagram it is about (a pass with the values
        its schedule recomputes in every program bound to names: ``chains.exposed``)."""
        name = decl.name if diagram is forward.diagram else fresh_name(f"{diagram.name}_derived", names)
        here = _with(module, forward.diagram, backs)
        if own is not None:
            attempt = TheoremDecl(name, diagram.name, own, decl.span)
            if proof.check_theorem(here, attempt, lemmas, strict=strict, relations=False).theorem is not None:
                return attempt, diagram
        found = search(here, diagram.name, cost_fn, lemmas=lemmas, theorem_name=name, max_rewrites=1, budget=budget,
                       seconds=seconds, screen=screen)
        best = found.best.theorem
        if diagram is not forward.diagram and found.best.ok and best is not None:
            # a value every program recomputes is hoisted into a first kernel where the model prices that cheaper
            bound = exposed(diagram, best)
            within = _with(module, forward.diagram, [bound if b.name == bound.name else b for b in backs])
            one = found if bound is diagram else search(within, bound.name, cost_fn, lemmas=lemmas,
                                                        theorem_name=name, max_rewrites=1, budget=budget,
                                                        seconds=seconds, screen=screen)
            chained = hoisted(one, within, bound.name, cost_fn, lemmas=lemmas, theorem_name=name,
                              launch_overhead=profile.launch_overhead, max_rewrites=1, budget=budget,
                              seconds=seconds, screen=screen)
            if chained.best.kernels:  # the pass as written stays where the chain does not win
                diagram, found = bound, chained
                backs[:] = [bound if b.name == bound.name else b for b in backs]
        if not found.best.ok:
            return TheoremDecl(name, diagram.name, ()), diagram
        return TheoremDecl(name, diagram.name, found.best.explicit, kernels=found.best.kernels), diagram

    # a chain's kernels cannot be joined with backward kernels (lower.chain): its forward is searched as one kernel
    decls = [scheduled(forward.diagram, None if decl.kernels or long is None else decl.steps)[0],
             *(scheduled(b, None)[0] for b in list(backs))]
    here = _with(module, forward.diagram, backs)
    proved = []
    for d in decls:
        result = proof.check_theorem(here, d, lemmas, strict=strict, relations=False)  # the join decides relations
        if result.theorem is None:
            assert result.failure is not None
            raise NapkinError(error("lower.backward_derived", diagram=d.diagram,
                                    why=f"its schedule is refused: {result.failure.message}"))
        proved.append(result.theorem)
    return DerivedBackward(proved[0], tuple(proved[1:]), _text(here, (forward.diagram, *backs), decls))


def _with(module: Module, forward: Diagram, backs: Sequence[Diagram]) -> Module:
    """``module`` with the derived forward and passes in scope."""
    scope = (*(module.scope_diagrams or module.diagrams), forward, *backs)
    return replace(module, diagrams=(*module.diagrams, forward, *backs), scope_diagrams=scope)


def _text(module: Module, diagrams: Sequence[Diagram], decls: Sequence[TheoremDecl]) -> str:
    axes = {a.name: a for d in diagrams for a in d.axes}
    lines = ["# Derived by napkin_cat.search.backward: a forward saving its statistics, and its backward passes."]
    lines += [f"axis {a.name}" + (f" = {a.size}" if a.size is not None else "") for a in axes.values()]
    for d in diagrams:
        lines += ["", print_diagram(d)]
    for t in decls:
        steps = "".join(f"  {print_step(s)}\n" for s in t.steps)
        kernels = "".join(f"  kernel {', '.join(k.writes)} {{\n" + "".join(f"    {print_step(s)}\n" for s in k.steps)
                          + "  }\n" for k in t.kernels)
        lines += ["", f"theorem {t.name}: {t.diagram} {{\n{steps}{kernels}}}"]
    return "\n".join(lines) + "\n"
