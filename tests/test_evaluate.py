"""Every primitive box against a hand-written numpy reference, over hypothesis-drawn sizes
and values; awkward inputs (huge logits, -inf masks, all-zero rows); weaving; size binding
and its error messages; the sympy algebra agreeing with float64."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import sympy
from hypothesis import example, given
from hypothesis import strategies as st
from scipy import special

from napkin_cat import ops, run
from napkin_cat.diagnostics import NapkinError
from napkin_cat.elaborate import loads
from napkin_cat.evaluate import FLOAT64, SYMBOLIC, Named, evaluate, evaluate_named
from napkin_cat.terms import Diagram, Module
from tests.strategies import FINITE, SIZE_REFUSALS, input_arrays, modules, sizes_for

AXES = "axis i, j, k\naxis p, r\n"
POSITIVE = st.floats(0.05, 8.0)
NONZERO = st.one_of(st.floats(-8.0, -0.05), st.floats(0.05, 8.0))


@functools.cache
def diagram(signature: str, body: str) -> Diagram:
    """A one-line diagram ``f`` over the axes i, j, k, p, r (all symbolic)."""
    return loads(f"{AXES}diagram f{signature} {{\n  return {body}\n}}\n").diagram("f")


def check(data: st.DataObject, d: Diagram, reference: Callable[..., Any],
          elements: st.SearchStrategy[float] = FINITE, rtol: float = 1e-9) -> None:
    """Draw sizes then inputs for ``d``; compare ``d.evaluate`` with ``reference``."""
    sizes = data.draw(sizes_for(d))
    arrays = data.draw(input_arrays(d, sizes, elements))
    got = run(d, *arrays)
    want = reference(*arrays)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-12)
    assert np.shape(got) == tuple(sizes[a] for a in d.out_types[0])


# ---- elementwise boxes --------------------------------------------------------------------

UNARY_REFERENCE: dict[str, tuple[Callable[[np.ndarray], np.ndarray], st.SearchStrategy[float]]] = {
    "exp": (np.exp, FINITE),
    "log": (np.log, POSITIVE),
    "neg": (lambda x: -x, FINITE),
    "sqrt": (np.sqrt, POSITIVE),
    "rsqrt": (lambda x: 1 / np.sqrt(x), POSITIVE),
    "recip": (lambda x: 1 / x, NONZERO),
    "square": (lambda x: x * x, FINITE),
    "abs": (np.abs, FINITE),
    "tanh": (np.tanh, FINITE),
    "sigmoid": (lambda x: 1 / (1 + np.exp(-x)), FINITE),
    "relu": (lambda x: np.where(x > 0, x, 0.0), FINITE),
    "gelu": (lambda x: 0.5 * x * (1 + special.erf(x / math.sqrt(2))), FINITE),
    "silu": (lambda x: x / (1 + np.exp(-x)), FINITE),
    "sign": (lambda x: np.where(x > 0, 1.0, np.where(x < 0, -1.0, 0.0)), FINITE),
    "floor": (lambda x: np.array([math.floor(v) for v in np.ravel(x)], dtype=float).reshape(np.shape(x)), FINITE),
}


def test_every_unary_op_has_a_reference() -> None:
    assert set(UNARY_REFERENCE) == set(ops.UNARY)


@pytest.mark.parametrize("op", sorted(ops.UNARY))
@given(data=st.data())
def test_unary(op: str, data: st.DataObject) -> None:
    reference, domain = UNARY_REFERENCE[op]
    check(data, diagram("(X: [i j]) -> [i j]", f"{op}(X)"), reference, domain)


BINARY_REFERENCE: dict[str, tuple[str, Callable[[Any, Any], Any]]] = {
    "add": ("X + Y", np.add),
    "sub": ("X - Y", np.subtract),
    "mul": ("X * Y", np.multiply),
    "div": ("X / Y", np.divide),
    "maximum": ("max(X, Y)", np.maximum),
    "minimum": ("min(X, Y)", np.minimum),
}


@pytest.mark.parametrize("op", sorted(ops.BINARY))
@given(data=st.data())
def test_binary_broadcasts_by_name(op: str, data: st.DataObject) -> None:
    text, fn = BINARY_REFERENCE[op]
    # X: [i j] and Y: [k j] meet on j; the result carries i, j, k
    d = diagram("(X: [i j], Y: [k j]) -> [i j k]", text)
    check(data, d, lambda x, y: fn(x[:, :, None], y.T[None, :, :]), NONZERO)


@given(data=st.data())
def test_constants_and_sizes(data: st.DataObject) -> None:
    d = diagram("(X: [i j]) -> [i j]", "X * rsqrt(j) + 2.5 - -1")
    sizes = data.draw(sizes_for(d))
    (x,) = data.draw(input_arrays(d, sizes))
    np.testing.assert_allclose(run(d, x), x / math.sqrt(sizes["j"]) + 3.5, rtol=1e-12)


# ---- reductions and normalisations ------------------------------------------------------------

REDUCE_REFERENCE: dict[str, Callable[..., Any]] = {
    "sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod, "mean": np.mean, "logsumexp": special.logsumexp,
}
NORMALISE_REFERENCE: dict[str, Callable[[np.ndarray, tuple[int, ...]], np.ndarray]] = {
    "softmax": lambda x, ax: np.exp(x - x.max(ax, keepdims=True)) / np.exp(x - x.max(ax, keepdims=True)).sum(
        ax, keepdims=True),
    "l2norm": lambda x, ax: x / np.sqrt((x * x).sum(ax, keepdims=True)),
    "rmsnorm": lambda x, ax: x / np.sqrt((x * x).mean(ax, keepdims=True)),
}
TARGETS = {"j": (1,), "i k": (0, 2), "i j k": (0, 1, 2)}


def test_every_reduction_and_normalisation_has_a_reference() -> None:
    assert set(REDUCE_REFERENCE) | set(NORMALISE_REFERENCE) == {
        name for name, info in ops.OPS.items() if info.kind in ("reduce", "normalise")}


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("op", sorted(REDUCE_REFERENCE))
@given(data=st.data())
def test_reduce(op: str, target: str, data: st.DataObject) -> None:
    kept = " ".join(a for a in "ijk" if a not in target.split())
    d = diagram(f"(X: [i j k]) -> [{kept}]", f"{op}[{target}](X)")
    check(data, d, lambda x: REDUCE_REFERENCE[op](x, axis=TARGETS[target]), st.floats(-3.0, 3.0, width=32))


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("op", sorted(NORMALISE_REFERENCE))
@given(data=st.data())
def test_normalise(op: str, target: str, data: st.DataObject) -> None:
    d = diagram("(X: [i j k]) -> [i j k]", f"{op}[{target}](X)")
    check(data, d, lambda x: NORMALISE_REFERENCE[op](x, TARGETS[target]), NONZERO)


@given(x=st.lists(st.floats(-1e300, 1e300), min_size=1, max_size=6))
@example(x=[0.0, -11.0])  # log(1 + e^-11) lost 11 digits to cancellation (found by the dev profile)
def test_huge_logits_stay_finite(x: list[float]) -> None:
    """The float64 evaluator itself (``evaluate``: ``run`` takes float32's range only)."""
    row = np.array([x])
    p = evaluate(diagram("(X: [i j]) -> [i j]", "softmax[j](X)"), [row])
    lse = evaluate(diagram("(X: [i j]) -> [i]", "logsumexp[j](X)"), [row])
    assert np.all(np.isfinite(p)) and np.isfinite(lse).all()
    np.testing.assert_allclose(p.sum(), 1.0, rtol=1e-12)
    np.testing.assert_allclose(lse, special.logsumexp(row, axis=1), rtol=1e-12)
    assert lse[0] >= row.max()


def test_masked_rows_follow_the_documented_conventions() -> None:
    """A -inf entry gets weight 0; a fully masked row gives softmax 0 and logsumexp -inf."""
    s = np.array([[0.5, -np.inf, 1.5], [-np.inf, -np.inf, -np.inf]])
    p = run(diagram("(X: [i j]) -> [i j]", "softmax[j](X)"), s)
    e = np.exp([0.5, 1.5])
    np.testing.assert_allclose(p, [[e[0] / e.sum(), 0.0, e[1] / e.sum()], [0.0, 0.0, 0.0]])
    lse = run(diagram("(X: [i j]) -> [i]", "logsumexp[j](X)"), s)
    np.testing.assert_allclose(lse, [np.log(e.sum()), -np.inf])
    v = np.arange(6.0).reshape(3, 2)
    o = run(diagram("(S: [i j], V: [j k]) -> [i k]", "ncontract[j; exp, exp, id](S, V)"), s, v)
    np.testing.assert_allclose(o, [p[0] @ v, [0.0, 0.0]])


@pytest.mark.parametrize("finite", [1.0, 100.0, 800.0])
def test_a_row_holding_plus_inf_is_nan_under_softmax_at_every_magnitude(finite: float) -> None:
    """softmax is exp(s - max) / Σ exp(s - max) (ops.OPS): a row whose maximum is +inf has
    exp(inf - inf) = NaN in its sum, so it is NaN throughout, and logsumexp is +inf.  The shift
    was once 0 for any non-finite maximum: the finite entries then read exp(s) / inf, 0 beside
    scores of 1 or 100 and NaN past 709, so the lemma softmax_shift's sides (S - c at c = -700,
    a finite c) disagreed."""
    s = np.array([[finite, np.inf, 1.0], [2.0, 0.5, -np.inf]])
    d = diagram("(X: [i j]) -> [i j]", "softmax[j](X)")
    shifted = diagram("(X: [i j], c: []) -> [i j]", "softmax[j](X - c)")
    p = evaluate(d, [s])
    assert np.isnan(p[0]).all() and np.isfinite(p[1]).all()
    np.testing.assert_array_equal(evaluate(shifted, [s, np.array(-700.0)]), p)
    assert evaluate(diagram("(X: [i j]) -> [i]", "logsumexp[j](X)"), [s])[0] == np.inf
    o = evaluate(diagram("(S: [i j], V: [j k]) -> [i k]", "ncontract[j; exp, exp, id](S, V)"), [s, np.ones((3, 2))])
    assert np.isnan(o[0]).all() and np.isfinite(o[1]).all()


def test_zero_rows_normalise_to_zero() -> None:
    x = np.array([[0.0, 0.0], [3.0, 4.0]])
    for op, scale in (("l2norm", 5.0), ("rmsnorm", math.sqrt(12.5))):
        got = run(diagram("(X: [i j]) -> [i j]", f"{op}[j](X)"), x)
        np.testing.assert_allclose(got, [[0.0, 0.0], [3.0 / scale, 4.0 / scale]])


# ---- contractions ---------------------------------------------------------------------------------

CONTRACTIONS = {
    "contract[j](X, Y)": ("(X: [i j], Y: [j k]) -> [i k]", "ij,jk->ik"),
    "contract[](X, Y)": ("(X: [i j], Y: [j k]) -> [i j k]", "ij,jk->ijk"),
    "contract[i j](X, Y)": ("(X: [i j], Y: [j k]) -> [k]", "ij,jk->k"),
    "contract[j k](X, Y, Z)": ("(X: [i j], Y: [j k], Z: [k i]) -> [i]", "ij,jk,ki->i"),
    "contract[i](X)": ("(X: [i j], Y: [j k]) -> [j]", "ij->j"),
}


@pytest.mark.parametrize("body", sorted(CONTRACTIONS))
@given(data=st.data())
def test_contract(body: str, data: st.DataObject) -> None:
    signature, spec = CONTRACTIONS[body]
    d = diagram(signature, body)
    n_inputs = spec.split("->")[0].count(",") + 1
    check(data, d, lambda *xs: np.einsum(spec, *xs[:n_inputs]))


NCONTRACT_WEIGHTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exp, exp, id": lambda s: np.exp(s - s.max(1, keepdims=True)) / np.exp(s - s.max(1, keepdims=True)).sum(
        1, keepdims=True),
    "id, square, sqrt": lambda s: s / np.sqrt((s * s).sum(1, keepdims=True)),
    "id, square, rms": lambda s: s / np.sqrt((s * s).mean(1, keepdims=True)),
    "sigmoid, abs, id": lambda s: special.expit(s) / np.abs(s).sum(1, keepdims=True),
    # not shift invariant: the evaluator shifted these by the row's maximum as for softmax, giving
    # exp(-max/2) times the weights (1.414 for 2.747e130 at a row [600, 600] under sqrt)
    "exp, exp, sqrt": lambda s: np.exp(s) / np.sqrt(np.exp(s).sum(1, keepdims=True)),
    "exp, exp, rms": lambda s: np.exp(s) / np.sqrt(np.exp(s).mean(1, keepdims=True)),
}


