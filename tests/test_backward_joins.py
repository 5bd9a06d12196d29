"""User-written backwards of running sums, linear recurrences and FlashAttention-2's chained key
pass (issue 28's red team of ``lower --backward``): each wrong one is refused without
``--allow-tested-join`` (``lower.backward_unproved``) and with it (the float64 test,
``lower.backward_wrong``, or the prover's float64 hazard, ``certify.prove.FloatHazard``); the right
ones are proved, or lowered with the opt-in alone."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from napkin_cat.certify.accumulators import FLOAT_MAX
from napkin_cat.diagnostics import NapkinError
from napkin_cat.elaborate import loads
from napkin_cat.evaluate import evaluate
from napkin_cat.grad import vjp
from napkin_cat.lower.backward import LONG, _draws, _resolved, _tested, link
from napkin_cat.search.backward import passes, saving
from napkin_cat.terms import Box, Const, Diagram, Expr

ROOT = Path(__file__).resolve().parent.parent

# ---- the running sum: H = cumsum[t](X·W), its gradient r = Σ_{s >= t} dH[s] -----------------------

CUMSUM = "axis t, d\ndiagram f(X: [t d], W: [d]) -> [t] {\n  H = cumsum[t](contract[d](X, W))\n  return H\n}\n"
NESTED = ("axis t, d\ndiagram f(X: [t d], W: [d]) -> [t] {\n  H = cumsum[t](cumsum[t](contract[d](X, W)))\n"
          "  return H\n}\n")
CUMSUM_B = ("diagram b(X: [t d], W: [d], dH: [t]) -> [t d], [d] {{\n  r = {r}\n  dX = r * W\n"
            "  dW = contract[t](r, X)\n  return dX, dW\n}}\n")
REVERSE = "(sum[t]({g}) - cumsum[t]({g}) + {g})"


def _pair(text: str, forward: str = "f", backwards: tuple[str, ...] = ("b",)) -> tuple[Diagram, list[Diagram]]:
    module = loads(text)
    return module.diagram(forward), [module.diagram(b) for b in backwards]


def _refused_both_ways(forward: Diagram, backwards: list[Diagram], tested: tuple[str, ...]) -> str:
    """Refused unproved without the opt-in, and with it by one of ``tested``'s codes; the latter's text."""
    with pytest.raises(NapkinError) as err:
        link(forward, backwards)
    assert err.value.codes == ("lower.backward_unproved",), str(err.value)
    with pytest.raises(NapkinError) as err:
        link(forward, backwards, allow_tested=True)
    assert err.value.codes[0] in tested, str(err.value)
    return str(err.value)


@pytest.mark.parametrize("text", [CUMSUM + CUMSUM_B.format(r=REVERSE.format(g="dH")),
                                  NESTED + CUMSUM_B.format(r=REVERSE.format(g=REVERSE.format(g="dH")))],
                         ids=["once", "nested"])
def test_a_right_reverse_running_sum_is_proved(text: str) -> None:
    """Nested too: the prover's cumsum atoms rebind their index symbol; the long draws pass."""
    ln = link(*_pair(text))
    assert ln.proved and f"t={LONG}" in ln.trust, ln.trust


@pytest.mark.parametrize("text", [
    CUMSUM + CUMSUM_B.format(r="cumsum[t](dH)"),  # run forwards
    CUMSUM + CUMSUM_B.format(r="sum[t](dH) - cumsum[t](dH)"),  # missing its own position
    NESTED + CUMSUM_B.format(r="cumsum[t](cumsum[t](dH))"),
    NESTED + CUMSUM_B.format(r=REVERSE.format(g="cumsum[t](dH)")),  # one reversed, one forwards
    NESTED + CUMSUM_B.format(r=REVERSE.format(g="dH"))],  # one reversal for two sums
    ids=["forwards", "exclusive", "nested_forwards", "nested_mixed", "nested_once"])
def test_a_wrong_running_sum_is_refused_both_ways(text: str) -> None:
    assert "dX at" in _refused_both_ways(*_pair(text), ("lower.backward_wrong",))


def test_an_absorbed_running_sum_is_a_float_hazard_either_way() -> None:
    """1e20 absorbs the running sums whole (the gradient is dH alone in float64): the prover's absorption
    is a float64 hazard, which the opt-in does not overrule (it was refused as untestable before, the
    constant past what the test draws)."""
    forward, backwards = _pair(CUMSUM + CUMSUM_B.format(
        r="(sum[t](dH) + 100000000000000000000.0) - (cumsum[t](dH) + 100000000000000000000.0) + dH"))
    text = _refused_both_ways(forward, backwards, ("lower.backward_unproved",))
    assert "may round" in text and "absorption" in text, text


# ---- the linear recurrence: H = linrec[t](exp(A), X), outside the join prover (its VJP reshapes) --------

LINREC = "axis t\ndiagram f(A: [t], X: [t]) -> [t] {\n  H = linrec[t](exp(A), X)\n  return H\n}\n"
ZERO = "0 * rename[t -> s](index[t](t))"
#: Dm[t, s] = Π_{s < r <= t} exp(A[r]) for s <= t; λ = Σ_t Dm·dH, dA = λ·H[t-1]·exp(A), dX = λ
LINREC_B = ("axis s\ndiagram b(A: [t], H: [t], dH: [t]) -> [t], [t] {{\n"
            f"  Dm = linrec[t](exp(A), where[t s](t == s, 1, {ZERO}))\n"
            "  lam = {lam}\n"
            f"  prev = contract[s](where[t s](s + 1 == t, 1, {ZERO}), rename[t -> s](H))\n"
            "  dA = lam * prev * exp(A)\n  dX = lam\n  return dA, dX\n}}\n")
RIGHT_LAM = "rename[s -> t](contract[t](Dm, dH))"
#: λ = exp(-C)·Σ_{t >= s} dH·exp(C), C = cumsum A: right over the reals (the naive cumulative-product
#: form), exact to 4e-11 at t <= 20, and inf or NaN from t = 710 at A = -1 where the VJP is finite
CUMPROD = ("exp(0 - cumsum[t](A)) * (sum[t](dH * exp(cumsum[t](A))) - cumsum[t](dH * exp(cumsum[t](A))) "
           "+ dH * exp(cumsum[t](A)))")


def test_a_right_recurrence_is_lowered_on_the_test_alone() -> None:
    forward, backwards = _pair(LINREC + LINREC_B.format(lam=RIGHT_LAM))
    with pytest.raises(NapkinError) as err:
        link(forward, backwards)
    assert err.value.codes == ("lower.backward_unproved",) and "reshapes an axis" in str(err.value)
    ln = link(forward, backwards, allow_tested=True)
    assert not ln.proved and f"t={LONG} at scale 1 about -1" in ln.trust and "about +1" in ln.trust, ln.trust


@pytest.mark.parametrize(("text", "at"), [
    # with its own decay: Dm's diagonal exp(A) for 1
    (LINREC + LINREC_B.format(lam=RIGHT_LAM).replace("where[t s](t == s, 1,", "where[t s](t == s, exp(A),"), ""),
    (LINREC + LINREC_B.format(lam=RIGHT_LAM.replace("(Dm,", "(where[t s](t < s + 15, Dm, 0),")), ""),  # a window
    # 1 up to t = 14: the draws must pass 14.5, not only its integer part (they took t = 8 to 14)
    (LINREC + LINREC_B.format(lam=RIGHT_LAM + " * min(1, 14.5 / t)"), ""),
    (LINREC + LINREC_B.format(lam=CUMPROD), f"t={LONG}")],  # exact at small t: the long draw reaches exp(1024)
    ids=["own_decay", "window_15", "factor_14_5", "cumprod"])
