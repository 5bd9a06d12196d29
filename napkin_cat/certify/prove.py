"""TRUSTED (for ``proved`` answers, with its atoms, atoms.py): lemmas and accumulator laws
proved at every size.

Domain (README "Proofs"): every input entry is a finite real and every axis has a
symbolic size n ≥ 1.  A value is a sympy expression in one free index symbol ``i_a`` per
axis it carries; an input ``X: [a b]`` is the real function application ``X(i_a, i_b)``.
A reduction over axes A (sum, max, min, prod) is an opaque atom of its body in the normal
form of atoms.py (linearity and exchange of Σ, merging of nested reductions, max/min as
lattice atoms with identities ∓inf), each step an identity over finite reals, and
exp(u + v) = exp(u)·exp(v); the split bijection of a chunked axis: a reduction over n1 + n2
positions is the sum, larger, smaller or product of the reductions over the first n1 and the
last n2.

Reshapes (split, join, rename) move positions by the split bijection i_w = i_p·n_q + i_q
(0 ≤ i_q < n_q), its inverse read by ⌊i_w / n_q⌋ and i_w mod n_q (atoms.index); the sizes
they tie (|w| = |p|·|q|) are solved for the left side (``_ties``), which is where a lemma
claims anything, and each tie of the right side must hold there.

Both sides are built by the semantics below and must then agree by sympy's field algebra
(``expand``, ``expand_log`` of positive factors, ``cancel``).  Every partial operation is
admitted only where it is defined on the whole domain: ``log`` of a term sympy knows is
positive (an exponential, a sum of them), a division, ``recip`` or ``rsqrt`` by a positive
term, ``sqrt`` of a non-negative one; anything else is not proved (``Unproved``), and the
caller falls back to bounded testing.  A normaliser that can be 0 (``Σ S²``) is split by
cases: S identically 0 along the row (the evaluator's convention gives 0), or not (the
normaliser is positive); each case is proved.  ``index[A](e)`` is the integer value of e at
the positions i_a, exactly (the evaluator's int64 wrap past 2^63 and float64 rounding past 2^53
are the numeric tier's, as a sum's rounding and a product's overflow are below), and
``onehot[v](L)`` an opaque 0/1 function of L's value and i_v (the same operands give the same
atom); both are refused where their axes are chunked (a chunk's
positions are offset).  In joins, ``cumsum[a](X)`` is an opaque atom binding its own index
symbol (``_cumsum``).  Ops outside this semantics (``where`` and ``cumsum`` outside joins,
comparisons and select of data, gather, ``linrec``, piecewise activations, ``floor``) are not proved.

-inf masks (``masks_unproved``): a parameter read only as scores (of softmax, logsumexp, max,
ncontract[exp, exp, id], over all its axes: one row) may be partly masked, S = S' + log m
with m an opaque 0/1 indicator of the positions (so exp(S) = m·exp(S') is exactly 0 where
masked, whatever positions the mask removes), where a sum of m·(positive) over the row is
positive and its maximum real, because the row keeps an entry; or fully masked, -inf at
every entry.  Every mix of the two cases over the score parameters must normalise to the
same term; a finite row is the case m = 1.  The accumulator laws' masks
(``_masked_laws``) are the same two cases per chunk.

A backward join (``prove_join``, lower/backward.py): backward diagrams fed the forward's
inputs, its outputs (the saved statistics) and the cotangents give, summed per input, the same
terms as the VJP diagram of the forward (``napkin_cat.grad``), each output of each at every
size; reshapes and normalisers that may be 0 are not proved there.  A join may hold ``where``
masks (``_Semantics.where``): where(p, a, b) = m·a + (1 - m)·b with m the indicator of p, an
opaque 0/1 function of the positions (m² = m), and a -inf fill is a + log m, read only by exp
(m·exp a), by a finite shift and as the scores of the exp-normalised reductions, each exact
for m ∈ {0, 1}; their normaliser Σ m·exp(·) is positive only where p holds at position 0 of
the summed axes for every position of the others (every row keeps a term); no log m may reach
an output.  Predicates and index values are read over the integers, so no index expression of the
join may wrap in int64 at some size (``finiteness.index_may_wrap``).  The guarded shift
max(L, -FLOAT_MAX) of an input L (a float64 array: each entry -inf or at least -FLOAT_MAX; the
derived backward's saved statistic, ``grad._weights``) is L, and -FLOAT_MAX where L is -inf, as
the accumulators' guard of a maximum of inputs is (``_Semantics.float_input``).  A sum, difference or sum
reduction cancelling terms equal over the reals to 0, unless float64 computes them alike, is a float64
hazard in a join (``_Semantics.cancelled``: float64 gives their rounding errors' difference), and so is a
term 0 over the reals read where 0 is a jump (``_Semantics.zero_read``: log, sign, sqrt, a normaliser's 0
convention; with masks opaque indicators and inputs finite, such a 0 is a cancellation, additive or not),
a difference whose operands read an input its value does not (``cancelled``: (K + 1/K)² - (K - 1/K)²), and a
log of a computed term 1 over the reals (``_Semantics.log``: a cancellation to 0 by a product).

Accumulator laws (accumulators.py, the unguarded forms, which equal the guarded ones on
finite inputs): combine(lift(x), lift(y)) = lift(x ⊕ y) with x, y of symbolic lengths
n1, n2 (so the fold over any number of chunks is the box, by induction on the chunks),
combine(identity, s) = s, final(lift(x)) = box(x), with padding lift(x ⊕ fill) = lift(x), and
for a one-step update update(s, x) = combine(s, lift(x)) for any state s.
These are identities over the reals: for sum and prod, float64 rounding and overflow
(a product past 1e308) are the numeric tier's, not the proof's.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from functools import cache
from typing import Any

import sympy
from sympy.core.function import AppliedUndef

from napkin_cat import ops
from napkin_cat.certify import accumulators as acc
from napkin_cat.certify.atoms import Quo, Rem, _expand, _i, _j, _MaxOf, _n, _Reduction, index, maximum, minimum, reduce
from napkin_cat.evaluate import FLOAT64
from napkin_cat.finiteness import (
    absorbing_sums,
    cancelled_absorptions,
    cancelling_sums,
    finite,
    float_unsafe_box,
    index_may_wrap,
    input_values,
    overflow_box,
)
from napkin_cat.printer import print_expr
from napkin_cat.terms import (
    Apply,
    Box,
    Const,
    Diagram,
    Expr,
    LemmaDecl,
    Param,
    Size,
    Var,
    box_diagram,
    expanded,
    fold,
    fold_index,
    fold_pred,
    relation_diagram,
    relations,
    run_diagram,
    walk,
)

__all__ = ["FloatHazard", "Unproved", "extended", "masks_unproved", "prove_accumulator", "prove_join", "prove_lemma",
           "why_unproved"]


class Unproved(Exception):
    """The term leaves the proved fragment; the message says where."""


class FloatHazard(Unproved):
    """The terms are equal over the reals, and float64 may compute one otherwise where the other is
    finite (an overflow, an underflowed sign, an absorption then cancelled): a finite-float reason,
    not the prover's incompleteness, which a test at drawn inputs cannot overrule (they need not
    reach the hazard; ``lower.backward.link`` refuses it with or without ``allow_tested``)."""


def _input_max(x: Any, rows: frozenset[Any] = frozenset()) -> bool:
    """Is ``x`` -oo or a maximum of inputs (a running max of float64 inputs, ≥ -FLOAT_MAX):
    of an input, or of a partly masked one S' + log m whose indicator m is one of ``rows``
    (its row keeps an entry, ``_Semantics.kept``) over every position m reads?"""
    if x == -sympy.oo:
        return True
    if isinstance(x, _MaxOf):
        return all(_input_max(a, rows) for a in x.args)
    if not isinstance(x, _Reduction) or x.kind != "Max":
        return False
    terms = sympy.Add.make_args(x.args[0])
    masks = [t.args[0] for t in terms if isinstance(t, sympy.log) and t.args[0].func in rows]
    inputs = [t for t in terms if isinstance(t, AppliedUndef) and t.func not in rows]
    return len(inputs) == 1 and len(terms) == 1 + len(masks) and len(masks) <= 1 and all(
        set(m.args) <= {_j(a) for a in x.axes} for m in masks)


#: boxes that move positions between axes: split, join and rename (a split into one part)
_RESHAPES = ("split", "join", "rename")


def _reshape_axes(node: Box) -> tuple[str, tuple[str, ...]]:
    """(w, parts) of split[w -> parts], rename[w -> part] or join[parts -> w]."""
    return (node.out[0], node.target) if node.op == "join" else (node.target[0], node.out)


def _ties(lemma: LemmaDecl) -> dict[Any, Any]:
    """The sizes the left side's reshapes tie, n_w = Π n_p, solved for the whole axes w: each
    tie either holds under the earlier ones or names a new w, which becomes that product; so
    every size where the left side is defined is an instance at positive sizes of the others.
    Each reshape of the right side must be defined there (its tie must hold)."""
    ties: dict[Any, Any] = {}
    for side, expr in (("left", lemma.lhs), ("right", lemma.rhs)):
        for node in _walk(expr):
            if not isinstance(node, Box) or node.op not in _RESHAPES:
                continue
            whole, parts = _reshape_axes(node)
            n, product = _n(whole).xreplace(ties), sympy.Mul(*[_n(p) for p in parts]).xreplace(ties)
            if _expand(n - product) == 0:
                continue
            if side == "right":
                raise Unproved(f"the right side's `{node.op}` needs |{whole}| = {'·'.join(f'|{p}|' for p in parts)}, "
                               "which the left side does not")
            if n != _n(whole) or n in product.free_symbols:
                raise Unproved(f"the sizes `{node.op}` ties to |{whole}| are tied otherwise too")
            ties = {k: v.xreplace({n: product}) for k, v in ties.items()} | {n: product}
    return ties


class _Semantics:
    """Diagram terms -> sympy values at symbolic sizes (see the module docstring).

    ``split`` maps a chunked axis to its two parts (the split bijection); ``zero`` names
    parameters taken identically 0 (a normaliser case); ``cases`` collects the parameters
    whose zero-ness decides a normaliser; ``fill`` (per part, 0 or 1) replaces inputs there by
    constants (padding, or a fully masked chunk).
    constants (padding, or a fully masked chunk); ``ties`` gives sizes that reshapes tie
    (``_ties``) as products of the others.
    """

    def __init__(self, zero: frozenset[str] = frozenset(), split: Mapping[str, tuple[str, str]] | None = None,
                 fill: Mapping[int, Mapping[Any, Any]] | None = None, known: set[Any] | None = None,
                 ties: Mapping[Any, Any] | None = None, masks: bool = False, rows: frozenset[Any] = frozenset()):
        self.zero, self.split, self.fill, self.ties = zero, dict(split or {}), dict(fill or {}), dict(ties or {})
        self.cases: set[str] = set()
        self.known = known if known is not None else set()  # normalisers positive in this case
        #: ``where`` masks (``masks``): per (predicate, axes), its indicator m and the predicate
        self.masks: dict[tuple[Any, tuple[str, ...]], Any] | None = {} if masks else None
        self.predicates: dict[Any, tuple[Any, tuple[str, ...]]] = {}
        #: the indicators of partly masked parameters (``_row_masked``) whose one row keeps an entry
        self.rows = rows
        #: the input names of the diagram being run (``run``): float64 arrays, each entry -inf or ≥ -FLOAT_MAX
        self.inputs: set[str] = set()
        #: an elementwise box outside the fragment (gelu) read as an unknown function of its operand
        self.opaque = False
        #: the bindings of the diagram being run (``cancelled`` reads its operands' terms)
        self.defs: Mapping[str, Expr] = {}
        #: a run of rewritten terms normalised alone (``_offsets_cancelled``, ``_alike_around``): a fresh atom
        #: they scale or stand for an operand with may drop out of a difference (``cancelled``'s non-zero case)
        self.probe = False
        #: the integer inputs of the diagram being run (a onehot's operand must be integer-valued in a join)
        self.integers: set[str] = set()

    def size(self, a: str) -> Any:
        return sum((_n(p) for p in self.split[a]), sympy.Integer(0)) if a in self.split else _n(a).xreplace(self.ties)

    def reduce(self, kind: str, body: Any, axes: tuple[str, ...]) -> Any:
        # a reduction over a binds i_a in its body as j_a; where a nested reduction over a already
        # binds j_a and i_a is free in it (a rename moved a position there: sum[t](rename[s -> t](
        # sum[t](X))); or the exchange Σ_b (u · Σ_x v) = Σ_{b x} (u·v) took in a factor u reading
        # the outer x), binding i_a would capture it: X's diagonal where it sums every entry
        if any(_i(a) in r.free_symbols for r in body.atoms(_Reduction) for a in set(axes) & set(r.axes)):
            raise Unproved(f"a reduction over `{', '.join(axes)}` of a term in which a nested reduction over the same "
                           f"axis reads that axis's outer position (after a rename or an exchange): binding it would "
                           f"capture it, outside the proved fragment")
        join = {"Sum": sympy.Add, "Max": maximum, "Min": minimum, "Prod": sympy.Mul}[kind]
        return self._parts(body, axes, lambda b, a: reduce(kind, b, a), join)

    def _parts(self, body: Any, axes: tuple[str, ...], fold: Callable[[Any, tuple[str, ...]], Any],
               join: Callable[..., Any]) -> Any:
        chunked = [a for a in axes if a in self.split]
        if not chunked:
            return fold(body, axes)
        a, rest = chunked[0], tuple(b for b in axes if b != chunked[0])
        parts = []
        for k, part in enumerate(self.split[a]):
            piece = body.xreplace({_i(a): _i(part)})
            if self.fill.get(k):  # padded (or fully masked) positions: each input along the axis is a constant
                at, values = _i(part), self.fill[k]
                piece = piece.replace(lambda e, s=at, v=values: getattr(e, "func", None) in v
                                      and s in e.free_symbols, lambda e, v=values: v[e.func])
            parts.append(self._parts(piece, (*rest, part), fold, join))
        return join(*parts)

    def positive(self, d: Any, what: str) -> Any:
        if not self.is_positive(d):
            raise Unproved(f"{what} of `{d}`, not known positive")
        return d

    def is_positive(self, d: Any) -> bool:
        """Is ``d`` positive in this case: by sympy's assumptions, with the normalisers ``known``
        positive here and the reductions ``held`` says?"""
        return bool(d.xreplace(self.held(d)).is_positive is True)

    def held(self, *values: Any) -> dict[Any, Any]:
        """What this case knows of the atoms of ``values``, as symbols to put in their place:
        the normalisers ``known`` and every sum that keeps a term of every row (``kept``) are
        positive, the maximum of a row that keeps an entry (``_input_max``) is real."""
        held: dict[Any, Any] = {k: sympy.Dummy(positive=True) for k in self.known}
        for a in set().union(*(getattr(v, "atoms", lambda *_: set())(_Reduction) for v in values)):
            if self.kept(a):
                held[a] = sympy.Dummy(positive=True)
            elif a.kind == "Max" and _input_max(a, self.rows):
                held[a] = sympy.Dummy(real=True)
        return held

    def equal(self, left: tuple[Any, ...], right: tuple[Any, ...]) -> bool:
        """``_all_equal`` with the atoms this case knows of (``held``) as such symbols (one per
        atom, on both sides), so that the field algebra may use their sign."""
        held = self.held(*left, *right)
        return _all_equal(tuple(v.xreplace(held) for v in left), tuple(v.xreplace(held) for v in right))

    # ---- where masks (``masks``; README "Training"): where(p, a, b) = m·a + (1 - m)·b with m the
    # indicator of p (an opaque function of the positions, m² = m: ``unmasked``), and a -inf fill
    # written a + log m, which only exp (m·exp a), a finite shift and the exp-normalised
    # reductions may read (``reads_masks``); a sum of m·(positive) is positive where p holds at
    # position 0 of the summed axes for every position of the others (``kept``).

    def where(self, node: Box, a: Any, b: Any) -> Any:
        assert self.masks is not None
        key = (node.index, node.target)
        if key not in self.masks:
            m = sympy.Function(f"Mask{len(self.masks)}", nonnegative=True)
            self.masks[key], self.predicates[m] = m, key
        m = self.masks[key](*[_i(a) for a in node.target])
        if self.masked(a) or self.masked(b) or a.has(sympy.oo, -sympy.oo):
            raise Unproved("a `where` of a masked or infinite value")
        if b == -sympy.oo:
            return a + sympy.log(m)
        if b.has(sympy.oo, -sympy.oo):
            raise Unproved("a `where` filled with +inf")
        return m * a + (1 - m) * b

    def reads_masks(self, node: Box, args: tuple[Any, ...]) -> bool:
        """May ``node`` read its -inf-masked operands (``_Semantics.where``)?  exp, a sum or a
        difference with a finite term (the mask on the left), and the scores of logsumexp and of
        the exp-normalised boxes: each gives the evaluator's value at m = 0."""
        masked = [self.masked(a) for a in args]
        if any(a.has(sympy.oo, -sympy.oo) for a in args) or (any(masked[1:]) and node.op != "add"):
            return False
        weights = ops.OPS[node.op].weights or node.params
        return node.op in ("exp", "add", "sub", "logsumexp") or weights == ("exp", "exp", "id")

    def masked(self, x: Any) -> bool:
        """Does ``x`` hold a -inf mask (a log m term)?"""
        return any(f.args[0].func in self.predicates for f in getattr(x, "atoms", lambda *_: ())(sympy.log))

    def kept(self, d: Any) -> bool:
        """Is ``d`` a sum whose body is a product of positive factors and masks that each keep
        position 0 of the summed axes (so a term of every row is positive), or of positive
        factors and one indicator of ``rows`` whose every position the sum runs over (its row
        keeps an entry, which is then a positive term)?"""
        if not isinstance(d, _Reduction) or d.kind != "Sum" or not (self.predicates or self.rows):
            return False
        bound = {_j(a) for a in d.axes}
        rows = [f for f in sympy.Mul.make_args(d.args[0]) if f.func in self.rows]
        if rows:
            return len(rows) == 1 and set(rows[0].args) <= bound and len(set(rows[0].args)) == len(rows[0].args) \
                and all(f.is_positive for f in sympy.Mul.make_args(d.args[0]) if f is not rows[0])
        for f in sympy.Mul.make_args(d.args[0]):
            if f.is_positive:
                continue
            if f.func not in self.predicates or not all(s.is_Symbol for s in f.args):
                return False
            pred, axes = self.predicates[f.func]
            # position 0 only along the axes this sum binds: a j_ symbol bound by an enclosing sum (the
            # row of a nested normaliser, Σ_x sign(Σ_y m(x, y)·e)) is any position of its row, not 0
            at = {a: sympy.Integer(0) if s in bound else sympy.Dummy(integer=True, nonnegative=True)
                  for a, s in zip(axes, f.args, strict=True)}
            if _holds(pred, at) is not sympy.true:
                return False
        return True

    def unmasked(self, x: Any) -> Any:
        """``x`` expanded with m^k = m for each mask m (an indicator); raises ``Unproved`` if a
        -inf mask is left (log m: the value is -inf somewhere)."""
        if self.masked(x):
            raise Unproved("a -inf mask reaches an output")
        return _expand(x).replace(lambda f: f.is_Pow and f.base.func in self.predicates and f.exp.is_positive,
                                  lambda f: f.base)

    def log(self, x: Any, operand: Expr) -> Any:
        """log of a positive term; log 0 = -inf, the evaluator's value (a fully masked row's
        logsumexp, whose Σ exp(-inf) is exactly 0).  In a join (``masks``), log of a term 1 over the
        reals computed from inputs (``operand``, not a literal) is a cancellation to 0 as a difference
        is (``cancelled``): float64 computes exp(u)·exp(-u) as 1 ± 2^-52, whose log ±1.1e-16 a later
        factor amplifies (exp(tanh(log(·)·exp(40))) is e^±1, not 1, at u = 1e-16; red team rtjoin2)."""
        if x == 0:
            self.zero_read("log")
            return -sympy.oo
        if self.masks is not None and _expand(x) == 1 and not isinstance(operand, Const):
            raise FloatHazard("`log` reads a term computed from the inputs that is 1 over the reals; float64 may "
                              "compute it as 1 ± a rounding residue, whose log (of either sign, where the reals' "
                              "is 0) a later box need not scale back")
        return sympy.log(self.positive(x, "log"))

    def zero_read(self, op: str) -> None:
        """In a join (``masks``), refuse a term that is 0 over the reals read by ``op`` where 0 is a jump
        (log's -inf, sign's 0, sqrt's edge, a normaliser's 0 convention): there it is no fully masked row
        (masks are opaque indicators) nor a -inf input, but a cancellation of terms equal over the reals,
        which float64 computes as a rounding residue of either sign, additive (``cancelled``: sum[x](X·3) -
        sum[x](X)·3 is 2.8e14 at X ≈ 1e29, where tanh(log(square(·))) is 1, not the -1 of the reals' -inf) or
        not (log(exp(X)·exp(-X)) is ±1e-16, where sign is ±1, not 0; red team rt3)."""
        if self.masks is not None:
            raise FloatHazard(f"`{op}` reads a term that is 0 over the reals, where {op} jumps; float64 may "
                              f"compute that term as a rounding residue of either sign (a cancellation of terms "
                              f"equal over the reals), which {op} reads otherwise")

    def cancelled(self, node: Box, operands: tuple[Any, ...], value: Any) -> None:
        """In a join (``masks``), refuse a sum, difference or sum reduction of non-zero terms that is 0 over
        the reals (a cancellation), unless float64 computes its two operands alike (``a - a``, ``a + -a``):
        elsewhere float64 computes it as their rounding errors' difference, of either sign and as large as
        2^-53 of the operands, which a later box need not scale back: exp(tanh(sum[x](X·3) - sum[x](X)·3)) is 1
        over the reals and e^±1 at X ≈ 1e29 (red team rt3)."""
        if self.masks is None or any(o == 0 for o in operands):
            return
        if (total := _expand(value)) != 0:
            # a difference cancelling to a non-zero term the inputs both operands read drop out of:
            # (K + 1/K)² - (K - 1/K)² is 4 over the reals and 0 in float64 at K = e^40 (red team rtjoin2)
            if self.probe or node.op not in ("add", "sub"):
                return
            if (_data(operands[0]) & _data(operands[1])) - _data(total):
                raise FloatHazard(f"`{node.op}` of terms reading inputs its value over the reals does not "
                                  f"(they cancel), which float64 may round to their magnitude's residue")
            return
        if node.op in ("add", "sub"):
            def bare(e: Expr) -> tuple[int, Expr]:  # the operand as float64 computes it, and its sign
                e = _canonical(expanded(e, self.defs))
                if isinstance(e, Box) and (e.op == "neg" or (e.op == "sub" and e.args[0] == Const(0.0))):
                    return -1, e.args[-1]
                return 1, e
            (s1, a), (s2, b) = bare(node.args[0]), bare(node.args[1])
            if a == b and s1 * s2 == (1 if node.op == "sub" else -1):
                return
        raise FloatHazard(f"`{node.op}` cancels terms equal over the reals to 0, which float64 computes otherwise "
                          f"(as their rounding errors' difference, of either sign)")

    def run(self, diagram: Diagram, inputs: list[Any]) -> tuple[Any, ...]:
        self.inputs = {p.name for p in diagram.inputs} - {n for let in diagram.body for n in let.names}
        self.integers = {p.name for p in diagram.inputs if p.integer}
        self.defs = diagram.bindings()
        def visit(node: Expr, kids: tuple[Any, ...], env: Mapping[str, Any]) -> Any:
            if isinstance(node, Var):
                return env[node.name]
            if isinstance(node, Const):
                return _constant(node.value)
            if isinstance(node, Size):
                return self.size(node.axis)
            if not isinstance(node, Box):
                raise Unproved("a diagram used as a box")
            return self.box(node, kids)

        return tuple(v.xreplace(self.ties) for v in run_diagram(diagram, inputs, visit))

    def box(self, node: Box, args: tuple[Any, ...]) -> Any:
        op, t = node.op, node.target
        x: Any = args[0] if args else None
        if op == "where" and self.masks is not None:
            return self.where(node, *args)
        if self.predicates and any(self.masked(a) for a in args) and not self.reads_masks(node, args):
            raise Unproved(f"a -inf mask meets `{op}`")
        if op == "exp":
            return sympy.exp(x)
        if op == "log":
            return self.log(x, node.args[0])
        if op == "neg":
            return -x
        if op == "square":
            return x**2
        if op == "tanh":  # total and smooth on the reals (a softcap: c·tanh(S / c))
            return sympy.tanh(x)
        if op in ("abs", "sign"):  # the guarded finaliser's |sign d|: 0 exactly where d is 0
            if op == "sign" and x == 0:
                self.zero_read(op)
            return sympy.Abs(x) if op == "abs" else sympy.sign(x)
        if op == "sqrt":
            if x.is_nonnegative is not True:
                raise Unproved(f"sqrt of `{x}`, not known non-negative")
            if x == 0:  # a negative residue's sqrt is NaN
                self.zero_read(op)
            return sympy.sqrt(x)
        if op in ("recip", "rsqrt"):
            return 1 / self.positive(sympy.sqrt(x) if op == "rsqrt" else x, op)
        # the guarded shift: a maximum of finite float64 inputs, or a float64 input itself (a backward's
        # saved statistic L, ``grad._weights``), is -inf or at least -FLOAT_MAX
        if op == "maximum" and args[1] == _constant(-acc.FLOAT_MAX) and (
                _input_max(x, self.rows) or self.float_input(node.args[0], x)):
            return args[1] if x == -sympy.oo else x
        if op in ("add", "sub", "mul", "maximum", "minimum"):
            y = args[1]
            value = {"add": x + y, "sub": x - y, "mul": x * y, "maximum": maximum(x, y), "minimum": minimum(x, y)}[op]
            if op in ("add", "sub"):
                self.cancelled(node, args, value)
            return value
        if op == "div":
            return x / self.positive(args[1], "division")
        if op in ("sum", "mean"):
            total = self.reduce("Sum", x, t)
            self.cancelled(node, args, total)
            return total if op == "sum" else total / sympy.Mul(*[self.size(a) for a in t])
        if op in ("max", "min", "prod"):
            return self.reduce(op.capitalize(), x, t)
        if op == "logsumexp":
            return self.log(self.reduce("Sum", sympy.exp(x), t), node)
        if op == "contract":
            total = self.reduce("Sum", sympy.Mul(*args), t)
            self.cancelled(node, args, total)
            return total
        if (weights := ops.OPS[op].weights) is not None:  # a normalisation: its normalised-contraction weights
            return self.weights(node, weights, x)
        if op == "ncontract":
            return self.reduce("Sum", self.weights(node, node.params, x) * args[1], t)
        if op == "transpose":  # a reorder of named axes: the value at each named position is unchanged
            return x
        if op in ("index", "onehot") and set(t) & set(self.split):
            raise Unproved(f"`{op}` reads the positions of a chunked axis")
        if op == "index":  # the integer value of the index expression at each position
            assert node.index is not None
            return fold_index(node.index, _i, sympy.Integer, lambda o, u, v: _ARITH[o](u, v))  # type: ignore[arg-type]
        if op == "onehot":  # 1 where the position along the new axis equals the operand, else 0
            operand = expanded(node.args[0], self.defs)
            if self.masks is not None and isinstance(operand, Box) and not ops.integer_valued(operand, self.integers):
                # its atom is keyed by the operand's value over the reals: a computed real equal there to an integer
                # (Σ 3·e / Σ e) may be computed off it, where onehot jumps; an input (labels) is what it holds
                raise FloatHazard("`onehot` reads a computed term that is not integer-valued, and jumps at every "
                                  "integer; float64 may compute it off the integer it is over the reals")
            return _ONEHOT(x, _i(t[0]))
        if op == "cumsum" and self.masks is not None:  # in joins, which move no positions (``_cumsum``)
            return _cumsum(t[0])(x.xreplace({_i(t[0]): _k(t[0])}), _i(t[0]))
        if op in _RESHAPES and not self.split:
            return self.reshape(node, x)
        if self.opaque and ops.OPS[op].kind == "unary":  # an unknown function of its operand (``_equal_join``)
            return sympy.Function(f"opaque_{op}")(x)
        raise Unproved(f"`{op}` is outside the proved fragment")

    def float_input(self, arg: Expr, x: Any) -> bool:
        """Is ``arg`` an input of the diagram being run, its value ``x`` -oo (a fully masked row's
        statistic) or free of infinities and masks (a finite float64 entry, so at least -FLOAT_MAX)?"""
        if not (isinstance(arg, Var) and arg.name in self.inputs):
            return False
        return x == -sympy.oo or not (x.has(sympy.oo, -sympy.oo) or any(
            f.args[0].func in self.predicates or f.args[0].func in self.rows for f in x.atoms(sympy.log)))

    def reshape(self, node: Box, x: Any) -> Any:
        """split[w -> p1 … pk] (and rename, k = 1) reads position i_w = (i_p1·n_p2 + i_p2)·n_p3 + …;
        join[p1 … pk -> w] reads i_pk = Rem(i_w, n_pk), i_pk-1 = Rem(Quo(i_w, n_pk), n_pk-1), …,
        i_p1 the last quotient (< n_p1 as i_w < n_w = Π n_p); indices then normalised (``index``)."""
        whole, parts = _reshape_axes(node)
        if node.op == "join":
            place, rest = {}, _i(whole)
            for p in reversed(parts[1:]):
                place[_i(p)], rest = Rem(rest, self.size(p)), Quo(rest, self.size(p))
            place[_i(parts[0])] = rest
        else:
            position = _i(parts[0])
            for p in parts[1:]:
                position = position * self.size(p) + _i(p)
            place = {_i(whole): position}

        def size(s: Any) -> Any:
            return self.size(s.name[2:]) if s.is_Symbol and s.name[:2] in ("i_", "j_") else None

        return x.xreplace(place).replace(lambda e: isinstance(e, AppliedUndef),
                                         lambda e: e.func(*(index(a, size) for a in e.args)))

    def weights(self, node: Box, params: tuple[str, ...], s: Any) -> Any:
        """a1(S) / b(Σ a2(S)), 0 where the normaliser is 0 (the evaluator's convention)."""
        a1, a2, b = params
        f = {"exp": sympy.exp, "id": lambda v: v, "square": lambda v: v**2}
        if a1 not in f or a2 not in f:
            raise Unproved(f"activation `{a1 if a1 not in f else a2}` is outside the proved fragment")
        z = self.reduce("Sum", f[a2](s), node.target)
        count = sympy.Mul(*[self.size(a) for a in node.target])
        denom = {"id": z, "sqrt": sympy.sqrt(z), "rms": sympy.sqrt(z / count)}[b]
        if denom == 0:
            self.zero_read(node.op)
            return sympy.Integer(0)
        if not self.is_positive(denom):
            # Σ S² is 0 iff S is 0 along the row: a case of its own
            arg = node.args[0]
            if a2 != "square" or not isinstance(arg, Var) or not set(arg.axes) <= set(node.target):
                raise Unproved(f"normaliser `{denom}` may be 0 and is not a case split on one row")
            self.cases.add(arg.name)
            self.known.add(z)  # in this case S is not 0 along the row, so Σ S² > 0
        return f[a1](s) / denom


