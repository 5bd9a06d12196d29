"""The `napkin` command line: the only module that prints or exits.

Exit codes: 0 success, 1 an error in the input (diagnostics printed), 2 a usage error.
Each subcommand is one ``cmd_*`` function registered in ``_parser``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from napkin_cat.diagnostics import NapkinError, render
from napkin_cat.elaborate import load
from napkin_cat.printer import print_module
from napkin_cat.terms import Module

__all__ = ["main"]


class UsageError(Exception):
    """A command-line mistake (exit code 2)."""


def parse_sizes(items: Sequence[str] | None) -> dict[str, int]:
    """``AXIS=N`` pairs from ``--size``; a malformed pair is a usage error."""
    sizes: dict[str, int] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name or not value.isdigit() or int(value) <= 0:
            raise UsageError(f"--size expects AXIS=N with N a positive integer, got {item!r}")
        sizes[name] = int(value)
    return sizes


def _module(path: str) -> Module:
    if not Path(path).is_file():
        raise UsageError(f"no such file: {path}")
    return load(path)


def _diagram_or_usage(module: Module, name: str) -> object:
    try:
        return module.diagram(name)
    except KeyError:
        known = ", ".join(d.name for d in module.scope_diagrams) or "none"
        raise UsageError(f"no diagram `{name}` in {module.path} (diagrams: {known})") from None


def cmd_parse(args: argparse.Namespace) -> int:
    print(print_module(_module(args.file)), end="")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from napkin_cat.evaluate import bind_sizes

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
    bind_sizes(diagram, shapes, sizes)  # type: ignore[arg-type]
    arrays = [rng.standard_normal(s) for s in shapes]
    result = diagram.evaluate(*arrays, sizes=sizes)  # type: ignore[attr-defined]
    outs = result if isinstance(result, tuple) else (result,)
    for i, (out, axes) in enumerate(zip(outs, diagram.out_types, strict=True)):  # type: ignore[attr-defined]
        arr = np.asarray(out)
        finite = arr[np.isfinite(arr)]
        summary = (f"mean={finite.mean():.6g} std={finite.std():.6g} min={finite.min():.6g} max={finite.max():.6g}"
                   if finite.size else "no finite values")
        print(f"output {i}: [{' '.join(axes)}] shape={arr.shape} {summary}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Check every theorem in the given files and folders; exit 1 if any fails or, with
    ``--certify``, if a library lemma or accumulator fails its full certification."""
    from napkin_cat.proof import check_file

    files: list[Path] = []
    for item in args.paths:
        path = Path(item)
        if path.is_dir():
            files.extend(sorted(path.rglob("*.ncd")))
        elif path.is_file():
            files.append(path)
        else:
            raise UsageError(f"no such file or folder: {item}")
    level = "full" if args.certify else "quick"
    uncertified = 0  # library lemmas and accumulators whose full certification failed: CI must fail too
    if args.certify:
        from napkin_cat import certify, rules

        for lemma in rules.library().values():
            cert = certify.certify_lemma(lemma, level)
            uncertified += not cert.ok
            print(f"lemma {lemma.name}: {'certified' if cert.ok else 'FAILED'} ({cert.how})"
                  + (f": {cert.counterexample}" if cert.counterexample else ""))
        for box, axis in certify.representative_boxes():
            from napkin_cat.accumulators import accumulators_for

            for name in accumulators_for(box, axis):
                cert = certify.certify_accumulator(box, axis, name, True, level)
                uncertified += not cert.ok
                params = f"; {', '.join(box.params)}" if box.params else ""
                print(f"accumulator {name} for {box.op}[{' '.join(box.target)}{params}]: "
                      f"{'certified' if cert.ok else 'FAILED'} ({cert.how})")
    theorems, failed, broken = 0, 0, 0
    for file in files:
        try:
            results = check_file(file, level)
        except NapkinError as exc:
            broken += 1
            for diag in exc.diagnostics:
                print(render(diag), file=sys.stderr)
            continue
        for result in results:
            theorems += 1
            print(f"{file}: {result.summary()}", flush=True)
            if not result.ok:
                failed += 1
                assert result.failure is not None
                print(render(result.failure), file=sys.stderr)
                if result.counterexample:
                    print(f"  counterexample: {result.counterexample}", file=sys.stderr)
                sys.stderr.flush()
    print(f"{theorems - failed} of {theorems} theorems checked" + (f", {failed} refused" if failed else "")
          + (f"; {broken} file(s) with errors" if broken else "")
          + (f"; {uncertified} lemma(s) or accumulator(s) FAILED certification" if uncertified else ""))
    return 1 if failed or broken or uncertified else 0


