"""Known holes of the join prover (issue 28, found by red team rtjoin3): wrong backwards that
``certify.prove.prove_join`` proves equal to the VJP over the reals and ``lower.backward.link`` lowers
without ``--allow-tested-join``, though float64 computes them off the VJP's gradient at inputs inside
float32's range.  Each test first shows the float64 evaluations apart (true now), then asks for the
join to be refused: strict xfail until the prover covers the class."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from napkin_cat.diagnostics import NapkinError
from napkin_cat.elaborate import loads
from napkin_cat.evaluate import evaluate
from napkin_cat.grad import vjp
from napkin_cat.lower.backward import link

#: the one failure each xfail expects: ``link`` lowering the join (any other error fails the test)
FAILED = pytest.fail.Exception


def _apart(text: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The VJP's and the backward ``b``'s dX of ``text``'s forward ``f(X, c)`` in float64 at X = ``x``, c = dY = 1."""
    module, one = loads(text), np.array(1.0)
    forward, backward = module.diagram("f"), module.diagram("b")
    return evaluate(vjp(forward), [x, one, one])[0], evaluate(backward, [x, one, one])[0]


def _refused(text: str) -> None:
    """``link`` refuses the join of ``text``'s ``f`` and ``b`` (the xfails' one expected failure: it lowers it)."""
    module = loads(text)
    with pytest.raises(NapkinError):
        link(module.diagram("f"), [module.diagram("b")])

def _scaled(factor: str, axes: str = "x") -> str:
    """A forward f(X: [axes], c) = sum(X)·c, whose VJP's dX is dY·c, and a backward b giving dY·c·``factor``
    (a term 1 over the reals, times exp(X·0) for dX's type)."""
    return (f"axis {', '.join(axes.split())}\ndiagram f(X: [{axes}], c: []) -> [] {{\n  Y = sum[{axes}](X) * c\n"
            f"  return Y\n}}\ndiagram b(X: [{axes}], c: [], dY: []) -> [{axes}], [] {{\n"
            f"  dX = dY * c * {factor} * exp(X * 0)\n  dc = dY * sum[{axes}](X)\n  return dX, dc\n}}\n")


#: u is within 1e-16 of 0 (so the finiteness analysis bounds exp(u) within 2^±1.5e-16 and 56 nested squares
#: stay finite); at every |X| < 1e4 the float64 test draws u is below 1e-50 and exp(u)·exp(-u) exactly 1, at
#: X = 1e38 u = 1e-16 and exp(u)·exp(-u) = 1 · (1 - 2^-53), whose 2^56-th power is e^-8 = 3.4e-4
U = "tanh(X * 1e-35) * 1e-16"
POWER = "square(" * 56 + f"exp({U}) * exp(-{U})" + ")" * 56
SQUARES = _scaled(POWER)


@pytest.mark.xfail(strict=True, raises=FAILED, reason=
                   "prove.py reads exp(u)·exp(-u) as 1 (sympy) and squares of 1 as 1; no check "
                   "covers a product or quotient that is a constant over the reals while reading inputs (``cancelled`` "
                   "covers add/sub/sum/contract only, ``log`` a computed 1 only): its 2^-53 residue, raised to the "
                   "2^56-th power by nested squares, is e^-8")
def test_a_rounded_product_identity_raised_by_nested_squares_is_refused() -> None:
    want, got = _apart(SQUARES, np.array([1e38, -2e38, 3e37]))
    assert np.all(want == 1.0) and np.all(np.abs(got - 3.3546e-4) < 1e-7), (want, got)
    _refused(SQUARES)


#: the forward saves O = -exp(X): -inf in float64 at X = 800, where the reals' -e^800 is below -FLOAT_MAX too; the
#: prover reads the guard max(O, -FLOAT_MAX) as O (``_Semantics.float_input``: an input of the backward whose term
#: is free of infinities), where it is -FLOAT_MAX (so tanh(·1e-330) is -0 and not -1: the factor is e, not 1)
SCALE = " * 1e-30" * 11
GUARD = ("axis x\ndiagram f(X: [x], c: []) -> [], [x] {\n  Y = sum[x](X) * c\n  O = 0 - exp(X)\n  return Y, O\n}\n"
         f"diagram b(X: [x], c: [], O: [x], dY: []) -> [x], [] {{\n"
         f"  dX = dY * c * exp(tanh(max(O, -1.7976931348623157e+308){SCALE})) / exp(tanh(O{SCALE}))\n"
         "  dc = dY * sum[x](X)\n  return dX, dc\n}\n")


@pytest.mark.xfail(strict=True, raises=FAILED, reason=
                   "prove.py's guard max(L, -FLOAT_MAX) is read as L for any backward input whose "
                   "sympy term is free of infinities; a saved forward output such as -exp(X) is -inf in float64 (and "
                   "below -FLOAT_MAX over the reals) at X = 800, where the guard clamps")
def test_a_guard_read_through_on_a_saved_output_float64_makes_minus_inf_is_refused() -> None:
    module = loads(GUARD)
    forward, backward = module.diagram("f"), module.diagram("b")
    x, one = np.array([800.0, 1e3, 1.0]), np.array(1.0)
    _, saved = evaluate(forward, [x, one])
    want = evaluate(vjp(replace(forward, outputs=forward.outputs[:1], out_types=forward.out_types[:1])),
                    [x, one, one])[0]
    got = evaluate(backward, [x, one, saved, one])[0]
    assert np.all(want == 1.0) and np.allclose(got, [np.e, np.e, 1.0]), (want, got)
    _refused(GUARD)


