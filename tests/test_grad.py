"""Reverse mode on diagrams (napkin_cat.grad): the VJP diagram is checked against central
finite differences of the float64 evaluator and against ``jax.grad`` of the diagram lowered
to plain JAX, on random modules (tests/strategies.py) and on every example; it prints as
.ncd that elaborates to the same diagram; non-differentiable points take jax's values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from napkin_cat import kernel, load, loads
from napkin_cat.certify.approximation import label_inputs
from napkin_cat.cli import main
from napkin_cat.diagnostics import NapkinError
from napkin_cat.evaluate import evaluate, sample_integers
from napkin_cat.grad import cotangent_names, vjp, vjp_module
from napkin_cat.lower import lower
from napkin_cat.printer import print_module
from napkin_cat.terms import Diagram
from tests.lower_cases import as_tuple
from tests.strategies import BROADCAST_SIZES, SIZE_REFUSALS, broadcast_texts, modules, sizes_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.ncd"))


def _random(diagram: Diagram, sizes: dict[str, int], seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Standard normal inputs and output cotangents: ties and kinks have probability 0; `int`
    inputs (segment ids, lengths, pages) hold small sorted integers."""
    rng = np.random.default_rng(seed)
    xs = [(sample_integers if p.integer else lambda r, s: r.standard_normal(s))(rng, [sizes[a] for a in p.axes])
          for p in diagram.inputs]
    cts = [rng.standard_normal([sizes[a] for a in t]) for t in diagram.out_types]
    return xs, cts


def _gradients(diagram: Diagram, xs: list[np.ndarray], cts: list[np.ndarray],
               sizes: dict[str, int]) -> tuple[np.ndarray, ...]:
    return as_tuple(evaluate(vjp(diagram), [*xs, *cts], sizes=sizes))


def _loss(diagram: Diagram, xs: list[np.ndarray], cts: list[np.ndarray], sizes: dict[str, int]) -> float:
    outs = as_tuple(evaluate(diagram, xs, sizes=sizes))
    return float(sum(np.sum(o * c) for o, c in zip(outs, cts, strict=True)))


def _directional(diagram: Diagram, xs: list[np.ndarray], cts: list[np.ndarray], sizes: dict[str, int],
                 direction: list[np.ndarray], h: float) -> float:
    plus = _loss(diagram, [x + h * v for x, v in zip(xs, direction, strict=True)], cts, sizes)
    minus = _loss(diagram, [x - h * v for x, v in zip(xs, direction, strict=True)], cts, sizes)
    return (plus - minus) / (2 * h)


def _sized(diagram: Diagram, sizes: dict[str, int]) -> bool:
    try:
        evaluate(diagram, _random(diagram, sizes, 0)[0], sizes=sizes)
    except NapkinError as exc:
        assert set(exc.codes) <= SIZE_REFUSALS, exc
        return False
    return True


@settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data(), module=modules(max_diagrams=2))
def test_vjp_of_random_diagrams_matches_finite_differences(data: st.DataObject, module: Any) -> None:
    """⟨∇, v⟩ from the VJP diagram equals the central difference of Σ⟨cotangent, output⟩ along
    a random v, where the function is smooth there (two step sizes agree)."""
    diagram = data.draw(st.sampled_from(module.diagrams))
    sizes = data.draw(sizes_for(diagram, 1, 3))
    assume(_sized(diagram, sizes))
    xs, cts = _random(diagram, sizes, data.draw(st.integers(0, 2**32 - 1)))
    with np.errstate(all="ignore"):
        grads = _gradients(diagram, xs, cts, sizes)
        assume(np.isfinite(_loss(diagram, xs, cts, sizes)))
        direction = [np.random.default_rng(1).standard_normal(x.shape) for x in xs]
        coarse = _directional(diagram, xs, cts, sizes, direction, 1e-4)
        fine = _directional(diagram, xs, cts, sizes, direction, 1e-5)
    for g, p in zip(grads, diagram.inputs, strict=True):
        assert g.shape == tuple(sizes[a] for a in p.axes)
    terms = [g * v for g, v in zip(grads, direction, strict=True)]
    assume(all(np.all(np.isfinite(t)) for t in terms))
    scale = 1.0 + sum(float(np.sum(np.abs(t))) for t in terms)
    assume(abs(coarse - fine) < 1e-6 * scale)  # smooth at this point, step error small
    exact = sum(float(np.sum(t)) for t in terms)
    assert abs(exact - fine) < 1e-5 * scale, (diagram.name, exact, fine)


@settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data(), module=modules(max_diagrams=2))
def test_vjp_of_random_diagrams_matches_jax_grad_of_their_lowering(data: st.DataObject, module: Any) -> None:
    """The VJP diagram (float64 evaluator) equals jax.grad of the diagram lowered unscheduled to
    plain JAX (f32), on diagrams that are not in the repo."""
    diagram = data.draw(st.sampled_from(module.diagrams))
    sizes = data.draw(sizes_for(diagram, 1, 3))
    assume(_sized(diagram, sizes))
    try:
        fn = lower(kernel.refl(diagram.name, diagram), target="jax").fn
    except NapkinError as exc:
        assume("lower.unbound_axis" not in exc.codes)
        raise
    xs, cts = _random(diagram, sizes, data.draw(st.integers(0, 2**32 - 1)))
    with np.errstate(all="ignore"):
        want = _gradients(diagram, xs, cts, sizes)
        outs = as_tuple(evaluate(diagram, xs, sizes=sizes))
    assume(all(np.all(np.isfinite(o)) & np.all(np.abs(o) < 1e6) for o in outs))
    assume(all(np.all(np.isfinite(w)) & np.all(np.abs(w) < 1e6) for w in want))

    def loss(*args: jax.Array) -> jax.Array:
        return sum(jnp.sum(o * c) for o, c in zip(as_tuple(fn(*args)), cts, strict=True))  # type: ignore[return-value]

    got = jax.grad(loss, argnums=tuple(range(len(xs))))(*[jnp.asarray(x, jnp.float32) for x in xs])
    for g, w in zip(got, want, strict=True):
        scale = max(1.0, float(np.max(np.abs(w), initial=0.0)))
        assert np.max(np.abs(np.asarray(g, np.float64) - w), initial=0.0) <= 1e-3 * scale, (diagram.name, g, w)


@given(module=modules(max_diagrams=2))
def test_vjp_prints_as_ncd_that_elaborates_to_it(module: Any) -> None:
    for diagram in module.diagrams:
        built = vjp_module(diagram)
        assert loads(print_module(built)).diagrams == built.diagrams


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_vjp_of_every_example_matches_jax_grad(path: Path) -> None:
    module = load(str(path))
    for diagram in module.diagrams:
        sizes = {a.name: a.size or 5 + i for i, a in enumerate(diagram.axes)}
        xs, cts = _random(diagram, sizes, 7)
        for i, p in enumerate(diagram.inputs):  # class labels hold positions along their one-hot axis
            if p.name in (labels := label_inputs(diagram)):
                xs[i] = np.random.default_rng(i).integers(0, sizes[labels[p.name]], xs[i].shape).astype(np.float64)
        fn = lower(kernel.refl(diagram.name, diagram), target="jax").fn
        want = _gradients(diagram, xs, cts, sizes)

        def loss(*args: jax.Array, fn: Any = fn, cts: list[np.ndarray] = cts) -> jax.Array:
            return sum(jnp.sum(o * c) for o, c in zip(as_tuple(fn(*args)), cts, strict=True))  # type: ignore[return-value]

        got = jax.grad(loss, argnums=tuple(range(len(xs))))(*[jnp.asarray(x, jnp.float32) for x in xs])
        for g, w in zip(got, want, strict=True):
            scale = max(1.0, float(np.max(np.abs(w), initial=0.0)))
            assert np.max(np.abs(np.asarray(g, np.float64) - w), initial=0.0) <= 1e-4 * scale, diagram.name


KINKS = """
axis a = 3
diagram kinks(X: [a], Y: [a]) -> [a], [a], [a], [], [] {
  return relu(X), abs(X), max(X, Y), max[a](Y), min[a](Y)
}
"""


