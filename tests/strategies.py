"""Shared hypothesis strategies: draw a type, then values.

- ``sizes_for`` / ``input_arrays``: sizes for a diagram's axes (declared sizes kept, and the
  sizes that its split/join/rename boxes tie together drawn to agree where they can), then
  float64 arrays for its inputs in declared order.
- ``attention_texts``: random modules of the attention family, every operand of the
  consuming boxes (scores, values, normalised scores) maybe masked.
- ``schedule_steps``: random rewrite, group and stream steps for a diagram (for the kernel
  to accept or refuse, one at a time).
- ``broadcast_texts``: a diagram of one scalar output over inputs of every rank on three axes, its
  boxes mostly over operands of lower rank than their value (broadcast scalars and vectors under
  reductions, scans, contractions and normalisations): for reverse mode's broadcasting adjoints.
- ``module_texts`` / ``modules``: random well-typed .ncd modules.  A module is drawn as
  axes first, then diagrams, each a few let-bindings of one box each (any op of
  ``napkin_cat.ops.OPS``, picked uniformly, or a call of an earlier diagram) over the arrays
  already in scope, so later bindings share earlier ones; operands are occasionally nested
  expressions, constants or axis sizes, and any operand of any box may be masked
  (``where[..](pred, operand, fill)``: affine predicates as causal and windowed masks
  write them, or any predicate; fills that equal each accumulator's padding value, 0, -inf,
  inf and 1, and fills that do not).  A binding is sometimes a normalisation then a
  contraction (``P = softmax[t](S)``, ``O = contract[t](P, V)``), the shape the library's
  normalised-contraction lemmas rewrite.  A later diagram often takes inputs shaped for an
  earlier one with extra axes and calls it, woven over them; diagrams return one or two
  outputs.  The text is elaborated with ``loads``, so the typing rules are the elaborator's
  own.  Every choice shrinks towards the simplest (fewer bindings, the first op, no call),
  so a failure shrinks to a small module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from napkin_cat import ops
from napkin_cat.elaborate import loads
from napkin_cat.terms import Apply, Box, Diagram, Expr, Module, Partition, Rewrite, walk

__all__ = ["BROADCAST_SIZES", "SIZE_REFUSALS", "attention_texts", "broadcast_texts", "input_arrays",
           "module_texts", "modules", "schedule_steps", "sizes_for"]

Draw = Callable[[st.SearchStrategy[Any]], Any]

#: the only refusals evaluating a generated module may give, with every axis sized by ``sizes_for``:
#: declared sizes that a rename target or split parts cannot match, and sizes too large to evaluate
SIZE_REFUSALS = frozenset({"eval.size", "eval.too_large", "type.split_sizes"})

#: finite values of moderate magnitude: exp of them stays far from overflow; float32 values, the
#: domain's (``napkin_cat.run`` refuses a magnitude float32 cannot hold, such as 1e-300)
FINITE = st.floats(-8.0, 8.0, allow_nan=False, allow_infinity=False, width=32)


def _reshapes(diagram: Diagram) -> list[Box]:
    """The split/join/rename boxes of a diagram and of the diagrams it calls, operands first."""
    found: list[Box] = []

    def visit(expr: Expr) -> None:
        for node in reversed(list(walk(expr))):  # reversed pre-order: children before parents
            if isinstance(node, Apply):
                for inner in node.diagram.body:
                    visit(inner.expr)
                for out in node.diagram.outputs:
                    visit(out)
            elif isinstance(node, Box) and node.op in ("split", "join", "rename"):
                found.append(node)

    for let in diagram.body:
        visit(let.expr)
    for out in diagram.outputs:
        visit(out)
    return found


def sizes_for(diagram: Diagram, min_size: int = 1, max_size: int = 4) -> st.SearchStrategy[dict[str, int]]:
    """A size for every axis of the diagram: declared sizes as declared, symbolic ones drawn
    from ``[min_size, max_size]``, except that a symbolic axis a reshape box ties to others
    (the parts of a split, the result of a join, a rename's target) is drawn to agree with
    them (a split's parts as divisors of the whole).  Declared sizes can still disagree."""
    free = [a.name for a in diagram.axes if a.size is None]
    fixed = {a.name: a.size for a in diagram.axes if a.size is not None}
    reshapes = _reshapes(diagram)

    @st.composite
    def draw_sizes(draw: Draw) -> dict[str, int]:
        sizes: dict[str, int] = dict(fixed)  # type: ignore[arg-type]

        def get(axis: str) -> int:
            if axis not in sizes:
                sizes[axis] = draw(st.integers(min_size, max_size))
            return sizes[axis]

        for box in reshapes:
            if box.op == "rename":  # the new name takes the old one's size unless it has one
                if box.out[0] not in sizes:
                    sizes[box.out[0]] = get(box.target[0])
                continue
            total = math.prod(get(a) for a in box.target)
            unknown = [a for a in box.out if a not in sizes]
            known = math.prod(sizes[a] for a in box.out if a in sizes)
            if not unknown or known == 0 or total % known:
                continue
            rest = total // known
            for axis in unknown[:-1]:
                part = draw(st.sampled_from([k for k in range(1, rest + 1) if rest % k == 0]))
                sizes[axis], rest = part, rest // part
            sizes[unknown[-1]] = rest
        for axis in free:
            get(axis)
        return sizes

    return draw_sizes()


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
_A_PARAMS = sorted(set(ops.UNARY) | {"id"})
_CMP = (">=", "<=", "==", "!=", ">", "<")
_BINARY = {"add": "+", "sub": "-", "mul": "*", "div": "/", "maximum": "max", "minimum": "min"}
#: what a box is drawn as: every op of the catalogue, equally likely, or (twice as likely) a call of an
#: earlier diagram
_CHOICES = (*sorted(ops.OPS), "call", "call")
_CONSTANTS = ("0.5", "inf", "(-inf)", "1e-05", "(-2)", "0.0")
#: mask fills: every accumulator padding value (0 for sums and contraction factors, -inf for max and
#: exponential scores, inf for min, 1 for products) and values that are none of them
_FILLS = ("0", "(-inf)", "0", "(-inf)", "inf", "1", "0.5", "(-2)")  # the pads of sums and exponentials likeliest
#: normalisations the library rewrites, with a following contraction, into one ncontract box
_NORMS = ("softmax", "l2norm", "rmsnorm")

Typed = tuple[str, tuple[str, ...]]  # source text and its axes (as a set, in some order)


@dataclass
class _Scope:
    """What a drawn expression may refer to: axes with sizes, arrays, earlier diagrams."""

    sizes: dict[str, int | None]
    env: dict[str, tuple[str, ...]] = field(default_factory=dict)
    diagrams: list[Diagram] = field(default_factory=list)

    @property
    def nameable(self) -> tuple[str, ...]:
        """The axes a box may name: all but the batch axis, which only calls weave."""
        return tuple(sorted(a for a in self.sizes if a != _BATCH))


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


def _affine(draw: Draw, axes: tuple[str, ...]) -> str:
    """A conjunction of one or two comparisons of the kind causal and windowed masks write
    (``a >= b``, ``a - b < 3``, ``2 * a + 1 >= b``, ``b < 5``), or one in three a disjunction
    of such a conjunction and one more comparison, as prefix-LM and window-with-sinks masks
    write (``a >= b or b < 5``)."""
    def one() -> str:
        a, b = draw(st.permutations(axes))[:2] if len(axes) > 1 else (axes[0], axes[0])
        left = draw(st.sampled_from((a, f"{a} - {b}", f"2 * {a} + 1", f"{a} + 3")))
        right = b if left == a or left.startswith(("2", f"{a} +")) else str(draw(st.integers(0, 20)))
        return f"{left} {draw(st.sampled_from(('>=', '<=', '>', '<')))} {right}"

    conjunction = one() if draw(st.booleans()) else f"{one()} and {one()}"
    return conjunction if draw(st.integers(0, 2)) else f"{conjunction} or {one()}"


def _mask(draw: Draw, scope: _Scope, operand: Typed) -> Typed:
    """``operand`` under a where mask over its own axes and maybe one more that an array in
    scope carries, with a drawn fill."""
    text, axes = operand
    own = [a for a in axes if a in scope.nameable]
    bound = sorted({a for t in scope.env.values() for a in t if a in scope.nameable})  # sized by an input
    target = tuple(dict.fromkeys(_subset(draw, own, min_size=min(1, len(own)), max_size=2)
                                 + _subset(draw, bound, max_size=1)))
    if not target:
        return operand
    pred = _affine(draw, target) if draw(st.integers(0, 3)) else _predicate(draw, target, 1)
    fill = draw(st.sampled_from(_FILLS))
    return f"where[{' '.join(target)}]({pred}, {text}, {fill})", tuple(dict.fromkeys(axes + target))


def _masked_often(draw: Draw, scope: _Scope, operand: Typed) -> Typed:
    """An operand of a box that consumes or mixes axes: masked one time in three."""
    return _mask(draw, scope, operand) if draw(st.integers(0, 2)) == 2 else operand


def _scalar(draw: Draw, scope: _Scope) -> Typed:
    """A constant or an axis size used as a scalar."""
    choice = draw(st.integers(0, 2))
    if choice == 0:
        return draw(st.sampled_from(_CONSTANTS)), ()
    if choice == 1:
        return draw(st.sampled_from(sorted(scope.sizes))), ()
    # exact in float32 and not subnormal there, so a lowering in f32 means the same constant
    value = draw(st.floats(0.0, 1e6, width=32, allow_subnormal=False) | st.integers(0, 100).map(float))
    return repr(value), ()


def _array(draw: Draw, scope: _Scope) -> Typed:
    """A name in scope, the most recent bindings likeliest (so bindings share them), or a
    scalar where nothing is in scope."""
    if not scope.env:
        return _scalar(draw, scope)
    names = list(scope.env)
    recent = names[-3:]
    name = draw(st.sampled_from(recent[::-1]) if draw(st.booleans()) else st.sampled_from(names))
    return name, scope.env[name]


def _integer(draw: Draw, scope: _Scope, avoid: str | None = None) -> Typed:
    """An integer operand (a comparison's, a gather's positions): an index box over axes other
    than ``avoid``, or an integer constant."""
    free = [a for a in scope.nameable if a != avoid]
    if not free or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(("0", "2", "(-1)"))), ()
    target = _subset(draw, free, min_size=1, max_size=2)
    return f"index[{' '.join(target)}]({_index_expr(draw, target, 2)})", target


def _operand(draw: Draw, scope: _Scope, depth: int) -> Typed:
    """An operand of a box: mostly an array in scope, sometimes a nested box (depth > 0) or a
    scalar; now and then masked (``_mask``)."""
    choice = draw(st.integers(0, 7))
    if choice == 6 and depth > 0:
        found = _expr(draw, scope, depth - 1)
    elif choice == 7:
        found = _scalar(draw, scope)
    else:
        found = _array(draw, scope)
    return _mask(draw, scope, found) if draw(st.integers(0, 4)) == 4 else found


def _with_axes(draw: Draw, scope: _Scope, depth: int) -> Typed:
    """An operand with at least one axis a box may name, if the scope has one."""
    first = _operand(draw, scope, depth)
    if any(a != _BATCH for a in first[1]):
        return first
    carrying = [n for n, t in scope.env.items() if any(a != _BATCH for a in t)]
    return (carrying[-1], scope.env[carrying[-1]]) if carrying else first


def _expr(draw: Draw, scope: _Scope, depth: int) -> Typed:
    """Source text of a well-typed expression: one box (any op, or a call) whose operands are
    arrays in scope, scalars or, while ``depth`` lasts, nested expressions."""
    return _box(draw, scope, draw(st.sampled_from(_CHOICES)), depth)


def _box(draw: Draw, scope: _Scope, op: str, depth: int) -> Typed:
    """A box of ``op`` over drawn operands; an op that no operand in scope fits (a rename with
    no axis of the same size free, a reduction where nothing has an axis) gives a simpler box
    or the operand itself, and a join without split parts in scope joins a split it makes."""
    nameable = scope.nameable
    if op in ops.UNARY:
        text, axes = _operand(draw, scope, depth)
        if op == "neg":
            return draw(st.sampled_from((f"(-{text})", f"neg({text})"))), axes
        return f"{op}({text})", axes
    if op in _BINARY:
        (left, la), (right, ra) = _operand(draw, scope, depth), _operand(draw, scope, depth)
        form = _BINARY[op]
        union = tuple(dict.fromkeys(la + ra))
        return (f"{form}({left}, {right})" if form in ("max", "min") else f"({left} {form} {right})"), union
    if op in ops.COMPARE:
        (left, la), (right, ra) = _integer(draw, scope), _integer(draw, scope)
        return f"{op}({left}, {right})", tuple(dict.fromkeys(la + ra))
    if op == "select":
        mask, ma = _box(draw, scope, draw(st.sampled_from(sorted(ops.COMPARE))), depth)
        (left, la), (right, ra) = _operand(draw, scope, depth), _operand(draw, scope, depth)
        return f"select({mask}, {left}, {right})", tuple(dict.fromkeys(ma + la + ra))
    if op == "gather":
        table, axes = _with_axes(draw, scope, depth)
        named = [a for a in axes if a != _BATCH]
        if not named:
            return table, axes
        n = draw(st.sampled_from(named))
        at, pa = _integer(draw, scope, avoid=n)
        return f"gather[{n}]({table}, {at})", ops.result_axes("gather", (axes, pa), (n,))
    if op == "call":
        call = _call(draw, scope, [d for d in scope.diagrams if len(d.out_types) == 1])
        if call is None:
            return _box(draw, scope, "exp", depth)
        callee, text, woven = call
        return text, woven + callee.out_types[0]
    if op in ("where", "index"):
        target = _subset(draw, nameable, min_size=1, max_size=2)
        if op == "index":
            return f"index[{' '.join(target)}]({_index_expr(draw, target, 2)})", target
        (left, la) = _operand(draw, scope, depth)
        (right, ra) = _operand(draw, scope, depth) if draw(st.booleans()) else ("(-inf)", ())
        pred = _predicate(draw, target, 2)
        return f"where[{' '.join(target)}]({pred}, {left}, {right})", tuple(dict.fromkeys(la + ra + target))
    if op == "contract":
        operands = [_masked_often(draw, scope, _operand(draw, scope, depth)) for _ in range(draw(st.integers(1, 3)))]
        union = tuple(dict.fromkeys(a for _, axes in operands for a in axes))
        target = _subset(draw, [a for a in union if a != _BATCH])
        args = ", ".join(t for t, _ in operands)
        return f"contract[{' '.join(target)}]({args})", tuple(a for a in union if a not in target)
    if op == "onehot":
        text, axes = _operand(draw, scope, depth)
        free = [a for a in nameable if a not in axes]
        if not free:
            return _box(draw, scope, "abs", depth)
        v = draw(st.sampled_from(free))
        return f"onehot[{v}]({text})", (*axes, v)
    if op == "join":
        parted = [n for n, t in scope.env.items() if all(p in t for p in _PARTS)]
        if parted:
            text = draw(st.sampled_from(parted))
            axes = scope.env[text]
        else:  # split, then join into another axis
            text, axes = _box(draw, scope, "split", depth)
        free = [a for a in nameable if a not in axes and a not in _PARTS]
        if not all(p in axes for p in _PARTS) or not free:
            return text, axes
        new = draw(st.sampled_from(free))
        return f"join[{' '.join(_PARTS)} -> {new}]({text})", (*tuple(a for a in axes if a not in _PARTS), new)
    text, axes = _with_axes(draw, scope, depth)
    named = tuple(a for a in axes if a != _BATCH)
    if not named:
        return text, axes  # nothing in scope has an axis to act on
    if op in ("argmax", "topk"):  # topk: k a free axis of declared size at most |e|'s (both declared)
        old = draw(st.sampled_from(named))
        size = scope.sizes[old]
        fits = [a for a in nameable if a not in axes and size is not None and (scope.sizes[a] or size + 1) <= size]
        if op == "argmax" or not fits:
            return f"argmax[{old}]({text})", tuple(a for a in axes if a != old)
        new = draw(st.sampled_from(fits))
        return f"topk[{old} -> {new}]({text})", tuple(new if a == old else a for a in axes)
    if op == "transpose":
        order = draw(st.permutations(axes))
        return f"transpose[{' '.join(order)}]({text})", tuple(order)
    if op == "rename":
        old = draw(st.sampled_from(named))
        fits = [a for a in nameable if a not in axes
                and (None in (scope.sizes[a], scope.sizes[old]) or scope.sizes[a] == scope.sizes[old])]
        if not fits:
            return _box(draw, scope, "transpose", depth)
        new = draw(st.sampled_from(fits))
        return f"rename[{old} -> {new}]({text})", tuple(new if a == old else a for a in axes)
    if op == "split":
        candidates = [a for a in named if a not in _PARTS]
        if any(p in axes for p in _PARTS) or not candidates:
            return text, axes
        old = draw(st.sampled_from(candidates))
        return f"split[{old} -> {' '.join(_PARTS)}]({text})", tuple(a for a in axes if a != old) + _PARTS
    if op == "ncontract":
        text, axes = _masked_often(draw, scope, (text, axes))
        (v, va) = _masked_often(draw, scope, _operand(draw, scope, depth))
        target = _subset(draw, named, min_size=1)
        a1, a2 = draw(st.sampled_from(_A_PARAMS)), draw(st.sampled_from(_A_PARAMS))
        b = draw(st.sampled_from(sorted(ops.NORMALISERS)))
        union = tuple(dict.fromkeys(axes + va))
        kept = tuple(a for a in union if a not in target)
        return f"ncontract[{' '.join(target)}; {a1}, {a2}, {b}]({text}, {v})", kept
    if op in ("cumsum", "linrec"):  # one axis of X; linrec's decay any operand (woven where it lacks axes)
        along = draw(st.sampled_from(named))
        if op == "cumsum":
            return f"cumsum[{along}]({text})", axes
        decay, da = _operand(draw, scope, depth)
        return f"linrec[{along}]({decay}, {text})", tuple(dict.fromkeys(da + axes))
    kind = ops.OPS[op].kind
    assert kind in ("reduce", "normalise"), op
    text, axes = _masked_often(draw, scope, (text, axes))
    named = tuple(a for a in axes if a != _BATCH)
    target = _subset(draw, named, min_size=1)
    kept = tuple(a for a in axes if a not in target) if kind == "reduce" else axes
    return f"{op}[{' '.join(target)}]({text})", kept


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


def _inputs_for_a_call(draw: Draw, callee: Diagram, whole: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """Inputs shaped for ``callee``'s parameters, with extra axes it does not use (the batch
    axis and others) on some of them, so a call weaves it over them."""
    inner = {a.name for a in callee.axes}
    extra = [a for a in (_BATCH, *whole) if a not in inner]
    inputs = []
    for i, param in enumerate(callee.inputs):
        more = _subset(draw, extra, min_size=1 if i == 0 else 0, max_size=2)
        inputs.append((f"X{i}", tuple(draw(st.permutations(more + param.axes)))))
    return inputs


def _bind_call(draw: Draw, scope: _Scope, lines: list[str], index: int, callees: list[Diagram]) -> bool:
    """A let-binding of a call of one of ``callees`` (all its outputs bound); False if none fits."""
    call = _call(draw, scope, callees)
    if call is None:
        return False
    callee, text, woven = call
    names = [f"A{index}_{k}" for k in range(len(callee.out_types))] if len(callee.out_types) > 1 else [f"A{index}"]
    lines.append(f"  {', '.join(names)} = {text}")
    for n, t in zip(names, callee.out_types, strict=True):
        scope.env[n] = woven + t
    return True


def _bind_attention(draw: Draw, scope: _Scope, lines: list[str], index: int) -> bool:
    """``P = norm[t](S)`` then ``A = contract[t](P, V)`` over operands that share an axis t
    (each possibly masked); False if no two operands in scope share one."""
    (s, sa), (v, va) = _with_axes(draw, scope, 0), _with_axes(draw, scope, 0)
    shared = [a for a in sa if a in va and a in scope.nameable]
    if not shared:
        return False
    t = draw(st.sampled_from(shared))
    (s, sa), (v, va) = _masked_often(draw, scope, (s, sa)), _masked_often(draw, scope, (v, va))
    lines.append(f"  P{index} = {draw(st.sampled_from(_NORMS))}[{t}]({s})")
    lines.append(f"  A{index} = contract[{t}](P{index}, {v})")
    scope.env[f"P{index}"] = sa
    scope.env[f"A{index}"] = tuple(a for a in dict.fromkeys(sa + va) if a != t)
    return True


def _bind(draw: Draw, scope: _Scope, lines: list[str], index: int) -> None:
    """One let-binding: a multi-output call or a normalised contraction now and then, else
    one box over the scope."""
    multi = [d for d in scope.diagrams if len(d.out_types) > 1]
    if multi and draw(st.integers(0, 3)) == 3 and _bind_call(draw, scope, lines, index, multi):
        return
    if draw(st.integers(0, 3)) == 3 and _bind_attention(draw, scope, lines, index):
        return
    text, axes = _expr(draw, scope, draw(st.integers(0, 1)))
    lines.append(f"  A{index} = {text}")
    scope.env[f"A{index}"] = axes


def _diagram_text(draw: Draw, name: str, scope: _Scope) -> str:
    whole = sorted(a for a in scope.sizes if a not in (*_PARTS, _BATCH))  # leave the split parts free
    callee = draw(st.sampled_from(scope.diagrams)) if scope.diagrams and draw(st.booleans()) else None
    if callee is not None:  # its first binding calls an earlier diagram, woven over extra axes
        inputs = _inputs_for_a_call(draw, callee, whole)
    else:
        inputs = [(f"X{i}", _subset(draw, whole, min_size=1 if i == 0 else 0, max_size=3))
                  for i in range(draw(st.integers(1, 3)))]
    scope.env = dict(inputs)
    lines: list[str] = []
    called = callee is not None and _bind_call(draw, scope, lines, 0, [callee])
    for i in range(int(called), draw(st.integers(2, 6))):
        _bind(draw, scope, lines, i)
    outs = [_array(draw, scope) if k == 0 and draw(st.booleans()) else _expr(draw, scope, 0)
            for k in range(draw(st.integers(1, 2)))]
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


def _masked_qx(draw: Draw, name: str, rare: bool = False) -> str:
    """``name`` under a ``where[q x]`` mask with a drawn fill two times in three (one in four
    if ``rare``), else as is."""
    masked = draw(st.integers(0, 3)) == 3 if rare else draw(st.integers(0, 2)) != 0
    if not masked:
        return name
    pred = _affine(draw, ("q", "x")) if draw(st.integers(0, 3)) else _predicate(draw, ("q", "x"), 1)
    return f"where[q x]({pred}, {name}, {draw(st.sampled_from(_FILLS))})"


@st.composite
def attention_texts(draw: Draw) -> str:
    """A module with one diagram of the attention family over ``q``, ``x`` and ``d = 4``:
    scores ``S = contract[d](Q, K)`` (maybe transformed), consumed along ``x`` by a
    normalisation then a contraction with ``V`` (``P0``/``A0``, as ``_bind_attention``
    names them), a normalised contraction, a reduction or a contraction, then maybe one more
    box.  Every operand of the consuming boxes, scores and values alike, may be masked over
    ``q`` and ``x`` (``_masked_qx``: causal, windowed and prefix shapes, or any predicate;
    fills equal to each padding value and not)."""
    lines = ["  S = contract[d](Q, K)"]
    scores = "S"
    if draw(st.booleans()):
        lines.append(f"  T = {draw(st.sampled_from(('tanh(S) * 3', 'S * 0.5', 'S - index[q x](q - x)', 'exp(S)')))}")
        scores = "T"
    kind = draw(st.sampled_from(("norm", "ncontract", "norm", "ncontract", "reduce", "contract")))
    out = "q" if kind == "reduce" else "q d"
    if kind == "norm":
        lines.append(f"  P0 = {draw(st.sampled_from(_NORMS))}[x]({_masked_qx(draw, scores)})")
        # masked normalised scores are rare: the lemmas rewrite contract[x](norm[x](S), V) only
        lines.append(f"  A0 = contract[x]({_masked_qx(draw, 'P0', rare=True)}, {_masked_qx(draw, 'V')})")
    elif kind == "ncontract":  # the lemmas' shapes (softmax, l2, rms attention) or any
        known = st.sampled_from((("exp", "exp", "id"), ("id", "square", "sqrt"), ("id", "square", "rms")))
        drawn = st.tuples(st.sampled_from(_A_PARAMS), st.sampled_from(_A_PARAMS),
                          st.sampled_from(sorted(ops.NORMALISERS)))
        a1, a2, b = draw(drawn if draw(st.integers(0, 3)) == 3 else known)
        lines.append(f"  A0 = ncontract[x; {a1}, {a2}, {b}]({_masked_qx(draw, scores)}, {_masked_qx(draw, 'V')})")
    elif kind == "reduce":
        op = draw(st.sampled_from(("sum", "mean", "max", "min", "logsumexp", "prod")))
        lines.append(f"  A0 = {op}[x]({_masked_qx(draw, scores)})")
    else:
        lines.append(f"  A0 = contract[x]({_masked_qx(draw, scores)}, {_masked_qx(draw, 'V')})")
    result = draw(st.sampled_from(("A0", "A0 * 2", "exp(A0)", "A0 + Q" if out == "q d" else "A0")))
    return (f"axis q, x\naxis d = 4\ndiagram att(Q: [q d], K: [x d], V: [x d]) -> [{out}] {{\n"
            + "\n".join(lines) + f"\n  return {result}\n}}\n")


#: lemmas that turn a normalisation then a contraction into one ncontract box (``_bind_attention``)
_LEMMAS = ("softmax_contract", "l2_contract", "rms_contract")


@st.composite
def schedule_steps(draw: Draw, diagram: Diagram) -> list[Rewrite | Partition]:
    """Up to two rewrites with ``_LEMMAS`` (mostly every lemma in turn at a ``P``/``A`` pair
    that ``_bind_attention`` wrote, else one at any one or two bindings), then one to four
    group and stream partitions of the diagram's axes at ``smem``, the first mostly a stream:
    group tiles 1 to 16, any,
    mostly along an output's axis; stream tiles 16 or 32, powers of two as Pallas needs,
    mostly along an axis some box consumes and no output carries; any accumulator or none
    named; padded or not.  Nothing here knows what the kernel admits: it accepts or refuses
    each step."""
    names = [n for let in diagram.body for n in let.names]
    pairs = [(n, "A" + n[1:]) for n in names if n.startswith("P") and "A" + n[1:] in names]
    steps: list[Rewrite | Partition] = []
    for _ in range(draw(st.integers(0, 2)) if names else 0):
        if pairs and draw(st.integers(0, 3)):  # every lemma in turn: the kernel keeps the one that matches
            at = draw(st.sampled_from(pairs))
            steps += [Rewrite(lemma, at) for lemma in draw(st.permutations(_LEMMAS))]
        else:
            at = tuple(draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True)))
            steps.append(Rewrite(draw(st.sampled_from(_LEMMAS)), at))
    axes = [a.name for a in diagram.axes]
    outputs = {a for t in diagram.out_types for a in t}
    consumed = sorted({a for let in diagram.body for node in walk(let.expr) if isinstance(node, Box)
                       and ops.is_consuming(node.op) for a in node.target} - outputs) or axes
    for k in range(draw(st.integers(1, 4))):
        kind = "stream" if k == 0 and draw(st.integers(0, 3)) else draw(st.sampled_from(("stream", "group")))
        tile = draw(st.sampled_from((16, 16, 32) if kind == "stream" else (1, 2, 3, 8, 16)))
        via = draw(st.none() | st.sampled_from(sorted(ops.ACCUMULATORS))) if kind == "stream" else None
        likely = consumed if kind == "stream" else sorted(outputs) or axes
        axis = draw(st.sampled_from(likely if draw(st.integers(0, 3)) else axes))
        steps.append(Partition(kind, axis, tile, "smem", via, draw(st.booleans())))
    return steps


