"""UNTRUSTED: fusion boundaries for ``napkin derive`` (README "Chained kernels").

Beside the one-kernel search (``rewrite.search``), two more kinds of plan are candidates:

- **a boundary**: for each binding B of the unfolded diagram, the chain ``kernel B { ... }
  kernel return { ... }`` (``terms.cut``: B written to hbm by the first kernel, read by the
  second), each kernel's steps the best the one-kernel search finds for its piece; priced as
  the two kernels' modelled times plus the profile's ``launch_overhead`` for the second launch;
- **the unfused diagram**: every binding its own kernel with no steps, priced at the cost
  model's unfused baseline (every box its own kernel, a launch overhead for each after the
  first: ``roofline.unfused``), so derive never returns a plan modelled slower than it.

``hoisted`` tries only the boundaries a one-kernel schedule makes worth it (``recomputed``): a
binding whose axes hold a streamed axis and lack a grouped one is recomputed, with everything it
reads loaded again, in every chunk of every program of that group (FlashAttention-2's key pass
recomputes ``D = Σ_d dO·O`` over the queries, and reads O, for every block of keys); cut there, a
first kernel writes it to hbm once and the second reads it.  The derived backward
(``search.backward``) tries them for each pass, and keeps the chain where the model prices it
cheaper, launch included.

Every candidate is a theorem with kernels checked by ``proof.check_theorem`` as ``napkin check``
will check the written file.  The pieces' searches share the caller's budget and time limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from napkin_cat import kernel, ops, terms
from napkin_cat.grad import live
from napkin_cat.proof import check_theorem, partitions
from napkin_cat.search.rewrite import Candidate, Costed, CostFn, ScreenFn, Search, rank, search
from napkin_cat.terms import (
    Box,
    Diagram,
    Expr,
    KernelDecl,
    LemmaDecl,
    Let,
    Module,
    Partition,
    Step,
    TheoremDecl,
    Var,
    fresh_name,
    walk,
)

__all__ = ["UnfusedFn", "exposed", "hoisted", "recomputed", "with_boundaries"]

#: prices a theorem's diagram as the unfused baseline (every box its own kernel)
UnfusedFn = Callable[[kernel.Theorem], Costed]


def with_boundaries(found: Search, module: Module, diagram: str, cost: CostFn, unfused: UnfusedFn | None, *,
                    lemmas: Mapping[str, LemmaDecl], theorem_name: str, launch_overhead: float, max_rewrites: int,
                    budget: int, seconds: float, screen: ScreenFn | None,
                    boundaries: Sequence[str] | None = None) -> Search:
    """``found`` (the one-kernel search) with the chains cut at one binding (each of ``boundaries``;
    by default every binding) and the unfused diagram (with ``unfused``) as candidates too; the
    best of them all (``rewrite.rank``) is the answer.

    ``seconds`` is this phase's window: no piece's search (its pricing) starts after it, the unfused
    diagram is priced whatever it is (the plan derive never does worse than), and where the window
    ends before every boundary was tried the search says so (``stopped`` "time", ``detail``)."""
    started, deadline = time.monotonic(), time.monotonic() + seconds
    whole = kernel.unfold(kernel.refl(theorem_name, module.diagram(diagram))).result
    extra: list[Candidate] = [] if unfused is None else [_unfused(module, whole, diagram, theorem_name, lemmas,
                                                                  unfused)]
    names = [let.names[0] for let in whole.body if boundaries is None or let.names[0] in boundaries]
    untried = 0
    for k, name in enumerate(names):
        if time.monotonic() >= deadline:
            untried = len(names) - k
            break
        try:
            pieces = terms.cut(whole, ((name,), ("return",)), ops.integer_valued)
        except ValueError:  # a binding the outputs do not read through another
            continue
        if not pieces[1].body or any(map(_unbound, pieces)):  # the second kernel would only copy
            continue
        scope = replace(module, diagrams=module.diagrams + pieces,
                        scope_diagrams=(module.scope_diagrams or module.diagrams) + pieces)
        bests = []
        for piece in pieces:
            left = deadline - time.monotonic()
            if left <= 0:  # a piece's search prices its piece whatever its window: none starts past the limit
                break
            part = search(scope, piece.name, cost, lemmas=lemmas, theorem_name=f"{piece.name}_derived",
                          max_rewrites=max_rewrites, budget=max(budget // 8, 1), seconds=left / 2, screen=screen)
            bests.append(part.best)
        if len(bests) < len(pieces):
            untried = len(names) - k
            break
        if all(b.ok for b in bests):
            extra.append(_chain(module, diagram, theorem_name, lemmas, name, bests, launch_overhead, screen))
    fitting = [c for c in (found.best, *extra) if c.ok]
    best = min(fitting, key=rank) if fitting else found.best
    stopped, detail = (found.stopped, found.detail) if not untried else (
        "time", f"{found.detail}; the time limit ended the fusion-boundary phase with {untried} of {len(names)} "
                "boundaries untried")
    return replace(found, best=best, candidates=found.candidates + tuple(extra), stopped=stopped, detail=detail,
                   elapsed=found.elapsed + time.monotonic() - started)


def _recomputed_by(thm: kernel.Theorem) -> Callable[[Expr], bool]:
    """Whether a value of a one-kernel theorem's diagram is recomputed in every chunk of every
    program: its axes hold a streamed axis and lack one the grid holds (a grouped or split axis),
    so it is the same for every program along that axis."""
    grid = {p.axis for p in partitions(thm) if p.kind in ("group", "split")}
    streamed = {p.axis for p in partitions(thm) if p.kind == "stream"}
    return lambda e: isinstance(e, Box) and bool(set(e.axes) & streamed) and bool(grid - set(e.axes))


def exposed(diagram: Diagram, thm: kernel.Theorem) -> Diagram:
    """``diagram`` (unfolded, the source of the one-kernel theorem ``thm``) with each outermost
    value ``thm`` recomputes in every program that is an operand inside a binding bound to a
    name of its own (``h``, ``h_2``, ...), so that a chain can cut there; ``diagram`` itself
    where there is none.  Binding an operand to a name changes no value."""
    again = _recomputed_by(thm)
    taken = {p.name for p in diagram.inputs} | {n for let in diagram.body for n in let.names}
    body: list[Let] = []

    def lift(expr: Expr) -> Expr:
        if again(expr):
            name = fresh_name("h", taken)
            body.append(Let((name,), expr))
            return Var(name, expr.axes)
        return replace(expr, args=tuple(lift(a) for a in expr.args)) if isinstance(expr, Box) else expr

    for let in diagram.body:
        top = let.expr
        body.append(replace(let, expr=top if again(top) or not isinstance(top, Box) else
                            replace(top, args=tuple(lift(a) for a in top.args))))
    if len(body) == len(diagram.body):
        return diagram
    return replace(diagram, body=tuple(body))


def recomputed(thm: kernel.Theorem) -> tuple[str, ...]:
    """The bindings of a one-kernel theorem's (unfolded) diagram that every program recomputes in
    every chunk (``_recomputed_by``); only the outermost of them (read by a binding or output
    that is not one), each a boundary ``hoisted`` tries (``exposed`` binds the operands)."""
    if thm.kernels:
        return ()
    whole = kernel.unfold(kernel.refl(thm.name, thm.source)).result
    again = {let.names[0] for let in whole.body if _recomputed_by(thm)(let.expr)}
    readers = [*((let.names[0], let.expr) for let in whole.body), *((None, out) for out in whole.outputs)]
    return tuple(name for name in (let.names[0] for let in whole.body) if name in again and any(
        reader not in again and any(isinstance(n, Var) and n.name == name for n in walk(expr))
        for reader, expr in readers))


def hoisted(found: Search, module: Module, diagram: str, cost: CostFn, *, lemmas: Mapping[str, LemmaDecl],
            theorem_name: str, launch_overhead: float, max_rewrites: int, budget: int, seconds: float,
            screen: ScreenFn | None) -> Search:
    """``found`` with, as candidates too, the chains that hoist each value its best schedule
    recomputes in every program (``recomputed``) into a first kernel; the best of them all
    (``rewrite.rank``: the model's time, a launch included) is the answer."""
    best = found.best.theorem
    names = recomputed(best) if found.best.ok and best is not None else ()
    if not names:
        return found
    return with_boundaries(found, module, diagram, cost, None, lemmas=lemmas, theorem_name=theorem_name,
                           launch_overhead=launch_overhead, max_rewrites=max_rewrites, budget=budget, seconds=seconds,
                           screen=screen, boundaries=names)


def _unbound(piece: Diagram) -> bool:
    """Does the kernel have a symbolic axis that none of its inputs carries (``onehot[v](L)`` alone)?  Nothing
    would give its lowering the size."""
    carried = {a for p in piece.inputs for a in p.axes}
    return any(a.size is None and a.name not in carried for a in piece.axes)


def _renamed(steps: tuple[Step, ...], suffix: str) -> tuple[Step, ...]:
    """The steps with every symbolic tile renamed ``TILE{suffix}``: two kernels' tiles named apart."""
    return tuple(replace(s, tile=f"{s.tile}{suffix}") if isinstance(s, Partition) and isinstance(s.tile, str) else s
                 for s in steps)


def _checked(module: Module, decl: TheoremDecl, lemmas: Mapping[str, LemmaDecl], kernels: tuple[KernelDecl, ...],
             cost: Costed) -> Candidate:
    result = check_theorem(module, decl, dict(lemmas))
    if result.theorem is None:
        assert result.failure is not None
        return Candidate((), refused=f"refused by the kernel: {result.failure.message}", kernels=kernels)
    return Candidate((), result.theorem, cost, kernels=kernels)


def _chain(module: Module, diagram: str, name: str, lemmas: Mapping[str, LemmaDecl], boundary: str,
           bests: list[Candidate], launch_overhead: float, screen: ScreenFn | None) -> Candidate:
    """Two kernels, ``boundary`` between them, each with its piece's best steps."""
    first, second = bests
    assert first.cost is not None and second.cost is not None
    kernels = (KernelDecl((boundary,), first.explicit), KernelDecl(("return",), _renamed(second.explicit, "2")))
    tiles = {**first.cost.tiles, **{f"{k}2": v for k, v in second.cost.tiles.items()}}
    value = first.cost.value + second.cost.value + launch_overhead
    serial = [c.serial if c.serial is not None else c.value for c in (first.cost, second.cost)]
    costed = Costed(value, True, tiles,
                    f"{value * 1e6:.4g} µs in 2 kernels, `{boundary}` between them in hbm (a launch of "
                    f"{launch_overhead * 1e6:.3g} µs): {first.cost.summary}; then {second.cost.summary}",
                    footprint=max(first.cost.footprint, second.cost.footprint),
                    relaxed=first.cost.relaxed + second.cost.relaxed, serial=sum(serial) + launch_overhead)
    found = _checked(module, TheoremDecl(name, diagram, (), kernels=kernels), lemmas, kernels, costed)
    if found.theorem is not None and screen is not None and (why := screen(found.theorem, costed)):
        return replace(found, refused=why)
    return found


def _unfused(module: Module, whole: Diagram, diagram: str, name: str, lemmas: Mapping[str, LemmaDecl],
             unfused: UnfusedFn) -> Candidate:
    """Every binding its own kernel, unscheduled, priced at the unfused baseline."""
    needed = live(list(whole.body), list(whole.outputs))  # a binding nothing reads is not computed
    read = {n.name for e in [*(let.expr for let in needed), *whole.outputs] for n in walk(e) if isinstance(n, Var)}
    writes = [let.names[0] for let in needed if let.names[0] in read]
    while unbound := [w for w, piece in zip(writes, terms.cut(whole, (*((w,) for w in writes), ("return",)),
                                                              ops.integer_valued), strict=False) if _unbound(piece)]:
        writes = [w for w in writes if w not in unbound]  # computed where it is read instead
    kernels = (*(KernelDecl((w,), ()) for w in writes), KernelDecl(("return",), ()))
    first = check_theorem(module, TheoremDecl(name, diagram, ()), dict(lemmas)).theorem
    assert first is not None  # the diagram itself, no steps
    base = unfused(first)
    costed = replace(base, fits=True, summary=f"{base.summary}; lowered as one kernel per binding")
    return _checked(module, TheoremDecl(name, diagram, (), kernels=kernels), lemmas, kernels, costed)
