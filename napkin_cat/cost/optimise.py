"""Tile optimisation: the continuous optimum in closed form (paper §3.1, §4.1), the multi-level
bandwidth-weighted model (§4.2), and the best integer tiles under the hardware's capacity and
divisibility constraints as a configuration table (§5.6).

``continuous`` minimises a level's transfers H_ℓ subject to M_ℓ = M with Lagrange multipliers
(sympy ``solve``); the trip counts ceil(size / tile) of padded partitions are relaxed to
size / tile, as every tile is.  Tiles that do not change H_ℓ (typically stream chunks) only cost memory, so
the relaxation takes them to their infimum 0 (the paper's "taking s_b small").  ``M`` is the
level's capacity in values of the compute dtype; ``Optimum.in_bytes`` rewrites the optimum for a
capacity in bytes, which is where quantisation's q^(1+β) law appears (§4.3).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import NamedTuple

import sympy
from sympy import Expr

from napkin_cat.cost import Cost, CostError, Launch, parallel_factor
from napkin_cat.cost import hardware as hw
from napkin_cat.cost.roofline import NO_PADDING, Padding, estimate
from napkin_cat.schedule.loopnest import Loop
from napkin_cat.schedule.program import max_of
from napkin_cat.terms import Box

__all__ = ["M_BYTES", "Config", "ConfigTable", "M", "Optimum", "continuous", "multilevel", "piecewise", "search"]

#: the capacity of the optimised level, in values of the compute dtype
M = sympy.Symbol("M", positive=True)
#: the same capacity in bytes
M_BYTES = sympy.Symbol("M_bytes", positive=True)


@dataclass(frozen=True)
class Optimum:
    """A continuous optimum at one level: tiles and transfers H* as functions of ``M``."""

    level: str
    tiles: dict[str, Expr]
    transfers: Expr
    bpv: int

    @property
    def terms(self) -> tuple[tuple[Expr, Expr], ...]:
        """The canonical form Σ α_t M^(-β_t) as (α, β) pairs, or () when H* is not of that form."""
        out: dict[Expr, Expr] = {}
        for term in sympy.Add.make_args(sympy.expand(self.transfers)):
            coeff, exponent = term.as_coeff_exponent(M)
            if coeff.has(M):
                return ()
            out[-exponent] = out.get(-exponent, sympy.Integer(0)) + coeff
        return tuple((alpha, beta) for beta, alpha in sorted(out.items(), key=lambda t: -t[0]))

    @property
    def beta(self) -> Expr:
        """The exponent of the leading M-dependent term: -lim M·R'(M)/R(M) with R = H* - H*(∞)."""
        rest = self.transfers - sympy.limit(self.transfers, M, sympy.oo)
        if sympy.simplify(rest) == 0:
            return sympy.Integer(0)
        return sympy.simplify(-sympy.limit(M * sympy.diff(rest, M) / rest, M, sympy.oo))

    def in_bytes(self) -> Expr:
        """Transfers in bytes for a capacity of ``M_bytes`` bytes: bpv · H*(M_bytes / bpv)."""
        return sympy.simplify(self.bpv * self.transfers.subs(M, M_BYTES / self.bpv))


def _tiles_at(c: Cost, level: str) -> list[sympy.Symbol]:
    names = dict.fromkeys(lp.tile for lp in c.program.nest.loops if lp.level == level and isinstance(lp.tile, str))
    return [c.tiles[n] for n in names]


def continuous(c: Cost, level: str | None = None) -> Optimum | None:
    """Minimise H_ℓ subject to M_ℓ = M over the level's tile symbols; None without a closed form.

    ``level`` defaults to the first level below hbm.  Memory is counted in values of the
    compute dtype (bytes / bpv), so mixed dtypes are weighted by their size.
    """
    lv = c.first if level is None else c.level(level)
    bpv = hw.bytes_per_value(c.dtype)
    transfers = _relaxed(lv.transfers)
    if piecewise(transfers):
        return None
    mine = _tiles_at(c, lv.name)
    free = [t for t in mine if t in transfers.free_symbols]
    if not free:
        return Optimum(lv.name, {}, sympy.simplify(transfers), bpv)
    memory = _relaxed(lv.memory_bytes).subs({t: 0 for t in mine if t not in free})
    if isinstance(memory, sympy.Max):
        memory = max_of(list(memory.args))
    # per column, in values (a Max divided by bpv would be a product, not a Max)
    columns = [col / bpv for col in (memory.args if isinstance(memory, sympy.Max) else (memory,))]
    # with several candidate peak columns, one of them is the active constraint: take the
    # first whose optimum keeps every other column within M, for every M or else for every
    # large M (the regime of the asymptotic analysis: e.g. g*g = M beats 192*g <= M only
    # from M = 12288 values on)
    for decide in (_within_always, _within_eventually):
        for active in columns:
            found = _lagrange(transfers, active, free)
            if found is None:
                continue
            tiles, best = found
            if all(decide(col.subs(tiles)) for col in columns if col is not active):
                return Optimum(lv.name, {str(t): v for t, v in tiles.items()}, best, bpv)
    return None


