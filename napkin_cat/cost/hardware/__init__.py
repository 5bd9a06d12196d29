"""Hardware profiles as data: memory levels, capacities, bandwidths, peak FLOP/s, tile constraints.

Each profile is a TOML file in this package (``h100.toml``, ``h200.toml``, ``a100.toml``,
``cpu.toml``),
read with ``tomllib`` through ``importlib.resources`` so that it ships inside the wheel.
Every number in a profile cites its source in a comment.

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

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from napkin_cat.terms import LEVELS

__all__ = ["BYTES", "DTYPE_ALIASES", "Hardware", "HardwareError", "Level", "available", "bytes_per_value",
           "canonical_dtype", "load"]

#: bytes per value of each number format (names as in the kernel's ``dtype`` step)
BYTES: dict[str, int] = {"f64": 8, "f32": 4, "tf32": 4, "bf16": 2, "f16": 2, "fp8e4m3": 1, "fp8e5m2": 1}

#: common spellings of the number formats, by the canonical name they stand for
DTYPE_ALIASES: dict[str, str] = {
    "fp64": "f64", "float64": "f64", "fp32": "f32", "float32": "f32", "fp16": "f16", "float16": "f16",
    "bfloat16": "bf16", "fp8": "fp8e4m3", "fp8_e4m3": "fp8e4m3", "fp8_e5m2": "fp8e5m2",
    "e4m3": "fp8e4m3", "e5m2": "fp8e5m2",
}


class HardwareError(ValueError):
    """An unknown profile, level or dtype, or a malformed profile file."""


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


def load(key: str) -> Hardware:
    """Read a profile by name (``h100``, ``h200``, ``a100``, ``cpu``); raises HardwareError."""
    key = key.lower()
    if key not in available():
        raise HardwareError(f"no hardware profile `{key}` (profiles: {', '.join(available())})")
    data = tomllib.loads(resources.files(__name__).joinpath(f"{key}.toml").read_text(encoding="utf-8"))
    try:
        raw_levels = data["levels"]
        unknown = [name for name in raw_levels if name not in LEVELS]
        if unknown:
            raise HardwareError(f"{key}.toml: unknown levels {unknown} (levels are {', '.join(LEVELS)})")
        levels = tuple(
            Level(name, float(raw_levels[name]["capacity"]),
                  float(raw_levels[name]["bandwidth"]) if "bandwidth" in raw_levels[name] else None,
                  str(raw_levels[name].get("per", "device")))
            for name in LEVELS if name in raw_levels
        )
        peak = {canonical_dtype(k): float(v) for k, v in data["peak"].items()}
        accumulate_pass = data.get("accumulate_pass", False)
        if not isinstance(accumulate_pass, bool):
            raise HardwareError(f"{key}.toml: accumulate_pass must be true or false")
        return Hardware(key, str(data["name"]), int(data["sms"]), levels, peak,
                        dict(data.get("divisibility", {})), dict(data.get("tensor_core", {})),
                        int(raw_levels.get("mesh", {}).get("devices", 1)), dict(data.get("launch", {})),
                        float(data["elementwise"]) if "elementwise" in data else None,
                        float(data.get("loop_overhead", 0.0)), accumulate_pass,
                        float(data.get("launch_overhead", 0.0)))
    except KeyError as exc:
        raise HardwareError(f"{key}.toml: missing field {exc}") from None
