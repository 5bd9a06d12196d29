"""UNTRUSTED: the search behind ``napkin derive``.  It proposes proof steps; it never builds
a ``Theorem``.  Every candidate is a ``TheoremDecl`` run through the kernel by
``proof.check_theorem`` exactly as ``napkin check`` will run the written file.

What is searched (architecture §3.1, paper R3-R8):

- **Rewrites**: the lemma library is matched against the diagram.  ``proposals`` walks
  every binding's expression, looking through let-bound names where a lemma's pattern
  needs a box, and proposes ``rewrite LEMMA at NAMES`` with the bindings it looked
  through.  No lemma or box is recognised by name; a proposal the kernel refuses is
  recorded and dropped.  Rewritten diagrams are explored best first (cheapest as
  written first), up to ``max_rewrites`` applications deep.  A rewrite that makes the
  diagram as written costlier is pursued only if it changes how some box treats some
  axis (``axis_roles``), i.e. only if it can open a relabelling: moving work into a form
  the cost model merely under-prices (``contract`` as ``sum`` of a product, say) is not
  an optimisation.  A diagram with the same typed boxes (up to operand order) and the same
  axis roles as one already searched (``contract_comm`` reorders operands) is expanded,
  since a later lemma may need the new order, but its relabellings are not searched again.
- **Relabellings**: ``axis_roles`` reads how every box treats every axis (``kernel.
  treatment``): an axis every box weaves is a group candidate; an axis some box consumes
  and none mixes is a stream candidate.  A ``Plan`` picks groups, stream axes in order
  (each with a preferred accumulator when several are admissible) and one or two memory
  levels, and with two levels which intermediates stay at the outer level (``place``); a
  hill climb from the largest plans moves to the best neighbour (toggle a group; add, drop
  or replace a stream or change its accumulator; add or drop the second level; toggle a
  placement) until none is cheaper.
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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from napkin_cat import kernel, ops
from napkin_cat.diagnostics import NapkinError
from napkin_cat.proof import check_theorem, describe_step
from napkin_cat.terms import (
    Box,
    Const,
    Diagram,
    Expr,
    LemmaDecl,
    Module,
    Partition,
    Place,
    Rewrite,
    Size,
    Step,
    TheoremDecl,
    Var,
    boxes,
    walk,
)

__all__ = ["Candidate", "CostFn", "Costed", "Plan", "ScreenFn", "Search", "accumulator_choices", "axis_roles",
           "batch_axes", "group_axes", "intermediates", "plan_steps", "proposals", "search", "stream_axes"]


@dataclass(frozen=True)
class Costed:
    """A cost model's answer for one checked theorem.

    ``value``: the modelled cost (lower is better; the model's unit, named in ``summary``);
    ``fits``: whether every level's memory bound holds with ``tiles``; ``tiles``: an integer
    for every symbolic tile of the schedule; ``why_not``: the violated capacity if not;
    ``footprint``: the largest fraction of a level's capacity in use (the tie-breaker:
    at equal cost, the schedule that leaves more fast memory free wins).
    """

    value: float
    fits: bool
    tiles: Mapping[str, int]
    summary: str
    why_not: str = ""
    footprint: float = 0.0


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
        return "; ".join(describe_step(s) for s in self.explicit) or "no steps (the diagram as written)"


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
        ranked = sorted((c for c in self.candidates if c.ok and c is not self.best), key=_rank)
        costed = [c for c in self.candidates if c.cost is not None and not c.ok]
        screened = sorted((c for c in costed if c.refused is not None and c.cost and c.cost.fits), key=_rank)
        unfit = sorted((c for c in costed if c.refused is None), key=_rank)
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


def _rank(c: Candidate) -> tuple[float, float, int, int, str]:
    """Cheapest first; at equal cost the smaller footprint, then the simpler proof."""
    assert c.cost is not None
    names = sum(len(s.at) for s in c.steps if isinstance(s, Rewrite))
    return (c.cost.value, c.cost.footprint, len(c.steps), names, c.describe())


# ---- lemma matching -----------------------------------------------------------------------


class _Matcher:
    """First-order matching of a lemma's left side, looking through let-bound names.

    The kernel's instantiation rule matches the same way (injective axis map, variables
    bound to sub-terms) but only on the term with the named bindings already inlined;
    this search-side matcher also decides *which* names to inline, and stays out of the
    trusted kernel, which re-checks every proposal anyway.
    """

    def __init__(self, defs: Mapping[str, Expr]):
        self.defs = defs
        self.vars: dict[str, Expr] = {}
        self.axes: dict[str, str] = {}
        self.through: list[str] = []

    def axis(self, pattern: str, actual: str) -> bool:
        if pattern in self.axes:
            return self.axes[pattern] == actual
        if actual in self.axes.values():
            return False
        self.axes[pattern] = actual
        return True

    def axis_list(self, pattern: tuple[str, ...], actual: tuple[str, ...]) -> bool:
        return len(pattern) == len(actual) and all(self.axis(p, a) for p, a in zip(pattern, actual, strict=True))

    def expr(self, pattern: Expr, actual: Expr) -> bool:
        if isinstance(pattern, Var):
            bound = self.vars.setdefault(pattern.name, actual)
            return bound == actual
        if isinstance(actual, Var) and actual.name in self.defs and actual.name not in self.through:
            self.through.append(actual.name)
            return self.expr(pattern, self.defs[actual.name])
        if isinstance(pattern, Const):
            return isinstance(actual, Const) and pattern.value == actual.value
        if isinstance(pattern, Size):
            return isinstance(actual, Size) and self.axis(pattern.axis, actual.axis)
        return (isinstance(pattern, Box) and isinstance(actual, Box) and pattern.op == actual.op
                and pattern.params == actual.params and actual.index is None and len(pattern.args) == len(actual.args)
                and self.axis_list(pattern.target, actual.target) and self.axis_list(pattern.out, actual.out)
                and all(self.expr(p, a) for p, a in zip(pattern.args, actual.args, strict=True)))


def proposals(diagram: Diagram, lemmas: Mapping[str, LemmaDecl]) -> list[Rewrite]:
    """Every ``rewrite LEMMA at NAMES`` whose left side matches a sub-term of a binding.

    The root of each proposal is a single-name binding; the other names are the bindings
    the match looked through (the kernel inlines exactly those).  Proposals are in body
    order, then library order; duplicates are dropped.  Whether a proposal is admissible
    (weaving of the matched variables, types) is the kernel's call.
    """
    defs = {let.names[0]: let.expr for let in diagram.body if len(let.names) == 1}
    order = {name: i for i, name in enumerate(n for let in diagram.body for n in let.names)}
    found: dict[tuple[str, tuple[str, ...]], Rewrite] = {}
    for let in diagram.body:
        if len(let.names) != 1:
            continue
        for node in walk(let.expr):
            if isinstance(node, Var):
                continue  # a match through a name is proposed at that name's own binding
            for lemma in lemmas.values():
                match = _Matcher(defs)
                if match.expr(lemma.lhs, node):
                    at = tuple(sorted(set(match.through) - {let.names[0]}, key=order.__getitem__)) + let.names
                    found.setdefault((lemma.name, at), Rewrite(lemma.name, at))
    return list(found.values())


# ---- relabelling candidates ---------------------------------------------------------------


def axis_roles(diagram: Diagram) -> dict[str, frozenset[str]]:
    """For each axis that reaches a box, how the boxes treat it (weaves, consumes, mixes).

    Axes are listed in order of first appearance (inputs, then boxes).  The diagram is
    expected unfolded (``kernel.unfold``): diagrams used as boxes are not looked into.
    """
    roles: dict[str, set[str]] = {a: set() for p in diagram.inputs for a in p.axes}
    for _, node in boxes(diagram):
        if not isinstance(node, Box):
            continue
        for axis in dict.fromkeys(node.axes + node.target + tuple(a for x in node.args for a in x.axes)):
            how = kernel.treatment(node, axis)
            if how != "absent":
                roles.setdefault(axis, set()).add(how)
    return {a: frozenset(r) for a, r in roles.items() if r}


def group_axes(diagram: Diagram) -> tuple[str, ...]:
    """Axes every box weaves: tiles along them are independent (R3)."""
    return tuple(a for a, r in axis_roles(diagram).items() if r == {"weaves"})


def stream_axes(diagram: Diagram) -> tuple[str, ...]:
    """Axes some box consumes and none mixes, and no output carries: stream candidates (R4).

    An axis that survives to an output is still needed after its consumption (a second
    pass over it), which no accumulator can stream.
    """
    outputs = {a for axes in diagram.out_types for a in axes}
    return tuple(a for a, r in axis_roles(diagram).items()
                 if "consumes" in r and "mixes" not in r and a not in outputs)


def batch_axes(diagram: Diagram) -> tuple[str, ...]:
    """Axes on every (non-scalar) input and every output: independent problems.  No array
    is shared across them, so sub-tiling one at a faster level changes no transfer."""
    arrays = [p.axes for p in diagram.inputs if p.axes] + list(diagram.out_types)
    return tuple(a for a in (arrays[0] if arrays else ()) if all(a in axes for axes in arrays))


def accumulator_choices(diagram: Diagram, axis: str) -> tuple[str, ...]:
    """Accumulators admissible for some box consuming ``axis`` (the ``via`` choices)."""
    names: list[str] = []
    for _, node in boxes(diagram):
        if isinstance(node, Box) and kernel.treatment(node, axis) == "consumes":
            names.extend(ops.accumulators_for(node.op, node.params))
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True, order=True)
class Plan:
    """A relabelling choice: grouped axes; streamed axes, outermost first, each with its
    preferred accumulator (None: the kernel's first certified one); levels (1 or 2); and
    with two levels the intermediates kept at the outer one (R2; by default an
    intermediate lives at the innermost partition's level)."""

    groups: tuple[str, ...] = ()
    streams: tuple[tuple[str, str | None], ...] = ()
    levels: int = 1
    placed: tuple[str, ...] = ()


#: the memory level of each partition level, and the tile-name prefixes used there
_LEVELS: tuple[tuple[str, str, str], ...] = (("smem", "g", "s"), ("reg", "w", "r"))


def plan_steps(plan: Plan, diagram: Diagram) -> tuple[Partition | Place, ...]:
    """The steps of ``plan``: partitions, outer level first, groups before the stream; then
    one ``place`` step for the intermediates kept at the outer level.

    Tile sizes are symbols named after the axis (``gq`` groups q at smem, ``sx`` streams x,
    ``wq``/``rx`` the same at registers), renamed apart from the diagram's axes.  The second
    level re-partitions the same axes except batch axes (``batch_axes``).
    """
    taken = set(diagram.axis_sizes()) | {a for p in diagram.inputs for a in p.axes}
    batch = batch_axes(diagram)
    steps: list[Partition | Place] = []
    for depth, (level, gprefix, sprefix) in enumerate(_LEVELS[: plan.levels]):
        for axis in plan.groups:
            if depth > 0 and axis in batch:
                continue  # sub-tiling an independent-problem axis saves nothing
            steps.append(Partition("group", axis, _fresh(gprefix + axis, taken), level))
        for axis, via in plan.streams:
            steps.append(Partition("stream", axis, _fresh(sprefix + axis, taken), level, via))
    if plan.placed and plan.levels > 1:
        steps.append(Place(plan.placed, _LEVELS[0][0]))
    return tuple(steps)


def intermediates(diagram: Diagram) -> tuple[str, ...]:
    """Let-bound arrays that are not returned as they are: the placement candidates."""
    returned = {o.name for o in diagram.outputs if isinstance(o, Var)}
    return tuple(n for let in diagram.body for n in let.names if n not in returned)


def _fresh(name: str, taken: set[str]) -> str:
    candidate = name
    for k in itertools.count(2):
        if candidate not in taken:
            break
        candidate = f"{name}_{k}"
    taken.add(candidate)
    return candidate


def _neighbours(plan: Plan, diagram: Diagram) -> Iterator[Plan]:
    groups, candidates = group_axes(diagram), stream_axes(diagram)
    for axis in groups:
        toggled = tuple(a for a in groups if (a in plan.groups) != (a == axis))
        yield replace(plan, groups=toggled)
    streamed = [a for a, _ in plan.streams]
    for k, (axis, via) in enumerate(plan.streams):
        yield replace(plan, streams=plan.streams[:k] + plan.streams[k + 1:])  # drop it
        for other in candidates:  # stream another axis in its place
            if other not in streamed:
                yield replace(plan, streams=(*plan.streams[:k], (other, None), *plan.streams[k + 1:]))
        for choice in (None, *accumulator_choices(diagram, axis)):
            if choice != via:
                yield replace(plan, streams=(*plan.streams[:k], (axis, choice), *plan.streams[k + 1:]))
    for other in candidates:  # stream one more axis, innermost
        if other not in streamed:
            yield replace(plan, streams=(*plan.streams, (other, None)))
    if plan.groups or plan.streams:
        yield replace(plan, levels=3 - plan.levels, placed=())
    if plan.levels > 1:
        for name in intermediates(diagram):
            placed = tuple(n for n in intermediates(diagram) if (n in plan.placed) != (n == name))
            yield replace(plan, placed=placed)


def _starts(diagram: Diagram) -> list[Plan]:
    """Every group candidate grouped, with each single stream candidate, and with none."""
    groups = group_axes(diagram)
    return [Plan(groups, ((axis, None),)) for axis in stream_axes(diagram)] + [Plan(groups)]


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
            best = min((c for c in self.seen.values() if c.ok), key=_rank, default=None)
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
    for plan in _starts(diagram):
        current = state.evaluate(prefix + plan_steps(plan, diagram))
        while True:
            moves = [(state.evaluate(prefix + plan_steps(p, diagram)), p) for p in _neighbours(plan, diagram)]
            better = [(c, p) for c, p in moves if c.ok and (not current.ok or _rank(c) < _rank(current))]
            if not better:
                break
            current, plan = min(better, key=lambda cp: _rank(cp[0]))


def _signature(diagram: Diagram) -> tuple[object, ...]:
    """The typed boxes of a diagram up to operand order, with its axis roles."""
    typed = sorted(repr((node.op, node.target, node.out, node.params, node.index, node.axes,
                         sorted(a.axes for a in node.args)))
                   for _, node in boxes(diagram) if isinstance(node, Box))
    return tuple(typed), tuple(sorted(axis_roles(diagram).items()))


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
            signature = _signature(current)
            if signature not in climbed:  # a rewrite that only reorders operands is expanded, not re-climbed
                climbed.add(signature)
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
    best = min((c for c in state.seen.values() if c.ok), key=_rank, default=baseline)
    if baseline.ok and best.cost is not None and baseline.cost is not None and \
            best.cost.value >= baseline.cost.value:
        best = baseline  # only a strictly cheaper schedule replaces a diagram that already fits
    return Search(best, baseline, tuple(state.seen.values()), stopped, detail, time.monotonic() - started)