def piecewise(expr: Expr) -> bool:
    """Does ``expr`` hold a ``Min`` or ``Max`` (a masked stream's chunk count where sympy cannot
    tell which size is larger)?  The Lagrange conditions of such an H are not solved:
    ``continuous`` returns None for it."""
    return bool(sympy.sympify(expr).has(sympy.Min, sympy.Max))


def _within_always(column: Expr) -> bool:
    return bool(sympy.simplify(column - M).is_nonpositive)


def _within_eventually(column: Expr) -> bool:
    """column <= M for every large enough M: the limit of column / M is below 1, or it is 1
    and column - M does not grow."""
    ratio = sympy.limit(column / M, M, sympy.oo)
    if ratio.is_finite and (ratio - 1).is_negative:  # None (undecided, e.g. 1/2 + 32/x) is no
        return True
    return bool(ratio == 1 and sympy.limit(column - M, M, sympy.oo).is_nonpositive)


def _relaxed(expr: Expr) -> Expr:
    """``expr`` with every ``ceiling(a)`` and ``floor(a)`` replaced by ``a``: a padded schedule's
    trip counts ceil(size / tile), and a masked stream's chunk bounds, relaxed to real tiles, as
    the unpadded schedule's (tiles are real here)."""
    return expr.replace(sympy.ceiling, lambda arg: arg).replace(sympy.floor, lambda arg: arg)


def _lagrange(transfers: Expr, memory: Expr, free: list[sympy.Symbol]) -> tuple[dict[sympy.Symbol, Expr], Expr] | None:
    """Stationary point of H subject to M_ℓ = M with positive tiles: (tiles, H*), or None.

    The multiplier is eliminated first: ∇H ∥ ∇M_ℓ is ∂H/∂t₀·∂M/∂tᵢ = ∂H/∂tᵢ·∂M/∂t₀ for each i.
    """
    first = free[0]
    parallel = [sympy.numer(sympy.together(sympy.diff(transfers, first) * sympy.diff(memory, t)
                                           - sympy.diff(transfers, t) * sympy.diff(memory, first)))
                for t in free[1:]]
    try:
        solutions = sympy.solve([*parallel, memory - M], free, dict=True)
    except NotImplementedError:
        return None
    for sol in sorted(solutions, key=lambda sol: not all(sol.get(t, t).is_positive for t in free)):
        if all(_positive(sol.get(t, t)) for t in free):
            best = sympy.simplify(transfers.subs(sol))
            # a tile left free must not matter (H depends on a product of tiles, e.g. GQA)
            if not best.has(*free):
                return {t: sympy.simplify(sol[t]) for t in free if t in sol}, best
    return None


def _positive(tile: Expr) -> bool:
    """Is a stationary tile positive?  Where sympy cannot tell (a sign hidden in symbolic
    sizes), at a representative point (every size 4096, M = 2^20) it must be real and positive:
    a root such as ``-sqrt(2)*sqrt(M)*...`` is no tile."""
    decided = sympy.sympify(tile).is_positive
    if decided is not None:
        return bool(decided)
    probe = sympy.sympify(tile).subs({s: (2 ** 20 if s == M else 4096) for s in tile.free_symbols})
    try:
        value = complex(sympy.N(probe))
    except TypeError:  # a symbol the probe did not bind
        return False
    return abs(value.imag) <= 1e-12 * max(1.0, abs(value.real)) and value.real > 0