def test_a_wrong_recurrence_is_refused_with_the_opt_in(text: str, at: str) -> None:
    refused = _refused_both_ways(*_pair(text), ("lower.backward_wrong",))
    assert at in refused, refused


# ---- FlashAttention-2's causal key pass, joined with the query pass: wrong D = Σ_d dO·O, wrong P --------

ATTENTION = (ROOT / "examples" / "attention_backward.ncd").read_text().replace(
    'use "attention.ncd"', f'use "{ROOT / "examples" / "attention.ncd"}"')
NAMES = ("causal_attention_forward", ("causal_attention_backward_kv", "causal_attention_backward_q"))


def _key_pass(old: str, new: str) -> tuple[Diagram, list[Diagram]]:
    head, sep, tail = ATTENTION.partition("diagram causal_attention_backward_kv(")
    body, sep2, rest = tail.partition("diagram causal_attention_backward_q(")
    assert old in body
    return _pair(head + sep + body.replace(old, new) + sep2 + rest, NAMES[0], NAMES[1])


D = "D = contract[d](dO, O)"


@pytest.mark.parametrize("new", [D, "D = sum[x](exp(S - L) * contract[d](dO, V))"])
def test_a_right_key_pass_is_proved(new: str) -> None:
    assert link(*_key_pass(D, new)).proved


@pytest.mark.parametrize(("new", "tested"), [
    ("D = 0 - contract[d](dO, O)", "lower.backward_wrong"),
    # unmasked: wrong, and its exp(S - L) at a masked key (S far above the row's L) overflows where the VJP is
    # finite, which the overflow check, run on a join the prover cannot prove too, refuses before the test
    ("D = sum[x](exp(contract[d](Q, K) * rsqrt(d) - L) * contract[d](dO, V))", "lower.backward_unproved"),
    ("D = where[q](q >= 1, contract[d](dO, O), 0)", "lower.backward_wrong"),
    # equal over the reals, and float64 hazards: the prover's reason stands with the opt-in
    ("D = contract[d](dO, O * exp(-800)) * exp(800)", "lower.backward_unproved"),  # underflows to 0 · inf
    ("D = contract[d](dO, O + exp(46.5)) - contract[d](dO, O * 0 + exp(46.5))", "lower.backward_unproved"),
    ("D = (contract[d](dO, O) + exp(46.5)) - exp(46.5)", "lower.backward_unproved")],
    ids=["sign", "unmasked", "half_rows", "underflow", "absorbed_in_O", "absorbed_in_sum"])
def test_a_wrong_key_pass_is_refused_both_ways(new: str, tested: str) -> None:
    _refused_both_ways(*_key_pass(D, new), (tested,))


def test_a_float64_hazard_the_prover_finds_is_refused_with_the_opt_in() -> None:
    """P = exp(S)·exp(0 - L) is the softmax over the reals, and exp(S) overflows from S = 710 where the
    VJP is finite (128 of 576 dK and dV entries non-finite at max S = 808, |dV| <= 4.66): the prover
    refuses it as a float64 hazard, and the float64 test's inputs (scale <= 16) keep S small, so the
    opt-in lowered it; the hazard is refused either way, with the prover's reason."""
    text = _refused_both_ways(*_key_pass("P = exp(S - L)", "P = exp(S) * exp(0 - L)"), ("lower.backward_unproved",))
    assert "may overflow in float64 where the VJP's is finite" in text, text


#: the causal pair under a document mask (segment ids, `eq`: outside the prover's fragment, so the
#: join is at best tested)
DOCUMENT = ATTENTION.replace("where[q x](q >= x, contract[d](Q, K) * rsqrt(d), -inf)",
                             "select(eq(Dq, Dx), contract[d](Q, K) * rsqrt(d), -inf)").replace(
    "V: [x d]", "V: [x d], Dq: int [q], Dx: int [x]")


@pytest.mark.parametrize("p", ["exp(S) * exp(0 - L)", "exp(S) / exp(L)"])
def test_an_overflow_is_refused_with_the_opt_in_where_the_prover_cannot_finish(p: str) -> None:
    """Document-masked FA-2 with P = exp(S)·exp(0 - L): the prover stops at `eq`, and before the overflow
    check ran only on a join proved equal, so the opt-in lowered it on the float64 test (scores at scale
    16 at most), though at a score of 800 on a kept pair it gives 128 of 256 dK and dV entries and 128 of
    192 dQ entries inf or NaN where the VJP is finite (|dV| <= 4.3).  The overflow check needs no
    equality proof: it runs on the join where each data mask keeps every entry, and refuses it either way."""
    assert DOCUMENT.count("select(eq(Dq, Dx)") == 5
    forward, backwards = _pair(DOCUMENT.replace("P = exp(S - L)", f"P = {p}"), NAMES[0], NAMES[1])
    text = _refused_both_ways(forward, backwards, ("lower.backward_unproved",))
    assert "may overflow in float64 where the VJP's is finite" in text and "`eq` is outside" in text, text


def test_a_document_masked_pass_that_is_nan_on_an_emptied_row_is_refused_with_the_opt_in() -> None:
    """exp(S - L) under the document mask is exp(-inf + inf) = NaN on a query whose document holds no
    key, where the VJP's gradient is 0: the float64 test drew ids keeping a key in every row, so the
    opt-in lowered it (every dV entry NaN in f32).  The test now also draws rows the data masks empty
    (``drawn_integers``' ``emptied``), and refuses it there."""
    forward, backwards = _pair(DOCUMENT, NAMES[0], NAMES[1])
    text = _refused_both_ways(forward, backwards, ("lower.backward_wrong",))
    assert "is nan from the backwards but 0 from the VJP, with sizes" in text, text
    assert "rows the data masks empty" in text, text


def test_a_guarded_document_masked_pass_rests_on_the_test() -> None:
    """exp(S - max(L, -FLOAT_MAX)) (``grad._weights``): L where L is finite, and 0 on an emptied row
    (exp(-inf)): the prover stops at `eq`, and the opt-in lowers it on the test, emptied rows included."""
    forward, backwards = _pair(DOCUMENT.replace("P = exp(S - L)", f"P = exp(S - max(L, {-FLOAT_MAX!r}))"),
                               NAMES[0], NAMES[1])
    with pytest.raises(NapkinError) as err:
        link(forward, backwards)
    assert err.value.codes == ("lower.backward_unproved",) and "`eq` is outside" in str(err.value), str(err.value)
    joined = link(forward, backwards, allow_tested=True)
    assert not joined.proved and "rows the data masks empty" in joined.trust, joined.trust


def test_a_guarded_causal_pass_is_proved() -> None:
    """The guard does not cost the causal pair its proof: L is a float64 input, -inf or at least
    -FLOAT_MAX, so max(L, -FLOAT_MAX) is L on every row the causal mask keeps a key in (all)."""
    assert link(*_key_pass("P = exp(S - L)", f"P = exp(S - max(L, {-FLOAT_MAX!r}))")).proved


@pytest.mark.parametrize("guarded", [True, False], ids=["guarded", "unguarded"])
def test_alibis_derived_backward_is_proved_with_or_without_the_guard(guarded: bool) -> None:
    """ALiBi's scores S - m·(q - x) absorb S where m·(q - x) is large, which the VJP's softmax cancels by its
    maximum and the backward by the saved L: excused where the two gradients normalise alike with the sum an
    opaque array. The derived backward guards L (max(L, -FLOAT_MAX)), which the VJP's softmax has no term
    for, so the guarded backward was refused as an absorption the VJP does not make; the guard, exact in
    float64, is read as L for that comparison (``prove._unguarded``)."""
    forward = saving(loads(ALIBI).diagram("alibi_attention"), "alibi_forward")
    backwards = passes(forward, "alibi_backward")
    if not guarded:
        backwards = tuple(replace(b, body=tuple(replace(let, expr=_strip(let.expr)) for let in b.body))
                          for b in backwards)
    assert any("maximum" in repr(let.expr) for b in backwards for let in b.body) == guarded
    assert link(forward.diagram, backwards).proved


