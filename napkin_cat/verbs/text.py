"""``napkin parse`` and ``napkin grad``: an .ncd file printed back, a diagram's VJP as .ncd text."""

from __future__ import annotations

import argparse

from napkin_cat.files import Outputs
from napkin_cat.grad import vjp_module
from napkin_cat.printer import print_module
from napkin_cat.verbs import EXIT_OK
from napkin_cat.verbs.common import diagram_or_usage, module_or_usage

__all__ = ["cmd_grad", "cmd_parse"]


def cmd_parse(args: argparse.Namespace) -> int:
    print(print_module(module_or_usage(args.file)), end="")
    return EXIT_OK


def cmd_grad(args: argparse.Namespace) -> int:
    """Write a diagram's vector-Jacobian product (napkin_cat.grad) as .ncd text."""
    module = module_or_usage(args.file)
    diagram = diagram_or_usage(module, args.diagram)
    outputs = Outputs(module.scope_files)
    if args.output is not None:
        outputs.check(args.output)
    text = print_module(vjp_module(diagram))  # type: ignore[arg-type]
    if args.output is None:
        print(text, end="")
    else:
        outputs.write(args.output, text)
        print(f"wrote {args.output}: diagram `{args.diagram}_vjp`")
    return EXIT_OK
