"""The cases certification evaluates and its equality decisions (napkin_cat/certify/cases.py)."""

from __future__ import annotations

import numpy as np
import pytest
import sympy

from napkin_cat.certify.cases import MAX_ORDERED, TooLarge, edges, grid, numeric_equal, symbolic_equal, symbols
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
    assert [what for what, _ in found] == [
        " with the inputs times 10", " with `A` = 0", " with `A` = rows summing to 0", " with `A` = -inf",
        " with `A` = -inf at every other entry", " with `A` = +inf", " with `B` = 0", " with `B` = rows summing to 0",
        " with `B` = -inf", " with `B` = -inf at every other entry", " with `B` = +inf"]
    finite = loads("axis x\nlemma l(A: [x], B: [x]) : A + B = B + A when B finite").lemmas[0]
    assert [what for what, _ in edges(finite, values, 10.0)][-1] == " with `B` = rows summing to 0"  # no infinity
    np.testing.assert_array_equal(found[0][1][1], [30.0, 40.0])
    np.testing.assert_array_equal(found[2][1][0], [5.0, -5.0])  # 1 + floor(4·|1|), paired with its negation
    np.testing.assert_array_equal(found[4][1][0], [-np.inf, 2.0])
    np.testing.assert_array_equal(found[4][1][1], values[1])  # the other parameter is left as drawn