def test_non_differentiable_points_take_jax_values() -> None:
    """relu and abs at 0, max at a tie, and max/min reductions over tied entries: the values
    jax.grad gives for jnp.maximum(x, 0), jnp.abs, jnp.maximum, jnp.max and jnp.min."""
    diagram = loads(KINKS).diagram("kinks")
    x = np.array([0.0, -1.0, 2.0])
    y = np.array([0.0, 5.0, 5.0])
    cts = [np.ones(3), np.ones(3), np.ones(3), np.ones(()), np.ones(())]
    got = _gradients(diagram, [x, y], cts, {"a": 3})

    def reference(x: jax.Array, y: jax.Array) -> jax.Array:
        return (jnp.sum(jnp.maximum(x, 0.0)) + jnp.sum(jnp.abs(x)) + jnp.sum(jnp.maximum(x, y))
                + jnp.max(y) + jnp.min(y))

    want = jax.grad(reference, argnums=(0, 1))(jnp.asarray(x), jnp.asarray(y))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, np.asarray(w, np.float64), atol=1e-7)
    assert got[0][0] == 0.5 + 1.0 + 0.5  # relu: 1/2, abs: 1, max tie: 1/2
    assert list(got[1]) == [0.5 + 1.0, 1.5, 1.5]  # tie with X and the min; above X and half the max each


PRODUCTS = """
axis a, b
diagram products(X: [a b]) -> [b] {
  return prod[a](X)
}
"""


def test_prod_gradient_is_exact_at_zeros() -> None:
    """∂ prod / ∂x_i is the product of the others, also where x_i (or another entry) is 0."""
    diagram = loads(PRODUCTS).diagram("products")
    x = np.array([[0.0, 2.0], [3.0, 0.0], [4.0, 0.0]])
    (got,) = _gradients(diagram, [x], [np.array([1.0, 1.0])], {"a": 3, "b": 2})
    np.testing.assert_array_equal(got, [[12.0, 0.0], [0.0, 0.0], [0.0, 0.0]])


BROADCAST = """
axis x, y
diagram shifted(B: [x], c: [], W: [x y], v: [y]) -> [], [y] {
  return sum[x](B + c), mean[x](W - exp(v)) + sum[x](where[x](x < 2, v, 0.0))
}
"""


def test_a_cotangent_constant_along_a_broadcast_axis_is_summed_over_it() -> None:
    """d/dc Σ_x (B + c) is |x|: the sum's cotangent lacks x (constant along it), and so does c, yet c
    was broadcast along x (the VJP gave 1, and a backward giving dc = dy was proved against it);
    likewise exp(v) broadcast along x inside a mean, and a `where` whose fill lacks an axis."""
    diagram = loads(BROADCAST).diagram("shifted")
    rng = np.random.default_rng(0)
    sizes = {"x": 5, "y": 3}
    xs = [rng.standard_normal([sizes[a] for a in p.axes]) for p in diagram.inputs]
    cts = [np.ones(()), np.ones(3)]
    got = _gradients(diagram, xs, cts, sizes)

    def reference(b: jax.Array, c: jax.Array, w: jax.Array, v: jax.Array) -> jax.Array:
        keep = (jnp.arange(5) < 2)[:, None]
        return jnp.sum(b + c) + jnp.sum(jnp.mean(w - jnp.exp(v), axis=0) + jnp.sum(jnp.where(keep, v, 0.0), axis=0))

    want = jax.grad(reference, argnums=(0, 1, 2, 3))(*(jnp.asarray(x) for x in xs))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, np.asarray(w, np.float64), rtol=1e-6)
    assert float(got[1]) == 5.0


@pytest.mark.parametrize("body", [
    "sum[y z](split[w -> y z](A) + v)", "sum[y](contract[x](A, X) + c)", "sum[x y](cumsum[x](X + c))",
    "sum[x](logsumexp[y](v + c) + A)", "sum[x y](transpose[y x](X) + c)", "sum[x y](select(lt(index[x](x), 2), c, X))",
    "sum[x](contract[](A, c) + c)", "sum[x y](maximum(X, c) + minimum(v, c))", "sum[x y](cumsum[y](v + c) + A)"])
