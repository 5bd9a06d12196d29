"""Terms -> numpy: the float64 reference semantics (and the same in float32, ``FLOAT32``),
and the same fold over sympy scalars.

The evaluator defines what a diagram means; every rewrite, schedule and emitted kernel
is checked against it.  Values carry their axis names at run time (``Named``), and every
box broadcasts by name, so weaving a diagram over extra axes needs no special case: the
callee's boxes simply carry the extra axes along.

Documented conventions for awkward inputs (float64):
- ``softmax`` and ``logsumexp`` subtract the running maximum, so large logits stay finite;
- a row that is entirely ``-inf`` (fully masked) gives ``softmax`` = 0 and
  ``logsumexp`` = -inf, and a normalised contraction over it gives 0;
- a row holding ``+inf`` gives ``logsumexp`` = +inf, and ``softmax`` (and the weights of
  ``ncontract[exp, exp, id]``) NaN throughout: exp(inf - inf) in the sum (``exp_shift``);
- ``l2norm``/``rmsnorm`` of an all-zero row, and any normalised contraction whose
  normaliser is 0, give 0.
"""

from __future__ import annotations

import functools
import importlib
import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from napkin_cat import ops
from napkin_cat.diagnostics import NapkinError, error
from napkin_cat.terms import (
    Apply,
    Axes,
    Box,
    Const,
    Diagram,
    Expr,
    IndexExpr,
    Pred,
    Size,
    Var,
    fold_index,
    fold_pred,
    relations,
    run_diagram,
    union_axes,
    walk,
)

__all__ = ["FLOAT32", "FLOAT64", "INDEX_ARITH", "INPUT_RANGE", "MAX_POINTS_EVALUATED", "SYMBOLIC", "Algebra",
           "Interpreter", "Named", "bind_sizes", "einsum_spec", "evaluate", "evaluate_named", "exp_shift",
           "iteration_spaces", "largest_space", "refuse_too_large", "related", "sample_integers", "visitor"]

#: the most points (array positions) one box's iteration space or one input may have in an
#: evaluation: 2^26 float64 values are 512 MiB, and a box holds a few such arrays at once
MAX_POINTS_EVALUATED = 1 << 26


@dataclass(frozen=True)
class Named:
    """An array with one name per axis (the run-time value of a wire bundle)."""

    axes: Axes
    data: Any

    def aligned(self, axes: Axes) -> Any:
        """The data transposed and expanded to broadcast against ``axes`` (a superset)."""
        present = [a for a in axes if a in self.axes]
        data = np.transpose(self.data, [self.axes.index(a) for a in present])
        return data.reshape([data.shape[present.index(a)] if a in self.axes else 1 for a in axes])

    def to(self, axes: Axes) -> Any:
        """The data with its axes in exactly this order (a permutation of ``self.axes``)."""
        assert sorted(axes) == sorted(self.axes), (axes, self.axes)
        return np.transpose(self.data, [self.axes.index(a) for a in axes]) if axes else self.data


def _weights(name: str) -> tuple[str, str, str]:
    """A normalisation's weights (a1, a2, b): it is the normalised contraction a1(x) / b(Σ a2(x))."""
    weights = ops.OPS[name].weights
    assert weights is not None, f"{name} is a normalisation without its weights"
    return weights


