"""The cases certification evaluates and its equality decisions (napkin_cat/certify/cases.py)."""

from __future__ import annotations

import numpy as np
import pytest
import sympy

from napkin_cat.certify.cases import (
    MAX_ORDERED,
    TooLarge,
    edges,
    grid,
    numeric_equal,
    partial_masks,
    symbolic_equal,
    symbols,
)
from napkin_cat.elaborate import loads


def test_grid_sweeps_every_combination_smallest_first() -> None:
    points = grid(["x", "y"], 3)
    assert len(points) == 9 and len({tuple(p.values()) for p in points}) == 9
    assert [sum(p.values()) for p in points] == sorted(sum(p.values()) for p in points)
    assert points[:3] == [{"x": 1, "y": 1}, {"x": 1, "y": 2}, {"x": 2, "y": 1}]
    assert grid([], 4) == [{}]


def test_symbols_are_distinct_across_parameters() -> None:
    """Entry 1 of ``A`` and a scalar ``A1`` are different symbols (a plain suffix merged them)."""
    a = symbols("A", ("x",), {"x": 2}).data.ravel().tolist()
    a1 = symbols("A1", (), {}).data.ravel().tolist()
    assert len(set(a + a1)) == 3
    assert all(s.is_real for s in a + a1)


def test_symbolic_equal_decides_max_and_min_by_cases() -> None:
    a, b = sympy.symbols("a b", real=True)
    assert symbolic_equal([sympy.Max(a, b) + sympy.Min(a, b)], [a + b])
    assert not symbolic_equal([sympy.Max(a, b)], [a])
    assert symbolic_equal([sympy.exp(a) * sympy.exp(b)], [sympy.exp(a + b)])
    assert not symbolic_equal([a, a], [a, b])


def test_orderings_use_fresh_names() -> None:
    """A scalar named ``t`` (the case split's own top symbol before) is split like any other."""
    t, b = sympy.Symbol("t", real=True), sympy.Symbol("b", real=True)
    assert not symbolic_equal([sympy.Max(t, b)], [t])
    assert symbolic_equal([sympy.Max(t, b)], [sympy.Max(b, t)])


def test_too_many_scalars_inside_max_are_not_split() -> None:
    xs = sympy.symbols(f"x0:{MAX_ORDERED + 1}", real=True)
    with pytest.raises(TooLarge):
        symbolic_equal([sympy.Max(*xs)], [xs[0]])
    # a difference free of Max is decided without splitting, whatever else holds a Max
    assert not symbolic_equal([sympy.Max(*xs), xs[0]], [sympy.Max(*xs), xs[1]])


def test_numeric_equal_tolerance_and_nan() -> None:
    assert numeric_equal([1.0, float("nan")], [1.0 + 1e-12, float("nan")])
    assert not numeric_equal([1.0], [1.0 + 1e-6])


def test_edges_scale_then_zero_and_mask_each_parameter() -> None:
    lemma = loads("axis x\nlemma l(A: [x], B: [x]) : A + B = B + A").lemmas[0]
    values = [np.array([1.0, 2.0]), np.array([3.0, 4.0])]
    found = list(edges(lemma, values, 10.0))
    masks = [f"-inf {what}" for what in ("at every other entry", "on a prefix", "on a suffix", "but at one entry",
                                         "outside a band", "at arbitrary entries")]
    assert [what for what, _ in found] == [
        " with the inputs times 10", " with `A` = 0", " with `A` = rows summing to 0", " with `A` = -inf",
        *(f" with `A` = {m}" for m in masks), " with `A` = +inf", " with `B` = 0", " with `B` = rows summing to 0",
        " with `B` = -inf", *(f" with `B` = {m}" for m in masks), " with `B` = +inf"]
    finite = loads("axis x\nlemma l(A: [x], B: [x]) : A + B = B + A when B finite").lemmas[0]
    assert [what for what, _ in edges(finite, values, 10.0)][-1] == " with `B` = rows summing to 0"  # no infinity
    np.testing.assert_array_equal(found[0][1][1], [30.0, 40.0])
    np.testing.assert_array_equal(found[2][1][0], [5.0, -5.0])  # 1 + floor(4·|1|), paired with its negation
    np.testing.assert_array_equal(found[4][1][0], [-np.inf, 2.0])
    np.testing.assert_array_equal(found[4][1][1], values[1])  # the other parameter is left as drawn


def test_partial_masks_take_the_shapes_masks_take() -> None:
    """Every other entry, a prefix, a suffix, one entry kept, a band kept and an arbitrary
    predicate, at the positions each names; all but the every-other one keep an entry at
    every size, and the kept entries keep their values."""
    n = 7
    value = np.arange(1.0, n + 1)
    shapes = dict(partial_masks(value))
    kept = {what: np.flatnonzero(np.isfinite(v)).tolist() for what, v in shapes.items()}
    assert kept["-inf at every other entry"] == [1, 3, 5]
    assert kept["-inf on a prefix"] == [4, 5, 6]
    assert kept["-inf on a suffix"] == [0, 1, 2]
    assert kept["-inf but at one entry"] == [3]
    assert kept["-inf outside a band"] == [2, 3, 4]
    assert 0 < len(kept["-inf at arbitrary entries"]) < n and n // 3 in kept["-inf at arbitrary entries"]
    for v in shapes.values():
        finite = np.isfinite(v)
        np.testing.assert_array_equal(v[finite], value[finite])
        assert np.all(v[~finite] == -np.inf)
    for size in range(2, 6):  # a kept entry at every size past 1 (at 1 a prefix is the whole row)
        for what, v in partial_masks(np.zeros(size)):
            assert what == "-inf at every other entry" or np.isfinite(v).any(), (what, size)
    matrix = dict(partial_masks(np.ones((2, 3))))["-inf on a suffix"]  # row-major over every axis
    np.testing.assert_array_equal(np.isfinite(matrix), [[True, True, True], [False, False, False]])


def test_a_difference_sympy_cannot_simplify_is_not_equal_rather_than_a_crash() -> None:
    """sympy's simplify raises AttributeError on |sign a| - sign |a| (its Piecewise rewrite): `napkin
    check` crashed on a user lemma with it; an undecided difference is not shown 0, so not equal."""
    a = sympy.Symbol("a", real=True)
    assert symbolic_equal([sympy.Abs(sympy.sign(a))], [sympy.sign(sympy.Abs(a))]) is False


def test_a_lemma_sympy_cannot_decide_is_refused_saying_so() -> None:
    """The same difference through `napkin check --certify`: the lemma is true, sympy cannot show it, and no
    random input shows the sides apart, so the refusal says that (it once said "the sides differ symbolically")."""
    from napkin_cat.proof import check_module

    text = ("axis x\nlemma signs(A: [x], B: [x]) : sum[x](abs(sign(A - B))) = sum[x](sign(abs(A - B)))\n"
            "diagram f(A: [x], B: [x]) -> [] {\n  return sum[x](abs(sign(A - B)))\n}\n"
            "theorem t: f {\n  rewrite signs at return\n}\n")
    (result,) = check_module(loads(text), "full")
    assert not result.ok
    assert result.failure is not None
    assert "sympy did not show the sides equal, and no random float64 input showed them apart" in result.failure.message
