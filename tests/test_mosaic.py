"""The Mosaic GPU target (``lower --target mosaic``, napkin_cat/lower/mosaic.py).

- interpret mode (``plgpu.InterpretGPUParams``: GMEM/SMEM, TMA, barriers and wgmma simulated on
  the CPU) against the float64 evaluator: a tiled matmul, flash attention and causal flash
  attention, in bf16 (wgmma multiplies f16/bf16);
- every kernel of the lowering cases (tests/lower_cases.py: the proofs/ theorems and more)
  cross-lowered for an abstract H200: one ``mosaic_gpu`` custom call in the HLO, or refused
  with ``lower.mosaic`` and its reason (or, for ``OVER_SMEM``, by Mosaic GPU's own shared-memory
  check), never another error;
- the tiles the machine model picks for this target meet its constraints (h200's [mosaic]).

Cross-lowering needs Mosaic GPU's MLIR bindings (``_mosaic_gpu_ext``), which ship in the JAX
CUDA plugin matching jax (``jax-cuda13-plugin==0.11.2``, the ``mosaic`` extra); without it those
tests skip and say so.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from napkin_cat.cost import hardware as hw
from napkin_cat.diagnostics import NapkinError
from napkin_cat.lower import default_tiles, lower, mosaic, realised_schedule
from tests import lower_cases as cases

ROOT = Path(__file__).resolve().parent.parent
H200 = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
MOSAIC_CALL = "custom_call @mosaic_gpu"
PLUGIN = importlib.util.find_spec("jax_cuda13_plugin") is not None
#: Mosaic GPU's lowering core (its ``artificial_shared_memory_limit``), with the plugin only
mgpu_core: Any = importlib.import_module("jax.experimental.mosaic.gpu.core") if PLUGIN else None
needs_plugin = pytest.mark.skipif(not PLUGIN, reason="cross-lowering Mosaic GPU needs _mosaic_gpu_ext from "
                                  "jax-cuda13-plugin==0.11.2 (pip install -e '.[mosaic]')")


#: the shared memory per block the H200 profile gives a Mosaic GPU kernel (Mosaic GPU's own
#: ahead-of-time default, 227 KiB)
SMEM = int(hw.load("h200").level("smem").capacity)


def cuda_hlo(fn: object, *args: jax.ShapeDtypeStruct) -> str:
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), (), abstract_device=H200)):
        traced = jax.jit(functools.partial(fn, interpret=False)).trace(*args)  # type: ignore[call-arg]
        return traced.lower(lowering_platforms=("cuda",)).as_text()  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", ["tiled_matmul", "flash_attention", "flash_attention_causal", "flash_mha"])
def test_interpret_matches_evaluator(name: str) -> None:
    """Ragged sizes (padding and masks), the cost model's tiles for h200's Mosaic rules; flash_mha
    has batch and head axes one position per program (squeezed windows of the TMA copies)."""
    thm = cases.theorems()[name]
    sizes, arrays = cases.inputs(thm, seed=0, low=100, high=300)
    arrays = [np.asarray(jnp.asarray(a, jnp.bfloat16).astype(jnp.float32), np.float64) for a in arrays]
    low = lower(thm, target="mosaic", dtype="bfloat16")
    assert "plgpu.emit_pipeline" in low.source and "wgmma(" in low.source
    assert ("jnp.exp2" in low.source) == (name != "tiled_matmul")
    got = cases.as_tuple(low.forward(*[jnp.asarray(a, jnp.bfloat16) for a in arrays]))  # interpret: auto on CPU
    for out, want in zip(got, cases.reference(thm, arrays, sizes), strict=True):
        assert out.dtype == jnp.bfloat16
        assert cases.relative_error(out, want) < cases.BF16_TOL


def test_an_integer_valued_output_is_stored_in_float32() -> None:
    """Mosaic refuses selections and floor, but a count of compares (`sum[x](eq(Dq, Dx))`, beside a matmul that
    anchors wgmma) is integer-valued too: a bf16 kernel stored it in bf16, 598 read back as 600.  It is stored,
    staged and counted in shared memory as the other targets store it (``Layout.output_dtype``: float32)."""
    from napkin_cat.elaborate import loads
    from napkin_cat.evaluate import evaluate
    from napkin_cat.proof import prove
    text = ("axis q, x\naxis d = 64\naxis f = 64\n"
            "diagram f(Q: [q d], W: [d f], Dq: int [q], Dx: int [x]) -> [q f], [q] {\n"
            "  return contract[d](Q, W), sum[x](eq(Dq, Dx))\n}\ntheorem g: f {\n  group q by 64\n}\n")
    thm = prove(loads(text), "g")
    low = lower(thm, target="mosaic", dtype="bfloat16")
    assert ("output 1 staging", 4, ("q",)) in mosaic.smem_count(low.layout, "bfloat16").parts
    rng = np.random.default_rng(0)
    q, w = (np.asarray(jnp.asarray(rng.standard_normal((64, 64)), jnp.bfloat16), np.float64) for _ in range(2))
    dq, dx = np.zeros(64), np.concatenate([np.ones(3), np.zeros(598)])
    _, count = low.fn(jnp.asarray(q, jnp.bfloat16), jnp.asarray(w, jnp.bfloat16), jnp.asarray(dq, jnp.int32),
                      jnp.asarray(dx, jnp.int32))  # interpret: auto on CPU
    assert count.dtype == jnp.float32
    assert np.array_equal(np.asarray(count, np.float64), evaluate(thm.source, [q, w, dq, dx])[1])
    assert np.all(np.asarray(count) == 598)


def test_causal_kernel_skips_and_unmasks() -> None:
    """Chunks above the diagonal are never fetched; below it a pipeline without the mask runs."""
    src = lower(cases.theorems()["flash_attention_causal"], target="mosaic", dtype="bfloat16").source
    assert "end_chunk" in src and "full_end" in src
    assert src.count("plgpu.emit_pipeline(") == 2 and src.count("lax.cond(") == 2


@needs_plugin
@pytest.mark.parametrize("name", sorted(cases.theorems()))
def test_kernel_cross_lowers_or_is_refused(name: str) -> None:
    """Each kernel cross-lowers (one Mosaic call per kernel of a chain) or is refused with a
    reason; for a single kernel, napkin's shared-memory count (``mosaic.smem_count`` at the
    depth the kernel picks) is exactly Mosaic GPU's: refused one byte below it, accepted at it."""
    thm = cases.theorems()[name]
    sizes, _ = cases.inputs(thm, seed=0, low=100, high=300)
    try:
        low = lower(thm, target="mosaic", dtype="bfloat16")
    except NapkinError as exc:
        assert exc.diagnostics[0].code in ("lower.mosaic", "lower.triton_op", "lower.stream_mixed"), str(exc)
        return
    lay = low.layout
    if lay.stream and lay.declared(lay.stream) is None:  # emit_pipeline shrinks a static pipeline of fewer chunks
        sizes[lay.stream] = max(sizes[lay.stream], mosaic.MOSAIC_STEPS * lay.tiles[lay.stream])
    specs = [jax.ShapeDtypeStruct(tuple(sizes[a] for a in p.axes), jnp.bfloat16) for p in thm.result.inputs]
    if thm.kernels:
        assert cuda_hlo(low.forward, *specs).count(MOSAIC_CALL) == len(thm.kernels)
        return
    count = mosaic.smem_count(lay, "bfloat16")
    extents = mosaic.extents_at(lay, sizes)
    steps = next(s for s in range(mosaic.MOSAIC_STEPS, 0, -1) if count.at(extents, s) <= SMEM)
    need = count.at(extents, steps)
    with mgpu_core.artificial_shared_memory_limit(need - 1), \
            pytest.raises(ValueError, match=f"smem_bytes={need} > max_smem_bytes={need - 1}"):
        cuda_hlo(low.forward, *specs)
    with mgpu_core.artificial_shared_memory_limit(need):
        assert cuda_hlo(low.forward, *specs).count(MOSAIC_CALL) == 1


