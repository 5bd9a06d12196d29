"""Which stream chunks a program skips because a mask read from data is 0 on all of them, as
code: ``datamask.data_masks`` decides statically that the skip rule holds (an absorbing operand
filled with its padding value wherever an integer mask is 0); this module emits, at the start
of a chunk, the mask on the (program block, chunk) pair and the test that some entry is
nonzero.  The targets run the chunk's step under ``lax.cond`` on that test, the skipped branch
returning the carry unchanged (the accumulators' identity lifted and combined, by the rule).
The test reads only its own inputs' chunks (``datamask.tested``: the segment ids); the chunks of
the other inputs (the keys and values) are loaded inside the branch that runs, so a skipped chunk
moves only what its test reads, as the cost model counts it.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping

from napkin_cat.lower import codegen as cg
from napkin_cat.lower.fold import emit_step
from napkin_cat.lower.jaxops import emit_node
from napkin_cat.lower.values import Scope, Value, align, position, predicate
from napkin_cat.schedule.datamask import DataMask, data_masks, tested
from napkin_cat.schedule.layout import Layout
from napkin_cat.terms import Box, Const, Expr, Var

__all__ = ["ChunkLoad", "guarded_step"]

#: code loading one input's chunk into a block, as the value the step reads
ChunkLoad = Callable[[cg.Block], Value]


def guarded_step(lay: Layout, env: dict[str, Value], scope: Scope, carried: list[Value],
                 carry: str, loads: Mapping[str, ChunkLoad]) -> ast.expr | None:
    """The chunk's new carry under ``lax.cond(live, run_chunk, lambda: carry)``: the step
    (``fold.emit_step``) in a function of its own that runs only where the chunk's data mask is
    live, the carry ``carry`` unchanged elsewhere; None where no data mask decides a skip (the
    caller loads the chunks and emits the step itself).  ``loads`` loads each streamed input's
    chunk: those the test reads before it, the rest inside ``run_chunk``."""
    if lay.stream is None:
        return None
    masks = data_masks(lay.flat, lay.stream, lay.plans)
    if masks is None:
        return None
    reads = tested(lay.flat, masks)
    for name, load in loads.items():
        if name in reads:
            env[name] = load(scope.block)
    live = _live(masks, lay, env, scope)
    run, name = scope.block.child(), scope.block.namer.fresh("run_chunk")
    for key, load in loads.items():
        if key not in reads:
            env[key] = load(run)
    updated = emit_step(lay, env, scope.with_block(run), carried)
    run.emit(ast.Return(cg.tuple_(updated)))
    scope.block.emit(cg.function(name, [], run.stmts))
    unchanged = ast.Lambda(ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
                           cg.name(carry))
    return cg.call("lax.cond", live, cg.name(name), unchanged)


def _live(masks: tuple[DataMask, ...], lay: Layout, env: dict[str, Value], scope: Scope) -> ast.expr:
    """Code for "some data mask of this chunk is nonzero".

    ``env`` holds the chunk's tested inputs and the values computed before the loop; the nodes
    the masks read are emitted into ``scope``'s block (and added to ``env``)."""
    defs = {n.name: n.expr for n in lay.flat.nodes}
    # max of 0/1 rather than jnp.any: Pallas' Triton backend has no reduce_or
    tests = [cg.binop(cg.call("jnp.max", cg.call("jnp.where", _conjunction(found, defs, env, scope), cg.const(1.0),
                                                 cg.const(0.0))), ">", cg.const(0.0)) for found in dict.fromkeys(masks)]
    live = tests[0]
    for test in tests[1:]:
        live = cg.call("jnp.logical_or", live, test)
    return scope.block.bind("live", live)


def _conjunction(found: DataMask, defs: dict[str, Expr], env: dict[str, Value], scope: Scope) -> ast.expr:
    """Where every mask is nonzero and every predicate holds, at a real position: a padded
    position (past an axis' true size, its ids zero-padded) may read as live, so it is left out
    of the test (a chunk is skipped only where no real position is live; a padded one lifts
    nothing either way)."""
    values = [_emit(mask, defs, env, scope) for mask in found.masks]
    axes = tuple(dict.fromkeys([a for v in values for a in v.axes]
                               + [a for _, target in found.preds for a in scope.keep(target)]))
    terms = [cg.binop(align(v, axes), "!=", cg.const(0)) for v in values]
    terms += [predicate(pred, axes, scope) for pred, _ in found.preds]
    terms += [cg.binop(position(a, axes, scope), "<", scope.limit(a)) for a in axes if a in scope.padded]
    hit = terms[0]
    for term in terms[1:]:
        hit = cg.call("jnp.logical_and", hit, term)
    return hit


def _emit(expr: Expr, defs: dict[str, Expr], env: dict[str, Value], scope: Scope) -> Value:
    """The mask's value on the chunk, emitting the nodes it reads that ``env`` lacks."""
    if not isinstance(expr, Var):  # a scalar mask (a constant or an axis size): its own value
        return Value(cg.const(0 if isinstance(expr, Const) and expr.value == 0 else 1), ())
    if expr.name not in env:
        box = defs[expr.name]
        assert isinstance(box, Box), expr
        for arg in box.args:
            _emit(arg, defs, env, scope)
        emit_node(expr.name, box, env, scope)
    return env[expr.name]