#: onehot's value: an opaque 0/1 function of the operand's value and the position (a name no input has)
_ONEHOT = sympy.Function("onehot'", nonnegative=True)


def _k(a: str) -> sympy.Symbol:
    return sympy.Symbol(f"k_{a}", integer=True)


@cache
def _cumsum(a: str) -> Any:
    """cumsum[a](X) at position i_a: the opaque atom ``cumsum'a(X[i_a := k_a], i_a)``, Σ of its
    body over k_a ≤ i_a, which binds k_a in its body.  k_a occurs nowhere else (only scans bind
    it) and no reduction binds it, so an atom's body is a function of k_a and the other axes'
    free positions alone: equal atoms are equal sums.  Only in joins (``prove_join``), where no
    reshape moves a position into an atom's body (a rename of s to a there would let a later
    scan over a capture it) and no axis is chunked."""
    return sympy.Function(f"cumsum'{a}", real=True)
_RELATIONS = {">=": sympy.Ge, "<=": sympy.Le, "==": sympy.Eq, "!=": sympy.Ne, ">": sympy.Gt, "<": sympy.Lt}
_ARITH = {"+": sympy.Add, "-": lambda u, v: u - v, "*": sympy.Mul}


def _holds(pred: Any, at: Mapping[str, Any]) -> Any:
    """The index predicate ``pred`` as a sympy boolean, each axis's position given by ``at``."""
    def side(e: Any) -> Any:
        return fold_index(e, at.__getitem__, sympy.Integer, lambda op, u, v: _ARITH[op](u, v))

    return fold_pred(pred, lambda op, x, y: _RELATIONS[op](side(x), side(y)),
                     lambda op, x, y: sympy.Not(x) if y is None else (sympy.And if op == "and" else sympy.Or)(x, y))


