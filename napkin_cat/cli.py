"""The `napkin` command line: the only module that prints or exits.

Exit codes: 0 success, 1 an error in the input (diagnostics printed), 2 a usage error
(including an output that cannot or must not be written), 74 standard output or error could
not be written (a full disk; sysexits' EX_IOERR), 130 interrupted (Ctrl-C), 141 the reader
of standard output closed it early (as SIGPIPE would).
Each subcommand is one ``cmd_*`` function registered in ``_parser``.  Outputs go through
``files.Outputs``: checked before any long work, never one of the files read, written
atomically.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from napkin_cat import __version__, certify, cost, proof, pseudo
from napkin_cat.certify import catalogue, prove, rules
from napkin_cat.certify.accumulators import accumulators_for
from napkin_cat.cost import hardware as hw
from napkin_cat.cost import report as cost_report
from napkin_cat.cost.hardware import HardwareError
from napkin_cat.diagnostics import NapkinError, error, render
from napkin_cat.elaborate import load
from napkin_cat.evaluate import bind_sizes, refuse_too_large, run
from napkin_cat.files import FileRefused, OutputRefused, Outputs, source_paths
from napkin_cat.grad import vjp_module
from napkin_cat.kernel import Theorem
from napkin_cat.printer import print_module
from napkin_cat.proof import check_file
from napkin_cat.terms import MAX_AXIS_SIZE, MAX_MESH_DEVICES, Module

__all__ = ["main"]


class UsageError(Exception):
    """A command-line mistake (exit code 2)."""


EXIT_OK, EXIT_INPUT, EXIT_USAGE, EXIT_IO, EXIT_INTERRUPTED, EXIT_PIPE = 0, 1, 2, 74, 130, 141

#: the number formats every verb accepts (``--dtype``), and the one default
DEFAULT_DTYPE = "bf16"


def _pairs(items: Sequence[str] | None, flag: str, what: str) -> dict[str, int]:
    """``NAME=N`` pairs with N a positive integer of ASCII digits up to ``MAX_AXIS_SIZE``."""
    pairs: dict[str, int] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        ok = sep and name and value.isascii() and value.isdigit() and len(value) <= 20
        if not ok or not 0 < int(value) <= MAX_AXIS_SIZE:
            raise UsageError(f"{flag} expects {what}=N with N a positive integer up to {MAX_AXIS_SIZE}, got {item!r}")
        pairs[name] = int(value)
    return pairs


def parse_sizes(items: Sequence[str] | None) -> dict[str, int]:
    """``AXIS=N`` pairs from ``--size``; a malformed pair is a usage error."""
    return _pairs(items, "--size", "AXIS")


def _module(path: str) -> Module:
    if not os.path.lexists(path):
        raise UsageError(f"no such file: {path}")
    return load(path)


def _dtype(name: str, kernel_dtypes: Mapping[str, str] | None = None) -> str:
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


def _hardware(name: str) -> hw.Hardware:
    """``--hardware``: a shipped profile's name or a .toml file, read and checked now, before
    any long work.  An unknown name or a missing file is a usage error; a file that cannot be
    read or breaks the schema an error in an input (``hardware.profile``)."""
    try:
        return hw.load(name)
    except hw.ProfileError as exc:
        raise NapkinError(error("hardware.profile", path=exc.path, reason=exc.reason)) from None
    except hw.HardwareError as exc:
        raise UsageError(str(exc)) from None


def _diagram_or_usage(module: Module, name: str) -> object:
    try:
        return module.diagram(name)
    except KeyError:
        known = ", ".join(d.name for d in module.scope_diagrams) or "none"
        raise UsageError(f"no diagram `{name}` in {module.path} (diagrams: {known})") from None


def cmd_parse(args: argparse.Namespace) -> int:
    print(print_module(_module(args.file)), end="")
    return EXIT_OK


def cmd_eval(args: argparse.Namespace) -> int:
    module = _module(args.file)
    diagram = _diagram_or_usage(module, args.diagram)
    sizes = parse_sizes(args.size)
    known = {a.name: a.size for a in diagram.axes}  # type: ignore[attr-defined]
    unknown = [a for a in sizes if a not in known]
    if unknown:
        raise UsageError(f"--size names axes that `{args.diagram}` does not use: {', '.join(unknown)}")
    clashes = [f"{a}={n} (declared {known[a]})" for a, n in sizes.items() if known[a] not in (None, n)]
    if clashes:
        raise UsageError(f"--size contradicts a declared axis size: {', '.join(clashes)}")
    rng = np.random.default_rng(args.seed)
    shapes = []
    for param in diagram.inputs:  # type: ignore[attr-defined]
        shape = []
        for axis in param.axes:
            n = known[axis] if known[axis] is not None else sizes.get(axis)
            if n is None:
                raise UsageError(f"axis `{axis}` is symbolic: give its size with --size {axis}=N")
            shape.append(n)
        shapes.append(tuple(shape))
    refuse_too_large(diagram, bind_sizes(diagram, shapes, sizes))  # type: ignore[arg-type]  # before allocating
    arrays = [rng.standard_normal(s) for s in shapes]
    result = run(diagram, *arrays, sizes=sizes)  # type: ignore[arg-type]
    outs = result if isinstance(result, tuple) else (result,)
    for i, (out, axes) in enumerate(zip(outs, diagram.out_types, strict=True)):  # type: ignore[attr-defined]
        arr = np.asarray(out)
        finite = arr[np.isfinite(arr)]
        summary = (f"mean={finite.mean():.6g} std={finite.std():.6g} min={finite.min():.6g} max={finite.max():.6g}"
                   if finite.size else "no finite values")
        print(f"output {i}: [{' '.join(axes)}] shape={arr.shape} {summary}")
    return EXIT_OK


def cmd_check(args: argparse.Namespace) -> int:
    """Check every theorem in the given files and folders; exit 1 if any fails or, with
    ``--certify``, if a library lemma or accumulator fails its full certification."""

    try:
        files = source_paths(args.paths)  # each then read by the one rule of files.read_source
    except FileRefused as exc:
        raise UsageError(str(exc)) from None
    level = "full" if args.certify else "quick"
    uncertified = 0  # library lemmas and accumulators whose full certification failed: CI must fail too
    if args.certify:
        for lemma in rules.library().values():
            cert = certify.certify_lemma(lemma, level)
            uncertified += not cert.ok
            if args.json or (args.quiet and cert.ok):
                continue
            print(f"lemma {lemma.name}: {cert.how.split(':')[0] if cert.ok else 'FAILED'} ({cert.how})"
                  + (f": {cert.counterexample}" if cert.counterexample else ""))
        for box, axis in certify.representative_boxes():
            for name in accumulators_for(box, axis):
                cert = certify.certify_accumulator(box, axis, name, True, level)
                uncertified += not cert.ok
                how = (prove.prove_accumulator(certify.canonical(box, axis), axis, name, True) or cert.how) \
                    if cert.ok else cert.how
                if args.json or (args.quiet and cert.ok):
                    continue
                params = f"; {', '.join(box.params)}" if box.params else ""
                print(f"accumulator {name} for {box.op}[{' '.join(box.target)}{params}]: "
                      f"{how.split(':')[0] if cert.ok else 'FAILED'} ({how})")
    theorems, failed, broken = 0, 0, 0
    records: list[dict[str, object]] = []
    for file in files:
        try:
            results = check_file(file, level, args.strict)
        except NapkinError as exc:
            broken += 1
            records.append({"file": str(file), "ok": False, "errors": [render(d) for d in exc.diagnostics]})
            if not args.json:
                for diag in exc.diagnostics:
                    print(render(diag), file=sys.stderr)
            continue
        for result in results:
            theorems += 1
            failed += not result.ok
            records.append({"file": str(file), "theorem": result.name, "ok": result.ok, "summary": result.summary(),
                            "error": render(result.failure) if result.failure is not None else None,
                            "counterexample": result.counterexample})
            if args.json:
                continue
            if not args.quiet:
                print(f"{file}: {result.summary()}", flush=True)
            if not result.ok:
                assert result.failure is not None
                print(render(result.failure), file=sys.stderr)
                if result.counterexample:
                    print(f"  counterexample: {result.counterexample}", file=sys.stderr)
                sys.stderr.flush()
    total = (f"{theorems - failed} of {theorems} theorems checked" + (f", {failed} refused" if failed else "")
             + (f"; {broken} file(s) with errors" if broken else "")
             + (f"; {uncertified} lemma(s) or accumulator(s) FAILED certification" if uncertified else ""))
    if args.json:
        print(json.dumps({"ok": not (failed or broken or uncertified), "theorems": theorems, "refused": failed,
                          "files_with_errors": broken, "uncertified": uncertified, "results": records}, indent=2))
    else:
        print(total)
    return EXIT_INPUT if failed or broken or uncertified else EXIT_OK


def cmd_draw(args: argparse.Namespace) -> int:
    """Draw a diagram or a checked theorem as SVG/PNG, or a theorem's derivation strip."""
    from dataclasses import replace

    from napkin_cat import draw

    module = _module(args.file)
    outputs = Outputs(module.scope_files)
    decl = next((t for t in module.theorems if t.name == args.name), None)
    if decl is None:
        if args.steps:
            raise UsageError(f"--steps draws the steps of a theorem; `{args.name}` is not a theorem in {args.file}")
        subject: object = _diagram_or_usage(module, args.name)
    if args.steps:
        assert decl is not None
        lemmas = rules.lemmas_in_scope(module)
        states = []
        for k in range(len(decl.steps) + 1):  # the theorem after each prefix of its steps
            result = proof.check_theorem(module, replace(decl, steps=decl.steps[:k]), lemmas)
            if result.theorem is None:
                assert result.failure is not None
                raise NapkinError(result.failure)
            states.append(result.theorem)
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


