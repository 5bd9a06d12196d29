"""The running error bounds of float64 evaluation (``napkin_cat.lower.roundoff``), which the join
test compares within: the values are ``evaluate``'s bit for bit, and each bound holds against the
exact value (sympy, evaluated to 40 digits), cancellation and input errors included."""

from __future__ import annotations

import numpy as np
import sympy

from napkin_cat.elaborate import loads
from napkin_cat.evaluate import SYMBOLIC, evaluate
from napkin_cat.lower.roundoff import U, evaluate_bounded

#: every kind of rule the join tests meet: contractions, exp-normalised and rms weights, a saved
#: statistic read back through exp, functions, divisions, scans, reductions and masks
MODULE = loads("""axis t, d
diagram f(X: [t d], Y: [t d], L: [t]) -> [t], [t d], [t d], [t d], [t d], [t], [t d], [t d] {
  S = contract[d](X, Y)
  P = softmax[d](where[t d](t >= d, X * 3, -inf))
  E = exp(Y * 4 - L)
  G = gelu(X) / (2 + tanh(Y)) - sqrt(square(X) + 1) * sigmoid(Y)
  R = rmsnorm[d](X) + ncontract[d; exp, exp, id](Y, X)
  M = logsumexp[d](Y) + max[d](X) * mean[d](Y) - prod[d](X)
  C = cumsum[t](X - Y)
  H = linrec[t](sigmoid(Y), X)
  return S, P, E, G, R, M, C, H
}
""")


def _exact(arrays: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    rational = [np.vectorize(sympy.Rational, otypes=[object])(a) for a in arrays]
    outs = evaluate(MODULE.diagram("f"), rational, algebra=SYMBOLIC)
    return tuple(np.vectorize(lambda v: float(sympy.N(v, 40)), otypes=[float])(o) for o in outs)


def test_the_bounds_hold_against_the_exact_values() -> None:
    rng = np.random.default_rng(0)
    for scale in (1.0, 16.0):
        x, y = scale * rng.standard_normal((5, 4)), scale * rng.standard_normal((5, 4))
        stat = np.log(np.exp(y * 4).sum(axis=1)) + 3 * U * np.abs(y).max()  # an input that is itself rounded
        values, bounds = evaluate_bounded(MODULE.diagram("f"), [x, y, stat], [0.0, 0.0, 3 * U * np.abs(stat)])
        plain = evaluate(MODULE.diagram("f"), [x, y, stat])
        for got, want in zip(values, plain, strict=True):
            np.testing.assert_array_equal(got, want)  # evaluate's values, bit for bit
        for k, (got, bound, exact) in enumerate(zip(values, bounds, _exact([x, y, stat]), strict=True)):
            assert (np.abs(got - exact) <= bound).all(), (k, scale, np.abs(got - exact) - bound)
            assert (bound <= 1e-9 * np.maximum(1.0, np.abs(exact))).all(), (k, scale, bound)  # and not vacuous


def test_a_cancelling_sum_keeps_the_bound_of_its_terms() -> None:
    """1e16 + x - 1e16 computes 0 or 2 for x = 1: the bound is γ·Σ|terms|, about 4, not u·|result|."""
    module = loads("axis n\ndiagram f(X: [n]) -> [] {\n  return sum[n](X)\n}\n")
    values, bounds = evaluate_bounded(module.diagram("f"), [np.array([1e16, 1.0, -1e16])])
    assert abs(values[0] - 1.0) <= bounds[0] <= 2 * 2 * U * 2e16
