"""A diagram as a box-and-wire graph: the first half of drawing (a neural circuit diagram).

``build_graph`` folds a ``terms.Diagram`` into the graph a neural circuit diagram shows:
one node per input, per box (``Box`` or ``Apply``) and per output; one edge per array
flowing from a producer's output port into a consumer.  An array is a bundle of wires,
one per axis.  Sub-expressions without arrays (``rsqrt(d)``, ``-inf``) are not wires:
they become part of the label of the box that uses them; bindings no output depends on
are not drawn.  With ``expand=True`` diagrams used as boxes (``Apply``) are inlined by
``ops.inlined``, their arrays carrying the axes they are woven over.

How each wire meets a box is read off the axes (``ops.treatment``): an axis on an
input and on the output that the box does not name *passes over* the box (weaving); an
axis the box names ends at the box, and re-emerges from it if it is also an output axis.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from napkin_cat import ops
from napkin_cat.printer import ATOM, print_expr, print_index, print_pred
from napkin_cat.terms import Apply, Axes, Box, Const, Diagram, Expr, Size, Var, union_axes

__all__ = ["GLYPHS", "BoxText", "Edge", "Graph", "Node", "Port", "box_text", "build_graph"]

#: How each primitive box is drawn: (shape, glyph, whether its target axes are written as a
#: subscript of the glyph).  Softmax is the triangle ◁, as Abbott's Algebraic-NCD draws it
#: (github.com/vtabbott/Algebraic-NCD); a contraction is Σ with the contracted axes below it.
GLYPHS: dict[str, tuple[str, str, bool]] = {
    **{name: ("rect", name, False) for name in ops.UNARY},
    "neg": ("rect", "−", False),
    "add": ("rect", "+", False),
    "sub": ("rect", "−", False),
    "mul": ("rect", "×", False),
    "div": ("rect", "÷", False),
    "maximum": ("rect", "max", False),
    "minimum": ("rect", "min", False),
    "sum": ("rect", "sum", True),
    "max": ("rect", "max", True),
    "min": ("rect", "min", True),
    "prod": ("rect", "prod", True),
    "mean": ("rect", "mean", True),
    "logsumexp": ("rect", "lse", True),
    "softmax": ("triangle", "softmax", True),
    "l2norm": ("rect", "l2norm", True),
    "rmsnorm": ("rect", "rmsnorm", True),
    "cumsum": ("rect", "cumsum", True),
    "linrec": ("rect", "linrec", True),
    "contract": ("rect", "Σ", True),
    "ncontract": ("rect", "Σ", True),  # after its normaliser: ◁ for softmax, else N(a1,a2,b)
    "where": ("rect", "where", False),
    **{name: ("rect", symbol, False) for name, symbol in ops.COMPARE.items()},
    "select": ("rect", "select", False),
    "gather": ("rect", "gather", True),
    "argmax": ("rect", "argmax", True),
    "topk": ("rect", "top-k", True),
    "index": ("rect", "index", False),
    "onehot": ("rect", "onehot", True),
    "split": ("rect", "split", False),
    "join": ("rect", "join", False),
    "rename": ("rect", "rename", False),
    "transpose": ("rect", "transpose", False),
}



@dataclass(frozen=True)
class Port:
    """Output ``index`` of node ``node``."""

    node: int
    index: int = 0


@dataclass
class Node:
    """An input, a box or an output of the drawn diagram.

    ``inputs`` are the ports feeding it in argument order; ``outputs`` the array types it
    produces; ``target`` the axes that end at the box instead of passing over it.
    """

    id: int
    kind: str  # "input" | "box" | "output"
    inputs: list[Port]
    outputs: list[Axes]
    label: str = ""  # drawn as label, then sub as a subscript, then suffix
    sub: str = ""
    suffix: str = ""
    title: str = ""
    shape: str = "rect"  # "rect" | "triangle" | "inner" (a diagram used as a box)
    target: Axes = ()
    name: str | None = None  # for inputs and outputs: the array's name

    def passing(self, in_axes: Sequence[Axes]) -> Axes:
        """The axes woven over this box: on some input and on an output, not targeted."""
        present = union_axes(*in_axes)
        return tuple(a for a in union_axes(*self.outputs) if a in present and a not in self.target)


@dataclass(frozen=True)
class Edge:
    """The array on ``src`` flowing into input ``slot`` of node ``dst``."""

    src: Port
    dst: int
    slot: int


@dataclass
class Graph:
    nodes: list[Node] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    #: array names of ports (let-bound and input names)
    names: dict[Port, str] = field(default_factory=dict)

    def add(self, kind: str, inputs: list[Port], outputs: list[Axes], **kw: object) -> Node:
        node = Node(len(self.nodes), kind, inputs, outputs, **kw)  # type: ignore[arg-type]
        self.nodes.append(node)
        for slot, port in enumerate(inputs):
            self.edges.append(Edge(port, node.id, slot))
        return node

    def axes(self, port: Port) -> Axes:
        return self.nodes[port.node].outputs[port.index]

    def consumers(self, port: Port) -> list[Edge]:
        return [e for e in self.edges if e.src == port]


Wired = Port | Expr  # a port, or an array-free constant (its variables substituted)

_WIRE = Var("·", ())  # how a wire is written inside a box's label


@dataclass(frozen=True)
class BoxText:
    """A box's drawn text ``label`` + subscript ``sub`` + ``suffix``, and its canonical ``title``."""

    label: str
    sub: str = ""
    suffix: str = ""
    title: str = ""

    @property
    def plain(self) -> str:
        return self.label + self.sub + self.suffix


