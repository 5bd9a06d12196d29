"""Known IO lower bounds, recognised from the structure of a diagram (never from its name).

- **attention-like**: a normalised contraction ``ncontract[x](S, V)``, or a contraction over x
  of a normalisation over x (``contract[x](softmax[x](S), V)``), whose scores S come (through
  elementwise boxes) from a two-operand contraction over d.  Bound N_q·N_x·d_qk·d_v / M per
  batch element: FlashAttention (arXiv 2205.14135) Theorem 2 and Proposition 3, Θ(N²d²/M) for
  d ≤ M ≤ Nd; Saha & Ye (arXiv 2402.07443) make it tight for M ≥ d².  The constant is taken as 1.
- **matmul-like**: a two-operand contraction C[m n] = Σ_k A[m k] B[k n] (batch axes allowed)
  that is not part of an attention pattern.  Bound 2·m·n·k / √M: Hong & Kung (1981) up to a
  constant, with the tight leading constant of Smith et al. (arXiv 1702.02017).
- **compulsory**: every input read and every output written once, the bound as M → ∞.

A box's bound is a bound on the diagram only where the box's assumptions hold in the diagram:
its operands (Q, K, V for attention; A, B for matmul) are diagram inputs, each value passed
through elementwise boxes that keep every axis, so every operand value costs a load; and its
result reaches a diagram output the same way, so every result value is saved or kept.  An
operand computed from smaller inputs (scores from Q K^T contracted again, a broadcast
difference Q - K) or a result consumed on chip (a fused MLP's hidden layer) can move fewer
values than the box alone would; a ``where`` mask on the way means the masked values are
never needed (a sliding window reads O(window) keys per query).  Such boxes give no bound.
A diagram's bound is the largest of its boxes' (and never below the compulsory traffic).
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
from sympy import Expr

from napkin_cat import ops
from napkin_cat.schedule.loopnest import Flat, Node
from napkin_cat.terms import Box, Var

__all__ = ["Bound", "diagram_bound", "lower_bounds"]



@dataclass(frozen=True)
class Bound:
    """A lower bound on the transfers to a level of capacity M (values)."""

    kind: str  # attention | matmul | compulsory
    node: str
    expr: Expr
    source: str


def _size(sizes: dict[str, Expr], axes: tuple[str, ...]) -> Expr:
    return sympy.Mul(*(sizes[a] for a in axes))


def _producer(flat: Flat, expr: object) -> Node | None:
    if isinstance(expr, Var):
        try:
            return flat.node(expr.name)
        except KeyError:
            return None
    return None


def _dense(node: Node) -> bool:
    """An elementwise box whose every output value needs the value of an argument carrying
    all its axes at the same position (a ``where`` mask does not: masked values are never read)."""
    return isinstance(node.expr, Box) and ops.OPS[node.expr.op].kind in ("unary", "binary")


def _from_inputs(flat: Flat, operand: Var) -> bool:
    """Every value of ``operand`` is a value of a diagram input passed through dense
    elementwise boxes (so each one costs a load)."""
    inputs = {name for name, _ in flat.inputs}
    axes = set(operand.axes)
    pending = [operand.name]
    while pending:
        name = pending.pop()
        if name in inputs:
            return True
        node = flat.node(name)
        if _dense(node):
            pending += [a.name for a in node.expr.args if isinstance(a, Var) and axes <= set(a.axes)]  # type: ignore[union-attr]
    return False


def _to_output(flat: Flat, name: str) -> bool:
    """Every value of the array ``name`` reaches a diagram output through dense elementwise
    boxes (so each one is saved, or kept live until its image is)."""
    pending, seen = [name], set()
    while pending:
        current = pending.pop()
        if current in flat.outputs:
            return True
        seen.add(current)
        pending += [n.name for n in flat.nodes if current in n.reads and _dense(n) and n.name not in seen]
    return False


def _through_elementwise(flat: Flat, node: Node | None, axes: set[str]) -> Node | None:
    """Follow dense elementwise boxes back to the box that produced the array carrying ``axes``."""
    while node is not None and _dense(node):
        carriers = [a for a in node.expr.args if isinstance(a, Var) and axes <= set(a.axes)]  # type: ignore[union-attr]
        node = _producer(flat, carriers[0]) if carriers else None
    return node


def _attention(flat: Flat, node: Node, sizes: dict[str, Expr], m: Expr) -> tuple[Bound, set[str]] | None:
    box = node.expr
    assert isinstance(box, Box)
    if len(box.args) != 2 or not all(isinstance(a, Var) for a in box.args):
        return None
    scores, values = box.args
    target = set(box.target)
    covered = {node.name}
    if ops.OPS[box.op].kind == "contract":
        norm = _through_elementwise(flat, _producer(flat, scores), target)
        if norm is None or ops.OPS[norm.expr.op].kind != "normalise" or set(norm.expr.target) != target:  # type: ignore[union-attr]
            return None
        covered.add(norm.name)
        scores = norm.expr.args[0]  # type: ignore[union-attr]
    qk = _through_elementwise(flat, _producer(flat, scores), target)
    if qk is None or not isinstance(qk.expr, Box) or qk.expr.op != "contract" or len(qk.expr.args) != 2:
        return None
    covered.add(qk.name)
    operands = (*qk.expr.args, values)
    if not (all(isinstance(a, Var) and _from_inputs(flat, a) for a in operands) and _to_output(flat, node.name)):
        return None
    batch = tuple(a for a in scores.axes if a in values.axes and a not in target)
    rows = tuple(a for a in scores.axes if a not in target and a not in batch)
    dv = tuple(a for a in values.axes if a not in target and a not in batch)
    expr = _size(sizes, batch + rows + box.target + qk.expr.target + dv) / m
    return Bound("attention", node.name, expr,
                 "FlashAttention Thm 2 / Prop 3 (Θ(N²d²/M), d ≤ M ≤ Nd); Saha–Ye: tight for M ≥ d²"), covered


def _matmul(flat: Flat, node: Node, sizes: dict[str, Expr], m: Expr) -> Bound | None:
    box = node.expr
    if not isinstance(box, Box) or ops.OPS[box.op].kind not in ("contract", "ncontract") or len(box.args) != 2:
        return None
    if not (all(isinstance(a, Var) and _from_inputs(flat, a) for a in box.args) and _to_output(flat, node.name)):
        return None
    first, second = (a.axes for a in box.args)
    k = box.target
    batch = tuple(a for a in first if a in second and a not in k)
    rows = tuple(a for a in first if a not in second and a not in k)
    cols = tuple(a for a in second if a not in first and a not in k)
    if not (rows and cols and k):
        return None
    expr = 2 * _size(sizes, batch + rows + cols + k) / sympy.sqrt(m)
    return Bound("matmul", node.name, expr, "Hong–Kung (1981); tight constant 2mnk/√M: Smith et al. (1702.02017)")


def lower_bounds(flat: Flat, sizes: dict[str, Expr], m: Expr, skip: frozenset[str] = frozenset()) -> list[Bound]:
    """Every recognised bound of a flattened diagram, plus the compulsory traffic."""
    found: list[Bound] = []
    covered: set[str] = set(skip)
    for node in flat.nodes:
        if isinstance(node.expr, Box) and ops.OPS[node.expr.op].kind in ("ncontract", "contract"):
            hit = _attention(flat, node, sizes, m)
            if hit is not None:
                found.append(hit[0])
                covered |= hit[1]
    for node in flat.nodes:
        if node.name not in covered:
            bound = _matmul(flat, node, sizes, m)
            if bound is not None:
                found.append(bound)
    compulsory = sympy.Add(*(_size(sizes, axes) for _, axes in flat.inputs)) + \
        sympy.Add(*(_size(sizes, flat.type_of(o)) for o in flat.outputs))
    found.append(Bound("compulsory", "", compulsory, "every input read and every output written once"))
    return found


def diagram_bound(bounds: list[Bound], at: dict[sympy.Symbol, Expr] | None = None) -> Bound:
    """The structural bound of largest leading order (compulsory when none is recognised).

    ``bounds`` is ``lower_bounds``' list (compulsory last).  With ``at`` (a substitution that
    makes every bound a number: the sizes given and M at a capacity) the compulsory traffic is
    returned instead where it is larger there (decoding attention: one query row reads every
    key once, more than N_q·N_x·d²/M), so the bound is never below the compulsory traffic."""
    compulsory = bounds[-1]
    structural = [b for b in bounds if b.kind != "compulsory"]
    if not structural:
        return compulsory
    if len({b.expr for b in structural}) == 1:
        best = structural[0]
    else:
        best = Bound("max", ",".join(b.node for b in structural), sympy.Max(*(b.expr for b in structural)),
                     "the largest of: " + "; ".join(f"{b.kind} at {b.node}" for b in structural))
    if at is not None:
        value, floor = best.expr.subs(at), compulsory.expr.subs(at)
        if value.is_number and floor.is_number and value < floor:
            return Bound("compulsory", "", compulsory.expr,
                         f"{compulsory.source}; larger here than the {best.kind} bound, {sympy.N(value, 6)}")
    return best
