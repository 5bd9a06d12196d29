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

__all__ = ["SIZE_REFUSALS", "input_arrays", "module_texts", "modules", "sizes_for"]

Draw = Callable[[st.SearchStrategy[Any]], Any]

#: the only refusals evaluating a generated module may give, with every axis sized by ``sizes_for``:
#: sizes drawn apart that a rename target or split parts must match
SIZE_REFUSALS = frozenset({"eval.size", "type.split_sizes"})

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


# ---- random well-typed modules ------------------------------------------------------------------

_AXIS_POOL = ("a", "b", "c", "e", "f")
_PARTS = ("p0", "p1")  # symbolic axes that split/join use, so sizes never clash
_BATCH = "w"  # an axis only some inputs carry and boxes never name: diagram calls weave it
_UNARY = sorted(ops.UNARY)
_REDUCE = sorted(n for n, i in ops.OPS.items() if i.kind == "reduce")
_NORMALISE = sorted(n for n, i in ops.OPS.items() if i.kind == "normalise")
_A_PARAMS = sorted(set(ops.UNARY) | {"id"})
_CMP = (">=", "<=", "==", "!=", ">", "<")
_KINDS = ("unary", "neg", "binary", "reduce", "normalise", "contract", "ncontract", "where", "index",
          "onehot", "split", "join", "rename", "transpose", "call")


@dataclass
class _Scope:
    """What a drawn expression may refer to: axes with sizes, arrays, earlier diagrams."""

    sizes: dict[str, int | None]
    env: dict[str, tuple[str, ...]] = field(default_factory=dict)
    diagrams: list[Diagram] = field(default_factory=list)


def _subset(draw: Draw, axes: tuple[str, ...] | list[str], min_size: int = 0, max_size: int = 6) -> tuple[str, ...]:
    """An ordered selection of distinct axes."""
    if not axes:
        return ()
    picked = draw(st.lists(st.sampled_from(list(axes)), min_size=min_size, max_size=min(max_size, len(axes)),
                           unique=True))
    return tuple(picked)


def _index_expr(draw: Draw, axes: tuple[str, ...], depth: int) -> str:
    choice = draw(st.integers(0, 3 if depth > 0 else 1))
    if choice == 0:
        return draw(st.sampled_from(axes))
    if choice == 1:
        return str(draw(st.integers(0, 5)))
    if choice == 2:
        return f"-({_index_expr(draw, axes, depth - 1)})"
    op = draw(st.sampled_from("+-*"))
    return f"({_index_expr(draw, axes, depth - 1)} {op} {_index_expr(draw, axes, depth - 1)})"


def _predicate(draw: Draw, axes: tuple[str, ...], depth: int) -> str:
    choice = draw(st.integers(0, 2 if depth > 0 else 0))
    if choice == 0:
        op = draw(st.sampled_from(_CMP))
        return f"{_index_expr(draw, axes, 1)} {op} {_index_expr(draw, axes, 1)}"
    if choice == 1:
        return f"(not {_predicate(draw, axes, depth - 1)})"
    op = draw(st.sampled_from(("and", "or")))
    return f"({_predicate(draw, axes, depth - 1)} {op} {_predicate(draw, axes, depth - 1)})"


def _leaf(draw: Draw, scope: _Scope) -> tuple[str, tuple[str, ...]]:
    choice = draw(st.integers(0, 4))
    if choice <= 1 and scope.env:
        name = draw(st.sampled_from(sorted(scope.env)))
        return name, scope.env[name]
    if choice == 2:
        return draw(st.sampled_from(sorted(scope.sizes))), ()  # an axis size as a scalar
    if choice == 3:
        return draw(st.sampled_from(("inf", "(-inf)", "0.5", "1e-05", "(-2)"))), ()
    value = draw(st.floats(0.0, 1e6, allow_nan=False) | st.integers(0, 100).map(float))
    return repr(value), ()