def cmd_lower(args: argparse.Namespace) -> int:
    """Lower a checked theorem to a Pallas kernel or a streamed plain-JAX module."""
    from napkin_cat.lower import KERNEL_DTYPES, UnprovedJoinWarning, lower  # jax: only the verbs that lower

    module = _module(args.file)
    backward = [n.strip() for n in (args.backward or "").split(",") if n.strip()]
    for name in (args.theorem, *backward):
        if not any(t.name == name for t in module.theorems):
            known = ", ".join(t.name for t in module.theorems) or "none"
            raise UsageError(f"no theorem `{name}` in {args.file} (theorems: {known})")
    tiles = _pairs(args.tile, "--tile", "NAME")
    dtype = _dtype(args.dtype, KERNEL_DTYPES)
    hardware = _hardware(args.hardware) if args.hardware else None  # lower's default: by target
    outputs = Outputs(module.scope_files)
    outputs.check(args.output)
    thm = proof.theorem(args.file, args.theorem)
    backs = [proof.theorem(args.file, name) for name in backward]
    parts = [p for t in (thm, *backs) for p in t.schedule.partitions]
    unknown = [n for n in tiles if n not in {str(p.tile) for p in parts} | {p.axis for p in parts}]
    if unknown:
        known = ", ".join(sorted({f"{p.tile} (axis {p.axis})" for p in parts})) or "none"
        raise UsageError(f"--tile names {', '.join(unknown)}: not a tile or partitioned axis of "
                         f"{', '.join(f'`{n}`' for n in (args.theorem, *backward))} (tiles: {known})")
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always", UnprovedJoinWarning)
        lowered = lower(thm, target=args.target, tiles=tiles, dtype=dtype, hardware=hardware, mesh=args.mesh,
                        backward=backs, allow_tested_join=args.allow_tested_join)
    for w in warned:
        print(f"warning: {w.message}", file=sys.stderr)
    outputs.write(args.output, lowered.source)
    placed = ", ".join(f"{axis}={tile}" for axis, tile in lowered.layout.tiles.items()) or "no tiles"
    split = lowered.layout.split
    placed += f"; {split[0]} split in blocks of {split[1]}" if split is not None else ""
    placed += f"; on a mesh of {args.mesh} devices" if args.mesh is not None else ""
    print(f"wrote {args.output}: {args.target} function `{lowered.function}` ({placed})")
    return EXIT_OK


