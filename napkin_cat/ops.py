"""The catalogue of primitive boxes: signature, how each box treats its axes, FLOPs.

Each op has one ``OpInfo``.  Its ``kind`` fixes how the box relates to the axes it names
in brackets: a box *weaves* every axis it does not name; it
*consumes* a named axis that is not on its output (sums, contractions); it *mixes* a named
axis that stays on its output (softmax and other normalisations).  The interpreters
(evaluate, cost, lower, draw) are tables keyed by these names; a test checks that every op
has an entry in every table.

FLOPs follow the Napkin paper's convention (§2.2): a contraction over ``k``
elements costs ``2k`` per output element for two operands (``n·k`` for ``n`` operands);
every other box costs ``flops`` per element it reads, a transcendental counting as one.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from napkin_cat.diagnostics import Span
from napkin_cat.terms import Axes, Box, Const, Diagram, Expr, IndexExpr, Pred, Size, Var, inline_calls

__all__ = [
    "ACCUMULATORS",
    "BINARY",
    "COMPARE",
    "INFIX",
    "NORMALISERS",
    "OPS",
    "POSITIONAL",
    "UNARY",
    "Accumulator",
    "OpInfo",
    "accumulators_for",
    "inlined",
    "integer_valued",
    "is_consuming",
    "is_mixing",
    "result_axes",
    "retyped",
    "scans_along",
    "treatment",
    "typed_box",
]


@dataclass(frozen=True)
class OpInfo:
    """What the elaborator and the kernel need to know about one primitive box.

    kind:     unary | binary | compare | select | gather | topk | reduce | normalise | scan | contract |
              ncontract | where | index | onehot | split | join | rename | transpose
    arity:    number of array arguments (None: one or more)
    target:   "none" (no brackets), "required" (named axes), "list" (axis list, may be empty)
    arrow:    the brackets carry ``-> axes`` (split, join, rename)
    nparams:  number of names after ``;`` in the brackets
    flops:    FLOPs per element read (contractions: see module docstring)
    accumulators: names of accumulators (below) that stream the axes this box consumes
    weights:  a normalisation as the weights (a1, a2, b) of a normalised contraction: it is
              a1(x) / b(Σ a2(x)), which every interpreter computes as it does ``ncontract``
    """

    name: str
    kind: str
    arity: int | None
    target: str = "none"
    arrow: bool = False
    nparams: int = 0
    flops: float = 1.0
    accumulators: tuple[str, ...] = ()
    doc: str = ""
    weights: tuple[str, str, str] | None = None


UNARY: dict[str, str] = {
    "exp": "e^x",
    "log": "natural logarithm",
    "neg": "-x",
    "sqrt": "square root",
    "rsqrt": "1/sqrt(x)",
    "recip": "1/x",
    "square": "x^2",
    "abs": "|x|",
    "tanh": "hyperbolic tangent",
    "sigmoid": "1/(1+e^-x)",
    "relu": "max(x, 0)",
    "gelu": "x·Φ(x), the exact (erf) form",
    "silu": "x·sigmoid(x)",
    "sign": "-1, 0 or 1 as x is negative, zero or positive (reverse mode writes max's and relu's slopes with it)",
    "floor": "the largest integer at most x, an integer (±inf and NaN stay as they are); no gradient",
}

#: the binary boxes written infix: their symbol and binding strength (the grammar's
#: precedence, which the printer and the drawing parenthesise by)
INFIX: dict[str, tuple[str, int]] = {"add": ("+", 1), "sub": ("-", 1), "mul": ("*", 2), "div": ("/", 2)}

#: binary elementwise boxes, with their infix symbol where they have one
BINARY: dict[str, str | None] = {
    **{name: symbol for name, (symbol, _) in INFIX.items()},
    "maximum": None,  # written max(A, B)
    "minimum": None,  # written min(A, B)
}

#: comparisons of integer values, elementwise and broadcasting by name: 1 where the comparison
#: holds, else 0 (a mask that ``select`` reads; data-dependent masks such as segment ids)
COMPARE: dict[str, str] = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}

#: the functions b(z) allowed as the aggregator of a normalised contraction
NORMALISERS: dict[str, str] = {
    "id": "b(z) = z",
    "sqrt": "b(z) = sqrt(z)",
    "rms": "b(z) = sqrt(z / n), n the size of the contracted axes",
}


def _ops() -> dict[str, OpInfo]:
    table: dict[str, OpInfo] = {}
    for name, doc in UNARY.items():
        table[name] = OpInfo(name, "unary", 1, doc=doc)
    for name in BINARY:
        table[name] = OpInfo(name, "binary", 2, doc=f"elementwise {name}, broadcasting by axis name")
    for name, symbol in COMPARE.items():
        table[name] = OpInfo(name, "compare", 2,
                             doc=f"1 where A {symbol} B, else 0: integer operands, broadcasting by axis name")
    table["select"] = OpInfo(
        "select", "select", 3,
        doc="select(M, A, B): A where the integer mask M is nonzero, else B (broadcasting by name)",
    )
    table["gather"] = OpInfo(
        "gather", "gather", 2, "required", flops=0.0,
        doc="gather[n](T, I): T read along n at the integer positions I, clamped into [0, |n| - 1]; "
            "n is replaced by the axes of I",
    )
    # selection: positions ranked by value along one axis, larger first; NaN ranks above every number
    # and equal values (-0 = +0, NaN = NaN) rank by position, the smaller first
    table["argmax"] = OpInfo(
        "argmax", "topk", 1, "required", flops=1.0,
        doc="argmax[e](X): the position of the largest entry along e (an integer; ties: the smallest position, "
            "a NaN counts as the largest); e leaves the result",
    )
    table["topk"] = OpInfo(
        "topk", "topk", 1, "required", arrow=True, flops=2.0,
        doc="topk[e -> k](X): the positions of the |k| largest entries along e, largest first (integers; ties: "
            "the smaller position first, a NaN counts as the largest); k takes e's place, |k| <= |e|",
    )
    reduce_docs = {
        "sum": ("sum", ("sum",)),
        "max": ("maximum", ("max",)),
        "min": ("minimum", ("min",)),
        "prod": ("product", ("prod",)),
        "mean": ("mean: sum / n", ("sum",)),
        "logsumexp": ("log Σ exp, computed stably", ("logsumexp",)),
    }
    for name, (doc, accs) in reduce_docs.items():
        flops = 4.0 if name == "logsumexp" else 1.0
        table[name] = OpInfo(name, "reduce", 1, "required", flops=flops, accumulators=accs, doc=doc)
    norm_docs: dict[str, tuple[str, float, tuple[str, str, str]]] = {
        "softmax": ("exp(x - max) / Σ exp(x - max); a fully masked (-inf) row gives 0, one holding +inf NaN", 5.0,
                    ("exp", "exp", "id")),
        "l2norm": ("x / sqrt(Σ x²); an all-zero row gives 0", 3.0, ("id", "square", "sqrt")),
        "rmsnorm": ("x / sqrt(Σ x² / n); an all-zero row gives 0", 3.0, ("id", "square", "rms")),
    }
    for name, (doc, flops, weights) in norm_docs.items():
        table[name] = OpInfo(name, "normalise", 1, "required", flops=flops, doc=doc, weights=weights)
    # scans: one named axis, kept on the output; position t reads positions 0..t (so they mix it)
    table["cumsum"] = OpInfo("cumsum", "scan", 1, "required", flops=1.0,
                             doc="cumsum[t](X): Σ_{s<=t} X[s], the running sum along t")
    table["linrec"] = OpInfo(
        "linrec", "scan", 2, "required", flops=2.0,
        doc="linrec[t](A, X): h[0] = X[0], h[t] = A[t]·h[t-1] + X[t], the first-order linear recurrence "
            "(Σ_{s<=t} Π_{s<r<=t} A[r] · X[s]; cumsum is A = 1)",
    )
    table["contract"] = OpInfo(
        "contract", "contract", None, "list", flops=2.0, accumulators=("sum",),
        doc="Σ over the named axes of the product of the operands (einsum)",
    )
    table["ncontract"] = OpInfo(
        "ncontract", "ncontract", 2, "required", nparams=3, flops=2.0, accumulators=("normalised",),
        doc="normalised contraction Σ_i a1(S_i)/b(Σ_j a2(S_j)) · V_i (2505.09326 Def. 2)",
    )
    table["where"] = OpInfo(
        "where", "where", 2, "required",
        doc="where[axes](predicate on indices, A, B): A where the predicate holds, else B",
    )
    table["index"] = OpInfo("index", "index", 0, "required", flops=0.0,
                            doc="index[axes](expr): the value of an index expression")
    table["onehot"] = OpInfo("onehot", "onehot", 1, "required", flops=1.0,
                             doc="onehot[v](L): adds axis v; 1 where the position along v equals L, else 0")
    table["split"] = OpInfo("split", "split", 1, "required", arrow=True, flops=0.0,
                            doc="split[a -> b c]: a = b·|c| + c (b major)")
    table["join"] = OpInfo("join", "join", 1, "required", arrow=True, flops=0.0,
                           doc="join[b c -> a]: the inverse of split")
    table["rename"] = OpInfo("rename", "rename", 1, "required", arrow=True, flops=0.0,
                             doc="rename[a -> b]: the same values along a new axis name")
    table["transpose"] = OpInfo("transpose", "transpose", 1, "required", flops=0.0,
                                doc="transpose[axes]: reorder the operand's axes")
    return table


OPS: dict[str, OpInfo] = _ops()


@dataclass(frozen=True)
class Accumulator:
    """A streaming accumulator: state, identity, and the recomposition law B(F(x), y) = F(x ⊕ y).

    The law and the identity are lemmas in ``napkin_cat.certify.rules`` that ``certify`` checks;
    the kernel only accepts a stream step whose accumulator is certified.
    """

    name: str
    state: tuple[str, ...]
    identity: tuple[str, ...]
    combine: str
    finalise: str
    doc: str = ""


ACCUMULATORS: dict[str, Accumulator] = {
    a.name: a
    for a in (
        Accumulator("sum", ("s",), ("0",), "s + Σ chunk", "s", "the (+, 0) monoid: sum, mean, contraction"),
        Accumulator("max", ("m",), ("-inf",), "max(m, max chunk)", "m", "the (max, -inf) monoid"),
        Accumulator("min", ("m",), ("inf",), "min(m, min chunk)", "m", "the (min, +inf) monoid"),
        Accumulator("prod", ("p", "w"), ("1", "1"), "p' = p · Π chunk; w' = w · Π sign(x)·(1 + (x - x))", "p",
                    "the (·, 1) monoid, with a flag w, the product of the finite entries' signs: a signed zero where "
                    "they hold a zero (then p is w whatever the other chunks' products overflow or underflow to)"),
        Accumulator(
            "logsumexp", ("m", "l"), ("-inf", "0"),
            "m' = max(m, max chunk); l' = e^(m-m') l + Σ e^(chunk-m')", "m + log l",
            "stable log-sum-exp with a running max",
        ),
        Accumulator(
            "normalised", ("o", "z"), ("0", "0"),
            "o' = o + Σ a1(s) v; z' = z + Σ a2(s)", "o / b(z)",
            "the normalised contraction of 2505.09326 (Lemma 2), exact over the reals",
        ),
        Accumulator(
            "online_softmax", ("m", "l", "o"), ("-inf", "0", "0"),
            "m' = max(m, max s); c = e^(m-m'); l' = c l + Σ e^(s-m'); o' = c o + Σ e^(s-m') v",
            "o / l (id); (o / sqrt(l))·e^(m/4)·e^(m/4) (sqrt; l / n for rms)",
            "the stable (m, l, o) state of online softmax, for ncontract[x; exp, exp, b]",
        ),
    )
}


def accumulators_for(op: str, params: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The accumulators that can stream an axis this box consumes."""
    info = OPS[op]
    if op == "ncontract" and params[:2] == ("exp", "exp"):
        return ("normalised", "online_softmax")
    return info.accumulators