def _strip(expr: Expr) -> Expr:
    """``expr`` with each guarded shift max(L, -FLOAT_MAX) written L."""
    if not isinstance(expr, Box):
        return expr
    if expr.op == "maximum" and expr.args[1] == Const(-FLOAT_MAX):
        return _strip(expr.args[0])
    return replace(expr, args=tuple(_strip(a) for a in expr.args))


#: ALiBi-style causal attention (examples/attention.ncd's)
ALIBI = """axis q
axis x
axis d = 64
diagram alibi_attention(Q: [q d], K: [x d], V: [x d], m: []) -> [q d] {
  S = contract[d](Q, K) * rsqrt(d) - m * index[q x](q - x)
  M = where[q x](q >= x, S, -inf)
  return contract[x](softmax[x](M), V)
}
"""


def test_a_join_the_prover_cannot_finish_still_rests_on_the_test() -> None:
    """min(P, 1) is P (a weight is at most 1): the prover does not see it, so only the opt-in lowers it."""
    forward, backwards = _key_pass("P = exp(S - L)", "P = min(exp(S - L), 1)")
    with pytest.raises(NapkinError) as err:
        link(forward, backwards)
    assert err.value.codes == ("lower.backward_unproved",)
    assert "--allow-tested-join" in (err.value.diagnostics[0].hint or "")
    assert not link(forward, backwards, allow_tested=True).proved


# ---- Mamba-2's quadratic (segsum) form: s a renamed copy of t, drawn at t's size ---------------------

SEGSUM = """axis t, s
diagram f(A: [t], X: [t]) -> [t] {
  C = cumsum[t](A)
  M = where[t s](s <= t, exp(C - rename[t -> s](C)), 0)
  Y = contract[s](M, rename[t -> s](X))
  return Y
}
diagram b(A: [t], X: [t], Y: [t], dY: [t]) -> [t], [t] {
  C = cumsum[t](A)
  DX
  dC = dY * Y - X * dX
  dA = sum[t](dC) - cumsum[t](dC) + dC
  return dA, dX
}
"""


def test_a_segsum_forward_is_tested_with_its_copy_of_time_at_times_size() -> None:
    """The test drew s apart from t, and `rename[t -> s]` failed to evaluate: every such join was
    refused, right or wrong; a rename ties the two axes' sizes."""
    right = SEGSUM.replace("DX", "M = where[t s](s <= t, exp(C - rename[t -> s](C)), 0)\n"
                                 "  dX = rename[s -> t](contract[t](M, dY))")
    ln = link(*_pair(right), allow_tested=True)
    assert not ln.proved and f"t={LONG}, s={LONG} at scale 1 about -1" in ln.trust, ln.trust
    # dX[s] = exp(-C[s])·Σ_{t >= s} exp(C[t])·dY[t]: right over the reals, inf from t = 710 at A about -1
    cumprod = SEGSUM.replace("DX", "E = dY * exp(C)\n  dX = exp(0 - C) * (sum[t](E) - cumsum[t](E) + E)")
    refused = _refused_both_ways(*_pair(cumprod), ("lower.backward_wrong",))
    assert f"t={LONG}" in refused and "dX at" in refused, refused


# ---- causal linear attention: the backward makes the running sum's absorption as the VJP does ----------

LINEAR = """axis t
axis d, e
diagram f(Q: [t d], K: [t d], V: [t e]) -> [t e] {
  H = cumsum[t](K * V)
  Y = contract[d](Q, H)
  return Y
}
diagram b(Q: [t d], K: [t d], V: [t e], dY: [t e]) -> [t d], [t d], [t e] {
  H = cumsum[t](K * V)
  dQ = contract[e](dY, H)
  G = Q * dY
  R = REVERSE
  dK = contract[e](R, V)
  dV = contract[d](R, K)
  return dQ, dK, dV
}
"""


def test_a_right_linear_attention_backward_is_proved() -> None:
    """Its reverse running sum Σ_t G - cumsum[t](G) + G of G = Q * dY may absorb as float64 rounds it; the
    VJP makes the same sum on contract[](dY, Q), the same product written otherwise, and the prover refused
    it as an absorption the VJP does not make (a float64 hazard, refused with the opt-in too)."""
    ln = link(*_pair(LINEAR.replace("REVERSE", "sum[t](G) - cumsum[t](G) + G")))
    assert ln.proved, ln.trust
    wrong = _pair(LINEAR.replace("REVERSE", "sum[t](G) - cumsum[t](G)"))  # missing its own position
    assert "dK at" in _refused_both_ways(*wrong, ("lower.backward_wrong",))


# ---- joins the prover cannot finish (gelu), wrong in float64 only at a reduction's length or by a sum ----------

#: the forward's gelu keeps the join outside the prover's fragment (only the overflow check runs there); dA is
#: the VJP's own gelu slope, dX the term each case writes
GELU = """axis t
diagram f(A: [t], X: [t]) -> [] {
  y = sum[t](exp(X)) + sum[t](gelu(A))
  return y
}
diagram b(A: [t], X: [t], dy: []) -> [t], [t] {
  dX = DX
  e = 1 - square(sign(A))
  dA = dy * ((gelu(A) + 0.5 * e) / (A + e) + 0.3989422804014327 * A * exp(-0.5 * square(A)))
  return dA, dX
}
"""


def test_a_right_gelu_join_is_drawn_long_along_its_reduced_axis() -> None:
    ln = link(*_pair(GELU.replace("DX", "dy * exp(X)")), allow_tested=True)
    assert not ln.proved and f"t={LONG} at scale 1 about -1" in ln.trust and "about +1" in ln.trust, ln.trust


@pytest.mark.parametrize("dx", ["dy * exp(X + sum[t](A)) * exp(0 - sum[t](A))",
                                "dy * exp(X) * prod[t](exp(A)) / prod[t](exp(A))"], ids=["exp_of_sum", "product"])
def test_an_overflow_with_a_reductions_length_is_refused_with_the_opt_in(dx: str) -> None:
    """dy·exp(X) over the reals, exact at t <= 20, and NaN at every position at t = 1024 about ±1 (exp(±1024)
    overflows, its inverse underflows) where the VJP is finite (|dX| <= 33.7): the VJP (exp(X)) is not vouched
    finite, so the overflow check passes it, and the long draws ran only along a scan's axis, so the opt-in
    lowered it; they run along every symbolic axis the forward reduces too.  (exp(X + Σ_t A) also absorbs X,
    which the prover's absorption check now finds on dX alone, gelu an unknown function: the test, alone, too.)"""
    refused = _refused_both_ways(*_pair(GELU.replace("DX", dx)), ("lower.backward_wrong", "lower.backward_unproved"))
    assert "dX at" in refused or "gradient of X computes" in refused, refused
    refused = _float64_test_alone(GELU.replace("DX", dx), GELU.replace("DX", "dy * exp(X)"))
    assert f"t={LONG}" in refused and "dX at" in refused, refused