def _equal(left: Any, right: Any) -> bool:
    if left == right:  # the same term (also the same infinity, where a difference would be nan)
        return True
    d = sympy.expand_log(_expand(left - right))
    return bool(d == 0 or sympy.cancel(sympy.together(_expand(d))) == 0)


def _data(e: Any) -> set[Any]:
    """The real inputs a term reads (``_input``'s functions and scalars; not sizes, positions or indicators)."""
    atoms = sympy.sympify(e).atoms(sympy.Symbol, AppliedUndef)
    return {a.func if isinstance(a, AppliedUndef) else a for a in atoms if a.is_real and a.is_integer is not True
            and (isinstance(a, AppliedUndef) or not a.name.startswith(("i_", "j_", "k_", "n_")))}


def _input(name: str, axes: tuple[str, ...], split: Mapping[str, str] | None = None) -> Any:
    position = [_i((split or {}).get(a, a)) for a in axes]
    return sympy.Function(name, real=True)(*position) if position else sympy.Symbol(name, real=True)


@cache
def prove_lemma(lemma: LemmaDecl) -> str | None:
    """``proved: ...`` if both sides agree at every size on finite inputs, else None (with why
    in ``why_unproved``); it names the parameters for which ``-inf`` masks are proved too
    (``masks_unproved``), in the form ``finiteness.narrowed`` reads."""
    if why_unproved(lemma):
        return None
    masks = _scores(lemma) if masks_unproved(lemma) is None else []
    axes = {_n(a.name): sympy.Symbol(a.name) for a in lemma.axes}
    tied = ", ".join(f"{axes[k]} = {str(v.xreplace(axes)).replace('*', '·')}" for k, v in _ties(lemma).items())
    where = f" where the left side is defined ({tied})" if tied else ""
    return f"proved: symbolically at every size{where}, on finite real inputs" + (
        f" [-inf masks: {', '.join(masks)}]" if masks else "")


