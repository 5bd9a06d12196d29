"""The moves of the schedule search (``rewrite.search``): lemma applications found by
matching, and relabelling plans built from how the boxes treat the axes.  UNTRUSTED: it
proposes proof steps; the kernel decides.

- ``proposals``: every ``rewrite LEMMA at NAMES`` whose left side matches a sub-term of a
  binding, looking through let-bound names where the pattern needs a box.  No lemma or
  box is recognised by name.
- ``axis_roles``: how the boxes treat each axis (``ops.treatment``), which gives the
  group candidates (every box weaves the axis, R3), the scan candidates (every box weaves
  it but the scans along it, cumsum and linrec, which carry a state from chunk to chunk)
  and the stream candidates (some box consumes it, none mixes it, no output carries it, R4).
- ``Plan`` / ``plan_steps``: a relabelling (groups; scans; ordered streams, each with a
  preferred accumulator; optionally one streamed axis split across programs; one or two
  levels; placements) as proof steps with symbolic tile names; ``neighbours`` and
  ``starts`` define the hill climb over plans.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace

from napkin_cat import kernel, ops
from napkin_cat.terms import Box, Diagram, Expr, LemmaDecl, Partition, Place, Rewrite, Var, boxes, walk

__all__ = ["Plan", "accumulator_choices", "axis_roles", "batch_axes", "group_axes", "intermediates", "neighbours",
           "plan_steps", "proposals", "scan_axes", "signature", "starts", "stream_axes"]


# ---- lemma matching -----------------------------------------------------------------------


def _looked_through(lhs: Expr, node: Expr, defs: Mapping[str, Expr]) -> list[str] | None:
    """The let names the kernel's matcher looks through to match ``lhs`` at ``node``, or None.

    The kernel matches on a term with the named bindings already inlined; the search decides
    *which* names to inline by letting the same matcher (``kernel.match``) unfold a name
    where the pattern expects a box or a constant, and the kernel re-checks every proposal.
    """
    through: list[str] = []

    def unfold(expr: Expr) -> Expr:
        while isinstance(expr, Var) and expr.name in defs and expr.name not in through:
            through.append(expr.name)
            expr = defs[expr.name]
        return expr

    return through if kernel.match(lhs, node, {}, {}, unfold) else None


def proposals(diagram: Diagram, lemmas: Mapping[str, LemmaDecl]) -> list[Rewrite]:
    """Every ``rewrite LEMMA at NAMES`` whose left side matches a sub-term of a binding.

    The root of each proposal is a single-name binding or ``return`` (the returned
    expressions); the other names are the bindings the match looked through (the kernel
    inlines exactly those).  Proposals are in body order, then library order; duplicates
    are dropped.  Whether a proposal is admissible (weaving of the matched variables,
    types) is the kernel's call.
    """
    defs = diagram.bindings()
    order = {name: i for i, name in enumerate(n for let in diagram.body for n in let.names)}
    roots = [(let.names[0], let.expr) for let in diagram.body if len(let.names) == 1]
    found: dict[tuple[str, tuple[str, ...]], Rewrite] = {}
    for root, expr in roots + [("return", out) for out in diagram.outputs]:
        for node in walk(expr):
            if isinstance(node, Var):
                continue  # a match through a name is proposed at that name's own binding
            for lemma in lemmas.values():
                through = _looked_through(lemma.lhs, node, defs)
                if through is not None:
                    at = (*sorted(set(through) - {root}, key=order.__getitem__), root)
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
            how = ops.treatment(node, axis)
            if how != "absent":
                roles.setdefault(axis, set()).add(how)
    return {a: frozenset(r) for a, r in roles.items() if r}


def group_axes(diagram: Diagram) -> tuple[str, ...]:
    """Axes every box weaves: tiles along them are independent (R3)."""
    return tuple(a for a, r in axis_roles(diagram).items() if r == {"weaves"})


def scan_axes(diagram: Diagram) -> tuple[str, ...]:
    """Axes some box scans (``ops.scans_along``: cumsum, linrec) and every other box weaves:
    ``scan`` candidates (chunks in order, each scan carrying its value into the next chunk)."""
    scanned: dict[str, bool] = {}
    for _, node in boxes(diagram):
        if isinstance(node, Box):
            for axis in node.target:
                scanned[axis] = scanned.get(axis, True) and ops.scans_along(node, axis)
    roles = axis_roles(diagram)
    return tuple(a for a, r in roles.items() if scanned.get(a) and r == {"weaves", "mixes"})


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
        if isinstance(node, Box) and ops.treatment(node, axis) == "consumes":
            names.extend(ops.accumulators_for(node.op, node.params))
    return tuple(dict.fromkeys(names))


@dataclass(frozen=True, order=True)
class Plan:
    """A relabelling choice: grouped axes; scanned axes (chunks in order, ``scan AXIS by TILE``
    after the groups, at the outer level only); streamed axes, outermost first, each with its
    preferred accumulator (None: the kernel's first certified one); levels (1 or 2); with
    two levels the intermediates kept at the outer one (R2; by default an intermediate
    lives at the innermost partition's level); and ``split``, a streamed axis whose stream
    also runs in parallel programs, one per block, their partial states combined
    afterwards (``split AXIS by TILE via ACC`` above every other partition, with the
    stream's accumulator: README "Split reductions")."""

    groups: tuple[str, ...] = ()
    streams: tuple[tuple[str, str | None], ...] = ()
    levels: int = 1
    placed: tuple[str, ...] = ()
    split: str | None = None
    scans: tuple[str, ...] = ()


#: the memory level of each partition level, and the tile-name prefixes used there
_LEVELS: tuple[tuple[str, str, str], ...] = (("smem", "g", "s"), ("reg", "w", "r"))
#: the tile-name prefix of a scan's chunks
_SCAN = "c"
#: the tile-name prefix of a split's blocks (they stay in hbm, one per program)
_SPLIT = "k"


def plan_steps(plan: Plan, diagram: Diagram, pad: bool = False) -> tuple[Partition | Place, ...]:
    """The steps of ``plan``: the split, if any (its blocks sit in hbm, above every other
    partition: R8); partitions, outer level first, groups before the stream; then one
    ``place`` step for the intermediates kept at the outer level.  With ``pad`` every
    partition is ``pad`` (masked ragged tiles: no tile need divide its axis).

    Tile sizes are symbols named after the axis (``kx`` splits x, ``gq`` groups q at smem,
    ``sx`` streams x, ``wq``/``rx`` the same at registers), renamed apart from the diagram's
    axes.  The second level re-partitions the same axes except batch axes (``batch_axes``).
    A split names the accumulator its stream names (the kernel requires the nested stream
    to continue the split's state); a plan whose split axis is not streamed has no split.
    """
    taken = set(diagram.axis_sizes()) | {a for p in diagram.inputs for a in p.axes}
    batch = batch_axes(diagram)
    steps: list[Partition | Place] = []
    for axis, via in plan.streams:
        if axis == plan.split:
            steps.append(Partition("split", axis, _fresh(_SPLIT + axis, taken), "hbm", via, pad=pad))
    for depth, (level, gprefix, sprefix) in enumerate(_LEVELS[: plan.levels]):
        for axis in plan.groups:
            if depth > 0 and axis in batch:
                continue  # sub-tiling an independent-problem axis saves nothing
            steps.append(Partition("group", axis, _fresh(gprefix + axis, taken), level, pad=pad))
        for axis in plan.scans if depth == 0 else ():
            steps.append(Partition("scan", axis, _fresh(_SCAN + axis, taken), level, pad=pad))
        for axis, via in plan.streams:
            steps.append(Partition("stream", axis, _fresh(sprefix + axis, taken), level, via, pad=pad))
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


def neighbours(plan: Plan, diagram: Diagram) -> Iterator[Plan]:
    """The plans one move away: toggle a group or a scan (a plan that scans streams nothing: both
    lowerings walk the scanned axis as the kernel's one stream); drop, replace or add a stream, or change
    its accumulator; split a streamed axis across programs, or stop splitting it; add or
    drop the second level; toggle a placement.  Dropping or replacing the split axis's
    stream drops the split with it."""
    groups, candidates = group_axes(diagram), stream_axes(diagram)
    for axis in groups:
        toggled = tuple(a for a in groups if (a in plan.groups) != (a == axis))
        yield replace(plan, groups=toggled)
    scans = scan_axes(diagram)
    for axis in scans:  # a scan is the kernel's one walked axis in both lowerings: it streams nothing else
        yield replace(plan, scans=tuple(a for a in scans if (a in plan.scans) != (a == axis)), streams=(), split=None)
    if plan.scans:
        yield from _levels_and_placements(plan, diagram)
        return
    streamed = [a for a, _ in plan.streams]
    for k, (axis, via) in enumerate(plan.streams):
        kept = None if axis == plan.split else plan.split
        yield replace(plan, streams=plan.streams[:k] + plan.streams[k + 1:], split=kept)  # drop it
        for other in candidates:  # stream another axis in its place
            if other not in streamed:
                yield replace(plan, streams=(*plan.streams[:k], (other, None), *plan.streams[k + 1:]), split=kept)
        yield replace(plan, split=None if axis == plan.split else axis)  # split it (one split per kernel)
        for choice in (None, *accumulator_choices(diagram, axis)):
            if choice != via:
                yield replace(plan, streams=(*plan.streams[:k], (axis, choice), *plan.streams[k + 1:]))
    for other in candidates:  # stream one more axis, innermost
        if other not in streamed:
            yield replace(plan, streams=(*plan.streams, (other, None)))
    yield from _levels_and_placements(plan, diagram)


def _levels_and_placements(plan: Plan, diagram: Diagram) -> Iterator[Plan]:
    """``neighbours``' moves of the second level: add or drop it, toggle a placement."""
    if plan.groups or plan.streams or plan.scans:
        yield replace(plan, levels=3 - plan.levels, placed=())
    if plan.levels > 1:
        for name in intermediates(diagram):
            placed = tuple(n for n in intermediates(diagram) if (n in plan.placed) != (n == name))
            yield replace(plan, placed=placed)


def starts(diagram: Diagram) -> list[Plan]:
    """Every group candidate cut, with each single stream candidate, and with every scan
    candidate instead (a scan is the kernel's one walked axis: ``neighbours``)."""
    groups, scans = group_axes(diagram), scan_axes(diagram)
    return [Plan(groups, ((axis, None),)) for axis in stream_axes(diagram)] + [Plan(groups, scans=scans)]


def signature(diagram: Diagram) -> tuple[object, ...]:
    """The typed boxes of a diagram up to operand order (and axis order, which is layout,
    not meaning), with its axis roles: diagrams with equal signatures have the same
    relabellings at the same cost."""
    typed = sorted(repr((node.op, node.target, node.out, node.params, node.index, sorted(node.axes),
                         sorted(sorted(a.axes) for a in node.args)))
                   for _, node in boxes(diagram) if isinstance(node, Box))
    return tuple(typed), tuple(sorted(axis_roles(diagram).items()))
