"""UNTRUSTED: fusion boundaries for ``napkin derive`` (README "Chained kernels").

Beside the one-kernel search (``rewrite.search``), two more kinds of plan are candidates:

- **a boundary**: for each binding B of the unfolded diagram, the chain ``kernel B { ... }
  kernel return { ... }`` (``terms.cut``: B written to hbm by the first kernel, read by the
  second), each kernel's steps the best the one-kernel search finds for its piece; priced as
  the two kernels' modelled times plus the profile's ``launch_overhead`` for the second launch;
- **the unfused diagram**: every binding its own kernel with no steps, priced at the cost
  model's unfused baseline (every box its own kernel, a launch overhead for each after the
  first: ``roofline.unfused``), so derive never returns a plan modelled slower than it.

Every candidate is a theorem with kernels checked by ``proof.check_theorem`` as ``napkin check``
will check the written file.  The pieces' searches share the caller's budget and time limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from napkin_cat import kernel, ops, terms
from napkin_cat.proof import check_theorem
from napkin_cat.search.rewrite import Candidate, Costed, CostFn, ScreenFn, Search, rank, search
from napkin_cat.terms import Diagram, KernelDecl, LemmaDecl, Module, Partition, Step, TheoremDecl, Var, walk

__all__ = ["UnfusedFn", "with_boundaries"]

#: prices a theorem's diagram as the unfused baseline (every box its own kernel)
UnfusedFn = Callable[[kernel.Theorem], Costed]


def with_boundaries(found: Search, module: Module, diagram: str, cost: CostFn, unfused: UnfusedFn, *,
                    lemmas: Mapping[str, LemmaDecl], theorem_name: str, launch_overhead: float, max_rewrites: int,
                    budget: int, seconds: float, screen: ScreenFn | None) -> Search:
    """``found`` (the one-kernel search) with the chains cut at one binding and the unfused diagram
    as candidates too; the best of them all (``rewrite.rank``) is the answer."""
    started, deadline = time.monotonic(), time.monotonic() + seconds
    whole = kernel.unfold(kernel.refl(theorem_name, module.diagram(diagram))).result
    extra: list[Candidate] = [_unfused(module, whole, diagram, theorem_name, lemmas, unfused)]
    for name in (let.names[0] for let in whole.body):
        if time.monotonic() > deadline:
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
            left = max(deadline - time.monotonic(), 0.0)
            part = search(scope, piece.name, cost, lemmas=lemmas, theorem_name=f"{piece.name}_derived",
                          max_rewrites=max_rewrites, budget=max(budget // 8, 1), seconds=left / 2, screen=screen)
            bests.append(part.best)
        if all(b.ok for b in bests):
            extra.append(_chain(module, diagram, theorem_name, lemmas, name, bests, launch_overhead, screen))
    fitting = [c for c in (found.best, *extra) if c.ok]
    best = min(fitting, key=rank) if fitting else found.best
    return replace(found, best=best, candidates=found.candidates + tuple(extra),
                   elapsed=found.elapsed + time.monotonic() - started)


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
    read = {n.name for e in [*(let.expr for let in whole.body), *whole.outputs] for n in walk(e) if isinstance(n, Var)}
    writes = [let.names[0] for let in whole.body if let.names[0] in read]
    while unbound := [w for w, piece in zip(writes, terms.cut(whole, (*((w,) for w in writes), ("return",)),
                                                              ops.integer_valued), strict=False) if _unbound(piece)]:
        writes = [w for w in writes if w not in unbound]  # computed where it is read instead
    kernels = (*(KernelDecl((w,), ()) for w in writes), KernelDecl(("return",), ()))
    first = check_theorem(module, TheoremDecl(name, diagram, ()), dict(lemmas)).theorem
    assert first is not None  # the diagram itself, no steps
    base = unfused(first)
    costed = replace(base, fits=True, summary=f"{base.summary}; lowered as one kernel per binding")
    return _checked(module, TheoremDecl(name, diagram, (), kernels=kernels), lemmas, kernels, costed)