#: two reductions equal over the reals that float64 sums in another order: at X = [[1e30, 1], [-1e30, 0]] the flat
#: sum over x y (row-major: 1e30 + 1 rounds to 1e30) is 0, the sum over x then y 1, so the factor is e^-tanh(1)
ORDERS = "exp(tanh({a})) / exp(tanh({b}))"  # over [x y]


@pytest.mark.xfail(strict=True, raises=FAILED, reason=
                   "prove.py reads reductions over the reals, where the order of a sum is free; "
                   "no check covers two sums of the same terms that float64 adds in different orders (``cancelled`` "
                   "looks at sums that are 0 over the reals only): at a cancellation inside the sum their values "
                   "differ by the whole result")
@pytest.mark.parametrize(("a", "b"), [("sum[x y](X)", "sum[y](sum[x](X))"),
                                      ("sum[x](sum[y](X))", "sum[y](sum[x](X))"),
                                      ("sum[x y](X)", "contract[x y](X, X * 0 + 1)")],
                         ids=["flat_nested", "nested_nested", "sum_contract"])
def test_sums_of_one_term_in_two_orders_are_refused(a: str, b: str) -> None:
    want, got = _apart(_scaled(ORDERS.format(a=a, b=b), "x y"), np.array([[1e30, 1.0], [-1e30, 0.0]]))
    assert np.all(want == 1.0) and np.all(np.abs(got - want) > 0.5), (want, got)
    _refused(_scaled(ORDERS.format(a=a, b=b), "x y"))


#: red team rt3's residue Σ 3·X - 3·Σ X read as a quotient, which ``_Semantics.cancelled`` (add, sub, sum, contract
#: cancelling to 0) does not see: at X = [3203455240676149, 3262313340441849, -6465768581117998] float64's Σ 3·X is 4
#: and 3·Σ X is 0, so the factor is e^tanh(4) = 2.716 where the VJP's is 1
QUOTIENT = _scaled("exp(tanh(sum[x](X * 3))) / exp(tanh(sum[x](X) * 3))")


@pytest.mark.xfail(strict=True, raises=FAILED, reason=
                   "a cancellation read multiplicatively: exp(tanh(a)) / exp(tanh(b)) with a, b "
                   "equal over the reals but computed otherwise is the refused exp(tanh(a) - tanh(b)); the prover's "
                   "checks look at differences and sums only")
def test_a_rounding_residue_read_as_a_quotient_is_refused() -> None:
    want, got = _apart(QUOTIENT, np.array([3203455240676149.0, 3262313340441849.0, -6465768581117998.0]))
    assert np.all(want == 1.0) and np.allclose(got, np.exp(np.tanh(4.0))), (want, got)
    _refused(QUOTIENT)


#: log(exp(X)) is X over the reals; float64's exp(-800) underflows to 0, whose log is -inf, so tanh(·0.001) is -1 where
#: the reals' is tanh(-0.8) = -0.664 (the overflow side, +inf at X = 960, is ``_finite_where_the_vjp_is``'s; a bounded
#: reading keeps the gradient finite), and the naive log-sum-exp log(Σ exp(X)) likewise beside logsumexp's shift
UNDERFLOW = "exp(tanh({a} * 0.001)) / exp(tanh({b} * 0.001))"


@pytest.mark.xfail(strict=True, raises=FAILED, reason=
                   "prove.py reads log(exp(X)) as X and log(Σ exp(X)) as logsumexp over the reals; zero_read refuses a "
                   "log of a term 0 over the reals, not of a positive term float64 underflows to 0 (log's -inf)")
@pytest.mark.parametrize(("a", "b"), [("log(exp(X))", "X"), ("log(sum[x](exp(X)))", "logsumexp[x](X)")],
                         ids=["log_exp", "naive_logsumexp"])
def test_a_log_of_an_underflowed_exp_read_as_its_real_value_is_refused(a: str, b: str) -> None:
    want, got = _apart(_scaled(UNDERFLOW.format(a=a, b=b)), np.array([-800.0, -900.0, -1000.0]))
    assert np.all(want == 1.0) and np.all(np.abs(got - want) > 0.2), (want, got)
    _refused(_scaled(UNDERFLOW.format(a=a, b=b)))


#: Z = X·1e-150 (five literals in float32's range), read back up by 1e180 (six divisions by 1e-30): sqrt(Z²) is |Z| over
#: the reals, and 0 in float64 at X = 1e-20 (Z² = 1e-340 underflows), where tanh of it scaled is 0, not 1 (factor 1/e)
Z = "(X" + " * 1e-30" * 5 + ")"
UP = " / 1e-30" * 6
SQRT = _scaled(f"exp(tanh(sqrt(square({Z})){UP})) / exp(tanh(abs({Z}){UP}))")


@pytest.mark.xfail(strict=True, raises=FAILED, reason=
                   "prove.py reads sqrt(square(Z)) as |Z|; float64's square underflows to 0 at |Z| < 1e-162, which no "
                   "check sees where the gradient stays finite (zero_read covers terms 0 over the reals only)")
def test_a_square_float64_underflows_read_back_up_is_refused() -> None:
    want, got = _apart(SQRT, np.array([1e-20, 3e-20, -2e-20]))
    assert np.all(want == 1.0) and np.allclose(got, 1 / np.e), (want, got)
    _refused(SQRT)
