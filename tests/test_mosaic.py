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

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from napkin_cat.cost import hardware as hw
from napkin_cat.diagnostics import NapkinError
from napkin_cat.lower import lower
from tests import lower_cases as cases

ROOT = Path(__file__).resolve().parent.parent
H200 = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
MOSAIC_CALL = "custom_call @mosaic_gpu"
PLUGIN = importlib.util.find_spec("jax_cuda13_plugin") is not None
needs_plugin = pytest.mark.skipif(not PLUGIN, reason="cross-lowering Mosaic GPU needs _mosaic_gpu_ext from "
                                  "jax-cuda13-plugin==0.11.2 (pip install -e '.[mosaic]')")


#: kernels that overflow the H200's 227 KiB of shared memory at these sizes even at the smallest
#: tiles (64): their whole axis d (227, padded to 256) sits in shared memory beside the 64-row
#: blocks, pipelined MOSAIC_STEPS deep, with wgmma operands staged; Mosaic GPU refuses them when
#: it lowers ("smem_bytes=272424 > max_smem_bytes=232448"); napkin does not check shared memory
#: at trace time yet (README "Targets")
OVER_SMEM = frozenset({"mlp_backward_w", "mlp_backward_x"})


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


def test_causal_kernel_skips_and_unmasks() -> None:
    """Chunks above the diagonal are never fetched; below it a pipeline without the mask runs."""
    src = lower(cases.theorems()["flash_attention_causal"], target="mosaic", dtype="bfloat16").source
    assert "end_chunk" in src and "full_end" in src
    assert src.count("plgpu.emit_pipeline(") == 2 and src.count("lax.cond(") == 2


@needs_plugin
@pytest.mark.parametrize("name", sorted(cases.theorems()))
def test_kernel_cross_lowers_or_is_refused(name: str) -> None:
    thm = cases.theorems()[name]
    sizes, _ = cases.inputs(thm, seed=0, low=100, high=300)
    specs = [jax.ShapeDtypeStruct(tuple(sizes[a] for a in p.axes), jnp.bfloat16) for p in thm.result.inputs]
    try:
        fn = lower(thm, target="mosaic", dtype="bfloat16").forward
    except NapkinError as exc:
        assert exc.diagnostics[0].code in ("lower.mosaic", "lower.triton_op", "lower.stream_mixed"), str(exc)
        return
    if name in OVER_SMEM:  # the backend's own refusal, at these tiles (module docstring)
        with pytest.raises(ValueError, match="Mosaic GPU kernel exceeds available shared memory"):
            cuda_hlo(fn, *specs)
        return
    assert cuda_hlo(fn, *specs).count(MOSAIC_CALL) == max(1, len(thm.kernels))  # one call per kernel of a chain


def test_f32_is_refused_with_reason() -> None:
    with pytest.raises(NapkinError, match="wgmma multiplies f16/bf16"):
        lower(cases.theorems()["tiled_matmul"], target="mosaic", dtype="float32")


def test_off_model_tile_is_refused() -> None:
    with pytest.raises(NapkinError, match="multiples of 64"):
        lower(cases.theorems()["flash_attention"], target="mosaic", dtype="bfloat16", tiles={"gq": 32, "sx": 64})


@pytest.mark.parametrize("name", ["tiled_matmul", "flash_attention", "flash_attention_causal", "mlp_forward",
                                  "fused_linear", "flash_mha"])
def test_model_tiles_meet_mosaic_rules(name: str) -> None:
    """The tiles the cost model picks for this target: powers of two, multiples of wgmma m
    (which also makes them multiples of wgmma n and of 16, the bf16 k), within a TMA box."""
    rules = hw.load("h200").mosaic
    assert rules == {"wgmma_m": 64, "wgmma_n": 8, "warpgroup_threads": 128, "tma_box": 256,
                     "max_concurrent_steps": 2}
    thm = cases.theorems()[name]
    low = lower(thm, target="mosaic", dtype="bfloat16")
    for axis in low.layout.grid + ((low.layout.stream,) if low.layout.stream else ()):
        if axis in low.layout.squeezed:
            continue
        tile = low.layout.tiles[axis]
        assert tile % rules["wgmma_m"] == 0 and tile % rules["wgmma_n"] == 0 and tile <= rules["tma_box"], (axis, tile)
        assert tile & (tile - 1) == 0


def test_a_profile_without_mosaic_rules_is_refused() -> None:
    with pytest.raises(NapkinError, match="has no \\[mosaic\\] table"):
        lower(cases.theorems()["tiled_matmul"], target="mosaic", dtype="bfloat16", hardware="cpu")


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
