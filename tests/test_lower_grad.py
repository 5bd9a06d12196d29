"""Gradients of lowered kernels (napkin_cat.lower.backward): ``jax.grad`` through the lowered
function (on Pallas a ``jax.custom_vjp`` whose backward is the VJP diagram) equals ``jax.grad``
of the unscheduled diagram lowered to plain JAX and differentiated through its own code, and
the float64 evaluator's gradient (the VJP diagram, ``napkin_cat.grad``), at ragged sizes in
f32, for every kernel of proofs/ and the extra cases, on both targets (Pallas in interpret
mode; slow-marked: a Pallas kernel in interpret mode takes seconds on CPU, and the plain-JAX
target's autodiff through its loops compiles for seconds, but ``FAST`` on that target runs in the
fast run too); a Pallas gradient is cross-lowered for CUDA, as the forwards are."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from napkin_cat import grad, kernel, proof
from napkin_cat.certify.approximation import label_inputs
from napkin_cat.evaluate import evaluate
from napkin_cat.lower import lower
from napkin_cat.lower.backward import GRADIENTS
from tests import lower_cases as cases

#: the plain-JAX target's rows of the fast run (``-m "not slow"``): a causal mask, a fused MLP, a
#: loss over a vocabulary, a normalised contraction; every other row is slow-marked (CI runs them)
FAST = ("flash_attention_causal", "fused_mlp_first_layer", "streamed_cross_entropy", "flash_rms_attention")


def _loss(fn: Any, weights: list[np.ndarray]) -> Any:
    def loss(*args: jax.Array) -> jax.Array:
        return sum(jnp.sum(o * w) for o, w in zip(cases.as_tuple(fn(*args)), weights, strict=True))  # type: ignore[return-value]
    return loss


def _check(name: str, target: str, dtype: str = "float32", tol: float = 1e-4) -> None:
    thm = cases.theorems()[name]
    sizes, arrays = cases.inputs(thm, seed=5, high=40)
    rng = np.random.default_rng(6)
    weights = [rng.standard_normal([sizes[a] for a in t]) for t in thm.result.out_types]
    labels = label_inputs(thm.result)
    wrt = tuple(i for i, p in enumerate(thm.result.inputs) if p.name not in labels)
    lowered = lower(thm, target=target, tiles=cases.TILES, dtype=None if dtype == "float32" else dtype)
    assert GRADIENTS[target] in lowered.source
    plain = lower(kernel.refl(name, thm.source), target="jax").forward
    xs = [jnp.asarray(a, jnp.float32) for a in arrays]
    want = jax.grad(_loss(plain, weights), argnums=wrt)(*xs)
    inputs = xs if dtype == "float32" else [x.astype(dtype) for x in xs]
    got = jax.grad(_loss(lowered.fn, weights), argnums=wrt)(*inputs)
    for g, w, i in zip(got, want, wrt, strict=True):
        assert g.dtype == inputs[i].dtype
        assert cases.relative_error(np.asarray(g, np.float32), np.asarray(w, np.float64)) < tol, (name, i)
    # and the evaluator's own gradient: the VJP diagram (napkin_cat.grad) in float64
    exact = cases.as_tuple(evaluate(grad.vjp(thm.source), [*arrays, *weights], sizes=sizes))
    for g, i in zip(got, wrt, strict=True):
        assert cases.relative_error(np.asarray(g, np.float32), np.asarray(exact[i], np.float64)) < tol, (name, i)


@pytest.mark.slow
def test_grad_of_a_bf16_kernel_is_within_bf16_tolerance() -> None:
    _check("flash_attention_causal", "pallas", "bfloat16", cases.BF16_TOL)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["jax", "pallas"])
@pytest.mark.parametrize(("name", "q", "x"), [("flash_attention", 100, 77), ("flash_attention_causal", 100, 100)])
def test_flash_attention_gradient_is_plain_attentions(target: str, name: str, q: int, x: int) -> None:
    """The issue's acceptance: jax.grad through the lowered FlashAttention (tiles 32/16) is the
    gradient of softmax(Q Kᵀ/√d) V written in jnp."""
    thm = proof.theorem(str(cases.ROOT / "proofs" / "flash_attention.ncd"), name)
    rng = np.random.default_rng(0)
    q_, k_, v_, w_ = (jnp.asarray(rng.standard_normal(s), jnp.float32) for s in [(q, 64), (x, 64), (x, 64), (q, 64)])

    def attention(Q: jax.Array, K: jax.Array, V: jax.Array) -> jax.Array:
        s = Q @ K.T / 8.0
        if name.endswith("causal"):
            s = jnp.where(jnp.arange(q)[:, None] >= jnp.arange(x)[None, :], s, -jnp.inf)
        return jax.nn.softmax(s, axis=-1) @ V

    fn = lower(thm, target=target, tiles={"gq": 32, "sx": 16}).fn
    want = jax.grad(lambda *a: jnp.sum(attention(*a) * w_), argnums=(0, 1, 2))(q_, k_, v_)
    got = jax.grad(lambda *a: jnp.sum(fn(*a) * w_), argnums=(0, 1, 2))(q_, k_, v_)
    for g, w in zip(got, want, strict=True):
        assert cases.relative_error(g, np.asarray(w, np.float64)) < 1e-4


@pytest.mark.parametrize(("name", "target"), [
    pytest.param(name, target, marks=() if target == "jax" and name in FAST else pytest.mark.slow)
    for name in sorted(cases.theorems()) for target in ("jax", "pallas")])
def test_grad_of_every_kernel_matches_plain_jax(name: str, target: str) -> None:
    """Issue 13: the gradient of every kernel of proofs/ (and the extra cases), both targets
    (Pallas in interpret mode), at ragged sizes in f32, against the unscheduled diagram's and
    against the evaluator's own (its VJP diagram in float64): relative error < 1e-4; a theorem
    with ``dtype`` steps, within bf16's tolerance."""
    _check(name, target, tol=max(1e-4, cases.tolerance(cases.theorems()[name])))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["flash_attention_causal", "streamed_cross_entropy_index"])
def test_grad_of_a_pallas_kernel_lowers_for_cuda(name: str) -> None:
    """The custom VJP of a Pallas kernel (its forward a pallas_call, its backward the VJP diagram
    in plain JAX) cross-lowers for CUDA against an abstract H200, as the forwards do."""
    from tests.test_crosslower import TRITON_CALL, cuda_hlo

    thm = cases.theorems()[name]
    sizes, _ = cases.inputs(thm, seed=0, low=100, high=300)
    specs = [jax.ShapeDtypeStruct(tuple(sizes[a] for a in p.axes), jnp.float32) for p in thm.result.inputs]
    labels = label_inputs(thm.result)
    wrt = tuple(i for i, p in enumerate(thm.result.inputs) if p.name not in labels)
    fn = lower(thm, target="pallas", tiles=cases.TILES | {"gq": 64, "sx": 64}).fn

    def grads(*args: jax.Array, interpret: bool = False) -> Any:
        def loss(*a: jax.Array) -> jax.Array:
            return sum(jnp.sum(o) for o in cases.as_tuple(fn(*a, interpret=interpret)))  # type: ignore[return-value]
        return jax.grad(loss, argnums=wrt)(*args)

    assert TRITON_CALL in cuda_hlo(grads, *specs)
