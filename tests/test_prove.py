"""The symbolic prover (napkin_cat.certify.prove): shipped lemmas and accumulator laws at every size,
and never a false lemma or a broken law."""

from __future__ import annotations

import dataclasses
import math

import pytest
import sympy

from napkin_cat import certify
from napkin_cat.certify import accumulators, atoms, prove, rules
from napkin_cat.certify.accumulators import FLOAT_MAX
from napkin_cat.elaborate import loads
from napkin_cat.ops import typed_box
from napkin_cat.terms import Box, Var


@pytest.mark.parametrize("name", sorted(rules.library()))
def test_shipped_lemmas_are_proved_at_every_size(name: str) -> None:
    assert prove.why_unproved(rules.library()[name]) is None


FALSE = """axis x, y
lemma product_of_sums(A: [x], B: [x]) : sum[x](A * B) = sum[x](A) * sum[x](B)
lemma max_additive(X: [x], Y: [x]) : max[x](X + Y) = max[x](X) + max[x](Y)
lemma lse_unshifted(S: [x], c: []) : logsumexp[x](S - c) = logsumexp[x](S)
lemma mean_off_by_one(X: [x]) : mean[x](X) = sum[x](X) / (x + 1.0)
lemma exp_log(X: []) : exp(log(X)) = X
lemma l2_wrong_b(S: [x], V: [x]) : contract[x](l2norm[x](S), V) = ncontract[x; id, square, id](S, V)
lemma swap_sum_max(X: [x y]) : sum[x](max[y](X)) = max[y](sum[x](X))
lemma tiny_difference(S: [x], V: [x]) : contract[x](softmax[x](S), V) = ncontract[x; exp, exp, id](S, V) + 1e-30
lemma sqrt_square(X: [x]) : sqrt(square(X)) = X
lemma times_size(X: [x]) : sum[x](X) = sum[x](X) * x
lemma rms_is_l2(S: [x]) : sum[x](rmsnorm[x](S)) = sum[x](l2norm[x](S))
lemma different_axes(X: [x], Y: [y]) : sum[x](X) = sum[y](Y)
lemma zero_row_undefined(S: [x]) : sum[x](l2norm[x](S)) = sum[x](S) / sqrt(sum[x](square(S)))
lemma below_float_range(A: [x]) : max(sum[x](A) * 10.0, -1.7976931348623157e308) = sum[x](A) * 10.0
"""


@pytest.mark.parametrize("lemma", loads(FALSE).lemmas, ids=lambda lemma: lemma.name)
def test_false_or_partial_lemmas_are_not_proved(lemma) -> None:  # type: ignore[no-untyped-def]
    assert prove.why_unproved(lemma) is not None


def test_true_lemmas_beyond_the_library_are_proved() -> None:
    text = ("axis x, y\nlemma sums_to_one(S: [x]) : sum[x](softmax[x](S)) = 1.0\n"
            "lemma outer(A: [x], B: [y]) : sum[x](A) * sum[y](B) = sum[x](A * sum[y](B))\n")
    assert [prove.why_unproved(lemma) for lemma in loads(text).lemmas] == [None, None]


def test_masks_are_claimed_only_where_the_masked_rows_agree() -> None:
    """Both sums of probabilities are 1 on finite scores, but a fully masked row sums to 0:
    true on finite inputs, false with masks, so no parameter is named as maskable."""
    text = ("axis x\nlemma twice(S: [x], T: [x]) : sum[x](softmax[x](S)) + sum[x](softmax[x](T)) = "
            "2.0 * sum[x](softmax[x](S))\n")
    proof = prove.prove_lemma(loads(text).lemmas[0])
    assert proof is not None and "masks" not in proof
    assert "[-inf masks: S]" in (prove.prove_lemma(rules.library()["softmax_contract"]) or "")


