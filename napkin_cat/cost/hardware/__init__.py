"""Hardware profiles as data: memory levels, capacities, bandwidths, peak FLOP/s, tile constraints.

Each profile is a TOML file in this package (``h100.toml``, ``h200.toml``, ``a100.toml``,
``cpu.toml``),
read with ``tomllib`` through ``importlib.resources`` so that it ships inside the wheel.
Every number in a profile cites its source in a comment.  ``load`` also reads a profile from
a ``.toml`` file given by path; shipped or not, a profile is checked against ``SCHEMA``
(required keys, types, finite positive numbers, ranges) and a profile that breaks it is a
``ProfileError`` naming the file and the key (or the line and column of a TOML syntax error).

Units: capacities in bytes (per unit of ``per``: the device or one SM), bandwidths in
bytes per second, peaks in FLOP per second.  A level's ``bandwidth`` is the rate at which
data is read out of it into the next faster level, so the time of the transfers into a
level is timed at its parent's bandwidth (paper §4.2: Ḣ_ℓ^-1 per level).

Bytes per value (paper §4.3, R10) are a property of the number format, not of the
hardware: ``bytes_per_value`` uses the dtype names of the kernel's ``dtype`` step
(``f32``, ``bf16``, ``f16``, ``fp8e4m3``, ...) and accepts the common spellings
(``fp32``, ``fp16``, ``fp8_e4m3``, ...).
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from typing import Any

from napkin_cat.files import FileRefused, read_source
from napkin_cat.terms import INT_BYTES, INT_DTYPE, LEVELS, MAX_AXIS_SIZE, MAX_MESH_DEVICES, MESH

__all__ = ["BYTES", "DTYPE_ALIASES", "INT_BYTES", "INT_DTYPE", "MAX_PROFILE_BYTES", "SCHEMA", "Hardware",
           "HardwareError", "Level", "ProfileError", "available", "bytes_per_value", "canonical_dtype", "is_path",
           "load", "parse"]

#: bytes per value of each number format (names as in the kernel's ``dtype`` step)
BYTES: dict[str, int] = {"f64": 8, "f32": 4, "tf32": 4, "bf16": 2, "f16": 2, "fp8e4m3": 1, "fp8e5m2": 1}


#: common spellings of the number formats, by the canonical name they stand for
DTYPE_ALIASES: dict[str, str] = {
    "fp64": "f64", "float64": "f64", "fp32": "f32", "float32": "f32", "fp16": "f16", "float16": "f16",
    "bfloat16": "bf16", "fp8": "fp8e4m3", "fp8_e4m3": "fp8e4m3", "fp8_e5m2": "fp8e5m2",
    "e4m3": "fp8e4m3", "e5m2": "fp8e5m2",
}


class HardwareError(ValueError):
    """An unknown profile, level or dtype, or a malformed profile file (``ProfileError``)."""


class ProfileError(HardwareError):
    """A profile file that cannot be read or does not follow the schema (``SCHEMA``): ``path``
    and ``reason`` (which names the key, or the line and column of a TOML syntax error, and
    quotes no line of the file)."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"hardware profile {path}: {reason}")
        self.path = path
        self.reason = reason


def canonical_dtype(name: str) -> str:
    """The kernel's name for a number format (``fp16`` -> ``f16``); raises HardwareError."""
    key = DTYPE_ALIASES.get(name.lower(), name.lower())
    if key not in BYTES:
        known = ", ".join(sorted(set(BYTES) | set(DTYPE_ALIASES)))
        raise HardwareError(f"unknown dtype `{name}` (known: {known})")
    return key


def bytes_per_value(dtype: str) -> int:
    """Bytes per value of a number format (paper §4.3's q, called ``bpv`` here)."""
    return BYTES[canonical_dtype(dtype)]


@dataclass(frozen=True)
class Level:
    """One memory level: capacity in bytes per ``per`` unit, read bandwidth in bytes/s."""

    name: str
    capacity: float
    bandwidth: float | None
    per: str


