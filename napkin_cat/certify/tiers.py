"""The certification tiers behind ``napkin_cat.certify`` (its docstring describes them):
imported on a cache miss only, since they load sympy."""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import sympy

from napkin_cat import ops
from napkin_cat.certify import accumulators as acc
from napkin_cat.certify import prove
from napkin_cat.certify.base import LEVELS, Certificate, lemma_side
from napkin_cat.certify.cases import (
    TooLarge,
    edges,
    flat,
    grid,
    numeric_equal,
    show_sizes,
    symbolic_equal,
    symbols,
    zero_sum,
)
from napkin_cat.certify.reach import UNBOUNDED, scale, unfolded
from napkin_cat.certify.reach import reach as lemma_reach  # not `reach`: the submodule keeps that name
from napkin_cat.certify.represent import prove_representation
from napkin_cat.certify.rules import validate
from napkin_cat.diagnostics import NapkinError
from napkin_cat.evaluate import FLOAT64, SYMBOLIC, Algebra, Named, evaluate_named
from napkin_cat.terms import Box, Diagram, LemmaDecl, Var, box_diagram, walk

__all__ = ["LEMMA_SAFETY_SCALES", "SAFETY_SCALE", "accumulator_answer", "certify_accumulator", "float_safety",
           "infinite_tested", "lemma_certificate", "lemma_float_safety", "prove_representation"]

_EXACT_ENTRIES = 512  # the exact tier's largest input (entries over all parameters)
_MAX_REACH = 24  # the largest size the float64 tier sweeps a lemma to (see certify_reach.reach)
_MAX_GRID = 4096  # the most size combinations (reach ** axes) the float64 tier sweeps
_EXACT_CASES = 120  # the most size combinations the exact tier evaluates (the smallest first)


# ---- lemmas ------------------------------------------------------------------------------------


def lemma_certificate(lemma: LemmaDecl, level: str) -> Certificate:
    try:
        return _certify_lemma(lemma, level)
    except ValueError as exc:  # raised by sympy on values it cannot order (complex infinity)
        return Certificate(False, "sympy", f"the sides cannot be evaluated exactly: {exc}")


def _certify_lemma(lemma: LemmaDecl, level: str) -> Certificate:
    if problems := validate(lemma):  # a malformed lemma (sides of different types) cannot be evaluated side by side
        return Certificate(False, "invalid", "; ".join(p.message for p in problems))
    bound, cases = LEVELS[level]
    swept = lemma_reach(lemma)
    if swept == UNBOUNDED:
        return Certificate(False, "reach", "a piecewise box (relu, abs, max, min) compares a size non-polynomially "
                                           "(`relu(sqrt(x) - 5)`), or a floor reads a size or a position "
                                           "(`floor(x / 30)`): bounded certification cannot place its step")
    if swept > _MAX_REACH:
        return Certificate(False, "reach", f"its sizes and constants reach {swept}, past the {_MAX_REACH} "
                                           "that bounded certification checks")
    if swept ** len(lemma.axes) > _MAX_GRID:
        return Certificate(False, "reach", f"its {len(lemma.axes)} axes, each swept to size {swept}, make "
                                           f"{swept ** len(lemma.axes)} size combinations, past the {_MAX_GRID} that "
                                           "bounded certification checks; state it on fewer axes")
    lhs, rhs = lemma_side(lemma, lemma.lhs), lemma_side(lemma, lemma.rhs)
    # values read as positions (onehot), ranked (argmax, topk), or read as integers from the parameters
    # (a gather's positions, a comparison's operands, select's mask): no case split of symbolic inputs
    # (`floor` of a symbol is no position to read nor a number to compare: the sympy tier crashed on them)
    read = {r for side in unfolded(lemma) for n in walk(side) if isinstance(n, Box) and (r := _integer_read(n))}
    labels = bool(read)
    checked, skipped, problem = (0, 0, None) if labels else _sympy_tier(lemma, lhs, rhs, bound)
    if problem is not None:
        return Certificate(False, "sympy", problem)
    factor = scale(lemma)
    exact, problem = _exact_tier(lemma, lhs, rhs, swept, factor, labels)
    if problem is not None:
        return Certificate(False, "exact", problem)
    numeric, problem = _float64_tier(lemma, lhs, rhs, swept, factor, cases, labels)
    if problem is not None:
        return Certificate(False, "float64", problem)
    problem = lemma_float_safety(lemma)
    if problem is not None:
        return Certificate(False, "float64 safety", problem)
    if (checked == 0 and not labels) or numeric == 0:
        return Certificate(False, "none", "no admissible sizes to check")
    extra = f", {skipped} too large for case splitting" if skipped else ""
    symbolic = f"no sympy ({' and '.join(sorted(read))})" if labels else f"sympy {checked} size cases ≤{bound}{extra}"
    tested = f"{symbolic}; exact {exact} sizes; float64 {numeric} cases, sizes ≤{swept}"
    proof = prove.prove_lemma(lemma)  # the tiers above also cover the infinite edge inputs a proof does not
    return Certificate(True, f"{proof}; tested: {tested}" if proof else f"tested: {tested}")


