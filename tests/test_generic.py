"""Genericity: diagrams and schedules that are not in examples/ or proofs/ (tests/generic/*.ncd:
sliding-window, ALiBi+softcap+bias, multi-query with e != d, sigmoid attention, heads as a
batch axis of both dots, layernorm then matmul, gated SiLU MLP, batched and three-operand
contractions, streamed row statistics; causal attention returning its log-sum-exp, kernel
regression, linear attention, feature-major K/V, two-level local attention, a temperature
size constant; a SwiGLU MLP streamed over its hidden axis, layernorm, a batched linear layer
with padded batch tiles, a contraction over two axes (also streamed), z-loss cross entropy, a mean squared error, cosine
similarities, logits written chunk by chunk; retention with a scalar decay input, grouped-query decoding,
a relative-position bias table gathered by one-hot, values projected inside the stream, a low-rank chain
re-associated at return, layer norm's gain gradient) go through every back end: the kernel checks each
theorem; both lowerings agree with the float64 evaluator at ragged sizes (no tile divides any
symbolic axis; d=80 and e=48 are not powers of two); the Pallas kernels cross-lower for CUDA
against an abstract H200; the cost model gives symbolic H and M and integer tiles at concrete
sizes; the pseudocode and the drawing render.  Nothing here is special-cased anywhere in napkin.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from napkin_cat import cost, draw, pseudo
from napkin_cat.certify.approximation import label_inputs
from napkin_cat.cost.optimise import search
from napkin_cat.evaluate import evaluate
from napkin_cat.lower import lower
from napkin_cat.proof import check_file
from tests import lower_cases as cases
from tests.test_crosslower import TRITON_CALL, cuda_hlo

FILES = sorted((Path(__file__).parent / "generic").glob("*.ncd"))
#: ragged sizes (primes and odd numbers: every tile leaves a remainder); batch-like axes small
SIZES = {"q": 37, "x": 29, "b": 3, "h": 2, "t": 23, "f": 19, "v": 45, "n": 21, "m": 18, "k": 27, "s": 33}
#: concrete sizes for the integer-tile search
LARGE = {"q": 2048, "x": 2048, "b": 2, "h": 8, "t": 4096, "f": 4096, "v": 32768, "n": 1024, "m": 1024, "k": 1024,
         "s": 4096}


def _theorems() -> dict[str, Any]:
    found = {}
    for path in FILES:
        for result in check_file(path):
            assert result.theorem is not None, (result.name, result.failure)
            found[result.name] = result.theorem
    return found


THEOREMS = _theorems()
#: each theorem's tests share a pytest-xdist worker (``--dist loadgroup``): its cost, derived
#: once per process (``simplified`` is remembered), takes a minute for the two-level masked one
NAMES = [pytest.param(name, marks=pytest.mark.xdist_group(f"generic:{name}")) for name in sorted(THEOREMS)]


def _case(name: str) -> tuple[Any, dict[str, int], list[np.ndarray], tuple[np.ndarray, ...]]:
    thm = THEOREMS[name]
    sizes = {a.name: a.size if a.size is not None else SIZES[a.name] for a in thm.result.axes}
    rng = np.random.default_rng(len(name))
    labels = label_inputs(thm.result)  # integer positions along the one-hot axis
    arrays = [rng.integers(0, sizes[labels[p.name]], [sizes[a] for a in p.axes]).astype(np.float64)
              if p.name in labels else rng.standard_normal([sizes[a] for a in p.axes]) for p in thm.source.inputs]
    want = evaluate(thm.source, arrays, sizes=sizes)
    return thm, sizes, arrays, want if isinstance(want, tuple) else (want,)


def _tiles(thm: Any) -> dict[str, int]:
    """16 for every symbolic tile (the smallest Triton block): several ragged tiles per axis;
    a head tile of 1 (a squeezed grid axis)."""
    return {str(p.tile): 1 if p.axis == "h" else 16 for p in thm.schedule.partitions if isinstance(p.tile, str)}


def test_the_files_hold_the_variants() -> None:
    assert len(FILES) == 5 and len(NAMES) == 31


@pytest.mark.parametrize("target", ["jax", "pallas"])
@pytest.mark.parametrize("name", NAMES)
def test_lowering_matches_the_evaluator_at_ragged_sizes(name: str, target: str) -> None:
    thm, _, arrays, want = _case(name)
    fn = lower(thm, target=target, tiles=_tiles(thm)).fn
    args = [jnp.asarray(a, jnp.float32) for a in arrays]
    got = cases.as_tuple(fn(*args, interpret=True) if target == "pallas" else fn(*args))
    for out, ref in zip(got, want, strict=True):
        assert cases.relative_error(out, ref) < cases.F32_TOL


@pytest.mark.parametrize("name", ["flash_biased", "fused_swiglu", "flash_heads_inside", "flash_lse",
                                  "tiled_batched_linear"])
def test_bf16_lowering_is_within_the_bf16_tolerance(name: str) -> None:
    thm, _, arrays, want = _case(name)
    fn = lower(thm, target="jax", tiles=_tiles(thm), dtype="bfloat16").fn
    got = cases.as_tuple(fn(*[jnp.asarray(a, jnp.bfloat16) for a in arrays]))
    for out, ref in zip(got, want, strict=True):
        assert out.dtype == jnp.bfloat16 and cases.relative_error(out, ref) < cases.BF16_TOL


@pytest.mark.parametrize("name", NAMES)
def test_pallas_kernel_lowers_for_cuda(name: str) -> None:
    """The Triton lowering accepts every kernel (2-D dots, power-of-two blocks, no erf),
    at the test tiles and at the cost model's default tiles, in bf16."""
    thm = THEOREMS[name]
    _, sizes, _, _ = _case(name)
    specs = [jax.ShapeDtypeStruct(tuple(sizes[a] for a in p.axes), jnp.bfloat16) for p in thm.result.inputs]
    for tiles in (_tiles(thm), None):
        hlo = cuda_hlo(lower(thm, target="pallas", tiles=tiles, dtype="bfloat16", hardware="h200").fn, *specs)
        assert hlo.count(TRITON_CALL) == 1


@pytest.mark.parametrize("name", NAMES)
def test_cost_pseudocode_and_drawing(name: str) -> None:
    thm = THEOREMS[name]
    symbolic = cost.cost(thm)
    tiles = {str(p.tile) for p in thm.schedule.partitions if isinstance(p.tile, str)}
    memory = {str(s) for s in symbolic.first.memory.free_symbols}
    assert symbolic.flops != 0 and memory & tiles  # the live set is per tile
    sized = cost.cost(thm, sizes={a: n for a, n in LARGE.items() if a in thm.result.axis_sizes()})
    rows = search(sized, relax=True).rows  # as `napkin cost` and the lowering search
    assert rows and set(rows[0].tiles) == tiles
    text = pseudo.render(symbolic.program, symbolic.bytes_of)
    assert all(f"for each {p.axis}" in text for p in thm.schedule.partitions)
    svg = ET.fromstring(draw.draw_svg(thm))
    assert svg.tag.endswith("svg") and len(list(svg.iter())) > 20


@pytest.mark.parametrize("name", NAMES)
def test_default_tiles_are_legal_for_pallas(name: str) -> None:
    """Regression: without --tile, the cost model chose the whole of d=80 as a stream chunk
    for fused_swiglu, which the Triton lowering refuses (a stream chunk must be a power of two)."""
    lowered = lower(THEOREMS[name], target="pallas")
    assert "pl.pallas_call" in lowered.source
