"""The `napkin cost` report: the derived cost, its optimum, the lower bound, the unfused
baseline, time estimates and the configuration table, as JSON-ready data and as text.

Every expression is written with ``str`` so that ``sympy.sympify`` parses it back.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import sympy

from napkin_cat.cost import Cost
from napkin_cat.cost import hardware as hw
from napkin_cat.cost.bounds import diagram_bound, lower_bounds
from napkin_cat.cost.mesh import mesh_cost, mesh_times
from napkin_cat.cost.optimise import ConfigTable, M, continuous, multilevel, piecewise, search
from napkin_cat.cost.roofline import timing, unfused
from napkin_cat.schedule.loopnest import woven_axes

__all__ = ["format_report", "report"]


def _s(expr: Any) -> str:
    return str(sympy.nsimplify(expr) if isinstance(expr, float) else expr)


def _num(expr: Any) -> Any:
    value = sympy.sympify(expr)
    return float(value) if value.is_number else str(value)


def _real(expr: Any) -> float | None:
    """The value of a real number expression; None for a complex one or one with free symbols."""
    value = sympy.sympify(expr)
    if not value.is_number:
        return None
    number = complex(sympy.N(value))
    return number.real if abs(number.imag) <= 1e-12 * max(1.0, abs(number.real)) else None


def _shortest(expr: sympy.Expr) -> sympy.Expr:
    """The simplest of the expanded and factored forms of ``expr`` (a sum of simple terms
    such as ``1 + sqrt(M)/(2*b)`` reads best expanded; a ratio of sums, factored)."""
    simple = sympy.simplify(expr)
    return min((sympy.expand(simple), sympy.factor(simple), simple), key=sympy.count_ops)


def report(c: Cost, name: str, devices: int | None = None) -> dict[str, Any]:
    """Everything `napkin cost` prints, for the cost ``c`` of theorem ``name`` (its mesh level on
    ``devices`` devices, by default the hardware profile's devices per node)."""
    numeric = not any(isinstance(s, sympy.Symbol) for s in c.sizes.values())
    bpv = hw.bytes_per_value(c.dtype)
    first = c.first
    capacity = c.hardware.level(first.name).capacity / bpv
    out: dict[str, Any] = {
        "theorem": name, "diagram": c.diagram, "hardware": c.hardware.key, "dtype": c.dtype,
        "sizes": {k: _s(v) for k, v in c.sizes.items()}, "convention": c.convention,
        "compute_level": c.program.compute_level, "flops": _s(c.flops),
        "levels": [{"name": lv.name, "parent": lv.parent, "transfers": _s(lv.transfers),
                    "transfers_bytes": _s(lv.transfers_bytes), "memory": _s(lv.memory),
                    "memory_bytes": _s(lv.memory_bytes),
                    "capacity_bytes": c.hardware.level(lv.name).capacity} for lv in c.levels],
        "levels_note": "transfers are the values moved between a level and its parent; hbm has no parent "
                       "(0): its traffic is the transfers of the level below it",
    }
    opt = continuous(c)
    bounds = lower_bounds(c.program.nest.flat, c.sizes, M)
    at = {M: sympy.nsimplify(capacity)} if numeric else {}
    bound = diagram_bound(bounds, at if numeric else None)
    # a tile whose optimum is a family (GQA's gg = M/(130 gq): H depends on their product) has no one value
    values = {k: value for k, v in opt.tiles.items() if (value := _real(v.subs(at))) is not None} \
        if opt is not None and numeric else {}
    unreal = [k for k, v in opt.tiles.items() if sympy.sympify(v.subs(at)).is_number and k not in values] \
        if opt is not None and numeric else []
    extent = {str(lp.tile): c.sizes[lp.axis] for lp in c.program.nest.loops if lp.level == first.name}
    outside = {k: v for k, v in values.items() if v < 1 or (k in extent and v > extent[k])}
    if opt is None or outside or unreal:
        out["optimum"] = None
        out["optimum_note"] = (
            f"no real optimum: at M = the capacity the Lagrange stationary point gives {', '.join(unreal)} no real "
            "value; the configurations below give the best integer tiles" if unreal else
            "no interior optimum: at M = the capacity the Lagrange stationary point has "
            + ", ".join(f"{k} = {v:.6g}" + (f" (the axis is {extent[k]})" if k in extent else "")
                        for k, v in outside.items())
            + ", outside a tile's range (1 to its axis): the best tiles lie on the boundary, and the "
            "configurations below give them" if outside else
            "no closed form: the masked stream's chunk count is piecewise in the sizes (Min/Max: "
            "where the mask clips depends on which size is larger); give every size with --size for the "
            "optimum at those sizes" if piecewise(c.first.transfers) and not numeric else
            "no closed form: the masked stream's chunk count is piecewise in the tiles (Min/Max: where the "
            "mask clips depends on the tile); the configurations below give the best integer tiles"
            if piecewise(c.first.transfers) else
            "no closed form: sympy could not solve the Lagrange conditions")
    else:
        out["optimum"] = {
            "level": opt.level, "capacity_symbol": "M (values of the compute dtype)",
            "tiles": {k: _num(v.subs(at)) if numeric else _s(v) for k, v in opt.tiles.items()},
            "transfers": _num(opt.transfers.subs(at)) if numeric else _s(sympy.expand(opt.transfers)),
            "terms": [[_s(a), _s(b)] for a, b in opt.terms], "beta": _s(opt.beta),
            "transfers_bytes_symbolic": _s(sympy.expand(opt.in_bytes())),
        }
        out["lower_bound"] = {"kind": bound.kind, "expr": _s(bound.expr), "source": bound.source,
                              "value": _num(bound.expr.subs(at)) if numeric else _s(bound.expr),
                              "ratio": _num(_shortest((opt.transfers / bound.expr).subs(at)))}
    if "lower_bound" not in out:
        out["lower_bound"] = {"kind": bound.kind, "expr": _s(bound.expr), "source": bound.source}
        if numeric:
            out["lower_bound"]["value"] = _num(bound.expr.subs(at))
    out["compulsory"] = _s(bounds[-1].expr)
    base = c.baseline
    out["baseline"] = {"transfers": _s(base.transfers), "transfers_bytes": _s(base.transfers_bytes),
                       "memory": _s(base.memory), "flops": _s(base.flops),
                       "note": "every box its own kernel, memory unconstrained per kernel"}
    woven = woven_axes(c.program.nest.flat, frozenset(lp.axis for lp in c.program.nest.loops))
    if woven:
        out["pallas_grid"] = {"axes": list(woven), "note": (
            f"a Pallas kernel runs {', '.join(woven)} one position per program; this costs the schedule as "
            f"proved, with {'them' if len(woven) > 1 else 'it'} whole in every group (add "
            + "; ".join(f"`group {a} by 1`" for a in woven) + " to the proof to cost that kernel)")}
    loops = c.program.nest.loops
    for index, runs, full in c.program.masked:
        out["masked"] = {"axis": loops[index].axis, "runs": _s(runs), "of": _s(full), "note": (
            f"a mask fills whole {loops[index].axis}-chunks: {_s(runs)} of the {_s(full)} (group, chunk) "
            "pairs can hold a true position (for a mask read from data, the --live fraction given), and the "
            "counts inside the stream are the Pallas kernel's, which runs only those (the plain-JAX kernel "
            "runs all of them where it vectorises the masked group)")}
    mask = c.program.block_mask
    if mask is not None:
        out["block_mask"] = {"reads": list(mask.reads), "programs": _s(mask.programs), "chunks": _s(mask.chunks),
                             "live": _s(mask.live), "note": (
            "a mask read from data: its block mask, computed before the kernel, is in the hbm traffic above "
            f"(reads {', '.join(mask.reads) or 'no input'} once; per (program, chunk) pair its kind written "
            "and read back, per program its live chunks and their full flags written, and read by the kernel "
            "on the live pairs; napkin_cat/schedule/program.py BlockMask)")}
    ml = multilevel(c) if len(c.levels) > 2 else None
    if ml is not None:
        out["multilevel"] = {"levels": {k: _s(v.transfers) for k, v in ml[0].items()}, "time": _s(ml[1])}
    if numeric:
        _numeric(c, out)
    _mesh(c, out, devices)
    if c.split is not None:
        sp = c.split
        out["split"] = {"axis": sp.axis, "tile": str(sp.tile), "blocks": _s(sp.blocks), "programs": _s(c.programs),
                        "states": _s(sp.states), "states_bytes": _s(sp.states_bytes), "rereads": _s(sp.rereads),
                        "rereads_bytes": _s(sp.rereads_bytes), "launches": sp.launches,
                        "launch_overhead_s": c.hardware.launch_overhead,
                        "note": "every program writes its partial state to hbm and the combine step reads it back "
                                "(2 x states, f32, in the hbm traffic above, with the re-reads of inputs lacking "
                                "the axis); the combine is one more launch (napkin_cat/cost/split.py)"}
    return out


def _mesh(c: Cost, out: dict[str, Any], devices: int | None) -> None:
    """The mesh level (``cost_mesh``): a level above hbm in ``levels`` (whose transfers into hbm
    are every device's receives, and whose hbm memory is one device's), and its details: at the
    tiles the time takes where sizes are numbers (a block in whole tiles depends on the tile)."""
    m = mesh_cost(c, devices)
    if m is None:
        return
    best = out["time"]["tiles"] if out.get("time") else {}
    m = dataclasses.replace(m, blocks={k: c.at(v, best) for k, v in m.blocks.items()},
                            **{f: c.at(getattr(m, f), best) for f in ("sends", "sends_bytes", "memory",
                                                                       "memory_bytes", "flops", "hbm_bytes")})
    top = out["levels"][0]
    mesh_level = {"name": "mesh", "parent": None, "transfers": "0", "transfers_bytes": "0",
                  "memory": top["memory"], "memory_bytes": top["memory_bytes"],
                  "capacity_bytes": c.hardware.level("mesh").capacity}
    top.update({"parent": "mesh", "transfers": _s(m.devices * m.sends),
                "transfers_bytes": _s(m.devices * m.sends_bytes), "memory": _s(m.memory),
                "memory_bytes": _s(m.memory_bytes)})
    out["levels"].insert(0, mesh_level)
    times = mesh_times(c, m, best)
    out["mesh"] = {
        "devices": m.devices, "sharded": m.sharded, "ring": m.ring,
        "interconnect_bytes_per_s": c.hardware.level("mesh").bandwidth,
        "blocks": {k: _s(v) for k, v in m.blocks.items()},
        "sends_per_device": _s(m.sends), "receives_per_device": _s(m.sends),
        "sends_bytes_per_device": _s(m.sends_bytes), "receives_bytes_per_device": _s(m.sends_bytes),
        "memory_per_device": _s(m.memory), "memory_bytes_per_device": _s(m.memory_bytes),
        "flops_per_device": _s(m.flops), "hbm_transfers_bytes_per_device": _s(m.hbm_bytes),
        "time_s": {k: _num(v) for k, v in times.items()}, "time_tiles": dict(best),
        "note": "per device; the ring passes each block of its inputs on N - 1 times (placing the inputs is not "
                "counted); hbm holds a device's blocks, a ring input twice (folded and arriving); serial adds "
                "compute, hbm and interconnect times, overlapped takes their maximum",
    }


def _numeric(c: Cost, out: dict[str, Any]) -> None:
    """Configuration table and time estimates at the best integer tiles."""
    table: ConfigTable = search(c, relax=True)
    out["configurations"] = [{"tiles": r.tiles, "memory_bytes": r.memory, "transfers_bytes": r.transfers,
                              "transfer_time_s": r.transfer_time, "programs": r.programs,
                              "parallel_factor": r.factor, "padding_factor": r.slower, "time_s": r.seconds,
                              "launch": None if r.launch is None else dataclasses.asdict(r.launch)}
                             for r in table.rows]
    if c.hardware.launch:
        values, fixed, staged, rows = c.on_chip
        out["launch_rule"] = {
            "registers_values": _s(values), "smem_fixed_bytes": _s(fixed), "smem_staged_bytes": _s(staged),
            "rows": _s(rows),
            **c.hardware.launch,
            "note": "a Triton program keeps its computed tiles (intermediates, accumulator states; 32-bit "
                    "values) in registers and its loaded blocks in shared memory, streamed chunks once per "
                    "pipeline stage; num_warps is the fewest whose register_budget share of "
                    "registers_per_thread x 32 x warps holds the values, with at least rows_per_warp of "
                    "the program's rows per warp (more repeat work), num_stages the most that fit; "
                    "occupancy: programs per SM by registers and shared memory (napkin_cat/cost/launch.py)"}
    out["constraints"] = {k: list(v) for k, v in table.constraints.items()}
    out["relaxed"] = list(table.relaxed)
    if not table.rows:
        exact = [f"{lp.tile} | {lp.axis}={c.sizes[lp.axis]}" for lp in c.program.nest.loops
                 if isinstance(lp.tile, str) and not lp.partition.pad and lp.level == c.first.name]
        out["configurations_note"] = "none feasible under the capacity and divisibility constraints" + (
            f"; without `pad` a tile must divide its axis ({', '.join(exact)}): `pad` allows ragged tiles"
            if exact else "")
    base_flop, base_move, base_launch = unfused(c)
    out["baseline"]["time_s"] = {"flops": base_flop, "transfers": base_move, "launches": base_launch,
                                 "serial": base_flop + base_move + base_launch,
                                 "overlapped": max(base_flop, base_move) + base_launch}
    out["baseline"]["fits"] = float(c.baseline.memory_bytes) <= c.hardware.level(c.first.name).capacity
    if not table.rows:
        out["time"] = None
        return
    chosen = table.rows[0]
    best: Mapping[str, int] = chosen.tiles
    t = timing(c, best, chosen.padding)
    serial, overlapped = float(t.serial), float(t.overlapped)
    # FLOPs per byte of hbm traffic; None where nothing moves through hbm (no ratio exists)
    intensity = t.intensity if math.isfinite(t.intensity) else None
    groups, factor = chosen.programs, chosen.factor
    out["time"] = {"tiles": dict(best), "flops_s": float(t.flop_time), "loop_overhead_s": float(t.overhead),
                   "transfers_s": {k: float(v) for k, v in t.transfer_times},
                   "serial_s": serial, "overlapped_s": overlapped,
                   "intensity_flop_per_byte": intensity, "ridge_flop_per_byte": t.ridge,
                   "bound_by": max([("compute", t.flop_time), *t.transfer_times], key=lambda kv: kv[1])[0],
                   "parallel_groups": groups, "sms": c.hardware.sms, "parallel_factor": factor,
                   "padding": {"arrays": dict(chosen.padding.arrays), "contraction_flops": chosen.padding.flops},
                   "padding_factor": chosen.slower,
                   "grid_serial_s": serial * factor, "grid_overlapped_s": overlapped * factor,
                   "gain_vs_unfused_serial": _ratio(base_flop + base_move + base_launch, serial * factor),
                   "gain_vs_unfused_overlapped": _ratio(max(base_flop, base_move) + base_launch,
                                                        overlapped * factor)}


def _launch(plan: Mapping[str, Any] | None) -> str:
    """A configuration's launch, for the table: warps, stages, registers per thread, occupancy."""
    if plan is None:
        return ""
    return (f"; {plan['num_warps']} warps, {plan['num_stages']} stages, {plan['per_thread']:.0f} values/thread, "
            f"{plan['occupancy']} program(s)/SM")


def _ratio(a: float, b: float) -> float | None:
    """a / b; None where b is 0 (a kernel that moves and computes nothing has no gain)."""
    return a / b if b else None


def _intensity(t: Mapping[str, Any]) -> str:
    if t["intensity_flop_per_byte"] is None:
        return "no hbm traffic (compute-bound)"
    bound = {"compute": "compute-bound", "l2": "bound by the L2's bandwidth"}.get(
        t["bound_by"], f"bound by the transfers into {t['bound_by']}")
    return (f"intensity {t['intensity_flop_per_byte']:.4g} FLOP per byte from hbm vs ridge "
            f"{t['ridge_flop_per_byte']:.4g}; {bound}")


def _gain(value: float | None) -> str:
    return "n/a" if value is None else f"x{value:.3g}"


def format_report(r: Mapping[str, Any]) -> str:
    """A readable table of a report."""
    lines = [f"theorem {r['theorem']} (diagram {r['diagram']}) on {r['hardware']}, dtype {r['dtype']}; "
             f"boxes run at {r['compute_level']}",
             "sizes: " + ", ".join(f"{k}={v}" for k, v in r["sizes"].items()),
             f"convention: {r['convention']}", "", f"FLOPs: {r['flops']}",
             f"{'level':<6} {'transfers H (values)':<40} {'memory M (values)':<36} capacity (bytes)"]
    for lv in r["levels"]:
        h = "-" if lv["parent"] is None else lv["transfers"]
        lines.append(f"{lv['name']:<6} {h:<40} {lv['memory']:<36} {lv['capacity_bytes']:.6g}")
    lines.append(f"unfused baseline ({r['baseline']['note']}): H = {r['baseline']['transfers']}, "
                 f"M = {r['baseline']['memory']}")
    opt = r.get("optimum")
    if opt:
        tiles = ", ".join(f"{k} = {v}" for k, v in opt["tiles"].items()) or "none free"
        lines += ["", f"continuous optimum at {opt['level']} (M = capacity in values): {tiles}",
                  f"  H* = {opt['transfers']}   (beta = {opt['beta']}; in bytes for M_bytes: "
                  f"{opt['transfers_bytes_symbolic']})"]
    else:
        lines += ["", r.get("optimum_note", "no optimum")]
    lb = r["lower_bound"]
    lines.append(f"lower bound ({lb['kind']}; {lb['source']}): {lb.get('value', lb['expr'])}"
                 + (f";  H*/bound = {lb['ratio']}" if "ratio" in lb else ""))
    lines.append(f"compulsory traffic (M -> oo): {r['compulsory']}")
    if "masked" in r:
        lines.append(f"note: {r['masked']['note']}")
    if "block_mask" in r:
        lines.append(f"note: {r['block_mask']['note']}")
    if "pallas_grid" in r:
        lines.append(f"note: {r['pallas_grid']['note']}")
    if "multilevel" in r:
        lines.append(f"multi-level (bandwidth-weighted, seconds): T = {r['multilevel']['time']}")
    if r.get("configurations") is not None:
        capacity = {lv["name"]: lv["capacity_bytes"] for lv in r["levels"]}
        lines += ["", "configurations (best first; bytes, % of the level's capacity):"]
        for row in r["configurations"]:
            tiles = " ".join(f"{k}={v}" for k, v in row["tiles"].items())
            mem = " ".join(f"M_{k}={v:.0f} ({100 * v / capacity[k]:.0f}%)" for k, v in row["memory_bytes"].items())
            moved = " ".join(f"H_{k}={v:.4g}" for k, v in row["transfers_bytes"].items())
            lines.append(f"  {tiles:<36} {mem:<28} {moved:<30} t={row['time_s']:.4g}s"
                         + f" (x{row['parallel_factor']:.3g}: {row['programs']:.0f} programs)" + _launch(row["launch"]))
        if not r["configurations"]:
            lines.append(f"  {r['configurations_note']}")
        if r.get("relaxed"):
            lines.append("  none met every preferred multiple; dropped: " + "; ".join(r["relaxed"]))
        for k, v in r["constraints"].items():
            lines.append(f"  {k}: {'; '.join(v)}")
        if "launch_rule" in r:
            rule = r["launch_rule"]
            lines.append(f"  launch: registers {rule['registers_values']} values, shared memory "
                         f"{rule['smem_fixed_bytes']} + stages x {rule['smem_staged_bytes']} bytes, "
                         f"rows {rule['rows']}; {rule['note']}")
    if "mesh" in r:
        m = r["mesh"]
        lines += ["", f"mesh: {m['devices']} devices" + (f", {m['sharded']} sharded" if m["sharded"] else "")
                  + (f", {m['ring']} passed around the ring" if m["ring"] else "") + "; blocks "
                  + ", ".join(f"{k} = {v}" for k, v in m["blocks"].items()),
                  f"  per device: sends and receives {m['sends_per_device']} values ({m['sends_bytes_per_device']} "
                  f"bytes); memory {m['memory_per_device']} values ({m['memory_bytes_per_device']} bytes); "
                  f"FLOPs {m['flops_per_device']}",
                  "  time per device" + (f" at {m['time_tiles']}" if m["time_tiles"] else "") + ": "
                  + ", ".join(f"{k} {v:.4g}s" if isinstance(v, float) else f"{k} {v}" for k, v in m["time_s"].items())]
    if "split" in r:
        sp = r["split"]
        lines += ["", f"split: {sp['axis']} in {sp['blocks']} blocks of {sp['tile']}, one program each: "
                  f"{sp['programs']} programs; partial states {sp['states']} values ({sp['states_bytes']} bytes) "
                  f"written and read back; re-reads {sp['rereads']} values ({sp['rereads_bytes']} bytes); "
                  f"{sp['launches']} launches (each after the first {sp['launch_overhead_s']:g}s)"]
    t = r.get("time")
    if t:
        per = ", ".join(f"{k} {v:.4g}s" if k != "l2" else f"the same bytes through the l2 {v:.4g}s"
                        for k, v in t["transfers_s"].items())
        b = r["baseline"]["time_s"]
        what = "loop and launch overhead" if "split" in r else "loop overhead"
        loops = f"; {what} {t['loop_overhead_s']:.4g}s" if t["loop_overhead_s"] else ""
        pad = t["padding"]
        grown = ", ".join(f"{a} x{f:.3g}" for a, f in pad["arrays"].items()) or "none"
        padded = ([f"  tiles without the preferred multiples, priced as padded to them: hbm traffic of {grown}; "
                   f"contraction FLOPs x{pad['contraction_flops']:.3g} (x{t['padding_factor']:.3g} the time)"]
                  if t["padding_factor"] != 1 else [])
        lines += ["", f"time at {t['tiles']}: FLOPs {t['flops_s']:.4g}s; transfers {per}{loops}", *padded,
                  f"  serial (sum) {t['serial_s']:.4g}s; overlapped (max) {t['overlapped_s']:.4g}s; "
                  + _intensity(t),
                  f"  {t['parallel_groups']:.0f} programs (parallel groups) on {t['sms']} SMs"
                  + ("" if t["parallel_factor"] == 1 else
                     f": in waves that leave SMs idle, x{t['parallel_factor']:.3g} the times above, "
                     f"serial {t['grid_serial_s']:.4g}s, overlapped {t['grid_overlapped_s']:.4g}s"),
                  f"  unfused baseline: serial {b['serial']:.4g}s, overlapped {b['overlapped']:.4g}s"
                  + (f" (with {b['launches']:.4g}s of launch overhead, a kernel per box)" if b["launches"] else "")
                  + "; gain "
                  f"{_gain(t['gain_vs_unfused_serial'])} (serial), "
                  f"{_gain(t['gain_vs_unfused_overlapped'])} (overlapped)"
                  + ("" if r["baseline"]["fits"] else f"; the baseline does not fit {_below_hbm(r)} "
                     "(its kernels need more than the capacity), so it is an ideal, not a real kernel")]
    return "\n".join(lines) + "\n"


def _below_hbm(r: Mapping[str, Any]) -> str:
    """The name of the level whose parent is hbm (the first on chip)."""
    return str(next(lv["name"] for lv in r["levels"] if lv["parent"] == "hbm"))
