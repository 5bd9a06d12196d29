"""The `cpu` hardware profile (benchmarks/cpu_profile.py measures it) and the plain-JAX target's
default tiles, which come from it: a loop trip costs the profile's overhead, non-contraction
work runs at its elementwise rate, and the tile search keeps away from the many small trips
that ran 1.9 to 3 times slower than the best tiles on this machine (BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from napkin_cat.cli import main
from napkin_cat.cost import cost
from napkin_cat.cost import hardware as hw
from napkin_cat.cost.optimise import search
from napkin_cat.cost.roofline import timing
from napkin_cat.lower import DEFAULT_HARDWARE, default_tiles, lower, realised_schedule
from napkin_cat.proof import theorem

ROOT = Path(__file__).resolve().parent.parent
PROOF = ROOT / "proofs" / "flash_attention.ncd"
CPU = hw.load("cpu")


@pytest.fixture(scope="module")
def attention() -> object:
    thm = theorem(PROOF, "flash_attention_prescaled")
    schedule = realised_schedule(thm.result, thm.schedule, "jax")
    return thm, cost(thm, schedule, hardware="cpu", sizes={"q": 8192, "x": 8192}, dtype="f32")


def test_a_loop_trip_costs_the_profiles_overhead_and_folds_run_at_its_elementwise_rate(attention: object) -> None:
    thm, c = attention  # type: ignore[misc]
    tiles = {"gq": 1024, "sx": 512}
    t = timing(c, tiles)
    trips = (8192 // 1024) * (8192 // 512)
    assert float(c.at(c.iterations, tiles)) == trips
    assert t.overhead == pytest.approx(trips * CPU.loop_overhead)
    contract, other = float(c.at(c.contract_flops, tiles)), float(c.at(c.other_flops, tiles))
    assert other > 0 and t.flop_time == pytest.approx(contract / CPU.peak_flops("f32") + other / CPU.elementwise)
    assert t.serial == pytest.approx(t.flop_time + t.overhead + sum(s for _, s in t.transfer_times))
    gpu = cost(thm, hardware="h200", sizes={"q": 8192, "x": 8192}, dtype="bf16")
    assert timing(gpu, {"gq": 128, "sx": 64}).overhead == 0


def test_the_search_keeps_to_few_wide_trips_within_the_cache(attention: object) -> None:
    """Measured here (benchmarks/cpu_profile.py, five runs): 256 x 32, 1024 x 64 and 512 x 128
    took 1.9 to 3 times the best tiles; the search ranks them below its choice and keeps its
    working set in smem."""
    _, c = attention  # type: ignore[misc]
    best = search(c, top=1).rows[0]
    assert best.memory["smem"] <= CPU.level("smem").capacity
    assert float(c.at(c.iterations, best.tiles)) <= 64
    for slow in ({"gq": 256, "sx": 32}, {"gq": 1024, "sx": 64}, {"gq": 512, "sx": 128}):
        assert timing(c, slow).serial > best.seconds


def test_the_jax_target_takes_its_default_tiles_from_the_cpu_profile(capsys: pytest.CaptureFixture[str],
                                                                     tmp_path: Path) -> None:
    thm = theorem(PROOF, "flash_attention_prescaled")
    assert DEFAULT_HARDWARE == {"pallas": "h100", "mosaic": "h200", "jax": "cpu"}
    lowered = lower(thm, target="jax")
    expected, origin = default_tiles(thm.result, realised_schedule(thm.result, thm.schedule, "jax"), "cpu", "f32")
    assert lowered.tiles == expected and "cost model optimum for cpu" in origin and origin in lowered.source
    assert "for h100" in lower(thm, target="jax", hardware="h100").source
    assert "for h100" in lower(thm, target="pallas").source
    out = tmp_path / "k.py"
    assert main(["lower", str(PROOF), "flash_attention_prescaled", "--target", "jax", "-o", str(out)]) == 0
    assert "cost model optimum for cpu" in out.read_text()
    capsys.readouterr()


@pytest.mark.parametrize(("args", "profile"), [(["--lower", "jax"], "cpu"), (["--lower", "pallas"], "h100"),
                                               ([], "h100"), (["--lower", "jax", "--hardware", "h200"], "h200")])
def test_derive_prices_on_the_profile_lower_would_use(args: list[str], profile: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`napkin derive --lower jax` searches on `cpu`, as `napkin lower --target jax` tiles;
    `--hardware` still overrides, and without `--lower` the default stays h100."""
    out = tmp_path / "mm.ncd"
    sizes = ["--size", "a=256", "--size", "b=256", "--size", "c=256"]
    assert main(["derive", str(ROOT / "examples" / "matmul.ncd"), "matmul", *sizes, "-o", str(out), *args]) == 0
    assert f"(hardware={profile} " in out.read_text().splitlines()[0]
    capsys.readouterr()


def test_on_the_cpu_a_summed_chunk_is_added_by_a_pass_over_its_state() -> None:
    """XLA:CPU adds each chunk's dot into a summed state in a pass of its own
    (``accumulate_pass``): tiled_matmul folds one FLOP per state value per chunk on the cpu
    profile and none on h100 (the MMA accumulates into its operand), so narrow chunks cost
    more than wide ones there, as measured (512 × 64 ran 1.6× 1024 × 1024, BENCHMARKS.md)."""
    thm = theorem(ROOT / "proofs" / "matmul.ncd", "tiled_matmul")
    schedule = realised_schedule(thm.result, thm.schedule, "jax")
    n = 4096
    sizes = {"a": n, "b": n, "c": n}
    cpu, gpu = (cost(thm, schedule, hardware=name, sizes=sizes, dtype="f32") for name in ("cpu", "h100"))
    narrow, wide = {"ga": 512, "sb": 64}, {"ga": 1024, "sb": 1024}
    assert CPU.accumulate_pass and not hw.load("h100").accumulate_pass
    assert cpu.at(cpu.fold_flops, narrow) == (n // 512) * (n // 64) * 512 * n  # programs × chunks × state
    assert gpu.at(gpu.fold_flops, narrow) == 0
    assert timing(cpu, narrow).serial > timing(cpu, wide).serial


def test_derive_for_the_jax_target_prices_in_f32_as_lower_does() -> None:
    """The plain-JAX target computes in f32 whatever its inputs (``PRICED_DTYPE``), so derive
    prices its candidates in f32 under any ``--dtype``: bf16 would count half the bytes and
    choose tiles (512 × 1024 for this matmul) that overflow the cache at f32."""
    from napkin_cat.lower import PRICED_DTYPE
    from napkin_cat.search.derive import model_cost

    thm = theorem(ROOT / "proofs" / "matmul.ncd", "tiled_matmul")
    sizes = {"a": 4096, "b": 4096, "c": 4096}
    assert PRICED_DTYPE == {"jax": "f32"}
    as_bf16, as_f32 = (model_cost("cpu", dtype, sizes, target="jax")(thm) for dtype in ("bf16", "f32"))
    assert as_bf16.tiles == as_f32.tiles and as_f32.fits
    assert model_cost("cpu", "bf16", sizes)(thm).tiles != as_f32.tiles  # no target: priced as given