class _Library:
    """A library imported on first use: sympy (the symbolic algebra) and scipy.special (the
    float64 algebra's erf and expit) stay unloaded in a process that evaluates neither, such as
    ``napkin check`` whose certificates are all stored (``napkin_cat.cache``)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


sympy: Any = _Library("sympy")
special: Any = _Library("scipy.special")


class Algebra:
    """Scalar semantics: float64 numpy (the reference) or sympy expressions (certify)."""

    symbolic = False
    #: the unary ops, elementwise
    unary: dict[str, Callable[[Any], Any]]

    def __init__(self) -> None:
        #: the binary ops, elementwise on arrays and on single scalars alike
        self.binary: dict[str, Callable[[Any, Any], Any]] = {
            "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
            "maximum": self.maximum, "minimum": self.minimum,
        }

    def asarray(self, value: Any) -> Any:
        raise NotImplementedError

    def maximum(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def minimum(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def reduce(self, name: str, data: Any, axis: tuple[int, ...]) -> Any:
        raise NotImplementedError

    def normalise(self, name: str, data: Any, axis: tuple[int, ...], n: int) -> Any:
        raise NotImplementedError

    def nweights(self, params: tuple[str, ...], data: Any, axis: tuple[int, ...], n: int) -> Any:
        """The weights a1(s_i) / b(Σ_j a2(s_j)) of a normalised contraction."""
        raise NotImplementedError


def _signed(out: Any, negative: Any) -> Any:
    """``out`` (a maximum or minimum) with each zero given the sign ``negative()`` computes from the operands' sign
    bits (IEEE 754-2019, -0 < +0; called only where some result is 0).  ``relu`` is max(x, +0): + 0.0 makes a zero
    +0 at the cost of one add."""
    sign = out + (out == 0) * (0.5 - negative())  # a nonzero value keeps its own sign (no masked ufunc: numpy's
    # where= is ten times slower on a scattered mask)
    fixed = np.copysign(out, sign).astype(np.result_type(out), copy=False)
    return fixed[()] if np.ndim(fixed) == 0 else fixed


def _gelu(x: Any) -> Any:
    return 0.5 * x * (1.0 + special.erf(x / math.sqrt(2.0)))


class _Float64(Algebra):
    def __init__(self) -> None:
        super().__init__()
        self.unary = {
            "exp": np.exp, "log": np.log, "neg": np.negative, "sqrt": np.sqrt,
            "rsqrt": lambda x: 1.0 / np.sqrt(x), "recip": lambda x: 1.0 / x, "square": np.square,
            "abs": np.abs, "tanh": np.tanh, "sigmoid": lambda x: special.expit(x),
            "relu": lambda x: np.maximum(x, 0.0) + 0.0, "gelu": _gelu, "silu": lambda x: x * special.expit(x),
            "sign": np.sign, "floor": np.floor, "id": lambda x: x,
        }

    def asarray(self, value: Any) -> Any:
        return np.asarray(value, dtype=np.float64)

    def maximum(self, a: Any, b: Any) -> Any:
        """IEEE 754-2019 maximum: -0 < +0 (numpy keeps an order-dependent one of equal zeros, XLA does not)."""
        out = np.maximum(a, b)  # a zero maximum has operands <= 0: it is -0 iff no operand is +0
        return _signed(out, lambda: np.signbit(a) & np.signbit(b)) if np.any(out == 0) else out

    def minimum(self, a: Any, b: Any) -> Any:
        """IEEE 754-2019 minimum: -0 < +0."""
        out = np.minimum(a, b)  # a zero minimum has operands >= 0: it is -0 iff an operand is -0
        return _signed(out, lambda: np.signbit(a) | np.signbit(b)) if np.any(out == 0) else out

    def reduce(self, name: str, data: Any, axis: tuple[int, ...]) -> Any:
        if name == "sum":
            return np.sum(data, axis=axis)
        if name == "mean":
            return np.mean(data, axis=axis)
        if name == "prod":
            return np.prod(data, axis=axis)
        if name in ("max", "min"):  # IEEE 754-2019, as ``maximum`` and ``minimum``
            out = (np.max if name == "max" else np.min)(data, axis=axis, initial=-np.inf if name == "max" else np.inf)
            either = np.all if name == "max" else np.any  # -0 iff every entry is <= -0 (max), any is -0 (min)
            return _signed(out, lambda: either(np.signbit(data), axis=axis)) if np.any(out == 0) else out
        assert name == "logsumexp", name
        m = np.max(data, axis=axis, keepdims=True, initial=-np.inf)
        safe = np.where(np.isfinite(m), m, 0.0)
        # log Σ exp(x - m) = log1p(k - 1 + Σ_{x < m} exp(x - m)) with k maxima: no cancellation
        # when the others are tiny (log(1 + 1e-5) lost 11 digits); a non-finite max is the result
        with np.errstate(invalid="ignore", divide="ignore"):
            rest = np.sum(np.where(data == m, 0.0, np.exp(data - safe)), axis=axis, keepdims=True)
            ties = np.sum(data == m, axis=axis, keepdims=True)
            return np.squeeze(np.where(np.isfinite(m), safe + np.log1p(ties - 1 + rest), m), axis=axis)

    def normalise(self, name: str, data: Any, axis: tuple[int, ...], n: int) -> Any:
        return self.nweights(_weights(name), data, axis, n)

    def nweights(self, params: tuple[str, ...], data: Any, axis: tuple[int, ...], n: int) -> Any:
        a1, a2, b = params
        if a1 == a2 == "exp" and b == "id":  # shift invariance (rules: softmax_shift) keeps exp finite; under
            # a sqrt or rms normaliser the weights are not invariant (exp(s - m) / sqrt(Σ exp(s - m)) is
            # exp(-m/2) times exp(s) / sqrt(Σ exp(s))), so those read s itself
            data = data - exp_shift(data, axis)
        top = self.unary[a1](data)
        z = np.sum(self.unary[a2](data), axis=axis, keepdims=True)
        denom = {"id": z, "sqrt": np.sqrt(z), "rms": np.sqrt(z / n)}[b]
        return np.where(denom == 0, 0.0, top / np.where(denom == 0, 1.0, denom))


def exp_shift(data: Any, axis: tuple[int, ...]) -> Any:
    """The shift of exp-normalised weights, exp(s - m) / Σ exp(s - m) (``softmax``, ``ncontract[exp, exp,
    id]``): the maximum m along ``axis`` (kept as 1s), or 0 where it is -inf (a fully masked row gives
    exp(-inf) = 0, so weights 0).  A row whose maximum is +inf (or NaN) is NaN throughout, as the
    formula gives (exp(inf - inf) in Σ): it has no distribution, and unshifted, as exp(s) / Σ exp(s),
    its finite entries would be 0 or NaN by whether exp(s) overflows (s = 100 or 800 beside +inf),
    which ``softmax_shift``'s two sides (s - c at c = -700) do not agree on."""
    m = np.max(data, axis=axis, keepdims=True, initial=-np.inf)
    return np.where(m == -np.inf, 0.0, m)


