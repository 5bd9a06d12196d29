"""Measured approximation error of dtype steps (napkin_cat.certify.approximation) and how `napkin check`
holds a dtype step's `tol` to it."""

from __future__ import annotations

import numpy as np

from napkin_cat import kernel
from napkin_cat.certify import approximation
from napkin_cat.elaborate import loads
from napkin_cat.proof import check_module

# examples/attention.ncd's attention at d = 16, not 64: at d = 64 the measured bf16 error (0.0033)
# lies below bf16's unit roundoff (0.0039), so no tolerance would be refused by the measurement
ATTENTION = """
axis q, x
axis d = 16
diagram attention(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = contract[d](Q, K) * rsqrt(d)
  P = softmax[x](S)
  O = contract[x](P, V)
  return O
}
"""


def test_rounding_to_each_format() -> None:
    values = np.array([1 + 2.0**-9, 1 + 2.0**-8 + 2.0**-12, 1 + 2.0**-11, 1 + 2.0**-11 + 2.0**-20, 1e5, np.inf])
    np.testing.assert_array_equal(approximation.rounding("bf16")(values)[:4], [1, 1 + 2.0**-7, 1, 1])
    # TF32 keeps 10 mantissa bits, like f16, and rounds a tie to even; its range is f32's
    np.testing.assert_array_equal(approximation.rounding("tf32")(values),
                                  [1 + 2.0**-9, 1 + 2.0**-8, 1, 1 + 2.0**-10, 99968, np.inf])
    assert approximation.rounding("f16")(values)[4] == np.inf  # past f16's range
    assert np.isnan(approximation.rounding("fp8e4m3")(values)[4])  # e4m3fn has no inf
    assert approximation.rounding("fp8e5m2")(np.array([0.3]))[0] == 0.3125
    assert approximation.rounding("f64")(values)[0] == values[0]
    assert set(approximation._ROUND) == set(kernel.DTYPE_ROUNDOFF)  # every format the kernel admits


def _theorem(steps: str, source: str = ATTENTION) -> kernel.Theorem:
    module = loads(source + f"theorem t: attention {{\n{steps}\n}}\n")
    (result,) = check_module(module)
    assert result.theorem is not None, result.failure
    return result.theorem


def test_an_exact_format_measures_zero_and_narrow_ones_their_roundoff() -> None:
    assert approximation.measure(_theorem("  dtype K, V as f64 tol 1e-15")).error == 0.0
    bf16 = approximation.measure(_theorem("  dtype K, V as bf16 tol 0.5"))
    assert 2.0**-10 < bf16.error < 2.0**-5  # a few units of bf16 roundoff (2^-8) relative to max|O|
    f32 = approximation.measure(_theorem("  dtype K, V as f32 tol 0.5"))
    assert 0 < f32.error < 2.0**-20
    fp8 = approximation.measure(_theorem("  dtype Q, K, V as fp8e5m2 tol 0.5"))
    assert fp8.error > bf16.error > f32.error
    assert dict(bf16.sizes) == {"q": 64, "x": 64}
    assert str(bf16).startswith("measured ") and "at q=64, x=64" in str(bf16)


def test_a_rounded_binding_is_rounded_when_stored() -> None:
    """`dtype S as f16`: the scores are rounded, the inputs are not."""
    scores = approximation.measure(_theorem("  dtype S as f16 tol 0.5"))
    probabilities = approximation.measure(_theorem("  dtype P as f16 tol 0.5"))
    assert scores.error > 0 and probabilities.error > 0 and scores.error != probabilities.error


def test_sizes_shrink_until_every_box_fits() -> None:
    wide = """
axis b, h, q, x
axis d = 8
diagram attention(Q: [b h q d], K: [b h x d], V: [b h x d]) -> [b h q d] {
  return contract[x](softmax[x](contract[d](Q, K)), V)
}
"""
    found = approximation.measure(_theorem("  dtype K as bf16 tol 0.5", wide))
    assert dict(found.sizes) == {"b": 16, "h": 16, "q": 16, "x": 16}  # 16^4 * 8 = 2^19 <= MAX_POINTS < 32^4 * 8


def test_check_refuses_a_tolerance_below_the_measured_error_and_reports_it_otherwise() -> None:
    module = loads(ATTENTION + "theorem tight: attention {\n  dtype Q, K, V as bf16 tol 0.004\n}\n"
                   "theorem loose: attention {\n  dtype Q, K, V as bf16 tol 0.05\n}\n")
    tight, loose = check_module(module)
    assert tight.failure is not None and tight.step == 1
    assert tight.failure.message.startswith("dtype: tolerance 0.004 is below the error the rounding causes: "
                                            "measured 0.0")
    assert tight.failure.hint is not None and "at least the measured error" in tight.failure.hint
    assert loose.ok and "approximation: Q, K, V as bf16 tol 0.05 (tested: measured 0.0" in loose.summary()
    assert not check_module(module, strict=True)[1].ok  # a measured claim is not proved


