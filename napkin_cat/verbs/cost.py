"""``napkin cost`` and ``napkin pseudo``, and the options every verb that prices or lowers
reads: ``--dtype``, ``--hardware``, the theorem."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping

from napkin_cat import cost, proof, pseudo
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
        c = cost.cost(thm, hardware=hardware, sizes=sizes, dtype=dtype, stages=args.stages)
        data = cost_report.report(c, args.theorem, args.mesh)
    except (HardwareError, cost.CostError) as exc:
        raise UsageError(str(exc)) from None
    text = json.dumps(data, indent=2, allow_nan=False) + "\n" if args.json else cost_report.format_report(data)
    print(text, end="")
    store(args, text)
    return EXIT_OK


def cmd_pseudo(args: argparse.Namespace) -> int:
    """Print a theorem's pseudocode diagram: loops, columns, live buffers, transfers per level."""
    dtype, hardware, sizes = dtype_option(args.dtype), hardware_option(args.hardware), parse_sizes(args.size)
    thm = theorem_or_usage(args.file, args.theorem)
    try:
        c = cost.cost(thm, hardware=hardware, sizes=sizes, dtype=dtype, stages=args.stages)
    except (HardwareError, cost.CostError) as exc:
        raise UsageError(str(exc)) from None
    text = pseudo.render(c.program, c.bytes_of)
    print(text, end="")
    store(args, text)
    return EXIT_OK
