"""How a Triton program is launched: ``num_warps`` from the registers its tiles need,
``num_stages`` from the shared memory its streamed chunks need, and how many programs share
an SM (occupancy).  One rule for the tile search (``optimise.search``), ``napkin cost`` and
the Pallas kernels, which call ``launch`` at trace time on their actual block shapes (the
function is copied into each generated module, so it uses no module globals).

The model (README "Cost model"): Triton keeps a program's computed tiles (score tiles,
intermediates, accumulator states; counted as 32-bit values, they are computed in f32) in
registers, and its loaded blocks in shared memory, one copy per pipeline stage.  A program of
``w`` warps has ``registers_per_thread · 32 · w`` registers; only ``register_budget`` of them
are counted for the named tiles, the rest hold addresses, dot fragments and temporaries (the
share is calibrated by benchmarks/gpu_static.py against ptxas's spill report).  Warps split a
program's rows: Triton gives every warp its own rows when dots chain (FlashAttention's two
dots; ``warpsPerTileV3`` in its AccelerateMatmul pass), and an MMA fragment has 16 of them, so
more warps than ``rows / rows_per_warp`` compute the same rows twice (measured: a 64-row
attention tile at 8 warps runs 1.9x the SASS per score of 4 warps) and hold no more values.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["launch", "occupancy"]


def launch(values: float, staged: float, rows: float, registers_per_thread: int, warps: Sequence[int],
           register_budget: float, rows_per_warp: int, stages: Sequence[int], smem: float) -> tuple[int, int, bool]:
    """``(num_warps, num_stages, fits)``: the fewest warps whose budgeted registers hold
    ``values`` 32-bit values, among those that give each warp ``rows_per_warp`` of the
    program's ``rows`` (the fewest choice always may), and the most pipeline stages whose
    copies of ``staged`` bytes fit in ``smem``; ``fits`` is False (with the most such warps,
    the fewest stages) when none does."""
    usable = [w for w in warps if w == min(warps) or rows >= rows_per_warp * w]
    w = next((w for w in usable if values <= register_budget * registers_per_thread * 32 * w), None)
    s = next((s for s in stages if staged * s <= smem), None)
    return (max(usable) if w is None else w), (min(stages) if s is None else s), w is not None and s is not None


def occupancy(values: float, smem_bytes: float, num_warps: int, registers_per_thread: int,
              register_budget: float, register_file: float, smem: float) -> int:
    """Programs resident on one SM: limited by its register file (each thread holding its
    budgeted values, at most ``registers_per_thread``) and by its shared memory (each program
    using ``smem_bytes``: its blocks, and its chunks once per stage)."""
    per_thread = min(registers_per_thread, max(1.0, values / (32 * num_warps * register_budget)))
    by_registers = register_file // (4 * per_thread * 32 * num_warps)
    by_smem = smem // smem_bytes if smem_bytes else by_registers
    return int(max(0, min(by_registers, by_smem)))