@dataclass(frozen=True)
class Hardware:
    """A hardware profile: levels (slowest first), peaks per dtype, tile constraints.

    ``divisibility`` holds ``power_of_two`` (bool), ``min_tile`` and ``coalesce_bytes``;
    ``tensor_core`` holds ``m``, ``n`` (values) and ``k_bytes`` for contraction operands;
    ``devices`` is the devices per node that the ``mesh`` level joins (1 without one);
    ``launch`` the keywords of ``cost.launch.launch`` (registers per thread, warps, register
    budget, stages) for a Triton program, empty for a profile without them; ``elementwise``
    the FLOP/s of work that is not a contraction (None: the f32 peak, a GPU's CUDA cores);
    ``loop_overhead`` the seconds each trip of the kernel's loops costs beyond its work (a
    processor that runs a kernel's loop body as a sequence of library calls, XLA:CPU's);
    ``launch_overhead`` the seconds each kernel launch beyond the first costs (a split's combine);
    ``accumulate_pass`` whether a chunk's contraction is added into its summed state by a pass
    of its own (XLA:CPU) rather than by the matrix unit into its operand (tensor cores).
    """

    key: str
    name: str
    sms: int
    levels: tuple[Level, ...]
    peak: dict[str, float] = field(compare=False)
    divisibility: dict[str, int | bool] = field(compare=False)
    tensor_core: dict[str, int] = field(compare=False)
    devices: int = 1
    launch: dict[str, Any] = field(default_factory=dict, compare=False)
    elementwise: float | None = None
    loop_overhead: float = 0.0
    accumulate_pass: bool = False
    launch_overhead: float = 0.0
    #: what a Mosaic GPU kernel needs (the [mosaic] table; empty: the profile has no Mosaic GPU):
    #: ``wgmma_m``, ``wgmma_n`` (tensor-core operand multiples), ``warpgroup_threads``,
    #: ``tma_box`` (the most elements per TMA box dimension), ``max_concurrent_steps`` (TMA
    #: copies in flight per streamed input)
    mosaic: dict[str, int] = field(default_factory=dict, compare=False)

    def for_mosaic(self) -> Hardware:
        """This profile as the Mosaic GPU target prices it: every contraction and stream tile
        a power of two from ``wgmma_m`` to ``tma_box`` (``divisibility`` min_tile/max_tile).
        HardwareError for a profile without a [mosaic] table."""
        if not self.mosaic:
            raise HardwareError(f"{self.key} has no [mosaic] table (the Mosaic GPU target needs one)")
        rules = {**self.divisibility, "power_of_two": True, "min_tile": self.mosaic["wgmma_m"],
                 "max_tile": self.mosaic["tma_box"]}
        return replace(self, divisibility=rules)

    def level(self, name: str) -> Level:
        for level in self.levels:
            if level.name == name:
                return level
        known = ", ".join(lv.name for lv in self.levels)
        raise HardwareError(f"{self.key} has no memory level `{name}` (levels: {known})")

    def peak_flops(self, dtype: str) -> float:
        key = canonical_dtype(dtype)
        if key not in self.peak:
            raise HardwareError(f"{self.key} has no peak FLOP/s for {key} (has: {', '.join(self.peak)})")
        return self.peak[key]

    def ridge(self, dtype: str, level: str = "hbm") -> float:
        """The roofline ridge point: FLOPs per byte read from ``level`` at which compute and
        transfer take equal time."""
        bandwidth = self.level(level).bandwidth
        if bandwidth is None:
            raise HardwareError(f"{self.key}: level `{level}` has no bandwidth")
        return self.peak_flops(dtype) / bandwidth


def available() -> tuple[str, ...]:
    """The names of the profiles shipped with the package (``h100``, ...)."""
    files = resources.files(__name__)
    return tuple(sorted(p.name.removesuffix(".toml") for p in files.iterdir() if p.name.endswith(".toml")))


def is_path(profile: str) -> bool:
    """Whether ``--hardware``/``load`` names a profile file (a path ending in .toml, or with a
    folder) rather than a shipped profile."""
    return profile.endswith(".toml") or "/" in profile or os.sep in profile


