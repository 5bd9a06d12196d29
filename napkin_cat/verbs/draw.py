"""``napkin draw``: a diagram or theorem as SVG/PNG, or a theorem's derivation strip."""

from __future__ import annotations

import argparse
from pathlib import Path

from napkin_cat import draw, proof
from napkin_cat.certify import rules
from napkin_cat.files import Outputs
from napkin_cat.verbs import EXIT_OK, UsageError
from napkin_cat.verbs.common import diagram_or_usage, module_or_usage

__all__ = ["cmd_draw"]


def cmd_draw(args: argparse.Namespace) -> int:
    """Draw a diagram or a checked theorem as SVG/PNG, or a theorem's derivation strip."""
    module = module_or_usage(args.file)
    outputs = Outputs(module.scope_files)
    decl = next((t for t in module.theorems if t.name == args.name), None)
    if decl is None:
        if args.steps:
            raise UsageError(f"--steps draws the steps of a theorem; `{args.name}` is not a theorem in {args.file}")
        subject: object = diagram_or_usage(module, args.name)
    if args.steps:
        assert decl is not None
        states = proof.derivation(module, decl, rules.lemmas_in_scope(module))
        written = draw.draw_steps(states, args.output, expand=args.expand, outputs=outputs)
        print(f"wrote {len(written) - 1} step pictures and {written[-1]}")
        return EXIT_OK
    if Path(args.output).suffix not in (".svg", ".png"):
        raise UsageError(f"-o must name a .svg or .png file (or a folder with --steps), got {args.output}")
    outputs.check(args.output)
    if decl is not None:
        subject = proof.theorem(args.file, args.name)
    draw.save(subject, args.output, expand=args.expand, outputs=outputs)  # type: ignore[arg-type]
    print(f"wrote {args.output}")
    return EXIT_OK