def _integer_read(box: Box) -> str | None:
    """What ``box`` reads as an integer that a symbolic input cannot give (the name the certificate
    shows), or None: onehot's labels and a selection's ranks always; a gather's positions, a
    comparison's operands and select's mask where they read a parameter (positions, `index`, are
    concrete at every size)."""
    kind = ops.OPS[box.op].kind
    if box.op == "onehot" or kind == "topk":
        return box.op if box.op == "onehot" else "a selection"
    read = {"gather": box.args[1:], "compare": box.args, "select": box.args[:1]}.get(kind, ())
    if any(isinstance(node, Var) for arg in read for node in walk(arg)):
        return {"gather": "a gather", "compare": "a comparison", "select": "a mask"}[kind]
    return None


def _sympy_tier(lemma: LemmaDecl, lhs: Diagram, rhs: Diagram, bound: int) -> tuple[int, int, str | None]:
    """(sizes checked, sizes with too many scalars inside Max/Min to split, first
    disagreement): every combination of sizes up to ``bound`` on symbolic inputs."""
    checked, skipped = 0, 0
    for sizes in grid([a.name for a in lemma.axes], bound):
        inputs = [symbols(p.name, p.axes, sizes) for p in lemma.params]
        try:
            left = evaluate_named(lhs, inputs, dict(sizes), SYMBOLIC)
        except NapkinError:
            continue  # sizes the left side's reshapes do not admit (e.g. |x| != |y|·|z|)
        right, problem = _right_side(rhs, inputs, sizes, SYMBOLIC)
        if right is None:
            return checked, skipped, problem
        try:
            same = symbolic_equal(flat(left), flat(right, [v.axes for v in left]))
        except TooLarge:
            skipped += 1
            continue
        if not same:
            return checked, skipped, _witness(lemma, lhs, rhs, sizes)
        checked += 1
    return checked, skipped, None


def _exact_tier(lemma: LemmaDecl, lhs: Diagram, rhs: Diagram, swept: int, factor: float,
                labels: bool) -> tuple[int, str | None]:
    """(sizes checked, first disagreement): the smallest ``_EXACT_CASES`` size combinations
    up to ``swept`` (``grid``) on random rational inputs (integers for onehot lemmas; every
    other combination's scaled by ``factor``, the lemma's scale), evaluated exactly: a
    rational difference must be 0, any other is compared to 50 digits, so a difference far
    below float64's tolerance (``1e-10 * relu(x - 3)``, or 1e-35) is seen; sizes
    whose inputs exceed ``_EXACT_ENTRIES`` entries are left to float64."""
    rng = np.random.default_rng(3)
    checked, scaled = 0, sympy.Integer(math.ceil(factor))
    for sizes in grid([a.name for a in lemma.axes], swept):
        shapes = [[sizes[a] for a in p.axes] for p in lemma.params]
        if sum(math.prod(shape) for shape in shapes) > _EXACT_ENTRIES:
            continue
        if checked == _EXACT_CASES:
            break
        times = scaled if checked % 2 else sympy.Integer(1)  # every other point at the lemma's scale
        inputs = [Named(p.axes, np.array([sympy.Integer(k) if labels else sympy.Rational(k, 8) * times for k in
                                          rng.integers(-16, 17, math.prod(shape)).tolist()], dtype=object)
                        .reshape(shape)) for p, shape in zip(lemma.params, shapes, strict=True)]
        try:
            left = evaluate_named(lhs, inputs, dict(sizes), SYMBOLIC)
        except NapkinError:
            continue
        right, problem = _right_side(rhs, inputs, sizes, SYMBOLIC)
        if right is None:
            return checked, problem
        for a, b in zip(flat(left), flat(right, [v.axes for v in left]), strict=True):
            exact = sympy.sympify(a) - sympy.sympify(b)
            d = sympy.N(exact, 50)  # rational when every operation was: then it must be 0
            if not (a == b or (exact == 0 if exact.is_Rational else d.is_number and d.is_finite
                               and abs(d) < 1e-30 * _magnitude(a, b))):
                return checked, (f"sizes {show_sizes(sizes)} on rational inputs: {sympy.N(a, 12)} vs "
                                 f"{sympy.N(b, 12)} (difference {sympy.N(d, 3)})")
        checked += 1
    return checked, None