def test_the_guarded_shift_of_an_input_is_the_input() -> None:
    """max(X, -FLOAT_MAX) of an input is X (every finite float64 is at least -FLOAT_MAX; the derived
    backward's guarded statistic, ``grad._weights``); of a computed term, or against another constant,
    the prover claims nothing (over the reals 2·X may be below -FLOAT_MAX, and X below -1e300)."""
    text = (f"axis x\nlemma guarded(X: [x]) : max(X, {-FLOAT_MAX!r}) = X\n"
            f"lemma scaled(X: [x]) : max(X * 2.0, {-FLOAT_MAX!r}) = X * 2.0\n"
            "lemma other(X: [x]) : max(X, -1e300) = X\n")
    assert [prove.why_unproved(lemma) is None for lemma in loads(text).lemmas] == [True, False, False]


RESHAPES = """axis x, y, z, u, v
lemma three(X: [x]) : join[u v z -> x](split[x -> u v z](X)) = X
lemma three_back(X: [u v z]) : split[x -> u v z](join[u v z -> x](X)) = X
lemma nested(X: [x]) : join[u v z -> x](split[y -> u v](split[x -> y z](X))) = X
lemma renamed(X: [x]) : rename[y -> x](rename[x -> y](X)) = X
lemma summed(X: [x]) : sum[y](join[u v -> y](split[y -> u v](split[x -> y z](X)))) = sum[y](split[x -> y z](X))
"""

WRONG_RESHAPES = """axis x, y, z, u
lemma swapped(X: [x]) : join[z y -> x](split[x -> y z](X)) = X
lemma split_other_way(X: [x]) : join[y z -> x](split[x -> z y](X)) = X
lemma swapped_back(X: [y z]) : split[x -> z y](join[y z -> x](X)) = X
lemma inverse_transposes(X: [x]) : join[z y -> x](split[x -> y z](X)) = join[y z -> x](split[x -> z y](X))
lemma split_mean(X: [x]) : sum[y](mean[z](split[x -> y z](X))) = mean[x](X)
lemma split_not_honoured(X: [x], Y: [y z]) : sum[x](X) + sum[y z](Y) = sum[y z](split[x -> y z](X)) + sum[y z](Y)
lemma join_not_honoured(X: [y z], Y: [x]) : sum[y z](X) + sum[x](Y) = sum[x](join[y z -> x](X)) + sum[x](Y)
lemma tied_twice(X: [x]) : join[y z -> x](split[x -> y z](X)) + join[y u -> x](split[x -> y u](X)) = X + X
"""


def test_reshapes_are_proved_where_the_left_side_is_defined() -> None:
    """split/join/rename through the split bijection i = a·|z| + b, at every size the left side's
    reshapes admit (|x| = |y|·|z|), which the proof names."""
    assert [prove.why_unproved(lemma) for lemma in loads(RESHAPES).lemmas] == [None] * 5
    assert "where the left side is defined (x = y·z)" in (prove.prove_lemma(rules.library()["split_join"]) or "")
    assert "(x = u·v·z, y = u·v)" in (prove.prove_lemma(loads(RESHAPES).lemmas[2]) or "")


@pytest.mark.parametrize("lemma", loads(WRONG_RESHAPES).lemmas, ids=lambda lemma: lemma.name)
def test_wrong_reshapes_are_not_proved(lemma) -> None:  # type: ignore[no-untyped-def]
    """Axes swapped (a transpose, the identity only where |y| = 1 or |z| = 1), a mean over a
    part, a right side whose reshape the left side's sizes need not honour, and sizes tied
    twice (|y|·|z| = |y|·|u|), which the prover does not solve."""
    why = prove.why_unproved(lemma)
    assert why is not None
    if lemma.name.endswith("not_honoured"):
        assert "which the left side does not" in why


def _box(op: str, params: tuple[str, ...] = ()) -> tuple[Box, str]:
    s, v = Var("X0", ("x",)), Var("X1", ("x",))
    return typed_box(op, (s, v) if op in ("contract", "ncontract") else (s,), ("x",), params=params), "x"


@pytest.mark.parametrize(("box", "axis"), certify.representative_boxes(), ids=lambda v: getattr(v, "op", v))
def test_accumulator_laws_are_proved(box, axis) -> None:  # type: ignore[no-untyped-def]
    canonical = certify.canonical(box, axis)
    for name in accumulators.accumulators_for(box, axis):
        for pad in (False, True):
            assert prove.prove_accumulator(canonical, axis, name, pad) is not None, (box.op, name, pad)


