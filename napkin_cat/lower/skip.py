"""Which stream chunks a program skips, and on which it leaves its masks out, as code:
``masks.stream_masks`` decides, by its skip rule, which where masks make whole chunks lift to
the accumulators' identity (a mask on an absorbing operand, filling it with its padding
value; see its docstring for the rule and the shapes recognised) and gives each disjunct of
each mask as a conjunction of ``masks.Side``; this module writes each side's chunk bound from
the program's grid offsets (``stream_runs``), and the loop runs over the union of the ranges:
one range for a conjunction, and for a disjunction the ranges sorted and made disjoint
(``ordered_runs``, the code of ``masks.chunk_runs``).  The cost model counts the same chunks
(``masks.chunk_count``).  ``masks.full_masks`` gives the where nodes (and disjuncts) whose
sides bound the chunks they hold on entirely; each range carries those bounds, and the
kernel computes the nodes unmasked there (``Scope.unmasked``).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from napkin_cat.lower import codegen as cg
from napkin_cat.schedule.layout import Layout
from napkin_cat.schedule.masks import Side, full_masks, stream_masks

__all__ = ["Runs", "cut_at_full", "ordered_runs", "stream_runs", "unmaskable"]

#: a chunk range ``[lo, hi)`` of one program, as code
Range = tuple[ast.expr, ast.expr]


@dataclass(frozen=True)
class Runs:
    """One program's stream chunks: those that run are the union of the ``live`` ranges (one
    per conjunction of ``masks.stream_masks``, which may overlap; ``(0, trips)`` where no mask
    skips), and with each, ``full``: chunks on which every node of ``unmasked`` holds at every
    position of the block (None: no node is left out); ``skips``: whether a mask skips chunks."""

    live: tuple[Range, ...]
    full: tuple[Range, ...] | None
    unmasked: frozenset[str]
    skips: bool


def stream_runs(lay: Layout, offsets: Mapping[str, ast.expr], trips: ast.expr,
                grid: Sequence[str] | None = None, extents: Mapping[str, ast.expr] | None = None) -> Runs | None:
    """The chunk ranges of one program (``Runs``), or None for the full loop with every mask.

    ``offsets`` holds the first index in this program (code) of each axis of ``grid`` (by
    default the layout's: Pallas programs; the plain-JAX target passes its mapped block axis),
    each spanning ``lay.block`` positions from there, or ``extents`` where given (the plain-JAX
    target's block of rows, or a mesh device's whole shard, which it runs vectorised: a shard of
    10 queries grouped by 8 spans 10 rows, not 8); ``trips`` is the number of chunks.  A
    where node is left out (``unmaskable``) with each live range when it has a disjunct whose
    full range to pair with it: the range's own conjunction, or the node's only disjunct (any
    disjunct's full range is sound; the pairing keeps one range per live range).
    """
    axis = lay.stream
    if axis is None:
        return None
    masks = stream_masks(lay.flat, axis, lay.plans, lay.grid if grid is None else grid)
    conjunctions: tuple[tuple[Side, ...] | None, ...] = masks if masks is not None else (None,)
    found = unmaskable(lay, grid)
    options: dict[str, list[tuple[Side, ...]]] = {}
    for name, sides in found:
        options.setdefault(name, []).append(sides)

    def pick(name: str, conjunction: tuple[Side, ...] | None) -> tuple[Side, ...] | None:
        if conjunction in options[name]:
            return conjunction
        return options[name][0] if len(options[name]) == 1 else None

    kept = [name for name in options if all(pick(name, c) is not None for c in conjunctions)]
    if masks is None and not kept:
        return None
    live = tuple(_bounds(c, lay, axis, offsets, trips, extents=extents) if c is not None else (cg.const(0), trips)
                 for c in conjunctions)
    full = tuple(_bounds(tuple(side for name in kept for side in pick(name, c) or ()), lay, axis, offsets, trips,
                         full=True, extents=extents) for c in conjunctions) if kept else None
    return Runs(live, full, frozenset(kept), masks is not None)


def ordered_runs(block: cg.Block, runs: Runs) -> list[tuple[Range, Range | None]]:
    """The live ranges made disjoint and put in increasing order, each with its full range: as
    ``masks.chunk_runs``, sorted by their first chunk (compare and swap, as code) and each
    started past the ends of those before, so that no chunk runs twice and chunks run in order
    (the accumulators combine in order).  One range is returned as it is."""
    items: list[tuple[ast.expr, ...]] = [
        (lo, hi, *(runs.full[k] if runs.full is not None else ())) for k, (lo, hi) in enumerate(runs.live)]
    if len(items) > 1:
        for i in range(len(items)):
            for k in range(len(items) - 1 - i):
                first, second = items[k], items[k + 1]
                starts = [e.value if isinstance(e, ast.Constant) and isinstance(e.value, int) else None
                          for e in (first[0], second[0])]
                if starts[0] is not None and starts[1] is not None:
                    if starts[0] > starts[1]:  # known here: no select in the kernel
                        items[k], items[k + 1] = second, first
                    continue
                before = block.bind("in_order", cg.binop(first[0], "<=", second[0]))
                pairs = list(zip(first, second, strict=True))
                items[k] = tuple(block.bind("run", cg.call("jnp.where", before, a, b)) for a, b in pairs)
                items[k + 1] = tuple(block.bind("run", cg.call("jnp.where", before, b, a)) for a, b in pairs)
        end: ast.expr = cg.const(0)
        for k, (lo, hi, *rest) in enumerate(items):
            items[k] = (block.bind("run_first", cg.call("jnp.maximum", lo, end)), hi, *rest)
            if k + 1 < len(items):
                end = block.bind("run_end", cg.call("jnp.maximum", end, hi))
    return [((lo, hi), (rest[0], rest[1]) if rest else None) for lo, hi, *rest in items]


def cut_at_full(block: cg.Block, lo: ast.expr, hi: ast.expr, full: Range, trips: ast.expr,
                ) -> list[tuple[ast.expr, ast.expr, bool]]:
    """Chunks ``[lo, hi)`` cut at the ``full`` range inside them: ``(start, stop, unmasked)``
    pieces in order, the middle one computed without the masks.  A side with no bound (a causal
    mask's first chunks, say) gets no piece of its own: each pipelined loop Triton compiles
    holds its own registers (README "Kernels").  With no lower bound the masked piece before the
    run would be empty (``first`` = min(lo, hi) then); with no upper bound the one after it."""
    head = not (isinstance(full[0], ast.Constant) and full[0].value == 0)
    first = block.bind("full_first", cg.call("jnp.minimum", cg.call("jnp.maximum", full[0], lo), hi)) \
        if head else lo
    end = block.bind("full_end", cg.call("jnp.maximum", cg.call("jnp.minimum", full[1], hi), first))
    return ([(lo, first, False)] if head else []) + [(first, end, True)] + \
        ([] if full[1] is trips else [(end, hi, False)])


def unmaskable(lay: Layout, grid: Sequence[str] | None = None) -> tuple[tuple[str, tuple[Side, ...]], ...]:
    """The where nodes computed per chunk whose masks a program can leave out of the chunks
    they hold on entirely, with the sides of each of their disjuncts (``masks.full_masks`` on
    the chunk's nodes; ``grid`` as in ``stream_runs``)."""
    if lay.stream is None:
        return ()
    chunk = [n.name for n in lay.flat.nodes if lay.phase[n.name] == "chunk"]
    return full_masks(lay.flat, lay.stream, chunk, lay.grid if grid is None else grid)


def _bounds(sides: tuple[Side, ...], lay: Layout, axis: str, offsets: Mapping[str, ast.expr],
            trips: ast.expr, full: bool = False,
            extents: Mapping[str, ast.expr] | None = None) -> tuple[ast.expr, ast.expr]:
    """Chunk bounds of one node's conjunction: the chunks holding a true position, each side at
    its block's permissive corner (as ``masks.chunk_range``); with ``full``, the chunks true at
    every position, each side at its restrictive corner (as ``masks.full_range``); a block spans
    ``lay.block`` positions, or ``extents`` where given (``stream_runs``)."""
    tile = lay.tiles[axis]
    lows: list[ast.expr] = []
    highs: list[ast.expr] = []
    for side in sides:
        terms: list[tuple[int, ast.expr]] = []
        for other, c in side.coeffs:
            span: int | ast.expr = 0 if other in lay.squeezed else lay.block(other) - 1
            if extents is not None and other in extents and other not in lay.squeezed:
                span = cg.binop(extents[other], "-", cg.const(1))
            corner = cg.binop(offsets[other], "+", span if isinstance(span, ast.expr) else cg.const(span)) \
                if side.top(c) != full and span else offsets[other]
            terms.append((c, corner))
        bound = _linear(terms, side.const)
        a = side.divisor
        if not side.upper:  # i >= ceil(v / a): chunks from that one on (full: starting there or later)
            first = bound if a == 1 else cg.binop(cg.binop(bound, "+", cg.const(a - 1)), "//", cg.const(a))
            if full:
                first = cg.binop(first, "+", cg.const(tile - 1))
            lows.append(cg.binop(first, "//", cg.const(tile)))
        else:  # i <= floor(v / a): chunks up to and including that one (full: ending there or before)
            last = bound if a == 1 else cg.binop(bound, "//", cg.const(a))
            if full:
                highs.append(cg.binop(cg.binop(last, "+", cg.const(1)), "//", cg.const(tile)))
            else:
                highs.append(cg.binop(cg.binop(last, "//", cg.const(tile)), "+", cg.const(1)))
    lo = cg.call("jnp.maximum", cg.const(0), _fold("jnp.maximum", lows)) if lows else cg.const(0)
    hi = cg.call("jnp.minimum", trips, _fold("jnp.minimum", highs)) if highs else trips
    return lo, hi  # hi <= lo: fori_loop runs no trip (a program whose rows mask every key)


def _linear(terms: list[tuple[int, ast.expr]], const: int) -> ast.expr:
    """``Σ c·e + const`` as code (unit coefficients and a zero constant left out)."""
    out: ast.expr | None = None
    for c, e in terms:
        if c == 0:
            continue
        term = e if abs(c) == 1 else cg.binop(cg.const(abs(c)), "*", e)
        out = (term if c > 0 else cg.binop(cg.const(0), "-", term)) if out is None else \
            cg.binop(out, "+" if c > 0 else "-", term)
    if out is None:
        return cg.const(const)
    return out if const == 0 else cg.binop(out, "+" if const > 0 else "-", cg.const(abs(const)))


def _fold(fn: str, items: list[ast.expr]) -> ast.expr:
    out = items[0]
    for item in items[1:]:
        out = cg.call(fn, out, item)
    return out