def _magnitude(a: Any, b: Any) -> float:
    """The larger of |a| and |b|, at most 1 (1 where neither is a finite number): the exact
    tier's threshold for an irrational difference is relative below 1, so two sides of order
    1e-40 that differ by a factor are told apart (an absolute 1e-30 passed them)."""
    values = [abs(sympy.N(v, 50)) for v in (a, b)]
    finite = [float(v) for v in values if v.is_number and v.is_finite]
    return min(1.0, max(finite)) if finite else 1.0


def _float64_tier(lemma: LemmaDecl, lhs: Diagram, rhs: Diagram, swept: int, factor: float, cases: int,
                  labels: bool) -> tuple[int, str | None]:
    """(cases checked, first disagreement): every combination of sizes up to ``swept``
    (the grid, not only equal sizes: ``relu(x - y*z*w - 2)`` is 0 wherever the axes are
    equal), then random sizes; with ``labels``, every other case draws integers in
    [-1, swept] instead of normals.  At each equal size the edge inputs (``edges``, scaled
    by ``factor``) are checked too."""
    rng = np.random.default_rng(0)
    axes = [a.name for a in lemma.axes]
    sweep = grid(axes, swept)
    numeric = 0
    for draw in itertools.count():
        if draw >= len(sweep) + 40 * cases or numeric >= cases + len(sweep):
            break  # draws the lemma's reshapes do not admit are redrawn
        sizes = sweep[draw] if draw < len(sweep) else {a: int(rng.integers(1, max(5, swept + 1))) for a in axes}
        shapes = [[sizes[a] for a in p.axes] for p in lemma.params]
        values = [rng.integers(-1, swept + 1, s).astype(float) if labels and draw % 2 else rng.standard_normal(s)
                  for s in shapes]
        equal_sizes = len(set(sizes.values())) <= 1
        for edge, inputs in [("", values)] + (list(edges(lemma, values, factor)) if equal_sizes else []):
            named = [Named(p.axes, v) for p, v in zip(lemma.params, inputs, strict=True)]
            try:
                left = evaluate_named(lhs, named, dict(sizes), FLOAT64)
            except NapkinError:
                break
            right, problem = _right_side(rhs, named, sizes, FLOAT64)
            if right is None:
                return numeric, problem
            a, b = left[0].data, right[0].data if not left[0].axes else right[0].to(left[0].axes)
            if edge:  # a rewrite must keep every value the left side defines (a finite one)
                a, b = np.where(np.isfinite(a), a, 0.0), np.where(np.isfinite(a), b, 0.0)
            if not numeric_equal(np.ravel(a), np.ravel(b)):
                return numeric, f"sizes {show_sizes(sizes)}{edge}: {np.ravel(a)[:3]} vs {np.ravel(b)[:3]}"
        else:
            numeric += 1
    return numeric, None


def _right_side(rhs: Diagram, inputs: list[Named], sizes: dict[str, int],
                algebra: Algebra) -> tuple[tuple[Named, ...] | None, str | None]:
    """(the right side's values, None), or (None, why) where it cannot be evaluated at sizes
    the left side admits: a reshape the sizes do not honour (``split[x -> y z]`` with |x| !=
    |y|·|z|) makes the rewritten diagram undefined where the original is defined, so such
    sizes are a counterexample, never a case to skip (only the left side's may be skipped)."""
    try:
        return evaluate_named(rhs, inputs, dict(sizes), algebra), None
    except NapkinError as exc:
        why = "; ".join(d.message for d in exc.diagnostics) or str(exc)
        return None, f"sizes {show_sizes(sizes)}: the left side is defined but the right side is not ({why})"


def _witness(lemma: LemmaDecl, lhs: Diagram, rhs: Diagram, sizes: dict[str, int]) -> str:
    """Concrete float64 inputs at ``sizes`` on which the sides differ, if random ones find it."""
    rng = np.random.default_rng(2)
    for _ in range(20):
        inputs = [Named(p.axes, rng.standard_normal([sizes[a] for a in p.axes]).round(2)) for p in lemma.params]
        (left,) = evaluate_named(lhs, inputs, dict(sizes), FLOAT64)
        (right,) = evaluate_named(rhs, inputs, dict(sizes), FLOAT64)
        a, b = np.ravel(left.data), np.ravel(right.to(left.axes))
        if not numeric_equal(a, b):
            shown = ", ".join(f"{p.name}={np.ravel(x.data).tolist()}"
                              for p, x in zip(lemma.params, inputs, strict=True))
            return f"{show_sizes(sizes)}, {shown}: left side {a.tolist()}, right side {b.tolist()}"
    return (f"{show_sizes(sizes)}: sympy did not show the sides equal, and no random float64 input showed them apart "
            "(a true lemma sympy cannot simplify is refused too)")


