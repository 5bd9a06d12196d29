"""The per-level program of a scheduled diagram (the Napkin paper's pseudocode diagrams, §5.1), as immutable
data, and the memory and transfer accounting over it.

``pseudo_build.program`` produces a ``Program``; ``cost``, ``draw_cost`` and ``pseudo.render``
read it.  A ``Program`` holds one ``View`` per memory level below hbm (slowest first); a view
is a sequence of columns (``Step``: a load, save, compute, init or final, with the loop
instances around it) and the ``Buffer``s live at its level over column ranges.  A view's
memory is its largest live set over the columns (``max_of`` drops the columns another column
dominates term by term); its transfers are Σ count·size over its loads and saves.  Every
quantity is a sympy expression in the axis sizes and tile symbols.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import sympy
from sympy import Expr

from napkin_cat.cache import cache_folder, key, read, write
from napkin_cat.schedule.loopnest import LoopNest
from napkin_cat.terms import INT_BYTES, LEVELS, Axes

__all__ = ["Buffer", "Inst", "Program", "Step", "View", "max_of", "rank", "simplified"]


@functools.lru_cache(maxsize=4096)
def simplified(expr: Expr) -> Expr:
    """``sympy.simplify``, remembered in the process and on disk (``napkin_cat.cache``, keyed by
    the expression's ``srepr`` and the sympy version): the cost of one schedule is derived again
    by every verb and test that prices it (cost, lower, derive), and simplifying its masked
    chunk counts dominates that (tens of seconds for a two-level masked schedule).  A result is
    stored only where its ``srepr`` reads back as the same expression, so what is read back is
    what ``simplify`` returned."""
    entry_key = key("simplified", {"expr": sympy.srepr(expr), "sympy": sympy.__version__})
    stored = read(cache_folder(), entry_key, lambda payload: isinstance(payload, str))
    if stored is not None:
        try:
            value: Expr = sympy.sympify(stored)
            return value
        except (sympy.SympifyError, SyntaxError, TypeError, ValueError, NameError, AttributeError):
            pass  # not readable here: simplified again below
    result: Expr = sympy.simplify(expr)
    text = sympy.srepr(result)
    try:
        faithful = sympy.sympify(text) == result
    except (sympy.SympifyError, SyntaxError, TypeError, ValueError, NameError, AttributeError):
        faithful = False
    if faithful:
        write(cache_folder(), entry_key, text)
    return result

#: a loop instance in a view: (index into LoopNest.loops, serial number of the instance)
Inst = tuple[int, int]


def rank(level: str) -> int:
    """Position in the hierarchy: 0 for hbm, larger is faster and smaller."""
    return LEVELS.index(level)


@dataclass(frozen=True)
class Step:
    """One column: ``load``/``save`` of an array into/out of the view's level, ``compute`` of a
    node, or ``init``/``final`` of a node's accumulator state around its stream.

    ``path`` is the loop instances around it (outermost first), ``count`` their trips
    multiplied, ``size`` the values moved by one load or save, ``users`` the nodes a load
    serves.
    """

    index: int
    op: str
    array: str
    path: tuple[Inst, ...]
    count: Expr
    size: Expr
    users: tuple[str, ...] = ()


@dataclass(frozen=True)
class Buffer:
    """A buffer at the view's level, live over columns ``start..end`` (inclusive)."""

    name: str
    array: str  # the array stored (a state component belongs to its node)
    role: str  # load | save | value | state
    shape: tuple[tuple[str, Expr], ...]
    start: int
    end: int
    copies: int = 1  # pipeline stages of a chunk load (multi-buffering)

    @property
    def size(self) -> Expr:
        return self.copies * sympy.Mul(*(extent for _, extent in self.shape))


@dataclass(frozen=True)
class View:
    """The program seen from one level: its loops, columns and buffers."""

    level: str
    parent: str
    loops: tuple[int, ...]
    steps: tuple[Step, ...]
    buffers: tuple[Buffer, ...]
    ends: tuple[tuple[Inst, int], ...]  # last column of each stream instance

    def live(self, column: int) -> tuple[Buffer, ...]:
        """The buffers at this level live in a column."""
        return tuple(b for b in self.buffers if b.start <= column <= b.end)

    def live_size(self, column: int, bytes_of: Mapping[str, int] | None = None) -> Expr:
        """The size of a column's live set: values, or bytes when ``bytes_of`` maps every
        array to its bytes per value."""
        return sympy.Add(*(b.size * _weight(bytes_of, b.array) for b in self.live(column)))

    def memory(self, bytes_of: Mapping[str, int] | None = None) -> Expr:
        """The largest live set over the columns (values, or bytes when ``bytes_of`` is given),
        dominated columns dropped."""
        return max_of([self.live_size(s.index, bytes_of) for s in self.steps])

    def transfers(self, bytes_of: Mapping[str, int] | None = None) -> Expr:
        """Σ count·size over the loads and saves (in bytes when ``bytes_of`` is given)."""
        total = sympy.Integer(0)
        for s in self.steps:
            if s.op in ("load", "save"):
                total += s.count * s.size * _weight(bytes_of, s.array)
        return total


def _weight(bytes_of: Mapping[str, int] | None, array: str) -> int:
    """Bytes per value of ``array``, or 1 when counting values."""
    return bytes_of[array] if bytes_of is not None else 1


@dataclass(frozen=True)
class BlockMask:
    """What a data mask's block mask moves: the inputs it reads (once), the grid's ``programs``,
    the ``chunks`` of each, and the fraction ``live`` of (program, chunk) pairs that run."""

    reads: tuple[str, ...]
    programs: Expr
    chunks: Expr
    live: Expr

    def transfers(self, elements: Mapping[str, Expr], bytes_of: Mapping[str, int] | None = None) -> Expr:
        """Values (or, with ``bytes_of``, bytes) between hbm and the chip: its inputs read once;
        the kinds of every pair written and read back (4-byte integers), the two arrays of each
        program's live chunks written (a count, or its zero, and one entry per chunk); and the
        kernel's reads of them: the count per program, a chunk index and its FULL flag per
        live pair."""
        width = INT_BYTES if bytes_of is not None else 1
        inputs = sympy.Add(*(elements[name] * (bytes_of[name] if bytes_of is not None else 1) for name in self.reads))
        pairs = self.programs * self.chunks
        return inputs + width * (2 * pairs + 2 * (pairs + self.programs) + self.programs + 2 * self.live * pairs)


@dataclass(frozen=True)
class Program:
    """A scheduled diagram as per-level views (slowest first), with the symbols it uses."""

    nest: LoopNest
    views: tuple[View, ...]
    compute_level: str
    homes: tuple[tuple[str, str], ...]
    sizes: tuple[tuple[str, Expr], ...]
    tiles: tuple[Expr, ...]  # tile of each loop (index into nest.loops)
    trips: tuple[Expr, ...]
    constants: frozenset[str]
    #: streams a mask lets the kernel cut short (``masks``): (loop index, (program, chunk)
    #: pairs that run, pairs in the full loop); every step inside such a stream is counted
    #: ``runs / full`` times as often as its loops' trips say
    masked: tuple[tuple[int, Expr, Expr], ...] = ()
    #: a data mask's block mask (``build``, ``lower.dataskip``), computed before the kernel
    block_mask: BlockMask | None = None

    def shape(self, axes: Axes, path: tuple[Inst, ...]) -> tuple[tuple[str, Expr], ...]:
        """Each axis with its extent inside ``path``: the tile of the innermost loop over it
        (latest in schedule order), else the axis size."""
        out = []
        for axis in axes:
            inner = [i for i, _ in path if self.nest.loops[i].axis == axis]
            out.append((axis, self.tiles[max(inner)] if inner else dict(self.sizes)[axis]))
        return tuple(out)


def max_of(columns: list[Expr]) -> Expr:
    """``Max`` of column sizes without the columns another column dominates term by term."""
    return _max_of(tuple(columns))


@functools.lru_cache(maxsize=4096)
def _max_of(columns: tuple[Expr, ...]) -> Expr:
    """``max_of``, remembered: the search prices many schedules whose views have the same live
    sets, and building a ``Max`` compares its arguments pairwise under assumptions."""
    cols = list(dict.fromkeys(sympy.expand(c) for c in columns)) or [sympy.Integer(0)]
    keep = [c for i, c in enumerate(cols)
            if not any(j != i and _dominates(o, c) and (not _dominates(c, o) or j < i) for j, o in enumerate(cols))]
    return sympy.Max(*keep) if len(keep) > 1 else keep[0]


def _dominates(big: Expr, small: Expr) -> bool:
    """``big >= small`` for all sizes and tiles >= 1: ``big - small`` with every symbol s
    written 1 + s' is a polynomial in the s' >= 0 with non-negative coefficients (a difference
    that is not a polynomial is read as it is).  Writing s as 1 + s' commutes with
    subtraction, so two polynomials are each rewritten once (``_shifted``, remembered:
    ``max_of`` compares every pair of columns), and their difference is taken term by term
    (``_coefficients``: the coefficient of each monomial, as ``Add`` collects them)."""
    shifted = _shifted(big), _shifted(small)
    if shifted[0] is not None and shifted[1] is not None:
        mine, theirs = _coefficients(shifted[0]), _coefficients(shifted[1])
        return all(mine.get(term, 0) - c >= 0 for term, c in theirs.items()) and \
            all(c >= 0 for term, c in mine.items() if term not in theirs)
    raw = sympy.expand(big - small)
    diff = _shifted(raw)
    if diff is None:
        diff = raw
    return all(t.as_coeff_Mul()[0] >= 0 for t in sympy.Add.make_args(diff))


@functools.lru_cache(maxsize=4096)
def _coefficients(expr: Expr) -> dict[Expr, Expr]:
    """The expanded ``expr`` as {monomial: numeric coefficient} (``as_coeff_Mul`` of each term, as
    ``Add`` splits terms when it collects like ones): the difference of two such sums is the
    difference of their coefficients, monomial by monomial."""
    out: dict[Expr, Expr] = {}
    for term in sympy.Add.make_args(expr):
        coeff, monomial = term.as_coeff_Mul()
        out[monomial] = out.get(monomial, sympy.Integer(0)) + coeff
    return out


@functools.lru_cache(maxsize=4096)
def _shifted(expr: Expr) -> Expr | None:
    """``expr`` with every symbol s written 1 + s', expanded; None unless it is a polynomial."""
    symbols = sorted(expr.free_symbols, key=str)
    if symbols and not expr.is_polynomial(*symbols):
        return None
    return sympy.expand(expr.subs({s: s + 1 for s in symbols}, simultaneous=True))
