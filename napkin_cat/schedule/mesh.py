"""A device's block of a mesh axis: the one definition that lowering realises (``lower.mesh``)
and cost prices (``cost.mesh``).

A partition at ``mesh`` over N devices gives each device a block of ⌈|a|/N⌉ positions of its axis,
whatever the proof names the mesh tile.  Where the theorem assumes the device's own tile t of
that axis divides the mesh tile (R9 records `gq | mq`, `sx | mx` in ``Theorem.constraints``;
none for a tile of 1), the block is rounded up to whole tiles, ⌈⌈|a|/N⌉/t⌉·t, so the assumption
holds on the realised blocks as the outermost `t | a` holds on a padded extent.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import overload

import sympy
from sympy import Expr

from napkin_cat.terms import Divides, Schedule

__all__ = ["device_block", "whole_tiles"]


def whole_tiles(schedule: Schedule, constraints: Iterable[Divides]) -> dict[str, str | int]:
    """Per mesh axis of ``schedule`` whose device tile the theorem assumes divides the mesh tile
    (``constraints``: ``Theorem.constraints``), that device tile (its name, or a number): each
    device's block of the axis is a whole number of it (``device_block``).  A tile of 1 is left out."""
    device = schedule.device().partitions
    recorded = frozenset(constraints)
    whole: dict[str, str | int] = {}
    for m in schedule.mesh:
        inner = next((p for p in device if p.axis == m.axis), None)
        if inner is not None and inner.tile != 1 and Divides(inner.tile, m.tile) in recorded:
            whole[m.axis] = inner.tile
    return whole


@overload
def device_block(size: int, devices: int, tile: int = 1) -> int: ...
@overload
def device_block(size: int | Expr, devices: int, tile: int | Expr = 1) -> int | Expr: ...
def device_block(size: int | Expr, devices: int, tile: int | Expr = 1) -> int | Expr:
    """One device's block of an axis of ``size`` over ``devices``, in whole tiles of ``tile``:
    ⌈⌈size/N⌉/t⌉·t.  Numbers give a number (an empty axis still gets one tile, as the lowering's
    ``runtime.round_up`` gives a kernel one program); a symbolic size or tile gives a sympy
    expression, ``ceiling(size/N)`` where the tile is 1."""
    if isinstance(size, int) and isinstance(tile, int):
        share = max(1, -(-size // devices))
        return -(-share // tile) * tile
    share = sympy.ceiling(sympy.sympify(size) / devices)
    return share if tile == 1 else sympy.ceiling(share / tile) * tile
