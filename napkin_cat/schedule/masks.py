"""Which chunks of a stream a mask lets a kernel skip: the backend-neutral analysis shared by
the Pallas lowering (``lower/skip.py`` turns the bounds into code) and the cost model
(``pseudo_build`` scales the counts inside the stream by ``chunk_count``).  It is the one
place that decides skipping, by this rule (``c`` a chunk of the streamed axis, ``B`` the
box an accumulator ``acc`` streams, ``x_i`` its operands)::

          x_i = pad_i where p is false    i ∈ absorbing(acc)    p false on all of c
    skip ──────────────────────────────────────────────────────────────────────────────
                              lift_acc(x|c) = identity_acc

Side condition: operand ``i`` *absorbs* (``AccumulatorPlan.absorbing``, certified by the
absorption law in ``certify``): that operand alone at its padding value makes the chunk's
lift the identity, whatever finite values the other operands hold; so every other operand
must be finite (``finiteness.finite``: a ``-inf`` mask there gives ``0 · -inf = NaN`` in the
chunk, which skipping would drop).  Finite over the reals, the proof domain: an operand that
overflows float64 (``exp(800)``) gives the evaluator ``0 · inf = NaN`` where a skipped chunk
gives nothing, outside the contract every kernel keeps (finite real inputs, results within
the dtype's range).  A mask whose fill
equals its operand's padding value is not enough by itself: the padding law fills every
operand at once, while a skipped chunk keeps the others.  Masked values of an attention
(``where(q >= x, V, 0)``) do not absorb (the normaliser still sums exp(s - m) over the
chunk); masked scores (``where(q >= x, S, -inf)``) do, so causal attention stops at the
diagonal.

An operand is known to be ``fill`` where ``pred`` is false (``masked_fill``) when it is a
``where[...](pred, A, fill)`` with a constant fill, or elementwise ops carry such a fill to
it: a unary op to its exact value at the fill (exp(-inf) = 0), a binary op where the fill
fixes the result for every finite value of the other operand (``-inf - L = -inf``,
``0 · y = ±0``; a zero's sign is not tracked, so what tells the signs apart, ``recip`` or a
division by it, carries nothing).  So the causal backward's ``P = exp(S - L)`` and ``dS = P·(dP - D)`` are 0
where the scores are masked, and its passes skip what the forward skips.  The fill must
equal the operand's pad, and ``pred`` must be a conjunction of
affine comparisons between the streamed axis' index and grid axes' indices (``q >= x``,
``q - x < 256``), or a disjunction of such conjunctions (``q >= x or x < 48``; ``and`` over
``or`` is distributed, up to ``MAX_DISJUNCTS`` disjuncts).  Each conjunct is a
``Side``: a bound on the stream index taken at the corner of the program's index box where
it is most permissive (interval arithmetic), and the intersection of the sides gives the
chunks ``[lo, hi)`` that can hold a true position.  A disjunction is true somewhere on a
chunk only if one of its disjuncts is, so the chunks that can hold a true position lie in
the union of the disjuncts' ranges (``chunk_runs``: a window's ``[lo, diagonal]`` and its
sinks' ``[0, s)``); a chunk outside all of them is false for every disjunct on all of it.
Anything else (a negation, ``!=``, a non-affine index, an axis that is neither streamed nor
a grid axis, an accumulator with no such absorbing operand, an output that carries the
streamed axis, a disjunct that bounds no stream index) keeps the full loop:
``stream_masks`` returns None.

The same sides, taken at the block's *restrictive* corner, say which chunks a mask holds on
entirely (``full_masks``, ``full_range``): there a kernel computes the masked node as its
value, without the mask — FlashAttention's causal loop masks only the chunks that straddle
the diagonal.  That needs no side condition (the mask is the identity on the chunk), only
that every conjunct bounds the stream index, so that no row of the block is left out.  For
a disjunction, a chunk on which any one disjunct holds everywhere is such a chunk.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy
from sympy import Expr

from napkin_cat import ops
from napkin_cat.certify.accumulators import AccumulatorPlan
from napkin_cat.evaluate import FLOAT64
from napkin_cat.finiteness import Inputs, finite, input_values
from napkin_cat.schedule.loopnest import Flat
from napkin_cat.schedule.program import simplified
from napkin_cat.terms import Box, Cmp, Const, IndexExpr, Logic, Param, Pred, Var, fold_index

__all__ = ["GroupAxis", "Side", "chunk_count", "chunk_range", "chunk_runs", "full_masks", "full_range", "masked_fill",
           "stream_masks"]

#: an affine index expression: coefficient per axis, and a constant
Affine = tuple[dict[str, int], int]


@dataclass(frozen=True)
class Side:
    """One conjunct as a bound on the streamed index ``i``, with ``v = Σ c·g + const`` over
    the grid indices ``g`` (``coeffs``: (axis, c) pairs, in the order written):
    ``i <= floor(v / divisor)`` when ``upper``, else ``i >= ceil(v / divisor)``.

    Over a program's block each ``g`` is taken at its most permissive corner (``top``: its
    block's last index), so the side holds for some position of the block iff it holds there.
    """

    upper: bool
    divisor: int
    coeffs: tuple[tuple[str, int], ...]
    const: int

    def top(self, coeff: int) -> bool:
        """Is the permissive corner of an axis with this coefficient its block's last index?
        (An upper bound is loosest where ``v`` is largest, a lower bound where it is smallest.)"""
        return (coeff > 0) == self.upper


#: the sides of one accumulating node (a conjunction)
Sides = tuple[Side, ...]


def stream_masks(flat: Flat, stream: str, plans: Mapping[str, AccumulatorPlan],
                 grid: Collection[str]) -> tuple[Sides, ...] | None:
    """Conjunctions of sides bounding the stream index, one per disjunct of each accumulating
    node's mask (duplicates dropped), or None for the full loop: a chunk outside the ranges of
    all of them lifts every node to its identity, so the loop may run over their union.

    ``plans`` maps every node that consumes ``stream`` to its accumulator; ``grid`` names
    the axes a program covers one block of.  Every accumulating node must have a recognised
    mask on an absorbing operand (the module docstring's rule; the first one found is used):
    the loop may then run over the union of their ranges (or a hull of it), since chunks
    outside one node's ranges lift to that node's identity.
    """
    found = absorbed_masks(flat, stream, plans, lambda operand, pred, fill, defs: _mask(pred, stream, grid)
                           if isinstance(pred, (Cmp, Logic)) else None)
    return None if found is None else tuple(dict.fromkeys(sides for each in found for sides in each))


def absorbed_masks(flat: Flat, stream: str, plans: Mapping[str, AccumulatorPlan],
                   recognise: Callable[[Expr, Pred | Expr, float, Mapping[str, Expr]], Any]) -> list[Any] | None:
    """The skip rule's search (module docstring), shared by index masks (``stream_masks``) and
    masks read from data (``datamask.data_masks``): per node of ``plans`` (every node that
    consumes ``stream``), the first absorbing operand that is its padding value wherever a
    mask is false (``masked_fill``), with every other operand finite, whose ``(operand, mask,
    fill, defs)`` ``recognise`` turns into something not None; None where some node has none,
    or an output carries the streamed axis (a chunk of it is written by the loop)."""
    if not plans or any(stream in flat.type_of(o) for o in flat.outputs):
        return None
    defs = {n.name: n.expr for n in flat.nodes}
    inputs = input_values(flat.params or tuple(Param(name, axes) for name, axes in flat.inputs))
    found_all: list[Any] = []
    for node in flat.nodes:
        if node.name not in plans:
            continue
        if not isinstance(node.expr, Box):
            return None
        found = None
        pads = plans[node.name].pad or ()  # no padding law: no absorbing operand either
        for i in plans[node.name].absorbing:
            known = masked_fill(node.expr.args[i], defs, inputs)
            if known is None or known[1] != pads[i]:
                continue
            if not all(finite(a, defs, inputs) for j, a in enumerate(node.expr.args) if j != i):
                continue  # another operand may be infinite: the chunk may lift to NaN, not the identity
            found = recognise(node.expr.args[i], known[0], known[1], defs)
            if found is not None:
                break
        if found is None:
            return None
        found_all.append(found)
    return found_all


def masked_fill(expr: Expr, defs: Mapping[str, Expr], inputs: Inputs) -> tuple[Pred | Expr, float] | None:
    """``(p, c)``: ``expr`` is ``c`` at every position where ``p`` is false, on finite inputs
    (None: not known).  A ``where`` with a constant fill gives its predicate and fill, a
    ``select`` with one its mask (an array: false where it is 0, ``schedule.datamask``); a unary
    op carries a fill to its value there (``_at``); a binary op carries one where one operand
    has a fill that fixes the result for every finite value of the other (``_absorbed``), or
    where both have fills under the same predicate (``_at``).  A zero is carried without its
    sign (``0·y`` is -0 for a negative y), so nothing that tells the signs apart
    (``recip``, a division by it) carries it."""
    known: dict[str, tuple[Pred | Expr, float] | None] = {}  # per binding: a value may feed many ops

    def fill(e: Expr) -> tuple[Pred | Expr, float] | None:
        if isinstance(e, Var):
            if e.name not in defs:
                return None
            if e.name not in known:
                known[e.name] = fill(defs[e.name])
            return known[e.name]
        if not isinstance(e, Box):
            return None
        if e.op == "where":
            last = e.args[-1]
            return (e.index, last.value) if isinstance(last, Const) and isinstance(e.index, (Cmp, Logic)) else None
        if e.op == "select":
            last = e.args[-1]
            return (e.args[0], last.value) if isinstance(last, Const) else None
        kind = ops.OPS[e.op].kind
        if kind not in ("unary", "binary"):
            return None
        fills = [fill(a) for a in e.args]
        first = fills[0]
        # the same predicate or mask, a zero's sign counted (== equates Const(0.0) and Const(-0.0))
        if first is not None and all(f is not None and repr(f[0]) == repr(first[0]) for f in fills):
            value = _at(e.op, tuple(f[1] for f in fills if f is not None))
            if value is not None:
                return first[0], value
        for k, f in enumerate(fills if kind == "binary" else ()):
            if f is not None and finite(e.args[1 - k], defs, inputs):
                value = _absorbed(e.op, k, f[1])
                if value is not None:
                    return f[0], value
        return None

    return fill(expr)


def _at(op: str, values: tuple[float, ...]) -> float | None:
    """``op`` at constant operands, where the result does not depend on the sign of a zero
    operand (both are tried) and is not NaN; in float64, as the evaluator computes it (and in
    float32, which must agree: conservative, since a skipped chunk is never computed)."""
    table: Mapping[str, Callable[..., Any]] = FLOAT64.unary if len(values) == 1 else FLOAT64.binary
    signed = itertools.product(*(((0.0, -0.0) if v == 0 else (v,)) for v in values))
    with np.errstate(all="ignore"):
        results = {float(table[op](*(np.asarray(v, dtype) for v in operands)))
                   for operands in signed for dtype in (np.float64, np.float32)}
    if any(math.isnan(r) for r in results) or len({(r, math.copysign(1.0, r)) for r in results}) > 1:
        return None
    return results.pop()


def _absorbed(op: str, k: int, c: float) -> float | None:
    """The value of binary ``op`` whose operand ``k`` is ``c`` and whose other operand is any
    finite real, where that value does not depend on it (None elsewhere): an infinity through
    addition and subtraction, a zero (of either sign) through multiplication and under an
    infinite divisor, and the infinity that a maximum or minimum keeps."""
    if op == "add" and math.isinf(c):
        return c
    if op == "sub" and math.isinf(c):
        return c if k == 0 else -c
    if (op == "mul" and c == 0) or (op == "div" and k == 1 and math.isinf(c)):
        return 0.0
    if (op == "maximum" and c == math.inf) or (op == "minimum" and c == -math.inf):
        return c
    return None


def full_masks(flat: Flat, stream: str, names: Collection[str], grid: Collection[str]) -> tuple[tuple[str, Sides], ...]:
    """The ``where`` nodes among ``names`` whose predicate is a disjunction of conjunctions of
    affine comparisons, with the sides of each disjunct whose every conjunct bounds the
    ``stream`` index by ``grid`` indices (a node once per such disjunct): on the chunks of any
    one disjunct's ``full_range`` such a node equals its value operand (the disjunct holds
    everywhere there, so the disjunction does; a disjunct left out only narrows that)."""
    out = []
    for node in flat.nodes:
        box = node.expr
        if node.name in names and isinstance(box, Box) and box.op == "where" and isinstance(box.index, (Cmp, Logic)):
            for conjuncts in _disjuncts(box.index) or ():
                sides = _sides(conjuncts, stream, grid, every=True)
                if sides is not None and (node.name, sides) not in out:
                    out.append((node.name, sides))
    return tuple(out)


def _mask(pred: Pred, axis: str, grid: Collection[str]) -> tuple[Sides, ...] | None:
    """The sides of each disjunct of ``pred`` (None: a disjunct not recognised, or one that
    bounds no stream index, which keeps every chunk)."""
    disjuncts = _disjuncts(pred)
    if disjuncts is None:
        return None
    out = []
    for conjuncts in disjuncts:
        sides = _sides(conjuncts, axis, grid)
        if sides is None:
            return None
        out.append(sides)
    return tuple(dict.fromkeys(out))


def _sides(conjuncts: list[Affine], axis: str, grid: Collection[str], every: bool = False) -> Sides | None:
    """The sides of a conjunction of affine forms ``f >= 0`` (None: an index that is neither
    the stream's nor a grid axis', or no conjunct bounds the stream index; with ``every``, also
    when some conjunct bounds none)."""
    out: list[Side] = []
    for coeffs_all, const in conjuncts:
        coeffs = {k: v for k, v in coeffs_all.items() if v != 0}
        a = coeffs.pop(axis, 0)
        if any(other not in grid for other in coeffs):
            return None
        if a == 0:
            if every:
                return None  # a bound on grid indices alone may drop some rows of the block
            continue  # bounds no stream index: keep every chunk
        # a·i + Σ b·g + const >= 0: a < 0 gives i <= (Σ b·g + const) / -a; a > 0 gives
        # i >= (-Σ b·g - const) / a
        sign = 1 if a < 0 else -1
        out.append(Side(a < 0, abs(a), tuple((g, sign * b) for g, b in coeffs.items()), sign * const))
    return tuple(out) or None


def chunk_range(sides: Sides, offsets: Mapping[str, int], spans: Mapping[str, int], tile: int,
                trips: int) -> tuple[int, int]:
    """The chunks ``[lo, hi)`` of one program that can hold a true position, in integers.

    ``offsets`` holds each grid axis' first index in the program, ``spans`` its block's last
    index minus its first; ``hi <= lo`` means no chunk runs.  (The Pallas lowering emits the
    same arithmetic as code.)
    """
    lo, hi = 0, trips
    for side in sides:
        v = side.const + sum(c * (offsets[g] + (spans[g] if side.top(c) else 0)) for g, c in side.coeffs)
        if side.upper:
            hi = min(hi, v // side.divisor // tile + 1)
        else:
            lo = max(lo, -(-v // side.divisor) // tile)
    return lo, hi


def full_range(sides: Sides, offsets: Mapping[str, int], spans: Mapping[str, int], tile: int,
               trips: int) -> tuple[int, int]:
    """The chunks ``[lo, hi)`` of one program on which the conjunction holds at every position
    of the block (each side at its restrictive corner: the first chunk index past a lower
    bound, the last chunk ending before an upper one), in integers; as ``chunk_range``, the
    Pallas and plain-JAX lowerings emit the same arithmetic as code (``skip.stream_runs``)."""
    lo, hi = 0, trips
    for side in sides:
        v = side.const + sum(c * (offsets[g] + (0 if side.top(c) else spans[g])) for g, c in side.coeffs)
        if side.upper:  # (j + 1)·tile - 1 <= floor(v / a)
            hi = min(hi, (v // side.divisor + 1) // tile)
        else:  # j·tile >= ceil(v / a)
            first = -(-v // side.divisor)
            lo = max(lo, -(-first // tile))
    return lo, hi


def chunk_runs(masks: tuple[Sides, ...], offsets: Mapping[str, int], spans: Mapping[str, int], tile: int,
               trips: int) -> list[tuple[int, int]]:
    """The chunks of one program that can hold a true position of any of ``masks`` (the union
    of their ``chunk_range``), as disjoint runs ``[lo, hi)`` in increasing order (empty ones
    left out): the ranges sorted by their first chunk, each started past the ends of those
    before it, so that no chunk runs twice and the chunks run in order.  The Pallas lowering
    emits the same sweep as code (``skip.ordered_runs``)."""
    out = []
    end = 0
    for lo, hi in sorted((chunk_range(sides, offsets, spans, tile, trips) for sides in masks), key=lambda r: r[0]):
        if hi > max(lo, end):
            out.append((max(lo, end), hi))
        end = max(end, hi)
    return out


@dataclass(frozen=True)
class GroupAxis:
    """A grid axis as the cost model sees it: blocks of ``tile`` indices, ``trips`` of them."""

    tile: Expr
    trips: Expr


#: the most conjunctions whose union ``chunk_count`` counts (by inclusion and exclusion: one
#: term per nonempty subset)
MAX_UNION = 4


def chunk_count(masks: tuple[Sides, ...], groups: Mapping[str, GroupAxis], tile: Expr,
                trips: Expr, caps: Mapping[sympy.Symbol, Expr] | None = None) -> Expr | None:
    """The number of (program, chunk) pairs that run, summed over the programs of the mask's
    grid axis, as a closed form in the sizes and tiles; None where none is derived.  A chunk
    runs when it can hold a true position of any of ``masks`` (their union, ``chunk_runs``).

    Exact when ``divisor·tile`` divides ``c·group tile`` for every side (for ``q >= x``: the
    stream tile divides the group tile) and the trips are whole; otherwise each program's
    bounds are rounded as if it did (within one chunk per side).  The union of up to
    ``MAX_UNION`` conjunctions over at most one grid axis is counted by inclusion and exclusion:
    the chunks of an intersection are those of the conjunction of all the sides.  A
    conjunction is counted in closed form when at most one of its lower and one of its upper
    sides read the grid axis (the others bound every program alike and clip its range).  A
    program whose range is empty contributes nothing; the count is clipped to ``[0, trips]``
    per program, with ``Min``/``Max`` where sympy cannot decide the sign; ``caps`` bounds tile
    symbols from above (a tile is at most its axis) for those decisions.  A program's block is
    its group tile: a Pallas tile stored as a larger block (``Layout.padded_tiles``) may run
    one more chunk per program than counted.
    """
    masks = tuple(dict.fromkeys(masks))
    axes = {g for sides in masks for side in sides for g, _ in side.coeffs}
    if len(axes) > 1 or len(masks) > MAX_UNION:
        return None
    axis = next(iter(axes), None)
    if axis is not None and axis not in groups:
        raise ValueError(f"the mask bounds the stream by `{axis}`, which `groups` lacks ({', '.join(groups)})")
    group = groups[axis] if axis is not None else GroupAxis(sympy.Integer(1), sympy.Integer(1))
    count = _Count(axis, group, tile, trips, _Signs(caps or {}))
    total: Expr = sympy.Integer(0)
    for size in range(1, len(masks) + 1):
        for subset in itertools.combinations(masks, size):
            term = count(tuple(dict.fromkeys(side for sides in subset for side in sides)))
            if term is None:
                return None
            total += term if size % 2 else -term
    return simplified(total)


@dataclass(frozen=True)
class _Count:
    """The (program, chunk) pairs of one conjunction, over the ``group.trips`` programs of
    ``axis`` (none: one program)."""

    axis: str | None
    group: GroupAxis
    tile: Expr
    trips: Expr
    sign: _Signs

    def __call__(self, sides: Sides) -> Expr | None:
        p = sympy.Dummy("p", integer=True, nonnegative=True)
        n, trips = self.group.trips, self.trips

        def reads(side: Side) -> bool:
            return any(g == self.axis and c != 0 for g, c in side.coeffs)

        def bound(side: Side, round_up: int) -> Expr:
            """The side's chunk index as linear in the program index p (upper: one past the last)."""
            c = dict(side.coeffs).get(self.axis, 0) if self.axis is not None else 0
            top = 1 if c != 0 and side.top(c) else 0
            step = c * self.group.tile / (side.divisor * self.tile)
            rest = _floor_div(side.const - c * top + round_up, side.divisor, self.tile)
            return step * (p + top) + rest

        uppers = [bound(s, 0) + 1 for s in sides if s.upper and reads(s)]
        lowers = [bound(s, s.divisor - 1) for s in sides if not s.upper and reads(s)]
        if len(uppers) > 1 or len(lowers) > 1:
            return None
        # the sides that read no grid index clip every program's range to [a, b]
        fixed_hi = [bound(s, 0) + 1 for s in sides if s.upper and not reads(s)]
        fixed_lo = [bound(s, s.divisor - 1) for s in sides if not s.upper and not reads(s)]
        a: Expr = sympy.Max(0, *fixed_lo) if fixed_lo else sympy.Integer(0)
        b: Expr = sympy.Max(a, sympy.Min(trips, *fixed_hi)) if fixed_hi or fixed_lo else trips
        hi, lo = (uppers or [None])[0], (lowers or [None])[0]
        if hi is not None and lo is not None and \
                not all(self.sign(sympy.expand(hi - lo).subs(p, at), 1) for at in (0, n - 1)):
            return None  # some program's range may be empty: the difference of clamps is not the count
        # with lo <= hi, max(0, min(b, hi) - max(a, lo)) = clamp(hi) - clamp(lo), clamp to
        # [a, b]; Σ_p clamp(f) = Σ f - Σ (f - b)^+ + Σ (a - f)^+, ramps of linear functions
        ramp = self.sign.ramp
        clamp_hi = _sum(hi, p, n) - ramp(hi - b, p, n) + ramp(a - hi, p, n) if hi is not None else b * n
        clamp_lo = _sum(lo, p, n) - ramp(lo - b, p, n) + ramp(a - lo, p, n) if lo is not None else a * n
        return clamp_hi - clamp_lo


