"""``napkin derive``: search for the cheapest checked schedule and write it as a proof file.

``derive`` runs the untrusted search (``rewrite.search``) with the cost model as its cost
function (the kernel itself refuses accumulators unsafe in floating point:
``certify.float_safety``) and, when a kernel is wanted, a lowering screen
(``lowering_screen``), then ``proof_text`` writes the
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
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import sympy

from napkin_cat import cache, cost, kernel
from napkin_cat.certify import rules
from napkin_cat.cost import hardware as hw
from napkin_cat.cost import optimise
from napkin_cat.cost.roofline import unfused
from napkin_cat.diagnostics import NapkinError
from napkin_cat.elaborate import load, loads
from napkin_cat.files import Outputs
from napkin_cat.printer import print_step
from napkin_cat.proof import CheckResult, check_module
from napkin_cat.schedule.layout import PRICED_DTYPE, layout, realised_schedule
from napkin_cat.search.chains import UnfusedFn, with_boundaries
from napkin_cat.search.rewrite import Candidate, Costed, CostFn, ScreenFn, Search, search
from napkin_cat.terms import Partition

__all__ = ["Derivation", "axes_of", "choose_tiles", "derive", "lowering_screen", "model_cost",
           "proof_text", "unfused_cost", "write"]

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

    def verdict(self) -> str:
        """One sentence: what was found, or why nothing helps."""
        found = self.search
        best, baseline = found.best, found.baseline
        if found.helps and best.cost is not None:
            return f"best: {best.describe()}: {best.cost.summary}"
        if baseline.ok and baseline.cost is not None:
            return ("Nothing helps: the diagram as written already fits one kernel and no checked rewrite or "
                    f"relabelling is cheaper ({baseline.cost.summary}).")
        closest = next((c for c in found.runners_up(len(found.candidates))
                        if c.cost is not None and any(isinstance(s, Partition) for s in c.steps)), None)
        reason = f"; the closest, {closest.describe()}: {_why_lost(closest, best)}" if closest else \
            (f"; the diagram as written: {baseline.refused}" if baseline.refused else "")
        return ("Nothing helps: no checked rewrite or relabelling fits the hardware at these sizes (and passes "
                f"the floating-point and lowering checks), so the diagram stays as written{reason}.")


def derive(path: str | Path, diagram: str, cost_fn: CostFn, *, settings: Mapping[str, str] | None = None,
           max_rewrites: int = 2, budget: int = 2000, seconds: float = 60.0, lower: str | None = None,
           progress: Callable[[str], None] | None = None, unfused: UnfusedFn | None = None,
           launch_overhead: float = 0.0) -> Derivation:
    """Search ``diagram`` of the file at ``path`` for its cheapest fitting schedule.

    With ``lower`` ("pallas" or "jax") only schedules that target can lower are accepted
    (``lowering_screen``).  With ``unfused`` (``unfused_cost``), fusion boundaries are searched too
    (``search.chains``: chains of two kernels, each launch after the first at ``launch_overhead``,
    and the unfused diagram, so the answer is never modelled slower than it).

    ``seconds`` is one window for both phases, from the start of the search: no candidate is checked
    and priced after it, but the one being priced when it passes runs to its end (pricing is not
    interrupted), and the diagram as written and (with ``unfused``) the unfused diagram are always
    priced, whatever the window.
    ``settings`` (hardware, dtype, sizes, ...) are only recorded for the written file.
    Raises NapkinError if the file does not elaborate and KeyError for an unknown diagram.
    """
    source = Path(path)
    module = load(source)
    started = time.monotonic()
    result = search(module, diagram, cost_fn, lemmas=rules.lemmas_in_scope(module),
                    theorem_name=f"{diagram}_derived", max_rewrites=max_rewrites, budget=budget, seconds=seconds,
                    screen=_lowering(lower) if lower else None, progress=progress)
    if unfused is not None:  # the fusion boundaries get what is left of the window, not a window of their own
        left = max(seconds - (time.monotonic() - started), 0.0)
        result = with_boundaries(result, module, diagram, cost_fn, unfused, lemmas=rules.lemmas_in_scope(module),
                                 theorem_name=f"{diagram}_derived", launch_overhead=launch_overhead,
                                 max_rewrites=max_rewrites, budget=budget, seconds=left,
                                 screen=_lowering(lower) if lower else None)
    return Derivation(source, diagram, result, dict(settings or {}))


# ---- the lowering screen ------------------------------------------------------------------


def _lowering(target: str) -> ScreenFn:
    return lambda thm, costed: lowering_screen(thm, costed, target)


def lowering_screen(thm: kernel.Theorem, costed: Costed, target: str) -> str | None:
    """Why ``target`` cannot lower the theorem's schedule (a chain's: each kernel's) at the chosen tiles, or None."""
    try:
        for each in thm.kernels or (thm,):
            layout(each.name, each.result, each.schedule, costed.tiles, target)
    except NapkinError as exc:
        return f"the {target} lowering refuses it: {exc}"
    return None


