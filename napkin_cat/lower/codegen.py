"""Small builders of Python ``ast`` nodes shared by the JAX and Pallas emitters.

Generated code is built as syntax trees and printed with ``ast.unparse``, so it is always well
formed and byte-identical for the same input.  ``Block`` is a list of statements being emitted,
with a ``Namer`` that hands out fresh, valid and unique Python identifiers derived from IR
names (``attention.2.S`` -> ``attention_2_S``).
"""

from __future__ import annotations

import ast
import keyword
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from napkin_cat.terms import fresh_name

__all__ = [
    "Block",
    "Namer",
    "assign",
    "attr",
    "binop",
    "call",
    "const",
    "dict_",
    "function",
    "import_",
    "kw",
    "module",
    "name",
    "subscript",
    "tuple_",
]

Node = ast.expr


def name(ident: str) -> ast.Name:
    return ast.Name(ident, ast.Load())


def attr(dotted: str) -> ast.expr:
    """``jnp.exp`` -> Attribute(Name('jnp'), 'exp')."""
    parts = dotted.split(".")
    node: ast.expr = name(parts[0])
    for part in parts[1:]:
        node = ast.Attribute(node, part, ast.Load())
    return node


def const(value: str | int | float | bool | None) -> ast.expr:
    """A literal; negative numbers print as ``-x`` rather than ``(-x)``."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
        return ast.UnaryOp(ast.USub(), ast.Constant(-value))
    return ast.Constant(value)


def kw(key: str, value: ast.expr) -> ast.keyword:
    return ast.keyword(key, value)


def call(func: str | ast.expr, *args: ast.expr, keywords: Sequence[ast.keyword] = ()) -> ast.Call:
    return ast.Call(attr(func) if isinstance(func, str) else func, list(args), list(keywords))


_OPS: dict[str, ast.operator] = {
    "+": ast.Add(), "-": ast.Sub(), "*": ast.Mult(), "/": ast.Div(), "//": ast.FloorDiv(), "%": ast.Mod(),
}
_CMPS: dict[str, ast.cmpop] = {
    ">=": ast.GtE(), "<=": ast.LtE(), "==": ast.Eq(), "!=": ast.NotEq(), ">": ast.Gt(), "<": ast.Lt(),
}


def binop(left: ast.expr, op: str, right: ast.expr) -> ast.expr:
    """Arithmetic (``+ - * / // %``), comparisons, or ``&``/``|`` on boolean arrays."""
    if op in _CMPS:
        return ast.Compare(left, [_CMPS[op]], [right])
    if op in ("is", "is not"):
        return ast.Compare(left, [ast.Is() if op == "is" else ast.IsNot()], [right])
    if op == "&":
        return ast.BinOp(left, ast.BitAnd(), right)
    if op == "|":
        return ast.BinOp(left, ast.BitOr(), right)
    return ast.BinOp(left, _OPS[op], right)


def tuple_(items: Sequence[ast.expr]) -> ast.Tuple:
    return ast.Tuple(list(items), ast.Load())


def dict_(items: Sequence[tuple[str, ast.expr]]) -> ast.Dict:
    return ast.Dict([ast.Constant(k) for k, _ in items], [v for _, v in items])


def subscript(value: ast.expr, index: ast.expr | Sequence[ast.expr]) -> ast.Subscript:
    slot = index if isinstance(index, ast.expr) else tuple_(list(index))
    return ast.Subscript(value, slot, ast.Load())


def full_slice() -> ast.Slice:
    return ast.Slice()


def assign(targets: str | Sequence[str], value: ast.expr) -> ast.Assign:
    """``a = value`` or ``a, b = value``."""
    if isinstance(targets, str):
        target: ast.expr = ast.Name(targets, ast.Store())
    else:
        target = ast.Tuple([ast.Name(t, ast.Store()) for t in targets], ast.Store())
    return ast.Assign([target], value, lineno=0)


def function(fname: str, args: Sequence[str], body: list[ast.stmt], doc: str | None = None,
             kwonly: Sequence[tuple[str, ast.expr]] = ()) -> ast.FunctionDef:
    """``def fname(args, *, kwonly=default): "doc"; body``."""
    stmts: list[ast.stmt] = [ast.Expr(ast.Constant(doc))] if doc else []
    arguments = ast.arguments(
        posonlyargs=[], args=[ast.arg(a) for a in args], vararg=None,
        kwonlyargs=[ast.arg(k) for k, _ in kwonly], kw_defaults=[v for _, v in kwonly], kwarg=None, defaults=[],
    )
    node = ast.FunctionDef(fname, arguments, stmts + (body or [ast.Pass()]), [], None, None,  # type: ignore[call-overload]
                           lineno=0)
    assert isinstance(node, ast.FunctionDef)
    return node


class Namer:
    """Fresh Python identifiers: sanitised, never a keyword, never reused."""

    def __init__(self, reserved: Sequence[str] = ()):
        self.used: set[str] = set(reserved)

    def fresh(self, hint: str) -> str:
        base = re.sub(r"\W", "_", hint).strip("_") or "v"
        if base[0].isdigit() or keyword.iskeyword(base):
            base = f"v_{base}"
        return fresh_name(base, self.used)


@dataclass
class Block:
    """Statements being emitted, sharing one ``Namer``; ``bind`` names a value.

    Emitted expressions are pure, so ``bind`` reuses the name of an identical expression
    bound earlier in this block or an enclosing one (common subexpressions, e.g. the
    running-max shift that an accumulator's lift uses twice, are computed once).
    """

    namer: Namer
    stmts: list[ast.stmt] = field(default_factory=list)
    bound: dict[str, str] = field(default_factory=dict)

    def bind(self, hint: str, value: ast.expr) -> ast.Name:
        """Emit ``fresh = value`` and return the fresh name (or the name it already has)."""
        if isinstance(value, ast.Name):
            return value
        key = ast.dump(value)
        if key not in self.bound:
            ident = self.namer.fresh(hint)
            self.stmts.append(assign(ident, value))
            self.bound[key] = ident
        return name(self.bound[key])

    def emit(self, stmt: ast.stmt) -> None:
        self.stmts.append(stmt)

    def child(self) -> Block:
        """A nested block (a loop body): same namer, sees the names bound so far."""
        return Block(self.namer, bound=dict(self.bound))


def import_(module_name: str, alias: str | None = None, names: Sequence[str] = ()) -> ast.stmt:
    """``import module as alias`` or, with ``names`` (``"x"`` or ``"x as y"``), ``from module import names``."""
    if names:
        aliases = [ast.alias(*n.split(" as ")) if " as " in n else ast.alias(n) for n in names]
        return ast.ImportFrom(module_name, aliases, 0)
    return ast.Import([ast.alias(module_name, alias)])


def module(doc: str, body: Sequence[ast.stmt]) -> str:
    """A module's source: docstring, then the body (imports first); ends with a newline."""
    stmts: list[ast.stmt] = [ast.Expr(ast.Constant(doc)), *body]
    tree = ast.Module(stmts, [])
    ast.fix_missing_locations(tree)
    return ast.unparse(tree) + "\n"
