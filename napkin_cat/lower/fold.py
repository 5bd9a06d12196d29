"""The fold over a scheduled diagram shared by both targets: phases become code.

Relative to the streamed axis (``loopnest`` phases, paper R4/R5) a node is emitted

- ``before`` the loop (once per program or call: it does not depend on the axis);
- in the loop body (``chunk``: woven through the stream, on the current chunk);
- as an accumulator update (``accumulate``): its operands are folded into the carry by
  the plan's ``update`` diagram where it has one (the stable states: one correction per
  chunk), else lifted into a partial state by ``lift`` and merged by ``combine``;
- ``after`` the loop, on the values the plans' ``final`` diagrams give.

Every accumulator diagram is inlined through the same op table as the diagram itself,
so no accumulator has hand-written code.  The targets decide only how a chunk of an
input is read, what the loop is, and where results go.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass

from napkin_cat.certify.accumulators import AccumulatorPlan
from napkin_cat.lower import codegen as cg
from napkin_cat.lower.jaxops import argument, emit_diagram, emit_node, last, mask_padded, started
from napkin_cat.lower.values import Scope, Value, saturate, transpose_to
from napkin_cat.schedule.layout import Layout
from napkin_cat.terms import Axes, Box

__all__ = ["Slot", "emit_after", "emit_before", "emit_combine", "emit_identity", "emit_step", "slots"]


@dataclass(frozen=True)
class Slot:
    """One component of the loop carry: a state variable of one accumulating node, or (``plan``
    None) the carried value of a scan node along a scanned axis (``Layout.carried``)."""

    node: str
    plan: AccumulatorPlan | None
    index: int
    axes: Axes

    @property
    def hint(self) -> str:
        return f"{self.node}_{'carry' if self.plan is None else self.plan.state[self.index][0]}"


def slots(lay: Layout, scope: Scope) -> list[Slot]:
    """The loop carry, in node order then state order (squeezed axes dropped)."""
    out: list[Slot] = []
    for node in lay.flat.nodes:
        plan = lay.plans.get(node.name)
        if plan is not None:
            out.extend(Slot(node.name, plan, i, scope.keep(t)) for i, (_, t) in enumerate(plan.state))
        elif node.name in lay.carried:
            out.append(Slot(node.name, None, 0, scope.keep(tuple(a for a in node.axes if a != lay.stream))))
    return out


def _emit_phase(lay: Layout, phases: Sequence[str], env: dict[str, Value], scope: Scope) -> None:
    for node in lay.flat.nodes:
        if lay.phase[node.name] in phases:
            assert isinstance(node.expr, Box)
            emit_node(node.name, node.expr, env, scope)


def emit_before(lay: Layout, env: dict[str, Value], scope: Scope) -> None:
    """Nodes that do not depend on the streamed axis (all nodes when nothing streams)."""
    _emit_phase(lay, ("before",), env, scope)


def emit_identity(lay: Layout, scope: Scope) -> ast.Tuple:
    """The initial carry: every state variable filled with its accumulator's identity, a scan's
    carried value with 0 (the first chunk's X[first] + A[first]·0 is X[first], its definition)."""
    items = []
    for slot in slots(lay, scope):
        fill = cg.const(0.0) if slot.plan is None else saturate(slot.plan.identity[slot.index])
        dims = cg.tuple_([scope.extents[a] for a in slot.axes])
        items.append(cg.call("jnp.full", dims, fill, cg.attr("jnp.float32")))
    return cg.tuple_(items)


def emit_step(lay: Layout, env: dict[str, Value], scope: Scope, carry: Sequence[Value]) -> list[ast.expr]:
    """One chunk: its woven nodes, then every accumulator's lift and combine.

    ``env`` holds the chunk's inputs and everything computed before the loop; returns
    the new carry, each state in its declared axis order so the carry's type is fixed.  A scan
    node along a scanned axis starts from its carried value, and carries its chunk's last one.
    """
    all_slots = slots(lay, scope)
    carried = {s.node: (carry[i], s.axes) for i, s in enumerate(all_slots) if s.plan is None}
    for node in lay.flat.nodes:
        phase = lay.phase[node.name]
        if phase == "chunk":
            assert isinstance(node.expr, Box)
            if node.name in carried:
                assert lay.stream is not None
                args = [argument(a, env, scope) for a in node.expr.args]
                args[-1] = started(node.expr, args, carried[node.name][0], scope)
                emit_node(node.name, node.expr, env, scope, args=args)
            else:
                emit_node(node.name, node.expr, env, scope)
    updated: list[ast.expr] = []
    inner = scope.with_block(scope.block, padded=frozenset())  # operands are masked once, up front
    for node in lay.flat.nodes:
        plan = lay.plans.get(node.name)
        if plan is None:
            if node.name in carried:
                assert lay.stream is not None
                updated.append(transpose_to(last(env[node.name], lay.stream, scope), carried[node.name][1]))
            continue
        box = node.expr
        assert isinstance(box, Box)
        operands = mask_padded(box, [argument(a, env, scope) for a in box.args], scope)
        previous = [carry[i] for i, s in enumerate(all_slots) if s.node == node.name]
        if plan.update is not None:  # one step: combine(state, lift(chunk)), certified
            merged = emit_diagram(plan.update, previous + operands, inner)
        else:
            merged = emit_diagram(plan.combine, previous + emit_diagram(plan.lift, operands, inner), inner)
        for value, (_, axes) in zip(merged, plan.state, strict=True):
            updated.append(transpose_to(value, scope.keep(axes)))
    return updated


def emit_combine(lay: Layout, scope: Scope, first: Sequence[Value], second: Sequence[Value]) -> list[ast.expr]:
    """Two carries merged by every accumulator's ``combine`` (a split's partial states, in
    order: ``first`` holds the earlier positions), each state in its declared axis order."""
    all_slots = slots(lay, scope)
    assert all(s.plan is not None for s in all_slots), "a split and a scan are two streams, which layout refuses"
    merged: list[ast.expr] = []
    for node in lay.flat.nodes:
        plan = lay.plans.get(node.name)
        if plan is None:
            continue
        mine = [i for i, s in enumerate(all_slots) if s.node == node.name]
        values = emit_diagram(plan.combine, [first[i] for i in mine] + [second[i] for i in mine], scope)
        merged += [transpose_to(v, scope.keep(axes)) for v, (_, axes) in zip(values, plan.state, strict=True)]
    return merged


def emit_after(lay: Layout, env: dict[str, Value], scope: Scope, carry: Sequence[Value]) -> None:
    """Each accumulator's final value under its node's name, then the nodes after it."""
    all_slots = slots(lay, scope)
    for node in lay.flat.nodes:
        plan = lay.plans.get(node.name)
        if plan is None:
            continue
        state = [carry[i] for i, s in enumerate(all_slots) if s.node == node.name]
        (value,) = emit_diagram(plan.final, state, scope)
        env[node.name] = Value(scope.block.bind(node.name, value.expr), value.axes)
    _emit_phase(lay, ("after",), env, scope)