class _Float32(_Float64):
    """The float64 semantics computed in float32, the lowered kernels' precision: where it and
    FLOAT64 disagree, the answer lies past what f32 arithmetic can hold (an overflow, a weight
    that underflows to 0 against an infinite value), which no f32 kernel can be asked to match."""

    def asarray(self, value: Any) -> Any:
        return np.asarray(value, dtype=np.float32)


class _Symbolic(Algebra):
    symbolic = True

    def __getattr__(self, name: str) -> Any:
        """The sympy-built tables (``unary``, ``_max``, ...), made on first use: creating the
        algebra imports no sympy."""
        if name not in ("unary", "_max", "_min", "_add", "_mul"):
            raise AttributeError(name)
        self._tables()
        return self.__dict__[name]

    def _tables(self) -> None:
        def lift(f: Callable[[Any], Any]) -> Callable[[Any], Any]:
            return np.frompyfunc(f, 1, 1)  # type: ignore[no-any-return]

        half = sympy.Rational(1, 2)
        self.unary = {
            "exp": lift(sympy.exp), "log": lift(sympy.log), "neg": lift(lambda x: -x), "sqrt": lift(sympy.sqrt),
            "rsqrt": lift(lambda x: 1 / sympy.sqrt(x)), "recip": lift(lambda x: 1 / x),
            "square": lift(lambda x: x**2), "abs": lift(sympy.Abs), "tanh": lift(sympy.tanh),
            "sigmoid": lift(lambda x: 1 / (1 + sympy.exp(-x))), "relu": lift(lambda x: sympy.Max(x, 0)),
            "gelu": lift(lambda x: half * x * (1 + sympy.erf(x / sympy.sqrt(2)))),
            "silu": lift(lambda x: x / (1 + sympy.exp(-x))),
            "sign": lift(sympy.sign), "floor": lift(sympy.floor), "id": lambda x: x,
        }
        self._max = np.frompyfunc(sympy.Max, 2, 1)
        self._min = np.frompyfunc(sympy.Min, 2, 1)
        self._add = np.frompyfunc(lambda a, b: a + b, 2, 1)
        self._mul = np.frompyfunc(lambda a, b: a * b, 2, 1)

    def asarray(self, value: Any) -> Any:
        if isinstance(value, float):
            # the decimal the float prints as, exactly (nsimplify rounds 1e-35 to 0 and 1.4142135623730951 to sqrt(2))
            value = sympy.oo if value == math.inf else -sympy.oo if value == -math.inf else \
                sympy.nan if math.isnan(value) else sympy.Rational(repr(value))
        return np.asarray(value, dtype=object)

    def maximum(self, a: Any, b: Any) -> Any:
        return self._max(a, b)

    def minimum(self, a: Any, b: Any) -> Any:
        return self._min(a, b)

    def reduce(self, name: str, data: Any, axis: tuple[int, ...]) -> Any:
        count = math.prod(data.shape[i] for i in axis)
        if name in ("sum", "mean"):
            total = self._fold(self._add, data, axis, sympy.Integer(0))
            return total if name == "sum" else total / count
        if name == "prod":
            return self._fold(self._mul, data, axis, sympy.Integer(1))
        if name == "max":
            return self._fold(self._max, data, axis, -sympy.oo)
        if name == "min":
            return self._fold(self._min, data, axis, sympy.oo)
        assert name == "logsumexp", name
        return self.unary["log"](self._fold(self._add, self.unary["exp"](data), axis, sympy.Integer(0)))

    def _fold(self, ufunc: Any, data: Any, axis: tuple[int, ...], identity: Any) -> Any:
        out = data
        for ax in sorted(axis, reverse=True):
            if out.shape[ax] == 0:
                out = np.full(out.shape[:ax] + out.shape[ax + 1:], identity, dtype=object)
            else:
                out = ufunc.reduce(out, axis=ax)
        return np.asarray(out, dtype=object)

    def normalise(self, name: str, data: Any, axis: tuple[int, ...], n: int) -> Any:
        return self.nweights(_weights(name), data, axis, n)

    def nweights(self, params: tuple[str, ...], data: Any, axis: tuple[int, ...], n: int) -> Any:
        a1, a2, b = params
        z = np.expand_dims(self._fold(self._add, self.unary[a2](data), axis, sympy.Integer(0)), axis)
        f = {"id": lambda v: v, "sqrt": sympy.sqrt, "rms": lambda v: sympy.sqrt(v / n)}[b]
        return self.unary[a1](data) / np.frompyfunc(f, 1, 1)(z)


FLOAT64: Algebra = _Float64()
FLOAT32: Algebra = _Float32()
SYMBOLIC: Algebra = _Symbolic()


# ---- sizes ---------------------------------------------------------------------------------