@needs_plugin
def test_over_smem_kernel_runs_one_buffer_deep() -> None:
    """mlp_backward_w at d = 227 (padded to 256) needs 272,424 bytes with two pipeline buffers
    (Mosaic GPU's own count), so its kernel pipelines one buffer deep; at d = 300 (512) not even
    that fits, and the kernel says so before Mosaic lowers it."""
    thm = cases.theorems()["mlp_backward_w"]
    low = lower(thm, target="mosaic", dtype="bfloat16")
    count = mosaic.smem_count(low.layout, "bfloat16")
    sizes = {"t": 300, "d": 227, "f": 200}
    extents = mosaic.extents_at(low.layout, sizes)
    assert count.at(extents, 2) == 272424 > SMEM >= count.at(extents, 1)
    specs = [jax.ShapeDtypeStruct(tuple(sizes[a] for a in p.axes), jnp.bfloat16) for p in thm.result.inputs]
    hlo = cuda_hlo(low.forward, *specs)
    assert hlo.count(MOSAIC_CALL) == 1
    sizes["d"] = 300
    specs = [jax.ShapeDtypeStruct(tuple(sizes[a] for a in p.axes), jnp.bfloat16) for p in thm.result.inputs]
    with pytest.raises(ValueError, match=r"`mlp_backward_w` cannot be lowered for Mosaic GPU at sizes .*'d': 300.*"
                       r"needs \d+ bytes of shared memory \(one pipeline buffer\), more than the 232448"):
        cuda_hlo(low.forward, *specs)


