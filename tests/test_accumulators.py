"""Accumulators as IR terms: every admissible plan, folded over chunks, equals the box."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from napkin_cat import ops
from napkin_cat.certify import accumulators as acc
from napkin_cat.evaluate import FLOAT32, FLOAT64, Named, evaluate_named
from napkin_cat.ops import typed_box
from napkin_cat.terms import Axis, Box, Const, Diagram, Param, Var

S, V, W = Var("S", ("q", "x")), Var("V", ("x", "d")), Var("W", ("q", "x"))
BOXES = [typed_box(op, (S,), ("x",)) for op in ("sum", "mean", "max", "min", "prod", "logsumexp")] + [
    typed_box("contract", (S, W), ("x",)),
    typed_box("contract", (S, V), ("x",)),
    *(typed_box("ncontract", (S, V), ("x",), params=p)
      for p in [("exp", "exp", "id"), ("exp", "exp", "sqrt"), ("exp", "exp", "rms"), ("id", "square", "sqrt"),
                ("id", "square", "rms"), ("sigmoid", "abs", "id")]),
]
PLANS = [(b, name) for b in BOXES for name in acc.accumulators_for(b, "x")]


def _value(box: Box, operands: list[Named], sizes: dict[str, int]) -> Named:
    params = tuple(Param(a.name, a.axes) for a in box.args if isinstance(a, Var))
    axes = tuple(Axis(a) for a in ("q", "x", "d"))
    (out,) = evaluate_named(Diagram("box", params, (), (box,), (box.axes,), axes), operands, sizes)
    return out


@pytest.mark.parametrize(("box", "name"), PLANS, ids=[f"{b.op}{b.params}-{n}" for b, n in PLANS])
@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 9), tile=st.integers(1, 4), masked=st.booleans(), pad=st.booleans(), seed=st.integers(0, 99))
def test_stream_fold_equals_the_box(box: Box, name: str, n: int, tile: int, masked: bool, pad: bool,
                                    seed: int) -> None:
    plan = acc.plan(box, "x", name)
    pad = pad and plan.pad is not None  # no padding law (sigmoid, abs): the example still runs, ragged
    rng = np.random.default_rng(seed)
    sizes = {"q": 3, "x": n, "d": 2}
    operands = [Named(a.axes, rng.standard_normal([sizes[x] for x in a.axes])) for a in box.args]
    if box.op == "prod":
        operands = [Named(o.axes, 1.0 + 0.1 * o.data) for o in operands]
    if masked:
        operands[0].data[0, :] = -math.inf  # a fully masked row (its value as evaluate.py documents, for every box)
    want = _value(box, operands, sizes)
    got = acc.stream_fold(plan, operands, tile, sizes, pad=pad)
    np.testing.assert_allclose(got.to(want.axes), want.data, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("box", "name"), PLANS, ids=[f"{b.op}{b.params}-{n}" for b, n in PLANS])
def test_exactly_the_absorbing_inputs_lift_a_padded_chunk_to_the_identity(box: Box, name: str) -> None:
    """Each input in turn at its padding value over a whole chunk, the others random: the
    lift is the identity exactly for the inputs the plan calls absorbing (the values of an
    attention at 0 are not: the normaliser still sums the chunk's scores)."""
    plan = acc.plan(box, "x", name)
    if plan.pad is None:
        assert plan.absorbing == ()
        return
    rng = np.random.default_rng(0)
    sizes = {"q": 3, "x": 4, "d": 2}
    operands = [Named(a.axes, 1.0 + 0.1 * rng.standard_normal([sizes[x] for x in a.axes])) for a in box.args]
    for i, fill in enumerate(plan.pad):
        held = [Named(o.axes, np.full_like(o.data, fill)) if j == i else o for j, o in enumerate(operands)]
        lifted = evaluate_named(plan.lift, held, sizes)
        identity = all(np.array_equal(s.data, np.full_like(s.data, v)) for s, v in zip(lifted, plan.identity,
                                                                                         strict=True))
        assert identity == (i in plan.absorbing), (i, fill, lifted)


def test_a_streamed_product_holding_a_zero_stays_zero_where_another_chunk_overflows() -> None:
    """issue 28 (differential rerun 42): in float32 (as a kernel) a chunk of 16 entries 1.2e4
    multiplies to inf, and the plain combine p1·p2 met the other chunk's 0 as NaN where the box's product is 0.  The
    state's zero flag w makes the guarded combine multiply signs there (the zero's sign kept: -0
    beside one negative entry), while an infinite entry or a NaN meeting the zero stays NaN."""
    box = typed_box("prod", (S,), ("x",))
    plan = acc.plan(box, "x", "prod")
    rows = np.full((6, 32), 1.2e4, dtype=np.float32)
    rows[0, :16] = 0.0  # the differential's row: zeros, then a chunk that overflows
    rows[1, 16] = 0.0  # the zero after the overflow (first in its chunk: f32 multiplies a chunk in order)
    rows[2, 3], rows[2, 20] = 0.0, -1.2e4  # -0
    rows[3, 0], rows[3, 20] = 0.0, math.inf  # inf · 0: NaN, as the box's
    rows[4, 0], rows[4, 20] = 0.0, math.nan
    rows[5, :] = 0.5  # no zero: the product
    operands = [Named(S.axes, rows)]
    sizes = {"q": 6, "x": 32}
    with np.errstate(all="ignore"):
        want = _value(box, [Named(S.axes, rows.astype(np.float64))], sizes).data  # float64's box
        got = acc.stream_fold(plan, operands, 16, sizes, algebra=FLOAT32).to(("q",))
    assert np.array_equal(want[:3], [0.0, 0.0, -0.0]) and np.all(np.isnan(want[3:5]))
    assert np.array_equal(got[:3], want[:3]) and np.array_equal(np.signbit(got[:3]), np.signbit(want[:3]))
    assert np.all(np.isnan(got[3:5])) and np.isclose(got[5], want[5], rtol=1e-5)


def test_the_plans_cover_every_accumulator_and_consuming_box() -> None:
    """The fold test above is parametrized over PLANS: an empty or partial list would pass it."""
    assert {name for _, name in PLANS} == set(ops.ACCUMULATORS)
    assert {box.op for box, _ in PLANS} == {op for op in ops.OPS if ops.is_consuming(op)}


def test_plan_shapes_and_identity() -> None:
    box = typed_box("ncontract", (S, V), ("x",), params=("exp", "exp", "id"))
    plan = acc.plan(box, "x", "online_softmax")
    assert [n for n, _ in plan.state] == ["m", "l", "o"]
    assert dict(plan.state)["o"] == ("q", "d") and dict(plan.state)["m"] == ("q",)
    assert plan.identity == (-math.inf, 0.0, 0.0) and plan.pad == (-math.inf, 0.0)
    assert [p.name for p in plan.lift.inputs] == ["X0", "X1"]
    assert len(plan.combine.inputs) == 6 and len(plan.final.outputs) == 1


def test_admissibility() -> None:
    box = typed_box("ncontract", (S, V), ("x",), params=("exp", "exp", "id"))
    assert acc.accumulators_for(box, "x") == ("normalised", "online_softmax")
    assert acc.accumulators_for(box, "q") == ()
    assert acc.accumulators_for(typed_box("softmax", (S,), ("x",)), "x") == ()
    with pytest.raises(ValueError, match="cannot stream"):
        acc.plan(box, "x", "max")
    with pytest.raises(ValueError, match="does not consume axis `q`"):
        acc.plan(box, "q")


def test_padding_values() -> None:
    odd = typed_box("ncontract", (S, V), ("x",), params=("sigmoid", "square", "sqrt"))
    assert acc.plan(odd, "x").pad is None  # no score value makes both sigmoid and square zero
    assert acc.plan(typed_box("min", (S,), ("x",)), "x").pad == (math.inf,)


def test_the_stable_states_update_in_one_step() -> None:
    """online_softmax and logsumexp fold a chunk into the state with one correction (their
    ``update``); the others combine a lifted chunk."""
    have = {(b.op, b.params, name): acc.plan(b, "x", name).update is not None for b, name in PLANS}
    assert {k for k, v in have.items() if v} == {("logsumexp", (), "logsumexp"),
                                                *(("ncontract", ("exp", "exp", b), "online_softmax")
                                                  for b in ("id", "sqrt", "rms"))}


def test_a_wrong_update_is_refused_by_the_prover_and_the_numeric_laws(monkeypatch: pytest.MonkeyPatch) -> None:
    """An update that forgets to rescale the running output (o = o1 + Σ p·v) fails the update
    law, symbolically and on drawn inputs."""
    from napkin_cat.certify import certify_accumulator, prove
    from napkin_cat.terms import Let

    right = acc._Builder.stable_update

    def forgetful(self: acc._Builder, parts: list, one: tuple) -> Diagram:  # type: ignore[type-arg]
        d = right(self, parts, one)
        o1, chunk = Var("o1", d.outputs[-1].axes), Var("o_chunk", d.outputs[-1].axes)
        body = tuple(Let(let.names, typed_box("add", (o1, chunk))) if let.names == ("o",) else let for let in d.body)
        return replace(d, body=body)

    monkeypatch.setattr(acc._Builder, "stable_update", forgetful)
    box = typed_box("ncontract", (Var("X0", ("x",)), Var("X1", ("x",))), ("x",), params=("exp", "exp", "id"))
    assert prove.prove_accumulator.__wrapped__(box, "x", "online_softmax", True) is None
    cert = certify_accumulator.__wrapped__(box, "x", "online_softmax", True, "quick")
    assert not cert.ok and "update(lift(x), y) != combine(lift(x), lift(y))" in cert.counterexample


#: normalised contractions whose weights are invariant under scaling the scores (``acc.DEGREE``)
SCALED = [typed_box("ncontract", (S, V), ("x",), params=p)
          for p in [("id", "square", "sqrt"), ("id", "square", "rms"), ("relu", "square", "sqrt"),
                    ("abs", "abs", "id"), ("relu", "relu", "id"), ("square", "square", "id")]]


def _fold_by_update(plan: acc.AccumulatorPlan, operands: list[Named], tile: int, sizes: dict[str, int],
                    algebra: Any) -> Named:
    """``acc.stream_fold`` as the kernels fold: the identity, then ``update`` per chunk, then final."""
    assert plan.update is not None
    state = tuple(Named((), algebra.asarray(v)) for v in plan.identity)
    for start in range(0, sizes["x"], tile):
        parts = [acc.chunk(x, "x", start, min(start + tile, sizes["x"])) for x in operands]
        state = evaluate_named(plan.update, [*state, *parts], {**sizes, "x": parts[0].data.shape[1]}, algebra)
    (value,) = evaluate_named(plan.final, state, sizes, algebra)
    return value


def test_the_float_safe_plan_is_the_proved_one_but_for_scaled_normalised_states() -> None:
    """``float_safe`` rescales exactly the normalised states of scale-invariant weights; every
    other plan (online softmax, sigmoid or exp weights, the monoids) is the proved plan itself."""
    for box, name in PLANS:
        plan = acc.plan(box, "x", name)
        scaled = name == "normalised" and box.params in {b.params for b in SCALED}
        assert (acc.float_safe(plan) is plan) != scaled, (box.params, name)
    for box in SCALED:
        plan, safe = acc.plan(box, "x", "normalised"), acc.float_safe(acc.plan(box, "x", "normalised"))
        assert [n for n, _ in safe.state] == ["m", "o", "z"] and safe.identity == (0.0, 0.0, 0.0)
        assert safe.pad == plan.pad and safe.absorbing == plan.absorbing and safe.update is not None


@pytest.mark.parametrize("box", SCALED, ids=[str(b.params) for b in SCALED])
@settings(max_examples=15, deadline=None)
@given(n=st.integers(1, 9), tile=st.integers(1, 4), pad=st.booleans(), seed=st.integers(0, 99),
       scales=st.lists(st.sampled_from([0.0, 1e-30, 1e-3, 1.0, 1e30]), min_size=9, max_size=9))
def test_the_float_safe_state_folds_to_the_box(box: Box, n: int, tile: int, pad: bool, seed: int,
                                               scales: list[float]) -> None:
    """The float-safe state (m, o', z') streamed by lift and combine (padded or ragged) and by the
    kernels' one-step update gives the box's value in float64, each position's scores scaled by
    its own factor (whole chunks of zeros, scales 60 orders apart), and the proved plan's on
    rows holding NaN or ±inf scores."""
    plan = acc.float_safe(acc.plan(box, "x", "normalised"))
    rng = np.random.default_rng(seed)
    sizes = {"q": 3, "x": n, "d": 2}
    scores = rng.standard_normal((3, n)) * np.asarray(scales[:n])
    scores[1, 0] = [math.inf, -math.inf, math.nan][seed % 3]  # a row the evaluator makes inf or NaN
    operands = [Named(("q", "x"), scores), Named(("x", "d"), rng.standard_normal((n, 2)))]
    want = _value(box, operands, sizes)
    for got in (acc.stream_fold(plan, operands, tile, sizes, pad=pad and plan.pad is not None),
                _fold_by_update(plan, operands, tile, sizes, FLOAT64)):
        np.testing.assert_allclose(got.to(want.axes), want.data, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("box", SCALED[:2], ids=[str(b.params) for b in SCALED[:2]])
@pytest.mark.parametrize(("first", "rest"), [(1e-21, 1e-21), (1e21, 1e21), (1e-22, 1e20), (1e-23, 1e-21),
                                             (1e-21, 1e-23), (0.0, 1e-25), (1e-39, 1e-39),
                                             (1e37, 1e37), (1e-40, 1e38)])
def test_the_float_safe_state_holds_in_float32(box: Box, first: float, rest: float) -> None:
    """In float32 (the kernels' precision) the proved state (Σ s·v, Σ s²) underflows at scores near
    1e-21 and overflows near 1e19; the float-safe one gives the float64 box's value (issue 28)."""
    rng = np.random.default_rng(0)
    sizes = {"q": 3, "x": 9, "d": 2}
    scores = rng.standard_normal((3, 9)) * np.where(np.arange(9) < 4, first, rest)
    operands = [Named(("q", "x"), scores.astype(np.float32).astype(np.float64)),
                Named(("x", "d"), rng.standard_normal((9, 2)).astype(np.float32).astype(np.float64))]
    want = _value(box, operands, sizes).data
    assert np.max(np.abs(want)) > 0.1
    single = [Named(o.axes, o.data.astype(np.float32)) for o in operands]
    got = _fold_by_update(acc.float_safe(acc.plan(box, "x", "normalised")), single, 4, sizes, FLOAT32)
    assert got.data.dtype == np.float32
    assert np.max(np.abs(got.to(("q", "d")) - want)) < 1e-5 * np.max(np.abs(want))
    with np.errstate(all="ignore"):
        proved = acc.stream_fold(acc.plan(box, "x", "normalised"), single, 4, sizes, FLOAT32)
    assert not np.max(np.abs(proved.to(("q", "d")) - want)) < 1e-5 * np.max(np.abs(want))


def test_the_float_safe_state_is_proved_to_represent_the_proved_plan() -> None:
    """``certify.represent`` proves every float-safe plan (the kernels' state) against its proved
    plan; a plan the kernels run as proved has nothing to prove."""
    from napkin_cat.certify import represent

    for box in SCALED:
        cert = represent.prove_representation(box, "x", "normalised")
        assert cert is not None and cert.ok and cert.how.startswith("proved: (m, o', z')"), (box.params, cert)
    assert represent.prove_representation(BOXES[-4], "x", "normalised") is None  # exp weights: the proved plan


def _relet(d: Diagram, name: str, expr: Any) -> Diagram:
    """``d`` with the let ``name`` computing ``expr(var)`` instead, ``var(n)`` a variable of ``d``."""
    from napkin_cat.terms import Let

    types = {p.name: p.axes for p in d.inputs} | {let.names[0]: let.expr.axes for let in d.body}
    return replace(d, body=tuple(Let(let.names, expr(lambda n: Var(n, types[n]))) if let.names == (name,) else let
                                 for let in d.body))


def _mul(a: Any, b: Any) -> Any:
    return typed_box("mul", (a, b))


def _add(a: Any, b: Any) -> Any:
    return typed_box("add", (a, b))


#: wrong float-safe plans, each with the law the certificate names
WRONG_FLOAT_SAFE = {
    "o' rescaled by k^p2": ("combine", lambda p: replace(p, combine=_relet(p.combine, "o", lambda v: _add(
        _mul(typed_box("square", (v("c1"),)), v("o1")), _mul(typed_box("square", (v("c2"),)), v("o2")))))),
    "one side not rescaled": ("combine", lambda p: replace(p, combine=_relet(
        p.combine, "o", lambda v: _add(_mul(v("c1"), v("o1")), v("o2"))))),
    "the state not rescaled by the update": ("update", lambda p: replace(p, update=_relet(
        p.update, "o", lambda v: _add(v("o1"), v("o_chunk"))))),
    "the chunk not scaled": ("lift", lambda p: replace(p, lift=_relet(p.lift, "t", lambda v: v("X0")))),
    "a finaliser mapping o' back but not z'": ("final", lambda p: replace(p, final=replace(
        p.final, outputs=(_mul(acc.scale(Var("m", ("q",)), Const(1.0)), p.final.outputs[0]),)))),
}


@pytest.mark.parametrize("wrong", list(WRONG_FLOAT_SAFE))
def test_a_wrong_float_safe_plan_is_refused(wrong: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each wrong variant of the kernels' state fails the law it breaks, and the accumulator's
    answer (the kernel's oracle) refuses it."""
    from napkin_cat.certify import represent, tiers

    law, mutate = WRONG_FLOAT_SAFE[wrong]
    right = acc.float_safe
    monkeypatch.setattr(acc, "float_safe", lambda p: p if right(p) is p else mutate(right(p)))
    box = typed_box("ncontract", (Var("X0", ("q", "x")), Var("X1", ("x", "d"))), ("x",),
                    params=("id", "square", "sqrt"))
    cert = represent.prove_representation.__wrapped__(box, "x", "normalised")
    assert cert is not None and not cert.ok and cert.counterexample.startswith(f"{law}:"), cert
    cached = (represent.prove_representation, tiers.float_safety, tiers.infinite_tested)
    for f in cached:
        f.cache_clear()
    try:
        answer = tiers.accumulator_answer.__wrapped__(box, "x", "normalised", True)
    finally:
        for f in cached:
            f.cache_clear()
    assert answer.startswith(f"the kernels' float-safe state does not represent it ({law}:"), answer


def test_the_degrees_and_classes_the_certificate_assumes_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong degree in ``DEGREE``, or a scale that takes m = inf for a usable one, is refused."""
    from napkin_cat.certify import represent

    assert represent._degrees_hold.__wrapped__() is None and represent._classes_hold.__wrapped__() is None
    monkeypatch.setitem(acc.DEGREE, "relu", 2.0)
    assert "`relu` is not of degree 2" in (represent._degrees_hold.__wrapped__() or "")
    monkeypatch.setitem(acc.DEGREE, "relu", 1.0)
    right = acc.scale

    def unbounded(m: Any, fallback: Any) -> Any:  # forgets m < inf: inf is clamped to 2^126, not 1
        wrong = right(m, fallback)
        return typed_box("select", (typed_box("gt", (m, Const(0.0))), wrong.args[1], fallback))

    monkeypatch.setattr(acc, "scale", unbounded)
    assert "scale(inf, 1)" in (represent._classes_hold.__wrapped__() or "")
