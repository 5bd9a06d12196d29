"""The error a theorem's ``dtype`` steps actually cause, measured (untrusted, like certify).

The kernel records ``dtype K, V as bf16 tol 0.01`` as a marked approximation and checks only
that the tolerance is at least the format's unit roundoff; what ``tol`` claims is checked
here.  Its meaning: on seeded standard-normal inputs, the theorem's result diagram with every
array named by its dtype steps rounded to its format (inputs when read, bindings when stored;
everything else exact) differs from the source diagram in float64 by at most
``tol · max|source output|`` in every output (entries where the source is not finite are
left out; a non-finite result where the source is finite is an infinite error).

An input that a ``onehot[v]`` operand is computed from (directly or through bindings, not
through a ``topk``/``argmax``) holds labels, drawn as integers in ``[0, |v|)`` (a standard normal hits no position, so
rounding the labels would measure 0 whatever it does to them).  Declared sizes too large
to evaluate (``MAX_MEASURED``) raise ``Unmeasurable``: no measurement vouches for the claim.

It is a measurement at one set of sizes, not a bound: every free symbolic axis gets the
same size, 64 or less so that no box's iteration space passes ``MAX_POINTS`` (an axis that
a split, join or rename ties to others gets the size that makes them agree), and rounding
errors that grow with a reduction's length are measured at that length.  The lowering's
own roundings (a bf16 operand of a dot it chose) are not part of the diagram's meaning and
are not measured here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import ml_dtypes
import numpy as np

from napkin_cat import ops
from napkin_cat.evaluate import MAX_POINTS_EVALUATED, Named, iteration_spaces, largest_space, related, visitor
from napkin_cat.kernel import Theorem
from napkin_cat.terms import Apply, Axes, Box, Diagram, Expr, Var, boxes, children, run_diagram, walk

__all__ = ["MAX_MEASURED", "MAX_POINTS", "Measurement", "Unmeasurable", "label_inputs", "measure", "rounding"]

#: the largest iteration space (points) of one box at the measured sizes
MAX_POINTS = 1 << 21
#: past this many points in one box even at the smallest sizes, the claim is not measured (``Unmeasurable``)
MAX_MEASURED = MAX_POINTS_EVALUATED


class Unmeasurable(Exception):
    """Declared sizes too large to evaluate: no measurement, so the claim is not vouched for."""


def _tf32(x: np.ndarray) -> np.ndarray:
    """Round to nearest even at TF32's 10 mantissa bits (stored as float32)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0xFFF) + ((bits >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    finite = np.isfinite(np.asarray(x, dtype=np.float32))
    return np.where(finite, rounded.view(np.float32), np.asarray(x, dtype=np.float32)).astype(np.float64)


def _via(dtype: type) -> Callable[[np.ndarray], np.ndarray]:
    def cast(x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore"):  # out of range: inf (or NaN in e4m3fn), as on a GPU
            return np.asarray(x, dtype=np.float64).astype(dtype).astype(np.float64)

    return cast


#: round float64 values to a number format a ``dtype`` step may name (kernel.DTYPE_ROUNDOFF's keys)
_ROUND: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "f64": lambda x: np.asarray(x, dtype=np.float64), "f32": _via(np.float32), "tf32": _tf32,
    "f16": _via(np.float16), "bf16": _via(ml_dtypes.bfloat16), "fp8e4m3": _via(ml_dtypes.float8_e4m3fn),
    "fp8e5m2": _via(ml_dtypes.float8_e5m2),
}


def rounding(fmt: str) -> Callable[[np.ndarray], np.ndarray]:
    """float64 -> float64 rounding to ``fmt`` (a key of kernel.DTYPE_ROUNDOFF)."""
    return _ROUND[fmt]


@dataclass(frozen=True)
class Measurement:
    """The largest error over the outputs, relative to max|source output|, and where measured."""

    error: float
    sizes: Mapping[str, int]

    def __str__(self) -> str:
        where = ", ".join(f"{a}={n}" for a, n in self.sizes.items())
        return f"measured {self.error:.3g} on seeded normal inputs{' at ' + where if where else ''}"


def _sizes(diagrams: Sequence[Diagram]) -> dict[str, int]:
    """Every axis's size: declared ones kept, free symbolic ones equal and as large as
    MAX_POINTS allows, the others tied to them by ``_tie`` (split, join, rename)."""
    declared = {a: n for d in diagrams for a, n in d.axis_sizes().items()}
    nodes = [n for d in diagrams for n in _nodes(d)]
    spaces = [space for d in diagrams for space in iteration_spaces(d)]
    ties = [(n.out[0], n.target) if n.op in ("join", "rename") else (n.target[0], n.out)
            for n in nodes if n.op in ("split", "join", "rename")]
    for size in (64, 32, 16, 8, 4, 2):
        sizes = _tie(declared, ties, size)
        if largest_space(spaces, sizes)[0] <= MAX_POINTS:
            return sizes
    points, largest = largest_space(spaces, sizes)
    if points > MAX_MEASURED:
        raise Unmeasurable(f"the declared sizes give {points:.3g} points over [{' '.join(largest)}] even with every "
                           f"symbolic axis at 2, past the {MAX_MEASURED:.3g} that a measurement evaluates")
    return sizes