# ---- accumulators ------------------------------------------------------------------------------


@cache
def accumulator_answer(plain: Box, axis: str, name: str, pad: bool) -> str:
    cert = certify_accumulator(plain, axis, name, pad, "quick")
    if not cert.ok:
        return f"its laws fail ({cert.how}: {cert.counterexample})" if cert.counterexample else cert.how
    kernel = prove_representation(plain, axis, name)  # the float-safe state the kernels run
    if kernel is not None and not kernel.ok:
        return f"the kernels' float-safe state does not represent it ({kernel.counterexample})"
    unsafe = float_safety(plain, axis, name)
    if unsafe:
        return unsafe
    proved = prove.prove_accumulator(plain, axis, name, pad)
    shown = f"; kernel state {kernel.how}" if kernel is not None else ""
    return (proved or cert.how) + shown + infinite_tested(plain, axis, name)


@cache
def infinite_tested(box: Box, axis: str, name: str) -> str:
    """What the accumulator was also tested on beyond its proof's finite operands (read by
    ``finiteness.unsupported``): `` [-inf tested: X0, ...]`` lists the operands of the canonical
    ``box`` with which the accumulator, run chunk by chunk (``accumulators.stream_fold``), gives
    exactly the evaluator's value (NaN where it is NaN, the same infinities) on inputs with
    -inf entries there, some rows entirely -inf (masks); `` [infinite: ...]`` those where it
    does so with +inf and -inf entries.  (logsumexp's state turns a +inf row into NaN where
    the evaluator gives +inf, so its scores are -inf tested only.)"""
    marks = []
    for label, fills in (("-inf tested", (-np.inf,)), ("infinite", (np.inf, -np.inf))):
        passed = [f"X{k}" for k in range(len(box.args)) if _agrees_with(box, axis, name, k, fills)]
        marks += [f" [{label}: {', '.join(passed)}]"] if passed else []
    return "".join(marks)


def _agrees_with(box: Box, axis: str, name: str, k: int, fills: tuple[float, ...]) -> bool:
    """``infinite_tested``'s check of operand ``k`` with entries from ``fills``."""
    for seed in range(3):
        rng = np.random.default_rng(seed)

        def values(diagram: Diagram, sizes: dict[str, int], seed: int = seed,
                   rng: np.random.Generator = rng) -> list[np.ndarray]:
            data = [rng.standard_normal([sizes[a] for a in p.axes]) for p in diagram.inputs]
            pick = rng.random(data[k].shape)
            data[k] = np.where(pick < 0.2, fills[0], np.where(pick > 0.8, fills[-1], data[k]))
            param = diagram.inputs[k]
            if axis in param.axes:  # whole rows along the streamed axis: one of the first fill, one of the last
                where = param.axes.index(axis)
                rows = np.moveaxis(data[k], where, -1)
                if rows.ndim > 1:
                    rows[(0,) * (rows.ndim - 1)] = fills[0]
                    rows[(-1,) * (rows.ndim - 1)] = fills[-1]
                    cancelling = _cancelling_row(box, k, fills[0], rows.shape[-1])
                    if cancelling is not None and rows.shape[0] > 2:  # a normaliser of exactly 0 beside a fill
                        rows[(1,) * (rows.ndim - 1)] = cancelling
                elif seed < len(fills):  # the operand is one row: whole of one fill, seed by seed
                    rows[...] = fills[seed]
                elif (cancelling := _cancelling_row(box, k, fills[0], rows.shape[-1])) is not None:
                    rows[...] = cancelling  # and, last, a normaliser of exactly 0 beside a fill
                data[k] = np.moveaxis(rows, -1, where)
            return data

        with np.errstate(all="ignore"):
            want, got = _both_ways(box, axis, name, values)
            if not np.all((got == want) | (np.isnan(got) & np.isnan(want))
                          | (np.isfinite(got) & np.isfinite(want) & np.isclose(got, want))):
                return False
    return True