def _scores(lemma: LemmaDecl) -> list[str]:
    """The parameters read only as scores (``_scores_only``), which may be proved for masks."""
    return [p.name for p in lemma.params if all(_scores_only(side, p.name) for side in (lemma.lhs, lemma.rhs))]


#: the most score parameters whose mask cases (2 per parameter, every mix) are tried
_MAX_MASKED = 4


@cache
def masks_unproved(lemma: LemmaDecl) -> str | None:
    """Why the lemma is not proved when the entries of its score parameters (``_scores``) may
    also be ``-inf`` (masks), or None when it is.

    Such a parameter S is one row (the scores of boxes over all its axes), read only through
    exp(S) and max(S).  Each row is one of two cases, and every mix of the parameters' cases
    must normalise to the same term (``_disagreement``):

    - partly masked (``kept``): S = S' + log m with S' finite and m an opaque 0/1 indicator
      of the positions (exp(S) = m·exp(S'), exactly 0 where masked: a mask at positions that
      depend on the index, a prefix, a band, a single key kept, any predicate), which keeps at
      least one position, so a sum of m·(positive) over the row is positive (``kept``) and
      max(S) a maximum of finite entries (an opaque atom); a finite row is the case m = 1;
    - fully masked (``full``): S = -inf everywhere (exp(-inf) = 0, the evaluator's
      zero-normaliser convention, log 0 = -inf)."""
    scores = _scores(lemma)
    if not scores:
        return "no parameter is read only as the scores of softmax, logsumexp, max or ncontract[exp, exp, id]"
    if len(scores) > _MAX_MASKED:
        return f"{len(scores)} score parameters: more than {_MAX_MASKED} to try every mix of masked rows"
    for kinds in itertools.product(("kept", "full"), repeat=len(scores)):
        masked = dict(zip(scores, kinds, strict=True))
        why = _disagreement(lemma, masked)
        if why:
            rows = ", ".join(f"{n} {'partly' if k == 'kept' else 'fully'} masked" for n, k in masked.items())
            return f"with {rows}: {why}"
    return None


def _row_mask(name: str) -> Any:
    """The indicator of parameter ``name``'s unmasked positions (a name no input has)."""
    return sympy.Function(f"{name}'kept", nonnegative=True)


def _disagreement(lemma: LemmaDecl, masked: Mapping[str, str]) -> str | None:
    """Why the sides of ``lemma`` do not normalise to the same term (None: they do), in every
    normaliser case (a parameter taken 0, ``_Semantics.weights``), with each parameter of
    ``masked`` partly (``"kept"``) or fully (``"full"``) masked as ``masks_unproved`` says."""
    rows = frozenset(_row_mask(p.name) for p in lemma.params if masked.get(p.name) == "kept" and p.axes)

    def value(p: Param, zero: frozenset[str]) -> Any:
        if p.name in zero:
            return sympy.Integer(0)
        if masked.get(p.name) == "full":
            return -sympy.oo
        x = _input(p.name, p.axes)
        return x + sympy.log(_row_mask(p.name)(*[_i(a) for a in p.axes])) if _row_mask(p.name) in rows else x

    zero: frozenset[str] = frozenset()
    tried: set[frozenset[str]] = set()
    pending = [zero]
    while pending:
        zero = pending.pop()
        tried.add(zero)
        inputs = [value(p, zero) for p in lemma.params]
        try:
            sem = _Semantics(zero, ties=_ties(lemma), rows=rows)
            left = sem.run(_side(lemma, lemma.lhs), inputs)
            right = sem.run(_side(lemma, lemma.rhs), inputs)
        except Unproved as exc:
            return str(exc)
        if not sem.equal(left, right):
            where = f" with {', '.join(sorted(zero))} = 0" if zero else ""
            return f"the sides do not normalise to the same term{where}"
        pending += [zero | {c} for c in sem.cases if zero | {c} not in tried]
    return None


#: boxes whose first operand is read only through exp(S) and max(S) (the scores)
_SCORES = {"softmax", "logsumexp", "max"}


def _scores_only(expr: Expr, name: str) -> bool:
    """Every occurrence of ``Var(name)`` in ``expr`` is the scores (first operand) of a box of
    ``_SCORES`` or of ncontract[exp, exp, id] over exactly its axes, alone or shifted by a
    term without it (``S - c``, ``S + c``, ``c + S``)."""
    def uses(e: Expr) -> bool:
        return any(isinstance(n, Var) and n.name == name for n in _walk(e))

    def alone(e: Expr) -> bool:
        return isinstance(e, Var) and e.name == name

    if not uses(expr):
        return True
    if not isinstance(expr, Box):
        return False  # the variable itself, outside a scores position
    if expr.op in _SCORES or (expr.op == "ncontract" and expr.params == ("exp", "exp", "id")):
        s = expr.args[0]
        var: Expr | None = s if alone(s) else None
        if isinstance(s, Box) and ((s.op == "sub" and alone(s.args[0]) and not uses(s.args[1]))
                                   or (s.op == "add" and sum(uses(a) for a in s.args) == 1)):
            var = next((a for a in s.args if alone(a)), None)  # S shifted by a term without it
        if var is not None and set(var.axes) == set(expr.target):
            return not any(uses(a) for a in expr.args[1:])
    return all(_scores_only(a, name) for a in expr.args)


def _walk(expr: Expr) -> list[Expr]:
    return [expr, *(n for a in expr.args for n in _walk(a))] if isinstance(expr, Box) else [expr]


@cache
def why_unproved(lemma: LemmaDecl) -> str | None:
    """Why ``lemma`` is not proved on finite inputs (None when it is)."""
    return _disagreement(lemma, {})