def cmd_draw(args: argparse.Namespace) -> int:
    """Draw a diagram or a checked theorem as SVG/PNG, or a theorem's derivation strip."""
    from dataclasses import replace

    from napkin_cat import draw, proof, rules

    module = _module(args.file)
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
        written = draw.draw_steps(states, args.output, expand=args.expand)
        print(f"wrote {len(written) - 1} step pictures and {written[-1]}")
        return 0
    if Path(args.output).suffix not in (".svg", ".png"):
        raise UsageError(f"-o must name a .svg or .png file (or a folder with --steps), got {args.output}")
    if decl is not None:
        subject = proof.theorem(args.file, args.name)
    draw.save(subject, args.output, expand=args.expand)  # type: ignore[arg-type]
    print(f"wrote {args.output}")
    return 0


def cmd_lower(args: argparse.Namespace) -> int:
    """Lower a checked theorem to a Pallas kernel or a streamed plain-JAX module."""
    from napkin_cat import proof
    from napkin_cat.lower import lower

    module = _module(args.file)
    if not any(t.name == args.theorem for t in module.theorems):
        known = ", ".join(t.name for t in module.theorems) or "none"
        raise UsageError(f"no theorem `{args.theorem}` in {args.file} (theorems: {known})")
    tiles = {}
    for item in args.tile or ():
        name, sep, value = item.partition("=")
        if not sep or not name or not value.isdigit() or int(value) <= 0:
            raise UsageError(f"--tile expects NAME=N with N a positive integer, got {item!r}")
        tiles[name] = int(value)
    thm = proof.theorem(args.file, args.theorem)
    parts = thm.schedule.partitions
    unknown = [n for n in tiles if n not in {str(p.tile) for p in parts} | {p.axis for p in parts}]
    if unknown:
        known = ", ".join(sorted({f"{p.tile} (axis {p.axis})" for p in parts})) or "none"
        raise UsageError(f"--tile names {', '.join(unknown)}: not a tile or partitioned axis of `{args.theorem}` "
                         f"(tiles: {known})")
    lowered = lower(thm, target=args.target, tiles=tiles, dtype=args.dtype, hardware=args.hardware)
    Path(args.output).write_text(lowered.source, encoding="utf-8")
    placed = ", ".join(f"{axis}={tile}" for axis, tile in lowered.layout.tiles.items()) or "no tiles"
    print(f"wrote {args.output}: {args.target} function `{args.theorem}` ({placed})")
    return 0


def cmd_grad(args: argparse.Namespace) -> int:
    """Write a diagram's vector-Jacobian product (napkin_cat.grad) as .ncd text."""
    from napkin_cat.grad import vjp_module

    diagram = _diagram_or_usage(_module(args.file), args.diagram)
    text = print_module(vjp_module(diagram))  # type: ignore[arg-type]
    if args.output is None:
        print(text, end="")
    else:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"wrote {args.output}: diagram `{args.diagram}_vjp`")
    return 0


def cmd_derive(args: argparse.Namespace) -> int:
    """Search checked rewrites and relabellings for the cheapest schedule; write it as a proof."""
    from napkin_cat import derive
    from napkin_cat.hardware import HardwareError

    module = _module(args.file)
    _diagram_or_usage(module, args.diagram)
    out = Path(args.output)
    if out.suffix != ".ncd":
        raise UsageError(f"-o expects a proof file name ending in .ncd, got {args.output!r}")
    if not out.parent.is_dir():
        raise UsageError(f"no such folder for -o: {out.parent}")
    if out.resolve() == Path(args.file).resolve():
        raise UsageError("-o names the source file itself; write the proof to another file")
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
        cost = derive.model_cost(args.hardware, args.dtype, sizes, target=args.lower)
    except HardwareError as exc:
        raise UsageError(str(exc)) from None
    settings = {"hardware": args.hardware, "dtype": args.dtype} | {a: str(n) for a, n in sizes.items()}
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
    checked = derive.write(found, out)
    if checked.theorem is None:
        assert checked.failure is not None
        print(render(checked.failure), file=sys.stderr)
        return 1
    print(f"wrote {out}: {checked.summary()}")
    if args.lower:
        from napkin_cat.lower import lower

        tiles = dict(best.cost.tiles) if best.cost is not None else {}
        lowered = lower(checked.theorem, target=args.lower, tiles=tiles, dtype=args.dtype, hardware=args.hardware)
        kernel_path = out.with_suffix(".py")
        kernel_path.write_text(lowered.source, encoding="utf-8")
        print(f"wrote {kernel_path}: {args.lower} function `{found.theorem_name}`")
    return 0


def _theorem_or_usage(path: str, name: str) -> object:
    from napkin_cat import proof

    module = _module(path)
    if not any(t.name == name for t in module.theorems):
        known = ", ".join(t.name for t in module.theorems) or "none"
        raise UsageError(f"no theorem `{name}` in {path} (theorems: {known})")
    return proof.theorem(path, name)


def cmd_cost(args: argparse.Namespace) -> int:
    """Derive a theorem's per-level transfers, memory, FLOPs, optimum, lower bound and times."""
    import json

    from napkin_cat import cost, cost_report
    from napkin_cat.hardware import HardwareError

    thm = _theorem_or_usage(args.file, args.theorem)
    try:
        c = cost.cost(thm, hardware=args.hardware, sizes=parse_sizes(args.size), dtype=args.dtype,
                      stages=args.stages)
        data = cost_report.report(c, args.theorem)
    except (HardwareError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(data, indent=2) if args.json else cost_report.format_report(data), end="\n" if args.json else "")
    return 0