def _floor_div(num: int, divisor: int, tile: Expr) -> Expr:
    """``floor(num / (divisor·tile))`` for an integer ``num`` and a tile >= 1, without a floor
    where the tile's value does not change it."""
    if 0 <= num < divisor:
        return sympy.Integer(0)
    if -divisor <= num < 0:
        return sympy.Integer(-1)
    if tile.is_number:
        return sympy.Integer(math.floor(sympy.Rational(num, divisor) / tile))
    return sympy.floor(sympy.Rational(num, divisor) / tile)


def _sum(f: Expr, p: sympy.Symbol, n: Expr, start: Expr | int = 0) -> Expr:
    """Σ_{p=start}^{n-1} f for f linear in p."""
    slope = sympy.expand(f).coeff(p, 1)
    offset = sympy.expand(f - slope * p)
    return slope * (n * (n - 1) - start * (start - 1)) / 2 + offset * (n - start)


@functools.cache
def _slack(tile: sympy.Symbol) -> sympy.Dummy:
    """The z >= 0 of a capped tile (``_Signs``): one per tile symbol in the process, so that the
    same sign question asked again (another lowering or pricing of the same schedule) is the same
    expression, and ``simplified`` answers it from memory instead of simplifying it again."""
    return sympy.Dummy(f"z_{tile}", nonnegative=True)


