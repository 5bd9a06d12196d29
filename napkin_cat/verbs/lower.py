"""``napkin lower`` and ``napkin derive``: the verbs that write kernels (they import jax)."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

from napkin_cat import proof
from napkin_cat.cost.hardware import HardwareError
from napkin_cat.diagnostics import render
from napkin_cat.files import Outputs
from napkin_cat.lower import DEFAULT_HARDWARE, KERNEL_DTYPES, UnprovedJoinWarning, lower
from napkin_cat.search import derive
from napkin_cat.search.backward import DERIVED, derived
from napkin_cat.verbs import (
    DEFAULT_DTYPE,
    EXIT_INPUT,
    EXIT_OK,
    KERNEL_DEFAULT_DTYPE,
    UsageError,
    pairs,
    parse_sizes,
)
from napkin_cat.verbs.common import diagram_or_usage, module_or_usage
from napkin_cat.verbs.cost import dtype_option, hardware_option
from napkin_cat.verbs.replay import store

__all__ = ["cmd_derive", "cmd_lower"]


def cmd_lower(args: argparse.Namespace) -> int:
    """Lower a checked theorem to a Pallas kernel or a streamed plain-JAX module."""
    module = module_or_usage(args.file)
    backward = [n.strip() for n in (args.backward or "").split(",") if n.strip()]
    derive_backward = backward == [DERIVED]
    for name in (args.theorem, *([] if derive_backward else backward)):
        if not any(t.name == name for t in module.theorems):
            known = ", ".join(t.name for t in module.theorems) or "none"
            raise UsageError(f"no theorem `{name}` in {args.file} (theorems: {known})")
    tiles = pairs(args.tile, "--tile", "NAME")
    dtype = dtype_option(args.dtype, KERNEL_DTYPES) if args.dtype else None  # lower's default: by target
    hardware = hardware_option(args.hardware) if args.hardware else None  # lower's default: by target
    outputs = Outputs(module.scope_files)
    outputs.check(args.output)
    if derive_backward:  # the forward saving its statistics and the derived passes, each proved
        found = derived(module, args.theorem, target=args.target, hardware=hardware or DEFAULT_HARDWARE[args.target])
        thm, backs, backward = found.forward, list(found.backward), [b.name for b in found.backward]
    else:
        thm = proof.theorem(args.file, args.theorem)
        backs = [proof.theorem(args.file, name) for name in backward]
    parts = [p for t in (thm, *backs) for p in proof.partitions(t)]
    names = {str(p.tile) for p in parts} | {p.axis for p in parts}
    names |= {f"{t.name}.{n}" for t in (thm, *backs) for p in proof.partitions(t) for n in (str(p.tile), p.axis)}
    unknown = [n for n in tiles if n not in names]
    if unknown:
        known = ", ".join(sorted({f"{p.tile} (axis {p.axis})" for p in parts})) or "none"
        raise UsageError(f"--tile names {', '.join(unknown)}: not a tile or partitioned axis of "
                         f"{', '.join(f'`{n}`' for n in (args.theorem, *backward))} (tiles: {known})")
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always", UnprovedJoinWarning)
        lowered = lower(thm, target=args.target, tiles=tiles, dtype=dtype, hardware=hardware, mesh=args.mesh,
                        backward=backs, allow_tested_join=args.allow_tested_join)
    warned_text = "".join(f"warning: {w.message}\n" for w in warned)
    print(warned_text, end="", file=sys.stderr)
    outputs.write(args.output, lowered.source)
    placed = "; ".join(_tiles_placed(lay) for lay in lowered.layouts or (lowered.layout,))
    placed += f"; on a mesh of {args.mesh} devices" if args.mesh is not None else ""
    said = f"wrote {args.output}: {args.target} function `{lowered.function}` ({placed})\n"
    print(said, end="")
    store(args, said, warned_text, {args.output: lowered.source})
    return EXIT_OK


def _tiles_placed(lay: Any) -> str:
    """``axis=tile, ...`` of a lowered kernel's layout, and its split's blocks."""
    placed = ", ".join(f"{axis}={tile}" for axis, tile in lay.tiles.items()) or "no tiles"
    return placed + (f"; {lay.split[0]} split in blocks of {lay.split[1]}" if lay.split is not None else "")


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
        lowered = lower(checked.theorem, target=args.lower, tiles=tiles, dtype=dtype, hardware=hardware)
        kernel_path = out.with_suffix(".py")
        written[kernel_path] = (lowered.source, f"wrote {kernel_path}: {args.lower} function `{lowered.function}`")
    outputs.write_all((path, data) for path, (data, _) in written.items())
    for _, said in written.values():
        print(said)
    return EXIT_OK
