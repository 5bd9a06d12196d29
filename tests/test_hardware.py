"""Hardware profiles: shipped as package data, every number sourced, units consistent."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from napkin_cat import kernel
from napkin_cat.cost import hardware as hw
from napkin_cat.terms import LEVELS


def test_the_profiles_ship_inside_the_package() -> None:
    assert {"h100", "h200", "a100", "cpu"} <= set(hw.available())
    for key in hw.available():
        assert resources.files("napkin_cat.cost.hardware").joinpath(f"{key}.toml").is_file()


@pytest.mark.parametrize("key", ["h100", "h200", "a100"])
def test_profile_levels_are_ordered_and_positive(key: str) -> None:
    prof = hw.load(key)
    names = [lv.name for lv in prof.levels]
    assert names == sorted(names, key=LEVELS.index)
    assert {"hbm", "smem", "reg"} <= set(names)
    for lv in prof.levels:
        assert lv.capacity > 0
        assert lv.bandwidth is None or lv.bandwidth > 0
    # capacities shrink and bandwidths grow towards the compute units
    caps = [lv.capacity for lv in prof.levels if lv.per == "device"]
    assert caps == sorted(caps, reverse=True)
    assert prof.level("smem").bandwidth > prof.level("hbm").bandwidth  # type: ignore[operator]
    assert prof.peak_flops("bf16") > prof.peak_flops("f32")


def test_the_cpu_profile_prices_loop_trips_and_elementwise_work() -> None:
    """The profile measured on this project's machine (benchmarks/cpu_profile.py): main memory
    and the last-level cache as hbm and smem, no registers level, one program at a time, a
    cost per loop trip and a rate for non-contraction work; the GPU profiles have neither."""
    cpu = hw.load("cpu")
    assert [lv.name for lv in cpu.levels] == ["hbm", "smem"] and cpu.sms == 1
    assert cpu.level("smem").capacity < cpu.level("hbm").capacity
    assert cpu.loop_overhead > 0 and cpu.elementwise is not None and 0 < cpu.elementwise < cpu.peak_flops("f32")
    for key in ("h100", "h200", "a100"):
        assert hw.load(key).loop_overhead == 0 and hw.load(key).elementwise is None


@pytest.mark.parametrize("key", ["h100", "h200", "a100", "cpu"])
def test_every_number_cites_a_source(key: str) -> None:
    text = resources.files("napkin_cat.cost.hardware").joinpath(f"{key}.toml").read_text(encoding="utf-8")
    numbers = [line for line in text.splitlines() if re.match(r"^\w+ = [0-9]", line)]
    assert numbers
    for line in numbers:
        assert "#" in line and len(line.split("#", 1)[1].strip()) > 10, line


def test_ridge_points_match_the_anchors() -> None:
    # dense BF16 peak over HBM bandwidth: 989e12 / 3.35e12 ≈ 295 FLOP/byte (H100), 989e12 / 4.8e12 ≈ 206 (H200)
    assert hw.load("h100").ridge("bf16") == pytest.approx(295, abs=1)
    assert hw.load("h200").ridge("bf16") == pytest.approx(206, abs=1)


def test_bytes_per_value_and_aliases() -> None:
    assert hw.bytes_per_value("f32") == hw.bytes_per_value("fp32") == 4
    assert hw.bytes_per_value("bf16") == hw.bytes_per_value("fp16") == 2
    assert hw.bytes_per_value("fp8_e4m3") == hw.bytes_per_value("fp8e5m2") == 1
    assert set(kernel.DTYPE_ROUNDOFF) <= set(hw.BYTES)  # every format the kernel accepts has a size


def test_clear_errors() -> None:
    with pytest.raises(hw.HardwareError, match="no hardware profile `tpu`"):
        hw.load("tpu")
    with pytest.raises(hw.HardwareError, match="unknown dtype"):
        hw.bytes_per_value("int3")
    with pytest.raises(hw.HardwareError, match="no peak FLOP/s for fp8e4m3"):
        hw.load("a100").peak_flops("fp8")
    with pytest.raises(hw.HardwareError, match="no memory level `l2`"):
        hw.load("a100").level("l2")
