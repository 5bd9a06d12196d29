"""Certification: true lemmas and accumulator laws certify; false ones are caught, with the
failing size or law named."""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from napkin_cat import certify
from napkin_cat.certify import accumulators, prove, rules
from napkin_cat.certify import reach as certify_reach
from napkin_cat.certify.accumulators import accumulators_for
from napkin_cat.elaborate import loads
from napkin_cat.evaluate import Named, evaluate_named
from napkin_cat.ops import typed_box
from napkin_cat.terms import Box, Const, Var, box_diagram, walk

FALSE = """
axis x, y
lemma softmax_linear(A: [x], B: [x]) : softmax[x](A + B) = softmax[x](A) + softmax[x](B)
lemma max_is_first(A: [x]) : max[x](A) = sum[x](A) / x
lemma swapped(S: [x], V: [x]) : contract[x](softmax[x](S), V) = ncontract[x; exp, exp, id](V, S)
lemma shift_wrong(S: [x], V: [x]) :
  ncontract[x; exp, exp, id](S, V) = ncontract[x; exp, exp, id](S - min[x](S) * 2, V) * 2
lemma max_order(A: [], B: []) : max(A, B) = A
lemma vanishes_to_4(A: [x]) : sum[x](A) = sum[x](A) + (x - 1) * (x - 2) * (x - 3) * (x - 4)
lemma cut_at_5(A: [x]) : sum[x](A) = sum[x](where[x](x < 5, A, 0))
lemma labels_never_hit(L: []) : sum[x](onehot[x](L)) = L * 0
lemma relu_step(A: [x]) : sum[x](A) = sum[x](A) + relu(x - 6)
lemma tiny_step(A: [x]) : sum[x](A) = sum[x](A) + 0.0000000001 * relu(x - 3)
"""


@pytest.mark.parametrize("name", sorted(rules.library()))
def test_every_library_lemma_certifies(name: str) -> None:
    cert = certify.certify_lemma(rules.library()[name])
    assert cert.ok, cert
    assert "sympy" in cert.how and "float64" in cert.how


#: the smallest size of x at which each false lemma's sides part (sizes are swept smallest first)
FIRST_WRONG_AT = {"softmax_linear": 1, "max_is_first": 2, "swapped": 1, "shift_wrong": 1, "max_order": None,
                  "vanishes_to_4": 5, "cut_at_5": 6, "labels_never_hit": 1, "relu_step": 7, "tiny_step": 4}


def test_every_false_lemma_has_its_first_wrong_size() -> None:
    assert {lm.name for lm in loads(FALSE).lemmas} == set(FIRST_WRONG_AT)


@pytest.mark.parametrize("lemma", loads(FALSE).lemmas, ids=lambda lm: lm.name)
def test_false_lemmas_are_caught(lemma) -> None:  # type: ignore[no-untyped-def]
    """Refused, with the smallest counterexample: the first size at which the sides part."""
    cert = certify.certify_lemma(lemma)
    assert not cert.ok and cert.counterexample, cert
    first, size = FIRST_WRONG_AT[lemma.name], re.search(r"\bx=(\d+)", cert.counterexample)
    if first is None:
        assert size is None and cert.counterexample.startswith("no axes"), cert.counterexample
    else:
        assert size is not None and int(size[1]) == first, cert.counterexample


def test_values_read_as_integers_from_symbols_are_not_case_split() -> None:
    """A comparison or a mask of floor of a parameter, or a gather at it, has no integer to read
    from a sympy symbol: the symbolic tier raised TypeError (cannot determine truth value of
    Relational; cannot convert symbols to int) out of certification.  Such a lemma is certified
    as a onehot lemma is, on rationals and in float64: a true one is tested, a false one refused
    (tests/unsound/rt5plan_user_lemma_*)."""
    true = loads("axis x\nlemma keep(X: [x], A: [x]) : cumsum[x](select(gt(floor(X), 0), A, 0)) = "
                 "cumsum[x](select(ge(floor(X), 1), A, 0))").lemmas[0]
    cert = certify.certify_lemma(true)
    assert cert.ok and "tested: no sympy (a comparison and a mask)" in cert.how, cert
    read = loads("axis n, m\nlemma same(T: [n], I: [m]) : sum[m](gather[n](T, floor(I))) * 2 = "
                 "sum[m](gather[n](T * 2, floor(I)))").lemmas[0]
    cert = certify.certify_lemma(read)
    assert cert.ok and "no sympy (a gather)" in cert.how, cert
    positions = loads("axis q, x\nlemma diag(A: [q x], B: [q x]) : select(eq(index[q](q), index[x](x)), A, B) = "
                      "where[q x](q == x, A, B)").lemmas[0]
    cert = certify.certify_lemma(positions)  # positions are concrete at every size: still case split
    assert cert.ok and "sympy" in cert.how and "no sympy" not in cert.how, cert


