"""Which stream chunks a program skips because a mask read from data is 0 on all of them, and on
which it leaves the mask out, as code: ``datamask.data_masks`` decides statically that the skip
rule holds (an absorbing operand filled with its padding value wherever an integer mask is 0);
this module emits the block mask, FlexAttention's: before the stream, one computation from the
mask's integer inputs classifies every (program block, chunk) pair, over its REAL positions
(padding left out), as

- ``EMPTY``: the mask is 0 at every real position.  By the skip rule the chunk lifts to the
  accumulators' identity, so it is not run: nothing of it is loaded;
- ``FULL``: the mask is nonzero (and every predicate of its chain holds) at every real position.
  There ``select(M, X, fill) = X`` (and ``where[...](p, X, fill) = X``): the chain of selects and
  wheres (``DataMask.nodes``) is computed as its value operand (``Scope.unmasked``).  At a padded
  position the two differ, and the padding law masks it where a box consumes it
  (``jaxops.mask_padded``), as on every chunk;
- ``PARTIAL``: anything else; the chunk runs with its masks.

``emit_kind`` writes the classification of one pair (the same conjunction the kernels tested per
chunk before, now counting ``all`` as well as ``any``), ``emit_steps`` the two steps (masked and
unmasked) a live chunk runs.  The targets place them: Pallas computes the kinds of every pair in
the wrapper (``runtime.pair_kinds``, plain jnp) and hands each program the count and the indices
of its live chunks in ascending order with their FULL flags (``runtime.live_chunks``), so its
loop runs over the live chunks only, in order; plain JAX, whose loop bounds stay static for
reverse mode, computes a block's kinds before its loop and switches on each chunk's kind.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from napkin_cat.lower import codegen as cg
from napkin_cat.lower.fold import emit_step
from napkin_cat.lower.jaxops import emit_node
from napkin_cat.lower.values import Scope, Value, align, position, predicate
from napkin_cat.schedule.datamask import DataMask, data_masks, tested
from napkin_cat.schedule.layout import Layout
from napkin_cat.terms import Box, Const, Expr, Var

__all__ = ["EMPTY", "FULL", "PARTIAL", "ChunkLoad", "DataSkip", "data_skip", "emit_kind", "emit_steps"]

#: code loading one input's chunk into a block, as the value the step reads
ChunkLoad = Callable[[cg.Block], Value]

#: the kinds of a (program block, chunk) pair (module docstring)
EMPTY, PARTIAL, FULL = 0, 1, 2


@dataclass(frozen=True)
class DataSkip:
    """A stream whose chunks a data mask skips: its masks (one per accumulating node), the
    inputs and nodes their classification reads (``datamask.tested``: the segment ids), and the
    nodes a FULL chunk computes unmasked (empty: every mask's chain is known, else none is
    left out and a FULL chunk runs masked, as a PARTIAL one)."""

    masks: tuple[DataMask, ...]
    reads: frozenset[str]
    unmasked: frozenset[str]


def data_skip(lay: Layout) -> DataSkip | None:
    """The layout's data skip, or None where no data mask decides one, an output is written
    chunk by chunk, or a split streams the axis in blocks (it skips nothing, as it skips no
    affine-masked chunk either)."""
    if lay.stream is None or lay.chunk_outputs or lay.split is not None:
        return None
    masks = data_masks(lay.flat, lay.stream, lay.plans)
    if masks is None:
        return None
    chains = [found.nodes for found in masks]
    unmasked = frozenset().union(*chains) if all(chains) else frozenset()
    return DataSkip(masks, tested(lay.flat, masks), unmasked)


def emit_kind(skip: DataSkip, lay: Layout, env: dict[str, Value], scope: Scope) -> ast.expr:
    """Code for the kind (``EMPTY``, ``PARTIAL`` or ``FULL``, int32) of the pair ``scope`` is at.

    ``env`` holds the pair's slices of the inputs the masks read; the nodes the masks read are
    emitted into ``scope``'s block (and added to ``env``).  Some real position of the pair is
    live where some mask's conjunction holds there; the pair is FULL where every mask's
    conjunction holds at every real position."""
    defs = {n.name: n.expr for n in lay.flat.nodes}
    live: ast.expr | None = None
    full: ast.expr | None = None
    for found in dict.fromkeys(skip.masks):
        hit, real = _conjunction(found, defs, env, scope)
        some = cg.call("jnp.any", hit if real is None else cg.call("jnp.logical_and", hit, real))
        every = cg.call("jnp.all", hit if real is None else cg.call("jnp.logical_or", hit,
                                                                     cg.call("jnp.logical_not", real)))
        live = some if live is None else cg.call("jnp.logical_or", live, some)
        full = every if full is None else cg.call("jnp.logical_and", full, every)
    assert live is not None and full is not None
    live = scope.block.bind("live", live)
    if not skip.unmasked:
        return cg.call("jnp.where", live, cg.const(PARTIAL), cg.const(EMPTY))
    inner = cg.call("jnp.where", scope.block.bind("full", full), cg.const(FULL), cg.const(PARTIAL))
    return cg.call("jnp.where", live, inner, cg.const(EMPTY))


def emit_steps(skip: DataSkip, lay: Layout, env: Mapping[str, Value], scope: Scope, carried: list[Value],
               loads: Mapping[str, ChunkLoad]) -> tuple[str, str]:
    """Two functions of no argument, emitted into ``scope``'s block, returning the chunk's new
    carry from ``carried``: the step of a PARTIAL chunk (every mask) and of a FULL one
    (``skip.unmasked`` computed as their value operands).  Each loads the chunks ``loads`` names
    (plain JAX: a chunk that runs neither loads nothing); ``env`` holds those loaded before
    (Pallas: every chunk of its loop runs one of the two)."""
    names = []
    for unmasked, hint in ((frozenset[str](), "partial_chunk"), (skip.unmasked, "full_chunk")):
        run, name = scope.block.child(), scope.block.namer.fresh(hint)
        chunk_env = dict(env) | {key: load(run) for key, load in loads.items()}
        inner = scope.with_block(run, unmasked=scope.unmasked | unmasked)
        run.emit(ast.Return(cg.tuple_(emit_step(lay, chunk_env, inner, carried))))
        scope.block.emit(cg.function(name, [], run.stmts))
        names.append(name)
    return names[0], names[1]


def _conjunction(found: DataMask, defs: dict[str, Expr], env: dict[str, Value],
                 scope: Scope) -> tuple[ast.expr, ast.expr | None]:
    """Where every mask is nonzero and every predicate holds, and where the position is real
    (None: every position of the pair is): a padded position (past an axis' true size, its ids
    zero-padded) may read as live or not, so it counts for neither EMPTY nor FULL."""
    values = [_emit(mask, defs, env, scope) for mask in found.masks]
    axes = tuple(dict.fromkeys([a for v in values for a in v.axes]
                               + [a for _, target in found.preds for a in scope.keep(target)]))
    terms = [cg.binop(align(v, axes), "!=", cg.const(0)) for v in values]
    terms += [predicate(pred, axes, scope) for pred, _ in found.preds]
    reals = [cg.binop(position(a, axes, scope), "<", scope.limit(a)) for a in axes if a in scope.padded]
    return _all(terms), (_all(reals) if reals else None)


def _all(terms: list[ast.expr]) -> ast.expr:
    out = terms[0]
    for term in terms[1:]:
        out = cg.call("jnp.logical_and", out, term)
    return out


def _emit(expr: Expr, defs: dict[str, Expr], env: dict[str, Value], scope: Scope) -> Value:
    """The mask's value on the pair, emitting the nodes it reads that ``env`` lacks."""
    if not isinstance(expr, Var):  # a scalar mask (a constant or an axis size): its own value
        return Value(cg.const(0 if isinstance(expr, Const) and expr.value == 0 else 1), ())
    if expr.name not in env:
        box = defs[expr.name]
        assert isinstance(box, Box), expr
        for arg in box.args:
            _emit(arg, defs, env, scope)
        emit_node(expr.name, box, env, scope)
    return env[expr.name]