def cmd_grad(args: argparse.Namespace) -> int:
    """Write a diagram's vector-Jacobian product (napkin_cat.grad) as .ncd text."""
    module = _module(args.file)
    diagram = _diagram_or_usage(module, args.diagram)
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


def cmd_derive(args: argparse.Namespace) -> int:
    """Search checked rewrites and relabellings for the cheapest schedule; write it as a proof."""
    from napkin_cat.lower import DEFAULT_HARDWARE, KERNEL_DTYPES, lower  # jax is imported only by the verbs that lower
    from napkin_cat.search import derive  # it lowers: jax

    module = _module(args.file)
    _diagram_or_usage(module, args.diagram)
    out = Path(args.output)
    if out.suffix != ".ncd":
        raise UsageError(f"-o expects a proof file name ending in .ncd, got {args.output!r}")
    dtype = _dtype(args.dtype, KERNEL_DTYPES if args.lower else None)
    hardware = _hardware(args.hardware or (DEFAULT_HARDWARE[args.lower] if args.lower else "h100"))
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
    except HardwareError as exc:
        raise UsageError(str(exc)) from None
    settings = {"hardware": hardware.key, "dtype": dtype} | {a: str(n) for a, n in sizes.items()}
    found = derive.derive(args.file, args.diagram, cost, settings=settings, max_rewrites=args.max_rewrites,
                          budget=args.budget, seconds=args.seconds, lower=args.lower,
                          progress=lambda message: print(f"napkin derive: {message}", file=sys.stderr))
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


