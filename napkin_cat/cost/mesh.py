"""The cost of the ``mesh`` level: a schedule's partitions across the devices of a node.

``cost.cost_of`` costs the device schedule (``Schedule.device``): its H_l and FLOPs are summed
over every device, as over every group.  Over N devices (by default the hardware profile's
devices per node, ``Hardware.devices``) a mesh partition of axis a has blocks of ⌈|a|/N⌉, rounded
up to whole tiles t, ⌈⌈|a|/N⌉/t⌉·t, where the theorem assumes the device's tile t of a divides the
mesh tile (R9's `gq | mq`: ``schedule.mesh.device_block``, the blocks ``lower.mesh`` realises):

- a sharded axis (``group a by t at mesh``) splits the work: each device does its block's share
  (block/|a|: 1/N where N divides a into whole tiles, more where its block is padded) of the FLOPs
  and of the transfers between its hbm and the level below, as the work of a sharded (woven) axis
  is per position;
- a ring (``stream a by t at mesh``) splits every input carrying a into N blocks; each device
  passes the block it holds on N - 1 times and receives N - 1 blocks, so it sends and receives
  (N - 1) blocks of every such input; nothing else crosses the interconnect (inputs start where
  the mesh keeps them, one block per device: placing them is not counted);
- one device's hbm holds its block of every input and output (an input lacking the mesh axes
  whole: every device reads all of it), a ring input twice (the block folded and the one
  arriving);
- time per device: its share of the compute (``cost.roofline``: contractions at the dtype's
  peak, the rest at the elementwise rate; no loop overhead: no profile with a mesh level has
  one), its hbm transfers over hbm's bandwidth (every one: the L2's hits
  are not modelled per device) and the bytes it receives over the interconnect's (the
  ``mesh`` level's bandwidth: what one device receives); serial adds the three, overlapped
  takes the largest (the ring's send does not wait for the fold: ``lower.mesh``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import sympy
from sympy import Expr

from napkin_cat.cost import Cost, CostError
from napkin_cat.cost.roofline import compute_seconds
from napkin_cat.schedule.mesh import device_block
from napkin_cat.terms import MAX_MESH_DEVICES

__all__ = ["MeshCost", "mesh_cost", "mesh_times"]


@dataclass(frozen=True)
class MeshCost:
    """The mesh level of a cost, per device (module docstring); ``blocks`` maps each mesh tile
    name to its block size; ``sends`` (values) is also what each device receives."""

    devices: int
    sharded: str | None
    ring: str | None
    blocks: dict[str, Expr]
    sends: Expr
    sends_bytes: Expr
    memory: Expr
    memory_bytes: Expr
    flops: Expr
    hbm_bytes: Expr
    #: the fraction of the work one device does: its block of the sharded axis over the axis, else 1 (a ring alone)
    share: Expr


def mesh_cost(c: Cost, devices: int | None = None) -> MeshCost | None:
    """The mesh level of ``c`` on ``devices`` devices (default ``c.hardware.devices``), or None
    when its schedule has no partition at mesh.  Raises CostError for a mesh of one axis that
    would shard or ring two axes, or for a count of devices outside 1 to ``MAX_MESH_DEVICES``."""
    if not c.mesh:
        return None
    count = c.hardware.devices if devices is None else devices
    if not 1 <= count <= MAX_MESH_DEVICES:
        raise CostError(f"a mesh has 1 to {MAX_MESH_DEVICES} devices, not {count}")
    if scans := [p.axis for p in c.mesh if p.kind == "scan"]:
        raise CostError(f"the schedule scans {scans[0]} at mesh: its chunks run one after another, each from the "
                        "carry of the one before, which the mesh model does not count; scan at hbm or below")
    groups = [p.axis for p in c.mesh if p.kind == "group"]
    rings = [p.axis for p in c.mesh if p.kind == "stream"]
    if len(groups) > 1 or len(rings) > 1:
        raise CostError(f"a mesh of one axis shards at most one axis and rings at most one; the schedule "
                         f"partitions {', '.join(groups + rings)} at mesh")
    block = {p.axis: sympy.sympify(device_block(c.sizes[p.axis], count, c.mesh_tiles.get(p.axis, 1)))
             for p in c.mesh}
    flat = c.program.nest.flat

    def on_device(axes: tuple[str, ...]) -> Expr:
        return sympy.Mul(*(block.get(a, c.sizes[a]) for a in axes))

    ring = rings[0] if rings else None
    travelling = [(name, axes) for name, axes in flat.inputs if ring in axes]
    sends = sympy.Add(*((count - 1) * on_device(axes) for _, axes in travelling))
    sends_bytes = sympy.Add(*((count - 1) * on_device(axes) * c.bytes_of[name] for name, axes in travelling))
    homes = dict(c.program.homes)
    resident = [(name, flat.type_of(name)) for name, home in homes.items() if home == "hbm"]
    copies = {name: 2 if ring in axes and name in dict(flat.inputs) else 1 for name, axes in resident}
    memory = sympy.Add(*(copies[n] * on_device(axes) for n, axes in resident))
    memory_bytes = sympy.Add(*(copies[n] * on_device(axes) * c.bytes_of[n] for n, axes in resident))
    share = block[groups[0]] / c.sizes[groups[0]] if groups else sympy.Integer(1)
    return MeshCost(count, groups[0] if groups else None, ring, {str(p.tile): block[p.axis] for p in c.mesh},
                    sends, sends_bytes, memory, memory_bytes, c.flops * share, c.first.transfers_bytes * share, share)


def mesh_times(c: Cost, m: MeshCost, values: Mapping[str, float | int] | None = None) -> dict[str, Expr]:
    """Seconds per device: ``compute``, ``hbm`` (its transfers to the level below), ``interconnect``
    (the bytes it receives), ``serial`` (their sum) and ``overlapped`` (their maximum); ``values``
    substitutes sizes and tiles by name.  Raises HardwareError if the profile has no mesh level."""
    vals = values or {}
    hbm = c.hardware.level("hbm").bandwidth
    link = c.hardware.level("mesh").bandwidth
    whole = compute_seconds(c, c.at(c.contract_flops, vals), c.at(c.other_flops, vals))
    times = {"compute": whole * c.at(m.share, vals),
             "hbm": c.at(m.hbm_bytes, vals) / (hbm or sympy.oo),
             "interconnect": c.at(m.sends_bytes, vals) / (link or sympy.oo)}
    parts = list(times.values())
    return times | {"serial": sympy.Add(*parts), "overlapped": sympy.Max(*parts)}
