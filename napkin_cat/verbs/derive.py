"""``napkin derive``: search checked rewrites and relabellings for the cheapest schedule.

It loads no jax (the lowering screen and the targets' pricing facts are ``schedule.layout``'s);
``--lower`` imports the lowering to write the kernel too.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from napkin_cat.cost.hardware import HardwareError
from napkin_cat.diagnostics import render
from napkin_cat.files import Outputs
from napkin_cat.schedule.layout import DEFAULT_HARDWARE, KERNEL_DTYPES
from napkin_cat.search import derive
from napkin_cat.verbs import DEFAULT_DTYPE, EXIT_INPUT, EXIT_OK, KERNEL_DEFAULT_DTYPE, UsageError, parse_sizes
from napkin_cat.verbs.common import diagram_or_usage, module_or_usage
from napkin_cat.verbs.cost import dtype_option, hardware_option

__all__ = ["cmd_derive"]


def cmd_derive(args: argparse.Namespace) -> int:
    """Search checked rewrites and relabellings for the cheapest schedule; write it as a proof."""
    module = module_or_usage(args.file)
    diagram_or_usage(module, args.diagram)
    out = Path(args.output)
    if out.suffix != ".ncd":
        raise UsageError(f"-o expects a proof file name ending in .ncd, got {args.output!r}")
    dtype = dtype_option(args.dtype or (KERNEL_DEFAULT_DTYPE if args.lower else DEFAULT_DTYPE),
                         KERNEL_DTYPES if args.lower else None)
    hardware = hardware_option(args.hardware or (DEFAULT_HARDWARE[args.lower] if args.lower else "h100"))
    outputs = Outputs(module.scope_files)
    outputs.check(out)  # before the search: an unwritable -o is found now, not after it
    if args.lower:
        outputs.check(out.with_suffix(".py"))
    sizes = parse_sizes(args.size)
    axes = derive.axes_of(args.file, args.diagram)
    unknown = [a for a in sizes if a not in axes]
    if unknown:
        raise UsageError(f"--size names axes that `{args.diagram}` does not use: {', '.join(unknown)}")
    clash = [f"{a}={n} (declared {axes[a]})" for a, n in sizes.items() if axes[a] is not None and axes[a] != n]
    if clash:
        raise UsageError(f"--size contradicts declared sizes: {', '.join(clash)}")
    missing = [a for a, n in axes.items() if n is None and a not in sizes]
    if missing:
        raise UsageError(f"axes {', '.join(missing)} of `{args.diagram}` are symbolic: give their sizes with "
                         f"--size AXIS=N")
    try:
        cost = derive.model_cost(hardware, dtype, sizes, target=args.lower)
        unfused = derive.unfused_cost(hardware, dtype, sizes, target=args.lower)
    except HardwareError as exc:
        raise UsageError(str(exc)) from None
    settings = {"hardware": hardware.key, "dtype": dtype} | {a: str(n) for a, n in sizes.items()}
    found = derive.derive(args.file, args.diagram, cost, settings=settings, max_rewrites=args.max_rewrites,
                          budget=args.budget, seconds=args.seconds, lower=args.lower,
                          progress=lambda message: print(f"napkin derive: {message}", file=sys.stderr),
                          unfused=unfused, launch_overhead=hardware.launch_overhead)
    search = found.search
    print(f"search stopped: {search.stopped} ({search.detail}); {len(search.candidates)} candidates checked "
          f"in {search.elapsed:.2f} s")
    best = found.best
    if search.helps and best.cost is not None:
        print(f"best: {best.describe()}\n  {best.cost.summary}")
        if best.cost.tiles:
            print("  tiles: " + ", ".join(f"{k}={v}" for k, v in best.cost.tiles.items()))
    else:
        print(found.verdict())
    text, checked = derive.checked(found, out)  # the proof and its kernel are written together or not at all
    if checked.theorem is None:
        assert checked.failure is not None
        print(render(checked.failure, {str(out): text}), file=sys.stderr)
        return EXIT_INPUT
    written = {out: (text, f"wrote {out}: {checked.summary()}")}
    if args.lower:
        tiles = dict(best.cost.tiles) if best.cost is not None else {}
        from napkin_cat.lower import lower  # jax: loaded by `derive --lower` only

        lowered = lower(checked.theorem, target=args.lower, tiles=tiles, dtype=dtype, hardware=hardware)
        kernel_path = out.with_suffix(".py")
        written[kernel_path] = (lowered.source, f"wrote {kernel_path}: {args.lower} function `{lowered.function}`")
    outputs.write_all((path, data) for path, (data, _) in written.items())
    for _, said in written.values():
        print(said)
    return EXIT_OK