def _expr(draw: Draw, scope: _Scope, depth: int) -> tuple[str, tuple[str, ...]]:
    """Source text of a well-typed expression and its axes (as a set, in some order)."""
    if depth == 0:
        return _leaf(draw, scope)
    kind = draw(st.sampled_from(_KINDS))
    sub = depth - 1
    axes_all = tuple(sorted(a for a in scope.sizes if a != _BATCH))
    if kind in ("unary", "neg"):
        text, axes = _expr(draw, scope, sub)
        if kind == "neg":
            return draw(st.sampled_from((f"(-{text})", f"neg({text})"))), axes
        return f"{draw(st.sampled_from(_UNARY))}({text})", axes
    if kind == "binary":
        (left, la), (right, ra) = _expr(draw, scope, sub), _expr(draw, scope, sub)
        union = tuple(dict.fromkeys(la + ra))
        form = draw(st.sampled_from(("+", "-", "*", "/", "max", "min")))
        return (f"{form}({left}, {right})" if form in ("max", "min") else f"({left} {form} {right})"), union
    if kind in ("reduce", "normalise", "transpose", "rename", "split", "onehot"):
        text, axes = _expr(draw, scope, sub)
        if kind == "onehot":
            free = [a for a in axes_all if a not in axes]
            if not free:
                return text, axes
            v = draw(st.sampled_from(free))
            return f"onehot[{v}]({text})", (*axes, v)
        if not axes:
            return text, axes
        if kind == "transpose":
            order = draw(st.permutations(axes))
            return f"transpose[{' '.join(order)}]({text})", tuple(order)
        if kind == "rename":
            old = draw(st.sampled_from(axes))
            fits = [a for a in axes_all if a not in axes
                    and (None in (scope.sizes[a], scope.sizes[old]) or scope.sizes[a] == scope.sizes[old])]
            if not fits:
                return text, axes
            new = draw(st.sampled_from(fits))
            return f"rename[{old} -> {new}]({text})", tuple(new if a == old else a for a in axes)
        if kind == "split":
            old = draw(st.sampled_from(axes))
            if any(p in axes for p in _PARTS) or old in _PARTS or _PARTS[0] not in scope.sizes:
                return text, axes
            split = f"split[{old} -> {' '.join(_PARTS)}]({text})"
            if draw(st.booleans()):  # and back: the join's new axis is free again
                return f"join[{' '.join(_PARTS)} -> {old}]({split})", axes
            return split, tuple(a for a in axes if a != old) + _PARTS
        target = _subset(draw, axes, min_size=1)
        op = draw(st.sampled_from(_REDUCE if kind == "reduce" else _NORMALISE))
        kept = tuple(a for a in axes if a not in target) if kind == "reduce" else axes
        return f"{op}[{' '.join(target)}]({text})", kept
    if kind == "join":
        text, axes = _expr(draw, scope, sub)
        free = [a for a in axes_all if a not in axes]
        if not all(p in axes for p in _PARTS) or not free:
            return text, axes
        new = draw(st.sampled_from(free))
        return f"join[{' '.join(_PARTS)} -> {new}]({text})", (*tuple(a for a in axes if a not in _PARTS), new)
    if kind == "contract":
        operands = [_expr(draw, scope, sub) for _ in range(draw(st.integers(1, 3)))]
        union = tuple(dict.fromkeys(a for _, axes in operands for a in axes))
        target = _subset(draw, union)
        args = ", ".join(t for t, _ in operands)
        return f"contract[{' '.join(target)}]({args})", tuple(a for a in union if a not in target)
    if kind == "ncontract":
        (s, sa), (v, va) = _expr(draw, scope, sub), _expr(draw, scope, sub)
        if not sa:
            return s, sa
        target = _subset(draw, sa, min_size=1)
        a1, a2 = draw(st.sampled_from(_A_PARAMS)), draw(st.sampled_from(_A_PARAMS))
        b = draw(st.sampled_from(sorted(ops.NORMALISERS)))
        union = tuple(dict.fromkeys(sa + va))
        return f"ncontract[{' '.join(target)}; {a1}, {a2}, {b}]({s}, {v})", tuple(a for a in union if a not in target)
    if kind in ("where", "index"):
        target = _subset(draw, axes_all, min_size=1, max_size=2)
        if kind == "index":
            return f"index[{' '.join(target)}]({_index_expr(draw, target, 2)})", target
        (left, la), (right, ra) = _expr(draw, scope, sub), _expr(draw, scope, sub)
        pred = _predicate(draw, target, 2)
        return f"where[{' '.join(target)}]({pred}, {left}, {right})", tuple(dict.fromkeys(la + ra + target))
    assert kind == "call"
    call = _call(draw, scope, [d for d in scope.diagrams if len(d.out_types) == 1])
    if call is None:
        return _leaf(draw, scope)
    callee, text, woven = call
    return text, woven + callee.out_types[0]


def _call(draw: Draw, scope: _Scope, callees: list[Diagram]) -> tuple[Diagram, str, tuple[str, ...]] | None:
    """A call of an earlier diagram on arrays in scope that carry its input axes, and the
    extra axes it is woven over (never ones it uses inside); None if no such call exists."""
    if not callees:
        return None
    callee = draw(st.sampled_from(callees))
    inner = {a.name for a in callee.axes}
    args: list[str] = []
    woven: list[str] = []
    for param in callee.inputs:
        fits = sorted(n for n, axes in scope.env.items()
                      if set(param.axes) <= set(axes) and not (set(axes) - set(param.axes)) & inner)
        if not fits:
            return None
        name = draw(st.sampled_from(fits))
        args.append(name)
        woven.extend(a for a in scope.env[name] if a not in param.axes and a not in woven)
    return callee, f"{callee.name}({', '.join(args)})", tuple(woven)