@pytest.mark.parametrize(("op", "params", "masked"), [
    ("max", (), True), ("logsumexp", (), True), ("ncontract", ("exp", "exp", "id"), True),
    ("sum", (), False), ("min", (), False)])
def test_masked_laws_are_claimed_for_the_score_accumulators(op: str, params: tuple[str, ...], masked: bool) -> None:
    """-inf masks are proved where the laws hold with a chunk or a whole row masked: logsumexp
    too, since log 0 = -inf (a fully masked row's Σ exp is exactly 0), as the evaluator gives.
    A sum over -inf entries is not a score accumulator: no claim."""
    box, axis = _box(op, params)
    canonical = certify.canonical(box, axis)
    name = accumulators.accumulators_for(canonical, axis)[-1]
    answer = prove.prove_accumulator(canonical, axis, name, False)
    assert answer is not None and ("[-inf masks: X0]" in answer) is masked, answer


def test_a_broken_law_is_not_proved() -> None:
    """Tampered plans: an online-softmax identity state that is not neutral, a mean whose
    finaliser forgets to divide, a sum padded with 1."""
    box, axis = _box("ncontract", ("exp", "exp", "id"))
    online = accumulators.plan(box, axis, "online_softmax", guard=False)
    guarded = accumulators.plan(box, axis, "online_softmax", guard=True)
    assert prove._laws(dataclasses.replace(online, identity=(0.0, 0.0, 0.0)), guarded, box, False) == "identity"
    mean, _ = _box("mean")
    plain = accumulators.plan(mean, "x", "sum", guard=False)
    total = accumulators.plan(typed_box("sum", (Var("X0", ("x",)),), ("x",)), "x", "sum", guard=False)
    assert prove._laws(dataclasses.replace(plain, final=total.final), plain, mean, False) == "finaliser"
    assert prove._laws(dataclasses.replace(total, pad=(1.0,)), total, total.box, True) == "padding"


@pytest.mark.parametrize(("op", "identity", "fill"), [("min", -math.inf, -math.inf), ("prod", 0.0, 0.0)])
def test_a_broken_min_or_prod_is_not_proved(op: str, identity: float, fill: float) -> None:
    """min with identity -inf (it absorbs every state), prod with identity 0, each padded with
    its wrong identity, and each combined by the other's operation (max for min, + for prod; prod's
    zero flag w kept as it is)."""
    box, axis = _box(op)
    plan = accumulators.plan(box, axis, op, guard=False)
    assert prove._laws(plan, plan, box, True) is None
    broken = (identity, *plan.identity[1:])
    assert prove._laws(dataclasses.replace(plan, identity=broken), plan, box, False) == "identity"
    assert prove._laws(dataclasses.replace(plan, pad=(fill,)), plan, box, True) == "padding"
    first, second = (Var(p.name, p.axes) for p in (plan.combine.inputs[0], plan.combine.inputs[len(plan.state)]))
    merged = typed_box({"min": "maximum", "prod": "add"}[op], (first, second))
    wrong = dataclasses.replace(plan.combine, outputs=(merged, *plan.combine.outputs[1:]))
    assert prove._laws(dataclasses.replace(plan, combine=wrong), plan, box, False) == "recomposition"


_A, _B = "sum[x](sign(softmax[x](S)))", "sum[x](sign(softmax[x](T)))"  # the kept keys of each row
_P, _Q = "sum[x](softmax[x](S))", "sum[x](softmax[x](T))"  # 1, or 0 on a fully masked row
_BOTH = "sum[x](softmax[x](S) * softmax[x](T))"
PARTLY_MASKED = f"""axis x
lemma count_kept(S: [x]) : {_A} = x * {_P}
lemma both_kept(S: [x], T: [x]) : sum[x](sign(softmax[x](S)) * sign(softmax[x](T))) = \
{_A} * {_Q} + {_B} * {_P} - x * {_P} * {_Q}
lemma overlap_positive(S: [x], T: [x]) : {_BOTH} * recip({_BOTH}) = 1.0
"""


