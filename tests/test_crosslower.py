"""Every Pallas kernel cross-lowered for CUDA against an abstract "NVIDIA H200" (``jax.sharding.AbstractDevice``).

No GPU is needed: ``jax.jit(...).trace(...).lower(lowering_platforms=("cuda",))`` runs the
Pallas Triton lowering on this machine, which catches the backend's constraint errors
(power-of-two shapes, unsupported primitives such as erf, dot operand rules) before a
kernel ever meets a GPU.  Numerics and Triton->PTX compilation still need test_gpu.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

from napkin_cat.lower import lower
from tests import lower_cases as cases

H200 = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
TRITON_CALL = "__gpu$xla.gpu.triton"


def cuda_hlo(fn: object, *args: jax.ShapeDtypeStruct) -> str:
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), (), abstract_device=H200)):
        traced = jax.jit(functools.partial(fn, interpret=False)).trace(*args)  # type: ignore[call-arg]
        return traced.lower(lowering_platforms=("cuda",)).as_text()  # type: ignore[no-any-return]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(cases.theorems()))
def test_kernel_lowers_for_cuda(name: str, dtype: str) -> None:
    thm = cases.theorems()[name]
    sizes, _ = cases.inputs(thm, seed=0, low=100, high=300)
    specs = [jax.ShapeDtypeStruct(tuple(sizes[a] for a in p.axes), jnp.dtype(dtype)) for p in thm.result.inputs]
    hlo = cuda_hlo(lower(thm, target="pallas", tiles=cases.TILES | {"gq": 64, "sx": 64}, dtype=dtype).fn, *specs)
    # one fused kernel (a chain: one per kernel), the wrapper's padding and slicing around it
    assert hlo.count(TRITON_CALL) == max(1, len(thm.kernels))


def test_default_tiles_lower_for_cuda() -> None:
    """The cost model's default tiles (or the documented fallback) are valid Triton blocks."""
    thm = cases.theorems()["flash_attention_causal"]
    spec = jax.ShapeDtypeStruct((1024, 64), jnp.bfloat16)
    assert TRITON_CALL in cuda_hlo(lower(thm, target="pallas", dtype="bfloat16", hardware="h200").fn, spec, spec, spec)


@pytest.mark.parametrize("steps", [("group q by gq",), ("group q by gq", "stream x by sx via online_softmax")])
@pytest.mark.parametrize("b", ["sqrt", "rms"])
def test_exp_weights_under_a_square_root_lower_for_cuda(b: str, steps: tuple[str, ...]) -> None:
    """No proofs/ theorem has exp weights under a square-root normaliser: their output relative to
    exp(m/2), scaled by a row vector exp(m/4) twice (whole axis) or in the online final, lowers too."""
    text = f"axis q, x, d\ndiagram es(S: [q x], V: [x d]) -> [q d] {{\n  return ncontract[x; exp, exp, {b}](S, V)\n}}"
    thm = cases.proved(text, "es", *steps)
    specs = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in ((200, 300), (300, 64))]
    assert cuda_hlo(lower(thm, target="pallas", tiles={"gq": 64, "sx": 64}).fn, *specs).count(TRITON_CALL) == 1