def _diagram_text(draw: Draw, name: str, scope: _Scope) -> str:
    whole = sorted(a for a in scope.sizes if a not in (*_PARTS, _BATCH))  # leave the split parts free
    n_inputs = draw(st.integers(0, 3))
    batched = bool(scope.diagrams) and draw(st.booleans())
    inputs = [(f"X{i}", (_BATCH,) * (batched and draw(st.booleans())) + _subset(draw, whole, max_size=3))
              for i in range(n_inputs)]
    scope.env = dict(inputs)
    lines: list[str] = []
    for i in range(draw(st.integers(0, 3))):
        multi = [d for d in scope.diagrams if len(d.out_types) > 1]
        call = _call(draw, scope, multi) if multi and draw(st.booleans()) else None
        if call is not None:
            callee, text, woven = call
            names = [f"A{i}_{k}" for k in range(len(callee.out_types))]
            lines.append(f"  {', '.join(names)} = {text}")
            for n, t in zip(names, callee.out_types, strict=True):
                scope.env[n] = woven + t
            continue
        text, axes = _expr(draw, scope, draw(st.integers(0, 3)))
        lines.append(f"  A{i} = {text}")
        scope.env[f"A{i}"] = axes
    outs = [_expr(draw, scope, draw(st.integers(0, 2))) for _ in range(draw(st.integers(1, 2)))]
    declared = [draw(st.permutations(axes)) for _, axes in outs]
    params = ", ".join(f"{n}: [{' '.join(t)}]" for n, t in inputs)
    types = ", ".join(f"[{' '.join(t)}]" for t in declared)
    body = "\n".join(lines)
    return f"diagram {name}({params}) -> {types} {{\n{body}\n  return {', '.join(t for t, _ in outs)}\n}}\n"


def _theorem_text(draw: Draw, name: str, diagram: str, scope: _Scope) -> str:
    names = st.sampled_from(sorted(scope.env) or ["A"])
    level = st.sampled_from(("hbm", "l2", "smem", "reg"))
    steps = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(("rewrite", "group", "stream", "place", "dtype")))
        if kind == "rewrite":
            steps.append(f"rewrite lemma_{draw(st.integers(0, 9))} at {draw(names)}")
        elif kind in ("group", "stream"):
            tile = draw(st.integers(1, 64).map(str) | st.sampled_from(("t0", "t1")))
            via = f" via {draw(st.sampled_from(('sum', 'online_softmax')))}" if kind == "stream" and draw(
                st.booleans()) else ""
            pad = " pad" if draw(st.booleans()) else ""
            steps.append(f"{kind} {draw(st.sampled_from(sorted(scope.sizes)))} by {tile} at {draw(level)}{via}{pad}")
        elif kind == "place":
            steps.append(f"place {draw(names)} at {draw(level)}")
        else:
            tol = draw(st.sampled_from(("0.01", "1e-05", "0.25")))
            steps.append(f"dtype {draw(names)} as {draw(st.sampled_from(('bf16', 'f32')))} tol {tol}")
    return f"theorem {name}: {diagram} {{\n" + "".join(f"  {s}\n" for s in steps) + "}\n"


@st.composite
def module_texts(draw: Draw, max_diagrams: int = 3) -> str:
    """Source text of a random well-typed module (axes, diagrams, a lemma, a theorem)."""
    names = _subset(draw, _AXIS_POOL, min_size=1)
    sizes: dict[str, int | None] = {n: draw(st.none() | st.integers(1, 6)) for n in names}
    sizes[_BATCH] = None
    if draw(st.booleans()):
        sizes.update(dict.fromkeys(_PARTS))
    axis_lines = [f"axis {n}" + (f" = {s}" if s is not None else "") for n, s in sizes.items()]
    text = "\n".join(axis_lines) + "\n"
    scope = _Scope(sizes)
    for i in range(draw(st.integers(1, max_diagrams))):
        text += _diagram_text(draw, f"g{i}", scope)
        scope.diagrams = list(loads(text).diagrams)
    if draw(st.booleans()):
        scope.env = {f"P{i}": _subset(draw, sorted(sizes)) for i in range(draw(st.integers(1, 2)))}
        lhs, rhs = _expr(draw, scope, 2), _expr(draw, scope, 2)
        params = ", ".join(f"{n}: [{' '.join(t)}]" for n, t in scope.env.items())
        text += f"lemma l0({params}) : {lhs[0]} = {rhs[0]}\n"
    if draw(st.booleans()):
        text += _theorem_text(draw, "t0", draw(st.sampled_from([d.name for d in scope.diagrams])), scope)
    return text


def modules(max_diagrams: int = 3) -> st.SearchStrategy[Module]:
    """Random well-typed modules, elaborated by ``loads``."""
    return module_texts(max_diagrams).map(loads)
