"""Scheduled terms -> sympy cost expressions: per-level transfers H_ℓ and peak memory M_ℓ
(values and bytes), FLOPs, and the unfused baseline (paper §2.2, §4).

``cost_of(diagram, schedule, ...)`` is the core; ``cost(theorem, ...)`` costs a checked
theorem's result under its schedule.  Every quantity is a sympy expression in the axis
sizes (symbols where the module leaves them symbolic) and the tile symbols of the schedule;
``Cost.at(...)`` substitutes numbers.  The per-level programs come from ``napkin_cat.schedule.build``
(its docstring states the modelling choices); optimisation, lower bounds and the time model
live in ``napkin_cat.cost.optimise``, ``napkin_cat.cost.bounds`` and ``napkin_cat.cost.roofline``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import sympy
from sympy import Expr

from napkin_cat import ops
from napkin_cat.certify.accumulators import AccumulatorPlan, accumulators_for, float_safe, plan
from napkin_cat.cost import hardware as hw
from napkin_cat.cost.launch import launch, occupancy
from napkin_cat.cost.split import SplitCost, per_point, split_cost
from napkin_cat.kernel import Theorem
from napkin_cat.schedule.build import chosen_accumulator, program
from napkin_cat.schedule.layout import integer_outputs
from napkin_cat.schedule.loopnest import flatten, loop_nest
from napkin_cat.schedule.mesh import whole_tiles
from napkin_cat.schedule.program import Buffer, Inst, Program, max_of, simplified
from napkin_cat.terms import INTEGER_OUTPUT_DTYPE, Box, Diagram, Divides, Partition, Schedule, union_axes

__all__ = ["CONVENTION", "Baseline", "Cost", "CostError", "Launch", "LevelCost", "cost", "cost_of",
           "parallel_factor"]


class CostError(ValueError):
    """A request the cost model cannot serve as asked (sizes, tiles, dtypes, mesh): the caller's
    input, not a defect of the model, so the CLI reports it as a usage error."""


#: the counting convention, printed beside every result: the Napkin paper defines H as the values
#: changing level (§2.2) but leaves open how often a tile counts; its matmul cost (§3.1) needs the
#: total over every group
CONVENTION = (
    "H_l counts the values loaded into level l from its parent level and saved from l back, each "
    "load or save once per iteration of every loop around it, so an array lacking a grouped axis is "
    "re-loaded by every group (as the Napkin paper's matmul cost, §3.1, requires). M_l is the largest "
    "live set at l over the columns of the schedule, per group. FLOPs: 2k per output element of a "
    "contraction over k elements (n·k for n operands), other boxes ops.OPS[op].flops per point of "
    "their iteration space; work "
    "repeated by groups that lack an axis is counted. Tiles are assumed to divide their axes unless "
    "padded (then trips are rounded up). Masked streams count the Pallas kernel: where a where mask "
    "fills whole chunks of a stream with the accumulator's padding (an affine conjunction of the "
    "streamed and grouped indices, or a disjunction of such, napkin_cat/schedule/masks.py), the Pallas "
    "kernel skips them and the loads, "
    "saves and FLOPs inside the stream count once per (group, chunk) pair that can hold a true "
    "position (about half of causal attention's; exact when the chunk tile divides the group tile); "
    "the plain-JAX target skips the same chunks in the block it maps (lax.cond), and runs every chunk "
    "when it vectorises the masked group instead. A mask read from data (a select of an integer mask, "
    "napkin_cat/schedule/datamask.py) is costed at the given live fraction of the pairs (--live; default 1, "
    "every chunk), plus its block mask, computed before the kernel: the mask's integer inputs read once, "
    "the kinds of every (program, chunk) pair and each program's list of live chunks written, and per "
    "program a count and per live pair a chunk index and a full flag read by the kernel."
)


@dataclass(frozen=True)
class LevelCost:
    """One memory level: transfers into and out of it (from/to ``parent``) and its peak memory.

    The top level (hbm) has no parent: its ``transfers`` are 0 and its ``memory`` is the
    footprint of the arrays that live there.

    The transfers are kept as counted (``counted``, ``counted_bytes``: the view's count, then
    what a split or a block mask adds) and simplified when first read (``simplified``, each sum
    in turn, as ``cost_of`` builds them): a search ranks by the bytes alone and a docstring prints
    the values alone, and simplifying a masked stream's count is most of a pricing's time.
    """

    name: str
    parent: str | None
    counted: tuple[Expr, ...]
    counted_bytes: tuple[Expr, ...]
    memory: Expr
    memory_bytes: Expr

    @functools.cached_property
    def transfers(self) -> Expr:
        """Values moved between this level and its parent."""
        return _summed(self.counted)

    @functools.cached_property
    def transfers_bytes(self) -> Expr:
        """Bytes moved between this level and its parent."""
        return _summed(self.counted_bytes)


def _summed(terms: tuple[Expr, ...]) -> Expr:
    """The first term simplified, then each further term added and the sum simplified again."""
    total = simplified(terms[0])
    for term in terms[1:]:
        total = simplified(total + term)
    return total


@dataclass(frozen=True)
class Baseline:
    """The unfused baseline: every box its own kernel, every intermediate saved to hbm and
    loaded back by each consumer; memory is the largest single box's operands and result;
    ``kernels`` the launches (one per box)."""

    transfers: Expr
    transfers_bytes: Expr
    memory: Expr
    memory_bytes: Expr
    flops: Expr
    #: the contractions' share of ``flops`` (``Cost.contract_flops``)
    contract_flops: Expr = sympy.S.Zero
    #: the kernels launched, one per box (each after the first costs ``launch_overhead``)
    kernels: int = 1


@dataclass(frozen=True)
class Cost:
    """The derived cost of a scheduled diagram on one hardware profile."""

    diagram: str
    levels: tuple[LevelCost, ...]
    flops: Expr
    baseline: Baseline
    program: Program
    hardware: hw.Hardware
    dtype: str
    bytes_of: dict[str, int] = field(compare=False)
    sizes: dict[str, Expr] = field(compare=False)
    tiles: dict[str, sympy.Symbol] = field(compare=False)
    convention: str = CONVENTION
    #: the schedule's partitions across devices (``cost_mesh`` costs them; the levels above are
    #: the device schedule's, summed over every device as H_l sums over every group)
    mesh: tuple[Partition, ...] = ()
    #: per mesh axis whose device blocks are whole tiles (``schedule.mesh.whole_tiles``: the theorem
    #: assumes the device's tile divides the mesh tile), that tile (a tile symbol or a number)
    mesh_tiles: dict[str, Expr] = field(default_factory=dict, compare=False)
    #: the accumulator chosen for each streamed node (by node name; the rest take their default)
    accumulators: dict[str, str] = field(default_factory=dict, compare=False)
    #: what a split adds (``cost.split``: its states and re-reads are in the hbm traffic above)
    split: SplitCost | None = None

    def level(self, name: str) -> LevelCost:
        for level in self.levels:
            if level.name == name:
                return level
        raise KeyError(f"no level `{name}` in this schedule (levels: {', '.join(lv.name for lv in self.levels)})")

    @property
    def first(self) -> LevelCost:
        """The level below hbm: its transfers are the hbm traffic."""
        return self.levels[1]

    @property
    def programs(self) -> Expr:
        """How many programs run in parallel: the product of the trips of the group loops at
        the level below hbm (the kernel's grid; one program per group) and of a split's blocks."""
        loops = self.program.nest.loops
        return sympy.Mul(*(trips for lp, trips in zip(loops, self.program.trips, strict=True)
                           if (lp.kind == "group" and lp.level == self.first.name) or lp.kind == "split"))

    @functools.cached_property
    def on_chip(self) -> tuple[Expr, Expr, Expr, Expr]:
        """Per program at the compute level, as a Triton program holds them (``cost.launch``):
        the computed values (intermediates and accumulator states, 32-bit each) kept in
        registers, the bytes of blocks loaded outside any stream (one copy in shared memory),
        and the bytes of chunks loaded inside a stream (one copy per pipeline stage), each the
        largest over the columns; and the program's rows, which its warps split: the fewest
        grouped positions (the product of a computed tile's extents along group axes) of any
        computed tile that has a group axis (else the largest tile's size: nothing to split)."""
        view = next(v for v in self.program.views if v.level == self.program.compute_level)
        loops = self.program.nest.loops
        streamed = {s.array for s in view.steps
                    if s.op == "load" and any(loops[i].folds for i, _ in s.path)}

        def peak(keep: Callable[[Buffer], bool], weight: Callable[[str], int]) -> Expr:
            return max_of([sympy.Add(*(b.size / b.copies * weight(b.array) for b in view.live(step.index) if keep(b)))
                           for step in view.steps])

        computed = [b for b in view.buffers if b.role in ("value", "state")]
        grouped = {lp.axis for lp in loops if lp.kind == "group"}
        rows = [sympy.Mul(*(n for a, n in b.shape if a in grouped)) for b in computed
                if any(a in grouped for a, _ in b.shape)]
        return (peak(lambda b: b.role in ("value", "state"), lambda _: 1),
                peak(lambda b: b.role == "load" and b.array not in streamed, self.bytes_of.__getitem__),
                peak(lambda b: b.role == "load" and b.array in streamed, self.bytes_of.__getitem__),
                sympy.Min(*rows) if rows else max_of([b.size for b in computed] or [sympy.Integer(1)]))

    def launched(self, values: Mapping[str, float | int]) -> Launch | None:
        """How a Triton program of these tiles is launched on ``hardware`` (``cost.launch``),
        or None for a profile without launch rules."""
        if not self.hardware.launch:
            return None
        return self.launch_of(*(float(self.at(e, values)) for e in self.on_chip))

    def launch_of(self, registers: float, fixed: float, staged: float, rows: float) -> Launch:
        """``launched`` from the numbers ``on_chip`` gives at some tiles."""
        rule = self.hardware.launch
        smem = self.hardware.level(self.program.compute_level).capacity
        warps, stages, fits = launch(registers, staged, rows, smem=smem - fixed, **rule)
        used = fixed + staged * stages
        resident = occupancy(registers, used, warps, rule["registers_per_thread"], rule["register_budget"],
                             self.hardware.level("reg").capacity, smem)
        return Launch(warps, stages, fits, registers, registers / (32 * warps), used, resident,
                      (staged > 0 and stages >= 2) or resident >= 2)

    @functools.cached_property
    def contract_flops(self) -> Expr:
        """The contractions' share of ``flops``: tensor-core work, timed at the dtype's peak
        (the rest at the elementwise rate, a GPU's CUDA cores' f32 peak: ``cost.roofline``)."""
        return _flops(self.program, contractions=True)

    @property
    def other_flops(self) -> Expr:
        """Every FLOP but the contractions': the other boxes' and the folds' (``cost.roofline``
        times them at the profile's elementwise rate, by default its f32 peak)."""
        return self.flops - self.contract_flops + self.fold_flops

    @functools.cached_property
    def fold_flops(self) -> Expr:
        """FLOPs of folding each chunk of a stream into its accumulator's state, beyond the
        chunk's own (the online softmax's correction of its running output: ``update`` less
        ``lift`` of the accumulator, or ``combine`` without an update; the float-safe l2/rms
        state's |s|, running max, scaling and rescaling besides), once per chunk; on a profile
        with ``accumulate_pass`` also a summed contraction's add (``_fold_flops``)."""
        return _fold_flops(self.program, self.accumulators, self.hardware.accumulate_pass)

    @functools.cached_property
    def work(self) -> tuple[Expr, ...]:
        """What ``cost.roofline`` times, as expressions in the sizes and tiles: the bytes moved
        into each level below hbm, the contraction FLOPs, the other FLOPs (boxes and folds),
        the programs, the loop trips (``iterations``), then for each array loaded from hbm
        (``loaded_from_hbm``'s order) the bytes loaded and its own bytes (which of those loads
        are re-reads an L2 can serve)."""
        flat = self.program.nest.flat
        pairs = [(n, _size(self.program, flat.type_of(a)) * self.bytes_of[a]) for a, n in self._loads.items()]
        return (*(lv.transfers_bytes for lv in self.levels[1:]), self.contract_flops, self.other_flops, self.programs,
                self.iterations, *(e for pair in pairs for e in pair))

    @property
    def iterations(self) -> Expr:
        """How many times the innermost loop body runs: every loop's trips multiplied (the
        grid's programs times each program's chunks)."""
        return sympy.Mul(*self.program.trips)

    @functools.cached_property
    def _loads(self) -> dict[str, Expr]:
        """Bytes loaded from hbm into the level below it, per array."""
        view = next(v for v in self.program.views if v.level == self.first.name)
        homes = dict(self.program.homes)
        loaded: dict[str, Expr] = {}
        for s in view.steps:
            if s.op == "load" and homes.get(s.array) == "hbm":
                loaded[s.array] = loaded.get(s.array, sympy.Integer(0)) + s.count * s.size * self.bytes_of[s.array]
        return loaded

    @functools.cached_property
    def loaded_from_hbm(self) -> tuple[tuple[str, bool], ...]:
        """Each array loaded from hbm, and whether the programs that share its blocks run next
        to each other: the grid axes it lacks (whose programs re-read it) are all axes that no
        streamed input has, which the Pallas lowering puts first in its grid, the fastest
        (``schedule.layout``: the query blocks of attention, which share one head's K and V)."""
        flat = self.program.nest.flat
        loops = self.program.nest.loops
        streams = {lp.axis for lp in loops if lp.folds}
        streamed = {a for _, axes in flat.inputs if streams & set(axes) for a in axes}
        grid = {lp.axis for lp in loops if lp.kind == "group" and lp.level == self.first.name}
        return tuple((a, bool(streams) and not (grid - set(flat.type_of(a))) & streamed) for a in self._loads)

    def at(self, expr: Expr, values: Mapping[str, float | int]) -> Expr:
        """``expr`` with axis sizes and tiles given by name substituted."""
        table = {sym: values[name] for name, sym in self.symbols().items() if name in values}
        return sympy.sympify(expr).subs(table)

    def symbols(self) -> dict[str, sympy.Symbol]:
        """Every free symbol by name: symbolic axis sizes and tile names."""
        syms = {name: s for name, s in self.sizes.items() if isinstance(s, sympy.Symbol)}
        return syms | dict(self.tiles)


@dataclass(frozen=True)
class Launch:
    """A Triton program's launch (``Cost.launched``): warps and pipeline stages chosen, whether
    its tiles fit the register budget and shared memory at all, the values it keeps in
    registers (in all, and per thread), its shared-memory bytes and the programs per SM."""

    num_warps: int
    num_stages: int
    fits: bool
    registers: float
    per_thread: float
    smem_bytes: float
    occupancy: int
    #: whether its transfers overlap its compute: its streamed chunks are pipelined (two or
    #: more stages) or another program shares its SM (``cost.roofline``)
    overlaps: bool = False


def cost(theorem: Theorem, schedule: Schedule | None = None, **options: Any) -> Cost:
    """The cost of a checked theorem: its result under its schedule, or under ``schedule``
    (the one a target realises, e.g. ``lower.realised_schedule``: the proved one with woven
    axes on a Pallas grid one position per program).  ``TypeError`` for anything but a
    ``kernel.Theorem``; ``cost_of`` is the model itself, on a diagram and a schedule.

    Accumulators chosen by the kernel for each stream are used for the state sizes.
    """
    if not isinstance(theorem, Theorem):
        raise TypeError(f"cost takes a kernel Theorem, not {type(theorem).__name__} (cost_of costs a bare schedule)")
    chosen = {_node_key(box): name for _axis, box, name in theorem.accumulators}
    return cost_of(theorem.result, theorem.schedule if schedule is None else schedule, accumulators=chosen,
                   source=theorem.source, constraints=theorem.constraints, **options)


def _node_key(box: Box) -> str:
    return f"{box.op}:{box.target}:{box.params}"


def cost_of(diagram: Diagram, schedule: Schedule, hardware: str | hw.Hardware = "h100",
            sizes: Mapping[str, int] | None = None, dtypes: Mapping[str, str] | None = None,
            dtype: str = "bf16", accumulators: Mapping[str, str] | None = None,
            source: Diagram | None = None, stages: int = 1, live: float = 1.0,
            constraints: Sequence[Divides] = ()) -> Cost:
    """Derive H_ℓ, M_ℓ and FLOPs of ``diagram`` run under ``schedule``.

    ``sizes`` gives symbolic axes a size (unknown names raise CostError); ``dtypes`` maps array
    names (inputs, let names) to number formats, overriding the schedule's ``dtype`` steps and
    the default ``dtype``; ``accumulators`` maps a consuming box (``op:target:params``) to the
    accumulator that streams it.  The unfused baseline is that of ``source`` (the diagram
    before any rewrite; default ``diagram``).  ``stages`` multi-buffers every chunk loaded in a
    stream (``pseudo_build.program``): 1 is the paper's model, 2 double buffering.  ``live``
    is the fraction of chunks a data mask leaves live (``schedule.datamask``; 1: every chunk).
    ``constraints`` are the theorem's divisibility assumptions (``Theorem.constraints``): where one
    says a device tile divides a mesh tile, each device's block is priced in whole tiles
    (``schedule.mesh``, as ``lower.mesh`` realises it).
    """
    prof = hardware if isinstance(hardware, hw.Hardware) else hw.load(hardware)
    nest = loop_nest(diagram, schedule.device())  # one device's program (the mesh: cost_mesh)
    declared = dict(nest.flat.sizes)
    given_sizes = dict(sizes or {})
    unknown = sorted(set(given_sizes) - set(declared))
    if unknown:
        raise CostError(f"sizes name axes that `{diagram.name}` does not use: {', '.join(unknown)}")
    contradicted = [f"{a}={n} (declared {declared[a]})" for a, n in sorted(given_sizes.items())
                    if declared[a] is not None and declared[a] != n]
    if contradicted:
        raise CostError(f"sizes contradict declared sizes: {', '.join(contradicted)}")
    size_syms: dict[str, Expr] = {}
    for axis, n in declared.items():
        given = given_sizes.get(axis, n)
        size_syms[axis] = sympy.Integer(given) if given is not None else sympy.Symbol(axis, positive=True)
    tile_syms = {lp.tile: sympy.Symbol(lp.tile, positive=True) for lp in nest.loops if isinstance(lp.tile, str)}
    clash = sorted(set(tile_syms) & set(declared))
    if clash:
        raise CostError(f"tile names clash with axis names: {', '.join(clash)}")
    by_node = {n.name: accumulators[_node_key(n.expr)] for n in nest.flat.nodes
               if isinstance(n.expr, Box) and accumulators and _node_key(n.expr) in accumulators}
    prog = program(nest, size_syms, tile_syms, by_node, stages, live)
    integers = frozenset(p.name for p in (*diagram.inputs, *(source.inputs if source else ())) if p.integer)
    bytes_of = _bytes_of(nest.flat, schedule, dtypes or {}, dtype, integers, diagram)
    for view in prog.views:
        prof.level(view.level)  # every level the schedule uses must exist on the hardware
    levels = [_top(prog, bytes_of)]
    for view in prog.views:
        levels.append(LevelCost(view.level, view.parent, (view.transfers(),), (view.transfers(bytes_of),),
                                view.memory(), view.memory(bytes_of)))
    try:
        split = split_cost(prog, bytes_of, by_node)
    except ValueError as exc:  # several splits: the caller's schedule, not a defect of the model
        raise CostError(str(exc)) from None
    if split is not None:  # its partial states and re-reads cross hbm too
        levels[1] = replace(levels[1], counted=(*levels[1].counted, split.transfers),
                            counted_bytes=(*levels[1].counted_bytes, split.transfers_bytes))
        levels[0] = replace(levels[0], memory=levels[0].memory + split.states,
                            memory_bytes=levels[0].memory_bytes + split.states_bytes)
    if prog.block_mask is not None:  # a data mask's block mask: computed before the kernel, from hbm
        mask = prog.block_mask
        elements = {name: sympy.Mul(*(size_syms[a] for a in nest.flat.type_of(name))) for name in mask.reads}
        levels[1] = replace(levels[1], counted=(*levels[1].counted, mask.transfers(elements)),
                            counted_bytes=(*levels[1].counted_bytes, mask.transfers(elements, bytes_of)))
    base = prog if source is None else program(loop_nest(source, Schedule()), size_syms, tile_syms)
    base_bytes = bytes_of if source is None else \
        _bytes_of(base.nest.flat, Schedule(), dtypes or {}, dtype, integers, source, strict=False)
    flops = _flops(prog) if split is None else simplified(_flops(prog) + split.flops)  # the combine's too
    whole = {axis: sympy.Symbol(t, positive=True) if isinstance(t, str) else sympy.Integer(t)
             for axis, t in whole_tiles(schedule, constraints).items()}  # a tile symbol is ``tile_syms``'s
    return Cost(diagram.name, tuple(levels), flops, _baseline(base, base_bytes), prog, prof,
                hw.canonical_dtype(dtype), bytes_of, size_syms, tile_syms, mesh=schedule.mesh, accumulators=by_node,
                split=split, mesh_tiles=whole)


def _bytes_of(flat: Any, schedule: Schedule, dtypes: Mapping[str, str], default: str,
              integers: frozenset[str] = frozenset(), diagram: Diagram | None = None,
              strict: bool = True) -> dict[str, int]:
    """Bytes per value of every array: an integer input (``integers``) at ``hw.INT_BYTES``
    whatever the float dtype (``dtypes`` naming one is refused), an integer-valued output of
    ``diagram`` (``flat``'s; ``integer_outputs``) at the width of ``INTEGER_OUTPUT_DTYPE``, which
    the targets store it in whatever the kernel's dtype or a ``dtype`` step says, every other
    array at its number format; ``strict`` refuses dtypes for arrays that do not exist (the source
    diagram of a rewrite may lack arrays the rewrite introduced)."""
    names = [name for name, _ in flat.inputs] + [n.name for n in flat.nodes]
    chosen: dict[str, str] = {}
    for q in schedule.quantisations:
        for name in q.names:
            chosen[name] = q.dtype
    chosen.update(dtypes)
    unknown = sorted(set(dtypes) - set(names) - {n.rsplit(".", 1)[-1] for n in names})
    if unknown and strict:
        raise CostError(f"dtypes name arrays that do not exist: {', '.join(unknown)}")
    fixed = sorted(set(dtypes) & integers)
    if fixed:
        raise CostError(f"dtypes name integer inputs, which are {hw.INT_DTYPE} whatever the float dtype: "
                        f"{', '.join(fixed)}")
    stored = {flat.outputs[k] for k in integer_outputs(diagram)} if diagram is not None else set()
    return {n: hw.INT_BYTES if n in integers else hw.bytes_per_value(INTEGER_OUTPUT_DTYPE) if n in stored else
            hw.bytes_per_value(chosen.get(n, chosen.get(n.rsplit(".", 1)[-1], default))) for n in names}


def _size(prog: Program, axes: tuple[str, ...]) -> Expr:
    return sympy.Mul(*(e for _, e in prog.shape(axes, ())))


def _top(prog: Program, bytes_of: Mapping[str, int]) -> LevelCost:
    homes = dict(prog.homes)
    flat = prog.nest.flat
    resident = [n for n, h in homes.items() if h == "hbm"]
    values = sympy.Add(*(_size(prog, flat.type_of(n)) for n in resident))
    weighted = sympy.Add(*(_size(prog, flat.type_of(n)) * bytes_of[n] for n in resident))
    return LevelCost("hbm", None, (sympy.Integer(0),), (sympy.Integer(0),), values, weighted)


def _flops(prog: Program, contractions: bool = False) -> Expr:
    """FLOPs at the compute level: per point of each box's iteration space, times its trips
    (with ``contractions``, of the contraction boxes only, and not simplified: the time model
    evaluates it at numbers)."""
    view = prog.views[-1]
    total = sympy.Integer(0)
    for step in view.steps:
        if step.op != "compute":
            continue
        box = prog.nest.flat.node(step.array).expr
        assert isinstance(box, Box)
        if not contractions or _on_tensor_cores(box):
            total += step.count * _box_flops(box, prog, step.path)
    return total if contractions else simplified(total)


def _box_flops(box: Box, prog: Program, path: tuple[Inst, ...]) -> Expr:
    """A box's FLOPs once, at the extents its axes have inside ``path``."""
    space = union_axes(*(a.axes for a in box.args), box.axes)
    return per_point(box) * sympy.Mul(*(e for _, e in prog.shape(space, path)))


def _fold_flops(prog: Program, chosen: Mapping[str, str], accumulate_pass: bool = False) -> Expr:
    """FLOPs of folding chunks into accumulator states (``Cost.fold_flops``): for each box
    computed inside a stream over an axis it consumes, per chunk, what the plan the kernels run
    (``accumulators.float_safe`` of the proved one) does beyond the proved plan's ``lift``, which
    the box's own FLOPs price: its ``update`` (its ``lift`` and ``combine`` where it has none)
    less the proved ``lift``, counted box by box as ``_flops`` counts the diagram's, at the
    extents inside the stream.  So the proved plans pay for their ``update`` less their ``lift``
    (``combine`` without an update), and the float-safe l2/rms state also for |s|, its running max
    and s·(1/k) per score, its scale per row and the rescaling per state entry and chunk.  An
    ``add`` of a contraction's result is free (the tensor cores accumulate into their operand),
    so a contraction summed over chunks folds at no cost (its ``sum`` state is the MMA's
    accumulator) and the online softmax pays for its correction only.  With ``accumulate_pass``
    (``Hardware``: XLA:CPU) a summed contraction's add is a pass of its own, one FLOP per state
    value per chunk; the online softmax's still rides in its correction's pass."""
    loops = prog.nest.loops
    total = sympy.Integer(0)
    for step in prog.views[-1].steps:
        box = prog.nest.flat.node(step.array).expr if step.op == "compute" else None
        if not isinstance(box, Box):
            continue
        streams = [loops[i] for i, _ in step.path if loops[i].folds and accumulators_for(box, loops[i].axis)]
        if not streams:
            continue
        if ops.OPS[box.op].kind == "contract":  # summed in the MMA's accumulator, or by a pass over the state
            if accumulate_pass:
                total += step.count * sympy.Mul(*(extent for _, extent in prog.shape(box.axes, step.path)))
            continue
        proved, run = _plans(box, streams[-1].axis,
                             chosen_accumulator(box, chosen.get(step.array), streams[-1].partition.via))
        folded = _term_flops(run.update, prog, step.path) if run.update is not None else \
            _term_flops(run.lift, prog, step.path) + _term_flops(run.combine, prog, step.path)
        total += step.count * (folded - _term_flops(proved.lift, prog, step.path))
    return total


def _term_flops(term: Diagram, prog: Program, path: tuple[Inst, ...]) -> Expr:
    """An accumulator term's FLOPs, box by box at the extents inside ``path``; adding a chunk's
    contraction into the state is the MMA's own accumulate (its C operand), free."""
    boxes = [(n.name, n.expr, set(n.reads)) for n in flatten(term).nodes if isinstance(n.expr, Box)]
    dots = {name for name, box, _ in boxes if _on_tensor_cores(box)}
    return sympy.Add(*(_box_flops(box, prog, path) for _, box, reads in boxes
                       if not (box.op == "add" and dots & reads)))


@functools.lru_cache(maxsize=256)
def _plans(box: Box, axis: str, name: str) -> tuple[AccumulatorPlan, AccumulatorPlan]:
    """(the proved plan, the plan the kernels run: ``accumulators.float_safe``)."""
    proved = plan(box, axis, name)
    return proved, float_safe(proved)


def _on_tensor_cores(box: Box) -> bool:
    """Is the box a contraction (plain or normalised): the work the time model puts on tensor cores?"""
    return ops.OPS[box.op].kind in ("contract", "ncontract")


def _baseline(prog: Program, bytes_of: Mapping[str, int]) -> Baseline:
    flat = prog.nest.flat
    moved, weighted, sizes_per_box, bytes_per_box = [], [], [], []
    flops, contract = sympy.Integer(0), sympy.Integer(0)
    for node in flat.nodes:
        if node.name in prog.constants:
            continue
        box = node.expr
        assert isinstance(box, Box)
        arrays = [r for r in dict.fromkeys(node.reads) if r not in prog.constants] + [node.name]
        moved += [_size(prog, flat.type_of(a)) for a in arrays]
        weighted += [_size(prog, flat.type_of(a)) * bytes_of[a] for a in arrays]
        sizes_per_box.append(sympy.Add(*(_size(prog, flat.type_of(a)) for a in arrays)))
        bytes_per_box.append(sympy.Add(*(_size(prog, flat.type_of(a)) * bytes_of[a] for a in arrays)))
        own = _box_flops(box, prog, ())
        flops += own
        contract += own if _on_tensor_cores(box) else 0
    return Baseline(sympy.Add(*moved), sympy.Add(*weighted), max_of(sizes_per_box), max_of(bytes_per_box), flops,
                    contract, max(1, len(sizes_per_box)))


def parallel_factor(programs: float, sms: int) -> float:
    """How much longer than the whole-chip time a grid of ``programs`` takes on ``sms``
    multiprocessors: the peaks and bandwidths are the chip's, reached only with every SM
    busy, and the programs run in ceil(P / S) waves of at most S, each program doing 1/P of
    the work, so the time is ceil(P / S) · S / P of the ideal (1 when P is a multiple of S;
    S / P, the idle SMs' share, when P < S)."""
    if programs <= 0 or sms <= 0:
        return 1.0
    return math.ceil(programs / sms) * sms / programs