def prove_join(forward: Diagram, reference: Diagram,
               backwards: Sequence[tuple[Diagram, Sequence[tuple[str, int]], Sequence[int]]]) -> str:
    """``proved: ...`` if the ``backwards`` (each a diagram, the source of each of its inputs,
    ``("input" | "output" | "cotangent", k)``, and the forward input each of its outputs is the
    gradient of) give, summed per forward input, the outputs of ``reference`` (the forward's VJP
    diagram, inputs: the forward's, then one cotangent per primal output) at every size on
    finite real inputs; raises ``Unproved`` saying where they leave the fragment or differ."""
    try:
        _equal_join(forward, reference, backwards)
    except Unproved as why:
        # the prover's incompleteness (a data mask's `eq`, gelu, a gather): the join may still rest on the
        # float64 test (--allow-tested-join), whose inputs need not reach a float64 hazard.  So the hazard
        # checks run here too, on the instance where each data mask keeps every entry (``_masks_kept``): an
        # overflow there (exp(S)·exp(0 - L) at S = 800) is float64's, while a row a mask empties (L = -inf,
        # exp(S - L) NaN) is a hole over the extended reals too, which the test and README's opt-in
        # paragraph answer for.  The overflow check needs no equality proof; the others (an absorption
        # cancelled, an underflowed sign, a sum of gradients cancelling) read the sides as equal, so they
        # run where that instance is proved equal (a document mask's `eq` read as keeping every key is the
        # unmasked join), and a hazard found there refuses the join (only ever a refusal added)
        kept = _masks_kept(forward, reference, backwards)
        try:
            _equal_join(*kept)
        except FloatHazard as hazard:  # met on the way (a cancellation), not the prover's incompleteness
            raise FloatHazard(f"where each data mask keeps every entry, {hazard}; the join is not proved "
                              f"({why})") from None
        except Unproved:
            equal = False
        else:
            equal = True
        try:
            _finite_where_the_vjp_is(*kept, overflow_only=not equal)
        except FloatHazard as hazard:
            where = "where each data mask keeps every entry, " if equal else ""
            raise FloatHazard(f"{where}{hazard}; the join is not proved either ({why})") from None
        # not even there: the gradients that normalise alike with each elementwise box outside the fragment an
        # unknown function of its operand (dX = dy·(W + 1000) - dy·1000 beside a gelu) get the other checks too,
        # each input's alone; a check the prover cannot finish on them is no verdict (the test answers for it)
        proved: set[int] = set()
        try:
            proved = set() if equal else _equal_gradients(*kept)
            if proved:
                _finite_where_the_vjp_is(*kept, proved=proved)
        except FloatHazard as hazard:
            names = ", ".join(forward.inputs[i].name for i in sorted(proved))
            if not names:  # met by the semantics itself (``_equal_gradients``: a cancellation)
                raise FloatHazard(f"where each data mask keeps every entry and each box outside the fragment is an "
                                  f"unknown function, {hazard}; the join is not proved ({why})") from None
            raise FloatHazard(f"where each data mask keeps every entry and each box outside the fragment is an "
                              f"unknown function, the gradients of {names} are the VJP's, and {hazard}; the join "
                              f"is not proved ({why})") from None
        except Unproved:
            pass
        raise
    _finite_where_the_vjp_is(forward, reference, backwards)
    return "proved: symbolically at every size, on finite real inputs"


def _equal_join(forward: Diagram, reference: Diagram,
                backwards: Sequence[tuple[Diagram, Sequence[tuple[str, int]], Sequence[int]]]) -> None:
    """Raise ``Unproved`` unless the join's gradients normalise to the VJP's (``prove_join``, over the
    reals: its float64 hazards are ``_finite_where_the_vjp_is``'s)."""
    _in_fragment(forward, reference, backwards)
    sem = _Semantics(masks=True)
    args = [_input(p.name, p.axes) for p in forward.inputs]
    cts = [_input(p.name, p.axes) for p in reference.inputs[len(forward.inputs):]]
    outs = sem.run(forward, args)
    want = sem.run(reference, [*args, *cts])
    got = [sympy.Integer(0) for _ in args]
    for diagram, sources, gives in backwards:
        values = [{"input": args, "output": outs, "cotangent": cts}[kind][k] for kind, k in sources]
        _relations_hold(sem, diagram, values)
        for i, g in zip(gives, sem.run(diagram, values), strict=True):
            got[i] = got[i] + g
    if sem.cases:
        raise Unproved(f"a normaliser of {', '.join(sorted(sem.cases))} may be 0")
    for p, g, w in zip(forward.inputs, got, want, strict=True):
        if not _equal(sem.unmasked(g), sem.unmasked(w)):
            raise Unproved(f"the gradients of {p.name} do not normalise to the same term")


def _in_fragment(forward: Diagram, reference: Diagram,
                 backwards: Sequence[tuple[Diagram, Sequence[tuple[str, int]], Sequence[int]]]) -> None:
    """Raise ``Unproved`` where the join reshapes an axis or computes index arithmetic that may wrap."""
    for d in (forward, reference, *(b for b, _, _ in backwards)):
        if any(isinstance(n, Box) and n.op in _RESHAPES for e in (*(let.expr for let in d.body), *d.outputs)
               for n in _walk(e)):
            raise Unproved(f"`{d.name}` reshapes an axis (the sizes it ties are not tracked here)")
    for d in (forward, reference, *(b for b, _, _ in backwards)):
        # the masks and index values below are read over the integers; the evaluator's int64 wraps
        if (box := index_may_wrap(*(let.expr for let in d.body), *d.outputs)) is not None:
            raise Unproved(f"`{d.name}`'s `{box.op}` computes index arithmetic that may wrap in int64 at some "
                           f"size, where the proof reads it over the integers (finiteness.index_may_wrap)")


def _equal_gradients(forward: Diagram, reference: Diagram,
                     backwards: Sequence[tuple[Diagram, Sequence[tuple[str, int]], Sequence[int]]]) -> set[int]:
    """The forward inputs whose gradients normalise to the VJP's (``_equal_join``), each input's alone (its
    gradients' terms, their bindings, the forward's), with each elementwise box outside the fragment (gelu)
    an unknown function of its operand: equal terms of it are equal whatever it is."""
    _in_fragment(forward, reference, backwards)
    found = set()
    for i in range(len(forward.inputs)):
        sem = _Semantics(masks=True)
        sem.opaque = True
        args = [_input(p.name, p.axes) for p in forward.inputs]
        cts = [_input(p.name, p.axes) for p in reference.inputs[len(forward.inputs):]]
        try:
            outs = sem.run(forward, args)
            (want,) = sem.run(_pruned(reference, (i,)), [*args, *cts])
            got = sympy.Integer(0)
            for diagram, sources, gives in backwards:
                if keep := tuple(m for m, j in enumerate(gives) if j == i):
                    values = [{"input": args, "output": outs, "cotangent": cts}[kind][k] for kind, k in sources]
                    _relations_hold(sem, diagram, values)
                    got = got + sum(sem.run(_pruned(diagram, keep), values), sympy.Integer(0))
            if not sem.cases and _equal(sem.unmasked(got), sem.unmasked(want)):
                found.add(i)
        except FloatHazard:  # a float64 hazard the semantics met (a cancellation): no incompleteness to skip
            raise
        except Unproved:
            continue
    return found


def _pruned(d: Diagram, keep: Sequence[int]) -> Diagram:
    """``d`` with only its outputs ``keep`` and the bindings they read."""
    outputs = tuple(d.outputs[k] for k in keep)
    read = {n.name for e in outputs for n in walk(e) if isinstance(n, Var)}
    live = []
    for let in reversed(d.body):
        if any(name in read for name in let.names):
            live.append(let)
            read |= {n.name for n in walk(let.expr) if isinstance(n, Var)}
    return replace(d, body=tuple(reversed(live)), outputs=outputs, out_types=tuple(d.out_types[k] for k in keep))


def _masks_kept(forward: Diagram, reference: Diagram,
                backwards: Sequence[tuple[Diagram, Sequence[tuple[str, int]], Sequence[int]]]
                ) -> tuple[Diagram, Diagram, list[tuple[Diagram, Sequence[tuple[str, int]], Sequence[int]]]]:
    """The join at inputs where each data mask keeps every entry: each ``select(c, a, -inf)`` (or
    ``select(c, -inf, a)``) of the diagrams, their relations (``given``) included, read as ``a``
    (segment ids all equal, lengths past the axis), where a softmax row keeps its keys; and every other
    ``select`` of such a condition c (its term over the inputs, bindings read through), as the VJP's
    ``select(c, dS, 0)``, read as the operand c picks there, where c keeps entries by one polarity only.
    Such inputs exist for the masks the bundled kernels take (`eq` of ids, `lt` of a length); for a
    condition that cannot hold everywhere, a hazard found here may not be reachable (a refusal, never
    an acceptance, rests on it)."""
    diagrams = (forward, reference, *(b for b, _, _ in backwards))
    polarity: dict[Expr, set[int]] = {}  # a mask's condition over the inputs: the operand it keeps (1 or 2)
    for d in diagrams:
        defs = d.bindings()
        for expr in (*(p.given for p in d.inputs if p.given is not None), *(let.expr for let in d.body), *d.outputs):
            for node in walk(expr):
                if isinstance(node, Box) and node.op == "select":
                    for k in (1, 2):
                        fill = node.args[3 - k]
                        if isinstance(fill, Const) and fill.value == -math.inf and node.args[k].axes == node.axes:
                            polarity.setdefault(_canonical(expanded(node.args[0], defs)), set()).add(k)

    def kept(expr: Expr, defs: Mapping[str, Expr]) -> Expr:
        def visit(node: Expr, args: tuple[Expr, ...]) -> Expr:
            if not isinstance(node, Box):
                return node
            if node.op == "select":
                for fill, other in ((args[2], args[1]), (args[1], args[2])):
                    if isinstance(fill, Const) and fill.value == -math.inf and other.axes == node.axes:
                        return other
                picks = polarity.get(_canonical(expanded(node.args[0], defs)), set())
                if len(picks) == 1 and args[(k := next(iter(picks)))].axes == node.axes:
                    return args[k]
            return replace(node, args=args) if args != node.args else node
        return fold(expr, visit)

    def diagram(d: Diagram) -> Diagram:
        defs = d.bindings()
        inputs = tuple(p if p.given is None else replace(p, given=kept(p.given, defs)) for p in d.inputs)
        body, outputs = [replace(let, expr=kept(let.expr, defs)) for let in d.body], [kept(o, defs) for o in d.outputs]
        # a binding no longer read (the condition ``t = eq(Dq, Dx)`` of the selects read through) is dropped
        read = {n.name for e in (*(p.given for p in inputs if p.given is not None), *outputs) for n in walk(e)
                if isinstance(n, Var)}
        live = []
        for let in reversed(body):
            if any(name in read for name in let.names):
                live.append(let)
                read |= {n.name for n in walk(let.expr) if isinstance(n, Var)}
        return replace(d, inputs=inputs, body=tuple(reversed(live)), outputs=tuple(outputs))
    return diagram(forward), diagram(reference), [(diagram(b), s, g) for b, s, g in backwards]


