"""``napkin derive``: search for the cheapest checked schedule and write it as a proof file.

``derive`` runs the untrusted search (``rewrite.search``) with the cost model as its cost
function and a floating-point screen (``overflow_screen``), then ``proof_text`` writes the
winner as a theorem that ``napkin check`` accepts: a ``use`` of the source file by its
path relative to the output, the steps, the modelled cost and tile sizes, and the
runners-up with why each lost.  ``write`` writes the file and checks it again through
the kernel, so derive never hands back a proof that does not check.

Tile sizes are written as symbols (``gq``, ``sx``) with the chosen integers in comments:
the theorem then holds for every tile that divides its axis (the kernel records ``gq |
q``), so the same proof serves other sizes and hardware, while the comment and the
``tiles`` given to lowering carry this configuration.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sympy

from napkin_cat import accumulators, cost, kernel, rules
from napkin_cat import hardware as hw
from napkin_cat.elaborate import load
from napkin_cat.evaluate import FLOAT64, Named, evaluate_named
from napkin_cat.printer import print_step
from napkin_cat.proof import CheckResult, check_file
from napkin_cat.rewrite import Candidate, Costed, CostFn, Search, search
from napkin_cat.terms import Axis, Box, Diagram, Param, Partition, Step, Var

__all__ = ["Derivation", "axes_of", "choose_tiles", "derive", "model_cost", "overflow_screen", "proof_text",
           "write"]

#: input magnitude of the floating-point screen: exp of it overflows float64
_SCREEN_SCALE = 1000.0


@dataclass(frozen=True)
class Derivation:
    """A finished search on one diagram of one file, with the settings it ran under."""

    source: Path
    diagram: str
    search: Search
    settings: Mapping[str, str]

    @property
    def best(self) -> Candidate:
        return self.search.best

    @property
    def theorem_name(self) -> str:
        return f"{self.diagram}_derived"


def derive(path: str | Path, diagram: str, cost: CostFn, *, settings: Mapping[str, str] | None = None,
           max_rewrites: int = 2, budget: int = 2000, seconds: float = 60.0,
           progress: Callable[[str], None] | None = None) -> Derivation:
    """Search ``diagram`` of the file at ``path`` for its cheapest fitting schedule.

    ``settings`` (hardware, dtype, sizes, ...) are only recorded for the written file.
    Raises NapkinError if the file does not elaborate and KeyError for an unknown diagram.
    """
    source = Path(path)
    module = load(source)
    result = search(module, diagram, cost, lemmas=rules.lemmas_in_scope(module),
                    theorem_name=f"{diagram}_derived", max_rewrites=max_rewrites, budget=budget, seconds=seconds,
                    screen=overflow_screen, progress=progress)
    return Derivation(source, diagram, result, dict(settings or {}))


# ---- the floating-point screen ----------------------------------------------------------


def overflow_screen(thm: kernel.Theorem) -> str | None:
    """Why the theorem's accumulators would fail in floating point, or None.

    Equalities are over the reals; an accumulator that is exact there can still overflow
    (the plain normalised contraction with exp has no running maximum).  Each chosen
    accumulator is run chunk by chunk (``accumulators.stream_fold``) on inputs of
    magnitude 1000 and compared with the evaluator, whose forms are stable.
    """
    for axis, box, name in thm.accumulators:
        problem = _overflows(box, axis, name)
        if problem:
            return problem
    return None


def _overflows(box: Box, axis: str, name: str) -> str | None:
    args = tuple(Var(f"X{i}", a.axes) for i, a in enumerate(box.args))
    canonical = kernel.typed_box(box.op, args, box.target, box.out, box.params)
    axes = tuple(dict.fromkeys(a for x in args for a in x.axes))
    sizes = {a: 3 for a in axes} | {axis: 6}
    diagram = Diagram(box.op, tuple(Param(x.name, x.axes) for x in args), (), (canonical,), (canonical.axes,),
                      tuple(Axis(a) for a in axes))
    rng = np.random.default_rng(0)
    inputs = [Named(x.axes, _SCREEN_SCALE * rng.standard_normal([sizes[a] for a in x.axes])) for x in args]
    (reference,) = evaluate_named(diagram, inputs, dict(sizes), FLOAT64)
    streamed = accumulators.stream_fold(accumulators.plan(canonical, axis, name), inputs, 2, sizes)
    want, got = reference.data, streamed.to(reference.axes)
    finite = np.isfinite(want)
    with np.errstate(invalid="ignore"):
        bad = finite & ~(np.isfinite(got) & np.isclose(got, want, rtol=1e-6, atol=1e-9))
    if bad.any():
        return (f"accumulator `{name}` for `{box.op}` along `{axis}` fails in floating point: on inputs of "
                f"magnitude {_SCREEN_SCALE:g} it gives {np.ravel(got[bad])[0]:.4g} where the stable form gives "
                f"{np.ravel(want[bad])[0]:.4g}")
    return None


# ---- writing the proof file ---------------------------------------------------------------


def _ratio(candidate: Candidate, best: Candidate) -> str:
    if candidate.cost is None or best.cost is None or best.cost.value <= 0 or not math.isfinite(best.cost.value):
        return ""
    ratio = candidate.cost.value / best.cost.value
    if math.isclose(ratio, 1.0, rel_tol=1e-9):
        return " (ties the best, which has fewer or simpler steps)"
    return f" ({ratio:.4g}x the best)"


def _why_lost(candidate: Candidate, best: Candidate) -> str:
    if candidate.refused is not None:
        return candidate.refused
    assert candidate.cost is not None
    if not candidate.cost.fits:
        return f"does not fit: {candidate.cost.why_not or candidate.cost.summary}"
    return f"{candidate.cost.summary}{_ratio(candidate, best)}"


def _comment(text: str, indent: str = "# ") -> list[str]:
    return [f"{indent}{line}".rstrip() for line in text.splitlines()]


def proof_text(derivation: Derivation, out_path: str | Path, runners_up: int = 6) -> str:
    """The proof file for ``derivation`` as it will be written at ``out_path``."""
    found = derivation.search
    best, baseline = found.best, found.baseline
    use = Path(os.path.relpath(derivation.source.resolve(), Path(out_path).resolve().parent)).as_posix()
    settings = " ".join(f"{k}={v}" for k, v in derivation.settings.items())
    lines = [f"# Derived by `napkin derive` for `{derivation.diagram}`" + (f" ({settings})" if settings else ""),
             f"# Search stopped: {found.stopped} ({found.detail}); {len(found.candidates)} candidates "
             f"checked by the kernel in {found.elapsed:.2f} s."]
    if found.helps:
        assert best.cost is not None
        lines += _comment(f"Modelled cost: {best.cost.summary}")
        if baseline.cost is not None:
            lines += _comment(f"The diagram as written: {baseline.cost.summary}{_ratio(baseline, best)}")
        if best.cost.tiles:
            chosen = ", ".join(f"{k} = {v}" for k, v in best.cost.tiles.items())
            lines += _comment(f"Tile sizes chosen for these settings: {chosen}.  The theorem holds for any tile "
                              "that divides its axis;\nthe checker records those conditions.")
    else:
        lines += _comment("Nothing helps: no checked rewrite or relabelling has a lower modelled cost than the "
                          "diagram as written" + (f" ({baseline.cost.summary})." if baseline.cost else "."))
    lines += [f'use "{use}"', "", f"theorem {derivation.theorem_name}: {derivation.diagram} {{"]
    lines += [f"  {print_step(step)}" for step in _explicit(best)]
    lines += ["}"]
    others = found.runners_up(runners_up)
    if others:
        lines += ["", "# Runners-up, and why they lost:"]
        for k, other in enumerate(others, start=1):
            lines += [f"#   {k}. {other.describe()}", f"#      {_why_lost(other, best)}"]
    return "\n".join(lines) + "\n"


def _explicit(candidate: Candidate) -> tuple[Step, ...]:
    """The candidate's steps with each stream's accumulator as the kernel chose it."""
    if candidate.theorem is None:
        return candidate.steps
    chosen = iter(candidate.theorem.schedule.partitions)
    return tuple(next(chosen) if isinstance(step, Partition) else step for step in candidate.steps)


def write(derivation: Derivation, out_path: str | Path) -> CheckResult:
    """Write the proof file and check it again; the derived theorem's check result.

    Raises NapkinError if the written file does not elaborate (a bug, reported to the
    user rather than hidden); a theorem that fails its check is in the result.
    """
    out = Path(out_path)
    out.write_text(proof_text(derivation, out), encoding="utf-8")
    results = {r.name: r for r in check_file(out)}
    assert derivation.theorem_name in results, f"{out}: the written file lost theorem {derivation.theorem_name}"
    return results[derivation.theorem_name]


# ---- the cost model as the search's cost function -------------------------------------------


def axes_of(module_path: str | Path, diagram: str) -> dict[str, int | None]:
    """Every axis ``diagram`` uses once diagrams used as boxes are unfolded, with its size
    (None where symbolic): the axes ``--size`` may and must name."""
    source = load(module_path).diagram(diagram)
    return kernel.unfold(kernel.refl(diagram, source)).result.axis_sizes()


def model_cost(hardware: str = "h100", dtype: str = "bf16", sizes: Mapping[str, int] | None = None) -> CostFn:
    """The cost model (``napkin_cat.cost``) as a search cost function: modelled seconds.

    A schedule is one fused kernel: its time is FLOPs at the dtype's peak plus, per level,
    the bytes moved into it over its parent's bandwidth (the paper's multi-level sum,
    §4.2), at the best tiles that fit every level's capacity (``choose_tiles``).  A
    diagram without partitions is one kernel holding whole arrays; when that does not
    fit, its value is the model's unfused baseline time (each box its own kernel with
    unlimited memory) with ``fits=False``: a reference and a guide for ordering rewrites,
    never a winner.  Raises HardwareError for an unknown profile or dtype.
    """
    profile = hw.load(hardware)
    peak = profile.peak_flops(dtype)
    given = dict(sizes or {})

    def evaluate(thm: kernel.Theorem) -> Costed:
        used = thm.result.axis_sizes()
        c = cost.cost(thm, hardware=profile, sizes={a: n for a, n in given.items() if a in used}, dtype=dtype)
        fused = choose_tiles(c, thm, peak)
        if thm.schedule.partitions or fused.fits:
            return fused
        # no partitions and too large for one kernel: keep the unfused time as a guide for
        # the search's ordering of rewrites, but it is not a schedule that fits
        hbm = profile.level("hbm").bandwidth or math.inf
        moved, flops = float(c.baseline.transfers_bytes), float(c.baseline.flops)
        seconds = flops / peak + moved / hbm
        return Costed(seconds, False, {}, f"{_us(seconds)} if run unfused, each box its own kernel with unlimited "
                                          f"memory ({_mb(moved)} moved, {flops / 1e9:.3g} GFLOP)", fused.why_not)

    return evaluate


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.4g} µs"


def _mb(moved: float) -> str:
    return f"{moved / 1e6:.4g} MB"


def _tile_values(size: int, least: int = 1) -> list[int]:
    """The powers of two that divide ``size`` and ``size`` itself, from ``least`` up
    (every divisor of the listed kind when ``size`` is below ``least``)."""
    values = {1, size}
    k = 2
    while k < size:
        if size % k == 0:
            values.add(k)
        k *= 2
    floor = least if size >= least else 1
    return sorted(v for v in values if v >= floor)


def _batch_axes(diagram: Diagram) -> set[str]:
    """Axes on every (non-scalar) input and every output: independent problems, which
    may take any tile.  Every other axis is a matrix dimension of some box."""
    arrays = [p.axes for p in diagram.inputs if p.axes] + list(diagram.out_types)
    return set.intersection(*(set(a) for a in arrays)) if arrays else set()


def choose_tiles(c: cost.Cost, thm: kernel.Theorem, peak: float, grid_limit: int = 200_000) -> Costed:
    """The fastest integer tiles that fit every level and satisfy the theorem's constraints.

    Candidates per tile: the powers of two dividing its axis and the axis size, at least
    the profile's ``min_tile`` (tensor-core operand shapes) unless the axis is a batch
    axis (``_batch_axes``).
    The whole grid is evaluated (vectorised) when it has at most ``grid_limit`` points;
    beyond that, coordinate descent from every "diagonal" start (all tiles the same
    power of two, which reaches square tiles) keeps the search polynomial.
    """
    sizes = {a: int(n) for a, n in c.sizes.items() if isinstance(n, sympy.Integer)}
    names = list(c.tiles)
    axis_of = {p.tile: p.axis for p in thm.schedule.partitions if isinstance(p.tile, str)}
    least = int(c.hardware.divisibility.get("min_tile", 1))
    batch = _batch_axes(thm.result)
    values = [np.array(_tile_values(sizes[axis_of[n]], 1 if axis_of[n] in batch else least), dtype=float)
              for n in names]
    symbols = [c.tiles[n] for n in names]
    hardware = c.hardware
    time_expr = c.flops / peak + sum((lv.transfers_bytes / (hardware.level(lv.parent).bandwidth or math.inf)
                                      for lv in c.levels[1:] if lv.parent is not None), sympy.Integer(0))
    time_fn = sympy.lambdify(symbols, c.at(time_expr, sizes), "numpy")
    memory = [(lv.name, hardware.level(lv.name).capacity, sympy.lambdify(symbols, c.at(lv.memory_bytes, sizes),
                                                                          "numpy")) for lv in c.levels[1:]]
    divides = [(d.divisor, d.dividend) for d in thm.constraints]

    def score(points: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        env = dict(zip(names, points, strict=True))
        shape = np.broadcast_shapes(*(p.shape for p in points)) if points else ()
        ok = np.ones(shape, dtype=bool)
        for _, capacity, fn in memory:
            ok &= np.broadcast_to(fn(*points), shape) <= capacity
        for divisor, dividend in divides:
            num = env[divisor] if isinstance(divisor, str) else divisor
            den = env[dividend] if isinstance(dividend, str) and dividend in env else sizes.get(str(dividend), dividend)
            ok &= np.broadcast_to(np.mod(den, num) == 0, shape)
        return np.where(ok, np.broadcast_to(time_fn(*points), shape), np.inf), ok

    if math.prod(len(v) for v in values) <= grid_limit:
        grids = np.meshgrid(*values, indexing="ij") if values else []
        times, _ = score(list(grids))
        best = np.unravel_index(np.argmin(times), times.shape) if values else ()
        chosen = [float(g[best]) for g in grids]
        seconds = float(times[best]) if values else float(times)
    else:
        chosen, seconds = _descend(values, score)
    tiles = {n: int(v) for n, v in zip(names, chosen, strict=True)}
    if not math.isfinite(seconds):
        smallest = [float(v[0]) for v in values]
        need = ", ".join(f"{name} needs {float(fn(*smallest)) / 1024:.4g} KiB of {capacity / 1024:.4g} KiB"
                         for name, capacity, fn in memory if float(fn(*smallest)) > capacity)
        what = "even the smallest tiles overflow" if names else "whole arrays overflow"
        return Costed(math.inf, False, {n: int(v) for n, v in zip(names, smallest, strict=True)},
                      "does not fit", f"{what}: {need or 'the tile constraints fail'}")
    moved = sum(float(c.at(lv.transfers_bytes, sizes | tiles)) for lv in c.levels[1:2])
    used = "; ".join(f"{name} {float(fn(*chosen)) / 1024:.4g} of {capacity / 1024:.4g} KiB"
                     for name, capacity, fn in memory)
    footprint = max((float(fn(*chosen)) / capacity for _, capacity, fn in memory), default=0.0)
    return Costed(seconds, True, tiles, f"{_us(seconds)} fused: {_mb(moved)} moved from hbm; {used}; "
                                        f"{float(c.at(c.flops, sizes | tiles)) / 1e9:.3g} GFLOP", footprint=footprint)


Score = Callable[[list[np.ndarray]], tuple[np.ndarray, np.ndarray]]


def _descend(values: list[np.ndarray], score: Score) -> tuple[list[float], float]:
    best: tuple[float, list[float]] = (math.inf, [float(v[0]) for v in values])
    for rank in range(max(len(v) for v in values)):
        point = [float(v[min(rank, len(v) - 1)]) for v in values]
        current = float(score([np.array(p) for p in point])[0])
        for _ in range(20):
            moved = False
            for i, options in enumerate(values):
                trial = [np.array(p) for p in point]
                trial[i] = options
                times, _ = score(trial)
                j = int(np.argmin(times))
                if times[j] < current:
                    point[i], current, moved = float(options[j]), float(times[j]), True
            if not moved:
                break
        if current < best[0]:
            best = (current, point)
    return best[1], best[0]
