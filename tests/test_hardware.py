"""Hardware profiles: shipped as package data, every number sourced, units consistent."""

from __future__ import annotations

import os
import re
from importlib import resources
from pathlib import Path

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


# ---- the schema (issue 33): a malformed profile is a located error, never a traceback ----------

H100 = resources.files("napkin_cat.cost.hardware").joinpath("h100.toml").read_text(encoding="utf-8")
CPU = resources.files("napkin_cat.cost.hardware").joinpath("cpu.toml").read_text(encoding="utf-8")


#: the least a profile must say
MINIMAL = 'name = "x"\nsms = 1\n[levels.hbm]\ncapacity = 1e9\n[peak]\nf32 = 1e12\n'
LAUNCH = "[launch]\nregisters_per_thread = 255\nwarps = [4]\nregister_budget = 0.5\nrows_per_warp = 16\nstages = [1]\n"


def _edit(text: str, old: str, new: str) -> str:
    """``text`` with the one line starting with ``old`` replaced by ``new`` (deleted for "")."""
    lines = text.splitlines()
    (index,) = [k for k, line in enumerate(lines) if line.startswith(old)]
    lines[index:index + 1] = [new] if new else []
    return "\n".join(lines) + "\n"


#: (case, profile text, the message's tail); one row per class of mistake the fuzzer found or the schema names
MALFORMED: list[tuple[str, str, str]] = [
    ("toml syntax", _edit(H100, "sms = 132", "sms = = 132"), r"not valid TOML: .*\(at line 12, column 7\)"),
    ("toml duplicate key", H100.replace("sms = 132", 'name = "again"\nsms = 132'),
     r"not valid TOML: .*\(at line \d+, column \d+\)"),
    ("missing name", _edit(H100, "name =", ""), r"missing key `name`"),
    ("missing peak", _edit(_edit(_edit(_edit(_edit(_edit(_edit(H100, "[peak]", ""), "f32 =", ""), "tf32 =", ""),
                                                 "bf16 =", ""), "f16 =", ""), "fp8e4m3 =", ""), "fp8e5m2 =", ""),
     r"missing key `peak`"),
    ("empty name", _edit(H100, "name =", 'name = ""'), r"`name` must be a one-line string"),
    ("name a number", _edit(H100, "name =", "name = 3"), r"`name` must be .*, not 3"),
    ("sms a string", _edit(H100, "sms = 132", 'sms = "many"'), r"`sms` must be an integer from 1 to \d+, not a string"),
    ("sms zero", _edit(H100, "sms = 132", "sms = 0"), r"`sms` must be an integer from 1 to \d+, not 0"),
    ("sms negative", _edit(H100, "sms = 132", "sms = -132"), r"`sms` must be an integer .*, not -132"),
    ("sms a float", _edit(H100, "sms = 132", "sms = 1.5"), r"`sms` must be an integer .*, not 1.5"),
    ("sms a bool", _edit(H100, "sms = 132", "sms = true"), r"`sms` must be an integer .*, not true"),
    ("capacity zero", _edit(H100, "capacity = 80e9", "capacity = 0"),
     r"`levels.hbm.capacity` must be a finite positive number, not 0"),
    ("capacity negative", _edit(H100, "capacity = 80e9", "capacity = -80e9"),
     r"`levels.hbm.capacity` must be a finite positive number, not -80000000000.0"),
    ("capacity past float", _edit(H100, "capacity = 80e9", "capacity = 1" + "0" * 400),
     r"`levels.hbm.capacity` must be a finite positive number, not 1000"),
    ("capacity a table", _edit(H100, "capacity = 80e9", "capacity = { a = 1 }"),
     r"`levels.hbm.capacity` must be a finite positive number, not a table"),
    ("capacity missing", _edit(H100, "capacity = 80e9", ""), r"missing key `levels.hbm.capacity`"),
    ("bandwidth inf", _edit(H100, "bandwidth = 3.35e12", "bandwidth = inf"),
     r"`levels.hbm.bandwidth` must be a finite positive number, not inf"),
    ("bandwidth nan", _edit(H100, "bandwidth = 3.35e12", "bandwidth = nan"),
     r"`levels.hbm.bandwidth` must be a finite positive number, not nan"),
    ("bandwidth a string", _edit(H100, "bandwidth = 3.35e12", 'bandwidth = "3.35 TB/s"'),
     r"`levels.hbm.bandwidth` must be a finite positive number, not a string"),
    ("peak inf", _edit(H100, "bf16 = 989e12", "bf16 = inf"), r"`peak.bf16` must be a finite positive number, not inf"),
    ("peak negative", _edit(H100, "bf16 = 989e12", "bf16 = -1"), r"`peak.bf16` must be a finite positive number"),
    ("peak of an unknown dtype", _edit(H100, "bf16 = 989e12", "int4 = 1e12"), r"unknown key `peak.int4`"),
    ("peak twice by alias", _edit(H100, "bf16 = 989e12", "bfloat16 = 1e12\nbf16 = 1e12"),
     r"`peak.bf16` repeats the peak of bf16"),
    ("unknown level", H100 + "[levels.l3]\ncapacity = 1\n", r"unknown key `levels.l3`"),
    ("levels not a table", 'name = "x"\nsms = 1\nlevels = 3\n[peak]\nf32 = 1\n', r"`levels` must be a table, not 3"),
    ("no hbm", MINIMAL.replace("levels.hbm", "levels.smem"), r"missing key `levels.hbm`"),
    ("launch without registers", MINIMAL + LAUNCH, r"`launch` needs a `levels.reg`"),
    ("per unknown", _edit(H100, 'per = "node"', 'per = "cluster"'), r"`levels.mesh.per` must be one of device, sm"),
    ("devices zero", _edit(H100, "devices = 8", "devices = 0"),
     r"`levels.mesh.devices` must be an integer from 1 to 65536, not 0"),
    ("devices past the mesh bound", _edit(H100, "devices = 8", "devices = 1000000"),
     r"`levels.mesh.devices` must be an integer from 1 to 65536, not 1000000"),
    ("warps empty", _edit(H100, "warps = [4, 8]", "warps = []"), r"`launch.warps` must be a non-empty array"),
    ("warps zero", _edit(H100, "warps = [4, 8]", "warps = [4, 0]"), r"`launch.warps\[1\]` must be an integer"),
    ("budget above one", _edit(H100, "register_budget = 0.55", "register_budget = 2"),
     r"`launch.register_budget` is a share of the registers: at most 1, not 2.0"),
    ("launch incomplete", _edit(H100, "stages = [3, 2, 1]", ""), r"missing key `launch.stages`"),
    ("min_tile zero", _edit(H100, "min_tile = 16", "min_tile = 0"), r"`divisibility.min_tile` must be an integer"),
    ("power_of_two a number", _edit(H100, "power_of_two = true", "power_of_two = 1"),
     r"`divisibility.power_of_two` must be true or false, not 1"),
    ("tensor core incomplete", _edit(H100, "k_bytes = 32", ""), r"missing key `tensor_core.k_bytes`"),
    ("unknown top-level key", H100.replace("name =", "nmae = 1\nname ="), r"unknown key `nmae`"),
    ("loop_overhead negative", _edit(CPU, "loop_overhead = 2.9e-5", "loop_overhead = -1"),
     r"`loop_overhead` must be a finite number of at least 0, not -1"),
    ("launch_overhead negative", _edit(H100, "launch_overhead = 4e-6", "launch_overhead = -4e-6"),
     r"`launch_overhead` must be a finite number of at least 0, not -4e-06"),
    ("launch_overhead inf", _edit(H100, "launch_overhead = 4e-6", "launch_overhead = inf"),
     r"`launch_overhead` must be a finite number of at least 0, not inf"),
    ("elementwise zero", _edit(CPU, "elementwise = 1.8e9", "elementwise = 0"),
     r"`elementwise` must be a finite positive number, not 0"),
    ("accumulate_pass a string", _edit(CPU, "accumulate_pass = true", 'accumulate_pass = "yes"'),
     r"`accumulate_pass` must be true or false, not a string"),
    ("empty file", "", r"missing key `name`"),
    ("binary", "\x00\x01", r"not valid TOML"),
]