def load(profile: str) -> Hardware:
    """A profile: shipped, by name (``h100``, ``h200``, ``a100``, ``cpu``), or a file (``is_path``).

    A file is read only if its resolved path is a regular file ending in ``.toml`` of at most
    ``MAX_PROFILE_BYTES``; every profile is checked against ``SCHEMA``.  Raises
    ``HardwareError`` for an unknown name or a missing file, ``ProfileError`` for a file that
    cannot be read or does not follow the schema."""
    if is_path(profile):
        where = ascii(profile)[1:-1]  # printable: control characters escaped
        if not os.path.lexists(profile):
            raise HardwareError(f"no such file: {where}")
        try:
            resolved = os.path.realpath(profile)
        except (OSError, ValueError):
            resolved = ""
        if not resolved.endswith(".toml"):
            raise ProfileError(where, "a profile is read only from a file whose resolved path ends in .toml")
        try:
            text = read_source(profile, MAX_PROFILE_BYTES, suffix=".toml")
        except FileRefused as exc:
            raise ProfileError(where, exc.reason) from None
        return parse(text, where, where)
    key = profile.lower()
    if key not in available():
        raise HardwareError(f"no hardware profile `{profile}` (profiles: {', '.join(available())}; or the path "
                            f"of a .toml profile file)")
    return parse(resources.files(__name__).joinpath(f"{key}.toml").read_text(encoding="utf-8"), key,
                 f"napkin_cat/cost/hardware/{key}.toml")


#: the largest profile file read: a shipped one is about 6 KB
MAX_PROFILE_BYTES = 1 << 16

#: the most SMs (or cores) a profile may have, and the most bytes of a coalesced access or
#: tensor-core operand
_MAX_UNITS = 1 << 20

_PERS = ("device", "sm", "node")


def _kind(value: object) -> str:
    """What a TOML value is, in words; numbers and booleans quoted (the only values quoted)."""
    if isinstance(value, bool):
        return f"{str(value).lower()}"
    if isinstance(value, int | float):
        return repr(value)
    names = {str: "a string", dict: "a table", list: "an array"}
    return next((n for t, n in names.items() if isinstance(value, t)), "a date or time")


def _positive(value: object, where: str, path: str, *, zero: bool = False) -> float:
    """A finite number above 0 (``zero``: at least 0)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok:
        try:
            number = float(value)  # type: ignore[arg-type]
        except OverflowError:
            ok = False
        else:
            ok = math.isfinite(number) and (number >= 0 if zero else number > 0)
    if not ok:
        what = "a finite number of at least 0" if zero else "a finite positive number"
        raise ProfileError(path, f"`{where}` must be {what}, not {_kind(value)}")
    return number


def _integer(value: object, where: str, path: str, high: int) -> int:
    """An integer from 1 to ``high``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ProfileError(path, f"`{where}` must be an integer from 1 to {high}, not {_kind(value)}")
    return value


def _integers(value: object, where: str, path: str, high: int) -> list[int]:
    """A non-empty array of integers from 1 to ``high``."""
    if not isinstance(value, list) or not value:
        raise ProfileError(path, f"`{where}` must be a non-empty array of integers from 1 to {high}, "
                                 f"not {_kind(value) if value != [] else 'an empty array'}")
    return [_integer(v, f"{where}[{k}]", path, high) for k, v in enumerate(value)]


def _boolean(value: object, where: str, path: str) -> bool:
    if not isinstance(value, bool):
        raise ProfileError(path, f"`{where}` must be true or false, not {_kind(value)}")
    return value


