"""The lemma library as named data (napkin_cat/certify/lemmas.ncd), validated when built.

A lemma ``lhs = rhs`` over typed pattern variables is admitted into the library only if
it is well formed as a rewrite rule (egg's discipline): the left side is not a bare
variable; every variable of the right side occurs on the left (no unbound right-hand
variables); every axis of the lemma is fixed by a box or size on the left side, so a
match determines the axis map; and both sides have the same type.  Whether it is *true*
is ``certify``'s job; the kernel only uses lemmas that certify vouches for.

Proof files may state their own lemmas; ``lemmas_in_scope`` merges them with the
library and refuses a name clash.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from napkin_cat.diagnostics import Diagnostic, NapkinError, error
from napkin_cat.elaborate import load
from napkin_cat.terms import Apply, Box, Expr, LemmaDecl, Module, Size, Var, walk

__all__ = ["LIBRARY_PATH", "lemmas_in_scope", "library", "validate"]

LIBRARY_PATH = Path(__file__).with_name("lemmas.ncd")


def _fixed_axes(expr: Expr) -> set[str]:
    """Axes a match of ``expr`` determines: box targets and outputs, and sizes."""
    fixed: set[str] = set()
    for node in walk(expr):
        if isinstance(node, Box):
            fixed.update(node.target + node.out)
        elif isinstance(node, Size):
            fixed.add(node.axis)
    return fixed


def validate(lemma: LemmaDecl) -> list[Diagnostic]:
    """Every reason ``lemma`` cannot be used as a rewrite rule (empty if it can)."""
    problems: list[str] = []
    if isinstance(lemma.lhs, Var):
        problems.append("the left side is a bare variable and would match anything")
    lhs_vars = {n.name for n in walk(lemma.lhs) if isinstance(n, Var)}
    rhs_vars = {n.name for n in walk(lemma.rhs) if isinstance(n, Var)}
    for name in sorted(rhs_vars - lhs_vars):
        problems.append(f"variable `{name}` of the right side does not occur on the left")
    fixed = _fixed_axes(lemma.lhs)
    used = {a for p in lemma.params for a in p.axes} | _fixed_axes(lemma.rhs)
    for axis in sorted(used - fixed):
        problems.append(f"axis `{axis}` is not named by any box on the left side, so a match cannot fix it")
    for side, expr in (("left", lemma.lhs), ("right", lemma.rhs)):
        for called in dict.fromkeys(n.diagram.name for n in walk(expr) if isinstance(n, Apply)):
            problems.append(f"the {side} side uses diagram `{called}` as a box; state lemmas on primitive boxes "
                            "(a diagram's body is what its uses unfold to)")
    for name in (n for n in lemma.finite if n not in lhs_vars):
        problems.append(f"`when {name} finite` names no variable of the left side")
    if set(lemma.lhs.axes) != set(lemma.rhs.axes):
        problems.append(f"the sides have different types [{' '.join(lemma.lhs.axes)}] and "
                        f"[{' '.join(lemma.rhs.axes)}]")
    return [error("proof.lemma_invalid", lemma.span, name=lemma.name, reason=p) for p in problems]


@lru_cache(maxsize=1)
def library() -> dict[str, LemmaDecl]:
    """The shipped lemmas by name; raises NapkinError if any is malformed."""
    module = load(LIBRARY_PATH)
    problems = [d for lemma in module.lemmas for d in validate(lemma)]
    if problems:
        raise NapkinError(problems)
    return {lemma.name: lemma for lemma in module.lemmas}


def lemmas_in_scope(module: Module) -> dict[str, LemmaDecl]:
    """The library plus the module's own (and used) lemmas, each validated."""
    lemmas = dict(library())
    problems: list[Diagnostic] = []
    for lemma in module.scope_lemmas or module.lemmas:
        if lemma.name in lemmas and (prior := lemmas[lemma.name]) != lemma:
            first = prior.span if prior.span is not None and lemma.name not in library() else LIBRARY_PATH.name
            problems.append(error("name.duplicate", lemma.span, kind="lemma", name=lemma.name, first=str(first)))
            continue
        problems.extend(validate(lemma))
        lemmas[lemma.name] = lemma
    if problems:
        raise NapkinError(problems)
    return lemmas
