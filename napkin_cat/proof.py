"""Proof blocks -> kernel calls: ``check_file``, ``check_module``, ``theorem``.

Each ``theorem NAME: DIAGRAM { steps }`` starts from reflexivity on the diagram, unfolds
diagrams used as boxes (δ), then runs each step through the kernel, wiring certify's
results in: a rewrite's lemma must certify, a stream step asks certify (through an
oracle) whether each accumulator's laws hold for the box it streams.  The first refused
step stops the theorem; for a refused partition the checker also looks for a concrete
counterexample: it runs the diagram tile by tile as the refused schedule would (tiles
evaluated independently, outputs that lack the axis combined with the named
accumulator's monoid or summed, no ragged tile without ``pad``) and compares with the
plain evaluator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from napkin_cat import certify, finiteness, kernel, ops, terms
from napkin_cat.certify import approximation, rules
from napkin_cat.certify.accumulators import chunk
from napkin_cat.diagnostics import Diagnostic, NapkinError, did_you_mean, error
from napkin_cat.elaborate import load
from napkin_cat.evaluate import FLOAT64, Named, evaluate_named, related, sample_integers
from napkin_cat.printer import print_expr
from napkin_cat.terms import (
    Box,
    Diagram,
    Expr,
    LemmaDecl,
    Module,
    Partition,
    Place,
    Quantise,
    Rewrite,
    Schedule,
    Step,
    TheoremDecl,
    Var,
    walk,
)

__all__ = ["CheckResult", "check_file", "check_module", "check_theorem", "derivation", "describe_step", "partitions",
           "prove", "theorem", "trust_line"]


@dataclass(frozen=True)
class CheckResult:
    """One theorem's outcome: the Theorem, or the failing step (1-based) and why."""

    name: str
    path: str
    steps: tuple[Step, ...]
    theorem: kernel.Theorem | None = None
    failure: Diagnostic | None = None
    step: int | None = None
    counterexample: str | None = None

    @property
    def ok(self) -> bool:
        return self.theorem is not None

    def summary(self) -> str:
        """``NAME: step; step; ... [trust: ...]`` or ``NAME: FAILED at step N``; the trust line ends with
        the source's input relations (``given L = ...``), which the theorem is claimed under."""
        steps = "; ".join(describe_step(s) for s in self.steps) or "no steps"
        if self.theorem is not None and self.theorem.kernels:
            steps = "; ".join([*(describe_step(s) for s in self.theorem.steps), *(
                f"kernel {', '.join(w)} {{{'; '.join(describe_step(s) for s in k.steps)}}}"
                for w, k in zip(self.theorem.writes, self.theorem.kernels, strict=True))])
        if self.theorem is not None:
            exact = "≡" if self.theorem.exact else "≈"
            constraints = ", ".join(str(c) for c in self.theorem.constraints)
            when = f" [assuming {constraints}]" if constraints else ""
            return f"{self.name} {exact}: {steps}{when}  (trust: {trust_line(self.theorem)})"
        return f"{self.name}: FAILED at step {self.step}: {describe_step(self.steps[self.step - 1])}" \
            if self.step and self.step <= len(self.steps) else f"{self.name}: FAILED"


def trust_line(theorem: kernel.Theorem) -> str:
    """What ``theorem`` rests on, as ``napkin check`` prints it after ``trust:`` and a lowered module's
    docstring after ``Proved by:``: its trust entries, then its source's input relations (``given L = ...``),
    which the theorem is claimed under (an input relation is what it assumes of its inputs: claimed only
    where it holds)."""
    unbounded = finiteness.relation_unbounded(theorem.source.inputs)
    given = [f"given {p.name} = {print_expr(p.given)}" + (
        f" (may be {', '.join(sorted(unbounded[p.name]))}: claimed for no input there)" if p.name in unbounded else "")
        for p in theorem.source.inputs if p.given is not None]
    return "; ".join([*theorem.trust, *given])


def describe_step(step: Step) -> str:
    """A proof step in its source form."""
    if isinstance(step, Rewrite):
        return f"rewrite {step.lemma} at {', '.join(step.at)}"
    if isinstance(step, Partition):
        via = f" via {step.via}" if step.via else ""
        at = "" if step.kind == "split" else f" at {step.level}"
        return f"{step.kind} {step.axis} by {step.tile}{at}{via}{' pad' if step.pad else ''}"
    if isinstance(step, Place):
        return f"place {', '.join(step.names)} at {step.level}"
    return f"dtype {', '.join(step.names)} as {step.dtype} tol {step.tol!r}"


