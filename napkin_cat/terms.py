"""The IR: axes, typed expressions (boxes and wires), diagrams, proof steps, modules.

Every term is an immutable, hashable frozen dataclass.  Source spans are kept on the
terms but excluded from equality, so ``parse(print(m)) == m`` compares meaning, not
layout.  An array type is a tuple of axis names; sizes live in one table per module
(``Axis``), concrete or symbolic (``size=None``).

A diagram is a list of let-bindings whose right-hand sides are expression trees; each
``Box`` or ``Apply`` node of a tree is a box of the neural circuit diagram, each ``Var``
a wire bundle.  ``fold`` is the one generic traversal that evaluation, costing,
lowering and drawing reuse.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Union

from napkin_cat.diagnostics import Span
from napkin_cat.limits import MAX_AXIS_SIZE as MAX_AXIS_SIZE  # re-exported: the IR's limits
from napkin_cat.limits import MAX_MESH_DEVICES as MAX_MESH_DEVICES

Axes = tuple[str, ...]

#: Memory levels from the largest and slowest to the smallest and fastest (paper §2.2).  ``mesh``
#: is the devices together (their HBMs joined by the interconnect): a group partition there is a
#: sharding, a stream partition a ring (README "Past one device").
LEVELS: tuple[str, ...] = ("mesh", "hbm", "l2", "smem", "reg")

#: the one width of integer inputs (segment ids, lengths, page tables, declared ``int``):
#: 32-bit, whatever the float dtype, as the kernels store and read them (``lower``) and the cost
#: model counts them (``cost``; ``cost.hardware`` re-exports both)
INT_DTYPE = "int32"
INT_BYTES = 4

#: the dtype an integer-valued output (a position, an id, a ``floor``: ``schedule.layout.integer_outputs``)
#: is stored in, whatever the kernel's dtype: exact to 2^24 with ±inf kept (in bfloat16 an argmax past 256
#: rounded, and an id a chain's kernel wrote for the next no longer matched its document); the targets
#: write such outputs in it and the cost model prices them at its width
INTEGER_OUTPUT_DTYPE = "float32"

#: the level above one device
MESH = "mesh"


@dataclass(frozen=True)
class Axis:
    """A named axis with a concrete size or ``None`` for a symbolic one."""

    name: str
    size: int | None = None
    span: Span | None = field(default=None, compare=False, repr=False)


# ---- index expressions and predicates (inside `where[...]` and `index[...]`) ----------


@dataclass(frozen=True)
class Idx:
    """The position along an axis: in ``where[q x](q >= x, ...)`` ``q`` is ``Idx('q')``."""

    axis: str


@dataclass(frozen=True)
class IInt:
    value: int


@dataclass(frozen=True)
class IBin:
    """Integer arithmetic on indices: op is one of ``+ - *``."""

    op: str
    left: IndexExpr
    right: IndexExpr


@dataclass(frozen=True)
class Cmp:
    """A comparison of index expressions: op is one of ``>= <= == != > <``."""

    op: str
    left: IndexExpr
    right: IndexExpr


@dataclass(frozen=True)
class Logic:
    """``and``/``or`` of two predicates, or ``not`` of one (``right`` is None)."""

    op: str
    left: Pred
    right: Pred | None = None


IndexExpr = Union[Idx, IInt, IBin]
Pred = Union[Cmp, Logic]


def fold_index[R](expr: IndexExpr, position: Callable[[str], R], integer: Callable[[int], R],
                   arith: Callable[[str, R, R], R]) -> R:
    """The one traversal of an index expression: ``position(axis)`` and ``integer(n)`` at the
    leaves, ``arith(op, left, right)`` for ``+ - *``; each interpreter gives its own three."""
    if isinstance(expr, Idx):
        return position(expr.axis)
    if isinstance(expr, IInt):
        return integer(expr.value)
    return arith(expr.op, fold_index(expr.left, position, integer, arith),
                 fold_index(expr.right, position, integer, arith))


def fold_pred[R](pred: Pred, compare: Callable[[str, IndexExpr, IndexExpr], R],
                 logic: Callable[[str, R, R | None], R]) -> R:
    """The one traversal of an index predicate: ``compare(op, left, right)`` at each comparison,
    ``logic(op, left, right)`` for ``and``/``or`` and ``not`` (``right`` None)."""
    if isinstance(pred, Cmp):
        return compare(pred.op, pred.left, pred.right)
    right = None if pred.right is None else fold_pred(pred.right, compare, logic)
    return logic(pred.op, fold_pred(pred.left, compare, logic), right)


# ---- array expressions -----------------------------------------------------------------


@dataclass(frozen=True)
class Var:
    """A reference to a diagram input or a let-bound array."""

    name: str
    axes: Axes
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Const:
    """A real constant (possibly ``inf`` or ``-inf``); a scalar with no axes."""

    value: float
    span: Span | None = field(default=None, compare=False, repr=False)

    @property
    def axes(self) -> Axes:
        return ()

    def __eq__(self, other: object) -> bool:
        """By the value's ``repr``, as ``match`` compares: 0.0 and -0.0 differ (1/x tells them apart:
        compared as floats, ``kernel.trans`` joined recip(0.0 + A * 0) ≡ recip(-0.0 + A * 0)), and a NaN
        equals itself, so that every term equals itself (theorems, caches and lemma scopes compare terms)."""
        return isinstance(other, Const) and repr(float(self.value)) == repr(float(other.value))

    def __hash__(self) -> int:
        return hash(repr(float(self.value)))


@dataclass(frozen=True)
class Size:
    """The size of an axis used as a scalar, e.g. the ``d`` in ``rsqrt(d)``."""

    axis: str
    span: Span | None = field(default=None, compare=False, repr=False)

    @property
    def axes(self) -> Axes:
        return ()


@dataclass(frozen=True)
class Box:
    """A primitive box from the op catalogue (``napkin_cat.ops``).

    ``target`` are the axes the box names in brackets; ``out`` the axes after ``->``
    (split, join, rename); ``params`` the names after ``;`` (ncontract); ``index`` the
    predicate of ``where`` or the index expression of ``index``.  ``axes`` is the
    inferred result type.
    """

    op: str
    args: tuple[Expr, ...]
    axes: Axes
    target: Axes = ()
    out: Axes = ()
    params: tuple[str, ...] = ()
    index: Pred | IndexExpr | None = None
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Apply:
    """A diagram used as a box, woven over the extra axes ``woven`` of its arguments.

    ``types`` holds one array type per output of the callee, each ``woven + declared``.
    """

    diagram: Diagram
    args: tuple[Expr, ...]
    woven: Axes
    types: tuple[Axes, ...]
    span: Span | None = field(default=None, compare=False, repr=False)

    @property
    def axes(self) -> Axes:
        assert len(self.types) == 1, "a multi-output Apply has no single type"
        return self.types[0]


Expr = Union[Var, Const, Size, Box, Apply]


@dataclass(frozen=True)
class Param:
    """A diagram input: its name and axes; ``integer`` for one declared ``int`` (segment ids,
    lengths, page tables: what comparisons, masks and gathers read); ``written`` for an array an
    earlier kernel of a chain wrote (``cut``): the diagram computing it from the chain's inputs,
    which the finiteness analysis reads its values through (it need not be finite, nor within
    the inputs' range); ``given`` for an input the diagram states equal to an expression of its
    other inputs (``given L = logsumexp[x](S)``: a backward pass reads the forward's saved
    statistic), the diagram claimed only for inputs where it is (``relations``)."""

    name: str
    axes: Axes
    span: Span | None = field(default=None, compare=False, repr=False)
    integer: bool = False
    written: Diagram | None = field(default=None, repr=False)
    given: Expr | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Let:
    """``names = expr``; several names bind the outputs of a multi-output Apply."""

    names: tuple[str, ...]
    expr: Expr
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Diagram:
    """A named diagram: typed inputs, let-bindings, outputs and the axes it uses."""

    name: str
    inputs: tuple[Param, ...]
    body: tuple[Let, ...]
    outputs: tuple[Expr, ...]
    out_types: tuple[Axes, ...]
    axes: tuple[Axis, ...]
    span: Span | None = field(default=None, compare=False, repr=False)

    def axis_sizes(self) -> dict[str, int | None]:
        return {a.name: a.size for a in self.axes}

    def uses_diagrams(self) -> bool:
        """Does some binding or output use a diagram as a box (an ``Apply``)?"""
        return any(isinstance(n, Apply) for e in [*(let.expr for let in self.body), *self.outputs] for n in walk(e))

    def bindings(self) -> dict[str, Expr]:
        """Each single-name binding's expression, by name (a tuple binding's are left out)."""
        return {let.names[0]: let.expr for let in self.body if len(let.names) == 1}

    def binding(self, name: str) -> Let:
        for let in self.body:
            if name in let.names:
                return let
        raise KeyError(name)


# ---- proofs: steps, schedules and declarations --------------------------------------------


@dataclass(frozen=True)
class Rewrite:
    """``rewrite LEMMA at NAME, ...``: replace the named bindings by a lemma instance."""

    lemma: str
    at: tuple[str, ...]
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Partition:
    """``group``/``stream`` AXIS ``by`` TILE [``at`` LEVEL] [``via`` ACC] [``pad``],
    ``split`` AXIS ``by`` TILE [``via`` ACC] [``pad``], or ``scan`` AXIS ``by`` TILE [``at`` LEVEL] [``pad``].

    A group partition tiles an axis that every box weaves (paper R3); a stream
    partition walks an axis in chunks with an accumulator (R4, R5); a split cuts a
    consumed axis in blocks (at ``hbm``) that parallel programs fold into partial
    states, merged afterwards with the accumulator's combine (``kernel.split``); a scan
    partition is a group partition whose tiles run in order, each scan box (cumsum, linrec)
    along the axis starting a chunk from its value before it (``kernel.group``).
    ``tile`` is an integer or the name of a tile-size symbol; ``level`` is where the
    tile lives.
    """

    kind: str
    axis: str
    tile: str | int
    level: str = "smem"
    via: str | None = None
    pad: bool = False
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Place:
    """``place NAME, ... at LEVEL``: keep these arrays at a memory level (R2)."""

    names: tuple[str, ...]
    level: str
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Quantise:
    """``dtype NAME, ... as DTYPE tol T``: a marked approximation, never an equality (R10)."""

    names: tuple[str, ...]
    dtype: str
    tol: float
    span: Span | None = field(default=None, compare=False, repr=False)


Step = Union[Rewrite, Partition, Place, Quantise]


@dataclass(frozen=True)
class Schedule:
    """The decorations on a diagram: partitions (outermost first), placements, dtypes."""

    partitions: tuple[Partition, ...] = ()
    placements: tuple[Place, ...] = ()
    quantisations: tuple[Quantise, ...] = ()

    @property
    def mesh(self) -> tuple[Partition, ...]:
        """The partitions at the ``mesh`` level (across devices), outermost first."""
        return tuple(p for p in self.partitions if p.level == MESH)

    @property
    def split(self) -> Partition | None:
        """The first ``split`` partition (blocks folded by parallel programs, then combined), if any."""
        return next((p for p in self.partitions if p.kind == "split"), None)

    def unsplit(self) -> Schedule:
        """The schedule each program of a split runs on its block: the partitions but the split."""
        return Schedule(tuple(p for p in self.partitions if p.kind != "split"), self.placements, self.quantisations)

    def device(self) -> Schedule:
        """The schedule each device runs: the partitions and placements below the mesh level
        (with no ``mesh`` partition, the schedule itself)."""
        if all(p.level != MESH for p in self.partitions) and all(p.level != MESH for p in self.placements):
            return self
        return Schedule(tuple(p for p in self.partitions if p.level != MESH),
                        tuple(p for p in self.placements if p.level != MESH), self.quantisations)

    def level_of(self, name: str, default: str = "hbm") -> str:
        for place in reversed(self.placements):
            if name in place.names:
                return place.level
        return default


@dataclass(frozen=True)
class KernelDecl:
    """``kernel NAME, ... { steps }`` in a theorem: one kernel of a chain, which writes the named arrays to hbm for
    the kernels after it (``return``: the diagram's outputs; ``kernel.chain``), proved by its own steps."""

    writes: tuple[str, ...]
    steps: tuple[Step, ...]
    span: Span | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class TheoremDecl:
    """``theorem NAME: DIAGRAM { steps [kernel ... { steps }]* }`` as written; the kernel checks it."""

    name: str
    diagram: str
    steps: tuple[Step, ...]
    span: Span | None = field(default=None, compare=False, repr=False)
    kernels: tuple[KernelDecl, ...] = ()


@dataclass(frozen=True)
class LemmaDecl:
    """``lemma NAME(params) : lhs = rhs [when c finite]`` as written; rules.py validates and
    certifies.  ``finite`` names the parameters the lemma holds for only when they are finite."""

    name: str
    params: tuple[Param, ...]
    lhs: Expr
    rhs: Expr
    axes: tuple[Axis, ...]
    span: Span | None = field(default=None, compare=False, repr=False)
    finite: tuple[str, ...] = ()


@dataclass(frozen=True)
class Module:
    """One .ncd file: its uses, its own declarations, and everything in scope."""

    path: str = field(compare=False)
    uses: tuple[str, ...]
    axes: tuple[Axis, ...]
    diagrams: tuple[Diagram, ...]
    theorems: tuple[TheoremDecl, ...] = ()
    lemmas: tuple[LemmaDecl, ...] = ()
    #: everything visible in this module, imported items included (not part of equality)
    scope_diagrams: tuple[Diagram, ...] = field(default=(), compare=False, repr=False)
    scope_axes: tuple[Axis, ...] = field(default=(), compare=False, repr=False)
    scope_lemmas: tuple[LemmaDecl, ...] = field(default=(), compare=False, repr=False)
    #: every file read to build this module (its own, then the ones it uses, transitively)
    scope_files: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def diagram(self, name: str) -> Diagram:
        for d in self.scope_diagrams or self.diagrams:
            if d.name == name:
                return d
        raise KeyError(f"no diagram `{name}` in {self.path}")

    def theorem(self, name: str) -> TheoremDecl:
        for t in self.theorems:
            if t.name == name:
                return t
        raise KeyError(f"no theorem `{name}` in {self.path}")


# ---- the generic fold ------------------------------------------------------------------------



def children(expr: Expr) -> tuple[Expr, ...]:
    """The array sub-expressions of a node (index predicates are not arrays)."""
    if isinstance(expr, (Box, Apply)):
        return expr.args
    return ()


def fold[R](expr: Expr, visit: Callable[[Expr, tuple[R, ...]], R], memo: dict[int, R] | None = None) -> R:
    """Post-order fold: ``visit(node, results_of_children)``; shared nodes visited once."""
    memo = {} if memo is None else memo
    key = id(expr)
    if key not in memo:
        memo[key] = visit(expr, tuple(fold(c, visit, memo) for c in children(expr)))
    return memo[key]


def run_diagram[R](
    diagram: Diagram,
    inputs: Sequence[R],
    visit: Callable[[Expr, tuple[R, ...], Mapping[str, R]], R | tuple[R, ...]],
) -> tuple[R, ...]:
    """Interpret a diagram: bind inputs, run each let through ``visit``, return outputs.

    ``visit(node, child_results, env)`` is called bottom-up on every node; for a ``Var``
    it is given the environment to look the name up in.  A multi-output ``Apply`` returns
    a tuple, which a multi-name ``Let`` unpacks.
    """
    env: dict[str, R] = {p.name: v for p, v in zip(diagram.inputs, inputs, strict=True)}

    def go(expr: Expr) -> R:
        return fold(expr, lambda node, kids: visit(node, kids, env))  # type: ignore[arg-type,return-value]

    for let in diagram.body:
        value = go(let.expr)
        if len(let.names) == 1:
            env[let.names[0]] = value
        else:
            for name, part in zip(let.names, value, strict=True):  # type: ignore[call-overload]
                env[name] = part
    return tuple(go(out) for out in diagram.outputs)


def walk(expr: Expr) -> Iterator[Expr]:
    """Every node of an expression tree, parents before children."""
    yield expr
    for child in children(expr):
        yield from walk(child)


def boxes(diagram: Diagram) -> Iterator[tuple[Let | None, Expr]]:
    """Every Box/Apply node of a diagram with the let it belongs to (None for outputs)."""
    for let in diagram.body:
        for node in walk(let.expr):
            if isinstance(node, (Box, Apply)):
                yield let, node
    for out in diagram.outputs:
        for node in walk(out):
            if isinstance(node, (Box, Apply)):
                yield None, node


def union_axes(*types: Axes) -> Axes:
    """Axes in order of first appearance: how binary boxes broadcast by name."""
    seen: list[str] = []
    for axes in types:
        for a in axes:
            if a not in seen:
                seen.append(a)
    return tuple(seen)


def repeated(value: Expr, along: Axes, axes: Axes = ()) -> Box:
    """``where[along](a == a, value, value)``: ``value`` repeated along axes it lacks, exactly
    (how an inlined call's output keeps the woven axes its body does not use); ``axes`` is the
    result type for callers that know it (else retype the box)."""
    always = Cmp("==", Idx(along[0]), Idx(along[0]))
    return Box("where", (value, value), axes, along, index=always)


def inline_calls(diagram: Diagram, retype: Callable[[Box, tuple[Expr, ...]], Box]) -> Diagram:
    """The diagram with every diagram used as a box (``Apply``) replaced by its body.

    Each callee binding becomes a binding of the caller (its name kept unless it clashes,
    else suffixed ``_2``, ``_3``...); a non-trivial argument is bound first.  Every box is
    rebuilt by ``retype(box, new_args)``, which recomputes its type so that the woven
    axes of a call flow through the inlined boxes by name.  The result uses no ``Apply``.
    """
    taken = {p.name for p in diagram.inputs} | {n for let in diagram.body for n in let.names}
    lets: list[Let] = []
    axes = {a.name: a for a in diagram.axes}

    def bind(name: str, value: Expr, span: Span | None) -> Var:
        fresh = fresh_name(name, taken)
        lets.append(Let((fresh,), value, span))
        return Var(fresh, value.axes)

    def inline(expr: Expr, env: dict[str, Expr]) -> tuple[Expr, ...]:
        if isinstance(expr, Var):
            return (env.get(expr.name, expr),)
        if isinstance(expr, Box):
            return (retype(expr, tuple(inline(a, env)[0] for a in expr.args)),)
        if not isinstance(expr, Apply):
            return (expr,)
        axes.update((a.name, a) for a in expr.diagram.axes if a.name not in axes)
        inner: dict[str, Expr] = {}
        for param, arg in zip(expr.diagram.inputs, expr.args, strict=True):
            value = inline(arg, env)[0]
            inner[param.name] = value if isinstance(value, (Var, Const, Size)) else bind(param.name, value, expr.span)
        for let in expr.diagram.body:
            for n, part in zip(let.names, inline(let.expr, inner), strict=True):
                inner[n] = bind(n, part, let.span)
        return tuple(repeat(inline(o, inner)[0], t) for o, t in zip(expr.diagram.outputs, expr.types, strict=True))

    def repeat(value: Expr, declared: Axes) -> Expr:
        # A call's output that does not depend on an axis of its type (a constant, or an
        # output computed only from arguments that lack a woven axis) is repeated along
        # it, as the evaluator does: where[missing](m == m, value, value) is exactly that.
        missing = tuple(a for a in declared if a not in value.axes)
        return retype(repeated(value, missing), (value, value)) if missing else value

    env: dict[str, Expr] = {}
    for let in diagram.body:
        for n, part in zip(let.names, inline(let.expr, env), strict=True):
            taken.discard(n)
            env[n] = bind(n, part, let.span)
    outputs = tuple(inline(o, env)[0] for o in diagram.outputs)
    return Diagram(diagram.name, diagram.inputs, tuple(lets), outputs, diagram.out_types, tuple(axes.values()),
                   diagram.span)


@dataclass(frozen=True)
class Divides:
    """A side condition ``divisor | dividend`` (a tile divides its axis or outer tile)."""

    divisor: str | int
    dividend: str | int

    def __str__(self) -> str:
        return f"{self.divisor} | {self.dividend}"


def contradiction(constraints: Sequence[Divides]) -> str | None:
    """Why no positive sizes satisfy the divisibility assumptions, else None: they chain an integer c to an
    integer d (c | ... | d) that c does not divide (`sx | 10, 4 | sx`).  Otherwise they are satisfiable: give
    each symbol the lcm of the integers chained into it (1 if none), and every constraint holds."""
    above: dict[str | int, set[str | int]] = {}
    for c in constraints:
        above.setdefault(c.divisor, set()).add(c.dividend)
    for start in (n for n in above if isinstance(n, int)):
        seen: set[str | int] = {start}
        todo: list[str | int] = [start]
        while todo:
            for n in above.get(todo.pop(), ()):
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        for n in seen:
            if isinstance(n, int) and n % start:
                return (f"the tile assumptions {', '.join(map(str, constraints))} chain {start} to {n}, which it does "
                        "not divide: no tile sizes satisfy them (R9)")
    return None


def box_diagram(box: Box) -> Diagram:
    """A box on variable operands as a one-box diagram (its operands the parameters)."""
    params = tuple(Param(a.name, a.axes) for a in box.args if isinstance(a, Var))
    axes = tuple(Axis(a) for a in dict.fromkeys(a for p in params for a in p.axes))
    return Diagram(box.op, params, (), (box,), (box.axes,), axes)


def axes_in_order(inputs: Iterable[Param], exprs: Iterable[Expr]) -> tuple[str, ...]:
    """The axis names a diagram uses, in order of first appearance: its inputs' types, then
    every node of ``exprs`` (its type, a box's brackets, a size's axis, a callee's axes).
    Elaboration orders ``Diagram.axes`` so; a diagram built in code does the same to print
    and parse back to itself."""
    names: list[str] = [a for p in inputs for a in p.axes]
    for expr in exprs:
        for node in walk(expr):
            types = node.types if isinstance(node, Apply) else (node.axes,)
            names.extend(a for ty in types for a in ty)
            if isinstance(node, Box):
                names.extend(node.target + node.out)
            elif isinstance(node, Size):
                names.append(node.axis)
            elif isinstance(node, Apply):
                names.extend(a.name for a in node.diagram.axes)
    return tuple(dict.fromkeys(names))


def fresh_name(base: str, taken: set[str]) -> str:
    """``base``, else ``base_2``, ``base_3``, ...: the first not in ``taken``, which it joins."""
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def integer_names(diagram: Diagram, integer_valued: Callable[[Expr, set[str]], bool]) -> frozenset[str]:
    """The names of ``diagram`` that hold integers: its inputs declared ``int`` (or written integer by an earlier
    kernel of a chain) and each single-named binding ``integer_valued`` judges integer (``ops.integer_valued``,
    given the integer inputs and bindings before it).  The one computation of the set: a chain's cut types the
    arrays it writes by it (``cut``), the targets and the cost model store outputs by it (``schedule.layout``)."""
    integers = {p.name for p in diagram.inputs if p.integer}
    for let in diagram.body:
        if len(let.names) == 1 and integer_valued(let.expr, integers):
            integers.add(let.names[0])
    return frozenset(integers)


def cut(diagram: Diagram, writes: Sequence[tuple[str, ...]],
        integer_valued: Callable[[Expr, set[str]], bool]) -> tuple[Diagram, ...]:
    """The kernels of a chain (``kernel.chain``): kernel k computes the arrays ``writes[k]`` (the last one the
    diagram's outputs) from the diagram's inputs and the arrays the kernels before it wrote.

    Its body is every binding of ``diagram`` (single-named, no ``Apply``: unfolded) that those arrays need and no
    earlier kernel wrote, in the diagram's order (a binding two kernels need is computed by each); its inputs are the
    diagram's inputs it reads, in declared order, then the written arrays it reads, in the order they were written,
    each a ``Param`` whose ``written`` is the diagram computing it from the chain's inputs (so an analysis of the
    kernel knows what values it holds: an array a kernel writes may be infinite).  Run in order, each on those
    values, the kernels compute every written array as the diagram binds it and, last, the diagram's outputs.
    A written array whose binding ``integer_valued`` judges integer (``integer_names``) is ``integer`` in the
    kernels reading it, as the elaborator types the binding.
    ValueError where ``writes`` is not such a chain (each array written once, read by a later kernel, the last
    kernel alone writing ``return``)."""
    lets = {let.names[0]: let for let in diagram.body}
    flat = [n for w in writes for n in w]
    if any(len(let.names) > 1 for let in diagram.body) or diagram.uses_diagrams():
        raise ValueError("the diagram binds several names at once or uses a diagram as a box; unfold it first")
    if not writes or writes[-1] != ("return",) or flat.count("return") != 1:
        raise ValueError("the last kernel, and only it, writes the outputs (`kernel return`)")
    for n in flat[:-1]:
        if n not in lets:
            raise ValueError(f"`{n}` is not a binding of `{diagram.name}` (bindings: {', '.join(lets)})")
        if flat.count(n) > 1:
            raise ValueError(f"`{n}` is written twice; each array is written by one kernel, once")
    integers = integer_names(diagram, integer_valued)
    written: dict[str, Param] = {}
    kernels: list[Diagram] = []
    for k, names in enumerate(writes):
        last = k == len(writes) - 1
        roots = diagram.outputs if last else tuple(Var(n, lets[n].expr.axes) for n in names)
        kernels.append(_piece(diagram, f"{diagram.name}_k{k + 1}", roots, written, last))
        written.update((n, Param(n, lets[n].expr.axes, integer=n in integers,
                                 written=_piece(diagram, n, (Var(n, lets[n].expr.axes),), {}, False)))
                       for n in ([] if last else names))
    for n in (n for n in flat[:-1] if not any(n in {p.name for p in k.inputs} for k in kernels)):
        raise ValueError(f"no later kernel reads `{n}`; write only what the kernels after it need")
    return tuple(kernels)


def _piece(diagram: Diagram, name: str, roots: tuple[Expr, ...], written: Mapping[str, Param], last: bool) -> Diagram:
    """The diagram computing ``roots`` (the outputs when ``last``) from ``diagram``'s inputs and the arrays
    ``written`` before: every binding they need that is not written, in the diagram's order (``cut``)."""
    lets = {let.names[0]: let for let in diagram.body}
    declared = {p.name for p in diagram.inputs}
    needed: set[str] = set()
    read: set[str] = set()
    stack = list(roots)
    while stack:
        for node in walk(stack.pop()):
            if not isinstance(node, Var):
                continue
            if node.name in written or node.name in declared:
                read.add(node.name)
            elif node.name not in needed:
                needed.add(node.name)
                stack.append(lets[node.name].expr)
    inputs = tuple(p for p in diagram.inputs if p.name in read) + tuple(p for n, p in written.items() if n in read)
    body = tuple(let for let in diagram.body if let.names[0] in needed)
    used = set(axes_in_order(inputs, [*(let.expr for let in body), *roots]))
    return Diagram(name, inputs, body, tuple(roots), diagram.out_types if last else tuple(r.axes for r in roots),
                   tuple(a for a in diagram.axes if a.name in used), diagram.span)


def expanded(expr: Expr, defs: Mapping[str, Expr]) -> Expr:
    """``expr`` with every name ``defs`` binds replaced by its expression, recursively: the term
    written out over the inputs (a relation's, ``relations``)."""
    if isinstance(expr, Var) and expr.name in defs:
        return expanded(defs[expr.name], defs)
    if isinstance(expr, (Box, Apply)):
        return replace(expr, args=tuple(expanded(a, defs) for a in expr.args))
    return expr


def relations(inputs: Sequence[Param]) -> dict[str, Expr]:
    """The inputs (a diagram's) given as expressions of the other inputs (``Param.given``), each
    one's expression: those whose expression reads only inputs that are neither given nor written
    (a kernel of a chain that lacks an input a relation reads keeps none of it)."""
    free = {p.name for p in inputs if p.given is None and p.written is None}
    return {p.name: p.given for p in inputs if p.given is not None
            and all(n.name in free for n in walk(p.given) if isinstance(n, Var))}


def relation_diagram(diagram: Diagram, name: str) -> tuple[Diagram, tuple[int, ...]]:
    """The relation giving ``diagram``'s input ``name`` (``relations``) as a diagram of the inputs
    no relation gives, with their positions among ``diagram``'s inputs: what a join evaluates to
    check the relation against the value it feeds ``name``."""
    given = relations(diagram.inputs)
    picked = tuple(k for k, p in enumerate(diagram.inputs) if p.name not in given)
    param = next(p for p in diagram.inputs if p.name == name)
    return Diagram(f"{diagram.name}_{name}", tuple(diagram.inputs[k] for k in picked), (), (given[name],),
                   (param.axes,), diagram.axes), picked


def match_axes(pattern: Axes, actual: Axes, axes: dict[str, str]) -> bool:
    """Extend the injective axis map ``axes`` so that ``pattern`` maps onto ``actual``."""
    if len(pattern) != len(actual):
        return False
    for p, a in zip(pattern, actual, strict=True):
        if axes.get(p, a) != a or (p not in axes and a in axes.values()):
            return False
        axes[p] = a
    return True


def match(pattern: Expr, actual: Expr, vars_: dict[str, Expr], axes: dict[str, str],
          unfold: Callable[[Expr], Expr] = lambda e: e) -> bool:
    """First-order matching of a lemma side against a term, extending ``vars_`` and ``axes`` (the kernel's
    ``match``, trusted: ``kernel.rewrite`` instantiates a lemma where it matches);
    ``unfold`` (the search's, never the kernel's) may look through a let name before comparing."""
    if isinstance(pattern, Var):  # by repr, which tells -0.0 from 0.0 and nan apart (== does not)
        return repr(vars_.setdefault(pattern.name, actual)) == repr(actual)
    actual = unfold(actual)
    if isinstance(pattern, Const):
        return repr(pattern) == repr(actual)
    if isinstance(pattern, Size):
        return isinstance(actual, Size) and match_axes((pattern.axis,), (actual.axis,), axes)
    return (isinstance(pattern, Box) and isinstance(actual, Box) and pattern.op == actual.op
            and pattern.params == actual.params and pattern.index is None and actual.index is None
            and len(pattern.args) == len(actual.args) and len(pattern.target) == len(actual.target)
            and match_axes(pattern.target + pattern.out, actual.target + actual.out, axes)
            and all(match(p, a, vars_, axes, unfold) for p, a in zip(pattern.args, actual.args, strict=True)))
