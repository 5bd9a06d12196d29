"""The canonical printer: IR -> .ncd text, such that ``loads(print_module(m)) == m``.

Parentheses are added exactly where the grammar's precedence needs them, so the printed
tree re-parses to the same tree (property-tested in tests/test_printer.py).
"""

from __future__ import annotations

import math

from napkin_cat import ops
from napkin_cat.terms import (
    Apply,
    Axes,
    Box,
    Cmp,
    Const,
    Diagram,
    Expr,
    Idx,
    IInt,
    IndexExpr,
    LemmaDecl,
    Logic,
    Module,
    Param,
    Partition,
    Place,
    Pred,
    Quantise,
    Rewrite,
    Size,
    Step,
    TheoremDecl,
    Var,
)

__all__ = ["ATOM", "print_diagram", "print_expr", "print_module", "print_step"]

_UNARY_PREC = 3
#: the precedence of an atom: print_expr(e, ATOM) parenthesises any compound e
ATOM = 4


def _number(value: float) -> str:
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0 and math.copysign(1.0, value) < 0:
        return "-0.0"  # its sign matters: recip(-0.0) is -inf
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


def _paren(text: str, prec: int, context: int) -> str:
    return f"({text})" if prec < context else text


def print_expr(expr: Expr, context: int = 0) -> str:
    """An expression, parenthesised for a context of precedence ``context``."""
    if isinstance(expr, Var):
        return expr.name
    if isinstance(expr, Size):
        return expr.axis
    if isinstance(expr, Const):
        return _paren(_number(expr.value), _UNARY_PREC if math.copysign(1.0, expr.value) < 0 else ATOM, context)
    if isinstance(expr, Apply):
        return f"{expr.diagram.name}({', '.join(print_expr(a) for a in expr.args)})"
    assert isinstance(expr, Box)
    if expr.op in ops.INFIX:
        symbol, prec = ops.INFIX[expr.op]
        left, right = expr.args
        return _paren(f"{print_expr(left, prec)} {symbol} {print_expr(right, prec + 1)}", prec, context)
    if expr.op == "neg" and not isinstance(expr.args[0], Const):  # `-2` would re-parse as the constant -2
        return _paren(f"-{print_expr(expr.args[0], _UNARY_PREC)}", _UNARY_PREC, context)
    name = {"maximum": "max", "minimum": "min"}.get(expr.op, expr.op)
    brackets = ""
    if ops.OPS[expr.op].target != "none":
        inside = " ".join(expr.target)
        if ops.OPS[expr.op].arrow:
            inside += " -> " + " ".join(expr.out)
        if expr.params:
            inside += "; " + ", ".join(expr.params)
        brackets = f"[{inside}]"
    args = [print_expr(a) for a in expr.args]
    if expr.op == "where":
        args.insert(0, print_pred(expr.index))  # type: ignore[arg-type]
    elif expr.op == "index":
        args = [print_index(expr.index)]  # type: ignore[arg-type]
    return f"{name}{brackets}({', '.join(args)})"


def print_index(expr: IndexExpr, context: int = 0) -> str:
    if isinstance(expr, Idx):
        return expr.axis
    if isinstance(expr, IInt):
        return _paren(str(expr.value), _UNARY_PREC if math.copysign(1.0, expr.value) < 0 else ATOM, context)
    prec = 2 if expr.op == "*" else 1
    return _paren(f"{print_index(expr.left, prec)} {expr.op} {print_index(expr.right, prec + 1)}", prec, context)


def print_pred(pred: Pred, context: int = 0) -> str:
    if isinstance(pred, Cmp):
        return _paren(f"{print_index(pred.left, 1)} {pred.op} {print_index(pred.right, 1)}", 3, context)
    assert isinstance(pred, Logic)
    if pred.op == "not":
        return _paren(f"not {print_pred(pred.left, 2)}", 2, context)
    prec = 1 if pred.op == "and" else 0
    assert pred.right is not None
    return _paren(f"{print_pred(pred.left, prec)} {pred.op} {print_pred(pred.right, prec + 1)}", prec, context)


def _type(axes: Axes) -> str:
    return "[" + " ".join(axes) + "]"


def _params(params: tuple[Param, ...]) -> str:
    return ", ".join(f"{p.name}: {'int ' if p.integer else ''}{_type(p.axes)}" for p in params)


def print_diagram(diagram: Diagram) -> str:
    given = ", ".join(f"{p.name} = {print_expr(p.given)}" for p in diagram.inputs if p.given is not None)
    lines = [f"diagram {diagram.name}({_params(diagram.inputs)}) -> "
             f"{', '.join(_type(t) for t in diagram.out_types)}{' given ' + given if given else ''} {{"]
    for let in diagram.body:
        lines.append(f"  {', '.join(let.names)} = {print_expr(let.expr)}")
    lines.append(f"  return {', '.join(print_expr(o) for o in diagram.outputs)}")
    lines.append("}")
    return "\n".join(lines)


def print_step(step: Step) -> str:
    if isinstance(step, Rewrite):
        return f"rewrite {step.lemma} at {', '.join(step.at)}"
    if isinstance(step, Partition):
        text = f"{step.kind} {step.axis} by {step.tile}" + ("" if step.kind == "split" else f" at {step.level}")
        if step.via:
            text += f" via {step.via}"
        return text + (" pad" if step.pad else "")
    if isinstance(step, Place):
        return f"place {', '.join(step.names)} at {step.level}"
    assert isinstance(step, Quantise)
    return f"dtype {', '.join(step.names)} as {step.dtype} tol {step.tol!r}"


def print_theorem(theorem: TheoremDecl) -> str:
    body = "".join(f"  {print_step(s)}\n" for s in theorem.steps)
    for k in theorem.kernels:
        body += f"  kernel {', '.join(k.writes)} {{\n" + "".join(f"    {print_step(s)}\n" for s in k.steps) + "  }\n"
    return f"theorem {theorem.name}: {theorem.diagram} {{\n{body}}}"


def print_lemma(lemma: LemmaDecl) -> str:
    when = f" when {', '.join(lemma.finite)} finite" if lemma.finite else ""
    return f"lemma {lemma.name}({_params(lemma.params)}) : {print_expr(lemma.lhs)} = {print_expr(lemma.rhs)}{when}"


def print_module(module: Module) -> str:
    """The canonical text of a module's own items (its ``use``s are printed, not inlined)."""
    parts = [f'use "{u}"' for u in module.uses]
    parts += [f"axis {a.name}" + (f" = {a.size}" if a.size is not None else "") for a in module.axes]
    parts += [print_diagram(d) for d in module.diagrams]
    parts += [print_lemma(lm) for lm in module.lemmas]
    parts += [print_theorem(t) for t in module.theorems]
    return "\n".join(parts) + "\n"