@st.composite
def module_texts(draw: Draw, max_diagrams: int = 3) -> str:
    """Source text of a random well-typed module (axes, diagrams, maybe a lemma and a theorem)."""
    names = _subset(draw, _AXIS_POOL, min_size=2)
    sizes: dict[str, int | None] = {n: draw(st.none() | st.integers(1, 4)) for n in names}
    sizes[_BATCH] = None
    sizes.update(dict.fromkeys(_PARTS))
    axis_lines = [f"axis {n}" + (f" = {s}" if s is not None else "") for n, s in sizes.items()]
    text = "\n".join(axis_lines) + "\n"
    scope = _Scope(sizes)
    for i in range(draw(st.integers(1, max_diagrams))):
        text += _diagram_text(draw, f"g{i}", scope)
        scope.diagrams = list(loads(text).diagrams)
    if draw(st.booleans()):
        scope.env = {f"P{i}": _subset(draw, scope.nameable) for i in range(draw(st.integers(1, 2)))}
        lhs, rhs = _expr(draw, scope, 1), _expr(draw, scope, 1)
        params = ", ".join(f"{n}: [{' '.join(t)}]" for n, t in scope.env.items())
        text += f"lemma l0({params}) : {lhs[0]} = {rhs[0]}\n"
    if draw(st.booleans()):
        text += _theorem_text(draw, "t0", draw(st.sampled_from([d.name for d in scope.diagrams])), scope)
    return text