def test_bounded_checks_reach_past_the_lemma_constants() -> None:
    """Sizes are swept to 2 + size sources + index constants; a lemma reaching too far is refused."""
    far = loads("axis x\nlemma far(A: [x]) : sum[x](A) = sum[x](where[x](x < 100, A, 0))").lemmas[0]
    assert certify.certify_lemma(far).how == "reach"
    true = loads("axis x\nlemma hits(L: []) : sum[x](onehot[x](L) * L) = sum[x](onehot[x](L)) * L").lemmas[0]
    cert = certify.certify_lemma(true)
    # proved (onehot is an opaque 0/1 function of L and x's position, certify.prove) and tested
    assert cert.ok and cert.how.startswith("proved: ") and "tested: no sympy (onehot)" in cert.how, cert
    squares = loads("axis x\nlemma sq(A: [x]) : sum[x](A) + contract[x](index[x](x), index[x](x)) = "
                    "sum[x](A + index[x](x) * index[x](x))").lemmas[0]
    assert certify.certify_lemma(squares).ok  # an index-only term is a size source, not a constant


def test_max_case_split_decides_running_maxima() -> None:
    lemma = rules.library()["max_nested"]
    assert certify.certify_lemma(lemma, "full").ok


def test_sizes_are_swept_off_the_diagonal() -> None:
    """A difference that vanishes wherever the axes are equal is found at unequal sizes,
    exactly when it is below float64's tolerance; a grid too large to sweep is refused."""
    tiny = loads("axis x, y\nlemma t(X: [x], Y: [y]) : sum[x](X) + sum[y](Y) = "
                 "sum[x](X) + sum[y](Y) + 1e-12 * relu(x - y - 2)").lemmas[0]
    cert = certify.certify_lemma(tiny)
    assert (cert.how, cert.counterexample and cert.counterexample.split(" on ")[0]) == ("exact", "sizes x=4, y=1")
    wide = loads("axis x, y, z, w, v\nlemma w(X: [x], Y: [y], Z: [z], W: [w], V: [v]) : "
                 "contract[x y z w v](X, Y, Z, W, V) = sum[x](X) * sum[y](Y) * sum[z](Z) * sum[w](W) * sum[v](V)"
                 ).lemmas[0]
    cert = certify.certify_lemma(wide)
    assert cert.how == "reach" and "size combinations" in (cert.counterexample or ""), cert


@pytest.mark.parametrize(("text", "edge"), [
    ("lemma s(S: [x]) : softmax[x](S) = exp(S) / sum[x](exp(S))", "with `S` = -inf"),
    ("lemma l(S: [x]) : l2norm[x](S) = S * rsqrt(sum[x](square(S)))", "with `S` = 0"),
    ("lemma m(S: [x], V: [x]) : ncontract[x; exp, exp, id](S, V) = "
     "ncontract[x; exp, exp, id](S - max[x](S), V)", "with `S` = -inf"),
])
def test_lemmas_keep_the_values_conventions_define(text: str, edge: str) -> None:
    """True over the reals, false where evaluate.py's conventions give a finite value
    (a fully masked row's softmax is 0, an all-zero row's l2norm is 0) and the right
    side gives NaN: a rewrite must keep every finite value of its left side."""
    cert = certify.certify_lemma(loads("axis x\n" + text).lemmas[0])
    assert not cert.ok and cert.how == "float64" and edge in (cert.counterexample or ""), cert