@pytest.mark.parametrize("params", sorted(NCONTRACT_WEIGHTS))
@given(data=st.data())
def test_ncontract(params: str, data: st.DataObject) -> None:
    d = diagram("(S: [i j], V: [j k]) -> [i k]", f"ncontract[j; {params}](S, V)")
    check(data, d, lambda s, v: NCONTRACT_WEIGHTS[params](s) @ v, NONZERO)


# ---- index boxes, masks and reshaping -------------------------------------------------------------

PREDICATES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "i >= j": lambda i, j: i >= j,
    "i - j < 2 and not i == j": lambda i, j: (i - j < 2) & (i != j),
    "2 * i + 1 != j or j <= 0": lambda i, j: (2 * i + 1 != j) | (j <= 0),
}


@pytest.mark.parametrize("pred", sorted(PREDICATES))
@given(data=st.data())
def test_where_with_index_predicates(pred: str, data: st.DataObject) -> None:
    # Y lacks i: it is shared along i; the result carries i and j
    d = diagram("(X: [i j], Y: [j]) -> [i j]", f"where[i j]({pred}, X, Y)")

    def reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        i, j = np.indices(x.shape)
        return np.where(PREDICATES[pred](i, j), x, y[None, :])

    check(data, d, reference)


@given(data=st.data())
def test_index(data: st.DataObject) -> None:
    d = diagram("(X: [i j]) -> [i j]", "X + index[i j](i - 2 * j + 3)")
    check(data, d, lambda x: x + np.indices(x.shape)[0] - 2 * np.indices(x.shape)[1] + 3)


