"""Loop nest -> per-level program: ``program`` lays out the columns and live buffers of every
memory level (the ``pseudo_program`` types) from ``loopnest.loop_nest``'s nodes, loops and
stream phases (the Napkin paper's pseudocode diagrams, §5.1).

It makes these explicit choices (the Napkin paper leaves them open):

- **One view per level.** The transfers into level ℓ and its memory are read off the loop nest
  of the partitions at ℓ or slower (faster partitions iterate inside ℓ's tiles).  Inside a view,
  group loops are outermost: groups are independent parallel tiles (R3), so they commute with
  the streams; streams follow in schedule order, slower levels first.
- **Homes.** Inputs and outputs live in hbm; an intermediate lives where it is placed, else at
  the innermost partition's level.  Boxes run at the compute level (the fastest level used; smem
  for an unscheduled diagram).  An array whose home is slower than the compute level is staged
  through each level in between: loaded into it (each consumer's load hoisted out of every stream
  that does not vary it) and saved from it.  Placing an intermediate at a slower level makes it a
  materialisation boundary: it is saved there and its consumers load it back; a box that reads
  an output (not placed) uses the value still on chip.
- **Counting convention.** A load or save counts once per iteration of every loop around it, so
  an array lacking a grouped axis is re-loaded by every group (the paper's matmul cost, §3.1,
  counts this multiplicity).
- **Columns.** Loads of inputs open their block (pre-allocation, paper §5.1); a node's loads sit
  before it; saves follow the node.  A node that accumulates over a stream gets an ``init``
  column before the stream and a ``final`` column after it (R4: identity, then the finaliser),
  and is saved after that.  A buffer is live from its definition to its last use, through the
  end of every loop it is used in; an accumulator state lives from its init to its final, and
  the finaliser writes the value over it.  An elementwise box writes over an operand
  of the same shape that dies at it.  A buffer's extent along an axis is the tile of the
  innermost loop over that axis enclosing its whole lifetime.
- Compile-time scalars (boxes that read no input, e.g. ``rsqrt(d)``) are folded: they take no
  storage, transfers or FLOPs.  Spilling an accumulator state (FlashAttention-1) is not modelled.
- **Masked streams.** Where ``masks.stream_masks`` decides by its skip rule that a where mask
  makes whole chunks of the (one) streamed axis lift to the accumulators' identity, as the
  Pallas lowering does before skipping them, every step inside that stream (its loads, saves and boxes) is
  counted once per (program, chunk) pair that runs (``masks.chunk_count``: causal attention
  runs about half; a disjunction, the union of its disjuncts' ranges), not once per trip of
  every loop; memory and steps outside the stream are unchanged.  Without a closed form for
  the pairs, every chunk is counted.  Where the mask is read from data
  (``datamask.data_masks``: a document mask), which chunks run is known only at run time: the
  steps are counted by the ``live`` fraction given (``napkin cost --live``), the ids' chunks
  among them; the block mask computed before the kernel (``program.BlockMask``: the ids once,
  a few integers per pair) is the cost package's to add.
- **Gathered tables.** An input read only at the rows gathers name (``datamask.gathered_tables``:
  a paged KV cache's pool) is never loaded whole: each gather loads its rows (the size of its
  result, where and as often as it runs), counted as a load of the gather's value; the value
  computed from them is a buffer of its own (one more copy of the rows than a kernel keeps).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import sympy
from sympy import Expr

from napkin_cat import ops
from napkin_cat.certify.accumulators import AccumulatorPlan, kernel_plan, plan
from napkin_cat.schedule.datamask import data_masks, gathered_tables, tested
from napkin_cat.schedule.loopnest import LoopNest, Node, woven_axes
from napkin_cat.schedule.masks import GroupAxis, chunk_count, stream_masks
from napkin_cat.schedule.program import BlockMask, Buffer, Inst, Program, Step, View, rank
from napkin_cat.terms import Axes, Box

__all__ = ["chosen_accumulator", "program"]


def program(nest: LoopNest, sizes: Mapping[str, Expr], tiles: Mapping[str, Expr],
            accumulators: Mapping[str, str] | None = None, stages: int = 1, live: float = 1.0) -> Program:
    """Build the per-level views of a loop nest.

    ``sizes`` maps every axis to its size (an integer or a positive symbol), ``tiles`` every
    symbolic tile name to its symbol; ``accumulators`` names the accumulator streaming each
    consuming node (else the partition's ``via``, else the op's first accumulator).
    ``stages`` buffers each chunk loaded inside a stream that many times (software
    pipelining: 2 is double buffering; the Pallas Triton backend's default
    ``num_stages`` is 3): memory grows, transfers do not change.  ``live`` is the fraction of
    (program, chunk) pairs a data mask leaves live (``datamask``: 1/8 for eight equal documents
    in blocks that do not straddle two), by which the steps of a stream that a data mask skips
    are counted; 1 (every chunk) is the bound that holds for any data.
    """
    if stages < 1:
        raise ValueError(f"stages must be at least 1, got {stages}")
    if not 0.0 < live <= 1.0:
        raise ValueError(f"the live fraction must be in (0, 1], got {live}")
    return _Builder(nest, sizes, tiles, accumulators or {}, stages, live).build()


def chosen_accumulator(box: Box, given: str | None, via: str | None) -> str:
    """The accumulator that streams ``box``: the theorem's choice (``given``), else the stream
    partition's ``via`` where it can stream the box (the layout's rule: a ``via logsumexp``
    stream's contraction is summed), else the box's first admissible one."""
    admissible = ops.accumulators_for(box.op, box.params)
    return given or (via if via in admissible else admissible[0])


@dataclass(frozen=True)
class _Block:
    """A stream loop instance inside a block (its body is ``_ViewBuilder.blocks[path]``)."""

    path: tuple[Inst, ...]


@dataclass(frozen=True)
class _Move:
    """A load, save, init or final placed in a block (``compute`` when linearised)."""

    op: str
    array: str
    users: tuple[str, ...] = ()


_Item = str | _Block | _Move

class _Builder:
    """Symbols, homes and the compute level shared by the views of one loop nest."""

    def __init__(self, nest: LoopNest, sizes: Mapping[str, Expr], tiles: Mapping[str, Expr],
                 accumulators: Mapping[str, str], stages: int = 1, live: float = 1.0) -> None:
        self.nest, self.flat = nest, nest.flat
        self.stages, self.live = stages, live
        self.sizes = dict(sizes)
        self.tiles = tuple(sympy.Integer(lp.tile) if isinstance(lp.tile, int) else tiles[lp.tile]
                           for lp in nest.loops)
        self.trips = tuple(self._trips(i) for i in range(len(nest.loops)))
        self.accumulators = accumulators
        inputs = {name for name, _ in self.flat.inputs}
        self.constants = self._constants(inputs)
        self.nodes = [n for n in self.flat.nodes if n.name not in self.constants]
        self.homes = {name: "hbm" for name in inputs} | {n.name: self._home(n.name) for n in self.nodes}
        placed = {name for name, _ in nest.placements}
        # an output's hbm home is only its sink: boxes reading it use the value still on chip
        self.sink_only = frozenset(o for o in self.flat.outputs if o not in placed)
        used = {lp.level for lp in nest.loops} | set(self.homes.values())
        self.compute = max(used, key=rank) if used != {"hbm"} else "smem"
        self.levels = sorted(used | {"hbm", self.compute}, key=rank)
        #: inputs read only at the rows gathers name (``datamask.gathered_tables``)
        self.gathered = gathered_tables(self.flat)
        #: a data mask's block mask, computed before the kernel (``_masked``)
        self.block_mask: BlockMask | None = None
        self.masked = self._masked()
        self.runs = {index: runs / full for index, runs, full in self.masked}
        self.stub = Program(nest, (), self.compute, tuple(self.homes.items()), tuple(self.sizes.items()),
                            self.tiles, self.trips, self.constants, self.masked, self.block_mask)

    def _trips(self, index: int) -> Expr:
        loop = self.nest.loops[index]
        outer = self.sizes[loop.axis]
        for j in range(index):
            if self.nest.loops[j].axis == loop.axis:
                outer = self.tiles[j]
        ratio = outer / self.tiles[index]
        return sympy.ceiling(ratio) if loop.partition.pad else ratio

    def _masked(self) -> tuple[tuple[int, Expr, Expr], ...]:
        """The stream a mask cuts short, as the Pallas lowering recognises it: one streamed
        axis, its outermost loop, grid axes at their outermost group loop (woven axes whole),
        each consuming node's padding from its accumulator.  Empty when none applies."""
        loops = self.nest.loops
        streamed = {lp.axis for lp in loops if lp.kind == "stream"}
        if len(streamed) != 1:
            return ()
        axis = streamed.pop()
        outermost = {lp.axis: i for i, lp in reversed(list(enumerate(loops)))}
        index = outermost[axis]
        plans: dict[str, AccumulatorPlan] = {}
        for node in self.flat.nodes:
            if self.nest.phase(loops[index], node.name) != "accumulate" or not isinstance(node.expr, Box):
                continue
            admissible = ops.accumulators_for(node.expr.op, node.expr.params)
            via = loops[index].partition.via
            name = self.accumulators.get(node.name) or (via if via in admissible else None)
            try:
                plans[node.name] = plan(node.expr, axis, name)
            except ValueError:
                return ()
        groups = {a: GroupAxis(self.tiles[i], self.trips[i]) for a, i in outermost.items() if loops[i].kind == "group"}
        for a in woven_axes(self.flat, frozenset(outermost)):
            groups[a] = GroupAxis(self.sizes[a], sympy.Integer(1))
        masks = stream_masks(self.flat, axis, plans, groups)
        if masks is None:  # a mask read from data: the live fraction of the chunks, as given
            found = data_masks(self.flat, axis, plans)
            if found is None or any(lp.kind == "split" for lp in loops):  # a split skips nothing
                return ()
            inputs = {name for name, _ in self.flat.inputs}
            live = sympy.nsimplify(self.live)
            self.block_mask = BlockMask(tuple(sorted(tested(self.flat, found) & inputs)),
                                        sympy.Mul(*(g.trips for g in groups.values())), self.trips[index], live)
            return ((index, live * self.trips[index], self.trips[index]),) if self.live < 1 else ()
        caps = {self.tiles[i]: self.sizes[loops[i].axis] for i in outermost.values()
                if isinstance(self.tiles[i], sympy.Symbol)}
        runs = chunk_count(masks, groups, self.tiles[index], self.trips[index], caps)
        if runs is None:
            return ()
        used = {g for sides in masks for side in sides for g, _ in side.coeffs}
        full = self.trips[index] * sympy.Mul(*(groups[g].trips for g in sorted(used)))
        return ((index, runs, full),)

    def _constants(self, inputs: set[str]) -> frozenset[str]:
        depends: set[str] = set(inputs)
        for n in self.flat.nodes:
            if any(r in depends for r in n.reads):
                depends.add(n.name)
        # an output is computed and written even when no input reaches it
        return frozenset(n.name for n in self.flat.nodes if n.name not in depends and n.name not in self.flat.outputs)

    def _home(self, name: str) -> str:
        return "hbm" if name in self.flat.outputs else self.nest.level_of(name)

    def build(self) -> Program:
        views = tuple(self._view(level, parent) for parent, level in zip(self.levels, self.levels[1:], strict=False))
        return replace(self.stub, views=views)

    # ---- one view ------------------------------------------------------------------------

    def _view(self, level: str, parent: str) -> View:
        visible = [i for i, lp in enumerate(self.nest.loops) if rank(lp.level) <= rank(level)]
        groups = sorted((i for i in visible if self.nest.loops[i].kind == "group"),
                        key=lambda i: rank(self.nest.loops[i].level))
        streams = sorted((i for i in visible if self.nest.loops[i].folds),
                         key=lambda i: rank(self.nest.loops[i].level))
        return _ViewBuilder(self, level, parent, tuple(groups), tuple(streams)).build()

    def phase(self, loop: int, name: str) -> str:
        """The node's phase in a stream loop (loopnest's phases); ``group`` for a group loop."""
        lp = self.nest.loops[loop]
        return "group" if lp.kind == "group" else self.nest.phase(lp, name)

    def state_shapes(self, node: Node, loop: int) -> list[tuple[str, Axes]]:
        """The accumulator state of a node consuming loop's axis, as the kernels hold it
        (``accumulators.float_safe``: the l2/rms state's running max m too): (component, axes) pairs."""
        box = node.expr
        assert isinstance(box, Box)
        lp = self.nest.loops[loop]
        name = chosen_accumulator(box, self.accumulators.get(node.name), lp.partition.via)
        state = [c for c, _ in kernel_plan(box, lp.axis, name).state]
        if ops.OPS[box.op].kind == "ncontract":
            rows = tuple(a for a in box.args[0].axes if a not in box.target)
            return [(c, node.axes if c == "o" else rows) for c in state]
        return [(c, node.axes) for c in state]


