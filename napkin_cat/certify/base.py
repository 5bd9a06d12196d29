"""What the certification front (``napkin_cat.certify``) and its tiers (``certify.tiers``)
share, none of it needing sympy: the certificate, the levels, the canonical box of an
accumulator question, a lemma's sides as diagrams, the representative boxes."""

from __future__ import annotations

from dataclasses import dataclass

from napkin_cat.ops import typed_box
from napkin_cat.terms import Box, Diagram, Expr, LemmaDecl, Var

__all__ = ["LEVELS", "Certificate", "canonical", "lemma_side", "representative_boxes"]

#: (symbolic size bound, random float64 cases) per level
LEVELS: dict[str, tuple[int, int]] = {"quick": (2, 12), "full": (3, 60)}


@dataclass(frozen=True)
class Certificate:
    """The outcome of certifying one lemma or accumulator: ``ok``, how, or a counterexample."""

    ok: bool
    how: str
    counterexample: str | None = None


def lemma_side(lemma: LemmaDecl, side: Expr) -> Diagram:
    """One side of ``lemma`` as a diagram on the lemma's parameters, for the evaluator."""
    return Diagram(lemma.name, lemma.params, (), (side,), (side.axes,), lemma.axes)


def canonical(box: Box, axis: str) -> Box:
    """The box on typed variables, woven axes dropped: all that the laws depend on.

    Woven axes only broadcast every term of lift, combine and final, so the laws hold
    with them iff they hold without them.
    """
    keep = set(box.target) | {axis}
    args = tuple(Var(f"X{i}", tuple(a for a in x.axes if a in keep)) for i, x in enumerate(box.args))
    return typed_box(box.op, args, box.target, box.out, box.params)


def representative_boxes() -> list[tuple[Box, str]]:
    """One canonical box per accumulator family, for ``napkin check --certify``."""
    s, v = Var("X0", ("q", "x")), Var("X1", ("x", "d"))
    boxes: list[tuple[Box, str]] = []
    for op in ("sum", "mean", "max", "min", "prod", "logsumexp"):
        boxes.append((Box(op, (s,), ("q",), ("x",)), "x"))
    boxes.append((Box("contract", (s, v), ("q", "d"), ("x",)), "x"))
    for params in (("exp", "exp", "id"), ("exp", "exp", "sqrt"), ("id", "square", "sqrt"), ("id", "square", "rms")):
        boxes.append((Box("ncontract", (s, v), ("q", "d"), ("x",), (), params), "x"))
    return boxes