class _Signs:
    """Sign decisions for positive sizes and tiles, each capped tile at most its cap."""

    def __init__(self, caps: Mapping[sympy.Symbol, Expr]) -> None:
        # a capped tile t written cap / (1 + z) with z >= 0 ranges over (0, cap]
        self.table = {t: cap / (1 + _slack(t)) for t, cap in caps.items()}

    def __call__(self, expr: Expr, sign: int) -> bool:
        """Is ``expr`` provably >= 0 (sign 1) or <= 0 (sign -1)?"""
        for form in (lambda: expr, lambda: sympy.sympify(expr).subs(self.table)):  # the capped form only if needed
            value = simplified(form())
            if (value.is_nonnegative if sign > 0 else value.is_nonpositive):
                return True
        return False

    def ramp(self, f: Expr, p: sympy.Symbol, n: Expr) -> Expr:
        """Σ_{p=0}^{n-1} max(0, f) for f linear in p, with the crossing rounded to a whole p."""
        slope = sympy.expand(f).coeff(p, 1)
        offset = sympy.expand(f - slope * p)
        first, last = offset, slope * (n - 1) + offset
        if self(first, -1) and self(last, -1):
            return sympy.Integer(0)
        if self(first, 1) and self(last, 1):
            return _sum(f, p, n)
        if slope == 0:
            return n * sympy.Max(0, offset)
        if self(slope, 1):  # positive from p >= -offset / slope on
            start = sympy.Min(n, sympy.Max(0, sympy.ceiling(-offset / slope)))
            return _sum(f, p, n, start)
        if self(slope, -1):  # positive below p = offset / -slope
            return _sum(f, p, sympy.Min(n, sympy.Max(0, sympy.ceiling(offset / -slope))))
        return sympy.Sum(sympy.Max(0, f), (p, 0, n - 1))


