"""Every op has an entry in every interpreter's table.

The interpreters of a diagram (the float64 and sympy evaluator, which certification's
reach analysis also reads scalars with, the JAX lowering, drawing, the finiteness analysis, the
join test's running error bounds)
are tables over ``ops.OPS``, keyed by the op's name or by its ``kind``.  One parametrised
test names each op against each table, so a new op that some interpreter lacks fails here
with both names, before any diagram that uses it reaches that interpreter.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest

from napkin_cat import evaluate, finiteness, ops
from napkin_cat.draw import graph
from napkin_cat.lower import jaxops, roundoff

#: table name -> (the table, how an op is looked up in it, which ops it must serve)
Table = tuple[Mapping[str, object], Callable[[ops.OpInfo], str], Callable[[ops.OpInfo], bool]]


def _by_kind(info: ops.OpInfo) -> str:
    return info.kind


def _by_name(info: ops.OpInfo) -> str:
    return info.name


def _every(info: ops.OpInfo) -> bool:
    return True


def _of_kind(kind: str) -> Callable[[ops.OpInfo], bool]:
    return lambda info: info.kind == kind


TABLES: dict[str, Table] = {
    "evaluate.BY_KIND": (evaluate.BY_KIND, _by_kind, _every),
    "evaluate.FLOAT64.unary": (evaluate.FLOAT64.unary, _by_name, _of_kind("unary")),
    "evaluate.SYMBOLIC.unary": (evaluate.SYMBOLIC.unary, _by_name, _of_kind("unary")),
    "evaluate.FLOAT64.binary": (evaluate.FLOAT64.binary, _by_name, _of_kind("binary")),
    "evaluate.SYMBOLIC.binary": (evaluate.SYMBOLIC.binary, _by_name, _of_kind("binary")),
    "lower.jaxops.TABLE": (jaxops.TABLE, _by_kind, _every),
    "lower.roundoff.RULES": (roundoff.RULES, _by_kind, _every),
    "lower.roundoff.SLOPES": (roundoff.SLOPES, _by_name, _of_kind("unary")),
    "lower.roundoff.ULPS": (roundoff.ULPS, _by_name, _of_kind("unary")),
    "lower.jaxops.UNARY": (jaxops.UNARY, _by_name, _of_kind("unary")),
    "lower.jaxops.BINARY": (jaxops.BINARY, _by_name, _of_kind("binary")),
    "draw.graph.GLYPHS": (graph.GLYPHS, _by_name, _every),
    "finiteness.RULES": (finiteness.RULES, _by_name, _every),
    "finiteness.UNARY": (finiteness.UNARY, _by_name, _of_kind("unary")),
    # every interpreter computes a normalisation as the normalised contraction of its weights
    "ops.OpInfo.weights": ({n: i.weights for n, i in ops.OPS.items() if i.weights}, _by_name, _of_kind("normalise")),
}


@pytest.mark.parametrize("table", sorted(TABLES))
@pytest.mark.parametrize("op", sorted(ops.OPS))
def test_every_op_has_an_entry_in_every_table(op: str, table: str) -> None:
    entries, key, serves = TABLES[table]
    info = ops.OPS[op]
    if serves(info):
        assert key(info) in entries, f"{table} has no entry for {op} (kind {info.kind})"


def test_tables_hold_nothing_but_ops_and_kinds() -> None:
    kinds = {info.kind for info in ops.OPS.values()}
    for name, (entries, key, _) in TABLES.items():
        known = kinds if key is _by_kind else set(ops.OPS) | {"id"}  # `id`: the identity normaliser weight
        assert set(entries) <= known, f"{name} has entries for no op: {sorted(set(entries) - known)}"