def test_partly_masked_rows_of_every_shape_are_edge_inputs() -> None:
    """The kept count k = Σ sign(p) plus k(x - k)(2k - x)(2k - x + 1), which is 0 at k = x,
    k = 0 and k = ⌊x/2⌋ (every other entry masked, a prefix, a suffix): only a mask of
    another shape (here arbitrary entries at x=3, k=2) sees the lemma is false."""
    k = "sum[x](sign(softmax[x](S)))"
    text = f"axis x\nlemma kept(S: [x]) : {k} = {k} + {k} * (x - {k}) * (2.0 * {k} - x) * (2.0 * {k} - x + 1.0)"
    cert = certify.certify_lemma(loads(text).lemmas[0])
    assert not cert.ok and cert.how == "float64", cert
    assert "-inf" in (cert.counterexample or "") and "every other" not in (cert.counterexample or ""), cert


UNSAFE = [
    ("lemma e(A: [], B: []) : exp(A + B) = exp(A) * exp(B)", "magnitude 1000 it gives nan where the left side gives 1"),
    ("lemma l(S: [x]) : logsumexp[x](S) = log(sum[x](exp(S)))",
     "magnitude 1000 it gives inf where the left side gives 1000"),
    ("lemma s(S: [x]) : softmax[x](S) = exp(S) / sum[x](exp(S)) when S finite", "magnitude 1000 it gives nan"),
    ("lemma a(X: []) : abs(X) = sqrt(square(X))", "magnitude 1e+200 it gives inf where the left side gives 1e+200"),
    ("lemma d(A: [x], B: [x], C: [x]) : contract[x](A + B, C) = contract[x](A, C) + contract[x](B, C)",
     "magnitude 1e+200 it gives nan where the left side gives 0"),
    # no sampled magnitude sees it: the right side overflows only for c in (709.8, 759.8), where the
    # left side is finite, and both are inf at 1e3; the left side's edge is found by bisection
    ("lemma w(c: []) : exp(c - 50.0) = exp(c) * exp(-50.0)", "it gives inf where the left side gives 1.798e+305"),
]


@pytest.mark.parametrize(("text", "message"), UNSAFE)
def test_lemmas_that_overflow_in_floating_point_are_refused(text: str, message: str) -> None:
    """Each is true over the reals (proved at every size) and on every edge input, but its
    right side overflows where its left side is finite (exp past 709.8, a square past 1.3e154,
    a product of two terms of 1e200 whose sum is 0)."""
    lemma = loads("axis x\n" + text).lemmas[0]
    assert prove.prove_lemma(lemma) is not None
    cert = certify.certify_lemma(lemma)
    assert not cert.ok and cert.how == "float64 safety", cert
    assert message in (cert.counterexample or ""), cert
    assert cert.counterexample == certify.lemma_float_safety(lemma)


@pytest.mark.parametrize("text", [
    "lemma e(A: [], B: []) : exp(A) * exp(B) = exp(A + B)",
    "lemma l(S: [x]) : log(sum[x](exp(S))) = logsumexp[x](S)",
    "lemma a(X: []) : sqrt(square(X)) = abs(X)",
    "lemma d(A: [x], B: [x], C: [x]) : contract[x](A, C) + contract[x](B, C) = contract[x](A + B, C)",
])
def test_the_safe_direction_of_an_overflowing_lemma_certifies(text: str) -> None:
    """The same equations the other way round: where the left side is finite so is the right
    (a finite exp(A)·exp(B) means A + B < 709.8; log Σ exp is inf where logsumexp is finite)."""
    lemma = loads("axis x\n" + text).lemmas[0]
    assert certify.lemma_float_safety(lemma) is None
    assert certify.certify_lemma(lemma).ok


@pytest.mark.parametrize("name", sorted(rules.library()))
def test_library_lemmas_are_safe_in_floating_point(name: str) -> None:
    assert certify.lemma_float_safety(rules.library()[name]) is None


def test_edge_inputs_skip_values_the_left_side_leaves_undefined() -> None:
    """``c * A`` with ``c = -inf`` is NaN or ±inf on either side: not a value to keep."""
    assert certify.certify_lemma(rules.library()["contract_scale"], "full").ok
    shift = rules.library()["online_softmax_shift"]
    assert certify.certify_lemma(shift, "full").ok