def _table(data: Mapping[str, Any], where: str, path: str, required: Sequence[str],
           optional: Sequence[str] = ()) -> dict[str, Any]:
    """``data[where]`` (or ``data`` itself for ``where`` empty) as a table with exactly the
    ``required`` keys and some of the ``optional`` ones."""
    table = data
    for part in filter(None, where.split(".")):
        table = table[part]
    prefix = f"{where}." if where else ""
    if not isinstance(table, dict):
        raise ProfileError(path, f"`{where}` must be a table, not {_kind(table)}")
    unknown = [k for k in table if k not in (*required, *optional)]
    if unknown:
        known = ", ".join(f"`{prefix}{k}`" for k in (*required, *optional))
        raise ProfileError(path, f"unknown key `{prefix}{ascii(unknown[0])[1:-1]}` (keys: {known})")
    missing = [k for k in required if k not in table]
    if missing:
        raise ProfileError(path, f"missing key `{prefix}{missing[0]}`")
    return table


#: The profile schema, for README: the keys, what each must be, and which are required.
#: the keys of a profile's [mosaic] table (``Hardware.mosaic``)
MOSAIC_KEYS = ("wgmma_m", "wgmma_n", "warpgroup_threads", "tma_box", "max_concurrent_steps")

SCHEMA: tuple[tuple[str, str], ...] = (
    ("name", "required: a one-line string of at most 200 printable characters"),
    ("sms", f"required: an integer from 1 to {_MAX_UNITS}, the SMs (or cores running programs at once)"),
    ("levels.LEVEL", "required: a table per memory level, of " + ", ".join(LEVELS) + "; `hbm` required, "
     "and `reg` with [launch]"),
    ("levels.LEVEL.capacity", "required: a finite positive number of bytes per unit of `per`"),
    ("levels.LEVEL.bandwidth", "optional: a finite positive number of bytes per second read out of the level"),
    ("levels.LEVEL.per", "optional: " + ", ".join(_PERS) + " (default device)"),
    ("levels.mesh.devices", f"optional: an integer from 1 to {MAX_MESH_DEVICES} (default 1)"),
    ("peak.DTYPE", "required, at least one: a finite positive number of FLOP/s per dtype"),
    ("divisibility", f"optional: power_of_two (true/false), min_tile (1 to {MAX_AXIS_SIZE}), coalesce_bytes "
     f"(1 to {_MAX_UNITS})"),
    ("tensor_core", f"optional: m, n, k_bytes, all three, integers from 1 to {_MAX_UNITS}"),
    ("launch", "optional: registers_per_thread and rows_per_warp (integers from 1 to 65536), warps and stages "
     "(non-empty arrays of integers from 1 to 1024 and 1 to 64), register_budget (a number above 0, at most 1), "
     "all five"),
    ("elementwise", "optional: a finite positive number of FLOP/s of work that is not a contraction"),
    ("loop_overhead", "optional: a finite number of seconds of at least 0 (default 0)"),
    ("accumulate_pass", "optional: true or false (default false)"),
    ("mosaic", "optional: " + ", ".join(MOSAIC_KEYS) + f", all five, integers from 1 to {_MAX_UNITS}"),
)