def _theorem_or_usage(path: str, name: str) -> Theorem:
    module = _module(path)
    if not any(t.name == name for t in module.theorems):
        known = ", ".join(t.name for t in module.theorems) or "none"
        raise UsageError(f"no theorem `{name}` in {path} (theorems: {known})")
    return proof.theorem(path, name)


def cmd_cost(args: argparse.Namespace) -> int:
    """Derive a theorem's per-level transfers, memory, FLOPs, optimum, lower bound and times."""
    dtype, hardware, sizes = _dtype(args.dtype), _hardware(args.hardware), parse_sizes(args.size)
    thm = _theorem_or_usage(args.file, args.theorem)
    try:
        c = cost.cost(thm, hardware=hardware, sizes=sizes, dtype=dtype, stages=args.stages, live=args.live)
        data = cost_report.report(c, args.theorem, args.mesh)
    except (HardwareError, cost.CostError) as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps(data, indent=2, allow_nan=False))
    else:
        print(cost_report.format_report(data), end="")
    return EXIT_OK


def cmd_pseudo(args: argparse.Namespace) -> int:
    """Print a theorem's pseudocode diagram: loops, columns, live buffers, transfers per level."""
    dtype, hardware, sizes = _dtype(args.dtype), _hardware(args.hardware), parse_sizes(args.size)
    thm = _theorem_or_usage(args.file, args.theorem)
    try:
        c = cost.cost(thm, hardware=hardware, sizes=sizes, dtype=dtype, stages=args.stages, live=args.live)
    except (HardwareError, cost.CostError) as exc:
        raise UsageError(str(exc)) from None
    print(pseudo.render(c.program, c.bytes_of), end="")
    return EXIT_OK


def cmd_lemmas(args: argparse.Namespace) -> int:
    """List the library's lemmas and accumulators with their statements."""
    found = [e for e in catalogue.entries() if args.name is None or e.name == args.name]
    if not found:
        known = ", ".join(sorted({e.name for e in catalogue.entries()}))
        raise UsageError(f"no lemma or accumulator `{args.name}` (known: {known})")
    if args.json:
        print(json.dumps([vars(e) for e in found], indent=2))
        return EXIT_OK
    for e in found:
        head = f"{e.statement}  ({e.trust})" if e.kind == "lemma" else \
            f"accumulator {e.name} for {e.applies_to} ({e.trust}):"
        body = "" if e.kind == "lemma" else "\n" + "\n".join(f"  {line}" for line in e.statement.splitlines())
        print(head + body)
    return EXIT_OK