def is_consuming(op: str) -> bool:
    """Does this box remove the axes it names from its output?"""
    return OPS[op].kind in ("reduce", "contract", "ncontract")


def is_mixing(op: str) -> bool:
    """Does one output position read every input position along the named axes?  (A gather
    reads any position along its axis, chosen by data; a selection ranks every position.)"""
    return OPS[op].kind in ("normalise", "scan", "split", "join", "rename", "gather", "topk")


def scans_along(box: Box, axis: str) -> bool:
    """Is ``box`` a scan along ``axis`` (``cumsum[axis]``, ``linrec[axis]``): the one box that mixes
    an axis a ``scan`` partition may cut, each chunk started from the carried state."""
    return OPS[box.op].kind == "scan" and box.target == (axis,)


#: boxes whose value is an integer where their operands are (arithmetic that keeps integers)
_INTEGER_CLOSED = frozenset({"add", "sub", "mul", "maximum", "minimum", "neg", "abs", "sign", "square",
                             "sum", "max", "min", "prod", "split", "join", "rename", "transpose"})


def integer_valued(expr: Expr, integers: Collection[str]) -> bool:
    """Is ``expr`` integer-valued wherever it is evaluated?  ``integers`` names the arrays known to
    hold integers (inputs declared ``int``, bindings of integer expressions).  Comparisons,
    positions (``index``), selections (``argmax``, ``topk``), ``onehot``, ``floor`` of any value
    and axis sizes are integers; integer arithmetic, a select or where of integers and a gather from an integer
    array keep them; everything else is real."""
    if isinstance(expr, Var):
        return expr.name in integers
    if isinstance(expr, Const):
        return math.isfinite(expr.value) and float(expr.value).is_integer()
    if isinstance(expr, Size):
        return True
    if not isinstance(expr, Box):
        return False
    kind = OPS[expr.op].kind
    if kind in ("compare", "index", "onehot", "topk") or expr.op == "floor":
        return True
    if kind == "select":
        return all(integer_valued(a, integers) for a in expr.args[1:])
    if kind == "gather":
        return integer_valued(expr.args[0], integers)
    return (expr.op in _INTEGER_CLOSED or kind == "where") and all(integer_valued(a, integers) for a in expr.args)