def modules(max_diagrams: int = 3) -> st.SearchStrategy[Module]:
    """Random well-typed modules, elaborated by ``loads``."""
    return module_texts(max_diagrams).map(loads)


#: the inputs of ``broadcast_texts``'s diagram, every rank over x, y, z, and sizes for them: all at
#: least 2 (an axis of size 1 hides a missing sum over it) and ragged (a swapped axis shows)
_BROADCAST_INPUTS = {"A": ("x",), "c": (), "X": ("x", "y"), "v": ("y",), "Z": ("x", "y", "z"), "u": ("z",),
                     "W": ("y", "z")}
BROADCAST_SIZES = {"x": 3, "y": 2, "z": 4}


def _broadcast_expr(draw: Draw, depth: int) -> tuple[str, frozenset[str]]:
    """A smooth expression over ``_BROADCAST_INPUTS`` and its axes: binary boxes join operands of
    different axes, and the boxes over them act along axes some operand lacks (no unary exp: nested,
    its values outrun what central differences can follow; logsumexp and softmax still read exp)."""
    if depth == 0 or draw(st.integers(0, 4)) == 0:
        name = draw(st.sampled_from(sorted(_BROADCAST_INPUTS)))
        return name, frozenset(_BROADCAST_INPUTS[name])
    kind = draw(st.sampled_from(("binary", "binary", "unary", "reduce", "normalise", "scan", "contract", "where",
                                 "transpose", "size")))
    text, axes = _broadcast_expr(draw, depth - 1)
    if kind in ("binary", "contract", "where"):
        other, more = _broadcast_expr(draw, depth - 1)
        union = axes | more
        if kind == "binary":
            op = draw(st.sampled_from(("+", "-", "*", "max", "min")))
            return (f"{op}({text}, {other})" if op in ("max", "min") else f"({text} {op} {other})"), union
        if kind == "contract":
            target = [a for a in sorted(union) if draw(st.booleans())]
            return f"contract[{' '.join(target)}]({text}, {other})", union - set(target)
        first, second = draw(st.permutations(("x", "y", "z")))[:2]
        return f"where[{first} {second}]({first} < {second}, {text}, {other})", union | {first, second}
    if kind == "unary":
        return f"{draw(st.sampled_from(('tanh', 'sigmoid', 'square', 'silu')))}({text})", axes
    if kind == "size":
        return f"({text} * {draw(st.sampled_from(('x', 'z', '0.5')))})", axes
    if not axes:
        return text, axes
    if kind == "transpose":
        return f"transpose[{' '.join(draw(st.permutations(sorted(axes))))}]({text})", axes
    if kind == "scan":
        along = draw(st.sampled_from(sorted(axes)))
        if draw(st.booleans()):
            return f"cumsum[{along}]({text})", axes
        decay, da = _broadcast_expr(draw, depth - 1)
        return f"linrec[{along}](tanh({decay}), {text})", axes | da
    target = draw(st.lists(st.sampled_from(sorted(axes)), min_size=1, unique=True))
    if kind == "normalise":
        return f"{draw(st.sampled_from(('softmax', 'l2norm', 'rmsnorm')))}[{' '.join(target)}]({text})", axes
    op = draw(st.sampled_from(("sum", "mean", "max", "min", "prod", "logsumexp")))
    return f"{op}[{' '.join(target)}]({text})", axes - set(target)


@st.composite
def broadcast_texts(draw: Draw) -> str:
    """A module holding ``g``, of the inputs ``_BROADCAST_INPUTS``, returning the sum of a
    ``_broadcast_expr`` over its axes (``BROADCAST_SIZES`` sizes them)."""
    text, axes = _broadcast_expr(draw, draw(st.integers(1, 4)))
    params = ", ".join(f"{n}: [{' '.join(t)}]" for n, t in _BROADCAST_INPUTS.items())
    body = f"sum[{' '.join(sorted(axes))}]({text})" if axes else text
    return f"axis x, y, z\ndiagram g({params}) -> [] {{\n  return {body}\n}}\n"