def _with_args(box: Box, args: Sequence[Wired]) -> Box:
    """The box with each wire written ``·`` and each constant argument substituted."""
    return replace(box, args=tuple(_WIRE if isinstance(a, Port) else a for a in args))


def box_text(box: Box, args: Sequence[Wired]) -> BoxText:
    """How a primitive box is labelled.

    Constant arguments are printed into the label, with ``·`` standing for each wire:
    ``contract[d](Q, K) * rsqrt(d)`` draws a box ``· × rsqrt(d)`` after the ``Σ`` box.
    """
    _, glyph, subscript = GLYPHS[box.op]
    if box.op == "ncontract":  # the normalised contraction a1(S_i)/b(Σ a2(S_j)) · V_i (ops.OPS)
        glyph = ("◁" if box.params == ("exp", "exp", "id") else "N(" + ",".join(box.params) + ")") + glyph
    if box.op in ("split", "join", "rename"):
        glyph += f"[{' '.join(box.target)} → {' '.join(box.out)}]"
    sub = " ".join(box.target) if subscript else ""
    consts = not all(isinstance(a, Port) for a in args)
    title = print_expr(_with_args(box, args))
    if box.op in ops.INFIX and consts:  # operands parenthesised as the printer would
        left, right = (print_expr(_WIRE if isinstance(a, Port) else a, ATOM) for a in args)
        return BoxText(f"{left} {glyph} {right}", title=title)
    texts = ["·" if isinstance(a, Port) else print_expr(a) for a in args]
    if box.op == "where":
        return BoxText(f"{glyph}({', '.join([print_pred(box.index), *texts])})", title=title)  # type: ignore[arg-type]
    if box.op == "index":
        return BoxText(f"{glyph}({print_index(box.index)})", title=title)  # type: ignore[arg-type]
    return BoxText(glyph, sub, f"({', '.join(texts)})" if consts else "", title)


def build_graph(diagram: Diagram, expand: bool = False) -> Graph:
    """The box-and-wire graph of a diagram; diagrams used as boxes inlined when ``expand``."""
    if expand:  # the kernel's δ-unfolding, typed by the op catalogue's one typing rule
        diagram = ops.inlined(diagram)
    graph = Graph()
    env: dict[str, Wired] = {}
    for param in diagram.inputs:
        node = graph.add("input", [], [param.axes], name=param.name)
        env[param.name] = Port(node.id)
        graph.names[Port(node.id)] = param.name
    results = _fold(graph, diagram, env)
    for i, result in enumerate(results):
        port = result if isinstance(result, Port) else _const_node(graph, result)
        name = graph.names.get(port) if isinstance(diagram.outputs[i], Var) else None
        graph.add("output", [port], [], name=name)
    return graph


def _const_node(graph: Graph, const: Expr) -> Port:
    """A constant used as an array (a diagram returning ``0``): a box with no inputs."""
    text = print_expr(const)
    return Port(graph.add("box", [], [()], label=text, title=text).id)


def _fold(graph: Graph, diagram: Diagram, env: dict[str, Wired]) -> list[Wired]:
    """Add the boxes of ``diagram`` that its outputs depend on to ``graph``."""
    memo: dict[int, Wired | list[Wired]] = {}
    pending = {name: let for let in diagram.body for name in let.names}

    def lookup(name: str) -> Wired:
        """A let is drawn when first used: bindings no output depends on are not drawn."""
        if name not in env:
            let = pending[name]
            value = go(let.expr)
            for bound, item in zip(let.names, value if isinstance(value, list) else [value], strict=True):
                env[bound] = item
                if isinstance(item, Port):
                    graph.names.setdefault(item, bound)
        return env[name]

    def go(expr: Expr) -> Wired | list[Wired]:
        key = id(expr)
        if key not in memo:
            memo[key] = visit(expr)
        return memo[key]

    def one(expr: Expr) -> Wired:
        result = go(expr)
        assert not isinstance(result, list), "a multi-output diagram used as one argument"
        return result

    def visit(expr: Expr) -> Wired | list[Wired]:
        if isinstance(expr, Var):
            return lookup(expr.name)
        if isinstance(expr, (Const, Size)):
            return expr
        args = [one(a) for a in expr.args]
        ports = [a for a in args if isinstance(a, Port)]
        if isinstance(expr, Box):
            if not expr.axes and not ports:
                return _with_args(expr, args)  # a constant
            text = box_text(expr, args)
            node = graph.add("box", ports, [expr.axes], label=text.label, sub=text.sub, suffix=text.suffix,
                             title=text.title, shape=GLYPHS[expr.op][0], target=expr.target)
            return Port(node.id)
        assert isinstance(expr, Apply)
        declared = union_axes(*(p.axes for p in expr.diagram.inputs), *expr.diagram.out_types)
        node = graph.add("box", ports, list(expr.types), label=expr.diagram.name, title=expr.diagram.name,
                         shape="inner", target=tuple(a for a in declared if a not in expr.woven))
        return [Port(node.id, i) for i in range(len(expr.types))] if len(expr.types) > 1 else Port(node.id)

    return [one(out) for out in diagram.outputs]