def _fraction(text: str) -> float:
    """An argparse type: a number in (0, 1] (``--live``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0.0 < value <= 1.0:  # NaN fails both comparisons
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text}")
    return value


def _count(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum`` (and at most ``maximum``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"from {minimum} to {maximum}" if maximum is not None else f"of at least {minimum}"
            raise argparse.ArgumentTypeError(f"expected an integer {bound}, got {value}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


_DTYPE_HELP = ("number format of the arrays, as for every verb: f32, bf16, f16 (kernels are emitted in these), "
               "also tf32, f64, fp8e4m3, fp8e5m2 for the cost model; common spellings (float32, bfloat16, "
               "fp16, ...) are accepted")


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each option's default where it has a meaningful one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required or action.default in (None, False, argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


def _parser() -> argparse.ArgumentParser:
    fmt = _Help
    parser = argparse.ArgumentParser(
        prog="napkin", formatter_class=fmt,
        description="Neural circuit diagrams as text: check relabelling proofs, derive IO costs, lower to JAX kernels.",
        epilog="Exit codes: 0 success, 1 an error in the input, 2 a usage error, 74 standard output could not be "
               "written, 130 interrupted, 141 the reader closed standard output.")
    parser.add_argument("--version", action="version", version=f"napkin {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text, formatter_class=fmt)

    def sizes(p: argparse.ArgumentParser) -> None:
        p.add_argument("--size", action="append", metavar="AXIS=N",
                       help="size of a symbolic axis (repeatable; may not contradict a declared size)")

    p = command("parse", "print the canonical form of an .ncd file")
    p.add_argument("file", help="the .ncd file")
    p.set_defaults(func=cmd_parse)

    p = command("eval", "evaluate a diagram on seeded random inputs (float64)")
    p.add_argument("file", help="the .ncd file")
    p.add_argument("diagram", help="the diagram to evaluate")
    sizes(p)
    p.add_argument("--seed", type=_count(0), default=0, help="seed of the standard-normal inputs (>= 0)")
    p.set_defaults(func=cmd_eval)

    p = command("check", "check the theorems of proof files (files or folders)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="proof files, or folders searched for *.ncd")
    p.add_argument("--certify", action="store_true", help="run the full certification of lemmas and accumulators")
    p.add_argument("--strict", action="store_true",
                   help="refuse theorems resting on a lemma or accumulator only tested (not proved for every size) "
                        "or on a measured dtype claim")
    p.add_argument("--json", action="store_true", help="print one JSON object: every result and the totals")
    p.add_argument("-q", "--quiet", action="store_true", help="print only failures and the totals")
    p.set_defaults(func=cmd_check)

    p = command("lemmas", "list the library's lemmas and accumulators with their statements")
    p.add_argument("name", nargs="?", default=None, help="show only this lemma or accumulator")
    p.add_argument("--json", action="store_true", help="print a JSON list of {kind, name, applies_to, statement}")
    p.set_defaults(func=cmd_lemmas)

    p = command("draw", "draw a diagram or theorem (SVG/PNG), or a theorem's derivation strip")
    p.add_argument("file", help="the .ncd file")
    p.add_argument("name", help="a diagram, or a theorem (drawn under its schedule)")
    p.add_argument("-o", "--output", required=True, help="OUT.svg or OUT.png; a folder with --steps")
    p.add_argument("--expand", action="store_true", help="draw diagrams used as boxes inline")
    p.add_argument("--steps", action="store_true", help="one picture per proof step, and an index.html")
    p.set_defaults(func=cmd_draw)

    p = command("lower", "lower a theorem to a JAX Pallas kernel or streamed plain JAX (a .py module)")
    p.add_argument("file", help="the proof file")
    p.add_argument("theorem", help="the theorem to lower")
    p.add_argument("--target", choices=("pallas", "jax"), default="pallas", help="Pallas kernel or plain JAX")
    p.add_argument("--tile", action="append", metavar="NAME=N", help="a tile size by tile name or axis (repeatable)")
    p.add_argument("--dtype", default=DEFAULT_DTYPE, help=_DTYPE_HELP)
    p.add_argument("--hardware", help="hardware profile for default tiles (h100, h200, a100, cpu, or a .toml "
                                      "profile file; default: h100 for pallas, cpu for jax)")
    p.add_argument("--mesh", type=_count(1, MAX_MESH_DEVICES), metavar="N",
                   help=f"run the mesh partitions on N devices (jax.shard_map; 1 to {MAX_MESH_DEVICES})")
    p.add_argument("--backward", metavar="T1,T2", help="theorems of the same file whose kernels compute the "
                   "gradients: the function becomes a jax.custom_vjp (README \"Training\")")
    p.add_argument("--allow-tested-join", action="store_true", help="lower --backward kernels whose join the "
                   "prover cannot prove, on the float64 test alone (a warning; the docstring says so)")
    p.add_argument("-o", "--output", required=True, help="OUT.py")
    p.set_defaults(func=cmd_lower)

    p = command("grad", "write a diagram's vector-Jacobian product as a diagram (.ncd)")
    p.add_argument("file", help="the .ncd file")
    p.add_argument("diagram", help="the diagram to differentiate")
    p.add_argument("-o", "--output", help="OUT.ncd (default: print it)")
    p.set_defaults(func=cmd_grad)

    p = command("derive", "search for the cheapest checked schedule of a diagram; write the proof")
    p.add_argument("file", help="the .ncd file")
    p.add_argument("diagram", help="the diagram to schedule")
    p.add_argument("--hardware", help="hardware profile (h100, h200, a100, cpu, or a .toml profile file; default: "
                                      "h100, or with --lower the target's: h100 for pallas, cpu for jax)")
    p.add_argument("--dtype", default=DEFAULT_DTYPE, help=_DTYPE_HELP)
    sizes(p)
    p.add_argument("-o", "--output", required=True, help="OUT.ncd, the proof file to write")
    p.add_argument("--lower", choices=("pallas", "jax"), help="also write the kernel next to it (OUT.py)")
    p.add_argument("--budget", type=_count(1), default=2000, help="most candidates to check")
    p.add_argument("--seconds", type=_seconds, default=120.0, help="time limit of the search")
    p.add_argument("--max-rewrites", type=_count(0), default=2, help="most lemma applications in a row")
    p.set_defaults(func=cmd_derive)

    for name, func, text in (("cost", cmd_cost, "derive a theorem's IO cost, optimum tiles and lower bound"),
                             ("pseudo", cmd_pseudo, "print a theorem's pseudocode diagram (loops, live buffers)")):
        p = command(name, text)
        p.add_argument("file", help="the proof file")
        p.add_argument("theorem", help="the theorem")
        p.add_argument("--hardware", default="h100", help="hardware profile (h100, h200, a100, cpu, or a .toml "
                                                          "profile file)")
        p.add_argument("--dtype", default=DEFAULT_DTYPE, help=_DTYPE_HELP)
        sizes(p)
        p.add_argument("--stages", type=_count(1), default=1,
                       help="buffers per streamed chunk (2: double buffering; Pallas Triton's default is 3)")
        p.add_argument("--live", type=_fraction, default=1.0, metavar="F",
                       help="fraction of the (program, chunk) pairs a mask read from data leaves live, in (0, 1] "
                            "(a document mask: about 1/documents; default 1, every chunk)")
        if name == "cost":
            p.add_argument("--json", action="store_true", help="print sympy-parsable JSON")
            p.add_argument("--mesh", type=_count(1, MAX_MESH_DEVICES), metavar="N",
                           help=f"devices of the mesh level, 1 to {MAX_MESH_DEVICES} (default: the hardware "
                                "profile's devices per node)")
        p.set_defaults(func=func)
    return parser


class StreamFailed(Exception):
    """Standard output or error could not be written (a full disk, an I/O error): exit 74."""

    def __init__(self, stream: str, cause: OSError):
        super().__init__(f"cannot write standard {stream}: {cause.strerror or type(cause).__name__}")


class _Guarded:
    """A text stream whose write errors, other than a closed pipe, become ``StreamFailed``."""

    def __init__(self, stream: Any, name: str):
        self._stream, self._name = stream, name

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StreamFailed(self._name, exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StreamFailed(self._name, exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _silence(stream: Any) -> None:
    """Point ``stream``'s descriptor at /dev/null, so that Python's final flush of what it still
    buffers cannot fail again (and print a traceback) after napkin has reported the failure."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # a test's StringIO has no descriptor
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; every outcome is an exit code of the module docstring, with at most
    one line on stderr for an interruption or a failed output stream."""
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Guarded(stdout, "output"), _Guarded(stderr, "error")  # type: ignore[assignment]
    command = "napkin"
    try:
        args = _parser().parse_args(argv)
        command = f"napkin {args.command}"
        return _run(args, command)
    except KeyboardInterrupt:
        _say(stderr, f"{command}: interrupted")
        return EXIT_INTERRUPTED
    except StreamFailed as exc:
        _say(stderr, f"{command}: error: {exc}")
        _silence(stdout)
        return EXIT_IO
    except BrokenPipeError:
        # the reader closed stdout early (`napkin lemmas | head`): stop quietly, as a process
        # killed by SIGPIPE would, and keep Python's final flush from writing to the closed pipe
        _silence(stdout)
        return EXIT_PIPE
    finally:
        sys.stdout, sys.stderr = stdout, stderr


def _say(stream: Any, line: str) -> None:
    """One line on ``stream``, if it can still be written."""
    try:
        stream.write(line + "\n")
        stream.flush()
    except OSError:
        pass


def _run(args: argparse.Namespace, command: str) -> int:
    try:
        code = int(args.func(args))
    except (UsageError, OutputRefused) as exc:
        print(f"{command}: error: {exc}", file=sys.stderr)
        code = EXIT_USAGE
    except NapkinError as exc:
        for diag in exc.diagnostics:
            print(render(diag), file=sys.stderr)
        code = EXIT_INPUT
    sys.stdout.flush()  # a full disk is found here, not by Python's flush at exit
    sys.stderr.flush()
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