def multilevel(c: Cost) -> tuple[dict[str, Optimum], Expr] | None:
    """Optimise every level below hbm for its own capacity ``M_<level>`` and weight each by its
    parent's bandwidth: T = Σ_ℓ bpv · H*_ℓ(M_ℓ) / BW_parent(ℓ) = Σ_t α_t Σ_ℓ Ḣ_ℓ^-1 M_ℓ^-β_t (§4.2)."""
    bpv = hw.bytes_per_value(c.dtype)
    optima: dict[str, Optimum] = {}
    total = sympy.Integer(0)
    for lv in c.levels[1:]:
        opt = continuous(c, lv.name)
        if opt is None:
            return None
        optima[lv.name] = opt
        assert lv.parent is not None
        bandwidth = c.hardware.level(lv.parent).bandwidth
        assert bandwidth is not None
        capacity = sympy.Symbol(f"M_{lv.name}", positive=True)
        total += opt.transfers.subs(M, capacity) * bpv / sympy.nsimplify(bandwidth)
    return optima, total


# ---- integer tiles --------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One integer tile configuration with its memory and transfers per level (bytes)."""

    tiles: dict[str, int]
    memory: dict[str, float]
    transfers: dict[str, float]
    #: the transfers' serial seconds (``roofline.Seconds.transfer``: bytes through an implicit L2 once)
    transfer_time: float
    #: the programs of the grid these tiles make, and ``cost.parallel_factor`` of them on the
    #: hardware's SMs
    programs: float = 1.0
    factor: float = 1.0
    #: what the configurations rank by: the modelled time (``cost.roofline``: overlapped for a
    #: launch that overlaps transfers and compute, else serial) times ``factor``
    seconds: float = 0.0
    #: the Triton launch of these tiles (``Cost.launched``), for a profile with launch rules
    launch: Launch | None = None
    #: the serial time (transfers and compute added) times ``factor``: the first tie-breaker
    serial: float = 0.0
    #: ``padding`` of these tiles: how much more tiles that lack a preferred multiple move and
    #: compute (none when they meet every one); ``seconds`` and ``serial`` include it, ``slower``
    #: is what it costs: the ratio of ``seconds`` to the time of unpadded tiles
    padding: Padding = NO_PADDING
    slower: float = 1.0


@dataclass(frozen=True)
class ConfigTable:
    """The best feasible integer configurations, best first, and each tile's constraints."""

    rows: tuple[Config, ...]
    constraints: dict[str, tuple[str, ...]]
    considered: int
    #: the preferred multiples (coalescing, tensor-core shapes) dropped because no
    #: configuration met them; the rows then meet only the backend's requirements
    relaxed: tuple[str, ...] = ()


class _TileRule(NamedTuple):
    """What a tile must be (a power of two, at least ``lowest``: the backend's requirements)
    and should be (a multiple of ``multiple``: coalescing, tensor-core fragments), and why."""

    multiple: int
    power_of_two: bool
    lowest: int
    causes: list[str]
    preferred: list[str]
    #: the largest tile the backend takes (``divisibility.max_tile``: a TMA box), 0 for none
    highest: int = 0
    #: each preferred multiple as (multiple, what it is for: an array or a contraction, its role:
    #: ``coalesce`` or the tensor-core ``m``/``n``/``k``), priced by ``padding``
    wants: tuple[tuple[int, str, str], ...] = ()


def padding(rules: dict[str, _TileRule], tiles: dict[str, int]) -> Padding:
    """How much more ``tiles`` move and compute for lacking the preferred multiples of ``rules``
    (``roofline.Padding``): the hardware runs a tile that lacks one as if padded to it (a 128-byte
    line moves whole for a 64-byte row; a tensor-core fragment computes its 64 rows for 16), so
    an array's hbm traffic grows by the ratio ceil(t / N)·N / t of its contiguous axis's tile t to
    the multiple N (the traffic of arrays not loaded from hbm, stores and intermediates, by the
    largest of theirs: an upper bound), and the contraction FLOPs by the largest product of a
    contraction's m, n and k ratios (an upper bound, as if every FLOP were the worst-padded one's).
    Where nested tiles of one axis want a multiple for the same array or role, the worst counts.
    No padding for tiles that meet every multiple."""
    worst: dict[tuple[str, str], float] = {}
    for name, rule in rules.items():
        t = tiles[name]
        for multiple, subject, role in rule.wants:
            ratio = math.ceil(t / multiple) * multiple / t
            worst[subject, role] = max(worst.get((subject, role), 1.0), ratio)
    arrays = {subject: ratio for (subject, role), ratio in worst.items() if role == "coalesce" and ratio > 1}
    per_box: dict[str, float] = {}
    for (subject, role), ratio in worst.items():
        if role != "coalesce":
            per_box[subject] = per_box.get(subject, 1.0) * ratio
    return Padding(tuple(sorted(arrays.items())), max(per_box.values(), default=1.0))