def parse(text: str, key: str, path: str) -> Hardware:
    """The profile ``key`` from its TOML ``text`` (read from ``path``, which errors name),
    checked against ``SCHEMA``; raises ProfileError."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(path, f"not valid TOML: {exc}") from None
    top = _table(data, "", path, ("name", "sms", "levels", "peak"),
                 ("divisibility", "tensor_core", "launch", "elementwise", "loop_overhead", "accumulate_pass",
                  "launch_overhead", "mosaic"))
    name = top["name"]
    if not (isinstance(name, str) and name and len(name) <= 200 and name.isprintable()):
        raise ProfileError(path, "`name` must be a one-line string of 1 to 200 printable characters"
                                 + (f", not {_kind(name)}" if not isinstance(name, str) else ""))
    sms = _integer(top["sms"], "sms", path, _MAX_UNITS)
    raw_levels = _table(data, "levels", path, (), LEVELS)
    if "hbm" not in raw_levels:
        raise ProfileError(path, "missing key `levels.hbm` (every profile has a device memory)")
    levels = []
    for level in (lv for lv in LEVELS if lv in raw_levels):
        where = f"levels.{level}"
        raw = _table(data, where, path, ("capacity",), ("bandwidth", "per") + (("devices",) if level == MESH else ()))
        per = raw.get("per", "device")
        if per not in _PERS:
            raise ProfileError(path, f"`{where}.per` must be one of {', '.join(_PERS)}"
                                     + ("" if isinstance(per, str) else f", not {_kind(per)}"))
        bandwidth = _positive(raw["bandwidth"], f"{where}.bandwidth", path) if "bandwidth" in raw else None
        levels.append(Level(level, _positive(raw["capacity"], f"{where}.capacity", path), bandwidth, per))
    devices = _integer(raw_levels[MESH].get("devices", 1), "levels.mesh.devices", path, MAX_MESH_DEVICES) \
        if MESH in raw_levels else 1
    raw_peak = _table(data, "peak", path, (), (*BYTES, *DTYPE_ALIASES))
    if not raw_peak:
        raise ProfileError(path, "`peak` must give the FLOP/s of at least one dtype")
    peak: dict[str, float] = {}
    for dtype, value in raw_peak.items():
        if canonical_dtype(dtype) in peak:
            raise ProfileError(path, f"`peak.{dtype}` repeats the peak of {canonical_dtype(dtype)}")
        peak[canonical_dtype(dtype)] = _positive(value, f"peak.{dtype}", path)
    divisibility: dict[str, int | bool] = {}
    if "divisibility" in top:
        raw = _table(data, "divisibility", path, (), ("power_of_two", "min_tile", "coalesce_bytes"))
        if "power_of_two" in raw:
            divisibility["power_of_two"] = _boolean(raw["power_of_two"], "divisibility.power_of_two", path)
        if "min_tile" in raw:
            divisibility["min_tile"] = _integer(raw["min_tile"], "divisibility.min_tile", path, MAX_AXIS_SIZE)
        if "coalesce_bytes" in raw:
            divisibility["coalesce_bytes"] = _integer(raw["coalesce_bytes"], "divisibility.coalesce_bytes", path,
                                                      _MAX_UNITS)
    tensor_core: dict[str, int] = {}
    if "tensor_core" in top:
        raw = _table(data, "tensor_core", path, ("m", "n", "k_bytes"))
        tensor_core = {k: _integer(v, f"tensor_core.{k}", path, _MAX_UNITS) for k, v in raw.items()}
    launch: dict[str, Any] = {}
    if "launch" in top:
        if "reg" not in raw_levels:
            raise ProfileError(path, "`launch` needs a `levels.reg` (its register file)")
        raw = _table(data, "launch", path, ("registers_per_thread", "warps", "register_budget", "rows_per_warp",
                                            "stages"))
        budget = _positive(raw["register_budget"], "launch.register_budget", path)
        if budget > 1:
            raise ProfileError(path, f"`launch.register_budget` is a share of the registers: at most 1, not {budget!r}")
        launch = {"registers_per_thread": _integer(raw["registers_per_thread"], "launch.registers_per_thread", path,
                                                   1 << 16),
                  "warps": _integers(raw["warps"], "launch.warps", path, 1024), "register_budget": budget,
                  "rows_per_warp": _integer(raw["rows_per_warp"], "launch.rows_per_warp", path, 1 << 16),
                  "stages": _integers(raw["stages"], "launch.stages", path, 64)}
    mosaic: dict[str, int] = {}
    if "mosaic" in top:
        raw = _table(data, "mosaic", path, MOSAIC_KEYS)
        mosaic = {k: _integer(v, f"mosaic.{k}", path, _MAX_UNITS) for k, v in raw.items()}
    elementwise = _positive(top["elementwise"], "elementwise", path) if "elementwise" in top else None
    loop_overhead = _positive(top.get("loop_overhead", 0.0), "loop_overhead", path, zero=True)
    accumulate_pass = _boolean(top.get("accumulate_pass", False), "accumulate_pass", path)
    launch_overhead = _positive(top.get("launch_overhead", 0.0), "launch_overhead", path, zero=True)
    return Hardware(key, name, sms, tuple(levels), peak, divisibility, tensor_core, devices, launch, elementwise,
                    loop_overhead, accumulate_pass, launch_overhead, mosaic)