def check_file(path: str | Path, level: str = "quick", strict: bool = False) -> list[CheckResult]:
    """Check every theorem of an .ncd file (raises NapkinError if it does not elaborate)."""
    return check_module(load(path), level, strict)


def check_module(module: Module, level: str = "quick", strict: bool = False) -> list[CheckResult]:
    """Check every theorem of an elaborated module."""
    lemmas = rules.lemmas_in_scope(module)
    return [check_theorem(module, decl, lemmas, level, strict) for decl in module.theorems]


def theorem(path: str | Path, name: str, strict: bool = False) -> kernel.Theorem:
    """The checked theorem ``name`` of a proof file; raises NapkinError if it fails (with
    ``strict``, also where it would rest on something only tested: ``check_theorem``)."""
    return prove(load(path), name, strict)


def prove(module: Module, name: str, strict: bool = False) -> kernel.Theorem:
    """The checked theorem ``name`` of an elaborated module; raises NapkinError if it fails (with
    ``strict``, also where it would rest on something only tested)."""
    try:
        decl = module.theorem(name)
    except KeyError:
        known = ", ".join(t.name for t in module.theorems) or "none"
        raise NapkinError(error("name.unknown", None, f"theorems here: {known}", kind="theorem", name=name)) from None
    result = check_theorem(module, decl, rules.lemmas_in_scope(module), strict=strict)
    if result.theorem is None:
        assert result.failure is not None
        raise NapkinError(result.failure)
    return result.theorem


def check_theorem(module: Module, decl: TheoremDecl, lemmas: dict[str, LemmaDecl],
                  level: str = "quick", strict: bool = False, relations: bool = True) -> CheckResult:
    """Run one theorem's steps through the kernel; with ``strict``, a step that makes the
    theorem rest on something only tested (``Theorem.tested``) is refused too, and so is a theorem
    whose diagram has an input relation that may be infinite or NaN (``_vacuous``) unless
    ``relations`` is False: a derived backward pass's relation is what its join feeds it, which
    ``lower``'s join proof decides (refused unproved, unless the caller opts into a tested join).  A chain's
    kernels (``kernel ... { steps }``) are each proved on their piece of the diagram
    (``terms.cut``), then joined by ``kernel.chain``; the steps are numbered through them, and a
    refused join counts as the first kernel's first step."""
    steps = decl.steps + tuple(s for k in decl.kernels for s in k.steps)
    if strict and relations and (vacuous := _vacuous(module.diagram(decl.diagram))) is not None:
        return CheckResult(decl.name, module.path, steps, None, vacuous, 1)
    whole, failed = _steps(kernel.unfold(kernel.refl(decl.name, module.diagram(decl.diagram))), decl.steps, 0,
                           lemmas, level, strict)
    if failed is not None:
        return CheckResult(decl.name, module.path, steps, None, *failed)
    if not decl.kernels:
        return CheckResult(decl.name, module.path, steps, whole)
    writes, span, done = tuple(k.writes for k in decl.kernels), decl.kernels[0].span, len(decl.steps)
    try:
        if whole.schedule != Schedule():  # the kernel's refusal: relabellings belong in the kernels
            kernel.chain(whole, writes, (), span)
        try:
            pieces = terms.cut(whole.result, writes, ops.integer_valued)
        except ValueError as exc:  # as kernel.chain refuses it
            raise kernel.KernelError("chain", str(exc), span) from None
        kernels = []
        for k, (piece, block) in enumerate(zip(pieces, decl.kernels, strict=True)):
            thm, failed = _steps(kernel.refl(f"{decl.name}_k{k + 1}", piece), block.steps, done, lemmas, level,
                                 strict)
            if failed is not None:
                return CheckResult(decl.name, module.path, steps, None, *failed)
            kernels.append(thm)
            done += len(block.steps)
        joined = kernel.chain(whole, writes, tuple(kernels), span)
        known = {f"{k.name}: {t}" for k in kernels for t in k.tested}
        if strict and (new := [t for t in joined.tested if t not in known]):  # what the join itself rests on
            refusal = error("proof.refused", span, "prove it, or go without --strict", rule="strict",
                            reason=f"the theorem would rest on {', '.join(new)}, which is only tested, "
                                   "not proved for every size")
            return CheckResult(decl.name, module.path, steps, None, refusal, len(decl.steps) + 1)
        return CheckResult(decl.name, module.path, steps, joined)
    except NapkinError as exc:
        return CheckResult(decl.name, module.path, steps, None, exc.diagnostics[0], len(decl.steps) + 1)