# ---- writing the proof file ---------------------------------------------------------------


def _ratio(candidate: Candidate, best: Candidate) -> str:
    if candidate.cost is None or best.cost is None or best.cost.value <= 0 or not math.isfinite(best.cost.value):
        return ""
    ratio = candidate.cost.value / best.cost.value
    if candidate.cost.relaxed and not best.cost.relaxed:
        return f" ({ratio:.4g}x the best, but its tiles lack the hardware's preferred multiples)"
    if math.isclose(ratio, 1.0, rel_tol=1e-9):
        mine, theirs = candidate.cost, best.cost
        if mine.relaxed and not theirs.relaxed:
            return " (ties the best, whose tiles meet the hardware's preferred multiples)"
        if mine.serial is not None and theirs.serial is not None and not math.isclose(mine.serial, theirs.serial,
                                                                                         rel_tol=1e-9):
            return " (ties the best, which takes less time with transfers and compute added, not overlapped)"
        if not math.isclose(mine.footprint, theirs.footprint, rel_tol=1e-9):
            return " (ties the best, which leaves more fast memory free)"
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
        lines += _comment(derivation.verdict())
    lines += [f'use "{use}"', "", f"theorem {derivation.theorem_name}: {derivation.diagram} {{"]
    lines += [f"  {print_step(step)}" for step in best.explicit]
    for block in best.kernels:
        lines += [f"  kernel {', '.join(block.writes)} {{", *(f"    {print_step(s)}" for s in block.steps), "  }"]
    lines += ["}"]
    others = found.runners_up(runners_up)
    if others:
        lines += ["", "# Runners-up, and why they lost:"]
        for k, other in enumerate(others, start=1):
            lines += [f"#   {k}. {other.describe()}", f"#      {_why_lost(other, best)}"]
    return "\n".join(lines) + "\n"


def checked(derivation: Derivation, out_path: str | Path) -> tuple[str, CheckResult]:
    """The proof file's text as it will be written at ``out_path``, and the derived
    theorem's result, checked from that text as the file will read (its ``use`` resolved
    from ``out_path``'s folder), before anything is written.

    Raises NapkinError if the text does not elaborate (a bug, reported to the user rather
    than hidden); a theorem that fails its check is in the result.
    """
    out = Path(out_path)
    text = proof_text(derivation, out)
    results = {r.name: r for r in check_module(loads(text, str(out)))}
    assert derivation.theorem_name in results, f"{out}: the proof text lost theorem {derivation.theorem_name}"
    return text, results[derivation.theorem_name]


def write(derivation: Derivation, out_path: str | Path, outputs: Outputs | None = None) -> CheckResult:
    """Check the proof file (``checked``) and write it (atomically, through ``outputs``, which
    refuses a path it must not replace: ``files.OutputRefused``) only if its theorem holds:
    a failed derivation leaves no file."""
    text, result = checked(derivation, out_path)
    if result.theorem is not None:
        (outputs or Outputs()).write(out_path, text)
    return result


# ---- the cost model as the search's cost function -------------------------------------------


def axes_of(module_path: str | Path, diagram: str) -> dict[str, int | None]:
    """Every axis ``diagram`` uses once diagrams used as boxes are unfolded, with its size
    (None where symbolic): the axes ``--size`` may and must name."""
    source = load(module_path).diagram(diagram)
    return kernel.unfold(kernel.refl(diagram, source)).result.axis_sizes()