def cmd_pseudo(args: argparse.Namespace) -> int:
    """Print a theorem's pseudocode diagram: loops, columns, live buffers, transfers per level."""
    from napkin_cat import cost, pseudo
    from napkin_cat.hardware import HardwareError

    thm = _theorem_or_usage(args.file, args.theorem)
    try:
        c = cost.cost(thm, hardware=args.hardware, sizes=parse_sizes(args.size), dtype=args.dtype,
                      stages=args.stages)
    except (HardwareError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    print(pseudo.render(c.program, c.bytes_of), end="")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="napkin",
        description="Neural circuit diagrams as text: check relabelling proofs, derive IO costs, lower to JAX kernels.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("parse", help="print the canonical form of an .ncd file")
    p.add_argument("file")
    p.set_defaults(func=cmd_parse)

    p = sub.add_parser("eval", help="evaluate a diagram on seeded random inputs (float64)")
    p.add_argument("file")
    p.add_argument("diagram")
    p.add_argument("--size", action="append", metavar="AXIS=N", help="size of a symbolic axis (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("check", help="check the theorems of proof files (files or folders)")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--certify", action="store_true", help="run the full certification of lemmas and accumulators")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("draw", help="draw a diagram or theorem (SVG/PNG), or a theorem's derivation strip")
    p.add_argument("file")
    p.add_argument("name", help="a diagram, or a theorem (drawn under its schedule)")
    p.add_argument("-o", "--output", required=True, help="OUT.svg or OUT.png; a folder with --steps")
    p.add_argument("--expand", action="store_true", help="draw diagrams used as boxes inline")
    p.add_argument("--steps", action="store_true", help="one picture per proof step, and an index.html")
    p.set_defaults(func=cmd_draw)

    p = sub.add_parser("lower", help="lower a theorem to a JAX Pallas kernel or streamed plain JAX (a .py module)")
    p.add_argument("file")
    p.add_argument("theorem")
    p.add_argument("--target", choices=("pallas", "jax"), default="pallas")
    p.add_argument("--tile", action="append", metavar="NAME=N", help="a tile size by tile name or axis (repeatable)")
    p.add_argument("--dtype", default="float32", help="input/output dtype: float32, bfloat16 or float16")
    p.add_argument("--hardware", default=None, help="hardware profile for default tiles (e.g. h100)")
    p.add_argument("-o", "--output", required=True, help="OUT.py")
    p.set_defaults(func=cmd_lower)

    p = sub.add_parser("grad", help="write a diagram's vector-Jacobian product as a diagram (.ncd)")
    p.add_argument("file")
    p.add_argument("diagram")
    p.add_argument("-o", "--output", help="OUT.ncd (default: print it)")
    p.set_defaults(func=cmd_grad)

    p = sub.add_parser("derive", help="search for the cheapest checked schedule of a diagram; write the proof")
    p.add_argument("file")
    p.add_argument("diagram")
    p.add_argument("--hardware", default="h100", help="hardware profile (h100, h200, a100)")
    p.add_argument("--dtype", default="bf16", help="number format of the arrays (bf16, f16, f32, ...)")
    p.add_argument("--size", action="append", metavar="AXIS=N", help="size of a symbolic axis (repeatable)")
    p.add_argument("-o", "--output", required=True, help="OUT.ncd, the proof file to write")
    p.add_argument("--lower", choices=("pallas", "jax"), help="also write the kernel next to it (OUT.py)")
    p.add_argument("--budget", type=int, default=2000, help="most candidates to check (default 2000)")
    p.add_argument("--seconds", type=float, default=120.0, help="time limit of the search (default 120)")
    p.add_argument("--max-rewrites", type=int, default=2, help="most lemma applications in a row (default 2)")
    p.set_defaults(func=cmd_derive)

    for name, func, text in (("cost", cmd_cost, "derive a theorem's IO cost, optimum tiles and lower bound"),
                             ("pseudo", cmd_pseudo, "print a theorem's pseudocode diagram (loops, live buffers)")):
        p = sub.add_parser(name, help=text)
        p.add_argument("file")
        p.add_argument("theorem")
        p.add_argument("--hardware", default="h100", help="hardware profile (h100, h200, a100)")
        p.add_argument("--dtype", default="bf16", help="number format of the arrays (bf16, f16, f32, fp8e4m3, ...)")
        p.add_argument("--size", action="append", metavar="AXIS=N", help="size of a symbolic axis (repeatable)")
        p.add_argument("--stages", type=int, default=1,
                       help="buffers per streamed chunk (2: double buffering; Pallas Triton's default is 3)")
        if name == "cost":
            p.add_argument("--json", action="store_true", help="print sympy-parsable JSON")
        p.set_defaults(func=func)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except UsageError as exc:
        print(f"napkin {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except NapkinError as exc:
        for diag in exc.diagnostics:
            print(render(diag), file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