def _vacuous(diagram: Diagram) -> Diagnostic | None:
    """``--strict``'s refusal of a theorem about ``diagram`` where an input relation may be infinite or
    NaN (``finiteness.relation_unbounded``): the given input is finite, so there the diagram has no
    input and the theorem claims nothing (a relation over a row every input masks claims nothing at
    all); None where every relation is shown finite."""
    unbounded = finiteness.relation_unbounded(diagram.inputs)
    if not unbounded:
        return None
    name, classes = next(iter(unbounded.items()))
    relation = next(p.given for p in diagram.inputs if p.name == name)
    assert relation is not None
    return error("proof.refused", getattr(relation, "span", None) or diagram.span,
                 "state a relation that is finite at every input (a mask keeping a key in every row), "
                 "or go without --strict", rule="strict",
                 reason=f"the relation giving `{name}` may be {', '.join(sorted(classes))} (finiteness."
                        f"relation_unbounded), and `{name}` is a finite input: where the relation is not, the "
                        "diagram has no input, and the theorem would claim nothing there")


def derivation(module: Module, decl: TheoremDecl, lemmas: dict[str, LemmaDecl]) -> list[kernel.Theorem]:
    """The proof states of a theorem that checks (NapkinError with the refusal otherwise): the
    diagram after each prefix of its steps (the first: reflexivity) and, for a chain, each
    kernel's piece (``terms.cut``) after each prefix of that kernel's steps, kernel by kernel."""
    result = check_theorem(module, decl, lemmas)
    if result.theorem is None:
        assert result.failure is not None
        raise NapkinError(result.failure)
    thm = kernel.unfold(kernel.refl(decl.name, module.diagram(decl.diagram)))
    states = [thm]
    for step in decl.steps:
        states.append(thm := _apply(thm, step, lemmas, "quick"))
    if decl.kernels:
        pieces = terms.cut(thm.result, tuple(k.writes for k in decl.kernels), ops.integer_valued)
        for k, (piece, block) in enumerate(zip(pieces, decl.kernels, strict=True)):
            states.append(part := kernel.refl(f"{decl.name}_k{k + 1}", piece))
            for step in block.steps:
                states.append(part := _apply(part, step, lemmas, "quick"))
    return states


def _steps(thm: kernel.Theorem, steps: tuple[Step, ...], done: int, lemmas: dict[str, LemmaDecl], level: str,
           strict: bool) -> tuple[kernel.Theorem, tuple[Diagnostic, int, str | None] | None]:
    """The theorem after ``steps`` (numbered after ``done`` earlier ones), or the first refusal:
    its diagnostic, its step number and a counterexample where one is found."""
    for index, step in enumerate(steps, start=done + 1):
        before = thm.tested
        try:
            thm = _apply(thm, step, lemmas, level)
        except NapkinError as exc:
            witness = _counterexample(thm.result, step) if isinstance(step, Partition) else None
            return thm, (exc.diagnostics[0], index, witness)
        if strict and (new := [t for t in thm.tested if t not in before]):  # tested, so no counterexample
            refusal = error("proof.refused", step.span, "prove it, or go without --strict", rule="strict",
                            reason=f"the theorem would rest on {', '.join(new)}, which is only tested, "
                                   "not proved for every size")
            return thm, (refusal, index, None)
    return thm, None


def partitions(thm: kernel.Theorem) -> tuple[Partition, ...]:
    """Every partition of a theorem's schedule and, for a chain, of its kernels' in order."""
    return thm.schedule.partitions + tuple(p for k in thm.kernels for p in k.schedule.partitions)