def test_later_dtype_steps_are_measured_with_the_earlier_ones() -> None:
    """Each step's tol bounds the error of every rounding so far."""
    module = loads(ATTENTION + "theorem t: attention {\n  dtype K as f32 tol 1e-6\n  dtype V as bf16 tol 1e-6\n}\n")
    (result,) = check_module(module)
    assert result.step == 2 and result.failure is not None


def test_a_value_out_of_the_formats_range_is_an_infinite_error() -> None:
    """e4m3fn has no infinity: 1000 rounds to NaN where the source is finite."""
    source = "axis i\ndiagram attention(X: [i]) -> [i] {\n  Y = X * 1000\n  return Y + 1\n}\n"
    module = loads(source + "theorem t: attention {\n  dtype Y as fp8e4m3 tol 0.5\n}\n")
    (result,) = check_module(module)
    assert result.failure is not None and "measured inf" in result.failure.message


def test_split_and_rename_axes_get_sizes_that_agree() -> None:
    """A true claim through a split (and a rename onto a declared axis, and a split of one) is
    measured, not refused by the evaluator: equal sizes for every symbolic axis break
    |a| = |ao|·|ai|, and no power of two splits 12."""
    source = ("axis a, ao, ai, t, p, r\naxis d = 8\naxis e = 12\n"
              "diagram attention(X: [a d], Y: [t], Z: [e]) -> [ao ai d], [d], [p r] {\n"
              "  return split[a -> ao ai](X) * 2, rename[t -> d](Y), split[e -> p r](Z)\n}\n")
    module = loads(source + "theorem t: attention {\n  dtype X, Y, Z as bf16 tol 0.01\n}\n")
    (result,) = check_module(module)
    assert result.theorem is not None, result.failure
    found = approximation.measure(result.theorem)
    assert found.sizes["a"] == found.sizes["ao"] * found.sizes["ai"] and found.sizes["t"] == 8
    assert found.sizes["p"] * found.sizes["r"] == 12
    assert 0 < found.error <= 2.0**-8


def test_labels_read_by_onehot_are_drawn_as_positions() -> None:
    """Rounding labels to bf16 keeps integers below 256 exact: 0 error.  To fp8 e4m3 it moves
    17 to 16: a wrong class, an error of the order of the values themselves (the label reaches
    onehot through a binding)."""
    source = ("axis v = 40\ndiagram attention(L: [], W: [v]) -> [] {\n"
              "  M = L - 1\n  return contract[v](onehot[v](M), W)\n}\n")
    module = loads(source + "theorem exact: attention {\n  dtype L as bf16 tol 0.01\n}\n"
                            "theorem fp8: attention {\n  dtype L as fp8e4m3 tol 0.5\n}\n")
    exact, fp8 = check_module(module)
    assert exact.theorem is not None and approximation.measure(exact.theorem).error == 0.0
    assert fp8.failure is not None and "below the error the rounding causes" in fp8.failure.message


def test_a_topk_makes_positions_of_what_it_reads_not_labels() -> None:
    """A router's onehot reads the top-k positions of logits X·W: X and W are numbers, drawn
    normal (not as positions, which made the logits integers up to 7.6e4); a label read
    through arithmetic stays a label."""
    module = loads("axis e = 8\naxis k = 2\naxis t, d\n"
                   "diagram route(X: [t d], W: [d e], L: [t]) -> [t e], [t e] {\n"
                   "  M = sum[k](onehot[e](topk[e -> k](contract[d](X, W))))\n"
                   "  return M, onehot[e](L + 1)\n}\n")
    assert approximation.label_inputs(module.diagram("route")) == {"L": "e"}


def test_sizes_too_large_to_evaluate_refuse_the_step_with_a_reason() -> None:
    """2^15 x 2^15 declared is 2^30 points (8 GiB in float64): not measured, so not vouched for."""
    source = "axis n = 32768\naxis m = 32768\ndiagram attention(A: [n], B: [m]) -> [] {\n  return sum[n m](A * B)\n}\n"
    (result,) = check_module(loads(source + "theorem t: attention {\n  dtype A as bf16 tol 0.01\n}\n"))
    assert result.failure is not None and result.step == 1 and result.failure.span is not None
    assert result.failure.message.startswith("dtype: the tolerance cannot be measured: the declared sizes give "
                                             "1.07e+09 points over [n m]")