def test_a_sum_absorbing_a_gradients_small_entries_is_refused_with_the_opt_in() -> None:
    """(g·exp(X) + Σ_t exp(X)) - Σ_t exp(X): at scale 16, 0 where the VJP is 1.8e-12 (3 of 13 entries wrong
    whole), beside an entry of 4.1e9; the backwards' rounding was capped at 1e-3 of the gradient's largest
    entry (4e6), so the test let it through; capped per position, it is refused (now at the draw whose cotangents
    are at 2^-60 already, where the sum drops dy·exp(X) whole: that refusal rests on the per-position cap too)."""
    dx = "(dy * exp(X) + sum[t](exp(X))) - sum[t](exp(X))"
    refused = _refused_both_ways(*_pair(GELU.replace("DX", dx)), ("lower.backward_unproved",))
    assert "unknown function, the gradients of X are the VJP's" in refused, refused  # dX alone normalises
    refused = _float64_test_alone(GELU.replace("DX", dx), GELU.replace("DX", "dy * exp(X)"))
    assert "at scale 1, cotangents at 2^-60" in refused and "dX at" in refused, refused


def _float64_test_alone(text: str, right: str) -> str:
    """The float64 test's refusal of the join ``text`` (``lower.backward._tested``), the prover skipped: a
    refusal of the prover's would hide whether the test catches it.  ``right`` gives the link (its sources and
    targets, ``text``'s too) and is lowered with the opt-in."""
    forward, backwards = _pair(text)
    ln = link(*_pair(right), allow_tested=True)
    with pytest.raises(NapkinError) as err:
        _tested(forward, vjp(forward), backwards, ln)
    assert err.value.codes == ("lower.backward_wrong",), str(err.value)
    return str(err.value)


#: the forward's y = Σ_t X·W beside the gelu: dX = dy·W, which each case writes otherwise
GELU_W = GELU.replace("A: [t], X: [t]) -> []", "A: [t], X: [t], W: [t]) -> []").replace(
    "sum[t](exp(X))", "sum[t](X * W)").replace(
    "A: [t], X: [t], dy: []) -> [t], [t]", "A: [t], X: [t], W: [t], dy: []) -> [t], [t], [t]").replace(
    "  return dA, dX", "  dW = dy * X\n  return dA, dX, dW")


def test_a_term_free_of_the_cotangent_absorbing_the_gradient_is_refused_with_the_opt_in() -> None:
    """dA = (1000 + dy·slope(A)) - 1000 is the VJP's over the reals, off by 6e-14 of itself at dy·slope about 1
    (within the per-position cap), and 0 where |dy·slope| is below 5.7e-14 (a float32 kernel: below 3e-5); the
    prover cannot normalise dA (gelu's guarded division), so no absorption check runs, the draws never made dA
    that small, and the opt-in lowered it.  The VJP is linear in the cotangents, so the first draw past the
    constants takes them at 2^-60 (``QUIET``); the right one, with its sign(A) slope, is lowered still."""
    right = GELU_W.replace("DX", "dy * W")
    ln = link(*_pair(right), allow_tested=True)
    assert not ln.proved and "cotangents at 2^-60" in ln.trust, ln.trust
    wrong = right.replace("  dA = dy * (", "  dA = 1000 + dy * (").replace("* square(A)))\n", "* square(A))) - 1000\n")
    assert wrong.count("1000") == 2
    refused = _refused_both_ways(*_pair(wrong), ("lower.backward_wrong",))
    assert "dA at" in refused and "cotangents at 2^-60" in refused, refused


@pytest.mark.parametrize("dx", ["(dy * W + 1000) - 1000", "dy * (W + 1000) - dy * 1000",
                                "(dy * W + sum[t](square(A))) - sum[t](square(A))"],
                         ids=["constant", "scaled_with_the_cotangent", "sum_of_inputs"])
def test_an_absorption_in_a_gradient_the_prover_normalises_beside_a_gelu_is_refused_with_the_opt_in(dx: str) -> None:
    """Beside the gelu the prover stops, and its absorption check ran only where it proved the whole join; dX
    normalises to the VJP's with gelu an unknown function of its operand (``prove._equal_gradients``), so the
    checks that read the two sides as equal run on it alone.  dy·(W + 1000) - dy·1000 scales with the cotangent,
    so the draw at cotangents of 2^-60 does not catch it; the float64 test passed it."""
    refused = _refused_both_ways(*_pair(GELU_W.replace("DX", dx)), ("lower.backward_unproved",))
    assert ("unknown function, the gradients of X, W are the VJP's" in refused and "absorption" in refused) or (
        "sum" in dx and "unknown function, `sub` of terms reading inputs" in refused), refused  # A cancels: cancelled
    assert "`gelu` is outside the proved fragment" in refused, refused


def test_an_underflowed_sign_in_a_gradient_the_prover_normalises_beside_a_gelu_is_refused_with_the_opt_in() -> None:
    """dy·W·sign(exp(X·10⁻⁴ - 744)) is dy·W over the reals and 0 where X < -4000 (exp underflows): the sign check
    needs the sides proved equal, which beside the gelu the prover did not, and the opt-in lowered it; dX alone
    normalises to the VJP's with gelu an unknown function (``prove._equal_gradients``)."""
    refused = _refused_both_ways(*_pair(GELU_W.replace("DX", "dy * W * sign(exp(X * 0.0001 - 744))")),
                                 ("lower.backward_unproved",))
    assert "the gradients of X, W are the VJP's" in refused and "takes the sign of a term" in refused, refused


@pytest.mark.parametrize("new", ["D = (contract[d](dO, O) + exp(10)) - exp(10)",
                                 "D = contract[d](dO, O + exp(10)) - contract[d](dO, O * 0 + exp(10))"],
                         ids=["absorbed_in_sum", "absorbed_in_O"])
def test_an_absorption_is_refused_with_the_opt_in_where_the_prover_cannot_finish(new: str) -> None:
    """Document-masked FA-2 with D absorbed by exp(10) ≈ 22026 then cancelled: the causal pair's prover refuses it
    as a float64 hazard, but the prover stops at `eq` before the hazard checks, and the float64 test's rounding
    bound covers it (off by 3.6e-13 at scale 1; at dO of 1e-9 dK is off by 1.5e-4 of itself in float64, and a
    float32 kernel drops D whole), so the opt-in lowered it.  Where each data mask keeps every entry, the join
    is the unmasked one, which the prover proves: the hazard checks run there."""
    forward, backwards = _pair(DOCUMENT.replace(D, new), NAMES[0], NAMES[1])
    text = _refused_both_ways(forward, backwards, ("lower.backward_unproved",))
    assert "where each data mask keeps every entry" in text and "absorption" in text and "`eq` is outside" in text, text


#: the causal pair under a document mask too: a query keeps a key only where its document has one at or before it
#: (weights guarded, exp(S - max(L, -FLOAT_MAX)): unguarded, an emptied row is NaN, which the emptied draws refuse)
CAUSAL_DOCUMENT = ATTENTION.replace("where[q x](q >= x, contract[d](Q, K) * rsqrt(d), -inf)",
                                    "select(eq(Dq, Dx), where[q x](q >= x, contract[d](Q, K) * rsqrt(d), -inf), -inf)"
                                    ).replace("V: [x d]", "V: [x d], Dq: int [q], Dx: int [x]"
                                              ).replace("P = exp(S - L)", f"P = exp(S - max(L, {-FLOAT_MAX!r}))")


def test_a_causal_document_key_pass_is_drawn_long_where_each_row_keeps_its_keys() -> None:
    """The guarded causal-document pair is drawn long (x = 1024 beside q of 1 to 3, its ids all 1, where each
    data mask keeps every entry: the long draws look for an overflow with length, the emptied draws for
    emptied rows) and lowered with the opt-in."""
    assert CAUSAL_DOCUMENT.count("select(eq(Dq, Dx), where") == 5 and CAUSAL_DOCUMENT.count("max(L, ") >= 1
    ln = link(*_pair(CAUSAL_DOCUMENT, NAMES[0], NAMES[1]), allow_tested=True)
    assert not ln.proved and f"x={LONG} at scale 1 about -1" in ln.trust, ln.trust