def model_cost(hardware: str | hw.Hardware = "h100", dtype: str = "bf16", sizes: Mapping[str, int] | None = None,
               target: str | None = None) -> CostFn:
    """The cost model (``napkin_cat.cost``) as a search cost function: modelled seconds.

    A schedule is one fused kernel: its time is the time model's (``cost.roofline``: compute
    and, per level, the bytes moved into it over its parent's bandwidth, overlapped where the
    launch overlaps them, else added as in the paper's multi-level sum, §4.2), at the best
    tiles that fit every level's capacity (``choose_tiles``).  A
    diagram without partitions is one kernel holding whole arrays; when that does not
    fit, its value is the model's unfused baseline time (each box its own kernel with
    unlimited memory, a launch overhead for each after the first: ``roofline.unfused``) with
    ``fits=False``: a reference and a guide for ordering rewrites,
    never a winner.  With ``target`` "pallas", a schedule is costed as that kernel runs it
    (``realised_schedule``: an axis woven through every box and left unpartitioned is a grid
    axis, one position per program, so arrays lacking it are re-loaded by each program).
    A target that computes in one dtype is priced in it (``PRICED_DTYPE``: plain JAX in f32),
    as ``lower`` prices its default tiles.  Raises HardwareError for an unknown profile or dtype.
    """
    profile = hardware if isinstance(hardware, hw.Hardware) else hw.load(hardware)
    profile.peak_flops(dtype)  # an unknown dtype is refused here, before any schedule is costed
    baseline = unfused_cost(profile, dtype, sizes, target)
    dtype = PRICED_DTYPE.get(target, dtype) if target else dtype
    given = dict(sizes or {})

    def evaluate(thm: kernel.Theorem) -> Costed:
        used = thm.result.axis_sizes()
        known = {a: n for a, n in given.items() if a in used}
        realised = realised_schedule(thm.result, thm.schedule, target) if target else None

        def compute() -> Costed:
            c = cost.cost(thm, realised, hardware=profile, sizes=known, dtype=dtype)
            fused = choose_tiles(c)
            if thm.schedule.partitions or fused.fits:
                return fused
            # no partitions and too large for one kernel: keep the unfused time as a guide for
            # the search's ordering of rewrites, but it is not a schedule that fits
            return replace(baseline(thm), why_not=fused.why_not)

        return remembered("model_cost", {"theorem": _priced(thm), "realised": repr(realised), "target": target,
                                         "hardware": repr(profile), "dtype": dtype, "sizes": known}, compute)

    return evaluate


def _priced(thm: kernel.Theorem) -> str:
    """What the cost model reads of a theorem (its result, schedule, source and chosen
    accumulators), as text for a cache key."""
    return repr((thm.result, thm.schedule, thm.source, thm.accumulators))


def remembered(kind: str, settings: Mapping[str, object], compute: Callable[[], Costed]) -> Costed:
    """``compute()``, stored in napkin's cache folder (``napkin_cat.cache``: keyed by ``settings``,
    napkin's own source and sympy's version) and read back on a later search: the cost model is
    a function of what it prices, and pricing a schedule (sympy: its programs, the tile search)
    is most of a search's time.  Only answers are stored; a refusal (an exception) is computed
    again.  Floats are stored as JSON writes them (``repr``: read back exactly), tiles as pairs in
    their order."""
    entry_key = cache.key(kind, {**settings, "sympy": sympy.__version__})
    stored = cache.read(cache.cache_folder(), entry_key, _costed_payload)
    if stored is not None:
        return Costed(stored["value"], stored["fits"], {k: v for k, v in stored["tiles"]}, stored["summary"],
                      stored["why_not"], stored["footprint"], tuple(stored["relaxed"]), stored["serial"])
    answer = compute()
    payload = {"value": answer.value, "fits": answer.fits, "tiles": [[k, v] for k, v in answer.tiles.items()],
               "summary": answer.summary, "why_not": answer.why_not, "footprint": answer.footprint,
               "relaxed": list(answer.relaxed), "serial": answer.serial}
    cache.write(cache.cache_folder(), entry_key, payload)
    return answer


def _costed_payload(payload: object) -> bool:
    """Is ``payload`` a stored ``Costed``?"""
    if not isinstance(payload, dict):
        return False
    number = (int, float)
    return (isinstance(payload.get("value"), number) and isinstance(payload.get("fits"), bool)
            and isinstance(payload.get("tiles"), list)
            and all(isinstance(kv, list) and len(kv) == 2 and isinstance(kv[0], str) and type(kv[1]) is int
                    for kv in payload["tiles"])
            and isinstance(payload.get("summary"), str) and isinstance(payload.get("why_not"), str)
            and isinstance(payload.get("footprint"), number) and isinstance(payload.get("relaxed"), list)
            and all(isinstance(r, str) for r in payload["relaxed"])
            and (payload.get("serial") is None or isinstance(payload.get("serial"), number)))


