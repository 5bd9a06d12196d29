"""``napkin lower``: the verb that writes kernels (it imports jax)."""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any

from napkin_cat import proof
from napkin_cat.files import Outputs
from napkin_cat.lower import DEFAULT_HARDWARE, KERNEL_DTYPES, UnprovedJoinWarning, lower
from napkin_cat.search.backward import DERIVED, derived
from napkin_cat.verbs import (
    EXIT_OK,
    UsageError,
    pairs,
)
from napkin_cat.verbs.common import module_or_usage
from napkin_cat.verbs.cost import dtype_option, hardware_option
from napkin_cat.verbs.replay import store

__all__ = ["cmd_lower"]


def cmd_lower(args: argparse.Namespace) -> int:
    """Lower a checked theorem to a Pallas kernel or a streamed plain-JAX module."""
    module = module_or_usage(args.file)
    backward = [n.strip() for n in (args.backward or "").split(",") if n.strip()]
    derive_backward = backward == [DERIVED]
    if args.strict and args.allow_tested_join:
        raise UsageError("--strict lowers only what is proved; --allow-tested-join lowers a join that is only tested")
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
        thm = proof.theorem(args.file, args.theorem, args.strict)
        backs = [proof.theorem(args.file, name, args.strict) for name in backward]
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
