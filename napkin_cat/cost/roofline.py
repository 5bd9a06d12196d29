"""The time model: how long one configuration's work (``Cost.work``, at numbers) takes on a
hardware profile.  One place for the tile search (``optimise.search``), ``napkin cost``
(``timing``) and the mesh's time per device (``mesh.mesh_times``).

- **Compute**: the contractions' FLOPs at the dtype's peak (tensor cores), every other FLOP
  (elementwise and reduction boxes, folding chunks into accumulator states) at the profile's
  ``elementwise`` rate, by default the f32 peak of the CUDA cores, which do that work in f32
  (FlashAttention-2's point: the non-matmul FLOPs cost many times more each).  The two add: a
  program's warps do both in turn.
- **Transfers**: each level's bytes over its parent's bandwidth.  Where the schedule goes from
  hbm straight to an on-chip level and the profile has an ``l2`` between them, every byte passes
  through the L2 (timed at its bandwidth, reported as ``l2``) and hbm serves the first read of
  each array, the writes, and the re-reads only if they do not fit.  They fit when the blocks
  of the re-read arrays that the programs in flight (SMs x programs per SM) touch together fit
  the L2's capacity: each program loads ``loaded / programs`` of an array, and an array loaded
  ``r`` times is shared by ``r`` programs; where those run next to each other
  (``Cost.loaded_from_hbm``: the lowering's grid order) the programs in flight touch
  ``(in flight + r) / r`` distinct blocks of it, else up to one block each.
- **Loop overhead**: a profile's ``loop_overhead`` seconds for each trip of the innermost
  loop body (``Cost.iterations``), added to both times; zero on the GPUs, where a program's
  loop is compiled code.  XLA:CPU runs each trip as a sequence of library calls.  A split's
  combine is a second kernel: its ``launch_overhead`` is added the same way (``cost.split``),
  as it is for every kernel after the first of the unfused baseline (``unfused``).
- **Serial** adds compute and transfers (a byte's way from hbm through the L2 counted once, at
  the slower of the two); **overlapped** takes their maximum (a roofline).  A
  Triton program whose launch pipelines its streamed chunks (``num_stages`` >= 2) or shares its
  SM with another (occupancy >= 2) overlaps them, and is ranked by the overlapped time, with
  the serial time to break ties; any other configuration by the serial time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from napkin_cat.cost import Cost, CostError, Launch
from napkin_cat.cost.hardware import Level

__all__ = ["NO_PADDING", "Padding", "Seconds", "Timing", "compute_seconds", "estimate", "timing", "unfused"]


@dataclass(frozen=True)
class Seconds:
    """A configuration's modelled time: compute, each level's transfers (``l2``: the traffic of
    the level below hbm through an L2 the schedule does not name; that level's own entry is its
    hbm side), their sum (``serial``, the L2 path counted once) and maximum, each plus the
    loops' ``overhead`` (trips x the profile's ``loop_overhead``), and ``ranked``: what the
    tile search ranks by (before the grid's parallel factor)."""

    compute: float
    transfers: tuple[tuple[str, float], ...]
    serial: float
    overlapped: float
    ranked: float
    overhead: float = 0.0

    @property
    def transfer(self) -> float:
        """The transfers' share of the serial time (the L2 path counted once)."""
        return self.serial - self.compute - self.overhead


class Padding(NamedTuple):
    """How much more a configuration moves and computes for tiles that lack the hardware's
    preferred multiples (``optimise.padding``): ``arrays``, each array's factor on its hbm traffic
    (the largest of them on the hbm traffic of arrays not loaded from hbm: stores, intermediates);
    ``flops``, the factor on the contraction FLOPs."""

    arrays: tuple[tuple[str, float], ...] = ()
    flops: float = 1.0

    def moved(self, level_bytes: float, loads: Sequence[tuple[str, float, float]]) -> tuple[float, list[float]]:
        """The hbm level's bytes and the loads' (bytes, own bytes) as padded."""
        factor = dict(self.arrays)
        names = {a for a, _, _ in loads}
        rest = max((f for a, f in factor.items() if a not in names), default=1.0)
        loaded = sum(n for _, n, _ in loads)
        padded = sum(n * factor.get(a, 1.0) for a, n, _ in loads) + max(0.0, level_bytes - loaded) * rest
        return padded, [b * factor.get(a, 1.0) for a, n, own in loads for b in (n, own)]


NO_PADDING = Padding()


def estimate(c: Cost, work: Sequence[float], launch: Launch | None = None,
             padding: Padding = NO_PADDING) -> Seconds:
    """The time of ``c.work`` evaluated at one configuration (``work``, in its order), launched
    as ``launch`` (None: no launch rules, ranked by the serial time), with the hbm traffic and
    the contraction FLOPs grown by ``padding`` (``optimise.padding``: tiles that lack the
    preferred multiples run as if padded to them)."""
    hw = c.hardware
    levels = c.levels[1:]
    moved = list(work[:len(levels)])
    contract, other, programs, iterations = work[len(levels):len(levels) + 4]
    contract *= padding.flops
    loads = list(work[len(levels) + 4:])
    if padding != NO_PADDING and levels:
        named = [(name, n, own) for (name, _), n, own in zip(c.loaded_from_hbm, loads[::2], loads[1::2],
                                                              strict=True)]
        moved[0], loads = padding.moved(moved[0], named)
    compute = compute_seconds(c, contract, other)
    overhead = iterations * hw.loop_overhead + (c.split.launches - 1 if c.split else 0) * hw.launch_overhead
    transfers: list[tuple[str, float]] = []
    l2 = _implicit_l2(c)
    path = 0.0  # the serial time of the transfers: a byte through hbm and the L2 counted once
    for lv, bytes_moved in zip(levels, moved, strict=True):
        assert lv.parent is not None
        bandwidth = hw.level(lv.parent).bandwidth or float("inf")
        if lv is c.first and l2 is not None:
            inflight = max(1.0, min(programs, hw.sms * (launch.occupancy if launch is not None else 1)))
            footprint, reread = 0.0, 0.0
            for (n, own), (_, adjacent) in zip(zip(loads[::2], loads[1::2], strict=True), c.loaded_from_hbm,
                                               strict=True):
                if n > own:
                    shared, block = n / own, n / max(programs, 1.0)  # programs per byte, bytes per program
                    blocks = (inflight + shared) / shared if adjacent else inflight
                    footprint, reread = footprint + min(own, blocks * block), reread + n - own
            from_hbm = bytes_moved - reread if footprint <= l2.capacity else bytes_moved
            transfers += [(lv.name, from_hbm / bandwidth), ("l2", bytes_moved / (l2.bandwidth or float("inf")))]
            path += max(t for _, t in transfers[-2:])
        else:
            transfers.append((lv.name, bytes_moved / bandwidth))
            path += transfers[-1][1]
    overlapped = max([compute, *(t for _, t in transfers)]) + overhead
    serial = compute + overhead + path
    return Seconds(compute, tuple(transfers), serial, overlapped,
                   overlapped if launch is not None and launch.overlaps else serial, overhead)


def unfused(c: Cost) -> tuple[float, float, float]:
    """The unfused baseline's time (``Cost.baseline``: every box its own kernel, with the whole
    chip and unlimited memory) as (compute, hbm transfers, launch overhead): one launch per
    box, each after the first at the profile's ``launch_overhead``, as a split's combine."""
    base = c.baseline
    hbm = c.hardware.level("hbm").bandwidth or math.inf
    flop = float(compute_seconds(c, base.contract_flops, base.flops - base.contract_flops))
    return flop, float(base.transfers_bytes) / hbm, (base.kernels - 1) * c.hardware.launch_overhead


def compute_seconds(c: Cost, contract: Any, other: Any) -> Any:
    """Compute time (numbers or sympy expressions): ``contract`` FLOPs at the dtype's peak,
    ``other`` FLOPs at the profile's ``elementwise`` rate, else at the f32 peak (the dtype's
    where the profile gives no f32 peak)."""
    hw = c.hardware
    peak = hw.peak_flops(c.dtype)
    return contract / peak + other / (hw.elementwise or hw.peak.get("f32", peak))


def _implicit_l2(c: Cost) -> Level | None:
    """The profile's ``l2`` level where the schedule skips it (hbm straight to the level below)."""
    names = {lv.name for lv in c.levels}
    if "l2" in names or c.first.parent != "hbm":
        return None
    return next((lv for lv in c.hardware.levels if lv.name == "l2" and lv.bandwidth), None)


@dataclass(frozen=True)
class Timing:
    """A time estimate (seconds, ``cost.roofline``): compute (``flop_time``: contractions at
    the dtype's peak, other FLOPs at the elementwise rate), each level's transfers, their sum
    (``serial``) and maximum (``overlapped``), each plus the loops' ``overhead``;
    ``intensity`` is FLOPs per byte hbm serves (after the L2's hits), ``ridge`` the dtype's
    peak per byte of hbm bandwidth."""

    flop_time: float
    transfer_times: tuple[tuple[str, float], ...]
    serial: float
    overlapped: float
    intensity: float
    ridge: float
    overhead: float = 0.0


def timing(c: Cost, values: Mapping[str, float | int] | None = None,
           padding: Padding = NO_PADDING) -> Timing:
    """Time estimate on ``c.hardware`` (``cost.roofline``) with sizes and tiles given by name in
    ``values``, the bytes moved and the contraction FLOPs multiplied by ``padding`` (``estimate``);
    raises CostError unless they make every quantity a number."""
    vals = values or {}
    try:
        work = [float(c.at(e, vals)) for e in c.work]
        flops = float(c.at(c.flops, vals))
    except TypeError as err:
        missing = sorted(set(c.symbols()) - set(vals))
        raise CostError(f"a time estimate needs every size and tile: give {', '.join(missing)}") from err
    t = estimate(c, work, c.launched(vals), padding)
    hbm = dict(t.transfers)[c.first.name] * (c.hardware.level("hbm").bandwidth or 0.0)  # what hbm serves
    return Timing(t.compute, t.transfers, t.serial, t.overlapped, flops / hbm if hbm else math.inf,
                  c.hardware.ridge(c.dtype, "hbm"), t.overhead)