@pytest.mark.parametrize(("box", "axis"), certify.representative_boxes(), ids=lambda v: getattr(v, "op", v))
def test_accumulator_laws_certify(box, axis) -> None:  # type: ignore[no-untyped-def]
    names = accumulators_for(box, axis)
    assert names, f"{box.op} consumes `{axis}` but has no accumulator to certify"
    for name in names:
        cert = certify.certify_accumulator(box, axis, name, True)
        assert cert.ok, (name, cert)


def test_accumulator_refusals() -> None:
    s, v = Var("X0", ("x",)), Var("X1", ("x",))
    odd = typed_box("ncontract", (s, v), ("x",), params=("sigmoid", "square", "id"))
    cert = certify.certify_accumulator(odd, "x", "normalised", True)
    assert not cert.ok and "no padding value" in (cert.counterexample or "")
    assert certify.certify_accumulator(odd, "x", "normalised", False).ok
    # with b = sqrt an all-zero row has Σ sigmoid(0)·V ≠ 0 over a normaliser of 0, where the box
    # is 0: the sign-guarded finaliser gives that 0 (dividing by max(sqrt(0), TINY) did not)
    root = typed_box("ncontract", (s, v), ("x",), params=("sigmoid", "square", "sqrt"))
    assert certify.certify_accumulator(root, "x", "normalised", False).ok
    assert not certify.certify_accumulator(odd, "x", "max", False).ok
    assert "no padding value" in certify.accumulator(odd, "x", "normalised", True)
    assert certify.accumulator(odd, "x", "normalised", False).startswith(("proved", "tested"))