def measure(thm: kernel.Theorem) -> tuple[float | None, str]:
    """The kernel's dtype oracle: the error the theorem's roundings cause, measured on seeded
    inputs (``approximation.measure``), or None and why it cannot be measured."""
    try:
        found = approximation.measure(thm)
    except approximation.Unmeasurable as exc:
        return None, str(exc)
    return found.error, str(found)


def _apply(thm: kernel.Theorem, step: Step, lemmas: dict[str, LemmaDecl], level: str) -> kernel.Theorem:
    if isinstance(step, Rewrite):
        lemma = lemmas.get(step.lemma)
        if lemma is None:
            raise NapkinError(error("proof.unknown_lemma", step.span, did_you_mean(step.lemma, lemmas),
                                    name=step.lemma))
        cert = certify.certify_lemma(lemma, level)
        if not cert.ok:
            raise NapkinError(error("proof.not_certified", step.span, name=lemma.name,
                                    reason=f"{cert.how}: {cert.counterexample}"))
        try:
            return kernel.rewrite(thm, lemma, step, {lemma.name: cert.how})
        except kernel.KernelError as exc:
            if exc.subject is None:
                raise
            raise NapkinError(_no_match(exc, exc.subject, thm, lemma, lemmas, step)) from None
    if isinstance(step, Partition):
        if step.kind in ("group", "scan"):
            return kernel.group(thm, step)
        return (kernel.split if step.kind == "split" else kernel.stream)(thm, step, certify.accumulator)
    if isinstance(step, Place):
        return kernel.place(thm, step)
    assert isinstance(step, Quantise)
    return kernel.quantise(thm, step, measure)


# ---- why a lemma does not match ------------------------------------------------------------------


def _no_match(exc: kernel.KernelError, subject: Expr, thm: kernel.Theorem, lemma: LemmaDecl,
              lemmas: dict[str, LemmaDecl], step: Rewrite) -> Diagnostic:
    """The kernel's refusal, with the lemma's left side and the binding printed, where they
    first differ, and a hint when a contraction's operands in the other order would match."""
    root = "return" if "return" in step.at else [n for let in thm.result.body for n in let.names if n in step.at][-1]
    what = "the returned expression" if root == "return" else f"`{root}`"  # the kernel's root, as it chose it
    reason = f"{exc.condition}: the left side is `{print_expr(lemma.lhs)}`, {what} is `{print_expr(subject)}`"
    candidates = [n for n in walk(subject) if isinstance(n, Box) and isinstance(lemma.lhs, Box)
                  and n.op == lemma.lhs.op and len(n.args) == len(lemma.lhs.args)]
    differing = next(((n, d) for n, d in ((n, _difference(lemma.lhs, n)) for n in candidates) if d is not None),
                     None)
    difference = differing[1] if differing is not None else None
    within = f"; matched against `{print_expr(differing[0])}` inside {what}" \
        if differing is not None and differing[0] is not subject else ""
    swapped = next((k for n in candidates for k in walk(n) if isinstance(k, Box) and k.op == "contract"
                    and len(k.args) == 2 and _difference(lemma.lhs, _swap(n, k)) is None), None)
    hint = None
    if swapped is not None:
        reason += f"; `{print_expr(swapped)}` has its operands in the other order"
        if "contract_comm" in lemmas and lemma.name != "contract_comm":
            hint = f"swap them first: `rewrite contract_comm at {root}`"
    elif difference is not None:
        reason += (f"{within}; where the left side has `{print_expr(difference[0])}`, it has "
                   f"`{print_expr(difference[1])}`")
        if isinstance(found := difference[1], Var) and any(found.name in let.names for let in thm.result.body):
            at = ", ".join([*(n for n in step.at if n != root), found.name, root])
            hint = f"a binding is inlined only when named: `rewrite {lemma.name} at {at}`"
    return error("proof.refused", step.span, hint, rule=exc.rule, reason=reason)


def _difference(pattern: Expr, term: Expr) -> tuple[Expr, Expr] | None:
    """The outermost sub-terms where ``term`` departs from ``pattern``'s shape (None if it
    has the shape: what is left to the kernel's matching is axes and repeated variables)."""
    if isinstance(pattern, Var):
        return None
    if not (isinstance(pattern, Box) and isinstance(term, Box)) or \
            (pattern.op, pattern.params, len(pattern.args)) != (term.op, term.params, len(term.args)):
        return None if pattern == term else (pattern, term)
    inner = [d for d in map(_difference, pattern.args, term.args) if d is not None]
    return (pattern, term) if len(inner) > 1 else inner[0] if inner else None


