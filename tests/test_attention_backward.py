"""FlashAttention-2's backward (examples/attention_backward.ncd, checked schedules in
proofs/flash_attention_backward.ncd) is attention's gradient.

The backward diagrams read the forward's saved statistics L = logsumexp of the scores and
D = Σ_d dO·O instead of a second softmax; they equal napkin's VJP of attention
(``grad.vjp``, itself tested against jax.grad) in float64 at ragged sizes, and their lowered
kernels on both targets give that gradient within f32 tolerance.  (Every theorem of proofs/
is also lowered against the evaluator and cross-lowered for CUDA by test_lower_*.)
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from napkin_cat import grad, proof
from napkin_cat.elaborate import load
from napkin_cat.evaluate import evaluate
from napkin_cat.lower import lower

ROOT = Path(__file__).resolve().parent.parent
MODULE = load(ROOT / "examples" / "attention_backward.ncd")
SIZES = {"q": 37, "x": 53, "d": 64}  # ragged against every tile below


def _inputs(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((SIZES[a], SIZES["d"])) for a in ("q", "x", "x", "q")]  # Q, K, V, dO


def _reference(arrays: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """dQ, dK, dV from the VJP of attention, in float64."""
    vjp = grad.vjp(MODULE.diagram("attention"))
    return tuple(np.asarray(g) for g in evaluate(vjp, arrays, sizes=SIZES))


def test_the_backward_diagrams_are_the_vjp_of_attention() -> None:
    arrays = _inputs(0)
    want = _reference(arrays)
    stats = evaluate(MODULE.diagram("attention_statistics"), arrays, sizes=SIZES)
    d_k, d_v = evaluate(MODULE.diagram("attention_backward_kv"), [*arrays, *stats], sizes=SIZES)
    d_q = evaluate(MODULE.diagram("attention_backward_q"), [*arrays, *stats], sizes=SIZES)
    for got, expected in zip((d_q, d_k, d_v), want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    # the statistics matter: a wrong L (or D) gives another gradient
    wrong = evaluate(MODULE.diagram("attention_backward_q"), [*arrays, stats[0] + 0.5, stats[1]], sizes=SIZES)
    assert not np.allclose(wrong, want[0], rtol=1e-3)


@pytest.mark.parametrize("target", ["jax", "pallas"])
def test_the_lowered_backward_kernels_give_the_gradient(target: str) -> None:
    arrays = _inputs(1)
    want = _reference(arrays)
    stats = [np.asarray(s) for s in evaluate(MODULE.diagram("attention_statistics"), arrays, sizes=SIZES)]
    path = ROOT / "proofs" / "flash_attention_backward.ncd"
    options = {"interpret": True} if target == "pallas" else {}
    args = [jnp.asarray(a, jnp.float32) for a in (*arrays, *stats)]
    kv = lower(proof.theorem(path, "flash_attention_backward_kv"), target=target, tiles={"gx": 16, "sq": 16})
    q = lower(proof.theorem(path, "flash_attention_backward_q"), target=target, tiles={"gq": 16, "sx": 16})
    d_k, d_v = jax.jit(lambda *a: kv.fn(*a, **options))(*args)
    d_q = jax.jit(lambda *a: q.fn(*a, **options))(*args)
    for got, expected in zip((d_q, d_k, d_v), want, strict=True):
        scale = float(np.max(np.abs(expected)))
        np.testing.assert_allclose(np.asarray(got, np.float64), expected, rtol=0, atol=1e-4 * scale)
