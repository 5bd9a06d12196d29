"""How far certification sweeps a lemma (napkin_cat/certify/reach.py)."""

from __future__ import annotations

import pytest

from napkin_cat.certify.reach import UNBOUNDED, reach, scale, unfolded
from napkin_cat.elaborate import loads
from napkin_cat.terms import Apply, LemmaDecl, walk

CALLS = """
axis x
diagram g(a: []) -> [] {
  return (a - 1) * (a - 2) * (a - 3) * (a - 4) * (a - 5) * (a - 6)
}
lemma inside(A: [x]) : sum[x](A) = sum[x](A) + g(x)
lemma plain(A: [x]) : sum[x](A) = sum[x](A) + (x - 1) * (x - 2) * (x - 3) * (x - 4) * (x - 5) * (x - 6)
"""


def _lemma(text: str) -> LemmaDecl:
    return loads("axis x, y\n" + text).lemmas[0]


@pytest.mark.parametrize(("text", "at_least"), [
    ("lemma l(A: [x]) : sum[x](A) = sum[x](where[x](x < 5, A, 0))", 5),  # an index constant
    ("lemma l(A: [x]) : sum[x](A) = sum[x](A) + relu(x - 10)", 10),  # a constant a size is compared with
    ("lemma l(A: [x]) : sum[x](A) = sum[x](A) + relu(x * 0.04 - 1)", 25),  # a Cauchy root bound
    ("lemma l(A: [x]) : sum[x](A) = sum[x](A) + relu(x - exp(exp(1)))", 16),  # a closed term at its value
])
def test_reach_passes_where_the_sides_could_part(text: str, at_least: int) -> None:
    assert reach(_lemma(text)) > at_least


def test_reach_without_sizes_is_small_and_step_without_polynomial_is_unbounded() -> None:
    assert reach(_lemma("lemma l(A: [], B: []) : A + B = B + A")) == 2
    assert reach(_lemma("lemma l(A: [x]) : sum[x](A) = sum[x](A) + relu(sqrt(x) - 5)")) == UNBOUNDED


def test_reach_reads_through_called_diagrams() -> None:
    """A size passed to a diagram counts as if the callee's body were written in place."""
    inside, plain = loads(CALLS).lemmas
    assert not any(isinstance(n, Apply) for side in unfolded(inside) for n in walk(side))
    assert reach(inside) == reach(plain) > 6


def test_scale_crosses_the_lemma_constants() -> None:
    assert scale(_lemma("lemma l(A: [x]) : sum[x](relu(A * 0.01 - 5)) = sum[x](relu(A * 0.01 - 5))")) == 502
    assert scale(_lemma("lemma l(A: []) : A = A")) == 3  # 2 plus the empty product
