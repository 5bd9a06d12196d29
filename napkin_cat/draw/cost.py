"""The cost model's row under a theorem's picture: M and H per column (the Napkin paper's Fig. 9).

``cost_table`` asks ``napkin_cat.cost`` for the theorem's per-level programs and gathers their
columns (one per load, box and save, see ``napkin_cat.schedule.program``) under the picture's columns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sympy

from napkin_cat import cost
from napkin_cat.draw.columns import depths
from napkin_cat.draw.layout import Layout, text_width
from napkin_cat.schedule.program import max_of

__all__ = ["CELL_FONT", "CostTable", "cost_table", "crowded"]

CELL_FONT = 11.0


@dataclass(frozen=True)
class CostTable:
    """The cost model's rows under the picture: (header, cell text by column), and totals."""

    rows: tuple[tuple[str, dict[int, str]], ...]
    totals: tuple[str, ...]


def cost_table(theorem: Any) -> CostTable:
    """Per column of the picture, M and H at each level below HBM (the Napkin paper's Fig. 9).

    The cost model's own columns (one per load, box and save, ``pseudo_program``) are gathered under
    the picture's columns: a box's column, its result's saves, and the loads it is the first
    reader of.
    """
    result = cost.cost(theorem)
    prog = result.program
    flat = prog.nest.flat
    boxes = [n for n in flat.nodes if n.name not in prog.constants]  # constants are folded into labels
    known = {name for name, _ in flat.inputs} | {n.name for n in boxes}
    column = depths({n.name: [r for r in n.reads if r in known] for n in boxes}, (name for name, _ in flat.inputs))
    readers: dict[str, list[int]] = {}
    for node in flat.nodes:
        for r in node.reads:
            if node.name in column:
                readers.setdefault(r, []).append(column[node.name])
    rows: list[tuple[str, dict[int, str]]] = []
    for view in prog.views:
        memory: dict[int, list[sympy.Expr]] = {}
        moved: dict[int, sympy.Expr] = {}
        for step in view.steps:
            col = min(readers.get(step.array, [0])) if step.op == "load" else column.get(step.array, 0)
            memory.setdefault(col, []).append(view.live_size(step.index))
            if step.op in ("load", "save"):  # the steps that move values (View.transfers)
                moved[col] = moved.get(col, sympy.Integer(0)) + sympy.Mul(step.count, step.size)
        rows.append((f"M {view.level}", {c: _expr(max_of(v)) for c, v in memory.items()}))
        rows.append((f"H {view.level}", {c: _expr(moved.get(c, sympy.Integer(0))) for c in memory}))
    totals = tuple(f"{lv.name}: M = {_expr(lv.memory)}, H = {_expr(lv.transfers)} (from {lv.parent})"
                   for lv in result.levels if lv.parent is not None)
    return CostTable(tuple(rows), totals)


def _expr(expr: Any) -> str:
    """The shorter of a sympy expression and its factored form."""
    plain, factored = str(sympy.expand(expr)), str(sympy.factor(expr))
    return factored if len(factored) < len(plain) else plain


def crowded(lay: Layout, table: CostTable) -> dict[int, float]:
    """Columns whose cost cells collide with their left neighbour: how much wider each must be."""
    need: dict[int, float] = {}
    for header, cells in table.rows:
        left = 16 + text_width(header, CELL_FONT)  # the row header
        for col, text in sorted(cells.items()):
            x0, x1 = lay.columns[col]
            half = text_width(text, CELL_FONT) / 2
            overlap = left + 14 - ((x0 + x1) / 2 - half)
            if overlap > 0:
                need[col] = max(need.get(col, 0.0), 2 * overlap)
            left = (x0 + x1) / 2 + half
    return need