def result_axes(op: str, args: tuple[tuple[str, ...], ...], target: tuple[str, ...] = (),
                out: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The typing rule of a primitive box: its result axes from its operands' axes.

    unary/normalise: the operand's axes; binary, compare, select and scan: the union by name
    (order of first appearance); gather[n](T, I): T's axes with n replaced by the axes of I that
    T lacks; where: that union and the target; reduce: the operand minus the target;
    (n)contract: the union minus the target; index: the target; onehot: the operand plus
    the target; transpose: the operand's other axes (woven through it by a call), then the
    target order; split/join/rename, topk: the new axes take the place of the first old one
    (argmax: none, its axis leaves).
    Assumes a well-formed box (the elaborator checks that).
    """
    kind = OPS[op].kind
    have = args[0] if args else ()
    union: list[str] = []
    for axes in args:
        union.extend(a for a in axes if a not in union)
    if kind in ("unary", "normalise"):
        return have
    if kind in ("binary", "compare", "select", "scan"):
        return tuple(union)
    if kind == "gather":  # the axes of T with n replaced by those of I it lacks
        at = have.index(target[0])
        extra = tuple(a for a in args[1] if a not in have)
        return have[:at] + extra + have[at + 1:]
    if kind == "where":
        return tuple(union) + tuple(a for a in target if a not in union)
    if kind == "reduce":
        return tuple(a for a in have if a not in target)
    if kind in ("contract", "ncontract"):
        return tuple(a for a in union if a not in target)
    if kind == "transpose":  # operand axes outside the brackets are woven through, first (as evaluated)
        return tuple(a for a in have if a not in target) + target
    if kind == "index":
        return target
    if kind == "onehot":
        return have + target
    assert kind in ("split", "join", "rename", "topk"), kind
    position = min(have.index(a) for a in target)
    kept = [a for a in have if a not in target]
    return tuple(kept[:position]) + out + tuple(kept[position:])


# ---- typing and how a box treats an axis (the kernel's side conditions read these) ----------

#: boxes whose bracketed axes are read as positions (an index offset), not reduced or moved
POSITIONAL = frozenset({"where", "index", "onehot", "transpose"})


def typed_box(op: str, args: tuple[Expr, ...], target: Axes = (), out: Axes = (), params: tuple[str, ...] = (),
              index: Pred | IndexExpr | None = None, span: Span | None = None) -> Box:
    """A primitive box with its result type from ``result_axes`` (the one typing rule)."""
    return Box(op, args, result_axes(op, tuple(a.axes for a in args), target, out), target, out, params,
               index, span)


def retyped(box: Box, args: tuple[Expr, ...]) -> Box:
    """``box`` over new arguments, its type recomputed by the one typing rule (``typed_box``)."""
    return typed_box(box.op, args, box.target, box.out, box.params, box.index, box.span)


def inlined(diagram: Diagram) -> Diagram:
    """``diagram`` with every call inlined and every box retyped, so that a call's woven
    axes flow through its boxes by name (``terms.inline_calls``): the kernel's ``unfold``,
    and the one inliner every later stage reads a diagram through."""
    return inline_calls(diagram, retyped)


def treatment(box: Box, axis: str) -> str:
    """How a box treats an axis (see the module docstring): weaves | consumes | mixes | absent.

    Index-dependent boxes (where, index, onehot) and transpose keep positions apart, so
    they weave their named axes (a tile passes its offset); split/join/rename mix.
    """
    if axis not in box.axes and axis not in box.target and all(axis not in a.axes for a in box.args):
        return "absent"
    if axis in box.out:
        return "mixes"
    if axis not in box.target or box.op in POSITIONAL:
        return "weaves"
    return "consumes" if is_consuming(box.op) else "mixes"