def test_index_arithmetic_of_integers_alone_is_int64() -> None:
    # positions and index arithmetic are int64, which wraps past 2^63 (finiteness.INDEX bounds an index
    # value by 2^63): integers multiplied with no position in between wrap too, rather than growing as
    # Python integers past float64 (2^62 to the ninth power was 2^558, its square inf)
    d = diagram("(X: [i]) -> [i]", "X + index[i](4611686018427387904 * 4 + 5 * 3)")
    np.testing.assert_array_equal(run(d, np.zeros(3)), [15.0, 15.0, 15.0])
    d = diagram("(X: [i]) -> [i]", "where[i](4611686018427387904 * 4 == 0, X, 0 * X)")
    np.testing.assert_array_equal(run(d, np.ones(2)), [1.0, 1.0])


@given(data=st.data())
def test_onehot(data: st.DataObject) -> None:
    d = diagram("(L: [i], X: [i k]) -> [i k]", "onehot[k](L) + 0 * X")
    sizes = data.draw(sizes_for(d))
    labels = data.draw(st.lists(st.integers(0, sizes["k"] - 1), min_size=sizes["i"], max_size=sizes["i"]))
    x = np.zeros((sizes["i"], sizes["k"]))
    np.testing.assert_array_equal(run(d, np.array(labels, dtype=float), x), np.eye(sizes["k"])[labels])


