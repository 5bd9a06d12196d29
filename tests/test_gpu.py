"""The Pallas kernels on a real GPU (``interpret=False``): the checks of test_lower_pallas.py.

Marked ``gpu`` and skipped unless ``jax.default_backend() == "gpu"``.  f32 kernels use
IEEE f32 dots (``precision=HIGHEST``, not TF32), so the f32 tolerance is that of the
interpreter times a small factor for the GPU's exp/rsqrt; bf16 uses the documented one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from napkin_cat.lower import lower
from tests import lower_cases as cases

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a CUDA GPU (jax.default_backend() == 'gpu')"),
]

NAMES = sorted(cases.theorems())


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", NAMES)
def test_kernel_on_gpu_matches_evaluator(name: str, dtype: str) -> None:
    thm = cases.theorems()[name]
    tol = cases.BF16_TOL if dtype == "bfloat16" else 10 * cases.tolerance(thm)  # GPU exp/rsqrt ulps
    sizes, arrays = cases.inputs(thm, seed=len(name), low=100, high=700)
    fn = lower(thm, target="pallas", tiles=cases.TILES | {"gq": 64, "sx": 64}, dtype=dtype).fn
    got = cases.as_tuple(jax.jit(lambda *a: fn(*a, interpret=False))(*[jnp.asarray(a, dtype) for a in arrays]))
    for out, want in zip(got, cases.reference(thm, arrays, sizes), strict=True):
        assert cases.relative_error(out, want) < tol


def test_default_tiles_run_on_gpu() -> None:
    thm = cases.theorems()["flash_attention_causal"]
    sizes, arrays = cases.inputs(thm, seed=9, low=500, high=1500)
    fn = lower(thm, target="pallas", dtype="bfloat16", hardware="h200").fn
    got = fn(*[jnp.asarray(a, jnp.bfloat16) for a in arrays])
    assert cases.relative_error(got, cases.reference(thm, arrays, sizes)[0]) < cases.BF16_TOL
