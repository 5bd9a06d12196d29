"""Per-level program -> pseudocode text (``napkin pseudo``): for every view, slowest level
first, the loop nest, one line per column (its load, box, save, init or final) with the buffers
live at that level, then the view's memory and transfers (the Napkin paper's pseudocode
diagrams, §5.1).

``render`` reads a ``pseudo_program.Program`` (built by ``pseudo_build.program``) and changes
nothing; its output is deterministic.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import sympy
from sympy import Expr

from napkin_cat.printer import print_expr
from napkin_cat.schedule.loopnest import Loop
from napkin_cat.schedule.program import Buffer, Inst, Program, Step, View
from napkin_cat.terms import Apply, Box, Const, Size, Var, fold
from napkin_cat.terms import Expr as TExpr

__all__ = ["render"]


def render(prog: Program, bytes_of: Mapping[str, int] | None = None) -> str:
    """The pseudocode diagram: per level, the loop nest, each column's live buffers, transfers."""
    lines: list[str] = []
    loops = prog.nest.loops
    for view in prog.views:
        lines.append(f"== level {view.level} (transfers {view.parent} <-> {view.level}; "
                     f"boxes run at {prog.compute_level}) ==")
        opened: list[Inst] = []
        for step in view.steps:
            while opened and opened[-1] not in step.path:
                opened.pop()
            for inst in step.path:
                if inst not in opened:
                    line = _loop_line(loops[inst[0]], prog.trips[inst[0]], prog.tiles[inst[0]])
                    for index, runs, full in prog.masked:  # a mask cuts this stream short in the kernel
                        if index == inst[0]:
                            line += f"  [masked: {runs} of the {full} (group, chunk) pairs run]"
                    lines.append("  " * len(opened) + line)
                    opened.append(inst)
            indent = "  " * len(step.path)
            live = ", ".join(_buffer_label(b) for b in view.live(step.index))
            what = _step_line(prog, view, step)
            lines.append(f"{indent}col {step.index:<3} {what:<44} | live@{view.level}: {live or '-'}")
        groups = sympy.Mul(*(prog.trips[i] for i in view.loops if loops[i].kind == "group"))
        total = view.transfers()
        lines.append(f"  memory M_{view.level} = {view.memory()}   (values, largest live set over the columns)")
        lines.append(f"  transfers H_{view.level} = {sympy.simplify(total)}   "
                     f"(per group: {sympy.simplify(total / groups)}; groups: {groups})")
        if bytes_of is not None:
            lines.append(f"  transfers in bytes = {sympy.simplify(view.transfers(bytes_of))}")
    return "\n".join(lines) + "\n"


def _buffer_label(b: Buffer) -> str:
    copies = f"x{b.copies}" if b.copies > 1 else ""
    return f"{b.name}[{' '.join(str(e) for _, e in b.shape)}]{copies}"


def _arg(prog: Program, expr: TExpr) -> str:
    """An operand: a constant's value, ``|axis|`` for a size, a folded node (one that reads no
    input, e.g. ``rsqrt(d)`` or ``index[q x](q - x)``: it has no column) as its expression, else
    the array's name."""
    if isinstance(expr, Const):
        return f"{expr.value:g}"
    if isinstance(expr, Size):
        return f"|{expr.axis}|"
    if isinstance(expr, Var) and expr.name not in prog.constants:
        return expr.name
    return print_expr(_inline_folded(prog, expr))


def _inline_folded(prog: Program, expr: TExpr) -> TExpr:
    """``expr`` with every folded node it reads replaced by that node's expression."""
    def visit(node: TExpr, kids: tuple[TExpr, ...]) -> TExpr:
        if isinstance(node, Var) and node.name in prog.constants:
            return _inline_folded(prog, prog.nest.flat.node(node.name).expr)
        return replace(node, args=kids) if isinstance(node, (Box, Apply)) else node
    return fold(expr, visit)


def _loop_line(loop: Loop, trips: Expr, tile: Expr) -> str:
    if loop.kind == "group":
        return f"parallel for each {loop.axis}-tile of {tile} ({trips} tiles) at {loop.level}:"
    via = f" via {loop.partition.via}" if loop.partition.via else ""
    if loop.kind == "split":
        return (f"parallel for each {loop.axis}-block of {tile} ({trips} programs) at {loop.level}{via}, "
                "each state from the identity, then combined in order:")
    return f"for each {loop.axis}-chunk of {tile} ({trips} chunks) at {loop.level}{via}:"


def _step_line(prog: Program, view: View, step: Step) -> str:
    homes = dict(prog.homes)
    if step.op == "load":
        source = homes[step.array] if homes[step.array] == view.parent else f"{homes[step.array]} via {view.parent}"
        return f"load {step.array} {source} -> {view.level} ({step.size})"
    if step.op == "save":
        sink = homes[step.array] if homes[step.array] == view.parent else f"{view.parent} on to {homes[step.array]}"
        return f"save {step.array} {view.level} -> {sink} ({step.size})"
    if step.op == "init":
        states = ", ".join(b.name.rsplit(".", 1)[1] for b in view.buffers
                           if b.role == "state" and b.array == step.array)
        return f"init {step.array} state ({states}) = identity"
    if step.op == "final":
        return f"{step.array} = final({step.array} state)"
    node = prog.nest.flat.node(step.array)
    box = node.expr
    assert isinstance(box, Box)
    target = f"[{' '.join(box.target)}]" if box.target else ""
    args = ", ".join(_arg(prog, a) for a in box.args)
    return f"{step.array} = {box.op}{target}({args})"