def _finite_where_the_vjp_is(forward: Diagram, reference: Diagram,
                             backwards: Sequence[tuple[Diagram, Sequence[tuple[str, int]], Sequence[int]]],
                             overflow_only: bool = False, proved: Collection[int] | None = None) -> None:
    """Raise ``Unproved`` where a backward's gradient may overflow in float64 (the finiteness
    analysis cannot vouch for it) while the VJP's gradient of that input is finite: equal terms
    over the reals, the backward's may pass through inf (``S + exp(S) - exp(S)``, ``log(exp(S))``,
    ``0 · exp(S)`` normalise to S, and are NaN or inf at S = 960 where the VJP is 960).  Where the
    analysis cannot vouch for the VJP's gradient either, the backward's must compute what the extended
    reals do (``finiteness.float_unsafe_box``, a lemma right side's check), so that it is finite
    wherever their common value is; where it can, the backward's may still cancel an absorption
    the VJP's does not make (``finiteness.cancelled_absorptions``), a finite but wrong value.
    ``overflow_only``: the first check alone (the others read the two sides as terms proved equal),
    for a join the prover could not prove (``prove_join``).  ``proved``: such a join's inputs whose gradients alone
    normalise to the VJP's (``_equal_gradients``): the first check as ``overflow_only``'s for every input (the
    finiteness analysis's imprecision is no verdict there), and for those inputs the checks that read the sides as
    equal (an underflowed sign, a cancelled absorption, the join's sums)."""
    vouched = [finite(o, reference.bindings(), input_values(reference.inputs)) for o in reference.outputs]
    saved = [expanded(o, forward.bindings()) for o in forward.outputs]
    for diagram, sources, gives in backwards:
        # a forward output the backward reads is the forward's term of the inputs (a relation, as
        # `given` states one), where the backward reads each input that term does; else what the forward
        # computes it as (an array an earlier kernel wrote): a saved O = exp(X) read without X is +inf at
        # X = 800, not a finite input, and g·Z·(O·0 + 1) NaN there where the VJP is g·Z
        read = {p.name for p, (kind, _) in zip(diagram.inputs, sources, strict=True) if kind == "input"}
        params = [p if kind != "output" or p.given is not None or p.written is not None else replace(p, given=saved[k])
                  if all(n.name in read for n in walk(saved[k]) if isinstance(n, Var)) else
                  replace(p, written=replace(forward, outputs=(forward.outputs[k],), out_types=(forward.out_types[k],)))
                  for p, (kind, k) in zip(diagram.inputs, sources, strict=True)]
        # a relation the backward states of a forward output (``given L = logsumexp[x](S)``) is proved of the
        # forward's term over the reals (``_relations_hold``), and the analysis below reads L by it; float64 must
        # compute that term as the extended reals do, else L is another value there: a forward saving
        # L = log(Σ_x exp(S)) gives +inf at S = 800, where exp(S - L) is 0 and the VJP's gradient finite.  A forward
        # computing the relation's own term (``_canonical``: as float64 computes it) feeds exactly its float64 value
        for p, (kind, k) in zip(diagram.inputs, sources, strict=True):
            if kind == "output" and p.given is not None and _canonical(saved[k]) != _canonical(p.given) and (
                    box := overflow_box(saved[k], forward, zeros=True)) is not None:
                raise FloatHazard(f"`{diagram.name}` states `{p.name}` by a relation, and the forward computes it with "
                                  f"`{box.op}`, which float64 may make ±inf, NaN or 0 where the extended reals do not "
                                  f"(finiteness.overflow_box): the relation need not hold of the value fed")
        defs, inputs = diagram.bindings(), input_values(params)
        related = replace(diagram, inputs=tuple(params))
        for out, i in zip(diagram.outputs, gives, strict=True):
            only = overflow_only or (proved is not None and i not in proved)
            # not proved equal (``overflow_only``): a gradient not vouched finite may be the analysis's
            # imprecision (gelu's guarded division), so only one with a box float64 overflows where the
            # extended reals do not (exp(S) at S = 800) is refused; the checks below read the sides as equal
            if vouched[i] and not finite(out, defs, inputs) and (
                    not (overflow_only or proved is not None)
                    or overflow_box(expanded(out, defs), related) is not None):
                raise FloatHazard(f"`{diagram.name}`'s gradient of {forward.inputs[i].name} may overflow in float64 "
                                  f"where the VJP's is finite (finiteness.finite cannot vouch for it)")
            if only:
                continue
            # where the analysis cannot vouch for the VJP's gradient either, it may still be finite where the
            # backward's is not (8·X⁷·g + exp(X) - exp(X) is NaN at X = 800, the VJP 1.7e21): the backward must
            # then compute what the extended reals do (no box float64 makes ±inf, NaN or 0 where they would
            # not), as a lemma's right side must at a use, so it is finite wherever their common value is
            term = expanded(out, defs)
            if proved is None and not vouched[i] and (box := float_unsafe_box(term, (), related)) is not None:
                raise FloatHazard(f"`{diagram.name}`'s gradient of {forward.inputs[i].name} may overflow in float64 at "
                                  f"`{box.op}` where the extended reals do not, and the VJP's is not vouched finite "
                                  f"either (finiteness.float_unsafe_box)")
            # sign jumps at 0: the prover reads sign(e) of an e it knows positive as 1, but float64 may underflow
            # e to 0 (sign(exp(X·1e-4 - 744)) is 0 at X = -5000, so S·sign(...) gave 0 where the VJP is S):
            # each sign's operand must compute what the extended reals do
            for node in walk(term):
                if isinstance(node, Box) and node.op == "sign" and float_unsafe_box(node.args[0], (), related):
                    raise FloatHazard(f"`{diagram.name}`'s gradient of {forward.inputs[i].name} takes the sign of a "
                                      f"term float64 may round to 0 or past the extended reals' value "
                                      f"(finiteness.float_unsafe_box)")
            # an absorption then cancelled: (S + C) - C is S over the reals, 0 in float64 where C = exp(46.5) drops
            # S whole; a finite error the finiteness checks cannot see, so refused unless the VJP cancels the same
            # absorbing sum (its term, the backward's inputs read as the VJP's: a running sum's Σ g - cumsum g; ALiBi's
            # scores S - m·(q - x), which the backward shifts by the saved L, the VJP's softmax by their maximum) and
            # its error reaches both values alike (``_alike_around``): computing it is not enough, a VJP may hold it
            # where its error does not reach its value (0.0 · tanh(X + C)), or weighted otherwise (0.5 · ((X + C) - C))
            # also over the VJP's inputs, a saved forward output read as its term: a backward reading the saved
            # O = X + C sees O - C as a difference of inputs, the forward having absorbed X into O
            over = _as_the_vjps(term, diagram, sources, forward, reference, saved)
            want = expanded(reference.outputs[i], reference.bindings())
            # an absorbing sum one of whose operands' share of the value cancels over the reals, by whatever box:
            # Σ_t (X - mean X)·(Y + C) is Σ_t (X - mean X)·Y, the weights summing to 0, but 0 in float64 where
            # C = exp(46.5) absorbs Y (no sum or difference cancels it: a reduction does)
            offsets = [(b, None, b) for b in _offsets_cancelled(over, reference, i)]
            if vouched[i] or offsets:
                made = [*cancelling_sums(want, reference), *(_offsets_cancelled(want, reference, i) if offsets else ())]
                for box, inner, same in [
                        *((b, n, _as_the_vjps(n, diagram, sources, forward, reference, saved))
                          for b, n in (cancelled_absorptions(term, related) if vouched[i] else ())),
                        *((b, n, n) for b, n in (cancelled_absorptions(over, reference) if vouched[i] else ())),
                        *offsets]:
                    if not _made(same, made) or not _alike_around(same, over, want, reference, i):
                        where = f" at {box.span}" if box.span is not None else ""
                        if inner is None:
                            raise FloatHazard(f"`{diagram.name}`'s gradient of {forward.inputs[i].name} computes "
                                              f"`{_short(box)}`{where}, which float64 may round to its larger "
                                              f"operand, and one operand's share of the gradient cancels over the "
                                              f"reals (by a reduction whose weights sum to 0, a softmax's shift, or "
                                              f"boxes that give the sum back: an absorption the VJP's gradient does "
                                              f"not make)")
                        raise FloatHazard(f"`{diagram.name}`'s gradient of {forward.inputs[i].name} computes "
                                          f"`{_short(box)}`{where}, where float64 may round `{_short(inner, 40)}` to "
                                          f"its larger operand and the outer sum cancel the rest (an absorption the "
                                          f"VJP's gradient does not make: finiteness.cancelled_absorptions)")
    if not overflow_only:
        _joined_sums_alike(forward, reference, backwards,
                           [v and (proved is None or i in proved) for i, v in enumerate(vouched)], saved)