# ---- a factor that is 1 up to a constant written as a term: the draws pass its value ----------------------

SQUARE = ("axis t\naxis d = 64\ndiagram f(X: [t]) -> [t] {{\n  Y = X * X\n  return Y\n}}\n"
          "diagram b(X: [t], dY: [t]) -> [t] {{\n  c = exp(3)\n  dX = 2 * X * dY * {factor}\n  return dX\n}}\n")


@pytest.mark.parametrize("factor", ["min(1, d / t)", "min(1, exp(3) / t)", "min(1, (4 * 4) / t)", "min(1, c * 2 / t)"],
                         ids=["declared_size", "exp_of_a_literal", "product_of_literals", "binding_read_through"])
def test_a_factor_past_a_constant_term_is_refused_with_the_opt_in(factor: str) -> None:
    """1 up to t = 64, 20.1, 16, 40.2: the draws took t = 8 to 14 (past the literals 4, 3 and SMALL, not past the
    terms' values) and lowered a gradient 0.64 of the VJP's at t = 100; they now pass each constant term's value."""
    refused = _refused_both_ways(*_pair(SQUARE.format(factor=factor)), ("lower.backward_wrong",))
    assert "dX at" in refused, refused


def test_a_window_written_as_index_arithmetic_counts_its_width() -> None:
    """``t < s + 4 * 4`` is a window of width 16, not 4: the draws pass the arithmetic's value."""
    from napkin_cat.lower.backward import _index_integers
    from napkin_cat.terms import Cmp, IBin, Idx, IInt

    window = Cmp("<", Idx("t"), IBin("+", Idx("s"), IBin("*", IInt(4), IInt(4))))
    assert max(_index_integers(window)) == 16


# ---- ids past the constants: a backward merging documents 3 and 4 ------------------------------------------------


@pytest.mark.parametrize("bound", [2, 30])
def test_a_backward_merging_documents_past_a_constant_is_refused_with_the_opt_in(bound: int) -> None:
    """``eq(min(Dq, c), min(Dx, c))`` is ``eq(Dq, Dx)`` on ids up to c: the draws took ids 1 and 2 (and -k) only, and
    the opt-in lowered it for c = 2 (documents 3 and 4 merged: a dV of -0.91 where the VJP's is 0.563); the draws past
    the constants now take ids past them too (``drawn_integers``' ``beyond``)."""
    head, sep, tail = DOCUMENT.replace("P = exp(S - L)", f"P = exp(S - max(L, {-FLOAT_MAX!r}))").partition(
        "diagram causal_attention_backward_kv(")
    text = head + sep + tail.replace("eq(Dq, Dx)", f"eq(min(Dq, {bound}), min(Dx, {bound}))")
    assert tail.count("eq(Dq, Dx)") == 4
    _refused_both_ways(*_pair(text, NAMES[0], NAMES[1]), ("lower.backward_wrong",))


# ---- a relation the forward computes otherwise in float64 ------------------------------------------------------


@pytest.mark.parametrize("weights", ["P = exp(S - L)", f"P = exp(S - max(L, {-FLOAT_MAX!r}))"],
                         ids=["plain", "guarded"])
def test_a_saved_statistic_float64_computes_otherwise_is_refused_either_way(weights: str) -> None:
    """A forward saving L = log(Σ_x exp(S)) meets the backwards' `given L = logsumexp[x](S)` over the reals, and the
    join was proved; in float64 L is +inf at scores of 800 (every dQ, dK, dV 0, the VJP's dV -0.749) and -inf at -800.
    A relation's forward term must compute what the extended reals do (``finiteness.overflow_box``, zeros too)."""
    text = ATTENTION.replace("  L = logsumexp[x](S)\n  return O, L", "  L = log(sum[x](exp(S)))\n  return O, L")
    assert "log(sum[x](exp(S)))" in text
    refused = _refused_both_ways(*_pair(text.replace("P = exp(S - L)", weights), NAMES[0], NAMES[1]),
                                 ("lower.backward_unproved",))
    assert "states `L` by a relation" in refused, refused


def test_a_factor_past_a_reduced_declared_size_is_refused_with_the_opt_in() -> None:
    """``sum[d](W * 0 + 1)`` is d = 64 read through a reduction of an input: drawn at t of 6 to 13 the factor is 1,
    and a gradient 0.64 of the VJP's at t = 100 (dX 1.28 where the VJP's is 2) is lowered with the opt-in.  Counting
    every reduced declared size as a constant drew attention's every axis past 64 (65⁵ entries, out of memory)."""
    text = ("axis t\naxis d = 64\ndiagram f(X: [t], W: [d]) -> [t] {\n  Y = X * X + sum[d](W)\n  return Y\n}\n"
            "diagram b(X: [t], W: [d], dY: [t]) -> [t], [d] {\n  dX = 2 * X * dY * min(1, sum[d](W * 0 + 1) / t)\n"
            "  dW = sum[t](dY) + W * 0\n  return dX, dW\n}\n")
    refused = _refused_both_ways(*_pair(text), ("lower.backward_wrong",))
    assert "dX at" in refused, refused


#: Y = X² + Σ_d V + Σ_e U with d = e = 64, and a backward whose dX is the VJP's times a factor of the sizes (t and s
#: only the backward reduces: drawn long, 1024, short of d·e)
PRODUCT = ("axis t, s\naxis d = 64, e = 64\n"
           "diagram f(X: [t s], V: [d], U: [e]) -> [t s] {{\n  Y = X * X + sum[d](V) + sum[e](U)\n  return Y\n}}\n"
           "diagram b(X: [t s], V: [d], U: [e], dY: [t s]) -> [t s], [d], [e] {{\n"
           "  dX = 2 * X * dY * {factor}\n  dV = sum[t s](dY) + V * 0\n  dU = sum[t s](dY) + U * 0\n"
           "  return dX, dV, dU\n}}\n")


@pytest.mark.parametrize("factor", ["min(1, sum[d e](V * U * 0 + 1) / t)",
                                    "min(1, sum[d](V * 0 + 1) * sum[e](U * 0 + 1) / t)"], ids=["one_box", "two_boxes"])
def test_a_factor_past_a_product_of_reduced_declared_sizes_is_refused_with_the_opt_in(factor: str) -> None:
    """d·e = 4096 read through reductions of inputs: the draws past a reduced declared size took t past the larger
    of d and e alone (t of 65 to 71, the factor 1), and the opt-in lowered a dX 4096/t of the VJP's past t = 4096; the
    draws now pass each box's product of the declared sizes it reduces, and the product of all of them."""
    refused = _refused_both_ways(*_pair(PRODUCT.format(factor=factor)), ("lower.backward_wrong",))
    assert "dX at" in refused and re.search(r"with sizes t=(\d+)", refused), refused
    assert int(re.search(r"with sizes t=(\d+)", refused).group(1)) > 4096, refused  # type: ignore[union-attr]


