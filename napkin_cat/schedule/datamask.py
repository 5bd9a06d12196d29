"""Which stream chunks a mask read from data lets a kernel skip: the data-dependent side of
``masks`` (whose module docstring states the skip rule this module applies unchanged)::

          x_i = pad_i where M = 0    i ∈ absorbing(acc)    M = 0 on all of (block, c)
    skip ──────────────────────────────────────────────────────────────────────────────
                              lift_acc(x|c) = identity_acc

Here the mask is an integer array ``M`` (``select(M, A, fill)``: a document mask
``eq(Dq, Dx)``, key padding ``lt(index[x](x), len)``), so whether it is 0 on a whole chunk is
known only at run time.  ``data_masks`` decides statically that the rest of the rule holds
(each accumulating node has an absorbing operand that ``masks.masked_fill`` shows is its
padding value wherever ``M`` is 0, every other operand finite); before the kernel, a block
mask computed from the arrays ``tested`` names classifies every (program block, chunk) pair
over its real positions as empty (``M`` 0 at all: skipped, by the rule), full (the whole
conjunction holds at all: the chain of selects and wheres, ``DataMask.nodes``, is its value
operand there) or partial (``lower/dataskip.py``; ``block_kinds`` states it in numpy).  The
classification is exact, not a bound, whatever the data (sorted or not; padded positions,
whose zero-padded ids may read either way, count for neither).  The cost model counts the
live chunks as a fraction of all (``--live``) and the block mask's reads and writes
(``program.BlockMask``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from napkin_cat.certify.accumulators import AccumulatorPlan
from napkin_cat.schedule.loopnest import Flat
from napkin_cat.schedule.masks import absorbed_masks
from napkin_cat.terms import Axes, Box, Cmp, Const, Expr, Logic, Pred, Var

__all__ = ["DataMask", "block_kinds", "block_liveness", "data_masks", "gathered_tables", "tested"]


@dataclass(frozen=True)
class DataMask:
    """Where an absorbing operand may differ from its padding value: where every integer mask of
    ``masks`` is nonzero and every index predicate of ``preds`` (each with the axes of its
    ``where``) holds.  Outside, the operand is its padding value."""

    masks: tuple[Expr, ...]
    preds: tuple[tuple[Pred, Axes], ...] = ()
    #: the nodes of the chain of selects and wheres that apply them (``_nested``), each its value
    #: operand wherever they all hold: where they hold at every real position of a (block,
    #: chunk) pair, the kernel computes the chain unmasked there; empty when the operand is
    #: no such chain (its chunks then run masked whatever the mask)
    nodes: frozenset[str] = frozenset()


def data_masks(flat: Flat, stream: str, plans: Mapping[str, AccumulatorPlan]) -> tuple[DataMask, ...] | None:
    """Per accumulating node (``plans``: every node that consumes ``stream``), the integer mask
    whose zeros fill an absorbing operand with its padding value; None where some node has
    none, or an output carries the streamed axis (a chunk of it is written by the loop)."""
    found = absorbed_masks(flat, stream, plans, lambda operand, mask, fill, defs: None
                           if isinstance(mask, (Cmp, Logic)) else _nested(operand, mask, fill, defs))
    return None if found is None else tuple(found)  # an index predicate is masks.py's (affine bounds)


def tested(flat: Flat, masks: tuple[DataMask, ...]) -> frozenset[str]:
    """The arrays the block mask of ``masks`` reads: the masks' nodes and, transitively, the
    nodes and inputs they read (the segment ids of a document mask, not its keys and values)."""
    nodes = {n.name: n for n in flat.nodes}
    seen: set[str] = set()
    todo = [m.name for found in masks for m in found.masks if isinstance(m, Var)]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += list(nodes[name].reads) if name in nodes else []
    return frozenset(seen)


def gathered_tables(flat: Flat) -> frozenset[str]:
    """The inputs a kernel reads only at the rows a gather names (a paged KV cache's pool): every
    box that reads one is a ``gather[n]`` of it along its first axis ``n`` at positions that
    share no axis with it (``page: [b j]`` into ``Kp: [n s d]``), and no output is one.  Such a
    gather is one indexed load, ``T[clamp(I)]``, of the rows the positions name; the whole table
    is never read (``lower``: through the input's ref in Pallas, ``jnp.take`` in plain JAX), and
    the cost model counts the rows (``schedule.build``)."""
    found = set()
    for name, axes in flat.inputs:
        readers = [n.expr for n in flat.nodes if name in n.reads]
        if readers and name not in flat.outputs and all(
                isinstance(box, Box) and box.op == "gather" and isinstance(box.args[0], Var)
                and box.args[0].name == name and box.target == axes[:1]
                and not set(box.args[1].axes) & set(axes) for box in readers):
            found.add(name)
    return frozenset(found)


def _nested(operand: Expr, mask: Expr, fill: float, defs: Mapping[str, Expr]) -> DataMask:
    """The conjunction a chain of masks with one fill makes: an operand ``select(M1, X, c)``
    with ``X = select(M2, Y, c)`` or ``where[...](p, Y, c)`` (and so on) is ``c`` wherever
    ``M1 = 0``, or ``M1 != 0`` and ``X = c``: live only where ``M1``, ``M2`` and ``p`` all hold
    (a causal document mask: the documents and the diagonal).  An operand that is not itself
    such a select keeps the one mask ``masks.masked_fill`` found."""
    masks: list[Expr] = []
    preds: list[tuple[Pred, Axes]] = []
    nodes: list[str] = []
    expr, name = operand, None
    while True:
        while isinstance(expr, Var) and expr.name in defs:
            name = expr.name
            expr = defs[name]
        if not isinstance(expr, Box) or not isinstance(expr.args[-1], Const) or expr.args[-1].value != fill:
            break
        if expr.op == "select":
            masks.append(expr.args[0])
            nodes.append(name or "")  # "": a box inside an operand, not a node the kernel can leave out
            expr, name = expr.args[1], None
        elif expr.op == "where" and isinstance(expr.index, (Cmp, Logic)):
            preds.append((expr.index, expr.target))
            nodes.append(name or "")
            expr, name = expr.args[0], None
        else:
            break
    chain = frozenset(nodes) if "" not in nodes else frozenset()
    return DataMask(tuple(masks), tuple(preds), chain) if masks else DataMask((mask,))


def block_liveness(mask: np.ndarray, block: int, chunk: int) -> np.ndarray:
    """``live[p, c]``: is the ``[rows, keys]`` mask nonzero somewhere on program ``p``'s block
    of ``block`` rows and chunk ``c`` of ``chunk`` keys (a ragged last block or chunk counts
    its real positions)?  The numpy statement of the block mask's live pairs, for measuring
    the fraction of live chunks (``--live`` of the cost model) on real segment ids."""
    rows, keys = mask.shape
    p, c = -(-rows // block), -(-keys // chunk)
    padded = np.zeros((p * block, c * chunk), dtype=bool)
    padded[:rows, :keys] = mask != 0
    return padded.reshape(p, block, c, chunk).any(axis=(1, 3))


def block_kinds(mask: np.ndarray, block: int, chunk: int) -> np.ndarray:
    """``kind[p, c]``: 0 where the ``[rows, keys]`` mask is 0 at every real position of program
    ``p``'s block and chunk ``c`` (``block_liveness`` false), 2 where it is nonzero at every one,
    1 otherwise: the numpy statement of the kernels' block mask (``lower.dataskip``)."""
    rows, keys = mask.shape
    p, c = -(-rows // block), -(-keys // chunk)
    padded = np.ones((p * block, c * chunk), dtype=bool)  # padding counts as live for "every"
    padded[:rows, :keys] = mask != 0
    every = padded.reshape(p, block, c, chunk).all(axis=(1, 3))
    live = block_liveness(mask, block, chunk)
    return np.where(live, np.where(every, 2, 1), 0)
