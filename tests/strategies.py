"""Shared hypothesis strategies: draw a type, then values.

- ``sizes_for`` / ``input_arrays``: sizes for a diagram's axes (declared sizes kept), then
  float64 arrays for its inputs in declared order.
- ``module_texts`` / ``modules``: random well-typed .ncd modules.  A module is drawn as
  axes first, then diagrams whose expressions are built bottom-up from the types in scope
  (every box, binary op, constant, where/index predicate, split/join/rename/transpose,
  onehot and calls of earlier diagrams, woven over extra axes), then elaborated with
  ``loads`` so the typing rules are the elaborator's own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from napkin_cat import ops
from napkin_cat.elaborate import loads
from napkin_cat.terms import Diagram, Module

__all__ = ["input_arrays", "module_texts", "modules", "sizes_for"]

Draw = Callable[[st.SearchStrategy[Any]], Any]

#: finite values of moderate magnitude: exp of them stays far from overflow
FINITE = st.floats(-8.0, 8.0, allow_nan=False, allow_infinity=False)


def sizes_for(diagram: Diagram, min_size: int = 1, max_size: int = 4) -> st.SearchStrategy[dict[str, int]]:
    """A size for every axis of the diagram: declared sizes as declared, symbolic ones drawn."""
    free = [a.name for a in diagram.axes if a.size is None]
    fixed = {a.name: a.size for a in diagram.axes if a.size is not None}
    drawn = st.fixed_dictionaries({name: st.integers(min_size, max_size) for name in free})
    return drawn.map(lambda d: {**fixed, **d})  # type: ignore[dict-item]


def input_arrays(
    diagram: Diagram,
    sizes: Mapping[str, int],
    elements: st.SearchStrategy[float] | Mapping[str, st.SearchStrategy[float]] = FINITE,
) -> st.SearchStrategy[tuple[np.ndarray, ...]]:
    """Float64 arrays for the diagram's inputs in declared order, shaped by ``sizes``.

    ``elements`` is one strategy for every input, or one per input name.
    """

    def one(name: str, axes: tuple[str, ...]) -> st.SearchStrategy[np.ndarray]:
        values = elements[name] if isinstance(elements, Mapping) else elements
        return hnp.arrays(np.float64, tuple(sizes[a] for a in axes), elements=values)

    return st.tuples(*(one(p.name, p.axes) for p in diagram.inputs))