def bind_sizes(diagram: Diagram, shapes: Sequence[tuple[int, ...]],
               sizes: Mapping[str, int] | None = None) -> dict[str, int]:
    """Sizes of the diagram's axes from declarations, ``sizes`` and the input shapes."""
    bound: dict[str, int] = {}
    for name, value in (sizes or {}).items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
            raise NapkinError(error("eval.size_binding", axis=name, got=value))
        bound[name] = int(value)
    for declared in diagram.axes:
        if declared.size is not None:
            if declared.name in bound and bound[declared.name] != declared.size:
                raise NapkinError(error("eval.size", axis=declared.name, expected=declared.size, name="sizes=",
                                        got=bound[declared.name]))
            bound[declared.name] = declared.size
    if len(shapes) != len(diagram.inputs):
        raise NapkinError(error("eval.arity", diagram=diagram.name, expected=len(diagram.inputs), got=len(shapes)))
    for param, shape in zip(diagram.inputs, shapes, strict=True):
        if len(shape) != len(param.axes):
            raise NapkinError(error("eval.rank", name=param.name, rank=len(param.axes),
                                    axes="[" + " ".join(param.axes) + "]", shape=tuple(shape)))
        for axis, n in zip(param.axes, shape, strict=True):
            if axis in bound and bound[axis] != n:
                raise NapkinError(error("eval.size", axis=axis, expected=bound[axis], name=param.name, got=n))
            bound[axis] = int(n)
    return bound


def iteration_spaces(diagram: Diagram, woven: Axes = ()) -> list[Axes]:
    """The axes of every input and of every box's iteration space (its operands' axes and
    its own), inside the diagrams it uses as boxes too, with the axes they are woven over."""
    spaces = [union_axes(woven, p.axes) for p in diagram.inputs]
    for expr in [let.expr for let in diagram.body] + list(diagram.outputs):
        for node in walk(expr):
            if isinstance(node, Apply):
                spaces += iteration_spaces(node.diagram, union_axes(woven, node.woven))
            elif isinstance(node, Box):
                spaces.append(union_axes(woven, *(a.axes for a in node.args), node.axes))
    return spaces


def largest_space(spaces: Sequence[Axes], sizes: Mapping[str, int]) -> tuple[int, Axes]:
    """The most points among ``spaces`` at ``sizes`` (an axis without a size counts 1), and where."""
    if not spaces:
        return 0, ()
    points = [(math.prod(sizes.get(a, 1) for a in space), space) for space in spaces]
    return max(points, key=lambda found: found[0])


def refuse_too_large(diagram: Diagram, sizes: Mapping[str, int]) -> None:
    """Raise ``NapkinError`` (``eval.too_large``) before allocating anything if evaluating
    ``diagram`` at ``sizes`` would hold more than ``MAX_POINTS_EVALUATED`` points in one box."""
    points, space = largest_space(iteration_spaces(diagram), sizes)
    if points > MAX_POINTS_EVALUATED:
        raise NapkinError(error("eval.too_large", diagram=diagram.name, points=points, axes=" ".join(space),
                                limit=MAX_POINTS_EVALUATED))


def _size(sizes: dict[str, int], axis: str) -> int:
    if axis not in sizes:
        raise NapkinError(error("eval.unbound", axis=axis))
    return sizes[axis]


# ---- the interpreter ---------------------------------------------------------------------------


#: integer index arithmetic and comparisons on numpy position grids
#: index arithmetic, on position grids and on sympy positions alike
INDEX_ARITH: dict[str, Callable[[Any, Any], Any]] = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_COMPARE: dict[str, Callable[[Any, Any], Any]] = {">=": np.greater_equal, "<=": np.less_equal, "==": np.equal,
                                                  "!=": np.not_equal, ">": np.greater, "<": np.less}


def _index(expr: IndexExpr, grids: Mapping[str, Any]) -> Any:
    """An index expression on position grids, in int64 arithmetic throughout (wrapping past 2^63, as
    ``finiteness.INDEX`` assumes): each integer is an int64 array too, so that an expression of
    integers alone is no unbounded Python integer (2^62 · 2^62 · ... wraps, not grows past float64)."""
    shape = (1,) * max((g.ndim for g in grids.values()), default=0)
    return fold_index(expr, grids.__getitem__, lambda n: np.full(shape, n, dtype=np.int64),
                      lambda op, a, b: INDEX_ARITH[op](a, b))


def _pred(pred: Pred, grids: Mapping[str, Any]) -> Any:
    def logic(op: str, left: Any, right: Any) -> Any:
        return np.logical_not(left) if op == "not" else (np.logical_and if op == "and" else np.logical_or)(left, right)

    return fold_pred(pred, lambda op, a, b: _COMPARE[op](_index(a, grids), _index(b, grids)), logic)


