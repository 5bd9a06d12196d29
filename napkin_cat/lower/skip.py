"""Which stream chunks a program skips, and on which it leaves its masks out, as code:
``masks.stream_masks`` decides, by its skip rule, which where masks make whole chunks lift to
the accumulators' identity (a mask on an absorbing operand, filling it with its padding
value; see its docstring for the rule and the shapes recognised) and gives each conjunct as
a ``masks.Side``; this module writes each side's chunk bound from the program's grid offsets,
and the loop runs over ``[lo, hi)``.  The cost model counts the same chunks
(``masks.chunk_count``).  ``masks.full_masks`` gives the where nodes whose sides bound the
chunks they hold on entirely; ``full_range`` writes those bounds, and the kernel computes
the nodes unmasked there (``Scope.unmasked``).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence

from napkin_cat.lower import codegen as cg
from napkin_cat.lower.layout import Layout
from napkin_cat.schedule.masks import Side, full_masks, stream_masks

__all__ = ["chunk_range", "full_range", "unmaskable"]


def chunk_range(lay: Layout, offsets: Mapping[str, ast.expr], trips: ast.expr,
                grid: Sequence[str] | None = None) -> tuple[ast.expr, ast.expr] | None:
    """``(lo, hi)`` chunk bounds of the stream loop for one program, or None for ``(0, trips)``.

    ``offsets`` holds the first index in this program (code) of each axis of ``grid`` (by
    default the layout's: Pallas programs; the plain-JAX target passes its mapped block axis),
    each spanning ``lay.block`` positions from there; ``trips`` is the number of chunks.  The
    loop runs over the hull of the accumulating nodes' ranges (``masks.stream_masks``).
    """
    axis = lay.stream
    if axis is None:
        return None
    masks = stream_masks(lay.flat, axis, lay.plans, lay.grid if grid is None else grid)
    if masks is None:
        return None
    ranges = [_bounds(sides, lay, axis, offsets, trips) for sides in dict.fromkeys(masks)]
    if len(ranges) == 1:
        return ranges[0]
    return _fold("jnp.minimum", [lo for lo, _ in ranges]), _fold("jnp.maximum", [hi for _, hi in ranges])


def unmaskable(lay: Layout, grid: Sequence[str] | None = None) -> tuple[tuple[str, tuple[Side, ...]], ...]:
    """The where nodes computed per chunk whose masks a program can leave out of the chunks
    they hold on entirely, with their sides (``masks.full_masks`` on the chunk's nodes; ``grid``
    as in ``chunk_range``)."""
    if lay.stream is None:
        return ()
    chunk = [n.name for n in lay.flat.nodes if lay.phase[n.name] == "chunk"]
    return full_masks(lay.flat, lay.stream, chunk, lay.grid if grid is None else grid)


def full_range(lay: Layout, offsets: Mapping[str, ast.expr], trips: ast.expr,
               grid: Sequence[str] | None = None) -> tuple[ast.expr, ast.expr, frozenset[str]] | None:
    """``(lo, hi, nodes)``: the chunks on which every where node of ``nodes`` holds at every
    position of the program's block, so that it equals its value operand there; None when no
    node has such bounds (``unmaskable``)."""
    found = unmaskable(lay, grid)
    if not found or lay.stream is None:
        return None
    lo, hi = _bounds(tuple(side for _, sides in found for side in sides), lay, lay.stream, offsets, trips, full=True)
    return lo, hi, frozenset(name for name, _ in found)


def _bounds(sides: tuple[Side, ...], lay: Layout, axis: str, offsets: Mapping[str, ast.expr],
            trips: ast.expr, full: bool = False) -> tuple[ast.expr, ast.expr]:
    """Chunk bounds of one node's conjunction: the chunks holding a true position, each side at
    its block's permissive corner (as ``masks.chunk_range``); with ``full``, the chunks true at
    every position, each side at its restrictive corner (as ``masks.full_range``)."""
    tile = lay.tiles[axis]
    lows: list[ast.expr] = []
    highs: list[ast.expr] = []
    for side in sides:
        terms: list[tuple[int, ast.expr]] = []
        for other, c in side.coeffs:
            span = 0 if other in lay.squeezed else lay.block(other) - 1
            corner = cg.binop(offsets[other], "+", cg.const(span)) if side.top(c) != full and span else offsets[other]
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