@pytest.mark.parametrize(("case", "text", "message"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_profile_is_a_located_error(case: str, text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "profile.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(hw.ProfileError) as info:
        hw.load(str(path))
    assert info.value.path == str(path) and re.search(message, info.value.reason), info.value.reason
    assert str(info.value).startswith(f"hardware profile {path}: ")


def test_the_least_profile_loads() -> None:
    least = hw.parse(MINIMAL, "least", "least.toml")
    assert [lv.name for lv in least.levels] == ["hbm"] and least.devices == 1 and least.launch == {}
    assert hw.parse(MINIMAL.replace("[peak]", "[levels.reg]\ncapacity = 1\n[peak]") + LAUNCH, "x", "x").launch


def test_a_profile_file_is_read_like_a_shipped_one(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(H100, encoding="utf-8")
    mine = hw.load(str(path))
    assert mine.key == str(path) and mine == hw.parse(H100, str(path), "h100.toml")
    assert (mine.levels, mine.peak, mine.launch, mine.devices) == (hw.load("h100").levels, hw.load("h100").peak,
                                                                   hw.load("h100").launch, 8)
    for name in hw.available():  # the shipped profiles follow the schema
        hw.parse(resources.files("napkin_cat.cost.hardware").joinpath(f"{name}.toml").read_text(), name, name)


def test_a_profile_file_must_resolve_to_a_regular_toml_file(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text('name = "SECRET-VALUE"\nsms = "SECRET"\n')
    link = tmp_path / "link.toml"
    link.symlink_to(secret)
    with pytest.raises(hw.ProfileError, match=r"resolved path ends in \.toml") as info:
        hw.load(str(link))
    assert "SECRET" not in str(info.value)
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(hw.ProfileError, match=r"not a regular file \(a pipe\)"):
        hw.load(str(fifo))  # refused without blocking on the pipe
    (tmp_path / "dir.toml").mkdir()
    with pytest.raises(hw.ProfileError, match=r"not a regular file \(a folder\)"):
        hw.load(str(tmp_path / "dir.toml"))
    big = tmp_path / "big.toml"
    big.write_text("#" * (hw.MAX_PROFILE_BYTES + 1))
    with pytest.raises(hw.ProfileError, match="past the limit"):
        hw.load(str(big))
    with pytest.raises(hw.HardwareError, match="no such file") as missing:
        hw.load(str(tmp_path / "none.toml"))
    assert not isinstance(missing.value, hw.ProfileError)
    # a value of the wrong type is described, not quoted: a TOML file's strings are never shown
    (tmp_path / "s.toml").write_text(_edit(H100, "name =", 'name = "x"').replace("sms = 132", 'sms = "SECRET"'))
    with pytest.raises(hw.ProfileError) as info:
        hw.load(str(tmp_path / "s.toml"))
    assert "SECRET" not in str(info.value) and "a string" in str(info.value)


def test_lower_never_falls_back_silently_on_a_broken_profile(tmp_path: Path) -> None:
    """The default tiles come from the named profile or the lowering refuses: a broken profile
    is never priced as 'the cost model could not choose' with 64-wide tiles."""
    from napkin_cat.diagnostics import NapkinError
    from napkin_cat.lower import default_tiles, lower
    from napkin_cat.proof import theorem

    broken = tmp_path / "broken.toml"
    broken.write_text(_edit(H100, "capacity = 232448", "capacity = 0"))
    thm = theorem(Path(__file__).resolve().parent.parent / "proofs" / "matmul.ncd", "tiled_matmul")
    with pytest.raises(NapkinError) as info:
        lower(thm, target="jax", hardware=str(broken))
    assert info.value.codes == ("lower.hardware",) and "`levels.smem.capacity`" in info.value.diagnostics[0].message
    with pytest.raises(hw.ProfileError):
        default_tiles(thm.result, thm.schedule, str(broken))