def index_grids(axes: Axes, sizes: Mapping[str, int], offsets: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Broadcastable integer position arrays, one per axis (``offsets`` shift a tile)."""
    grids = {}
    for i, axis in enumerate(axes):
        shape = [1] * len(axes)
        shape[i] = sizes[axis]
        grids[axis] = np.arange(sizes[axis]).reshape(shape) + (offsets or {}).get(axis, 0)
    return grids


def _rank_key(row: Any, i: int) -> tuple[Any, ...]:
    """The sort key of position i of a row of sympy numbers: NaN first, then larger first, then
    the smaller position (the order of ``argmax`` and ``topk``)."""
    nan = row[i] is sympy.nan
    return (not nan, 0 if nan else -row[i], i)


def einsum_spec(operands: Sequence[Axes], target: Axes) -> tuple[str, Axes]:
    """The ``np.einsum`` subscripts of a contraction of operands with these axes over
    ``target``, and the result's axes (the others, in order of first appearance)."""
    everything = union_axes(*operands)
    out = tuple(a for a in everything if a not in target)
    letters = {a: chr(ord("a") + i) if i < 26 else chr(ord("A") + i - 26) for i, a in enumerate(everything)}
    return ",".join("".join(letters[a] for a in k) for k in operands) + "->" + "".join(letters[a] for a in out), out


class Interpreter:
    """The fold of ``evaluate``: one method per kind of box (``BY_KIND``), in ``algebra``."""

    def __init__(self, algebra: Algebra, sizes: dict[str, int], offsets: Mapping[str, int] | None = None,
                 full_sizes: Mapping[str, int] | None = None):
        self.alg = algebra
        self.sizes = sizes
        self.offsets = dict(offsets or {})
        self.full_sizes = dict(full_sizes or {})

    def visit(self, node: Expr, kids: tuple[Named, ...], env: Mapping[str, Named]) -> Named | tuple[Named, ...]:
        alg = self.alg
        if isinstance(node, Var):
            return env[node.name]
        if isinstance(node, Const):
            return Named((), alg.asarray(node.value))
        if isinstance(node, Size):
            return Named((), alg.asarray(float(_size({**self.sizes, **self.full_sizes}, node.axis))))
        if isinstance(node, Apply):
            return self.apply(node, kids)
        assert isinstance(node, Box)
        return self.box(node, kids)

    def apply(self, node: Apply, kids: tuple[Named, ...]) -> Named | tuple[Named, ...]:
        outs = run_diagram(node.diagram, kids, self.visit)
        lengths = {a: n for value in (*kids, *outs) for a, n in zip(value.axes, np.shape(value.data), strict=True)}
        results = []
        for out, declared in zip(outs, node.types, strict=True):
            # Axes this call is woven over from further out (a call inside a woven diagram)
            # stay in front.  An output that does not depend on some woven axis (a constant,
            # or computed only from arguments that lack it) is repeated along it.
            axes = tuple(a for a in out.axes if a not in declared) + declared
            data = np.broadcast_to(out.aligned(axes), [lengths[a] for a in axes])
            results.append(Named(axes, np.array(data)))
        return results[0] if len(results) == 1 else tuple(results)

    def box(self, node: Box, kids: tuple[Named, ...]) -> Named:
        with np.errstate(all="ignore"):
            return BY_KIND[ops.OPS[node.op].kind](self, node, kids)

    def unary(self, node: Box, kids: tuple[Named, ...]) -> Named:
        return Named(kids[0].axes, self.alg.unary[node.op](kids[0].data))

    def binary(self, node: Box, kids: tuple[Named, ...]) -> Named:
        alg = self.alg
        axes = union_axes(kids[0].axes, kids[1].axes)
        a, b = kids[0].aligned(axes), kids[1].aligned(axes)
        return Named(axes, np.asarray(alg.binary[node.op](a, b), dtype=a.dtype if alg.symbolic else None))

    def compare(self, node: Box, kids: tuple[Named, ...]) -> Named:
        """1 where the comparison holds, else 0 (integer operands: exact in float64 below 2^53)."""
        axes = union_axes(kids[0].axes, kids[1].axes)
        hit = _COMPARE[ops.COMPARE[node.op]](kids[0].aligned(axes), kids[1].aligned(axes))
        one, zero = (sympy.Integer(1), sympy.Integer(0)) if self.alg.symbolic else (1.0, 0.0)
        return Named(axes, self.alg.asarray(np.where(np.asarray(hit, dtype=bool), one, zero)))

    def select(self, node: Box, kids: tuple[Named, ...]) -> Named:
        """A where the mask is nonzero, else B."""
        axes = union_axes(*(k.axes for k in kids))
        mask, a, b = (k.aligned(axes) for k in kids)
        shape = np.broadcast_shapes(*(np.shape(v) for v in (mask, a, b)))
        data = np.where(np.asarray(mask != 0, dtype=bool), a, b)
        return Named(axes, np.asarray(np.broadcast_to(data, shape), dtype=data.dtype))

    def gather(self, node: Box, kids: tuple[Named, ...]) -> Named:
        """T along n at the positions I, each clamped into [0, |n| - 1] (a fractional position
        is rounded down first): so every position reads some element, as the lowerings clamp.  A
        NaN position (integer arithmetic past float64's range: inf - inf) is no position: it reads
        NaN."""
        table, at = kids
        n = node.target[0]
        axes = ops.result_axes("gather", (table.axes, at.axes), node.target)
        size = table.data.shape[table.axes.index(n)]
        shape = {a: k for v in kids for a, k in zip(v.axes, np.shape(v.data), strict=True)}
        full = [shape[a] for a in axes]
        positions = np.broadcast_to(at.aligned(axes), full)
        if self.alg.symbolic:
            positions = np.vectorize(lambda v: int(sympy.floor(v)), otypes=[np.int64])(positions)
        real = np.asarray(positions, dtype=np.float64)
        nowhere = np.isnan(real)
        positions = np.clip(np.floor(np.where(nowhere, 0.0, real)), 0, size - 1).astype(np.int64)
        source = np.broadcast_to(table.aligned((*axes, n)), [*full, size])
        data = np.take_along_axis(source, positions[..., None], axis=-1)[..., 0]
        return Named(axes, np.asarray(np.where(nowhere, np.nan, data) if nowhere.any() else data))

    def topk(self, node: Box, kids: tuple[Named, ...]) -> Named:
        """The positions along e ranked by value, larger first, a NaN above every number, equal
        values (-0 and +0, two NaNs) by position, the smaller first: a stable sort, exact.
        argmax[e] keeps the first (e leaves); topk[e -> k] the first |k|, along k in e's place."""
        (x,) = kids
        (axis,) = node.target
        at = x.axes.index(axis)
        rows = np.moveaxis(np.asarray(x.data), at, -1)
        size = rows.shape[-1]
        count = _size(self.sizes, node.out[0]) if node.out else 1
        if count > size:
            raise NapkinError(error("eval.topk_size", axis=axis, k=node.out[0], count=count, size=size))
        if self.alg.symbolic:  # exact comparisons of sympy numbers, row by row
            flat = rows.reshape(-1, size)
            order = np.array([sorted(range(size), key=functools.partial(_rank_key, row)) for row in flat],
                             dtype=np.int64).reshape(rows.shape)
        else:
            real = np.asarray(rows, dtype=np.float64)
            nan = np.isnan(real)  # lexsort is stable: equal keys keep the smaller position first
            order = np.lexsort((np.where(nan, 0.0, -real), ~nan), axis=-1)
        picked = (order[..., :count] + self.offsets.get(axis, 0)).astype(np.float64)
        if self.alg.symbolic:
            picked = np.vectorize(sympy.Integer, otypes=[object])(picked.astype(np.int64))
        if not node.out:
            return Named(x.axes[:at] + x.axes[at + 1:], self.alg.asarray(picked[..., 0]))
        axes = ops.result_axes(node.op, (x.axes,), node.target, node.out)
        return Named(axes, self.alg.asarray(np.moveaxis(picked, -1, at)))

    def reduce(self, node: Box, kids: tuple[Named, ...]) -> Named:
        arg = kids[0]
        pos = tuple(arg.axes.index(a) for a in node.target)
        return Named(tuple(a for a in arg.axes if a not in node.target), self.alg.reduce(node.op, arg.data, pos))

    def normalise(self, node: Box, kids: tuple[Named, ...]) -> Named:
        arg = kids[0]
        pos = tuple(arg.axes.index(a) for a in node.target)
        n = math.prod(arg.data.shape[i] for i in pos)
        return Named(arg.axes, self.alg.normalise(node.op, arg.data, pos, n))

    def scan(self, node: Box, kids: tuple[Named, ...]) -> Named:
        """The recurrence run position by position along the named axis, as its definition reads
        (ops.OPS): h[0] = X[0] (+0.0 for a -0.0), h[t] = A[t]·h[t-1] + X[t] (``cumsum``: A = 1, no product)."""
        axes = union_axes(*(k.axes for k in kids))
        at = axes.index(node.target[0])
        x = np.moveaxis(kids[-1].aligned(axes), at, 0)
        decay = np.moveaxis(kids[0].aligned(axes), at, 0) if node.op == "linrec" else None
        # X[0], a -0.0 as +0.0: a running sum starts from +0, as `sum` does and XLA's scans past one position
        h = [x[0] if self.alg.symbolic else x[0] + 0.0]
        for t in range(1, x.shape[0]):
            h.append((h[-1] if decay is None else decay[t if decay.shape[0] > 1 else 0] * h[-1]) + x[t])
        # every position has the operands' broadcast shape, the decay's axes included where the scan
        # runs over one position and X[0] alone is the value (linrec[a](D: [w b], X: [a b]) at |a| = 1)
        shape = x.shape[1:] if decay is None else np.broadcast_shapes(x.shape[1:], decay.shape[1:])
        data = np.stack([np.broadcast_to(v, shape) for v in h])
        return Named(axes, np.moveaxis(data, 0, at))

    def contract(self, node: Box, kids: tuple[Named, ...]) -> Named:
        operands = list(kids)
        if node.op == "ncontract":
            s = operands[0]
            pos = tuple(s.axes.index(a) for a in node.target)
            n = math.prod(s.data.shape[i] for i in pos)
            operands[0] = Named(s.axes, self.alg.nweights(node.params, s.data, pos, n))
        spec, out = einsum_spec([k.axes for k in operands], node.target)
        if self.alg.symbolic:
            data = np.einsum(spec, *(k.data for k in operands), dtype=object)
        else:  # operands multiplied in their order, pairwise: einsum's own path depends on the shapes (of
            # X^5 [x], c [q x], Y^5 [x] it multiplies the vectors first at q = 4, c first at q = 1, so a
            # group of q by 1 would turn an overflow finite), and a value must not depend on a tile
            path = ["einsum_path", *[(0, 1)] * (len(operands) - 1)] if len(operands) > 2 else False
            data = np.einsum(spec, *(k.data for k in operands), optimize=path)
        return Named(out, np.asarray(data))

    def indexed(self, node: Box, kids: tuple[Named, ...]) -> Named:
        grids = index_grids(node.target, {a: _size(self.sizes, a) for a in node.target}, self.offsets)
        if node.op == "index":
            assert node.index is not None
            value = np.broadcast_to(_index(node.index, grids), [self.sizes[a] for a in node.target])  # type: ignore[arg-type]
            return Named(node.target, self.alg.asarray(value.astype(np.float64)) if not self.alg.symbolic
                         else np.asarray(value, dtype=object) * sympy.Integer(1))
        a, b = kids
        axes = union_axes(a.axes, b.axes, node.target)
        mask = Named(node.target, np.broadcast_to(_pred(node.index, grids), [self.sizes[x] for x in node.target]))  # type: ignore[arg-type]
        return Named(axes, np.where(mask.aligned(axes), a.aligned(axes), b.aligned(axes)))

    def onehot(self, node: Box, kids: tuple[Named, ...]) -> Named:
        """1 where the position along the new axis equals the operand's value, else 0; a value
        that is no position (fractional, negative, or past the end) gives a row of zeros."""
        arg = kids[0]
        axes = arg.axes + node.target
        n = _size(self.sizes, node.target[0])
        positions = np.arange(n) + self.offsets.get(node.target[0], 0)
        hit = np.equal(arg.aligned(axes), positions.reshape((1,) * len(arg.axes) + (n,)))
        one, zero = (sympy.Integer(1), sympy.Integer(0)) if self.alg.symbolic else (1.0, 0.0)
        return Named(axes, self.alg.asarray(np.where(hit.astype(bool), one, zero)))

    def reshape(self, node: Box, kids: tuple[Named, ...]) -> Named:
        arg = kids[0]
        shape = dict(zip(arg.axes, arg.data.shape, strict=True))
        if node.op == "transpose":
            order = tuple(a for a in arg.axes if a not in node.target) + node.target
            return Named(order, arg.to(order))
        if node.op == "rename":
            src, dst = node.target[0], node.out[0]
            if dst in self.sizes and self.sizes[dst] != shape[src]:
                raise NapkinError(error("eval.size", axis=dst, expected=self.sizes[dst], name=f"rename[{src} -> {dst}]",
                                        got=shape[src]))
            self.sizes.setdefault(dst, shape[src])
            return Named(tuple(dst if a == src else a for a in arg.axes), arg.data)
        old, new = node.target, node.out
        position = min(arg.axes.index(a) for a in old)
        kept = [a for a in arg.axes if a not in old]
        before, after = tuple(kept[:position]), tuple(kept[position:])
        data = arg.to(before + old + after)
        total = math.prod(shape[a] for a in old)
        parts = [self.sizes.get(a) for a in new]
        unknown = [i for i, p in enumerate(parts) if p is None]
        if len(unknown) == 1:
            known = math.prod(p for p in parts if p is not None)
            parts[unknown[0]] = total // known if known and total % known == 0 else None
        if any(p is None for p in parts) or math.prod(parts) != total:  # type: ignore[arg-type]
            raise NapkinError(error("type.split_sizes", axis=" ".join(old), parts=" ".join(new),
                                    sizes=" x ".join("?" if p is None else str(p) for p in parts), total=total))
        for axis, p in zip(new, parts, strict=True):
            self.sizes.setdefault(axis, p)  # type: ignore[arg-type]
        shape_out = [shape[a] for a in before] + parts + [shape[a] for a in after]
        return Named(before + new + after, data.reshape(shape_out))


#: how the interpreter evaluates each kind of box (``ops.OpInfo.kind``); a test checks that every
#: op's kind has an entry here and in every other interpreter's table
BY_KIND: dict[str, Callable[[Interpreter, Box, tuple[Named, ...]], Named]] = {
    "unary": Interpreter.unary, "binary": Interpreter.binary, "reduce": Interpreter.reduce,
    "compare": Interpreter.compare, "select": Interpreter.select, "gather": Interpreter.gather,
    "topk": Interpreter.topk,
    "normalise": Interpreter.normalise, "scan": Interpreter.scan, "contract": Interpreter.contract,
    "ncontract": Interpreter.contract,
    "where": Interpreter.indexed, "index": Interpreter.indexed, "onehot": Interpreter.onehot,
    "split": Interpreter.reshape, "join": Interpreter.reshape, "rename": Interpreter.reshape,
    "transpose": Interpreter.reshape,
}


def evaluate_named(diagram: Diagram, inputs: Sequence[Named], sizes: dict[str, int],
                   algebra: Algebra = FLOAT64, offsets: Mapping[str, int] | None = None,
                   full_sizes: Mapping[str, int] | None = None) -> tuple[Named, ...]:
    """Run the fold on named inputs; outputs in the declared axis order.

    For one tile of a schedule: ``sizes`` are the tile's extents, ``offsets`` where the
    tile starts along each axis (index-dependent boxes see global positions) and
    ``full_sizes`` the whole axes (what ``Size`` means).
    """
    outs = run_diagram(diagram, inputs, visitor(sizes, algebra, offsets, full_sizes))
    return tuple(Named(t, out.to(t)) for out, t in zip(outs, diagram.out_types, strict=True))


def visitor(sizes: Mapping[str, int], algebra: Algebra = FLOAT64, offsets: Mapping[str, int] | None = None,
            full_sizes: Mapping[str, int] | None = None) -> Callable[..., Named | tuple[Named, ...]]:
    """The fold's ``visit`` for ``terms.run_diagram`` (arguments as for ``evaluate_named``), for
    callers that wrap it, e.g. to round the arrays a ``dtype`` step names when they are read."""
    return Interpreter(algebra, dict(sizes), offsets, full_sizes).visit


def evaluate(diagram: Diagram, arrays: Sequence[Any], sizes: Mapping[str, int] | None = None,
             algebra: Algebra = FLOAT64) -> Any:
    """Evaluate a diagram on arrays given in declared input order (float64 by default).

    Symbolic axis sizes bind from the arrays; ``sizes`` gives those no input carries.
    Returns one array, or a tuple of arrays for a diagram with several outputs.
    """
    for param, array in zip(diagram.inputs, arrays, strict=False):
        if not algebra.symbolic and np.iscomplexobj(array):  # float64 would drop the imaginary part
            raise NapkinError(error("eval.dtype", name=param.name, kind="complex"))
    data = [algebra.asarray(a) if not algebra.symbolic else np.asarray(a, dtype=object) for a in arrays]
    for param, values in zip(diagram.inputs, data, strict=False):
        if param.integer and not algebra.symbolic:
            real = np.asarray(values, dtype=np.float64)
            wrong = real[~np.isfinite(real) | (real != np.floor(real))]
            if wrong.size:  # NaN and the infinities too: they are no integers
                raise NapkinError(error("eval.integer", name=param.name, value=float(wrong.flat[0])))
    bound = bind_sizes(diagram, [np.shape(d) for d in data], sizes)
    refuse_too_large(diagram, bound)
    inputs = [Named(p.axes, d) for p, d in zip(diagram.inputs, data, strict=True)]
    outs = tuple(o.data for o in evaluate_named(diagram, inputs, bound, algebra))
    return outs[0] if len(outs) == 1 else outs


def related(diagram: Diagram, arrays: Sequence[Any], sizes: Mapping[str, int]) -> list[Any]:
    """``arrays`` (values of ``diagram``'s inputs in declared order, as a seeded test draws them) with
    each input a relation gives (``terms.relations``: ``given L = logsumexp[x](S)``) replaced by its
    expression evaluated in float64 on the others: the diagram claims nothing of other inputs, so every
    test that draws inputs for a diagram draws them through this (README "Proofs")."""
    given = relations(diagram.inputs)
    if not given:
        return list(arrays)
    free = tuple(p for p in diagram.inputs if p.name not in given)
    named = [Named(p.axes, FLOAT64.asarray(a)) for p, a in zip(diagram.inputs, arrays, strict=True)
             if p.name not in given]
    out = list(arrays)
    for k, p in enumerate(diagram.inputs):
        if p.name in given:
            relation = Diagram(f"{diagram.name}_{p.name}", free, (), (given[p.name],), (p.axes,), diagram.axes)
            out[k] = evaluate_named(relation, named, dict(sizes))[0].data
    return out


def sample_integers(rng: np.random.Generator, shape: Sequence[int], runs: int = 4) -> np.ndarray:
    """A random value for an ``int`` input in seeded tests: sorted along its last axis, values in
    ``[0, runs)`` (segment ids in a few documents of ragged lengths, lengths, page numbers), as
    float64; a standard-normal draw would make every comparison false."""
    return np.sort(rng.integers(0, runs, size=tuple(shape)), axis=-1).astype(np.float64)


#: the inputs' range (README "The domain"): 0, or a magnitude float32 holds (its subnormals included)
INPUT_RANGE = (2.0**-149, 2.0**128)


def run(diagram: Diagram, *arrays: Any, sizes: Mapping[str, int] | None = None) -> Any:
    """Evaluate ``diagram`` in float64 on numpy arrays given in declared input order.

    The public entry point (``napkin_cat.run(module.diagram("attention"), Q, K, V)``): symbolic
    sizes bind from the arrays, ``sizes`` gives those no input carries; returns one array, or a
    tuple for several outputs.  A finite input entry outside float32's range (``INPUT_RANGE``:
    what a kernel can read, and what the proofs' finiteness analysis assumes) is refused
    (``eval.range``); ±inf and NaN are evaluated by the evaluator's conventions (outside the
    domain too: proofs claim nothing of them).  ``evaluate`` computes past the range (the
    lemma tests' float64 magnitudes).
    """
    for param, array in zip(diagram.inputs, arrays, strict=False):
        if np.iscomplexobj(array) or not np.issubdtype(np.asarray(array).dtype, np.number):
            continue  # evaluate refuses complex values; anything else is evaluate's to convert
        real = np.abs(np.asarray(array, dtype=np.float64))
        outside = np.argwhere(np.isfinite(real) & (real != 0) & ((real < INPUT_RANGE[0]) | (real > INPUT_RANGE[1])))
        if outside.size:
            at = tuple(int(i) for i in outside[0])
            raise NapkinError(error("eval.range", name=param.name, value=float(np.asarray(array, dtype=np.float64)[at]),
                                    index=list(at)))
    return evaluate(diagram, arrays, sizes=sizes)