@pytest.mark.parametrize("diagram", ["mha", "gqa"])
def test_attentions_draws_past_its_reduced_head_size_stay_small(diagram: str) -> None:
    """Attention contracts over d = 64: each symbolic axis is drawn past 64 in some draw (as the factor above needs),
    one at a time beside the others at 1 to 3 (past 64 + 3, so that its difference with each other axis is past 64),
    so that no draw's sizes multiply past 2^24 entries (an array over every axis, d included).  Drawing every axis
    past 64 at once (each of b, h, (g,) q, x at 65 to 71, beside d) put the draws past 65⁵ entries, and the slow
    derived sweep's worker past the machine's 23 GB."""
    forward = saving(loads((ROOT / "examples" / "attention.ncd").read_text()).diagram(diagram), "forward")
    backwards = list(passes(forward, "backward"))
    axes, past, plans, left = _draws(forward.diagram, vjp(forward.diagram), backwards,
                                     _resolved(forward.diagram, backwards))
    symbolic = [a for a, n in axes.items() if n is None]
    assert axes["d"] == 64 and past < 64 and len(symbolic) >= 4 and not left, (axes, past, left)
    assert all(any(p.sizes[a] > 64 and not p.drift for p in plans) for a in symbolic), [p.sizes for p in plans]
    assert max(math.prod(p.sizes.values()) for p in plans) <= 2 ** 24, [p.sizes for p in plans]
    for p in (p for p in plans if p.beyond == 64):  # past 64 by more than the others: min(1, d / (q - x)) < 1 too
        one = max(symbolic, key=p.sizes.__getitem__)  # (q of 65 to 71 beside x of 1 to 3 missed it: q - x = 63)
        assert all(p.sizes[one] - p.sizes[a] > 64 for a in symbolic if a != one), p.sizes



def test_a_draw_past_a_reduced_count_too_large_to_evaluate_falls_back_or_is_left_out_and_said() -> None:
    """The mixture of experts reduces over f = 128 beside e = 64 and d = 64: t drawn past 128 holds 7e7 points in
    one box, past what an evaluation may hold, so the derived backward's test failed as "evaluating them failed"
    (the slow derived sweep's fused_moe and grouped_experts); then that draw was left out.  It now takes t past the
    largest count of the reduced declared sizes it can hold (d or e, 64; not f, e·f = 8192 or d·e·f·k), and says
    so in its sizes.  The long draws along t, which only the backwards reduce (the experts' weights' gradients),
    hold 5.4e8 points at t = 1024: they are left out, and the test's description says so (an unproved join whose
    forward reduced t there would be untestable)."""
    forward = saving(loads((ROOT / "examples" / "moe.ncd").read_text()).diagram("moe"), "forward")
    backwards = list(passes(forward, "backward"))
    axes, _past, plans, left = _draws(forward.diagram, vjp(forward.diagram), backwards,
                                      _resolved(forward.diagram, backwards))
    assert axes["f"] == 128 and [a for a, n in axes.items() if n is None] == ["t"], axes
    past_64 = [p.sizes["t"] for p in plans if p.beyond == 64]
    assert len(past_64) == 1 and 64 + 3 < past_64[0] <= 128 and all(p.sizes["t"] <= 128 for p in plans), plans
    assert len(left) == 2 and all("left out: too large to evaluate" in why for why in left), left
    assert all(why.startswith(f"the draw at t={LONG} at scale 1 about") for why in left), left


def test_a_draw_too_large_to_evaluate_refuses_the_join_as_untestable() -> None:
    """Past the constant 70 the draws put t at 71 to 77 beside d = e = 1024: Σ_{d,e} X·W holds 7e7 points, past
    what an evaluation may hold.  The factor min(1, 70 / t) is 1 at the draw below it, so nothing there is wrong:
    the join cannot be tested, and is refused saying so (it read "the backward passes do not give the VJP")."""
    text = ("axis t\naxis d = 1024\naxis e = 1024\ndiagram f(X: [t], W: [d e]) -> [t] {\n"
            "  Y = sum[d e](X * W)\n  return Y\n}\n"
            "diagram b(X: [t], W: [d e], dY: [t]) -> [t], [d e] {\n  dX = dY * sum[d e](W) * min(1, 70 / t)\n"
            "  dW = sum[t](dY * X) + W * 0\n  return dX, dW\n}\n")
    refused = _refused_both_ways(*_pair(text), ("lower.backward_untestable",))
    assert "is too large to evaluate" in refused and "t=7" in refused, refused



def test_a_proved_join_leaves_out_a_draw_too_large_to_evaluate_and_says_so() -> None:
    """The same sizes with the factor written 70 / 70: the join is proved, so it rests on its proof; the draws past
    the constant 70 cannot be evaluated and are left out, named in its trust, not refused."""
    text = ("axis t\naxis d = 1024\naxis e = 1024\ndiagram f(X: [t], W: [d e]) -> [t] {\n"
            "  Y = sum[d e](X * W)\n  return Y\n}\n"
            "diagram b(X: [t], W: [d e], dY: [t]) -> [t], [d e] {\n  dX = dY * sum[d e](W) * (70 / 70)\n"
            "  dW = sum[t](dY * X) + W * 0\n  return dX, dW\n}\n")
    ln = link(*_pair(text))
    assert ln.proved and "left out: too large to evaluate" in ln.trust, ln.trust


# ---- an order mask of ids: the emptied draws put each input's ids below and above the others' ----------------------


@pytest.mark.parametrize("mask", ["le(Dx, Dq)", "le(Dq, Dx)"])
def test_an_unguarded_pass_under_an_order_mask_of_ids_is_refused_with_the_opt_in(mask: str) -> None:
    """Under ``le(Dx, Dq)`` (a key's document at or before the query's) a query below every key has no key, where
    exp(S - L) is NaN and the VJP 0: the emptied draws gave the keys' ids the smallest value (-1 beside the queries'
    0) and the largest was 2 for both, so no row was empty and the opt-in lowered it; the second emptied draw
    numbers the inputs the other way, and the last position of each is above the others' (``drawn_integers``)."""
    text = DOCUMENT.replace("eq(Dq, Dx)", mask)
    assert text.count(mask) == 5
    refused = _refused_both_ways(*_pair(text, NAMES[0], NAMES[1]), ("lower.backward_wrong",))
    assert "is nan from the backwards but 0 from the VJP" in refused, refused
    guarded = text.replace("P = exp(S - L)", f"P = exp(S - max(L, {-FLOAT_MAX!r}))")
    assert not link(*_pair(guarded, NAMES[0], NAMES[1]), allow_tested=True).proved


# ---- a scalar broadcast along a summed axis: d/dc Σ_x (B + c) = |x|·dy --------------------------------------

SHIFTED = ("axis x\ndiagram f(B: [x], c: []) -> [] {{\n  y = sum[x](B + c)\n  return y\n}}\n"
           "diagram b(B: [x], c: [], dy: []) -> [x], [] {{\n  dB = B * 0.0 + dy\n  dc = {dc}\n  return dB, dc\n}}\n")


def test_a_scalar_broadcast_along_a_summed_axis_gets_the_axis_size() -> None:
    """napkin's VJP gave dc = dy (the sum's cotangent lacks x, and so does c, so it was not summed over x):
    a backward giving dc = dy was proved equal to it and lowered without the opt-in (jax.grad 1 where it
    is |x| = 5); now that one is refused and dc = dy·|x| is proved."""
    assert link(*_pair(SHIFTED.format(dc="dy * x"))).proved
    with pytest.raises(NapkinError) as err:
        link(*_pair(SHIFTED.format(dc="dy")))
    assert err.value.codes == ("lower.backward_unproved",) and "gradients of c" in str(err.value), str(err.value)