def test_default_tiles_are_the_cost_models_best_that_fit_a_full_pipeline() -> None:
    """tiled_matmul: the cost model's optimum for h200's Mosaic rules holds its output block
    and two buffers of its A and B chunks in more than 227 KiB, so it would run one buffer deep;
    the default tiles are the best configuration whose kernel fits two deep."""
    thm = cases.theorems()["tiled_matmul"]
    profile = hw.load("h200")
    optimum, _ = default_tiles(thm.result, realised_schedule(thm.result, thm.schedule.device(), "mosaic"),
                               profile.for_mosaic())
    low = lower(thm, target="mosaic", dtype="bfloat16")
    assert low.tiles != optimum and "best configuration that fits" in low.source

    def need(lay: Any, steps: int) -> int:
        return mosaic.smem_count(lay, "bfloat16").at(mosaic.least_extents(lay), steps)
    best = lower(thm, target="mosaic", dtype="bfloat16", tiles=optimum).layout
    assert need(best, 1) <= SMEM < need(best, 2)
    assert need(low.layout, 2) <= SMEM


def test_oversized_tile_is_refused_by_its_shared_memory() -> None:
    """A 256 x 256 output block of a matmul with its k streamed 256 at a time needs more than
    227 KiB even one buffer deep; napkin refuses it, naming the bytes, before emitting."""
    with pytest.raises(NapkinError, match=r"at tiles .*a program needs at least (\d+) bytes of shared memory "
                       r"\(.*pipeline buffer of .*\), more than the 232448 per block"):
        lower(cases.theorems()["tiled_matmul"], target="mosaic", dtype="bfloat16",
              tiles={"ga": 256, "gc": 256, "sb": 256})


def test_f32_is_refused_with_reason() -> None:
    with pytest.raises(NapkinError, match="wgmma multiplies f16/bf16"):
        lower(cases.theorems()["tiled_matmul"], target="mosaic", dtype="float32")


def test_off_model_tile_is_refused() -> None:
    with pytest.raises(NapkinError, match="multiples of 64"):
        lower(cases.theorems()["flash_attention"], target="mosaic", dtype="bfloat16", tiles={"gq": 32, "sx": 64})


