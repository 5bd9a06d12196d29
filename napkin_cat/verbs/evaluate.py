"""``napkin eval``: a diagram on seeded random inputs (standard normal; small sorted integers for an
``int`` input; an input a relation gives, its expression of the others: ``evaluate.related``), in float64."""

from __future__ import annotations

import argparse

import numpy as np

from napkin_cat.evaluate import bind_sizes, refuse_too_large, related, run, sample_integers
from napkin_cat.verbs import EXIT_OK, UsageError, parse_sizes
from napkin_cat.verbs.common import diagram_or_usage, module_or_usage

__all__ = ["cmd_eval"]


def cmd_eval(args: argparse.Namespace) -> int:
    module = module_or_usage(args.file)
    diagram = diagram_or_usage(module, args.diagram)
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
    # an `int` input (segment ids, lengths, page numbers) gets small sorted integers, as `check` draws them
    arrays = [sample_integers(rng, s) if p.integer else rng.standard_normal(s)
              for p, s in zip(diagram.inputs, shapes, strict=True)]  # type: ignore[attr-defined]
    arrays = related(diagram, arrays, {**sizes, **{a: n for a, n in known.items() if n is not None}})  # type: ignore[arg-type]
    result = run(diagram, *arrays, sizes=sizes)  # type: ignore[arg-type]
    outs = result if isinstance(result, tuple) else (result,)
    for i, (out, axes) in enumerate(zip(outs, diagram.out_types, strict=True)):  # type: ignore[attr-defined]
        arr = np.asarray(out)
        finite = arr[np.isfinite(arr)]
        summary = (f"mean={finite.mean():.6g} std={finite.std():.6g} min={finite.min():.6g} max={finite.max():.6g}"
                   if finite.size else "no finite values")
        print(f"output {i}: [{' '.join(axes)}] shape={arr.shape} {summary}")
    return EXIT_OK