def test_a_right_join_with_subnormal_gradients_at_quiet_cotangents_is_lowered_with_the_opt_in() -> None:
    """Red team rtmerge2: dX = dy·exp(X - 700)·(X + 1), the VJP's own formula beside a gelu, was refused
    with the opt-in at the draw whose cotangents are at 2^-60: its gradients there are subnormal
    (1e-304·1e-18), one ulp (4.9e-324) apart from the VJP's, where the running bound, relative to |v| alone,
    was 0.  The bound now carries the standard model's underflow term (``roundoff.ETA``)."""
    text = GELU.replace("sum[t](exp(X))", "sum[t](exp(X - 700) * X)")
    for dx in ("dy * exp(X - 700) * (X + 1)", "exp(X - 700) * (dy * X + dy)"):
        ln = link(*_pair(text.replace("DX", dx)), allow_tested=True)
        assert not ln.proved and "cotangents at 2^-60" in ln.trust, ln.trust
    # a wrong one at that scale is still refused: X + 1 read as X + 2, or the gradient absorbed whole
    for dx in ("dy * exp(X - 700) * (X + 2)", "(dy * exp(X - 700) * (X + 1) + 1) - 1"):
        _refused_both_ways(*_pair(text.replace("DX", dx)), ("lower.backward_wrong", "lower.backward_unproved"))


def test_a_proved_join_past_the_largest_reduced_declared_size_is_lowered() -> None:
    """Red team rtmerge2: the draws past a reduced declared size refused every join with one past 4096 as
    untestable, a proved one too (the reverse running sum at a declared d = 5000, lowered before them); a
    proved join rests on its proof, and only the tested one is refused."""
    text = (CUMSUM + CUMSUM_B.format(r=REVERSE.format(g="dH"))).replace("axis t, d", "axis t, d = 5000")
    ln = link(*_pair(text))
    assert ln.proved and "d=5000" not in ln.trust, ln.trust
    with pytest.raises(NapkinError) as err:  # the same join, unproved (gelu beside it), stays untestable
        link(*_pair(GELU.replace("axis t", "axis t, d = 5000").replace("X: [t]", "X: [d]").replace(
            "sum[t](exp(X))", "sum[d](X)").replace("-> [t], [t]", "-> [t], [d]").replace("DX", "dy + X * 0")),
             allow_tested=True)
    assert err.value.codes == ("lower.backward_untestable",), str(err.value)


# ---- a cancellation to a real 0, which float64 computes as a rounding residue ------------------------------------

RESIDUE = ("axis x\ndiagram f(X: [x], c: []) -> [] {{\n  Y = sum[x](X) * c\n  return Y\n}}\n"
           "diagram b(X: [x], c: [], dY: []) -> [x], [] {{\n  r = sum[x](X * 3) - sum[x](X) * 3\n"
           "  dX = dY * c * {factor} + X * 0\n  dc = dY * sum[x](X)\n  return dX, dc\n}}\n")


@pytest.mark.parametrize("factor", ["(0 - tanh(log(square(r))))", "exp(tanh(r))", "(1 - square(sign(r)))",
                                    "(1 + sqrt(r))", "(1 - square(sign(sum[x](log(exp(X) * exp(0 - X))))))"],
                         ids=["log", "tanh", "sign", "sqrt", "sign_of_a_product_identity"])
def test_a_rounding_residue_read_as_an_exact_zero_is_a_float_hazard_either_way(factor: str) -> None:
    """Red team rt3: r = Σ 3·X - 3·Σ X is 0 over the reals, so the prover read log(r²) as -inf, tanh of it -1,
    and dX = dY·c·(0 - tanh(log(r²))) as the VJP's dY·c; exp(tanh(r)) as 1 likewise: both joins were proved
    and lowered without the opt-in (the float64 test draws r ~ 1e-15, where they are -1 and 1 too).  float64
    computes r as its operands' rounding errors' difference: at X = [3, 8, 3.3, -13]·1e29 it is 2.8e14, where
    dX is -1 and e where the VJP's is 1.  sign(r) was proved too (refused only by the test, whose draws happened
    to round r off 0); sqrt(r), NaN at a negative residue, was refused by the finiteness analysis.  A
    cancellation to 0 of terms float64 computes otherwise (``certify.prove._Semantics.cancelled``), and a term 0
    over the reals read where 0 is a jump (``_Semantics.zero_read``: log(exp(X)·exp(-X)) is ±1e-16 in float64)
    are now float64 hazards, refused with the opt-in too."""
    text = RESIDUE.format(factor=factor)
    forward, backwards = _pair(text)
    if factor in ("(0 - tanh(log(square(r))))", "exp(tanh(r))"):  # what the prover accepted is wrong in the domain
        x = np.array([3e29, 8e29, 3.3e29, -1.3e30])
        want = evaluate(vjp(forward), [x, np.array(1.0), np.array(1.0)])[0]
        got = evaluate(backwards[0], [x, np.array(1.0), np.array(1.0)])[0]
        assert np.all(want == 1.0) and np.all(np.abs(got - want) > 1.0), (want, got)
    assert "over the reals" in _refused_both_ways(forward, backwards, ("lower.backward_unproved",))


def test_a_saved_output_cancelling_to_zero_is_a_float_hazard_either_way() -> None:
    """Red team rt3: the forward saves O = Σ 3·X - 3·Σ X, 0 over the reals, which a backward reads as
    exp(tanh(O)) = 1: proved and lowered without the opt-in, yet float64's O is 2.8e14 at X = [3, 8, 3.3, -13]·1e29,
    where dX is e·dY·c and the VJP's dY·c.  The forward's cancellation is refused as the backward's is."""
    text = ("axis x\ndiagram f(X: [x], c: []) -> [], [] {\n  Y = sum[x](X) * c\n  O = sum[x](X * 3) - sum[x](X) * 3\n"
            "  return Y, O\n}\ndiagram b(X: [x], c: [], O: [], dY: []) -> [x], [] {\n"
            "  dX = dY * c * exp(tanh(O)) + X * 0\n  dc = dY * sum[x](X)\n  return dX, dc\n}\n")
    forward, backwards = _pair(text)
    x, one = np.array([3e29, 8e29, 3.3e29, -1.3e30]), np.array(1.0)
    (_, saved) = evaluate(forward, [x, one])
    assert np.allclose(evaluate(backwards[0], [x, one, saved, one])[0], math.e)
    assert "over the reals" in _refused_both_ways(forward, backwards, ("lower.backward_unproved",))


# ---- a term 1 over the reals read by log, and a cancellation to a non-zero constant (red team rtjoin2) -----------

#: u is X·1e-20 (tanh keeps exp finite), so exp(u)·exp(-u) is exactly 1 in float64 at every |X| < 1e4 the test draws
#: and 1 ± 2^-52 at X = 1e4; the amplifier exp(40 + tanh(X)·0) is 2.35e17 and no constant (the test's bound is 4096)
AMPLIFIED = "exp(tanh(log(exp({u}) * exp(0 - {u})) * exp(40 + tanh(X) * 0)))".format(
    u="tanh(X * 0.00000000000000000001)")
#: the forward of RESIDUE, a backward whose dX is dY·c times a factor 1 over the reals
FACTOR = RESIDUE.replace("  r = sum[x](X * 3) - sum[x](X) * 3\n", "").replace(" + X * 0", "")
#: (K + 1/K)² - (K - 1/K)² is 4 over the reals; K = exp(40·tanh(X/1000)) is e^40 at X = 1e4, where K ± 1/K rounds to K
SQUARES = "(square({k} + {r}) - square({k} - {r})) / 4".format(
    k="exp(tanh(X * 0.001) * 40)", r="exp(0 - tanh(X * 0.001) * 40)")


def _wrong_at_1e4(forward: Diagram, backward: Diagram) -> None:
    """The backward's dX is off the VJP's 1 by more than 0.5 at X = 1e4 (an input in the domain)."""
    x, one = np.array([1e4, 1e4]), np.array(1.0)
    want = evaluate(vjp(forward), [x, one, one])[0]
    got = evaluate(backward, [x, one, one])[0]
    assert np.all(want == 1.0) and np.all(np.abs(got - want) > 0.5), (want, got)


