"""UNTRUSTED: the search behind ``napkin derive``.  It proposes proof steps; it never builds
a ``Theorem``.  Every candidate is a ``TheoremDecl`` run through the kernel by
``proof.check_theorem`` exactly as ``napkin check`` will run the written file.

What is searched (the relabellings ``kernel`` admits, R3-R8, read off ``ops.treatment``):

The moves (lemma proposals by matching, relabelling plans from the axis roles) are in
``napkin_cat.search.moves``; this module runs them through the kernel and the cost function.

- **Rewrites**: the lemma library is matched against the diagram (``moves.proposals``);
  a proposal the kernel refuses is recorded and dropped.  Rewritten diagrams are explored best first (cheapest as
  written first), up to ``max_rewrites`` applications deep.  A rewrite that makes the
  diagram as written costlier is pursued only if it changes how some box treats some
  axis (``axis_roles``), i.e. only if it can open a relabelling: moving work into a form
  the cost model merely under-prices (``contract`` as ``sum`` of a product, say) is not
  an optimisation.  A diagram with the same typed boxes (up to operand order) and the same
  axis roles as one already searched (``contract_comm`` reorders operands) is expanded,
  since a later lemma may need the new order, but its relabellings are not searched again.
- **Relabellings**: on each rewritten diagram a hill climb over ``moves.Plan`` (groups,
  ordered streams and their accumulators, one or two levels, placements) starts from the
  largest plans and moves to the best neighbour until none is cheaper.
- **Cost**: one pluggable callable ``CostFn`` (the cost model, or anything else in
  tests) answers for a checked theorem its modelled cost, whether it fits the memory
  capacities, and integer tile sizes.  A kernel-accepted candidate that fits may still be
  screened out by ``screen`` (the caller's floating-point and lowering checks); it stays in
  the report with why.

The search stops when every reachable diagram was explored (``saturated``), after
``budget`` candidates (``budget``) or after ``seconds`` (``time``), and says which.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from napkin_cat import kernel
from napkin_cat.diagnostics import NapkinError
from napkin_cat.proof import check_theorem, describe_step
from napkin_cat.search.moves import Plan, axis_roles, neighbours, plan_steps, proposals, signature, starts
from napkin_cat.terms import Diagram, KernelDecl, LemmaDecl, Module, Partition, Rewrite, Step, TheoremDecl

__all__ = ["Candidate", "CostFn", "Costed", "ScreenFn", "Search", "rank", "search"]


@dataclass(frozen=True)
class Costed:
    """A cost model's answer for one checked theorem.

    ``value``: the modelled cost (lower is better; the model's unit, named in ``summary``);
    ``fits``: whether every level's memory bound holds with ``tiles``; ``tiles``: an integer
    for every symbolic tile of the schedule; ``why_not``: the violated capacity if not;
    ``serial``: the cost with transfers and compute added rather than overlapped (the first
    tie-breaker: at equal ``value``, the plan that moves and computes less in all wins, as the
    tile search ranks tiles); ``footprint``: the largest fraction of a level's capacity in use
    (the next: at equal cost, the schedule that leaves more fast memory free wins); ``relaxed``: the
    hardware's preferred tile multiples that ``tiles`` do not meet (none met them); the cost model
    prices them (``optimise.padding``: such tiles run as if padded to the multiples), and ``rank``
    still puts such a plan after every plan without any.
    """

    value: float
    fits: bool
    tiles: Mapping[str, int]
    summary: str
    why_not: str = ""
    footprint: float = 0.0
    relaxed: tuple[str, ...] = ()
    serial: float | None = None


#: the pluggable cost function: a checked theorem -> its cost
CostFn = Callable[[kernel.Theorem], Costed]
#: an optional extra screen on accepted theorems that fit, given their cost (chosen tiles):
#: None if fine, else why it is rejected
ScreenFn = Callable[[kernel.Theorem, Costed], "str | None"]


@dataclass(frozen=True)
class Candidate:
    """One proposed step list and what happened to it: a theorem and its cost, or a refusal."""

    steps: tuple[Step, ...]
    theorem: kernel.Theorem | None = None
    cost: Costed | None = None
    refused: str | None = None
    #: a chain's kernels (``search.chains``), each with its steps as the kernel settled them
    kernels: tuple[KernelDecl, ...] = ()

    @property
    def ok(self) -> bool:
        """Kernel-accepted, not screened out, costed, and fits."""
        return self.refused is None and self.cost is not None and self.cost.fits

    @property
    def explicit(self) -> tuple[Step, ...]:
        """The steps with each stream's accumulator as the kernel chose it (``via``)."""
        if self.theorem is None:
            return self.steps
        chosen = iter(self.theorem.schedule.partitions)
        return tuple(next(chosen) if isinstance(step, Partition) else step for step in self.steps)

    def describe(self) -> str:
        kernels = [f"kernel {', '.join(k.writes)} {{{'; '.join(describe_step(s) for s in k.steps)}}}"
                   for k in self.kernels]
        return "; ".join([*(describe_step(s) for s in self.explicit), *kernels]) or "no steps (the diagram as written)"


@dataclass(frozen=True)
class Search:
    """The outcome: the best candidate, the unscheduled baseline, everything evaluated."""

    best: Candidate
    baseline: Candidate
    candidates: tuple[Candidate, ...]
    stopped: str
    detail: str
    elapsed: float

    @property
    def helps(self) -> bool:
        """Does the best candidate cost strictly less than the diagram as written?"""
        if self.best is self.baseline or self.best.cost is None:
            return False
        return self.baseline.cost is None or not self.baseline.ok or self.best.cost.value < self.baseline.cost.value

    def runners_up(self, limit: int = 5) -> list[Candidate]:
        """The next best fitting candidates, then those that fit but were screened out, then
        the closest that do not fit, then the kernel's and the cost model's refusals."""
        ranked = sorted((c for c in self.candidates if c.ok and c is not self.best), key=rank)
        costed = [c for c in self.candidates if c.cost is not None and not c.ok]
        screened = sorted((c for c in costed if c.refused is not None and c.cost and c.cost.fits), key=rank)
        unfit = sorted((c for c in costed if c.refused is None), key=rank)
        refused = [c for c in self.candidates if c.cost is None]
        shown: list[Candidate] = []
        seen = {self.best.describe(), _schedule_key(self.best)}
        for c in ranked + screened + unfit + refused:
            # the same proof reached with and without an explicit `via`, or the same schedule at the same
            # cost after a different neutral rewrite (contract_comm, say), is shown once
            keys = {c.describe(), _schedule_key(c)}
            if not keys & seen:
                seen |= keys
                shown.append(c)
        return shown[:limit]


def _schedule_key(c: Candidate) -> str:
    """The relabelling as the kernel settled it (partitions, placements, the accumulator of
    every consuming box) and its cost: two proofs with the same key differ only in a
    neutral rewrite or in how ``via`` was spelled."""
    if c.theorem is None or c.cost is None or not c.theorem.steps:
        return c.describe()
    sched = c.theorem.schedule
    parts = [describe_step(replace(p, via=None)) for p in sched.partitions]
    places = [describe_step(p) for p in sched.placements]
    chosen = [f"{axis}:{name}" for axis, _, name in c.theorem.accumulators]
    return f"{parts} {places} {chosen} @ {c.cost.value:.6g}"


def rank(c: Candidate) -> tuple[bool, float, float, float, int, int, int, str]:
    """Tiles that meet the hardware's preferred multiples first, then cheapest (tiles that lack
    them priced as padded to them: ``optimise.padding``); at equal cost the smaller serial cost,
    then the smaller footprint, then fewer kernels, then the simpler proof."""
    assert c.cost is not None
    steps = c.steps + tuple(s for k in c.kernels for s in k.steps)
    names = sum(len(s.at) for s in steps if isinstance(s, Rewrite))
    serial = c.cost.value if c.cost.serial is None else c.cost.serial
    # to 9 significant digits, as the tile search ranks: equal models differ in the last bits
    value, serial = (float(f"{v:.9g}") for v in (c.cost.value, serial))
    return (bool(c.cost.relaxed), value, serial, c.cost.footprint, len(c.kernels), len(steps), names, c.describe())


# ---- the search -----------------------------------------------------------------------------


@dataclass
class _State:
    module: Module
    decl: TheoremDecl
    lemmas: Mapping[str, LemmaDecl]
    cost: CostFn
    screen: ScreenFn | None
    budget: int
    deadline: float
    progress: Callable[[str], None] | None
    seen: dict[tuple[Step, ...], Candidate] = field(default_factory=dict)
    stop: str | None = None
    reported: float = field(default_factory=time.monotonic)

    def evaluate(self, steps: tuple[Step, ...]) -> Candidate:
        if steps in self.seen:
            return self.seen[steps]
        if not self.seen:
            pass  # the first candidate (the diagram as written) is always evaluated
        elif len(self.seen) >= self.budget:
            self.stop = "budget"
        elif time.monotonic() > self.deadline:
            self.stop = "time"
        if self.stop:
            raise _Stop
        result = check_theorem(self.module, replace(self.decl, steps=steps), dict(self.lemmas))
        if result.theorem is None:
            assert result.failure is not None
            cand = Candidate(steps, refused=f"refused by the kernel at step {result.step}: {result.failure.message}")
        else:
            try:
                cost = self.cost(result.theorem)
            except (NapkinError, ValueError) as exc:  # e.g. a level the hardware lacks (HardwareError)
                cand = Candidate(steps, result.theorem, refused=f"the cost model refused it: {exc}")
            else:
                why = self.screen(result.theorem, cost) if self.screen and cost.fits else None
                cand = Candidate(steps, result.theorem, cost, refused=why)
        self.seen[steps] = cand
        now = time.monotonic()
        if self.progress and now - self.reported >= _PROGRESS_EVERY:
            self.reported = now
            best = min((c for c in self.seen.values() if c.ok), key=rank, default=None)
            self.progress(f"{len(self.seen)} candidates checked; best so far: "
                          + (f"{best.describe()} ({best.cost.summary})" if best and best.cost else "none"))
        return cand


#: seconds between progress reports (the first comes after this long, so short searches are quiet)
_PROGRESS_EVERY = 2.0


class _Stop(Exception):
    pass


def _climb(state: _State, prefix: tuple[Step, ...], diagram: Diagram) -> None:
    """Hill-climb over plans on one (rewritten) diagram from each start to a local optimum;
    every candidate it evaluates is recorded in ``state``."""
    for plan in starts(diagram):
        current = _plan(state, prefix, plan, diagram)
        while True:
            moves = [(_plan(state, prefix, p, diagram), p) for p in neighbours(plan, diagram)]
            better = [(c, p) for c, p in moves if c.ok and (not current.ok or rank(c) < rank(current))]
            if not better:
                break
            current, plan = min(better, key=lambda cp: rank(cp[0]))


def _plan(state: _State, prefix: tuple[Step, ...], plan: Plan, diagram: Diagram) -> Candidate:
    """The candidate of ``plan``; where no integer tiles that divide the axes fit (ragged
    sizes: q=2000 has no power-of-two tile that is x64), the same plan with ``pad`` partitions
    (masked ragged tiles) if that one fits.  A plan with a split is also tried with ``pad``
    partitions (blocks sized to the SMs, each block's last chunk masked: ``optimise``; both
    targets lower them), kept where it is modelled cheaper."""
    plain = state.evaluate(prefix + plan_steps(plan, diagram))
    if plan.split is not None:
        ragged = state.evaluate(prefix + plan_steps(plan, diagram, pad=True))
        cheaper = ragged.ok and ragged.cost is not None and (
            not plain.ok or plain.cost is None or ragged.cost.value < plain.cost.value * (1 - 1e-9))
        return ragged if cheaper else plain
    if plain.ok or plain.cost is None or plain.cost.tiles or not plain.theorem or not plain.theorem.schedule.partitions:
        return plain
    padded = state.evaluate(prefix + plan_steps(plan, diagram, pad=True))
    return padded if padded.ok else plain


def _costlier(child: Candidate, parent: Costed | None) -> bool:
    """Does a rewrite make the diagram as written (no relabelling) cost more?"""
    if child.cost is None or parent is None:
        return False
    return child.cost.value > parent.value * (1 + 1e-9)


def search(module: Module, diagram: str, cost: CostFn, *, lemmas: Mapping[str, LemmaDecl],
           theorem_name: str | None = None, max_rewrites: int = 2, budget: int = 2000, seconds: float = 60.0,
           screen: ScreenFn | None = None, progress: Callable[[str], None] | None = None) -> Search:
    """Search rewrites and relabellings of ``diagram`` for the cheapest fitting schedule.

    Raises ``KeyError`` if ``module`` has no such diagram.  The baseline (no steps) is
    always evaluated first; it is the answer when nothing else is cheaper.
    """
    source = module.diagram(diagram)
    decl = TheoremDecl(theorem_name or f"{diagram}_derived", diagram, ())
    state = _State(module, decl, lemmas, cost, screen, max(budget, 1), time.monotonic() + seconds, progress)
    started = time.monotonic()
    baseline = state.evaluate(())
    counter = itertools.count()
    frontier: list[tuple[float, int, int, tuple[Step, ...], Diagram]] = []
    root = baseline.theorem.result if baseline.theorem else kernel.unfold(kernel.refl(decl.name, source)).result
    heapq.heappush(frontier, (0.0, 0, next(counter), (), root))
    explored: set[Diagram] = {root}
    beyond = pruned = 0
    climbed: set[tuple[object, ...]] = set()
    try:
        while frontier:
            _, depth, _, prefix, current = heapq.heappop(frontier)
            here = state.evaluate(prefix).cost
            key = signature(current)
            if key not in climbed:  # a rewrite that only reorders operands is expanded, not re-climbed
                climbed.add(key)
                _climb(state, prefix, current)
            if depth >= max_rewrites:
                beyond += len(proposals(current, lemmas))
                continue
            for step in proposals(current, lemmas):
                child = state.evaluate((*prefix, step))
                if child.theorem is None or child.theorem.result in explored:
                    continue
                explored.add(child.theorem.result)
                if _costlier(child, here) and axis_roles(child.theorem.result) == axis_roles(current):
                    pruned += 1
                    continue
                # cost-guided: a rewrite that makes the unscheduled diagram cheaper is explored first
                priority = child.cost.value if child.cost is not None else float("inf")
                heapq.heappush(frontier, (priority, depth + 1, next(counter), child.steps, child.theorem.result))
    except _Stop:
        pass
    stopped = state.stop or "saturated"
    detail = {
        "saturated": f"every diagram reachable with up to {max_rewrites} rewrites was explored"
                     + (f"; {beyond} lemma applications beyond that bound were not" if beyond else "")
                     + (f"; {pruned} rewrites that made the diagram costlier without opening a new relabelling "
                        "were not pursued" if pruned else ""),
        "budget": f"the budget of {state.budget} candidates was spent ({len(frontier)} diagrams unexplored)",
        "time": f"the time limit of {seconds:g} s was reached ({len(frontier)} diagrams unexplored)",
    }[stopped]
    best = min((c for c in state.seen.values() if c.ok), key=rank, default=baseline)
    if baseline.ok and best.cost is not None and baseline.cost is not None and \
            best.cost.value >= baseline.cost.value:
        best = baseline  # only a strictly cheaper schedule replaces a diagram that already fits
    return Search(best, baseline, tuple(state.seen.values()), stopped, detail, time.monotonic() - started)
