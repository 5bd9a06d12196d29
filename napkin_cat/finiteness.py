"""TRUSTED: a sound finiteness analysis, to discharge a lemma's ``when c finite`` condition.

``finite(expr, defs)`` is True only if ``expr`` is a finite real at every position for
every finite real input of its diagram (the proof domain, README "Proofs": inputs are
finite reals, axes have at least one position; ``±inf`` enters only through constants).
It answers False whenever it cannot tell: a ``-inf`` mask, a division, a logarithm or a
square root of something not known to be positive, a binding it cannot see.  The kernel
refuses an instantiation whose matched term it does not vouch for, naming the condition.

Rules (over the reals, with the evaluator's conventions): constants are finite iff they
are; sizes are finite and positive; elementwise ops other than the partial ones below,
reductions, normalisations (a zero normaliser gives 0), contractions, where, reshapes and
onehot give finite values from finite operands, and ``exp`` from finite or ``-inf``
operands (``masked``); ``div``/``recip`` need a nonzero denominator (positive, or the guarded
``d + (1 - square(sign d))``), ``rsqrt``/``log`` a positive operand, ``sqrt`` a non-negative
one; an index expression is integer arithmetic (``+ - *``), so finite.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from napkin_cat import ops
from napkin_cat.terms import Box, Const, Diagram, Expr, Size, Var

__all__ = ["INFINITE", "MASKS", "MASKS_TESTED", "finite", "finite_in", "masked", "narrowed", "unsupported"]

#: elementwise ops finite on finite operands (over the reals)
_TOTAL = frozenset({"exp", "neg", "square", "abs", "sign", "tanh", "sigmoid", "relu", "gelu", "silu",
                    "add", "sub", "mul", "maximum", "minimum"})
#: ops whose value is ≥ 0 / > 0 for finite operands
_NONNEGATIVE = frozenset({"square", "abs", "relu", "exp", "sigmoid", "sqrt"})
_POSITIVE = frozenset({"exp", "sigmoid"})


def finite(expr: Expr, defs: Mapping[str, Expr], inputs: frozenset[str] | set[str] = frozenset()) -> bool:
    """Is ``expr`` finite wherever it is evaluated on finite inputs?  ``defs`` maps binding
    names to their expressions, ``inputs`` names the diagram's inputs (finite by the domain)."""
    if isinstance(expr, Var):
        return expr.name in inputs or (expr.name in defs and finite(defs[expr.name], defs, inputs))
    if isinstance(expr, Const):
        return math.isfinite(expr.value)
    if isinstance(expr, Size):
        return True
    if isinstance(expr, Box) and expr.op == "exp" and masked(expr.args[0], defs, inputs):
        return True  # exp(-inf) = 0: the weights of masked scores, exp(S - L)
    if not isinstance(expr, Box) or not all(finite(a, defs, inputs) for a in expr.args):
        return False  # a diagram used as a box, or an operand that may be infinite
    kind = ops.OPS[expr.op].kind
    if expr.op in _TOTAL or kind in ("reduce", "normalise", "contract", "where", "index", "onehot", "split", "join",
                                     "rename", "transpose"):
        return True
    if expr.op == "recip":
        return _nonzero(expr.args[0], defs, inputs)
    if expr.op in ("rsqrt", "log"):
        return _sign(expr.args[0], defs, inputs) == "positive"
    if expr.op == "div":
        return _nonzero(expr.args[1], defs, inputs)
    if expr.op == "sqrt":
        return _sign(expr.args[0], defs, inputs) in ("positive", "nonnegative")
    if expr.op == "ncontract":  # z = Σ a2(S) ≥ 0 unless a2 is id; b = sqrt needs z ≥ 0
        return expr.params[2] == "id" or expr.params[1] in _NONNEGATIVE
    return False


def masked(expr: Expr, defs: Mapping[str, Expr], inputs: frozenset[str] | set[str] = frozenset()) -> bool:
    """Is every entry of ``expr`` finite or ``-inf`` (a mask) on finite inputs?  A mask is a
    ``-inf`` constant chosen by ``where``, kept by adding finite terms or other masks,
    subtracting finite terms, or scaling by a positive one."""
    if finite(expr, defs, inputs) or (isinstance(expr, Const) and expr.value == -math.inf):
        return True
    if isinstance(expr, Var) and expr.name in defs:
        return masked(defs[expr.name], defs, inputs)
    if not isinstance(expr, Box):
        return False
    if expr.op in ("where", "add"):
        return all(masked(a, defs, inputs) for a in expr.args)
    if expr.op == "sub":
        return masked(expr.args[0], defs, inputs) and finite(expr.args[1], defs, inputs)
    if expr.op == "mul":
        return any(masked(a, defs, inputs) and finite(b, defs, inputs) and _sign(b, defs, inputs) == "positive"
                   for a, b in (expr.args, expr.args[::-1]))
    return False


#: how a proof names the parameters it also covers with -inf masks (prove.py writes it)
MASKS = re.compile(r"\[-inf masks: ([\w, ]+)\]")


#: how a proved accumulator's answer names the operands it was also tested on with -inf
#: entries (masks), and with ±inf entries (certify.infinite_tested writes both)
MASKS_TESTED = re.compile(r"\[-inf tested: ([\w, ]+)\]")
INFINITE = re.compile(r"\[infinite: ([\w, ]+)\]")


