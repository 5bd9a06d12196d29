"""Integer boxes on positions (issue 30): ``floor``, with ``log`` and ``min``/``max`` on integers,
enough to write T5's relative-position bucketing in the diagram.

``floor(X)`` is the largest integer at most X, an integer-valued box whatever X is (±inf and NaN
stay as they are); it is exact in the evaluator, typed an integer (a gather's positions, a
comparison's operands), has a finiteness rule the analysis checks, no gradient, and lowers on both
targets (Mosaic GPU refuses it).  ``t5_bias`` in examples/masked_attention.ncd is HF T5's
``_relative_position_bucket`` written with it; proofs/relative_bias.ncd's kernel with it checks
``--strict`` and matches the evaluator and the numpy reference on both targets at ragged sizes.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import napkin_cat
from napkin_cat import finiteness, grad, kernel, proof
from napkin_cat.certify import certify_lemma
from napkin_cat.cost import cost
from napkin_cat.diagnostics import NapkinError
from napkin_cat.elaborate import load, loads
from napkin_cat.evaluate import evaluate
from napkin_cat.lower import lower
from napkin_cat.proof import check_file
from napkin_cat.terms import Diagram
from tests.test_elaborate import one_error

ROOT = Path(__file__).resolve().parent.parent
NAN, INF = math.nan, math.inf


def _one(text: str, name: str = "f") -> Diagram:
    return loads(text).diagram(name)


# ---- the box ------------------------------------------------------------------------------------


def test_floor_at_the_edges_is_numpys_and_keeps_the_infinities() -> None:
    """floor of negatives rounds away from 0, -0 stays a zero, ±inf and NaN pass through, a value
    past 2^52 is already an integer; floor(log(0)) is -inf and floor(log(-1)) NaN."""
    x = np.array([-2.5, -0.5, -0.0, 0.0, 0.25, 0.999999, 1.0, 2.5, 2.0**60 + 2048.0, -INF, INF, NAN])
    got = napkin_cat.run(_one("axis i\ndiagram f(X: [i]) -> [i] {\n  return floor(X)\n}\n"), x)
    want = [-3.0, -1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 2.0**60 + 2048.0, -INF, INF, NAN]
    np.testing.assert_array_equal(got, want)
    logs = napkin_cat.run(_one("axis i\ndiagram f(X: [i]) -> [i] {\n  return floor(log(X))\n}\n"),
                          np.array([0.0, -1.0, 1.0, 2.7, 7.5]))
    np.testing.assert_array_equal(logs, [-INF, NAN, 0.0, 0.0, 2.0])


def test_integer_floor_division_is_exact() -> None:
    """floor(i / c) is i // c for positions (a block id), negative ones included: in the
    evaluator for any c; in the f32 kernels where c is a power of two (the quotient is then exact;
    XLA's f32 division by 7 on CPU gives -4998 / 7 = -714.00006, whose floor is -715: README)."""
    for c in (7, 64):
        d = _one(f"axis i\ndiagram f(X: [i]) -> [i] {{\n  return X + floor(index[i](i - 5000) / {c})\n}}\n")
        want = (np.arange(20000) - 5000) // c
        np.testing.assert_array_equal(napkin_cat.run(d, np.zeros(20000)), want)
    fn = lower(kernel.refl("f", d), target="jax").fn
    np.testing.assert_array_equal(np.asarray(fn(jnp.zeros(20000, jnp.float32))), want)


def test_the_finiteness_rule_keeps_infinities_and_makes_small_positives_zero() -> None:
    """floor's classes: a positive below 1 becomes 0, a negative stays negative (at most -1), ±inf
    and NaN stay; so floor of a finite input is finite, and floor(log(X)) may be -inf or NaN."""
    d = _one("axis i\ndiagram f(X: [i]) -> [i], [i], [i] {\n"
             "  return floor(X), floor(log(abs(X))), floor(exp(X))\n}\n")
    defs, inputs = d.bindings(), finiteness.input_values(d.inputs)
    values = [finiteness._Analysis(defs, inputs).value(o) for o in d.outputs]
    assert values[0].classes == finiteness.FINITE and values[0].lo == 0.0
    assert values[1].classes == finiteness.FINITE | {"-inf"}
    assert values[2].classes == frozenset({"0", "+", "+inf"})  # exp overflows at 710; below 1 it floors to 0


def test_log_of_a_value_bounded_away_from_1_has_its_sign() -> None:
    """log(16) is positive (T5's log(max_distance / max_exact) as a divisor: no 0, so no NaN from
    -inf / 0), log(1/16) negative; log of a size (1 at |i| = 1) or of an input may be 0 (the
    analysis reads a size as any positive value from 1 up: a log of either sign)."""
    d = _one("axis i\ndiagram f(X: [i]) -> [], [], [], [i] {\n"
             "  return log(16), log(recip(16)), log(i), log(abs(X))\n}\n")
    defs, inputs = d.bindings(), finiteness.input_values(d.inputs)
    values = [finiteness._Analysis(defs, inputs).value(o).classes for o in d.outputs]
    assert values == [{"+"}, {"-"}, {"-", "0", "+"}, {"-", "0", "+", "-inf"}]


def test_floor_is_typed_an_integer_and_log_is_not() -> None:
    head = "axis q, r\n"
    ok = loads(head + "diagram f(T: [r], X: [q]) -> [q] {\n  return gather[r](T, floor(X * 3))\n}\n")
    assert ok.diagram("f").out_types == (("q",),)
    # a position from a log without floor, and a comparison of a real: located errors
    for body, col in [("diagram f(T: [r], X: [q]) -> [q] {\n  return gather[r](T, log(abs(X)))\n}\n", 10),
                      ("diagram f(X: [q]) -> [q] {\n  return lt(floor(X) + 0.5, 3)\n}\n", 10)]:
        found, line, column, _, _ = one_error(head + body)
        assert (found, line, column) == ("type.integer_needed", 3, col)
    # an `int` input of a called diagram takes a floor
    mod = loads(head + "diagram g(I: int [q]) -> [q] {\n  return I\n}\n"
                       "diagram f(X: [q]) -> [q] {\n  return g(floor(X))\n}\n")
    assert mod.diagram("f").out_types == (("q",),)


def test_floor_has_no_gradient() -> None:
    """The VJP treats floor as a constant (jax.grad's zero): d/dX of X·floor(X) is floor(X)."""
    d = _one("axis i\ndiagram f(X: [i]) -> [i] {\n  return X * floor(X)\n}\n")
    x = np.array([-1.5, 0.25, 2.75])
    dx = evaluate(grad.vjp(d), [x, np.ones(3)], sizes={"i": 3})
    np.testing.assert_array_equal(dx, np.floor(x))


def test_a_lemma_with_floor_is_refused_when_false_and_never_proved() -> None:
    """floor(2X) = 2 floor(X) fails at X = -0.41 (a witness is found); a true one
    (floor(X + 1) = floor(X) + 1) is tested, not proved, so --strict refuses its use; a floor of a
    size steps at every integer it crosses: refused as unbounded."""
    bad = loads("axis i\nlemma twice(X: [i]) : sum[i](floor(X * 2)) = sum[i](floor(X) * 2)\n").lemmas[0]
    cert = certify_lemma(bad)
    assert not cert.ok and "left side" in (cert.counterexample or ""), cert  # a witness such as X = -0.41
    good = loads("axis i\nlemma shift(X: [i]) : sum[i](floor(X + 1)) = sum[i](floor(X) + 1)\n").lemmas[0]
    cert = certify_lemma(good)
    assert cert.ok and cert.how.startswith("tested")
    sized = loads("axis i\nlemma blocks(X: [i]) : sum[i](X * floor(i / 30)) = sum[i](X * 0)\n").lemmas[0]
    cert = certify_lemma(sized)
    assert not cert.ok and "floor reads a size" in (cert.counterexample or "")


def test_mosaic_refuses_floor_with_a_reason() -> None:
    thm = {r.name: r.theorem for r in check_file(ROOT / "proofs" / "relative_bias.ncd")}["flash_t5_bucket_attention"]
    with pytest.raises(NapkinError) as info:
        lower(thm, target="mosaic", tiles={"gq": 64, "sx": 64}, dtype="bfloat16")
    assert info.value.diagnostics[0].code == "lower.mosaic"


def test_floor_costs_one_flop_per_element() -> None:
    d = _one("axis i\naxis j = 8\ndiagram f(X: [i j]) -> [i j] {\n  return floor(X)\n}\n")
    assert cost(kernel.refl("f", d), sizes={"i": 4}).flops == 32


# ---- T5 relative-position bias with the bucket in the diagram ------------------------------------


def _t5_bucket(relative: np.ndarray, buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """HF T5's bidirectional ``_relative_position_bucket`` of ``relative`` = key - query, in
    float32 as HF computes it (``relative_position.float()``)."""
    half = buckets // 2
    exact = half // 2
    distance = np.abs(relative)
    with np.errstate(divide="ignore"):
        scaled = (np.log(distance.astype(np.float32) / np.float32(exact)) / np.float32(math.log(max_distance / exact))
                  * np.float32(half - exact))
    large = np.minimum(exact + np.where(distance < exact, 0, scaled).astype(int), half - 1)
    return (relative > 0) * half + np.where(distance < exact, distance, large)


def test_the_bucket_in_the_diagram_is_hf_t5s_bucketing() -> None:
    """t5_bias of zero scores with T[r] = r gives each pair's bucket: HF's, at distances -1200 .. 1199."""
    bias = load(ROOT / "examples" / "masked_attention.ncd").diagram("t5_bias")
    got = napkin_cat.run(bias, np.zeros((1200, 1200)), np.arange(32.0))
    relative = np.arange(1200)[None, :] - np.arange(1200)[:, None]
    np.testing.assert_array_equal(got, _t5_bucket(relative))


def _softmax_rows(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("target", ["pallas", "jax"])
def test_the_t5_kernel_with_the_bucket_in_the_diagram_matches_t5(target: str) -> None:
    """At ragged sizes (133 queries, 150 keys, tiles of 32: distances past 128 on both sides), the
    kernel equals the evaluator and attention with HF's bias; the bias table's gradient is the
    scatter-add of the scores' cotangent (central differences of the numpy reference)."""
    thm = {r.name: r.theorem for r in check_file(ROOT / "proofs" / "relative_bias.ncd",
                                                 strict=True)}["flash_t5_bucket_attention"]
    rng = np.random.default_rng(11)
    q, x = 133, 150
    Q, K, V = rng.standard_normal((q, 64)), rng.standard_normal((x, 64)), rng.standard_normal((x, 64))
    table = rng.standard_normal(32)
    bias_at = _t5_bucket(np.arange(x)[None, :] - np.arange(q)[:, None])

    def reference(t: np.ndarray) -> np.ndarray:
        return _softmax_rows(Q @ K.T / 8.0 + t[bias_at]) @ V

    want = reference(table)
    assert np.abs(napkin_cat.run(thm.source, Q, K, V, table) - want).max() < 1e-12
    lowered = lower(thm, target=target, tiles={"gq": 32, "sx": 32})
    assert "jnp.floor(" in lowered.source
    extra = {"interpret": True} if target == "pallas" else {}
    args = [jnp.asarray(a, jnp.float32) for a in (Q, K, V, table)]
    assert np.abs(np.asarray(lowered.fn(*args, **extra)) - want).max() < 1e-5
    g = jax.grad(lambda t: lowered.fn(*args[:3], t, **extra).sum())(args[3])
    step = 1e-6
    numeric = [(reference(table + step * e).sum() - reference(table - step * e).sum()) / (2 * step)
               for e in np.eye(32)]
    assert np.abs(np.asarray(g) - np.array(numeric)).max() < 1e-4


# ---- index arithmetic in the kernels: int32, refused where it may wrap ---------------------------

_WIDE = """axis q, x
diagram f(S: [q x]) -> [q x] {
  return S + index[q x](x * 65536 * 65536)
}
diagram g(S: [q x]) -> [q] {
  return sum[x](where[q x](q * x * 65536 >= x * 65536, S, 0))
}
theorem wide: f {
  group q by gq
}
theorem masked: g {
  group q by gq
  stream x by sx via sum
}
diagram h(S: [q x]) -> [q] {
  return sum[x](where[q x](q * 150000000 - x >= 0 - q * 150000000, S, 0))
}
theorem spread: h {
  group q by gq
  stream x by sx via sum
}
"""


@pytest.mark.parametrize("target", ["jax", "pallas"])
def test_a_kernel_refuses_sizes_where_its_index_arithmetic_may_leave_int32(tmp_path: Path, target: str) -> None:
    """The kernels compute index arithmetic in int32, the evaluator in int64: x·65536·65536 is 2^32 at
    x = 1 in the evaluator and 0 in int32, and q·x·65536 is 2^16·q·x, past 2^31 from q·x = 2^15 on (a
    mask read wrongly, and chunk bounds too).  Both kernels computed the wrapped values silently; each now
    refuses such sizes when traced, and runs where every sub-expression fits (index_range)."""
    path = tmp_path / "wide.ncd"
    path.write_text(_WIDE)
    s = np.random.default_rng(0).standard_normal((40, 3))
    assert evaluate(_one(_WIDE), [s])[0, 1] == s[0, 1] + 2.0**32
    kw = {"interpret": True} if target == "pallas" else {}
    wide = lower(proof.theorem(path, "wide"), target=target, tiles={"gq": 16})
    with pytest.raises(ValueError, match="int32"):
        wide.fn(jnp.asarray(s, jnp.float32), **kw)
    masked = lower(proof.theorem(path, "masked"), target=target, tiles={"gq": 16, "sx": 16})
    with pytest.raises(ValueError, match="int32"):
        masked.fn(jnp.ones((200, 200), jnp.float32), **kw)
    small = np.random.default_rng(1).standard_normal((20, 5))  # q·x·65536 < 2^31 at every position (and padded one)
    np.testing.assert_allclose(masked.fn(jnp.asarray(small, jnp.float32), **kw),
                               evaluate(_one(_WIDE, "g"), [small]), rtol=1e-5, atol=1e-5)
    # each side of h's comparison is within int32 at q <= 9, but the chunk bounds sum its grid terms,
    # 3·10^8·q, which wrapped at q = 8 and 9: the plain-JAX kernel skipped every chunk of those rows
    spread = lower(proof.theorem(path, "spread"), target=target, tiles={"gq": 2 if target == "jax" else 16, "sx": 16})
    with pytest.raises(ValueError, match="int32"):
        spread.fn(jnp.ones((10, 40), jnp.float32), **kw)
    if target == "jax":  # at q <= 7 every bound fits (Pallas pads q to 16 blocks and refuses)
        rows = np.random.default_rng(2).standard_normal((7, 40))
        np.testing.assert_allclose(spread.fn(jnp.asarray(rows, jnp.float32)), evaluate(_one(_WIDE, "h"), [rows]),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["jax", "pallas"])
def test_a_kernel_refuses_ids_past_int32_that_it_would_wrap(target: str) -> None:
    """A kernel reads its `int` inputs as int32: a document id 2^32 was read as 0, so the query
    holding it saw document 0's keys where the evaluator's row is fully masked (0).  Called on a
    numpy array, the kernel refuses it; ±(2^31 - 1) and -2^31 are exact."""
    thm = proof.theorem(ROOT / "proofs" / "document_attention.ncd", "flash_document_attention")
    fn = lower(thm, target=target, tiles={"gq": 16, "sx": 16}).fn
    kw = {"interpret": True} if target == "pallas" else {}
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((3, 64)), rng.standard_normal((4, 64)), rng.standard_normal((4, 64))
    f32 = [jnp.asarray(a, jnp.float32) for a in (q, k, v)]
    with pytest.raises(ValueError, match="past int32"):
        fn(*f32, np.array([0, 2**32, 1]), np.array([0, 0, 1, 1]), **kw)
    dq, dx = np.array([0, 2**31 - 1, -2**31]), np.array([-2**31, 0, 2**31 - 1, 0])
    np.testing.assert_allclose(fn(*f32, dq, dx, **kw), evaluate(thm.source, [q, k, v, dq, dx]), rtol=1e-4, atol=1e-4)