def test_onehot_of_a_value_that_is_no_position_is_a_zero_row() -> None:
    d = diagram("(L: [i]) -> [i k]", "onehot[k](L)")
    np.testing.assert_array_equal(run(d, np.array([1.0, 0.5, -1.0, 3.0]), sizes={"k": 3}),
                                  [[0, 1, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]])


@given(data=st.data())
def test_split_join_inverse(data: st.DataObject) -> None:
    d = loads(AXES + "axis io = 2, ii\n"
              "diagram s(X: [k i j]) -> [k io ii j] { return split[i -> io ii](X) }\n"
              "diagram sj(X: [k i j]) -> [k i j] { return join[io ii -> i](split[i -> io ii](X)) }\n")
    sizes = data.draw(st.fixed_dictionaries({"k": st.integers(1, 3), "i": st.sampled_from([2, 4, 6]),
                                             "j": st.integers(1, 3)}))
    x = data.draw(input_arrays(d.diagram("sj"), sizes))[0]
    np.testing.assert_array_equal(run(d.diagram("sj"), x), x)
    # io is major: position i = io * |ii| + ii
    np.testing.assert_array_equal(run(d.diagram("s"), x), x.reshape(sizes["k"], 2, sizes["i"] // 2, -1))


def test_split_of_an_indivisible_axis_is_an_error() -> None:
    d = loads(AXES + "axis io = 2, ii\ndiagram s(X: [i]) -> [io ii] { return split[i -> io ii](X) }\n")
    with pytest.raises(NapkinError, match=r"split\[i -> io ii\]: sizes 2 x \? do not multiply to 3"):
        run(d.diagram("s"), np.zeros(3))


@given(data=st.data())
def test_rename_and_transpose(data: st.DataObject) -> None:
    d = diagram("(X: [i j], Y: [k]) -> [k i]", "contract[j](rename[j -> k](X) * Y, transpose[j i](X))")
    # rename[j -> k] makes X's second axis k, so k and j have the same size
    sizes = data.draw(sizes_for(d))
    sizes["k"] = sizes["j"]
    x, y = data.draw(input_arrays(d, sizes))
    expected = np.einsum("ik,ij->ki", x * y[None, :], x)
    np.testing.assert_allclose(run(d, x, y), expected, rtol=1e-10, atol=1e-12)


# ---- weaving ------------------------------------------------------------------------------------

WOVEN = AXES + """
diagram norm(X: [j], W: [j]) -> [j] { return softmax[j](X) * W }
diagram woven(X: [p r j], W: [r j]) -> [p r j] { return norm(X, W) }
"""


@given(data=st.data())
def test_a_diagram_is_woven_over_extra_axes_and_shares_inputs_that_lack_them(data: st.DataObject) -> None:
    d = loads(WOVEN).diagram("woven")
    check(data, d, lambda x, w: NORMALISE_REFERENCE["softmax"](x, (2,)) * w[None])


def test_weaving_nests_through_calls_inside_woven_diagrams() -> None:
    m = loads(AXES + "diagram f(X: [j]) -> [j] { return softmax[j](X) }\n"
                     "diagram g(X: [i j]) -> [i j] { return f(X) * index[i](i) }\n"
                     "diagram h(X: [p i j]) -> [p i j] { return g(X) }\n")
    x = np.random.default_rng(3).standard_normal((2, 3, 4))
    expected = NORMALISE_REFERENCE["softmax"](x, (2,)) * np.arange(3)[None, :, None]
    np.testing.assert_allclose(run(m.diagram("h"), x), expected, rtol=1e-12)


def test_an_output_independent_of_a_woven_axis_is_repeated_along_it() -> None:
    m = loads(AXES + "diagram c(X: [j]) -> [], [j] { return 2.5, sum[i](index[i j](i + j)) }\n"
                     "diagram w(X: [p j]) -> [p], [p j] { A, B = c(X)\n return A, B }\n")
    a, b = run(m.diagram("w"), np.zeros((2, 3)), sizes={"i": 4})
    np.testing.assert_array_equal(a, [2.5, 2.5])
    np.testing.assert_array_equal(b, np.broadcast_to(6 + 4 * np.arange(3.0), (2, 3)))


def test_woven_outputs_put_the_woven_axes_first() -> None:
    m = loads(AXES + "diagram t(X: [i]) -> [i], [] { return X, sum[i](X) }\n"
                     "diagram w(X: [i p]) -> [p i], [p] { A, B = t(X)\n return A, B }\n")
    a, b = run(m.diagram("w"), np.arange(6.0).reshape(3, 2))
    np.testing.assert_array_equal(a, np.arange(6.0).reshape(3, 2).T)
    np.testing.assert_array_equal(b, [6.0, 9.0])


# ---- sizes bind from arrays; mismatches name the axis ------------------------------------------------

SIZED = "axis i, j\naxis d = 3\ndiagram f(X: [i d], Y: [i j]) -> [d j] { return contract[i](X, Y) }\n"


def test_symbolic_sizes_bind_from_the_arrays() -> None:
    d = loads(SIZED).diagram("f")
    assert run(d, np.ones((4, 3)), np.ones((4, 5))).shape == (3, 5)
    assert run(d, np.ones((1, 3)), np.ones((1, 2))).shape == (3, 2)


@pytest.mark.parametrize(("arrays", "sizes", "message"), [
    ((np.ones((4, 3)), np.ones((5, 2))), None, "axis `i` has size 4 but input `Y` has 5 along it"),
    ((np.ones((4, 2)), np.ones((4, 2))), None, "axis `d` has size 3 but input `X` has 2 along it"),
    ((np.ones((4, 3)), np.ones(4)), None, r"input `Y` must have 2 axes \[i j\], got an array of shape \(4,\)"),
    ((np.ones((4, 3)),), None, "`f` takes 2 inputs, got 1"),
    ((np.ones((4, 3)), np.ones((4, 2))), {"i": 5}, "axis `i` has size 5 but input `X` has 4 along it"),
    ((np.ones((4, 3)), np.ones((4, 2))), {"d": 4}, "axis `d` has size 3 but input `sizes=` has 4"),
    ((np.ones((4, 3)), np.ones((4, 2))), {"j": 0}, "size for axis `j` must be a positive integer, got 0"),
])
def test_size_mismatches_name_the_axis(arrays: tuple[np.ndarray, ...], sizes: dict[str, int] | None,
                                       message: str) -> None:
    with pytest.raises(NapkinError, match=message):
        run(loads(SIZED).diagram("f"), *arrays, sizes=sizes)


def test_rename_onto_an_axis_of_another_size_names_the_axis() -> None:
    d = diagram("(X: [i j], Y: [k]) -> [i k]", "rename[j -> k](X) * Y")
    with pytest.raises(NapkinError, match=r"axis `k` has size 4 but input `rename\[j -> k\]` has 3 along it"):
        run(d, np.ones((2, 3)), np.ones(4))


def test_an_axis_no_input_carries_needs_a_size() -> None:
    d = loads("axis i, j\ndiagram f(X: [i]) -> [i j] { return X + index[j](j) }\n").diagram("f")
    with pytest.raises(NapkinError, match=r"axis `j` has no size: give it with sizes=\{'j': N\}"):
        run(d, np.ones(2))
    np.testing.assert_array_equal(run(d, np.ones(2), sizes={"j": 3}), [[1, 2, 3], [1, 2, 3]])



@given(modules(max_diagrams=2), st.data())
def test_generated_diagrams_do_not_depend_on_how_their_inputs_are_laid_out(module: Module,
                                                                          data: st.DataObject) -> None:
    """Axes are names, not positions: the same inputs with their axes stored in another order
    give the same outputs exactly, through every box, weaving and call of a random module."""
    for d in module.diagrams:
        sizes = data.draw(sizes_for(d, max_size=3))
        arrays = data.draw(input_arrays(d, sizes))
        try:
            want = evaluate_named(d, [Named(p.axes, a) for p, a in zip(d.inputs, arrays, strict=True)], sizes)
        except NapkinError as exc:  # sizes a rename or split cannot honour (declared apart)
            assert set(exc.codes) <= SIZE_REFUSALS, exc.diagnostics
            continue
        moved = []
        for p, a in zip(d.inputs, arrays, strict=True):
            order = data.draw(st.permutations(range(a.ndim)))
            moved.append(Named(tuple(p.axes[i] for i in order), np.transpose(a, order)))
        got = evaluate_named(d, moved, sizes)
        for w, g, axes in zip(want, got, d.out_types, strict=True):
            assert g.axes == w.axes == axes
            np.testing.assert_array_equal(g.data, w.data)

# ---- the sympy algebra is the same fold -------------------------------------------------------------

SYMBOLIC_CASES = [
    ("(X: [i j]) -> [i j]", " + ".join(f"{op}(X)" for op in sorted(ops.UNARY))),
    ("(X: [i j], Y: [j]) -> [i j]", "max(X, Y) - min(X, Y) * X / Y"),
    ("(X: [i j], Y: [j]) -> [i]", " + ".join(f"{op}[j](X)" for op in sorted(REDUCE_REFERENCE))),
    ("(X: [i j], Y: [j]) -> [i j]", "softmax[j](X) + l2norm[j](X) + rmsnorm[i j](X)"),
    ("(X: [i j], Y: [j]) -> [i]", "contract[j](X, Y) + contract[j](ncontract[i; exp, exp, id](X, Y), X)"),
    ("(X: [i j], Y: [j]) -> [i j]", "where[i j](i >= j, X, Y) + index[i j](i * j) + onehot[j](index[i](i))"),
]


@pytest.mark.parametrize(("signature", "body"), SYMBOLIC_CASES)
def test_symbolic_algebra_agrees_with_float64(signature: str, body: str) -> None:
    d = diagram(signature, body)
    rng = np.random.default_rng(7)
    sizes = {"i": 2, "j": 3}  # unequal, so a count or broadcast taken along the wrong axis shows
    arrays = [rng.uniform(0.5, 2.0, size=[sizes[a] for a in p.axes]) for p in d.inputs]
    exact = [np.vectorize(lambda v: sympy.Rational(v).limit_denominator(1000), otypes=[object])(a) for a in arrays]
    floats = evaluate(d, [e.astype(float) for e in exact], algebra=FLOAT64)
    symbolic = evaluate(d, exact, algebra=SYMBOLIC)
    np.testing.assert_allclose(np.vectorize(lambda e: float(sympy.N(e)))(symbolic), floats, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("value", [1e39, -3.5e38, 1e-300, -5e-324])
def test_run_refuses_a_magnitude_float32_cannot_hold(value: float) -> None:
    """The domain's inputs are float32's (README "The domain"): ``run`` refuses a finite entry
    outside it, naming the input, the value and where; ``evaluate`` computes it in float64."""
    d = diagram("(X: [i]) -> [i]", "X * 2.0")
    x = np.array([1.0, 0.0, value])
    with pytest.raises(NapkinError) as info:
        run(d, x)
    assert info.value.codes == ("eval.range",)
    assert "input `X`" in info.value.diagnostics[0].message and "at [2]" in info.value.diagnostics[0].message
    np.testing.assert_array_equal(evaluate(d, [x]), x * 2.0)


def test_run_takes_the_ends_of_float32s_range_and_the_infinities() -> None:
    d = diagram("(X: [i]) -> [i]", "X * 1.0")
    x = np.array([2.0**128, -(2.0**-149), 0.0, -0.0, -np.inf, np.inf, float(np.finfo(np.float32).max)])
    np.testing.assert_array_equal(run(d, x), x)


def test_a_gather_at_a_nan_position_reads_nan() -> None:
    """Integer arithmetic past float64's range gives NaN positions (inf - inf); the gather read
    them as int64's minimum and raised an IndexError.  A NaN position reads NaN; others clamp."""
    d = loads("axis n, k, j\ndiagram f(T: [n], J: int [k], I: int [j]) -> [j] {\n"
              "  return gather[n](T, I + prod[k](J) - prod[k](J))\n}\n").diagram("f")
    table = np.arange(4.0)
    np.testing.assert_array_equal(run(d, table, np.full(9, 2.0**127), np.array([0.0, 1.0])), [np.nan, np.nan])
    np.testing.assert_array_equal(run(d, table, np.full(9, 2.0), np.array([-3.0, 9.0])), [0.0, 3.0])


@pytest.mark.parametrize("algebra", [FLOAT64, SYMBOLIC], ids=["float64", "symbolic"])
@pytest.mark.parametrize("length", [1, 3])
def test_a_scan_keeps_the_axes_of_its_decay_at_every_length(algebra: Any, length: int) -> None:
    """``linrec[a](D, X)`` with a decay D of an axis X lacks (w): over one position the value is X[0]
    alone, but its type is [w b a]; the evaluator returned the axis at extent 1 (found by
    tests/test_kernel.py's unfold property, a caller woven over w), so the unfolded caller lost w."""
    d = loads("axis a, b, w\ndiagram g(D: [w b], X: [a b]) -> [w b a] {\n  return linrec[a](D, X)\n}").diagrams[0]
    decay, x = np.full((2, 3), 0.5), np.arange(1.0, 1.0 + 3 * length).reshape(length, 3)
    if algebra is SYMBOLIC:
        decay, x = decay.astype(object), x.astype(object)
    (out,) = evaluate_named(d, [Named(("w", "b"), decay), Named(("a", "b"), x)], {"a": length, "b": 3, "w": 2},
                            algebra=algebra)
    got = np.asarray(out.to(("w", "b", "a")), dtype=np.float64)
    want = np.zeros((2, 3, length))
    for t in range(length):
        want[:, :, t] = x[t].astype(np.float64) + (0.5 * want[:, :, t - 1] if t else 0.0)
    assert got.shape == (2, 3, length)
    np.testing.assert_allclose(got, want)
