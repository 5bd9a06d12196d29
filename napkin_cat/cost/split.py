"""The cost of a split reduction (``split a by k``, README "Split reductions").

``cost.cost_of`` costs the loop nest with the split as an outer fold of ``a`` (``Loop.folds``):
each block's chunks, loads and FLOPs counted once, as the programs do between them.  What a
split adds beyond that fold, over n = ⌈|a|/k⌉ blocks (n trips of the split loop):

- **states**: every program writes its unfinalised accumulator state to hbm and the combine step
  reads it back: 2 · n · |state| values (each consuming box's state at the sizes of the other
  axes: online softmax's (m, l, o) over the queries), kept in f32 (4 bytes) as the lowering does;
- **re-reads**: an input loaded from hbm that lacks ``a`` (the queries) is loaded by each of the
  n programs where the fold loads it once: (n − 1) times its loads more;
- **programs**: n times the grid's (``Cost.programs``), the parallelism a split buys;
- **launches**: the combine is a second kernel: one more launch, timed at the profile's
  ``launch_overhead`` (``cost.roofline``).

- **combine FLOPs**: the combine merges the n states in order, n − 1 applications of the
  accumulator's ``combine`` term (online softmax's rescale of both states and their sum), each
  box of it counted per point of its space as the diagram's boxes are (``per_point``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import sympy
from sympy import Expr

from napkin_cat import ops
from napkin_cat.certify.accumulators import kernel_plan
from napkin_cat.schedule.build import chosen_accumulator
from napkin_cat.schedule.loopnest import flatten
from napkin_cat.schedule.program import Program
from napkin_cat.terms import Box, union_axes

__all__ = ["STATE_BYTES", "SplitCost", "per_point", "split_cost"]

#: bytes per value of a partial state in hbm (states are computed and kept in f32)
STATE_BYTES = 4


@dataclass(frozen=True)
class SplitCost:
    """What a split adds (module docstring): ``blocks`` (n), the values of every program's state
    together (written once, read back once), and the re-read values of inputs lacking the axis."""

    axis: str
    tile: str | int
    blocks: Expr
    states: Expr
    states_bytes: Expr
    rereads: Expr
    rereads_bytes: Expr
    launches: int = 2
    #: the combine's FLOPs (n - 1 merges of every state)
    flops: Expr = sympy.S.Zero

    @property
    def transfers(self) -> Expr:
        return 2 * self.states + self.rereads

    @property
    def transfers_bytes(self) -> Expr:
        return 2 * self.states_bytes + self.rereads_bytes


def split_cost(prog: Program, bytes_of: Mapping[str, int], accumulators: Mapping[str, str]) -> SplitCost | None:
    """The split of ``prog``'s loop nest (None without one); ValueError for several (``CostError``
    is the cost package's, which imports this module)."""
    nest = prog.nest
    indices = [i for i, lp in enumerate(nest.loops) if lp.kind == "split"]
    if not indices:
        return None
    if len(indices) > 1:
        raise ValueError(f"the cost model prices one split per kernel; this schedule splits "
                         f"{', '.join(nest.loops[i].axis for i in indices)}")
    index = indices[0]
    loop = nest.loops[index]
    blocks = prog.trips[index]

    def size(axes: tuple[str, ...]) -> Expr:
        return sympy.Mul(*(e for _, e in prog.shape(axes, ())))

    states, merge = sympy.Integer(0), sympy.Integer(0)
    for node in nest.consumers(loop):
        box = node.expr
        assert isinstance(box, Box)
        name = chosen_accumulator(box, accumulators.get(node.name), loop.partition.via)
        acc = kernel_plan(box, loop.axis, name)  # the state the kernels merge
        states += sympy.Add(*(size(axes) for _, axes in acc.state))
        merge += sympy.Add(*(per_point(n.expr) * size(union_axes(*(a.axes for a in n.expr.args), n.expr.axes))
                             for n in flatten(acc.combine).nodes if isinstance(n.expr, Box)))
    first = prog.views[0]
    homes = dict(prog.homes)
    loads: dict[str, Expr] = {}
    for s in first.steps:
        if s.op == "load" and homes.get(s.array) == "hbm" and loop.axis not in nest.flat.type_of(s.array):
            loads[s.array] = loads.get(s.array, sympy.Integer(0)) + s.count * s.size
    rereads = sympy.Add(*((blocks - 1) * n for n in loads.values()))
    rereads_bytes = sympy.Add(*((blocks - 1) * n * bytes_of[a] for a, n in loads.items()))
    return SplitCost(loop.axis, loop.tile, blocks, blocks * states, blocks * states * STATE_BYTES,
                     rereads, rereads_bytes, flops=(blocks - 1) * merge)


def per_point(box: Box) -> Expr:
    """A box's FLOPs per point of its iteration space (``ops`` docstring: a contraction of n operands costs n per
    point, 2k per output element for two)."""
    info = ops.OPS[box.op]
    return sympy.Integer(len(box.args)) if info.kind == "contract" else _rational(info.flops)


@functools.cache
def _rational(flops: float) -> Expr:
    """An op's FLOPs per point as the rational it stands for (``nsimplify``, a parse per call:
    remembered, since the search prices every box of every candidate)."""
    return sympy.nsimplify(flops)