def _joined_sums_alike(forward: Diagram, reference: Diagram,
                       backwards: Sequence[tuple[Diagram, Sequence[tuple[str, int]], Sequence[int]]],
                       vouched: Sequence[bool], saved: Sequence[Expr]) -> None:
    """Raise ``Unproved`` where the sum the join makes of one input's gradients from several backwards
    (the lowered function adds them in float64) cancels an absorption no one backward makes, as
    ``_finite_where_the_vjp_is`` refuses one inside a backward: ``g·(X + C)`` and ``0 - g·C`` are g·X over
    the reals, 0 in float64 at X = 1, C = exp(46.5), where the VJP is 1.  Their terms are read over the
    VJP's inputs (``_as_the_vjps``), the forward's saved outputs as its terms."""
    parts: dict[int, list[Expr]] = {}
    for diagram, sources, gives in backwards:
        for out, i in zip(diagram.outputs, gives, strict=True):
            parts.setdefault(i, []).append(
                _as_the_vjps(expanded(out, diagram.bindings()), diagram, sources, forward, reference, saved))
    for i, terms in parts.items():
        if len(terms) < 2 or not vouched[i]:
            continue
        total, joins = terms[0], []
        for t in terms[1:]:
            total = Box("add", (total, t), reference.out_types[i])
            joins.append(total)
        want = expanded(reference.outputs[i], reference.bindings())
        made = cancelling_sums(want, reference)
        for box, inner in cancelled_absorptions(total, reference):
            if any(box is j for j in joins) and (
                    not _made(inner, made) or not _alike_around(inner, total, want, reference, i)):
                raise FloatHazard(f"the join's sum of the backwards' gradients of {forward.inputs[i].name} may cancel "
                                  f"an absorption: float64 may round `{_short(inner, 40)}` to its larger operand (an "
                                  f"absorption the VJP's gradient does not make: finiteness.cancelled_absorptions)")


def _offsets_cancelled(term: Expr, reference: Diagram, i: int) -> list[Box]:
    """The sums and differences of ``term`` (a gradient over the VJP diagram ``reference``'s inputs, of its
    ``i``-th input) that float64 may round to their larger operand alone (``finiteness.absorbing_sums``) and
    one of whose operands adds nothing to ``term``'s value over the reals: scaled by a fresh positive scalar
    exp(δ) in that sum alone, or wherever ``term`` reads it, ``term`` still normalises to the same term
    (``Σ_t w·(Y + C)`` with weights summing to 0, a shift a softmax drops, ``recip(recip(E + C)) - C``).
    Whatever boxes cancel that operand's share, float64 may have dropped the other one's whole in the
    sum, as a difference cancelling an absorption does."""
    name = "delta"
    while any(p.name == name for p in reference.inputs):
        name += "_"
    params = (*reference.inputs, Param(name, ()))
    values = [_input(p.name, p.axes) for p in params]

    def normal(t: Expr) -> Any:
        sem = _Semantics(masks=True)
        sem.probe = True
        return sem.unmasked(sem.run(replace(reference, inputs=params, body=(), outputs=(t,),
                                            out_types=(reference.out_types[i],)), values)[0])
    factor = Box("exp", (Var(name, ()),), ())  # positive, so a square root or a log of the sum stays one
    found: list[Box] = []
    base = None
    # each rewritten term's verdict (normalises to ``term``'s normal form: True, not: False, no term: None), by the
    # term: ``normal`` reads a term's structure only, so an equal term has the same verdict.  The two rewrites of an
    # operand read once give one term, and an operand of several sums rewritten everywhere the same one
    verdicts: dict[Expr, bool | None] = {}
    for box in absorbing_sums(term, replace(reference, body=())):
        for k in (0, 1):
            operand = box.args[k]
            scaled = replace(box, args=tuple(Box("mul", (a, factor), a.axes) if j == k else a
                                             for j, a in enumerate(box.args)))
            base = normal(term) if base is None else base

            def here(e: Expr, box: Box = box, scaled: Box = scaled) -> Expr | None:
                return scaled if e is box else None

            # and wherever the operand is read: exp(log(E + C)) - C and recip(recip(E + C)) - C are E over
            # the reals, C's share cancelling through boxes that carry no sum's value in general
            def everywhere(e: Expr, operand: Expr = operand) -> Expr | None:
                return Box("mul", (operand, factor), operand.axes) if e == operand else None
            for swap in (here, everywhere):
                moved_term = _replaced(term, swap)
                if moved_term not in verdicts:
                    try:  # a -inf mask scaled by δ is no term (only exp and its reductions read one)
                        moved = normal(moved_term)
                    except Unproved:
                        verdicts[moved_term] = None
                    else:
                        verdicts[moved_term] = _equal(moved, base)
                if verdicts[moved_term]:
                    found.append(box)
                    break
            if found and found[-1] is box:
                break
    return found


def _made(inner: Expr, made: Sequence[Expr]) -> bool:
    """Is ``inner`` one of ``made`` as float64 computes it (``_canonical``)?"""
    key = _canonical(inner)
    return any(_canonical(m) == key for m in made)


def _canonical(expr: Expr) -> Expr:
    """``expr`` up to how it is written where float64 computes it alike: a ``contract`` over no axis
    of two operands as their product, the two operands of a product or a sum in a fixed order
    (float64's are commutative), and every array's axes in a fixed order (a layout, not a value).
    Equal canonical terms round alike: causal linear attention's VJP makes its running sum's
    ``Σ_t dH - cumsum[t](dH)`` on ``dH = contract[](dY, Q)``, a backward's on ``Q * dY``."""
    if isinstance(expr, Var):
        return replace(expr, axes=tuple(sorted(expr.axes)))
    if not isinstance(expr, Box):
        return expr
    args = tuple(_canonical(a) for a in expr.args)
    product = expr.op == "contract" and not expr.target and len(args) == 2
    if product or (expr.op in ("mul", "add") and len(args) == 2):
        args = tuple(sorted(args, key=repr))
    return replace(expr, op="mul" if product else expr.op, args=args, axes=tuple(sorted(expr.axes)))


def _alike_around(inner: Expr, got: Expr, want: Expr, reference: Diagram, i: int) -> bool:
    """Do ``got`` and ``want`` (a backward's gradient and the VJP's ``i``-th output, terms over the VJP
    diagram ``reference``'s inputs) still normalise to the same term with the absorbing sum ``inner`` made an
    opaque array of its type: then whatever float64 rounds it to reaches both alike.  Computing the
    same absorbing sum, or cancelling it too, is not enough: a VJP of ``X + 0.5·((X + C) - C)`` has it
    weighted 0.5 beside an exact X (2 at X = 1, g = 1, t = 2), a backward's ``1.5·((X + C) - C)`` is 0.
    A guarded shift ``max(L, -FLOAT_MAX)`` (``grad._weights``) is read as L here (``_unguarded``): exact in float64, it
    passes L's rounding on, or drops it whole where it clamps, so the sum's error reaches the guarded
    gradient as the unguarded one, or not at all (ALiBi's ``exp(S - m·(q - x) - max(L, -FLOAT_MAX))``
    beside the VJP's softmax of the same scores)."""
    name = "absorbed"
    while any(p.name == name for p in reference.inputs):
        name += "_"
    atom = Var(name, inner.axes)
    params = (*reference.inputs, Param(name, inner.axes))
    sem = _Semantics(masks=True)
    sem.probe = True
    values = [_input(p.name, p.axes) for p in params]
    key = _canonical(inner)  # the VJP's may be written otherwise: Q * dY as contract[](dY, Q)
    opaque = [_replaced(_unguarded(t), lambda e: atom if _canonical(e) == key else None) for t in (got, want)]
    left, right = (sem.run(replace(reference, inputs=params, body=(), outputs=(t,),
                                   out_types=(reference.out_types[i],)), values)[0] for t in opaque)
    return not sem.cases and _equal(sem.unmasked(left), sem.unmasked(right))


def _unguarded(expr: Expr) -> Expr:
    """``expr`` with each guarded shift ``max(L, -FLOAT_MAX)`` (``grad._weights``) read as L."""
    return _replaced(expr, lambda e: _unguarded(e.args[0]) if isinstance(e, Box) and e.op == "maximum"
                     and e.args[1] == Const(-acc.FLOAT_MAX) else None)


def _as_the_vjps(expr: Expr, diagram: Diagram, sources: Sequence[tuple[str, int]], forward: Diagram,
                 reference: Diagram, saved: Sequence[Expr]) -> Expr:
    """``expr``, a term of the backward ``diagram``, over the VJP diagram ``reference``'s inputs: a
    forward input or cotangent the backward reads (``sources``) by the VJP's name for it, a saved
    forward output by its term (``saved``)."""
    names: dict[str, Expr] = {}
    for p, (kind, k) in zip(diagram.inputs, sources, strict=True):
        names[p.name] = saved[k] if kind == "output" else \
            Var((forward.inputs[k] if kind == "input" else reference.inputs[len(forward.inputs) + k]).name, p.axes)
    return _replaced(expr, lambda e: names.get(e.name) if isinstance(e, Var) else None)


def _replaced(expr: Expr, swap: Callable[[Expr], Expr | None]) -> Expr:
    """``expr`` with each outermost sub-term that ``swap`` maps to a term replaced by it."""
    if (new := swap(expr)) is not None:
        return new
    return replace(expr, args=tuple(_replaced(a, swap) for a in expr.args)) if isinstance(expr, (Box, Apply)) else expr


def _short(expr: Expr, limit: int = 80) -> str:
    text = print_expr(expr)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _relations_hold(sem: _Semantics, diagram: Diagram, values: Sequence[Any]) -> None:
    """Raise ``Unproved`` unless each input relation of ``diagram`` (``given L = logsumexp[x](S)``,
    ``terms.relations``) holds of the values the join feeds it: the backward is claimed (and its
    theorem proved, its finiteness facts drawn) only where its relations hold, so a forward that
    saves another statistic (``logsumexp[x](S) - 700``, compensated by the pass's ``exp(-700)``)
    would run it outside what its proof covers."""
    names = [p.name for p in diagram.inputs]
    for name in relations(diagram.inputs):
        stated, picked = relation_diagram(diagram, name)
        value = sem.run(stated, [values[k] for k in picked])[0]
        if not _equal(sem.unmasked(value), sem.unmasked(values[names.index(name)])):
            raise Unproved(f"the relation of `{diagram.name}` giving `{name}` does not hold of the value the join "
                           f"feeds it (they do not normalise to the same term)")


def _side(lemma: LemmaDecl, side: Expr) -> Diagram:
    return Diagram(lemma.name, lemma.params, (), (side,), (side.axes,), lemma.axes)