def unfused_cost(hardware: str | hw.Hardware = "h100", dtype: str = "bf16", sizes: Mapping[str, int] | None = None,
                 target: str | None = None) -> UnfusedFn:
    """The unfused baseline of a theorem's (possibly rewritten) diagram as a ``Costed`` that does not fit: every
    box its own kernel with unlimited memory, a launch overhead for each after the first
    (``roofline.unfused``); priced as ``model_cost`` prices (``PRICED_DTYPE`` for ``target``)."""
    hardware = hardware if isinstance(hardware, hw.Hardware) else hw.load(hardware)
    dtype = PRICED_DTYPE.get(target, dtype) if target else dtype
    sizes = dict(sizes or {})

    def evaluate(thm: kernel.Theorem) -> Costed:
        used = thm.result.axis_sizes()
        known = {a: n for a, n in sizes.items() if a in used}

        def compute() -> Costed:
            own = cost.cost_of(thm.result, thm.schedule, hardware=hardware, sizes=known, dtype=dtype)
            flop, move, launches = unfused(own)
            seconds = flop + move + launches
            moved, flops = float(own.baseline.transfers_bytes), float(own.baseline.flops)
            return Costed(seconds, False, {}, f"{_us(seconds)} if run unfused, each box its own kernel with "
                                              f"unlimited memory ({_mb(moved)} moved, {flops / 1e9:.3g} GFLOP, "
                                              f"{own.baseline.kernels} launches)")

        return remembered("unfused_cost", {"diagram": repr((thm.result, thm.schedule)), "hardware": repr(hardware),
                                           "dtype": dtype, "sizes": known}, compute)

    return evaluate


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.4g} µs"


def _mb(moved: float) -> str:
    return f"{moved / 1e6:.4g} MB"


def choose_tiles(c: cost.Cost) -> Costed:
    """The best integer tiles of the cost model's search (``optimise.search``: every level's
    capacity and the hardware's divisibility constraints, least modelled time, then fewest
    loop trips), costed as they rank: the time model's (``cost.roofline``), times
    the grid's ``cost.parallel_factor`` (the whole chip's peaks are reached only with every SM
    busy).  The preferred
    multiples (coalescing, tensor-core shapes) are dropped where no configuration meets them, as
    `napkin cost` and the lowering do: a row whose 64-row tile overflows SMEM fits fewer rows at a
    time; such tiles are priced as if padded to the multiples (``optimise.padding``), and the plan
    ranks after every plan whose tiles meet them (``Costed.relaxed``, ``rewrite.rank``)."""
    sizes = {a: int(n) for a, n in c.sizes.items() if isinstance(n, sympy.Integer)}
    table = optimise.search(c, top=1, relax=True)
    capacities = {lv.name: c.hardware.level(lv.name).capacity for lv in c.levels[1:]}
    if not table.rows:
        if c.tiles:
            why = (f"none of the {table.considered} tile configurations allowed by the hardware fits "
                   + ", ".join(f"{name} ({cap / 1024:.4g} KiB)" for name, cap in capacities.items())
                   + (" with its computed tiles in the register budget (napkin_cat/cost/launch.py)"
                      if c.hardware.launch else ""))
        else:
            why = "whole arrays overflow: " + ", ".join(
                f"{lv.name} needs {float(c.at(lv.memory_bytes, sizes)) / 1024:.4g} KiB of "
                f"{capacities[lv.name] / 1024:.4g} KiB" for lv in c.levels[1:])
        return Costed(math.inf, False, {}, "does not fit", why)
    best = table.rows[0]
    flops = float(c.at(c.flops, sizes | best.tiles))
    seconds = best.seconds
    used = "; ".join(f"{name} {best.memory[name] / 1024:.4g} of {cap / 1024:.4g} KiB"
                     for name, cap in capacities.items())
    moved = best.transfers[c.levels[1].name]
    footprint = max(best.memory[name] / cap for name, cap in capacities.items())
    dropped = (f"; tiles without the preferred {', '.join(table.relaxed)}"
               + (f", priced as padded to them (x{best.slower:.3g})" if best.slower > 1 else "")
               if table.relaxed else "")
    grid = f"; {best.programs:.0f} programs on {c.hardware.sms} SMs (x{best.factor:.3g})" if best.factor > 1 else ""
    summary = (f"{_us(seconds)} fused: {_mb(moved)} moved to and from {c.levels[1].name}; {used}; "
               f"{flops / 1e9:.3g} GFLOP{grid}{dropped}")
    return Costed(seconds, True, dict(best.tiles), summary, footprint=footprint, relaxed=table.relaxed,
                  serial=best.serial)