@pytest.mark.parametrize("name", sorted(cases.theorems()))
def test_model_tiles_meet_mosaic_rules(name: str) -> None:
    """The tiles the cost model picks for this target, for every kernel it lowers: powers of
    two, multiples of wgmma m (which also makes them multiples of wgmma n and of 16, the bf16
    k), within a TMA box, and a kernel that fits the H200's shared memory with its whole
    pipeline (two buffers) at the least sizes, and at the tests' sizes at some depth
    (``mosaic.smem_count``)."""
    rules = hw.load("h200").mosaic
    assert rules == {"wgmma_m": 64, "wgmma_n": 8, "warpgroup_threads": 128, "tma_box": 256,
                     "max_concurrent_steps": 2}
    thm = cases.theorems()[name]
    try:
        low = lower(thm, target="mosaic", dtype="bfloat16")
    except NapkinError as exc:  # refused with its reason (test_kernel_cross_lowers_or_is_refused)
        assert exc.diagnostics[0].code in ("lower.mosaic", "lower.triton_op", "lower.stream_mixed"), str(exc)
        return
    if thm.kernels:  # a chain's kernels are placed as single kernels are
        return
    lay = low.layout
    for axis in lay.grid + ((lay.stream,) if lay.stream else ()):
        if axis in lay.squeezed:
            continue
        tile = lay.tiles[axis]
        assert tile % rules["wgmma_m"] == 0 and tile % rules["wgmma_n"] == 0 and tile <= rules["tma_box"], (axis, tile)
        assert tile & (tile - 1) == 0
    count = mosaic.smem_count(lay, "bfloat16")
    assert count.at(mosaic.least_extents(lay), mosaic.MOSAIC_STEPS) <= SMEM
    sizes, _ = cases.inputs(thm, seed=0, low=100, high=300)
    assert count.at(mosaic.extents_at(lay, sizes), 1) <= SMEM, name


@pytest.mark.parametrize("name", ["tiled_matmul", "attention_then_projection"])  # one kernel, a chain
def test_a_profile_without_mosaic_rules_is_refused(name: str) -> None:
    """A chain's kernels were placed on the profile unchecked: a traceback (HardwareError) where one
    kernel gets this diagnostic (found by benchmarks/fuzz_verbs.py)."""
    with pytest.raises(NapkinError, match="has no \\[mosaic\\] table"):
        lower(cases.theorems()[name], target="mosaic", dtype="bfloat16", hardware="a100")


def test_mosaic_table_is_checked() -> None:
    text = (ROOT / "napkin_cat" / "cost" / "hardware" / "h200.toml").read_text()
    with pytest.raises(hw.ProfileError, match="mosaic"):
        hw.parse(text.replace("tma_box = 256", ""), "h200", "h200.toml")
    with pytest.raises(hw.ProfileError, match=r"mosaic\.tma_box"):
        hw.parse(text.replace("tma_box = 256", "tma_box = 0"), "h200", "h200.toml")
    assert hw.load("h200").for_mosaic().divisibility["max_tile"] == 256


def test_cli_writes_a_mosaic_module_or_a_located_refusal(capsys: pytest.CaptureFixture[str],
                                                        tmp_path: Path) -> None:
    from napkin_cat.cli import main

    proofs = str(ROOT / "proofs" / "flash_attention.ncd")
    out = tmp_path / "fa.py"
    assert main(["lower", proofs, "flash_attention_causal", "--target", "mosaic", "--dtype", "bf16",
                 "-o", str(out)]) == 0
    assert "plgpu.kernel(" in out.read_text() and "from jax.experimental.pallas import mosaic_gpu as plgpu" in \
        out.read_text()
    capsys.readouterr()
    assert main(["lower", proofs, "flash_attention_causal", "--target", "mosaic", "--tile", "gq=32",
                 "-o", str(tmp_path / "no.py")]) == 1
    err = capsys.readouterr().err
    assert "cannot be lowered for Mosaic GPU: tile 32 of `q`" in err and "Traceback" not in err
    matmul = str(ROOT / "proofs" / "matmul.ncd")
    assert main(["lower", matmul, "tiled_matmul", "--target", "mosaic", "--tile", "ga=256", "--tile", "gc=256",
                 "--tile", "sb=256", "-o", str(tmp_path / "big.py")]) == 1
    err = capsys.readouterr().err
    assert "a program needs at least 393224 bytes of shared memory" in err and "Traceback" not in err
    assert not (tmp_path / "big.py").exists()
