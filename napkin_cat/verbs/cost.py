"""``napkin cost`` and ``napkin pseudo``, and the options every verb that prices or lowers
reads: ``--dtype``, ``--hardware``, the theorem."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping

from napkin_cat import cost, proof, pseudo
from napkin_cat.cost import chain as cost_chain
from napkin_cat.cost import hardware as hw
from napkin_cat.cost import report as cost_report
from napkin_cat.cost.hardware import HardwareError
from napkin_cat.diagnostics import NapkinError, error
from napkin_cat.kernel import Theorem
from napkin_cat.verbs import EXIT_OK, UsageError, parse_sizes
from napkin_cat.verbs.common import module_or_usage
from napkin_cat.verbs.replay import store

__all__ = ["cmd_cost", "cmd_pseudo", "dtype_option", "hardware_option", "theorem_or_usage"]


def dtype_option(name: str, kernel_dtypes: Mapping[str, str] | None = None) -> str:
    """``--dtype`` in the cost model's vocabulary (``hardware.canonical_dtype``); given the
    lowering's ``kernel_dtypes``, only the formats a kernel can be emitted in."""
    try:
        canonical = hw.canonical_dtype(name)
    except hw.HardwareError as exc:
        raise UsageError(str(exc)) from None
    if kernel_dtypes is not None and canonical not in kernel_dtypes:
        raise UsageError(f"dtype `{name}` is modelled by `cost` but kernels are emitted in "
                         f"{', '.join(kernel_dtypes)} only")
    return canonical


def hardware_option(name: str) -> hw.Hardware:
    """``--hardware``: a shipped profile's name or a .toml file, read and checked now, before
    any long work.  An unknown name or a missing file is a usage error; a file that cannot be
    read or breaks the schema an error in an input (``hardware.profile``)."""
    try:
        return hw.load(name)
    except hw.ProfileError as exc:
        raise NapkinError(error("hardware.profile", path=exc.path, reason=exc.reason)) from None
    except hw.HardwareError as exc:
        raise UsageError(str(exc)) from None


def theorem_or_usage(path: str, name: str) -> Theorem:
    module = module_or_usage(path)
    if not any(t.name == name for t in module.theorems):
        known = ", ".join(t.name for t in module.theorems) or "none"
        raise UsageError(f"no theorem `{name}` in {path} (theorems: {known})")
    return proof.theorem(path, name)


def cmd_cost(args: argparse.Namespace) -> int:
    """Derive a theorem's per-level transfers, memory, FLOPs, optimum, lower bound and times."""
    dtype, hardware, sizes = dtype_option(args.dtype), hardware_option(args.hardware), parse_sizes(args.size)
    thm = theorem_or_usage(args.file, args.theorem)
    try:
        options = {"hardware": hardware, "sizes": sizes, "dtype": dtype, "stages": args.stages, "live": args.live}
        data = cost_chain.chain_report(thm, args.theorem, args.mesh, **options) if thm.kernels else \
            cost_report.report(cost.cost(thm, **options), args.theorem, args.mesh)
    except (HardwareError, cost.CostError) as exc:
        raise UsageError(str(exc)) from None
    text = json.dumps(data, indent=2, allow_nan=False) + "\n" if args.json else \
        (cost_chain.format_chain if thm.kernels else cost_report.format_report)(data)
    print(text, end="")
    store(args, text)
    return EXIT_OK


def cmd_pseudo(args: argparse.Namespace) -> int:
    """Print a theorem's pseudocode diagram: loops, columns, live buffers, transfers per level."""
    dtype, hardware, sizes = dtype_option(args.dtype), hardware_option(args.hardware), parse_sizes(args.size)
    thm = theorem_or_usage(args.file, args.theorem)
    parts = []
    for k, (kernel, writes) in enumerate(zip(thm.kernels, thm.writes, strict=True), start=1):  # a chain's, in order
        wrote = "the outputs" if writes == ("return",) else f"{', '.join(writes)} to hbm for the kernels after it"
        parts.append((f"# kernel {k} of {len(thm.kernels)}: {kernel.name}, writes {wrote}\n", kernel))
    unknown = [a for a in sizes if parts and not any(a in k.result.axis_sizes() for k in thm.kernels)]
    if unknown:
        raise UsageError(f"sizes name axes that `{thm.source.name}` does not use: {', '.join(unknown)}")
    text = ""
    try:
        for header, each in parts or [("", thm)]:
            own = {a: n for a, n in sizes.items() if a in each.result.axis_sizes()} if parts else sizes
            c = cost.cost(each, hardware=hardware, sizes=own, dtype=dtype, stages=args.stages, live=args.live)
            text += header + pseudo.render(c.program, c.bytes_of)
    except (HardwareError, cost.CostError) as exc:
        raise UsageError(str(exc)) from None
    print(text, end="")
    store(args, text)
    return EXIT_OK