def _listed(how: str, marker: re.Pattern[str]) -> set[str]:
    """The parameter names a certification answer lists after ``marker``."""
    found = marker.search(how)
    return {m.strip() for m in found.group(1).split(",")} if found else set()


def _uncovered(diagram: Diagram, terms: Mapping[str, Expr], masks: set[str], infinite: set[str]) -> str | None:
    """The first parameter whose matched term is neither finite, nor a -inf mask where the
    parameter is in ``masks``, nor anything where it is in ``infinite``; None when all are."""
    defs = {let.names[0]: let.expr for let in diagram.body if len(let.names) == 1}
    inputs = {p.name for p in diagram.inputs}
    return next((n for n, t in terms.items() if not (finite(t, defs, inputs) or n in infinite
                                                      or (n in masks and masked(t, defs, inputs)))), None)


def unsupported(how: str, diagram: Diagram, terms: Mapping[str, Expr]) -> str | None:
    """Why an accumulator use is backed by nothing, or None: its proof (``proved: ...``) or
    its bounded tests (``tested: ...``, on finite inputs) cover finite operands, a proof also
    the -inf masks it names, and its float64 test with infinities the operands it names
    ``[-inf tested: ...]`` (masks) and ``[infinite: ...]`` (±inf); an operand ``terms`` matches
    that may be infinite otherwise (a +inf mask streamed via logsumexp, whose state gives NaN
    where the box gives +inf) is neither proved nor tested."""
    proved = how.startswith("proved")
    masks = _listed(how, MASKS) if proved else set()
    n = _uncovered(diagram, terms, masks | _listed(how, MASKS_TESTED), _listed(how, INFINITE))
    if n is None:
        return None
    which = ("first", "second", "third")[int(n[1:])] if n[1:].isdigit() and int(n[1:]) < 3 else n
    return (f"its {which} operand may be infinite here, and it is {'proved' if proved else 'tested'} for finite "
            f"operands{' and -inf masks' if masks else ''}, not tested with infinite ones")


def narrowed(how: str, diagram: Diagram, terms: Mapping[str, Expr]) -> str:
    """Certification's ``how`` for one use, its parameters matched to ``terms``: a proof
    (``proved: ...``) covers finite inputs, and -inf masks in the parameters it names in
    ``[-inf masks: S]``; applied to anything else the use is only tested."""
    if not how.startswith("proved") or _uncovered(diagram, terms, _listed(how, MASKS), set()) is None:
        return how
    return f"tested here (proved for finite terms, applied to one that may be infinite): {how[len('proved: '):]}"


def finite_in(diagram: Diagram, expr: Expr) -> bool:
    """``finite`` for a term of ``diagram`` (its bindings and inputs in scope)."""
    defs = {let.names[0]: let.expr for let in diagram.body if len(let.names) == 1}
    return finite(expr, defs, {p.name for p in diagram.inputs})


def _nonzero(expr: Expr, defs: Mapping[str, Expr], inputs: frozenset[str] | set[str]) -> bool:
    """Nonzero at every finite input (the operand is known finite): positive, or the guarded
    divisor ``d + (1 - g)`` with ``g`` = ``square(sign(d))`` or ``abs(sign(d))``, which is 1
    where d = 0 and d elsewhere (the evaluator's and the VJP's convention for a quotient whose
    divisor may be 0)."""
    if _sign(expr, defs, inputs) == "positive":
        return True
    expr = _through(expr, defs)
    if not (isinstance(expr, Box) and expr.op == "add"):
        return False
    for d, rest in (expr.args, expr.args[::-1]):
        rest = _through(rest, defs)
        if isinstance(rest, Box) and rest.op == "sub" and rest.args[0] == Const(1.0):
            g = _through(rest.args[1], defs)
            inner = _through(g.args[0], defs) if isinstance(g, Box) and g.op in ("square", "abs") else None
            if isinstance(inner, Box) and inner.op == "sign" and _through(inner.args[0], defs) == _through(d, defs):
                return True
    return False


def _through(expr: Expr, defs: Mapping[str, Expr]) -> Expr:
    """The expression a binding names (through chains of names)."""
    while isinstance(expr, Var) and expr.name in defs:
        expr = defs[expr.name]
    return expr


def _sign(expr: Expr, defs: Mapping[str, Expr], inputs: frozenset[str] | set[str]) -> str | None:
    """"positive" or "nonnegative" where that holds for every finite input, else None
    (the operand is known finite: ``finite`` checked it first)."""
    if isinstance(expr, Var) and expr.name in defs:
        return _sign(defs[expr.name], defs, inputs)
    if isinstance(expr, Size):
        return "positive"
    if isinstance(expr, Const):
        return "positive" if expr.value > 0 else "nonnegative" if expr.value == 0 else None
    if not isinstance(expr, Box):
        return None
    if expr.op in _POSITIVE or (expr.op == "sqrt" and _sign(expr.args[0], defs, inputs) == "positive"):
        return "positive"
    if expr.op in _NONNEGATIVE:
        return "nonnegative"
    if expr.op in ("mul", "add", "maximum", "minimum"):
        signs = [_sign(a, defs, inputs) for a in expr.args]
        if None in signs:
            return None
        if expr.op == "add" or expr.op == "maximum":
            return "positive" if "positive" in signs else "nonnegative"
        return "positive" if set(signs) == {"positive"} else "nonnegative"
    return None