def test_a_computed_one_read_by_log_is_a_float_hazard_either_way() -> None:
    """Red team rtjoin2: log(exp(u)·exp(-u)) is 0 over the reals, which the prover read exactly, so a factor
    exp(tanh(log(·)·2.35e17)) was 1 and the join proved and lowered without the opt-in.  float64 computes
    exp(u)·exp(-u) as 1 ± 2^-52 at X = 1e4: the log is ±1.1e-16, amplified to ±26, and dX is 1/e where the VJP's
    is 1 (no difference cancels, so ``_Semantics.cancelled`` did not see it; the test's draws, |X| < 100, keep
    u below the rounding).  log of a computed term that is 1 over the reals is a cancellation to 0 as a
    difference is (``_Semantics.log``), refused with the opt-in too."""
    forward, backwards = _pair(FACTOR.format(factor=AMPLIFIED))
    _wrong_at_1e4(forward, backwards[0])
    assert "1 over the reals" in _refused_both_ways(forward, backwards, ("lower.backward_unproved",))


def test_a_difference_of_squares_cancelling_to_a_constant_is_a_float_hazard_either_way() -> None:
    """Red team rtjoin2: (K + 1/K)² - (K - 1/K)² is 4 over the reals, so dY·c·(that)/4 was proved equal to the VJP's
    dY·c and lowered without the opt-in; at X = 1e4 float64 rounds K ± 1/K to K = e^40 and dX is 0 where the VJP's
    is 1 (the test's draws, |X| < 100, keep K below e^4, where it rounds right).  No operand's share cancels (the
    cross term 4·K·(1/K) survives: ``finiteness.cancelled_absorptions``) and the difference is not 0
    (``_Semantics.cancelled`` saw only those): a difference whose operands read an input its value over the reals
    does not is a cancellation too, refused with the opt-in as well."""
    forward, backwards = _pair(FACTOR.format(factor=SQUARES))
    _wrong_at_1e4(forward, backwards[0])
    assert "reading inputs its value" in _refused_both_ways(forward, backwards, ("lower.backward_unproved",))


@pytest.mark.parametrize("dx", ["dy * W * " + AMPLIFIED.replace("X", "W"),
                                "dy * W * exp(tanh(sum[t](W * 3) - sum[t](W) * 3))"], ids=["log_of_one", "rt3"])
def test_a_cancellation_beside_a_gelu_is_a_float_hazard_with_the_opt_in(dx: str) -> None:
    """Red team rtjoin2: beside a gelu the prover stops, and ``prove._equal_gradients`` (each gradient alone, gelu an
    unknown function) read a float64 hazard its semantics met (``_Semantics.cancelled``, ``_Semantics.log``) as
    the prover's incompleteness, so the join rested on the float64 test, whose draws do not reach the residue:
    the opt-in lowered dX = dy·W·(factor 1 over the reals), 1/e·W at W = 1e4 (log_of_one) and e·W at
    W = [3, 8, 3.3, -13]·1e29 (rt3) where the VJP's is W.  The hazard is now raised from there too."""
    forward, backwards = _pair(GELU_W.replace("DX", dx))
    w = np.array([1e4, 1e4]) if "log" in dx else np.array([3e29, 8e29, 3.3e29, -1.3e30])
    a, x = np.ones_like(w), np.ones_like(w)
    want = evaluate(vjp(forward), [a, x, w, np.array(1.0)])[1]
    got = evaluate(backwards[0], [a, x, w, np.array(1.0)])[1]
    assert np.all(np.abs(got - want) > 0.3 * np.abs(want)), (want, got)
    assert "over the reals" in _refused_both_ways(forward, backwards, ("lower.backward_unproved",))


@pytest.mark.xfail(strict=True, reason="lower.backward._constants counts literals and terms free of inputs "
                   "(_folded); exp(8 + tanh(Σ X)·0) reads X, so its value 2981 is no constant there and the draws "
                   "stop at t = 1024, where min(1, 2981 / t) is 1: counting each term's value over the reals when it "
                   "is a number (the prover's semantics) would take the draws past it")
def test_a_constant_computed_from_the_inputs_is_drawn_past_with_the_opt_in() -> None:
    """Red team rtjoin2: dX = dY·c·min(1, exp(8 + tanh(Σ_x X)·0) / |x|) is the VJP's dY·c up to |x| = 2981 and
    0.9937·dY·c at |x| = 3000; unproved, the opt-in lowered it on the float64 test, whose draws reach |x| = 1024
    (the long draw) and past the literal 8, not past the value 2981 the term has at every input."""
    factor = "min(1, exp(8 + tanh(sum[x](X)) * 0) / sum[x](X * 0 + 1))"
    forward, backwards = _pair(RESIDUE.replace("  r = sum[x](X * 3) - sum[x](X) * 3\n", "").format(factor=factor))
    x, one = np.random.default_rng(0).normal(size=3000), np.array(1.0)
    want = evaluate(vjp(forward), [x, one, one])[0]
    got = evaluate(backwards[0], [x, one, one])[0]
    assert np.all(want == 1.0) and np.all(np.abs(got - 0.9937) < 1e-4), (want, got)
    _refused_both_ways(forward, backwards, ("lower.backward_wrong", "lower.backward_untestable"))


#: r and q are 3 over the reals, so onehot[v](r) and onehot[v](q) were one atom; e = exp(tanh(X·1e-20)) is exactly 1 at
#: every |X| < 1e4 the test draws, so r and q are exactly 3 there, and at X = [554, 37, 756, 543]·1e3 r is 3 - 2^-51
ONEHOTS = ("axis x\ndiagram f(X: [x], c: []) -> [] {\n  Y = sum[x](X) * c\n  return Y\n}\n"
           "axis v = 8\ndiagram b(X: [x], c: [], dY: []) -> [x], [] {\n"
           "  e = exp(tanh(X * 0.00000000000000000001))\n  r = sum[x](e * 3) / sum[x](e)\n"
           "  q = sum[x](e * 9) / sum[x](e * 3)\n"
           "  dX = dY * c * exp(tanh(sum[v](onehot[v](r)))) / exp(tanh(sum[v](onehot[v](q)))) * exp(X * 0)\n"
           "  dc = dY * sum[x](X)\n  return dX, dc\n}\n")


def test_a_onehot_of_a_computed_real_is_a_float_hazard_either_way() -> None:
    """Red team rtjoin2: onehot jumps at every integer, and the prover keys its atom by the operand's value over
    the reals, so onehot[v](r) and onehot[v](q), both 3 there, cancelled: the join was proved and lowered without
    the opt-in.  float64 computes r as 3 - 2^-51 at X = [554, 37, 756, 543]·1e3, where onehot[v](r) is 0 everywhere,
    q as 3, and dX is dY·c/e^tanh(1) = 0.467 where the VJP's is 1.  A onehot of a computed term not
    integer-valued (``ops.integer_valued``; labels read as inputs are what they hold) is now a float64 hazard in a
    join (``_Semantics.box``)."""
    forward, backwards = _pair(ONEHOTS)
    x, one = np.array([554e3, 37e3, 756e3, 543e3]), np.array(1.0)
    want = evaluate(vjp(forward), [x, one, one])[0]
    got = evaluate(backwards[0], [x, one, one])[0]
    assert np.all(want == 1.0) and np.all(np.abs(got - want) > 0.5), (want, got)
    assert "onehot" in _refused_both_ways(forward, backwards, ("lower.backward_unproved",))