def _cancelling_row(box: Box, k: int, fill: float, n: int) -> np.ndarray | None:
    """For the scores of a normalised contraction: a row [fill, g, 0, ...] whose normaliser
    terms a2 cancel to exactly 0 (a2(g) = -a2(fill), the rest at a2's zero) while a1(fill) may
    be infinite, the case where a guarded finaliser's o·0 is NaN but the evaluator's weight is
    0; None where a2 has no such g among small values (or no zero), or for other operands."""
    if box.op != "ncontract" or k != 0 or n < 2:
        return None
    a2 = FLOAT64.unary[box.params[1]]
    zeros = [z for z in (0.0, -1.0, -np.inf) if np.all(a2(np.array([z])) == 0)]
    with np.errstate(all="ignore"):
        target = -a2(np.array([fill]))[0]
        g = next((v for v in (1.0, -1.0, 2.0, -2.0, 0.5, -0.5) if a2(np.array([v]))[0] == target), None)
    if g is None or not zeros or not np.isfinite(target):
        return None
    return np.array([fill, g] + [zeros[0]] * (n - 2))


def _both_ways(box: Box, axis: str, name: str,
               values: Callable[[Diagram, dict[str, int]], list[np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """The canonical ``box``'s value by the evaluator and by accumulator ``name`` run chunk by
    chunk as the kernels run it (``accumulators.float_safe``, ``stream_fold``, tile 2), at size 3
    per axis and 6 along ``axis``, on the inputs ``values(diagram, sizes)`` gives: (evaluator,
    streamed), aligned."""
    diagram = box_diagram(box)
    sizes = {a.name: 3 for a in diagram.axes} | {axis: 6}
    inputs = [Named(p.axes, v) for p, v in zip(diagram.inputs, values(diagram, sizes), strict=True)]
    (reference,) = evaluate_named(diagram, inputs, dict(sizes), FLOAT64)
    streamed = acc.stream_fold(acc.kernel_plan(box, axis, name), inputs, 2, sizes)
    return np.asarray(reference.data, float), np.asarray(streamed.to(reference.axes), float)


#: input magnitude of the floating-point test: exp of it overflows float64
SAFETY_SCALE = 1000.0


#: the magnitudes of a lemma's floating-point test (``lemma_float_safety``): exp overflows past
#: 709.8, a square past 1.3e154, anything past 1.8e308
LEMMA_SAFETY_SCALES = (SAFETY_SCALE, 1e4, 1e200, 1e300)


def _safety_values(rng: np.random.Generator, shape: list[int], scale: float = SAFETY_SCALE) -> np.ndarray:
    """Seeded normal values scaled so the largest is exactly +``scale`` (past exp's float
    range whatever the draw at SAFETY_SCALE: a std of 1000 over six values once peaked at
    640, and passed)."""
    z = rng.standard_normal(shape)
    peak = z.flat[np.abs(z).argmax()] if z.size else 1.0
    return scale * z / peak if peak else z


def _unsafe(want: np.ndarray, got: np.ndarray, scale: float, rtol: float | None, what: str) -> str | None:
    """The floating-point failure of ``got`` (what napkin would run) against ``want`` (the
    value it replaces) on inputs of magnitude ``scale``: a value ``want`` has finite that
    ``got`` makes inf or NaN (or, with ``rtol``, not close to it); None where there is none."""
    with np.errstate(invalid="ignore"):
        held = np.isfinite(got) & (np.isclose(got, want, rtol=rtol, atol=1e-9) if rtol is not None else True)
        bad = np.isfinite(want) & ~held
    if not bad.any():
        return None
    return (f"it fails in floating point: on inputs of magnitude {scale:g} it gives {np.ravel(got[bad])[0]:.4g} "
            f"where {what} gives {np.ravel(want[bad])[0]:.4g}")


@cache
def lemma_float_safety(lemma: LemmaDecl) -> str | None:
    """Why ``lemma`` fails in floating point, or None.

    Its sides are equal over the reals, but the right side (what a rewritten diagram runs)
    may overflow where the left side does not (``exp(A + B) = exp(A) * exp(B)`` at A = 800,
    B = -800: 1 by the left, inf · 0 = NaN by the right; logsumexp written as log Σ exp).  Both
    sides are evaluated at the smallest sizes (every axis 1 to 3, ``_SAFETY_SIZES`` of them)
    on seeded inputs of each magnitude of ``LEMMA_SAFETY_SCALES``, with every parameter
    positive, every one negative, and each one alone negated (``_safety_values``: normals
    scaled so the largest is the magnitude, so both signs occur within a parameter too); the
    right side must be finite wherever the left side is (the float64 tier compares values).
    Then, in each case where the left side is within ``_HEADROOM`` of float64's range at one
    magnitude and not at the next (magnitude 1 taken within), the largest magnitude between them
    where it is still within is found by bisection (``_finite_edge``) and both sides compared
    there, so a right side that overflows first is seen even in a window no sampled magnitude
    falls in (``exp(c - 50) = exp(c) · exp(-50)`` is inf on the right only for c in
    (709.8, 759.8), and the left side is inf at 1e3 too).
    Every parameter has the one magnitude: where values of far apart magnitudes meet only
    near the float64 edge (A·c·B at A = 1e300, c = 1e10, B = 1e-300, which any
    reassociation, and so every tiling, can overflow) the lemma is not checked (README
    "Proofs")."""
    lhs, rhs = lemma_side(lemma, lemma.lhs), lemma_side(lemma, lemma.rhs)
    k = len(lemma.params)
    signs = [[1.0] * k, [-1.0] * k] + [[-1.0 if j == i else 1.0 for j in range(k)] for i in range(k)]
    admitted: list[tuple[dict[str, int], dict[int, list[bool]]]] = []
    for sizes in grid([a.name for a in lemma.axes], 3):
        if len(admitted) == _SAFETY_SIZES:
            break
        finite: dict[int, list[bool]] = {}  # per sign case: is the left side `_bounded` at each magnitude
        for magnitude, (case, sign) in itertools.product(LEMMA_SAFETY_SCALES, enumerate(signs)):
            try:
                want, got = _safety_sides(lhs, rhs, sizes, case, sign, magnitude)
            except NapkinError:
                break  # sizes the left side's reshapes do not admit
            if isinstance(got, str):
                return got
            finite.setdefault(case, []).append(_bounded(want))
            unsafe = _unsafe(want, got, magnitude, None, "the left side")
            if unsafe:
                return f"{unsafe} (sizes {show_sizes(sizes)}, signs {', '.join(f'{s:+g}' for s in sign)})"
        else:
            admitted.append((sizes, finite))
    for sizes, finite in admitted:  # the left side's float64 edge between two magnitudes
        for case, sign in enumerate(signs):
            low = [1.0, *LEMMA_SAFETY_SCALES]
            turns = [(a, b) for a, b, was, now in zip(low, LEMMA_SAFETY_SCALES, [True, *finite[case]], finite[case],
                                                      strict=False) if was and not now]
            for a, b in turns[:1]:
                edge = _finite_edge(lambda m, z=sizes, c=case, s=sign: _bounded(  # type: ignore[misc]
                    _safety_sides(lhs, rhs, z, c, s, m)[0]), a, b)
                if edge is None:
                    continue
                want, got = _safety_sides(lhs, rhs, sizes, case, sign, edge)
                unsafe = got if isinstance(got, str) else _unsafe(want, got, edge, None, "the left side")
                if unsafe:
                    return f"{unsafe} (sizes {show_sizes(sizes)}, signs {', '.join(f'{s:+g}' for s in sign)})"
    return None


def _safety_sides(lhs: Diagram, rhs: Diagram, sizes: dict[str, int], case: int, sign: list[float],
                  magnitude: float) -> tuple[np.ndarray, np.ndarray | str]:
    """(left, right) of ``lemma_float_safety``'s case ``case`` (its seed) with ``sign`` per
    parameter at ``magnitude``; the right side is why it cannot be evaluated where it cannot."""
    rng = np.random.default_rng(case)
    inputs = [Named(p.axes, s * _safety_values(rng, [sizes[a] for a in p.axes], magnitude))
              for p, s in zip(lhs.inputs, sign, strict=True)]
    with np.errstate(all="ignore"):
        (left,) = evaluate_named(lhs, inputs, dict(sizes), FLOAT64)
        right, problem = _right_side(rhs, inputs, sizes, FLOAT64)
    want = np.asarray(left.data, float)
    if right is None:
        return want, problem or "the right side cannot be evaluated"
    return want, np.asarray(right[0].data if not left.axes else right[0].to(left.axes), float)


#: bisection steps on log(magnitude) to the left side's float64 edge (``lemma_float_safety``)
_EDGE_STEPS = 60
#: the edge is where the left side leaves |v| <= _HEADROOM · FLOAT_MAX: nearer the largest float,
#: any reassociation (A·C + B·C against (A + B)·C, whose partial sums differ by a few times)
#: overflows, and napkin claims nothing there (README "Proofs")
_HEADROOM = 1e-3


def _bounded(values: np.ndarray) -> bool:
    """Is every entry finite and at most ``_HEADROOM`` of the largest float in magnitude?"""
    with np.errstate(invalid="ignore"):
        return bool(np.all(np.abs(values) <= _HEADROOM * acc.FLOAT_MAX))


def _finite_edge(finite: Callable[[float], bool], low: float, high: float) -> float | None:
    """The largest magnitude bisection finds in (low, high) where ``finite`` holds, given that
    it holds at ``low`` and not at ``high`` (on log(magnitude)); None if none past ``low``."""
    lo, hi, found = math.log(low), math.log(high), None
    for _ in range(_EDGE_STEPS):
        mid = (lo + hi) / 2
        if finite(math.exp(mid)):
            lo, found = mid, math.exp(mid)
        else:
            hi = mid
    return found


_SAFETY_SIZES = 4  # the size combinations (smallest first) a lemma's floating-point test evaluates


@cache
def float_safety(box: Box, axis: str, name: str) -> str | None:
    """Why accumulator ``name`` for the canonical ``box`` fails in floating point, or None.

    Equalities are over the reals; an accumulator that is exact there can still overflow
    where the box does not (the plain normalised contraction with exp has no running
    maximum).  It is run chunk by chunk (``accumulators.stream_fold``) on inputs of
    magnitude ``SAFETY_SCALE`` and must give every finite value the evaluator (whose forms
    are stable) gives, to 1e-6.  The stream rule refuses what fails (through ``accumulator``).
    """
    rng = np.random.default_rng(0)
    want, got = _both_ways(box, axis, name, lambda diagram, sizes: [
        _safety_values(rng, [sizes[a] for a in p.axes]) for p in diagram.inputs])
    return _unsafe(want, got, SAFETY_SCALE, 1e-6, f"`{box.op}`")


@cache
def certify_accumulator(box: Box, axis: str, name: str, pad: bool, level: str = "quick") -> Certificate:
    """Check the accumulator laws for a canonical box (see the module docstring).

    Symbolically on the level's splits of the streamed axis, then in float64 on random
    sizes and splits; where the first operand pads with ``-inf`` (max, logsumexp, the
    exponential-weighted states), every fourth case masks one full row of it along
    ``axis``, which the guarded forms must carry through.  ``level`` is a key of ``LEVELS``.
    """
    try:
        exact, guarded = acc.plan(box, axis, name, guard=False), acc.plan(box, axis, name, guard=True)
    except ValueError as exc:
        return Certificate(False, "plan", str(exc))
    if pad and exact.pad is None:
        return Certificate(False, "padding", f"no padding value leaves `{name}` unchanged")
    others = [a for a in dict.fromkeys(a for x in box.args for a in x.axes) if a != axis]
    splits = [(1, 1), (1, 2), (2, 1)] if level == "quick" else [(1, 1), (1, 2), (2, 1), (2, 2), (1, 3)]
    for n1, n2 in splits:
        sizes = dict.fromkeys(others, 1) | {axis: n1 + n2}
        problem = _laws(exact, box, sizes, n1, pad, SYMBOLIC, lambda i, s: symbols(f"x{i}", s.axes, s.sizes),
                        symbolic_equal)
        if problem:
            return Certificate(False, "sympy", problem)
    rng = np.random.default_rng(1)
    cases = LEVELS[level][1]
    masks = guarded.pad is not None and guarded.pad[0] == -math.inf  # it absorbs -inf scores: masked rows
    for case in range(cases):
        sizes = {a: int(rng.integers(1, 4)) for a in others}
        n1, n2 = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        sizes[axis] = n1 + n2
        masked = case % 4 == 3 and masks

        def draw(i: int, spec: _Spec, masked: bool = masked) -> Named:
            data = rng.standard_normal([spec.sizes[a] for a in spec.axes])
            if masked and i == 0:  # one fully masked row: every entry along the streamed axis
                data[tuple(slice(None) if a == axis else 0 for a in spec.axes)] = -math.inf
            return Named(spec.axes, data)

        problem = _laws(guarded, box, sizes, n1, pad, FLOAT64, draw, numeric_equal)
        if problem:
            return Certificate(False, "float64", problem)
    edge_cases = 0
    for what, edge in _SCORE_EDGES:  # scores where a normaliser is 0: random draws (almost) never are
        for _ in range(_EDGE_DRAWS):
            sizes = {a: int(rng.integers(1, 4)) for a in others}
            n1, n2 = int(rng.integers(1, 4)), int(rng.integers(1, 4))
            sizes[axis] = n1 + n2

            def scores(i: int, spec: _Spec, edge: Callable[[np.ndarray], np.ndarray] = edge) -> Named:
                data = rng.standard_normal([spec.sizes[a] for a in spec.axes])
                return Named(spec.axes, edge(data) if i == 0 else data)

            problem = _laws(guarded, box, sizes, n1, pad, FLOAT64, scores, numeric_equal)
            if problem:
                return Certificate(False, "float64", f"{problem} with the scores X0 {what}")
            edge_cases += 1
    return Certificate(True, f"tested: laws by sympy on {len(splits)} splits; float64 {cases} random, "
                             f"{edge_cases} on edge scores (≤ 0, rows summing to 0, 0)")


#: the first operand's (the scores') edge cases for accumulator laws: where Σ a2(S) is 0 on a
#: row, the evaluator's convention gives 0 and the accumulator's guarded finaliser must too
#: (``max(sqrt(z), TINY)`` does not when a2(S) is 0 but a1(S) is not: relu, a zero-sum row)
_SCORE_EDGES: tuple[tuple[str, Callable[[np.ndarray], np.ndarray]], ...] = (
    ("all <= 0 (relu of them is 0)", lambda d: -np.abs(d)),
    ("in rows summing to 0", zero_sum),
    ("all 0", np.zeros_like),
)
_EDGE_DRAWS = 3  # random sizes and splits per score edge


@dataclass(frozen=True)
class _Spec:
    axes: tuple[str, ...]
    sizes: dict[str, int]


def _laws(plan: acc.AccumulatorPlan, box: Box, sizes: dict[str, int], n1: int, pad: bool, algebra: Algebra,
          draw: Callable[[int, _Spec], Named], equal: Callable[[Sequence[Any], Sequence[Any]], bool]) -> str | None:
    """The first law that fails on one drawn input, or None."""
    axis = plan.axis
    n = sizes[axis]
    xs = [draw(i, _Spec(a.axes, sizes)) for i, a in enumerate(box.args)]
    part1 = [acc.chunk(x, axis, 0, n1) for x in xs]
    part2 = [acc.chunk(x, axis, n1, n) for x in xs]

    def lift(parts: list[Named], size: int) -> tuple[Named, ...]:
        return evaluate_named(plan.lift, parts, sizes | {axis: size}, algebra)

    def state(values: Sequence[Named]) -> list[Any]:
        return flat(values, [t for _, t in plan.state])

    whole = lift(xs, n)
    merged = evaluate_named(plan.combine, lift(part1, n1) + lift(part2, n - n1), dict(sizes), algebra)
    if not equal(state(merged), state(whole)):
        return f"combine(lift(x), lift(y)) != lift(x ⊕ y) at {show_sizes(sizes)}"
    if plan.update is not None:
        stepped = evaluate_named(plan.update, list(lift(part1, n1)) + part2, sizes | {axis: n - n1}, algebra)
        if not equal(state(stepped), state(merged)):
            return f"update(lift(x), y) != combine(lift(x), lift(y)) at {show_sizes(sizes)}"
    identity = tuple(Named((), algebra.asarray(v)) for v in plan.identity)
    unit = evaluate_named(plan.combine, identity + whole, dict(sizes), algebra)
    if not equal(state(unit), state(whole)):
        return f"combine(identity, s) != s at {show_sizes(sizes)}"
    (final,) = evaluate_named(plan.final, whole, dict(sizes), algebra)
    (value,) = evaluate_named(box_diagram(box), xs, dict(sizes), algebra)
    if not equal(flat([final], [value.axes]), flat([value])):
        return f"final(lift(x)) != {box.op}(x) at {show_sizes(sizes)}"
    if pad and plan.pad is not None:
        filled = [acc.padded(x, axis, n + 1, fill) for x, fill in zip(xs, plan.pad, strict=True)]
        if algebra is SYMBOLIC:
            filled = [Named(f.axes, np.asarray(algebra.asarray(f.data.astype(object)))) for f in filled]
        if not equal(state(lift(filled, n + 1)), state(whole)):
            return f"lift(x ⊕ padding) != lift(x) at {show_sizes(sizes)}"
    if algebra is FLOAT64:
        return _absorption(plan, xs, lambda parts: lift(parts, n), state, equal, show_sizes(sizes))
    return None


def _absorption(plan: acc.AccumulatorPlan, xs: list[Named], lift: Callable[[list[Named]], tuple[Named, ...]],
                state: Callable[[Sequence[Named]], list[Any]],
                equal: Callable[[Sequence[Any], Sequence[Any]], bool], where: str) -> str | None:
    """The first absorbing input whose all-padding chunk does not lift to the identity, or None."""
    for i in plan.absorbing:
        assert plan.pad is not None, "absorbing inputs come with a padding law"
        held = [Named(x.axes, np.full_like(x.data, plan.pad[i])) if j == i else x for j, x in enumerate(xs)]
        lifted = lift(held)
        unit = [Named(s.axes, np.full_like(s.data, v)) for s, v in zip(lifted, plan.identity, strict=True)]
        if not equal(state(lifted), state(unit)):
            return f"lift(x with input {i} all {plan.pad[i]}) != identity at {where}"
    return None