def test_a_false_absorption_claim_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Online softmax with the values claimed to absorb (what let masked values skip chunks,
    issue 18): a chunk of zero values still adds exp(s - m) to l, and certification says so."""
    s, v = Var("X0", ("q", "x")), Var("X1", ("x", "d"))
    box = typed_box("ncontract", (s, v), ("x",), params=("exp", "exp", "id"))
    real = accumulators.plan

    def claims_more(*args: object, **kwargs: object) -> accumulators.AccumulatorPlan:
        return dataclasses.replace(real(*args, **kwargs), absorbing=(0, 1))  # type: ignore[arg-type]

    monkeypatch.setattr(accumulators, "plan", claims_more)
    cert = certify.certify_accumulator.__wrapped__(box, "x", "online_softmax", False, "quick")
    assert not cert.ok and cert.how == "float64", cert
    assert "lift(x with input 1 all 0.0) != identity" in (cert.counterexample or "")
    monkeypatch.setattr(accumulators, "plan", real)
    assert certify.certify_accumulator.__wrapped__(box, "x", "online_softmax", False, "quick").ok


@pytest.mark.parametrize("name", sorted(rules.library()))
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_library_lemmas_hold_on_hypothesis_sizes_and_values(name: str, data: st.DataObject) -> None:
    """T2 by hypothesis: both sides agree in float64 on drawn sizes and values."""
    lemma = rules.library()[name]
    sizes = {a.name: data.draw(st.integers(1, 4), label=a.name) for a in lemma.axes}
    for node in (n for side in (lemma.lhs, lemma.rhs) for n in walk(side)):
        if isinstance(node, Box) and node.op in ("split", "join"):  # the whole axis is the product of its parts
            whole, parts = (node.target, node.out) if node.op == "split" else (node.out, node.target)
            sizes[whole[0]] = math.prod(sizes[p] for p in parts)
    values = st.floats(-3, 3, allow_nan=False, allow_infinity=False)
    inputs = [Named(p.axes, np.asarray(data.draw(hnp.arrays(np.float64, [sizes[a] for a in p.axes], elements=values)),
                                       dtype=np.float64)) for p in lemma.params]
    (left,) = evaluate_named(certify.lemma_side(lemma, lemma.lhs), inputs, dict(sizes))
    (right,) = evaluate_named(certify.lemma_side(lemma, lemma.rhs), inputs, dict(sizes))
    np.testing.assert_allclose(left.data, right.to(left.axes), rtol=1e-9, atol=1e-9)


def test_piecewise_boxes_of_the_data_still_certify() -> None:
    """The step bound reads sizes and positions; a piecewise box of the data alone adds nothing."""
    lemma = loads("axis x\nlemma r(X: [x]) : sum[x](relu(X) * 2) = sum[x](max(X, 0) + max(X, 0))").lemmas[0]
    cert = certify.certify_lemma(lemma, "full")
    assert cert.ok and cert.how.endswith("sizes ≤6"), cert  # 2 + two sums + the constant 2


@pytest.mark.parametrize("term", ["relu(x * sqrt(-2.0) - 1)", "relu(x * recip(0.0) - 1)", "relu(x * log(0.0) - 1)"])
def test_lemmas_sympy_cannot_read_are_refused_not_crashed(term: str) -> None:
    lemma = loads(f"axis x\nlemma l(X: [x]) : sum[x](X) = sum[x](X + {term})").lemmas[0]
    cert = certify.certify_lemma(lemma)
    assert not cert.ok and cert.counterexample, cert


def test_a_lemma_with_sides_of_different_types_is_refused_not_crashed() -> None:
    """certify_lemma on its own (``rules.validate`` is not run before it): the sides [y] and []
    cannot be compared entry by entry (an AssertionError in the exact tier)."""
    lemma = loads("axis x, y\nlemma l(A: [x], L: []) : onehot[y](L) * sum[x](A) = sum[x](A)").lemmas[0]
    cert = certify.certify_lemma(lemma)
    assert not cert.ok and cert.how == "invalid"
    assert cert.counterexample is not None and "the sides have different types [y] and []" in cert.counterexample


def test_lemmas_calling_diagrams_are_refused_and_their_reach_reads_through_the_callee() -> None:
    """Lemmas are stated on primitive boxes: certify refuses one that calls a diagram (as
    rules.validate does at load).  Its reach still reads through the call, for any caller that
    certifies on its own: a size passed to a diagram counts (``g(x)`` hid (x-1)..(x-6) from a
    sweep to 5), and a call inside a piecewise box's argument is read, not a crash."""
    module = loads("""axis x
diagram g(a: []) -> [] {
  return (a - 1) * (a - 2) * (a - 3) * (a - 4) * (a - 5) * (a - 6)
}
diagram f(a: []) -> [] {
  return a * 2
}
lemma vanishes_to_6(A: [x]) : sum[x](A) = sum[x](A) + g(x)
lemma step_in_call(A: [x]) : sum[x](relu(f(x) - 3) + A) = sum[x](relu(x * 2 - 3) + A)
""")
    false, true = module.lemmas
    for lemma, side in ((false, "right"), (true, "left")):
        cert = certify.certify_lemma(lemma, "full")
        assert not cert.ok and cert.how == "invalid", cert
        assert f"the {side} side uses diagram" in (cert.counterexample or "")
    assert certify_reach.reach(false) >= 7  # the sweep must reach x = 7, where g(x) stops vanishing
    assert certify_reach.reach(true) >= 3  # relu(2x - 3) steps at x = 2


@pytest.mark.parametrize("text", [
    "lemma c(A: [x], A1: []) : sum[x](where[x](x == 1, A - A1, 0)) = sum[x](A) * 0",
    "lemma m(t: [], B: []) : max(t, B) = t",
])
def test_symbolic_tier_sees_every_parameter_apart(text: str) -> None:
    """Entry 1 of ``A`` is not the scalar ``A1``, and a scalar ``t`` is not the case split's
    own symbol: the symbolic tier itself refutes both (it passed them before)."""
    cert = certify.certify_lemma(loads("axis x\n" + text).lemmas[0])
    assert not cert.ok and cert.how == "sympy", cert