#: the most disjuncts a predicate's disjunctive normal form may have for the analysis
MAX_DISJUNCTS = 8


def _disjuncts(pred: Pred) -> list[list[Affine]] | None:
    """``pred`` in disjunctive normal form: a list of conjunctions, each a list of affine
    forms ``f`` meaning ``f >= 0`` (None: not recognised, or more than ``MAX_DISJUNCTS``)."""
    if isinstance(pred, Logic):
        if pred.right is None or pred.op not in ("and", "or"):
            return None
        left, right = _disjuncts(pred.left), _disjuncts(pred.right)
        if left is None or right is None:
            return None
        out = left + right if pred.op == "or" else [a + b for a in left for b in right]
        return out if len(out) <= MAX_DISJUNCTS else None
    left_form, right_form = _affine(pred.left), _affine(pred.right)
    if left_form is None or right_form is None:
        return None
    diff = _combine(left_form, right_form, -1)  # left - right
    minus = _combine(({}, 0), diff, -1)  # right - left
    by_op: dict[str, list[Affine]] = {
        ">=": [diff], ">": [_shift(diff, -1)], "<=": [minus], "<": [_shift(minus, -1)], "==": [diff, minus]}
    found = by_op.get(pred.op)
    return None if found is None else [found]


def _shift(form: Affine, by: int) -> Affine:
    return dict(form[0]), form[1] + by


def _combine(left: Affine, right: Affine, sign: int) -> Affine:
    coeffs = dict(left[0])
    for k, v in right[0].items():
        coeffs[k] = coeffs.get(k, 0) + sign * v
    return coeffs, left[1] + sign * right[1]


def _affine(expr: IndexExpr) -> Affine | None:
    """An integer index expression as coefficients and constant (None: not affine)."""
    def arith(op: str, left: Affine | None, right: Affine | None) -> Affine | None:
        if left is None or right is None:
            return None
        if op in ("+", "-"):
            return _combine(left, right, 1 if op == "+" else -1)
        if op == "*" and (not left[0] or not right[0]):
            scale, form = (left[1], right) if not left[0] else (right[1], left)
            return {k: scale * v for k, v in form[0].items()}, scale * form[1]
        return None

    return fold_index(expr, lambda axis: ({axis: 1}, 0), lambda n: ({}, n), arith)
