"""The cost of a chain of kernels (``kernel.chain``): each kernel costed as a theorem of its own
(``cost.cost``, its report ``report.report``), the arrays between them kept in hbm (written by one
kernel, read by each later kernel that needs them: already in their hbm traffic), and the time
the kernels' times added, with the profile's ``launch_overhead`` for every launch after the first,
as a split's combine and the unfused baseline count it (``cost.roofline``).  The baseline is the
whole diagram's (every box its own kernel), so a chain's gain is against the same ideal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sympy

from napkin_cat.cost import Cost, cost
from napkin_cat.cost.report import format_report, report
from napkin_cat.cost.roofline import unfused
from napkin_cat.kernel import Theorem

__all__ = ["chain_report", "chain_seconds", "format_chain"]


def chain_seconds(costs: Sequence[tuple[Cost, Mapping[str, Any]]]) -> tuple[float, float] | None:
    """The chain's (serial, overlapped) time from its kernels' reports (each at its best tiles, with its grid's
    waves), one ``launch_overhead`` for each kernel after the first; None where a kernel has no time."""
    times = [r.get("time") for _, r in costs]
    if not costs or any(t is None for t in times):
        return None
    launches = (len(costs) - 1) * costs[0][0].hardware.launch_overhead
    return (sum(t["grid_serial_s"] for t in times if t) + launches,
            sum(t["grid_overlapped_s"] for t in times if t) + launches)


def chain_report(theorem: Theorem, name: str, devices: int | None = None, **options: Any) -> dict[str, Any]:
    """`napkin cost` of a chain: every kernel's report, the arrays written between them, the launches,
    and (with every size given) the summed time against the whole diagram's unfused baseline."""
    sizes = options.pop("sizes", None) or {}
    costs = [(c, report(c, k.name, devices)) for k in theorem.kernels
             for c in [cost(k, sizes={a: n for a, n in sizes.items() if a in k.result.axis_sizes()}, **options)]]
    first = costs[0][0]
    whole = cost(theorem, sizes=sizes, **options)  # the unscheduled diagram: its baseline, every box its own kernel
    buffers = []
    for k, (c, _), writes in zip(theorem.kernels[:-1], costs[:-1], theorem.writes[:-1], strict=True):
        for array in writes:
            j = next(j for j, o in enumerate(k.result.outputs) if getattr(o, "name", None) == array)
            axes = k.result.outputs[j].axes
            values = sympy.Mul(*(whole.sizes[a] for a in axes))
            bpv = c.bytes_of[c.program.nest.flat.outputs[j]]  # as the writing kernel stores it (an id in f32)
            readers = sum(array in {p.name for p in later.result.inputs} for later in theorem.kernels)
            buffers.append({"array": array, "axes": list(axes), "values": str(values), "bytes": str(values * bpv),
                            "written_by": k.name, "readers": readers})
    out: dict[str, Any] = {
        "theorem": name, "chain": True, "hardware": first.hardware.key, "dtype": first.dtype,
        "kernels": [dict(r, writes=list(w)) for (_, r), w in zip(costs, theorem.writes, strict=True)],
        "buffers": buffers, "launches": len(costs), "launch_overhead_s": first.hardware.launch_overhead,
        "flops": str(sympy.Add(*(c.flops for c, _ in costs))),
        "note": "each kernel is costed as a theorem of its own; an array between kernels is written to hbm once "
                "and read by each later kernel that needs it (in those kernels' hbm traffic); every launch after "
                "the first costs the profile's launch_overhead (napkin_cat/cost/chain.py)"}
    seconds = chain_seconds(costs)
    if seconds is not None:
        flop, move, launch = unfused(whole)
        base = {"serial": flop + move + launch, "overlapped": max(flop, move) + launch}
        out["time"] = {"serial_s": seconds[0], "overlapped_s": seconds[1], "unfused_s": base,
                       "gain_vs_unfused_serial": base["serial"] / seconds[0] if seconds[0] else None,
                       "gain_vs_unfused_overlapped": base["overlapped"] / seconds[1] if seconds[1] else None}
    return out


def format_chain(r: Mapping[str, Any]) -> str:
    """A chain's report as text: each kernel's, then the arrays between them and the total."""
    lines = [f"theorem {r['theorem']}: a chain of {r['launches']} kernels on {r['hardware']}, dtype {r['dtype']}",
             f"FLOPs (all kernels): {r['flops']}", ""]
    for k, kernel in enumerate(r["kernels"], start=1):
        writes = "the outputs" if kernel["writes"] == ["return"] else ", ".join(kernel["writes"])
        lines += [f"== kernel {k} of {r['launches']}: {kernel['theorem']}, writes {writes} ==",
                  format_report(kernel).rstrip("\n"), ""]
    for b in r["buffers"]:
        lines.append(f"buffer {b['array']} [{' '.join(b['axes'])}]: {b['values']} values ({b['bytes']} bytes) in hbm, "
                     f"written by {b['written_by']}, read by {b['readers']} later kernel(s)")
    lines.append(f"{r['launches']} launches (each after the first {r['launch_overhead_s']:g}s)")
    t = r.get("time")
    if t:
        base = t["unfused_s"]
        gain = "n/a" if t["gain_vs_unfused_serial"] is None else f"x{t['gain_vs_unfused_serial']:.3g}"
        lines.append(f"chain time: serial {t['serial_s']:.4g}s, overlapped {t['overlapped_s']:.4g}s (each kernel at "
                     f"its best tiles with its grid's waves, plus the launches); unfused baseline serial "
                     f"{base['serial']:.4g}s, overlapped {base['overlapped']:.4g}s; gain {gain} (serial)")
    return "\n".join(lines) + "\n"