def _swap(expr: Expr, node: Box) -> Expr:
    """``expr`` with ``node``'s two operands exchanged (shape only: types are not recomputed)."""
    if expr is node:
        return replace(node, args=node.args[::-1])
    return replace(expr, args=tuple(_swap(a, node) for a in expr.args)) if isinstance(expr, Box) else expr


# ---- counterexamples for refused partitions ---------------------------------------------------

#: how the tiles' outputs lacking the axis are merged: a monoid accumulator's operation on its
#: states, which are the box's values on the tiles (logsumexp's log-add: adding logsumexps was no
#: merge at all, and printed a counterexample where the accumulator is right)
_MERGE: dict[str, Callable[[Any, Any], Any]] = {  # max, min: IEEE 754-2019 on zeros, as the evaluator
    "sum": np.add, "max": FLOAT64.maximum, "min": FLOAT64.minimum, "prod": np.multiply, "logsumexp": np.logaddexp}


def _counterexample(diagram: Diagram, step: Partition) -> str | None:
    """Inputs on which running ``diagram`` tile by tile as ``step`` claims differs from it.

    Tiles are simulated by slicing the inputs, so an axis no input carries (absent, or made
    inside by onehot, split or a mask), or one whose positions a box reads, gets no
    counterexample."""
    if not any(step.axis in p.axes for p in diagram.inputs):
        return None
    exprs = [let.expr for let in diagram.body] + list(diagram.outputs)
    if any(isinstance(b, Box) and b.index is not None and step.axis in b.axes for e in exprs for b in walk(e)):
        return None  # a mask or index box reads positions, which the slices would renumber from 0
    declared = diagram.axis_sizes()
    tile = step.tile if isinstance(step.tile, int) else 2
    sizes = {a: (n if n is not None else 3) for a, n in declared.items()}
    if declared.get(step.axis) is None:
        sizes[step.axis] = 2 * tile
    if any(n > 4096 for n in sizes.values()):
        return None
    rng = np.random.default_rng(0)
    drawn = related(diagram, [(sample_integers if p.integer else _normal)(rng, [sizes[a] for a in p.axes])
                              for p in diagram.inputs], sizes)
    inputs = [Named(p.axes, x) for p, x in zip(diagram.inputs, drawn, strict=True)]
    try:
        whole = evaluate_named(diagram, inputs, dict(sizes), FLOAT64)
        n = sizes[step.axis]
        tiles = [(s, min(s + tile, n)) for s in range(0, n, tile) if step.pad or s + tile <= n]
        if not tiles:
            return f"with {_sizes(sizes)}, no whole tile of {tile} fits in the {n} positions of `{step.axis}`"
        pieces = [evaluate_named(diagram, [chunk(x, step.axis, a, b) for x in inputs],
                                 dict(sizes) | {step.axis: b - a}, FLOAT64) for a, b in tiles]
    except NapkinError:
        return None
    merge = _MERGE.get(step.via or "sum", np.add)
    for k, (out, axes) in enumerate(zip(whole, diagram.out_types, strict=True)):
        parts = [p[k].to(axes) for p in pieces]
        if step.axis in axes:
            got = np.concatenate(parts, axis=axes.index(step.axis))
            if got.shape != out.data.shape:
                return (f"with {_sizes(sizes)} and tile {tile}, the tiles cover {got.shape[axes.index(step.axis)]} "
                        f"of {n} positions of `{step.axis}`")
        else:
            got = parts[0]
            for p in parts[1:]:
                got = merge(got, p)
        bad = ~np.isclose(got, out.data, rtol=1e-6, atol=1e-9, equal_nan=True)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            return (f"with {_sizes(sizes)}, tile {tile} and seeded normal inputs, output {k} at {list(where)} is "
                    f"{got[where]:.6g} tile by tile but {out.data[where]:.6g} by the diagram")
    return None


def _normal(rng: np.random.Generator, shape: list[int]) -> np.ndarray:
    return rng.standard_normal(shape)


def _sizes(sizes: dict[str, int]) -> str:
    return ", ".join(f"{a}={n}" for a, n in sizes.items())