class _ViewBuilder:
    """Lays out one view's columns (a tree of blocks), then its buffers."""

    def __init__(self, b: _Builder, level: str, parent: str, groups: tuple[int, ...], streams: tuple[int, ...]):
        self.b, self.level, self.parent = b, level, parent
        self.groups, self.streams = groups, streams
        self.serial = 0
        self.paths: dict[str, tuple[Inst, ...]] = {}
        self.root = tuple((g, 0) for g in groups)  # the group instances around every column
        self.blocks: dict[tuple[Inst, ...], list[_Item]] = {}
        self.blocks[self.root] = self._tree(list(b.nodes), list(streams), self.root)

    def _tree(self, nodes: list[Node], streams: list[int], path: tuple[Inst, ...]) -> list[_Item]:
        """Items of one block: node names and stream sub-blocks (in phase order, R4)."""
        if not streams:
            for n in nodes:
                self.paths[n.name] = path
            return [n.name for n in nodes]
        head, rest = streams[0], streams[1:]
        part = {p: [n for n in nodes if self.b.phase(head, n.name) in p]
                for p in (("before",), ("chunk", "accumulate"), ("after",))}
        items: list[_Item] = self._tree(part[("before",)], rest, path)
        if part[("chunk", "accumulate")]:
            self.serial += 1
            inner = (*path, (head, self.serial))
            self.blocks[inner] = self._tree(part[("chunk", "accumulate")], rest, inner)
            items.append(_Block(inner))
        return items + self._tree(part[("after",)], rest, path)

    def _kept(self, inst: Inst, name: str) -> bool:
        """Must a load or save of ``name`` sit inside this loop instance?"""
        loop = self.b.nest.loops[inst[0]]
        return loop.kind == "group" or loop.axis in self.b.flat.type_of(name) or self.b.phase(inst[0], name) == "chunk"

    def _position(self, path: tuple[Inst, ...], name: str, skip: tuple[Inst, ...] = ()) -> tuple[Inst, ...]:
        kept = [i for i, inst in enumerate(path) if inst not in skip and self._kept(inst, name)]
        cut = kept[-1] + 1 if kept else 0
        return path[:cut]

    def build(self) -> View:
        b, rank_l = self.b, rank(self.level)
        loads: dict[tuple[str, tuple[Inst, ...]], list[str]] = {}
        saves: list[tuple[str, tuple[Inst, ...]]] = []
        for n in b.nodes:
            for arg in dict.fromkeys(n.reads):
                if arg in b.gathered and rank(b.homes[arg]) < rank_l:  # the rows the gather names, as it runs
                    loads.setdefault((n.name, self._position(self.paths[n.name], n.name)), []).append(n.name)
                elif arg not in b.constants and arg not in b.sink_only and rank(b.homes[arg]) < rank_l:
                    loads.setdefault((arg, self._position(self.paths[n.name], arg)), []).append(n.name)
            if rank(b.homes[n.name]) < rank_l:
                saves.append((n.name, self._position(self.paths[n.name], n.name, tuple(self._own(n.name)))))
        if self.level == b.compute:
            self._insert_state()
        self._insert(loads, saves)
        steps, ends = self._linearise()
        return View(self.level, self.parent, self.groups + self.streams, tuple(steps),
                    tuple(self._buffers(steps, ends)), tuple(ends.items()))

    def _own(self, name: str) -> list[Inst]:
        """The stream instances around a node that it accumulates over (outermost first)."""
        return [inst for inst in self.paths[name] if self.b.phase(inst[0], name) == "accumulate"]

    def _insert_state(self) -> None:
        """``init`` before, and ``final`` after, the outermost stream each node accumulates over
        (R4: identity, then the finaliser t once the stream is done)."""
        for n in self.b.nodes:
            own = self._own(n.name)
            if own:
                path = self.paths[n.name]
                scope = path[:path.index(own[0])]
                block = self.blocks[scope]
                at = block.index(_Block((*scope, own[0])))
                after = at + 1
                while after < len(block) and _is_final(block[after]):
                    after += 1  # finals in node order
                block.insert(after, _Move("final", n.name))
                block.insert(at, _Move("init", n.name))

    def _insert(self, loads: dict[tuple[str, tuple[Inst, ...]], list[str]],
                saves: list[tuple[str, tuple[Inst, ...]]]) -> None:
        inputs = {name for name, _ in self.b.flat.inputs}
        for (arg, pos), users in loads.items():
            block = self.blocks[pos]
            if arg in inputs:  # inputs open their block (pre-allocation)
                at = sum(1 for it in block if isinstance(it, _Move) and it.op == "load" and it.array in inputs)
            else:  # an intermediate can only be loaded back after it was saved
                at = min(self._index_of(block, pos, u) for u in users)
            block.insert(at, _Move("load", arg, tuple(users)))
        for name, pos in saves:
            block = self.blocks[pos]
            final = _Move("final", name)
            # a state is saved once it is finalised; anything else right after it is computed
            at = block.index(final) + 1 if final in block else self._index_of(block, pos, name) + 1
            block.insert(at, _Move("save", name))

    def _index_of(self, block: list[_Item], pos: tuple[Inst, ...], name: str) -> int:
        """The index in ``block`` of the item (node or sub-block) that contains node ``name``."""
        target = self.paths[name]
        for i, item in enumerate(block):
            if item == name or (isinstance(item, _Block) and target[:len(item.path)] == item.path):
                return i
        raise AssertionError(f"{name} not under {pos}")

    def _linearise(self) -> tuple[list[Step], dict[Inst, int]]:
        steps: list[Step] = []
        ends: dict[Inst, int] = {}

        def walk(path: tuple[Inst, ...]) -> None:
            for item in self.blocks[path]:
                if isinstance(item, str):
                    self._step(steps, _Move("compute", item), path)
                elif isinstance(item, _Block):
                    walk(item.path)
                    ends[item.path[-1]] = len(steps) - 1
                else:
                    self._step(steps, item, path)

        walk(self.root)
        return steps, ends

    def _step(self, steps: list[Step], move: _Move, path: tuple[Inst, ...]) -> None:
        runs = self.b.runs
        count = sympy.Mul(*(self.b.trips[i] * runs.get(i, 1) for i, _ in path))
        shape = self._shape(self.b.flat.type_of(move.array), path)
        size = sympy.Mul(*(e for _, e in shape)) if move.op in ("load", "save") else sympy.Integer(0)
        steps.append(Step(len(steps), move.op, move.array, path, count, size, move.users))

    def _shape(self, axes: Axes, scope: tuple[Inst, ...]) -> tuple[tuple[str, Expr], ...]:
        return Program.shape(self.b.stub, axes, scope)

    def _buffers(self, steps: list[Step], ends: dict[Inst, int]) -> list[Buffer]:
        b, level = self.b, self.level
        computed = {s.array: s.index for s in steps if s.op == "compute"}
        buffers: list[Buffer] = []

        def span(name: str, role: str, start: int, uses: list[int], scope: tuple[Inst, ...],
                 copies: int = 1) -> None:
            end = max([start, *uses])
            for u in uses:
                for inst in steps[u].path:
                    if inst not in steps[start].path and inst in ends:
                        end = max(end, ends[inst])
            buffers.append(Buffer(name, name, role, self._shape(b.flat.type_of(name), scope), start, end, copies))

        for s in steps:
            if s.op == "load":
                users = [computed[u] for u in s.users]
                chunked = any(inst[0] in self.streams for inst in s.path)
                span(s.array, "load", s.index, users, s.path, b.stages if chunked else 1)
            elif s.op == "save" and level != b.compute:
                shape = self._shape(b.flat.type_of(s.array), s.path)
                buffers.append(Buffer(s.array, s.array, "save", shape, s.index, s.index))
        for n in b.nodes:
            if level != b.compute and b.homes[n.name] != level:
                continue
            if level == b.compute and rank(b.homes[n.name]) > rank(level):
                continue
            i = computed[n.name]
            uses = [computed[c.name] for c in b.nodes if n.name in c.reads]
            uses += [s.index for s in steps if s.op == "save" and s.array == n.name]
            own = self._own(n.name)
            if own and level == b.compute:
                outer = own[0]
                scope = steps[i].path[:steps[i].path.index(outer)]
                init = next(s.index for s in steps if s.op == "init" and s.array == n.name)
                final = next(s.index for s in steps if s.op == "final" and s.array == n.name)
                for component, axes in b.state_shapes(b.flat.node(n.name), outer[0]):
                    shape = self._shape(axes, scope)
                    buffers.append(Buffer(f"{n.name}.{component}", n.name, "state", shape, init, final))
                if uses:  # the finaliser writes the value over the state (in place)
                    span(n.name, "value", min(final + 1, *uses), uses, _common([steps[u].path for u in uses]))
                continue
            scope = _common([steps[i].path] + [steps[u].path for u in uses])
            span(n.name, "value", i, uses, scope)
        return _in_place(b, buffers, steps)


def _is_final(item: _Item) -> bool:
    return isinstance(item, _Move) and item.op == "final"


def _common(paths: list[tuple[Inst, ...]]) -> tuple[Inst, ...]:
    first = paths[0]
    n = 0
    while all(len(p) > n and p[n] == first[n] for p in paths):
        n += 1
    return first[:n]


def _in_place(b: _Builder, buffers: list[Buffer], steps: list[Step]) -> list[Buffer]:
    """An elementwise box writes over an operand buffer of the same size that dies at it."""
    out = list(buffers)
    for s in steps:
        if s.op != "compute":
            continue
        node = b.flat.node(s.array)
        if not isinstance(node.expr, Box) or ops.OPS[node.expr.op].kind not in ("unary", "binary", "where"):
            continue
        mine = [x for x in out if x.name == node.name and x.start == s.index]
        for k, x in enumerate(out):
            if mine and x.name in node.reads and x.end == s.index and x.start < s.index \
                    and sympy.expand(x.size - mine[0].size) == 0:
                out[k] = Buffer(x.name, x.array, x.role, x.shape, x.start, s.index - 1, x.copies)
                break
    return out