@pytest.mark.parametrize("lemma", loads(PARTLY_MASKED).lemmas, ids=lambda lemma: lemma.name)
def test_partly_masked_rows_are_not_taken_as_finite(lemma) -> None:  # type: ignore[no-untyped-def]
    """Each is true on finite scores (every weight positive) and on fully masked rows, but not
    where a row is partly masked: a masked weight is exactly 0 (sign 0, a key counted out), and
    two partly masked rows may keep no key in common (Σ p_S·p_T = 0).  The prover proves the
    finite case and names no parameter maskable, saying which mix of masked rows fails."""
    proof = prove.prove_lemma(lemma)
    assert proof is not None and "masks" not in proof, proof
    why = prove.masks_unproved(lemma)
    assert why is not None and "partly masked" in why, why
    if lemma.name == "overlap_positive":  # two indicators in one sum: no row is known to keep a term of both
        assert "recip" in why and "not known positive" in why, why


MASKABLE = """axis x, d
lemma shift_two(S: [x], T: [x], c: []) : softmax[x](S - c) * softmax[x](T) = softmax[x](S) * softmax[x](T)
lemma lse_shift_max(S: [x], c: []) : logsumexp[x](S + c) - max[x](S) = logsumexp[x](S) + c - max[x](S)
lemma contract_two(S: [x], T: [x], V: [x d]) : contract[x](softmax[x](S), V) + contract[x](softmax[x](T), V) = \
ncontract[x; exp, exp, id](S, V) + ncontract[x; exp, exp, id](T, V)
"""


@pytest.mark.parametrize("lemma", loads(MASKABLE).lemmas, ids=lambda lemma: lemma.name)
def test_masks_are_proved_in_every_mix_of_partly_and_fully_masked_rows(lemma) -> None:  # type: ignore[no-untyped-def]
    """Shifts and normalised contractions of several score rows hold whatever each row's mask
    (m·exp(S') with m any 0/1 indicator, or every entry -inf): the prover names them all."""
    assert prove.masks_unproved(lemma) is None
    scores = [p.name for p in lemma.params if p.name in ("S", "T")]
    assert f"[-inf masks: {', '.join(scores)}]" in (prove.prove_lemma(lemma) or "")


@pytest.mark.parametrize("name", ["softmax_contract", "online_softmax_shift", "softmax_shift", "logsumexp_shift"])
def test_library_score_lemmas_keep_their_masks(name: str) -> None:
    assert prove.masks_unproved(rules.library()[name]) is None
    assert "[-inf masks: S]" in (prove.prove_lemma(rules.library()[name]) or "")


def test_nan_is_not_absorbed_by_an_infinity_in_max_or_min() -> None:
    """On a fully masked row max[x](S) - max[x](S) is -inf - -inf = NaN, and the evaluator's
    max(NaN, +inf) is NaN; the prover's lattice once let +oo absorb sympy's nan, so the left side
    below was +oo there like the right side and S was named maskable (tests/unsound/
    redteam_max_of_nan_and_inf.ncd: NaN rewritten to +inf on a fully masked row)."""
    assert atoms.maximum(sympy.nan, sympy.oo) is sympy.nan and atoms.minimum(-sympy.oo, sympy.nan) is sympy.nan
    (lemma,) = loads("""axis x
lemma absorb(S: [x]) : max(max[x](S) - max[x](S), neg(max[x](S))) = max(0.0, neg(max[x](S)))
""").lemmas
    proof = prove.prove_lemma(lemma)
    assert proof is not None and "masks" not in proof, proof
    why = prove.masks_unproved(lemma)
    assert why is not None and "S fully masked" in why, why


def test_a_reduction_never_captures_a_position_a_rename_moved_into_a_nested_one() -> None:
    """sum[t](rename[s -> t](sum[t](X))) sums every entry of X: the inner sum binds t, the rename
    moves s's position onto t, and binding the outer t inside the inner atom would read X's
    diagonal.  The prover refuses the term rather than normalise it wrongly, so neither the true
    equation nor the diagonal one is proved."""
    text = ("axis t, s\nlemma total(X: [t s]) : sum[t](rename[s -> t](sum[t](X))) = sum[t s](X)\n"
            "lemma diagonal(X: [t s], D: [t]) : sum[t](rename[s -> t](sum[t](X))) = sum[t](D)\n")
    for lemma in loads(text).lemmas:
        assert "a nested reduction over the same axis" in (prove.why_unproved(lemma) or "")