@cache
def prove_accumulator(box: Box, axis: str, name: str, pad: bool) -> str | None:
    """``proved: ...`` if the laws of ``name`` for the canonical ``box`` hold at every size (and
    the padding law with ``pad``), else None."""
    try:
        plan, guarded = acc.plan(box, axis, name, guard=False), acc.plan(box, axis, name, guard=True)
    except ValueError:
        return None
    if pad and plan.pad is None:
        return None
    try:
        problem = _laws(plan, guarded, box, pad)
    except Unproved:
        return None
    if problem:
        return None
    masked = box.args[0] if _scores_only(box, "X0") and _masked_laws(plan, guarded, box) else None
    anything = ", ".join(f"X{k}" for k in range(len(box.args))) if extended(plan, pad) else ""
    return "proved: laws symbolically at every chunk length (finite real inputs)" + (
        " [-inf masks: X0]" if masked is not None else "") + (f" [extended: {anything}]" if anything else "")


#: the monoid accumulators whose laws extend to every float64 value: their merge, the boxes they fold
_EXTENDED = {"sum": ("add", ("sum", "contract")), "max": ("maximum", ("max",)), "min": ("minimum", ("min",))}


def extended(plan: acc.AccumulatorPlan, pad: bool) -> bool:
    """Do the laws of ``plan``, proved for finite operands, hold for operands of every float64
    value, ±inf and NaN included (``finiteness.EXTENDED``)?  For a monoid accumulator of +,
    max or min on the box it folds (sum or contract, max, min; no one-step update): its state
    is the box's own fold over the chunk, each position's term (a contraction's product) is
    computed alike by box and lift, and combining merges two folds; so the laws hold wherever
    the evaluator's merge (``FLOAT64.binary``) is associative and commutative and its identity
    neutral.  Over finite values that is the finite proof (over the reals: reassociating
    floats rounds, README "The domain"); with ±inf or NaN among three operands, the result
    depends on their classes alone (inf + x = inf for every finite x, NaN absorbs, inf + -inf
    is NaN), so checking it on every triple of {-1.5, 0, 2.25, ±inf, NaN} where one is not
    finite covers every value.  With ``pad``, every operand must carry the streamed axis, so
    that a padded position is its fills alone (0·0, not 0·inf)."""
    if plan.name not in _EXTENDED or plan.update is not None:
        return False
    merge, boxes = _EXTENDED[plan.name]
    if plan.box.op not in boxes or (pad and not all(plan.axis in a.axes for a in plan.box.args)):
        return False
    op = FLOAT64.binary[merge]
    values = (-1.5, 0.0, 2.25, -math.inf, math.inf, math.nan)

    def same(a: float, b: float) -> bool:
        return bool(a == b or (math.isnan(a) and math.isnan(b)))

    for x, y, z in itertools.product(values, repeat=3):
        if all(math.isfinite(v) for v in (x, y, z)):
            continue
        if not (same(op(op(x, y), z), op(x, op(y, z))) and same(op(x, y), op(y, x))):
            return False
    return all(same(op(plan.identity[0], x), x) for x in values)


def _masked_laws(plan: acc.AccumulatorPlan, guarded: acc.AccumulatorPlan, box: Box) -> bool:
    """The laws where the scores ``X0`` may be ``-inf`` (see ``masks_unproved``), with the
    guarded forms, whose shift max(m, -FLOAT_MAX) keeps exp(-inf - m) at 0: each chunk (and
    the whole row) partly masked, X0' + log m with m an opaque indicator that keeps an entry
    of the chunk (masked weights exactly 0), or fully masked (-inf), in every mix of the two
    chunks; a masked chunk into a finite state and into the identity; the finaliser must give
    the box's value, the guarded one on a fully masked row (0 where every entry is masked), the
    unguarded one on a partly masked row, which is the guarded one there as on finite rows (the
    shift is the row's finite maximum, and its normaliser at least that maximum's exp(0) = 1)."""
    axis, parts = plan.axis, (f"{plan.axis}1", f"{plan.axis}2")
    mask = _row_mask("X0")
    rows = frozenset({mask})
    full = {sympy.Function("X0", real=True): -sympy.oo, mask: sympy.Integer(1)}

    def sem(split: Mapping[str, tuple[str, str]] | None = None,
            fill: Mapping[int, Mapping[Any, Any]] | None = None) -> _Semantics:
        return _Semantics(frozenset(), split, fill, rows=rows)

    def chunk(part: str | None, kind: str) -> list[Any]:
        """The operands on ``part`` (None: the whole row), the scores partly or fully masked."""
        xs = [_input(f"X{k}", a.axes, {axis: part} if part else None) for k, a in enumerate(box.args)]
        return [-sympy.oo if kind == "full" else xs[0] + sympy.log(mask(*xs[0].args)), *xs[1:]]

    try:
        for kinds in itertools.product(("kept", "full"), repeat=2):
            lifted = [sem().run(_renamed(guarded.lift, axis, part), chunk(part, kind))
                      for part, kind in zip(parts, kinds, strict=True)]
            fill = {n: full for n, k in enumerate(kinds) if k == "full"}
            whole = sem({axis: parts}, fill).run(guarded.lift, chunk(None, "kept"))
            if not sem().equal(sem().run(guarded.combine, [*lifted[0], *lifted[1]]), whole):
                return False
        identity = [_constant(v) for v in guarded.identity]
        for kind in ("kept", "full"):
            masked = chunk(None, kind)
            state = sem().run(guarded.lift, masked)
            if guarded.update is not None:  # a masked chunk into a finite state, and into the identity
                held = [_input(f"{n}0", t) for n, t in guarded.state]
                for before in (held, identity):
                    if not sem().equal(sem().run(guarded.update, [*before, *masked]),
                                       sem().run(guarded.combine, [*before, *state])):
                        return False
            final = sem().run((guarded if kind == "full" else plan).final, list(state))
            value = sem().run(box_diagram(box), masked)
            if not (sem().equal(sem().run(guarded.combine, [*identity, *state]), state) and sem().equal(final, value)):
                return False
        return True
    except Unproved:
        return False


def _laws(plan: acc.AccumulatorPlan, guarded: acc.AccumulatorPlan, box: Box, pad: bool) -> str | None:
    """The first law that fails to normalise (None: all proved), per normaliser case: in the
    case where a normaliser is 0 the guarded finaliser (0 where b(z) = 0, ``quotient``) is the
    one that gives the evaluator's 0; elsewhere the unguarded one is exact."""
    axis = plan.axis
    parts = (f"{axis}1", f"{axis}2")
    names = [f"X{k}" for k in range(len(box.args))]
    for zero in _zero_cases(box):
        known: set[Any] = set()

        def sem(split: Mapping[str, tuple[str, str]] | None = None, fill: Mapping[int, Mapping[Any, Any]] | None = None,
                zero: frozenset[str] = zero, known: set[Any] = known) -> _Semantics:
            return _Semantics(zero, split, fill, known)

        def inputs(part: str | None = None, zero: frozenset[str] = zero) -> list[Any]:
            return [sympy.Integer(0) if n in zero else _input(n, a.axes, {axis: part} if part else None)
                    for n, a in zip(names, box.args, strict=True)]

        (value,) = sem().run(box_diagram(box), inputs())  # registers the normalisers positive in this case
        lift1 = sem().run(_renamed(plan.lift, axis, parts[0]), inputs(parts[0]))
        lift2 = sem().run(_renamed(plan.lift, axis, parts[1]), inputs(parts[1]))
        whole = sem({axis: parts}).run(plan.lift, inputs())
        if not _all_equal(sem().run(plan.combine, [*lift1, *lift2]), whole):
            return "recomposition"
        state = sem().run(plan.lift, inputs())
        if not _all_equal(sem().run(plan.combine, [*map(_constant, plan.identity), *state]), state):
            return "identity"
        if plan.update is not None:  # update(s, x) = combine(s, lift(x)) for any state s
            held = [_input(f"{n}0", t) for n, t in plan.state]
            if not _all_equal(sem().run(plan.update, [*held, *inputs()]), sem().run(plan.combine, [*held, *state])):
                return "update"
        (final,) = sem().run((guarded if zero else plan).final, list(state))
        if not _equal(final, value):
            return "finaliser"
        if pad and plan.pad is not None:
            fill = {1: {sympy.Function(n, real=True): _constant(v) for n, v in zip(names, plan.pad, strict=True)}}
            if not _all_equal(sem({axis: parts}, fill).run(plan.lift, inputs()), lift1):
                return "padding"
    return None


def _constant(v: float) -> Any:
    """A float constant as the exact rational it is (±inf as sympy's ±oo)."""
    if math.isnan(v):
        raise Unproved("a NaN constant")
    return (sympy.oo if v > 0 else -sympy.oo) if math.isinf(v) else sympy.Rational(v)


def _all_equal(left: tuple[Any, ...], right: tuple[Any, ...]) -> bool:
    return len(left) == len(right) and all(_equal(a, b) for a, b in zip(left, right, strict=True))


def _zero_cases(box: Box) -> list[frozenset[str]]:
    probe = _Semantics()
    probe.run(box_diagram(box), [_input(f"X{k}", a.axes) for k, a in enumerate(box.args)])
    return [frozenset()] + [frozenset({c}) for c in sorted(probe.cases)]


def _renamed(diagram: Diagram, old: str, new: str) -> Diagram:
    """``diagram`` with axis ``old`` called ``new`` (a chunk of it)."""
    def ren(axes: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(new if a == old else a for a in axes)

    def expr(e: Expr) -> Expr:
        if isinstance(e, Var):
            return Var(e.name, ren(e.axes))
        if isinstance(e, Size):
            return Size(new) if e.axis == old else e
        if isinstance(e, Box):
            return replace(e, args=tuple(expr(a) for a in e.args), axes=ren(e.axes), target=ren(e.target),
                           out=ren(e.out))
        return e

    return replace(diagram, inputs=tuple(Param(p.name, ren(p.axes)) for p in diagram.inputs),
                   body=tuple(replace(let, expr=expr(let.expr)) for let in diagram.body),
                   outputs=tuple(expr(o) for o in diagram.outputs), out_types=tuple(ren(t) for t in diagram.out_types))