def _constraints(c: Cost) -> dict[str, _TileRule]:
    """Per tile symbol: its rule from the hardware (R9)."""
    div, tc = c.hardware.divisibility, c.hardware.tensor_core
    flat = c.program.nest.flat
    out: dict[str, _TileRule] = {}
    for lp in c.program.nest.loops:
        if not isinstance(lp.tile, str):
            continue
        causes, preferred, multiple, lowest = [], [], 1, 1
        wants: list[tuple[int, str, str]] = []
        if div.get("power_of_two"):
            causes.append("power of two (Pallas Triton backend)" if c.hardware.launch else
                          f"power of two ({c.hardware.key} profile: a search grid, not a rule)")
            if lp.folds and int(div.get("min_tile", 1)) > lowest:
                # a stream chunk is an in-kernel block with no padding: the lowering's rule
                lowest = int(div["min_tile"])
                causes.append(f">= {lowest} (a Triton stream chunk is a block)")
        coalesce = int(div.get("coalesce_bytes", 0))
        for name, axes in list(flat.inputs) + [(o, flat.type_of(o)) for o in flat.outputs]:
            if coalesce and axes and axes[-1] == lp.axis:
                need = max(1, coalesce // c.bytes_of[name])
                multiple = math.lcm(multiple, need)
                preferred.append(f"x{need} ({coalesce}-byte coalescing of {name})")
                causes.append(preferred[-1])
                wants.append((need, name, "coalesce"))
        for node in flat.nodes:
            box = node.expr
            if not (isinstance(box, Box) and box.op in ("contract", "ncontract") and len(box.args) == 2):
                continue
            role = _role(box, lp.axis)
            if role is None:
                continue
            if div.get("min_tile") and int(div["min_tile"]) > lowest:
                lowest = int(div["min_tile"])
                causes.append(f">= {lowest} (tl.dot operand dims)")
            if tc:
                need = max(1, tc["k_bytes"] // c.bytes_of[node.name]) if role == "k" else tc[role]
                multiple = math.lcm(multiple, need)
                preferred.append(f"x{need} (tensor-core {role} of {node.name})")
                causes.append(preferred[-1])
                wants.append((need, node.name, role))
        prev = out.get(lp.tile)
        if prev:
            multiple, lowest = math.lcm(multiple, prev.multiple), max(lowest, prev.lowest)
            causes, preferred = prev.causes + causes, prev.preferred + preferred
            wants = list(prev.wants) + wants
        highest = int(div.get("max_tile", 0))
        if highest:
            causes.append(f"<= {highest} (a TMA box dimension)")
        out[lp.tile] = _TileRule(multiple, bool(div.get("power_of_two")), lowest, causes, preferred, highest,
                                 tuple(wants))
    return out


def _role(box: Box, axis: str) -> str | None:
    """The tensor-core dimension an axis is for a two-operand contraction: ``k`` (contracted),
    ``m`` (the innermost axis only the first operand has), ``n`` (likewise for the second).
    The matrix rows and columns flatten several axes; the fragment shape constrains the
    innermost one."""
    first, second = (a.axes for a in box.args)
    if axis in box.target:
        return "k"
    only_first = [a for a in first if a not in second and a not in box.target]
    only_second = [a for a in second if a not in first and a not in box.target]
    if only_first and axis == only_first[-1]:
        return "m"
    if only_second and axis == only_second[-1]:
        return "n"
    return None


def _candidates(extent: int, multiple: int, pow2: bool, lowest: int, pad: bool, group: bool) -> list[int]:
    """Tile sizes for an axis of ``extent``: allowed sizes (multiples of ``multiple``, powers of
    two if ``pow2``, at least ``lowest``) that divide it, or with ``pad`` any below it and the
    first allowed size that covers it in one padded tile; else, for a ``group``, the whole
    axis as one tile (a stream's chunk must be an allowed block: Triton has no padded loop
    chunk, so a stream without one has no candidate)."""
    values = []
    step = multiple
    t = max(multiple, math.ceil(lowest / multiple) * multiple)
    while t < extent:
        if (not pow2 or t & (t - 1) == 0) and (pad or extent % t == 0):
            values.append(t)
        t = t * 2 if pow2 and t & (t - 1) == 0 else t + step
    if (not pow2 or t & (t - 1) == 0) and (t == extent or pad):
        values.append(t)
    if not values and (group or not pow2 or extent & (extent - 1) == 0):
        # the whole axis as one tile partitions nothing; the lowering pads a group block that
        # is not a power of two (as it pads an ungrouped axis, d=80 to 128)
        values.append(extent)
    return values


def search(c: Cost, top: int = 8, limit: int = 500_000, relax: bool = False) -> ConfigTable:
    """The best integer tiles: feasible under every level's capacity (bytes) and the hardware's
    divisibility constraints, ranked by modelled time (``cost.roofline``: transfers and
    compute, overlapped where the launch overlaps them, else added) times the grid's
    ``parallel_factor`` (a grid of fewer programs than SMs leaves the rest idle), then by the
    serial time, then by fewer loop trips.  All axis sizes must be
    numbers (raises CostError otherwise).  Past ``limit`` combinations the longest candidate
    lists are thinned to every other value.

    The multiples a tile should have (128-byte coalescing, tensor-core fragments) are
    preferences: with ``relax``, when no configuration meets them (64 rows of a 32768-wide
    row do not fit), the search is repeated with only the backend's requirements (powers of
    two, the dot's minimum) and ``relaxed`` lists what was dropped.  Without it, no row.  With
    launch rules, a configuration must also keep its computed tiles within the register budget
    (``Cost.launched``): a whole 32k-wide row of logits in one program does not."""
    symbolic = sorted(n for n, s in c.sizes.items() if isinstance(s, sympy.Symbol))
    if symbolic:
        raise CostError(f"integer tiles need every axis size: give {', '.join(symbolic)}")
    cons = _constraints(c)
    model = _Model(c, list(cons))
    table = _ranked(model, cons, top, limit)
    if table.rows or not relax or all(rule.multiple == 1 for rule in cons.values()):
        return table
    required = {n: rule._replace(multiple=1) for n, rule in cons.items()}
    table = _ranked(model, required, top, limit)
    relaxed = tuple(f"{n}: {cause}" for n, rule in cons.items() for cause in rule.preferred)
    return ConfigTable(table.rows, table.constraints, table.considered, relaxed if table.rows else ())


class _Model:
    """What ``search`` evaluates at every configuration of ``c``'s tiles ``names``, built once
    for its strict and its relaxed pass: the memory of each level below hbm, the on-chip
    quantities of a launch (with launch rules) and the work, as one compiled function of the
    tiles; and the nested partitions whose inner tile must divide the outer one."""

    def __init__(self, c: Cost, names: list[str]) -> None:
        self.cost, self.names = c, names
        self.levels = c.levels[1:]
        self.launched = bool(c.hardware.launch)
        self.chip = list(c.on_chip) if self.launched else []
        exprs = [lv.memory_bytes for lv in self.levels] + self.chip + list(c.work)
        # no docstring: printing every expression a second time for it costs as much as the code
        self.fn = sympy.lambdify([c.tiles[n] for n in names], exprs,
                                 modules=[{"Max": max, "Min": min, "ceiling": math.ceil}, "math"], docstring_limit=0)
        loops = c.program.nest.loops
        #: (outer tile, inner tile) of each partition nested in another of its axis, unpadded
        self.nested = [(loops[[j for j in range(i) if loops[j].axis == lp.axis][-1]].tile, lp.tile)
                       for i, lp in enumerate(loops)
                       if not lp.partition.pad and any(loops[j].axis == lp.axis for j in range(i))]

    def nested_ok(self, tiles: dict[str, int]) -> bool:
        """Nested partitions of one axis: each inner tile divides the outer one (unless padded)."""
        for outer, inner in self.nested:
            if int(tiles.get(str(outer), outer)) % int(tiles.get(str(inner), inner)):
                return False
        return True


#: a padded split's blocks are also tried at one and two programs per SM (``_per_sm``)
SPLIT_WAVES = (1, 2)


def _per_sm(c: Cost, loops: list[Loop]) -> list[int]:
    """Blocks of a padded split whose stream below it is padded too (each block's last chunk
    masked: ``kernel._nest``), sized to the SMs: ⌈|a| / (w·SMs)⌉ for w in ``SPLIT_WAVES``, so the
    programs fill whole waves (whole power-of-two chunks leave some SM a longer block: README
    "Split reductions").  A block that no power-of-two tile gives breaks the Triton backend's rule,
    so Pallas refuses it (``schedule.layout``) where plain JAX runs it."""
    inner = [lp for lp in c.program.nest.loops if lp.kind == "stream"]
    out: list[int] = []
    for lp in loops:
        if lp.kind != "split" or not lp.partition.pad or not any(s.axis == lp.axis and s.partition.pad for s in inner):
            continue
        size = int(c.sizes[lp.axis])
        out += [n for w in SPLIT_WAVES if 1 < (n := math.ceil(size / (w * c.hardware.sms))) < size]
    return sorted(set(out))


def _longest(c: Cost, tiles: dict[str, int]) -> float:
    """How much longer the longest program of a split runs than the average: every block holds
    k of |a|'s positions but the last, so the grid's ⌈|a|/k⌉ programs wait on blocks of k,
    ⌈|a|/k⌉·k / |a| of the average (1 when k divides |a|)."""
    if c.split is None:
        return 1.0
    size = int(c.sizes[c.split.axis])
    block = int(tiles.get(str(c.split.tile), c.split.tile))
    return math.ceil(size / block) * block / size


def _ranked(model: _Model, cons: dict[str, _TileRule], top: int, limit: int) -> ConfigTable:
    """``search`` under the tile rules ``cons``."""
    c, names = model.cost, model.names
    loops = c.program.nest.loops
    axes_of = {name: [lp for lp in loops if lp.tile == name] for name in names}
    choices = [_candidates(int(c.sizes[axes_of[n][0].axis]), cons[n].multiple, cons[n].power_of_two, cons[n].lowest,
                           any(lp.partition.pad for lp in axes_of[n]),
                           all(lp.partition.kind == "group" for lp in axes_of[n])) for n in names]
    choices = [[t for t in values if not cons[n].highest or t <= cons[n].highest]
               for n, values in zip(names, choices, strict=True)]
    choices = [values + _per_sm(c, axes_of[n]) for n, values in zip(names, choices, strict=True)]
    while math.prod(len(c) for c in choices) > limit:  # thin the longest list, keeping its ends
        longest = max(range(len(choices)), key=lambda k: len(choices[k]))
        choices[longest] = choices[longest][::2] + ([choices[longest][-1]] if len(choices[longest]) % 2 == 0 else [])
    combos = [dict(zip(names, values, strict=True)) for values in itertools.product(*choices)]
    combos = [t for t in combos if model.nested_ok(t)]
    levels = model.levels
    capacity = [c.hardware.level(lv.name).capacity for lv in levels]
    launched, chip, fn = model.launched, model.chip, model.fn
    # with launch rules, the compute level's capacity is the launch's: loaded blocks in shared
    # memory (per pipeline stage), computed tiles in the register budget (``Cost.launched``)
    rows: list[tuple[float, float, float, Config]] = []
    for tiles in combos:
        values = [float(v) for v in fn(*[tiles[n] for n in names])]
        memory = {lv.name: values[i] for i, lv in enumerate(levels)}
        if any(memory[lv.name] > cap for lv, cap in zip(levels, capacity, strict=True)
               if not (launched and lv.name == c.program.compute_level)):
            continue
        work = values[len(levels) + len(chip):]
        plan = c.launch_of(*values[len(levels):len(levels) + len(chip)]) if launched else None
        if plan is not None and not plan.fits:
            continue
        moved = {lv.name: work[i] for i, lv in enumerate(levels)}
        padded = padding(cons, tiles)
        t = estimate(c, work, plan, padded)
        slower = t.ranked / estimate(c, work, plan).ranked if padded != NO_PADDING else 1.0
        programs, trips = work[len(levels) + 2:len(levels) + 4]  # ``Cost.work``'s order
        factor = parallel_factor(programs, c.hardware.sms) * _longest(c, tiles)
        rows.append((t.ranked * factor, t.serial * factor, trips,
                     Config(tiles, memory, moved, t.transfer, programs, factor, t.ranked * factor, plan,
                            t.serial * factor, padded, slower)))
    rows.sort(key=lambda r: (float(f"{r[0]:.9g}"), float(f"{r[1]:.9g}"), r[2]))
    return ConfigTable(tuple(r[3] for r in rows[:top]), {n: tuple(cons[n].causes) for n in names}, len(combos))