def _tie(declared: Mapping[str, int | None], ties: Sequence[tuple[str, Axes]], size: int) -> dict[str, int]:
    """Sizes with ``|whole| = Π |parts|`` for each tie where the symbolic axes allow it: a
    tie with one unknown axis fixes it (the product, or the quotient where it divides);
    otherwise an unknown part of a tie whose whole is known gets the largest divisor of
    what is left of it up to ``size``, else an unknown part (else any axis) gets ``size``."""
    sizes = {a: n for a, n in declared.items() if n is not None}
    free = [a for a, n in declared.items() if n is None]
    while unknown := [a for a in free if a not in sizes]:
        open_: list[tuple[str, int]] = []  # (an unknown part, what is left of its known whole)
        for whole, parts in ties:
            known = math.prod(sizes[p] for p in parts if p in sizes)
            missing = [p for p in parts if p not in sizes]
            if whole not in sizes and not missing:
                sizes[whole] = known
                break
            if whole in sizes and missing and sizes[whole] % known == 0:
                if len(missing) == 1:
                    sizes[missing[0]] = sizes[whole] // known
                    break
                open_.append((missing[0], sizes[whole] // known))
        else:
            if open_:
                axis, left = open_[0]
                sizes[axis] = max(k for k in range(1, min(left, size) + 1) if left % k == 0)
            else:
                parts_ = {p for _, parts in ties for p in parts}
                sizes[next((a for a in unknown if a in parts_), unknown[0])] = size
    return sizes


def _nodes(diagram: Diagram) -> list[Box]:
    """Every box of a diagram, inside the diagrams it uses as boxes too."""
    found: list[Box] = []
    for expr in [let.expr for let in diagram.body] + list(diagram.outputs):
        for node in walk(expr):
            if isinstance(node, Apply):
                found += _nodes(node.diagram)
            elif isinstance(node, Box):
                found.append(node)
    return found


def _inputs(diagram: Diagram, sizes: Mapping[str, int], rng: np.random.Generator) -> list[Named]:
    """Seeded standard-normal inputs; an input that a ``onehot[v]`` operand is computed from
    (through bindings too) holds labels in [0, |v|); an input a relation gives, its value (``related``)."""
    labels = label_inputs(diagram)
    drawn = [rng.integers(0, sizes[labels[p.name]], [sizes[a] for a in p.axes]).astype(float)
             if p.name in labels else rng.standard_normal([sizes[a] for a in p.axes]) for p in diagram.inputs]
    return [Named(p.axes, x) for p, x in zip(diagram.inputs, related(diagram, drawn, sizes), strict=True)]


def _read(expr: Expr) -> list[Var]:
    """The names ``expr`` reads for its value, not through a ``topk``/``argmax``, whose result
    is a position whatever its operand holds (a router's logits are no labels)."""
    if isinstance(expr, Var):
        return [expr]
    if isinstance(expr, Box) and ops.OPS[expr.op].kind == "topk":
        return []
    return [v for kid in children(expr) for v in _read(kid)]


#: the operands of each box that hold positions: a onehot's, a gather's
_READS = {"onehot": slice(None), "gather": slice(1, 2)}


def label_inputs(diagram: Diagram, reads: tuple[str, ...] = ("onehot",)) -> dict[str, str]:
    """The inputs a ``onehot[v]`` operand is computed from (directly or through bindings; not
    through a ``topk`` or ``argmax``, which make positions of anything), each with its ``v``:
    they hold positions along ``v``, and a standard-normal draw would hit none (the first
    onehot found decides the axis); with ``reads`` ("gather",), those a ``gather[v]``'s positions are
    computed from.  ``diagram`` is unfolded: no calls."""
    defs = diagram.bindings()
    labels: dict[str, str] = {}
    todo = [(arg, node.target[0]) for _, node in boxes(diagram)
            if isinstance(node, Box) and node.op in reads for arg in node.args[_READS[node.op]]]  # unfolded: no calls
    seen: set[str] = set()
    while todo:
        expr, axis = todo.pop()
        for var in (n for n in _read(expr) if n.name not in seen):
            seen.add(var.name)
            if var.name in defs:
                todo.append((defs[var.name], axis))
            else:
                labels.setdefault(var.name, axis)
    return labels


def _run(diagram: Diagram, inputs: list[Named], sizes: dict[str, int],
         rounded: Mapping[str, Callable[[np.ndarray], np.ndarray]]) -> tuple[Named, ...]:
    exact = visitor(sizes)

    def visit(node: Expr, kids: tuple[Named, ...], env: Mapping[str, Named]) -> Named | tuple[Named, ...]:
        value = exact(node, kids, env)
        if isinstance(node, Var) and node.name in rounded:
            assert isinstance(value, Named)
            return Named(value.axes, rounded[node.name](value.data))
        return value

    outs = run_diagram(diagram, inputs, visit)
    return tuple(Named(t, out.to(t)) for out, t in zip(outs, diagram.out_types, strict=True))


def measure(thm: Theorem, seed: int = 0) -> Measurement:
    """The error of ``thm.result`` with its quantised arrays rounded, against ``thm.source``;
    raises ``Unmeasurable`` where the declared sizes are too large to evaluate."""
    sizes = _sizes((thm.source, thm.result))
    inputs = _inputs(thm.result, sizes, np.random.default_rng(seed))
    rounded = {name: rounding(q.dtype) for q in thm.approximations for name in q.names}
    want = _run(thm.source, inputs, sizes, {})
    got = _run(thm.result, inputs, sizes, rounded)
    worst = 0.0
    for w, g in zip(want, got, strict=True):
        finite = np.isfinite(w.data)
        if not finite.any():
            continue
        scale = float(np.max(np.abs(w.data[finite]))) or 1.0
        with np.errstate(invalid="ignore"):
            diff = np.abs(g.to(w.axes)[finite] - w.data[finite])
        worst = max(worst, math.inf if not np.all(np.isfinite(diff)) else float(np.max(diff)) / scale)
    symbolic = {a: n for a, n in sizes.items() if thm.result.axis_sizes().get(a) is None}
    return Measurement(worst, symbolic)