@pytest.mark.parametrize("scores", [("q", "x"), ("x", "q"), ("x",)])
def test_masked_rows_run_along_the_streamed_axis(scores: tuple[str, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    """Without its guard, online softmax gives NaN on a fully masked row (exp(-inf + inf)):
    the float64 tier masks a whole row along the streamed axis, whatever the operand's axes
    (it masked one position of every row of an [x q] operand, and nothing of an [x] one,
    which then certified)."""
    plan = accumulators.plan
    monkeypatch.setattr(accumulators, "plan", lambda box, axis, name=None, guard=True: plan(box, axis, name, False))
    box = typed_box("ncontract", (Var("X0", scores), Var("X1", ("x", "d"))), ("x",), params=("exp", "exp", "id"))
    cert = certify.certify_accumulator.__wrapped__(box, "x", "online_softmax", False, "full")
    assert not cert.ok and cert.how == "float64", cert


def test_a_right_side_undefined_where_the_left_is_defined_is_refused() -> None:
    """A reshape on the right side that the sizes need not honour (x = 3 split into 2 x 2)
    leaves the rewritten diagram undefined where the original is defined: a counterexample,
    not a size to skip (split_join, whose left side is the partial one, still certifies)."""
    text = ("axis x, y, z\nlemma s(X: [x], Y: [y z]) : sum[x](X) + sum[y z](Y) = "
            "sum[y z](split[x -> y z](X)) + sum[y z](Y)")
    cert = certify.certify_lemma(loads(text).lemmas[0])
    assert not cert.ok and "the left side is defined but the right side is not" in (cert.counterexample or ""), cert
    assert certify.certify_lemma(rules.library()["split_join"]).ok


def test_rows_summing_to_zero_are_an_edge_input() -> None:
    """A zero normaliser Σ S on a row that is not 0: the convention's 0 on the left, a guard
    on the row being 0 on the right; random and rational draws (almost) never sum to 0."""
    text = ("axis x\nlemma g(V: [x], S: [x]) : ncontract[x; id, id, id](S, V) = "
            "contract[x](S, V) / (sum[x](S) + 1 - sum[x](square(l2norm[x](S))))")
    cert = certify.certify_lemma(loads(text).lemmas[0])
    assert not cert.ok and "with `S` = rows summing to 0" in (cert.counterexample or ""), cert
    rows = certify.cases.zero_sum(np.arange(1.0, 16.0).reshape(3, 5))
    assert (rows.sum(axis=0) == 0).all() and (rows.sum(axis=1) == 0).all() and rows[:2, :4].all()


@pytest.mark.parametrize(("params", "edge", "scores", "values"), [
    (("id", "relu", "sqrt"), "all <= 0", [-1, -2, -0.5, -3], [1, 2, 3, 4]),
    (("exp", "relu", "rms"), "all <= 0", [-1, -2, -0.5, -3], [1, 2, 3, 4]),
    (("id", "id", "sqrt"), "in rows summing to 0", [1, -1], [1, 0])])
def test_accumulator_laws_see_zero_normalisers(params: tuple[str, str, str], edge: str, scores: list[float],
                                               values: list[float], monkeypatch: pytest.MonkeyPatch) -> None:
    """Where Σ a2(S) is 0 (every score ≤ 0 under relu, a row summing to 0) the box is 0 while
    o = Σ a1(S)·V need not be.  The normalised state's finaliser, guarded by the normaliser's
    sign, gives that 0 and is certified; the laws are checked on such rows, so the finaliser it
    replaced, o / max(b(z), TINY) (1e308 or -inf there), is refused."""
    box = typed_box("ncontract", (Var("X0", ("x",)), Var("X1", ("x",))), ("x",), params=params)
    assert certify.certify_accumulator(box, "x", "normalised", False).ok
    row = [Named(("x",), np.array(scores, float)), Named(("x",), np.array(values, float))]
    sizes = {"x": len(scores)}
    (want,) = evaluate_named(box_diagram(box), row, sizes)
    got = accumulators.stream_fold(accumulators.plan(box, "x", "normalised"), row, 2, sizes)
    assert float(want.data) == 0 and float(got.data) == 0

    def divide_by_tiny(self: accumulators._Builder, o: Box, denom: Box) -> Box:  # the guard before the sign's
        return typed_box("div", (o, typed_box("maximum", (denom, Const(accumulators.TINY))) if self.guard else denom))

    monkeypatch.setattr(accumulators._Builder, "quotient", divide_by_tiny)
    cert = certify.certify_accumulator.__wrapped__(box, "x", "normalised", False)  # uncached: the patched plan
    assert not cert.ok and "final(lift(x))" in (cert.counterexample or "") and edge in (cert.counterexample or ""), cert
