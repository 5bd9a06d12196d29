"""Signs in the prover (napkin_cat.certify.atoms): a reduction atom reports a sign only where it
holds at every length n >= 1, so abs, sign and sqrt(square(.)) of a product are not rewritten
by the sign of its body (Π(-1 - X²) is negative at odd lengths, positive at even ones)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import sympy

from napkin_cat.certify import atoms, prove
from napkin_cat.elaborate import loads

X = sympy.Function("X", real=True)
AT = sympy.Symbol("i_x", integer=True)
BODIES = {"positive": 1 + X(AT) ** 2, "nonnegative": X(AT) ** 2, "negative": -1 - X(AT) ** 2,
          "nonpositive": -X(AT) ** 2, "any": X(AT)}
FOLD = {"Sum": sum, "Prod": math.prod, "Max": max, "Min": min}
CLAIMS = {"is_positive": lambda v: v > 0, "is_nonnegative": lambda v: v >= 0, "is_negative": lambda v: v < 0,
          "is_nonpositive": lambda v: v <= 0, "is_zero": lambda v: v == 0}


@pytest.mark.parametrize(("kind", "body"), list(itertools.product(FOLD, BODIES)))
def test_an_atom_claims_a_sign_only_where_it_holds_at_every_length(kind: str, body: str) -> None:
    """Each sign sympy reports for the atom (True or False) holds for the reduction's value at
    lengths 1..6 on random inputs and on zeros (where a non-negative body is 0)."""
    atom = atoms.reduce(kind, BODIES[body], ("x",))
    claims = {name: getattr(atom, name) for name in CLAIMS}
    rng = np.random.default_rng(0)
    for n in range(1, 7):
        for values in [rng.standard_normal(n) for _ in range(20)] + [np.zeros(n)]:
            terms = [float(BODIES[body].subs(X(AT), sympy.Float(v))) for v in values]
            value = FOLD[kind](terms)
            for name, claimed in claims.items():
                if claimed is not None:
                    assert CLAIMS[name](value) is claimed, (kind, body, name, n, values)


WRONG = """axis x
lemma abs_of_product(X: [x]) : abs(prod[x](-1.0 - square(X))) = -prod[x](-1.0 - square(X))
lemma sign_of_product(X: [x]) : sign(prod[x](-1.0 - square(X))) = -1.0
lemma sqrt_square_of_product(X: [x]) : sqrt(square(prod[x](-1.0 - square(X)))) = -prod[x](-1.0 - square(X))
lemma abs_of_product_of_nonpositive(X: [x]) : abs(prod[x](-square(X))) = -prod[x](-square(X))
"""

RIGHT = """axis x
lemma abs_of_sum(X: [x]) : abs(sum[x](-1.0 - square(X))) = sum[x](1.0 + square(X))
lemma abs_of_positive_product(X: [x]) : abs(prod[x](1.0 + square(X))) = prod[x](1.0 + square(X))
lemma sign_of_max(X: [x]) : sign(max[x](-1.0 - square(X))) = -1.0
lemma abs_of_min(X: [x]) : abs(min[x](-1.0 - square(X))) = -min[x](-1.0 - square(X))
lemma sqrt_square_of_exp_product(X: [x]) : sqrt(square(prod[x](exp(X)))) = prod[x](exp(X))
"""


@pytest.mark.parametrize("lemma", loads(WRONG).lemmas, ids=lambda lemma: lemma.name)
def test_a_product_of_negatives_has_no_sign_at_every_length(lemma) -> None:  # type: ignore[no-untyped-def]
    assert prove.prove_lemma(lemma) is None


@pytest.mark.parametrize("lemma", loads(RIGHT).lemmas, ids=lambda lemma: lemma.name)
def test_signs_that_hold_at_every_length_are_still_used(lemma) -> None:  # type: ignore[no-untyped-def]
    assert prove.prove_lemma(lemma) is not None