def test_broadcast_operands_under_a_reduction_match_finite_differences(body: str) -> None:
    """Each was off before: a cotangent lacking an axis the box broadcast its operand along (3 where 1)."""
    a = "w" if "split" in body else "x"
    text = f"axis x, y, z, w = 6\ndiagram g(A: [{a}], c: [], X: [x y], v: [y]) -> [] {{ return {body} }}\n"
    diagram = loads(text).diagram("g")
    sizes = {"x": 3, "y": 2, "z": 3, "w": 6}
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal([sizes[a] for a in p.axes]) for p in diagram.inputs]
    got = _gradients(diagram, xs, [np.ones(())], sizes)
    for k, x in enumerate(xs):
        for j in range(x.size):
            step = np.zeros(x.size)
            step[j] = 1.0
            direction = [np.zeros_like(v) for v in xs]
            direction[k] = step.reshape(x.shape)
            fd = _directional(diagram, xs, [np.ones(())], sizes, direction, 1e-6)
            assert abs(float(np.ravel(got[k])[j]) - fd) < 1e-4 * (1 + abs(fd)), (diagram.inputs[k].name, j)


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(text=broadcast_texts(), seed=st.integers(0, 2**32 - 1))
def test_vjp_of_lower_rank_operands_matches_finite_differences(text: str, seed: int) -> None:
    """Every entry of the gradient equals its central difference, on random diagrams whose boxes
    act along axes their operands lack (sizes 3, 2, 4: an axis of size 1 hides a missing sum; a
    VJP without the broadcast sums of 575df2c fails here), where the function is smooth there."""
    diagram = loads(text).diagram("g")
    rng = np.random.default_rng(seed)  # one generator: inputs that share no values, so no ties
    xs = [rng.standard_normal([BROADCAST_SIZES[a] for a in p.axes]) for p in diagram.inputs]
    with np.errstate(all="ignore"):
        assume(np.isfinite(_loss(diagram, xs, [np.ones(())], BROADCAST_SIZES)))
        got = _gradients(diagram, xs, [np.ones(())], BROADCAST_SIZES)
        for k, x in enumerate(xs):
            for j in range(x.size):
                direction = [np.zeros_like(v) for v in xs]
                direction[k].flat[j] = 1.0
                coarse, fine = (_directional(diagram, xs, [np.ones(())], BROADCAST_SIZES, direction, h)
                                for h in (1e-5, 1e-6))
                if abs(coarse - fine) < 1e-5 * (1 + abs(fine)):  # smooth there
                    assert abs(float(got[k].flat[j]) - fine) < 1e-4 * (1 + abs(fine)), (diagram.inputs[k].name, j)


def test_convention_names_and_types() -> None:
    module = load(str(ROOT / "examples" / "attention.ncd"))
    for name in ("attention", "mha", "alibi_mha"):
        diagram = module.diagram(name)
        result = vjp(diagram)
        assert result.name == f"{name}_vjp"
        assert [p.name for p in result.inputs] == [p.name for p in diagram.inputs] + list(cotangent_names(diagram))
        assert [p.axes for p in result.inputs[len(diagram.inputs):]] == list(diagram.out_types)
        assert result.out_types == tuple(p.axes for p in diagram.inputs)
    assert cotangent_names(module.diagram("attention")) == ("dO",)
    assert cotangent_names(module.diagram("mha")) == ("d_out",)


def test_cli_grad_writes_ncd_that_parses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "attention_vjp.ncd"
    assert main(["grad", str(ROOT / "examples" / "attention.ncd"), "causal_attention", "-o", str(out)]) == 0
    assert "causal_attention_vjp" in capsys.readouterr().out
    written = load(str(out)).diagram("causal_attention_vjp")
    assert written == vjp(load(str(ROOT / "examples" / "attention.ncd")).diagram("causal_attention"))
    assert main(["grad", str(ROOT / "examples" / "attention.ncd"), "nope"]) == 2
    assert "no diagram `nope`" in capsys.readouterr().err
