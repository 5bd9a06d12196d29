"""Gradients of lowered kernels.

With backward theorems (``lower(forward, backward=[...])``, ``napkin lower --backward``), the
public function is a ``jax.custom_vjp`` joining proved kernels (``joined``): the forward kernel
returns its primal outputs and saves the statistics it also computes (FlashAttention's row
log-sum-exp), and the backward kernels compute the input gradients from them.  ``link``
resolves the backward diagrams' inputs by name: a forward input, a forward output's binding
name (the value it saved), or a cotangent ``d`` + the name of a forward output (``grad``'s
convention).  A forward output whose cotangent some backward reads is primal (the public
function returns it); the others are statistics, returned only to the backward.  Each
backward output is the gradient of the forward input it is named after (``dQ`` for ``Q``;
several backwards' gradients of one input are summed; an input no backward gives a gradient
for, such as class labels, gets zeros, which the test below checks).  Each schedule is proved
by its own theorem.  That the diagrams together are the forward's VJP is proved at every size
(``certify.prove.prove_join``: attention's backward from the saved log-sum-exp and
D = Σ dO·O is proved this way) and tested (``_tested``: both sides in float64 at ``DRAWS``
size draws, the small sizes 1 to 7 and sizes past every constant of the diagrams (one axis at a time
past a count of declared sizes reductions run over: ``_draws``),
inputs at several scales, labels across the vocabulary, and rows the data masks empty:
``drawn_integers``), refusing with
``lower.backward_wrong`` where they differ by more than float64's rounding can account for
(``SAFETY`` times the sum of both sides' running error bounds, ``lower.roundoff``: a
cancelling sum, or a saved statistic's rounding read back through exp, is allowed what it
rounds by; a wrong term far past it is not).  A join the prover cannot prove (``where``
masks it cannot show keep a key per row, data masks, scans, the guarded division of gelu's slope)
is refused with its reason (``lower.backward_unproved``) unless the caller opts in
(``allow_tested``: ``lower(..., allow_tested_join=True)``, ``--allow-tested-join``): then it
rests on the test alone, ``lower`` warns (``UnprovedJoinWarning``) and the module docstring
says so and why.  A join the prover refuses for a float64 hazard (``certify.prove.FloatHazard``:
equal over the reals, but an overflow, underflow or absorption float64 may make where the VJP's
gradient is finite) is refused either way: the test's inputs need not reach the hazard.  The
overflow check also runs on a join the prover cannot finish (``prove_join``, at inputs where each data
mask keeps every entry), so the opt-in does not lower an exp(S)·exp(0 - L) behind an `eq` mask; the
other hazard checks too where the prover proves that instance equal (an absorption behind an `eq` mask),
or on each input whose gradients alone it proves equal with gelu an unknown function of its operand.
Elsewhere (gelu's own gradient) an absorption by a term free of the cotangents is the test's: one draw
takes them at ``QUIET`` (2^-60), where it drops the gradient whole.

Without backward theorems:

A Pallas kernel has no reverse mode (``pallas_call`` is not transposable), so on that target
``differentiable`` makes the public function a ``jax.custom_vjp``: the forward kernel under a
private name, the backward (the diagram's VJP, ``napkin_cat.grad``, lowered unscheduled to
plain JAX: every intermediate it recomputes is materialised whole, for attention the q×x
scores and weights once), and the public function, which keeps ``interpret=``, runs the
forward and, under ``jax.grad``/``jax.vjp``, saves only its inputs as residuals and calls the
backward.  The plain-JAX target is differentiated by JAX through its own code: its streamed
step is checkpointed, so its backward keeps per-chunk carries, not q·x values, which the
unscheduled VJP would.  ``GRADIENTS`` is each target's docstring line.  Where the VJP cannot
be lowered, the Pallas function is the forward itself and its docstring says why.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from napkin_cat.certify.accumulators import FLOAT_MAX
from napkin_cat.certify.approximation import label_inputs
from napkin_cat.certify.prove import FloatHazard, Unproved, prove_join
from napkin_cat.diagnostics import NapkinError, error
from napkin_cat.evaluate import INDEX_ARITH, MAX_POINTS_EVALUATED, evaluate, iteration_spaces, largest_space, related
from napkin_cat.grad import cotangent_names, vjp
from napkin_cat.lower import codegen as cg
from napkin_cat.lower import jax as jax_target
from napkin_cat.lower.roundoff import U, evaluate_bounded
from napkin_cat.ops import OPS, inlined
from napkin_cat.schedule.layout import layout
from napkin_cat.terms import (
    Apply,
    Axis,
    Box,
    Cmp,
    Const,
    Diagram,
    Expr,
    IndexExpr,
    Logic,
    Pred,
    Schedule,
    Size,
    Var,
    fold_index,
    fold_pred,
    relation_diagram,
    relations,
    walk,
)

__all__ = ["DRAWS", "GRADIENTS", "Link", "UnprovedJoinWarning", "differentiable", "drawn_integers", "joined", "link"]

#: size draws at which ``link`` tests the backward diagrams against the forward's VJP
DRAWS = 4
#: the first draw's symbolic sizes are 1 to SMALL; the others' past SMALL and every constant
SMALL = 7
#: the largest constant (rounded up) whose sizes past it the join test draws: each array it evaluates
#: then holds up to (LARGEST + 8)^2 values per pair of drawn axes (a window of 4096 keys, not a
#: size past 3037000500^2 that wraps int64)
LARGEST = 4096
#: the draws more (the first at the first draw's sizes, the others past every constant) where a forward
#: has ``int`` inputs (segment ids, lengths, masks: ``drawn_integers``) that empty rows of the masks
EMPTIED = 2
#: the scales of the normal inputs, by draw
SCALES = (1.0, 1.0, 4.0, 16.0)
#: the size of a scanned or reduced axis (``_long``) in the join test's long draws, the other axes 1 to 3:
#: past the length at which a gradient computed through exp of a running sum (or a sum, a product) of
#: inputs about ±1 overflows (exp(-cumsum A) is inf from t = 710 at A = -1), where the right one is finite,
#: and a query past every key by the width of a window narrower than 1021 keys (a row it empties)
LONG = 1024
#: the other symbolic axes' largest size (they take 1 to BESIDE) in the long draws and the draws past a reduced
#: count, which take their axis past the count by more than it: ``min(1, d / (t - s))`` differs from 1 there
BESIDE = 3
#: the inputs' offsets in the long draws (normals at scale 1 about each), one draw each: decays
#: (A of ``linrec[t](exp(A), X)``) and growths alike
DRIFTS = (-1.0, 1.0)
#: the cotangents' scale in the first draw past the constants (a power of 2, so scaling is exact): the VJP is
#: linear in its cotangents, and a right backward computes its gradients scaled alike (bit for bit where float64
#: does not underflow), so a right one passes as at cotangents about 1; but a term free of them that a backward
#: adds then cancels, ``(1000 + dy·gelu'(A)) - 1000`` for gelu's gradient, absorbs its low digits (6e-14 of it
#: about 1, within the per-position cap ``ROUNDING_AT_MOST``; float64 drops it whole below 2^-53 of the constant, a
#: float32 kernel below 2^-24): at cotangents about 2^-60 it is lost whole, and refused.  Normal draws never put a
#: gradient near 2^-53 of such a term, and the prover's absorption check (``certify.prove.prove_join``) runs only
#: where it proves the gradients equal (not gelu's own)
QUIET = 2.0 ** -60
#: the description of the draw at QUIET cotangents
QUIETLY = ", cotangents at 2^-60"
#: the join test's tolerance, in units of the two sides' running error bounds
#: (``lower.roundoff``: first order, so a factor past 1 for the dropped terms)
SAFETY = 2.0
#: how much rounding the backwards' side may claim past the VJP's own bound, as a fraction of the
#: larger of the two gradients at that position: past it, rounding that large (a sum absorbing
#: a gradient whole, as ``cumsum[t](g + exp(46.5)) - cumsum[t](g * 0 + exp(46.5))`` is 0 for the
#: running sum) would let a wrong gradient through, so the test refuses it as wrong (a gradient
#: that is rounding noise on both sides, near-cancelling sums alike, keeps its bound)
ROUNDING_AT_MOST = 1e-3


class UnprovedJoinWarning(UserWarning):
    """``lower`` joined backward kernels whose join is only tested, not proved (opted in)."""


@dataclass(frozen=True)
class Link:
    """How backward diagrams attach to a forward (module docstring)."""

    #: the forward outputs the public function returns, by position
    primal: tuple[int, ...]
    #: per backward, per input: ("input", i), ("output", j) or ("cotangent", k) (k-th primal output)
    sources: tuple[tuple[tuple[str, int], ...], ...]
    #: per backward, per output: the forward input it is the gradient of
    targets: tuple[tuple[int, ...], ...]
    #: what the join rests on: proved (``certify.prove.prove_join``) or only tested, and the test
    trust: str
    #: the forward outputs' names (binding names, or ``output J``), for the docstring
    names: tuple[str, ...] = ()
    #: whether ``prove_join`` proved the join (else it was allowed on the test alone)
    proved: bool = True


def link(forward: Diagram, backwards: Sequence[Diagram], allow_tested: bool = False) -> Link:
    """Resolve the backwards' inputs and outputs against ``forward``, then prove that they give
    its VJP (``certify.prove.prove_join``) and test it (``_tested``); raises ``NapkinError``
    (``lower.backward_*``) otherwise.  A join the prover cannot prove is refused
    (``lower.backward_unproved``, with the prover's reason) unless ``allow_tested``: then it
    rests on the test alone, and the ``Link`` says so (``proved`` False)."""
    result = _resolved(forward, backwards)
    reference = vjp(replace(forward, outputs=tuple(forward.outputs[j] for j in result.primal),
                            out_types=tuple(forward.out_types[j] for j in result.primal)))
    try:
        proof = prove_join(forward, reference, list(zip(backwards, result.sources, result.targets, strict=True)))
    except Unproved as why:
        if isinstance(why, FloatHazard):  # equal over the reals: a test's inputs need not reach the hazard
            raise NapkinError(error("lower.backward_unproved", forward.span, hint=(
                "the backwards equal the VJP over the reals, but float64 may compute them otherwise where the "
                "VJP's gradient is finite; the float64 test's inputs need not reach that, so --allow-tested-join "
                "does not lower it: compute what the extended reals do"), forward=forward.name, why=str(why))) from None
        if not allow_tested:
            raise NapkinError(error("lower.backward_unproved", forward.span, hint=(
                "a join only tested in float64 is lowered with --allow-tested-join (Python: "
                "lower(..., allow_tested_join=True)), with a warning"), forward=forward.name, why=str(why))) from None
        tested = _tested(forward, reference, backwards, result)
        return replace(result, trust=f"tested, not proved ({why}): equal to the VJP of the forward (napkin_cat.grad) "
                                     f"{tested}", proved=False)
    tested = _tested(forward, reference, backwards, result, proved=True)
    return replace(result, trust=f"proved equal to the VJP of the forward (napkin_cat.grad){proof[len('proved:'):]}, "
                                 f"and tested {tested}")


def _resolved(forward: Diagram, backwards: Sequence[Diagram]) -> Link:
    """The backwards' inputs and outputs resolved against ``forward`` (``link``), the trust not yet
    said; raises ``NapkinError`` (``lower.backward_primal``, ``_input``, ``_type``, ``_output``)."""
    inputs = {p.name: (i, p.axes) for i, p in enumerate(forward.inputs)}
    outputs = {o.name: (j, t) for j, (o, t) in enumerate(zip(forward.outputs, forward.out_types, strict=True))
               if isinstance(o, Var) and o.name not in inputs}
    seeds = cotangent_names(forward)
    read = {p.name for b in backwards for p in b.inputs}
    primal = tuple(j for j, name in enumerate(seeds) if name in read)
    if not primal:
        raise NapkinError(error("lower.backward_primal", cotangents=", ".join(seeds)))
    cotangents = {seeds[j]: (k, forward.out_types[j]) for k, j in enumerate(primal)}
    sources, targets = [], []
    for b in backwards:
        row = []
        for p in b.inputs:
            kind = "input" if p.name in inputs else "output" if p.name in outputs else \
                "cotangent" if p.name in cotangents else None
            if kind is None:
                raise NapkinError(error("lower.backward_input", name=p.name, diagram=b.name, inputs=", ".join(inputs),
                                        outputs=", ".join(outputs) or "none", cotangents=", ".join(cotangents)))
            index, axes = {"input": inputs, "output": outputs, "cotangent": cotangents}[kind][p.name]
            if tuple(axes) != tuple(p.axes):
                raise NapkinError(error("lower.backward_type", name=p.name, diagram=b.name, got=" ".join(p.axes),
                                        want=" ".join(axes)))
            row.append((kind, index))
        sources.append(tuple(row))
        gives = []
        for k, (out, axes) in enumerate(zip(b.outputs, b.out_types, strict=True)):
            name = out.name[1:] if isinstance(out, Var) and out.name.startswith("d") else None
            if name not in inputs or tuple(inputs[name][1]) != tuple(axes):
                raise NapkinError(error("lower.backward_output", index=k, diagram=b.name,
                                        names=", ".join(f"d{n}" for n in inputs)))
            gives.append(inputs[name][0])
        targets.append(tuple(gives))
    names = tuple(o.name if isinstance(o, Var) else f"output {j}" for j, o in enumerate(forward.outputs))
    return Link(primal, tuple(sources), tuple(targets), "", names)


def _tested(forward: Diagram, reference: Diagram, backwards: Sequence[Diagram], ln: Link,
            proved: bool = False) -> str:
    """Evaluate the joined backwards and ``reference`` (``grad.vjp`` of the forward's primal
    outputs) in float64 at ``DRAWS`` size draws, and return a description, or raise
    ``lower.backward_wrong`` naming the first gradient that differs by more than ``SAFETY``
    times the two sides' running error bounds (``roundoff.evaluate_bounded``; the backwards
    read the forward's outputs with the bounds the forward computed them within).

    The first draw takes every symbolic axis from 1 to ``SMALL`` (the small edge cases); the
    others take them past ``SMALL`` and every constant of the diagrams and their index predicates
    (``_constants``: a window of width 8 needs sizes above 8 to show an off-by-one, a factor
    ``min(1, 8 / x)`` sizes above 8 to differ from 1, ``min(1, 14.5 / x)`` above 15); an axis a
    ``rename`` ties to another (``_ties``) takes that one's size.  Where the forward has ``int``
    inputs that are no labels (segment ids, lengths, masks), ``EMPTIED`` more draws, one at each kind
    of sizes, empty rows of the data masks (``drawn_integers``' ``emptied``: a length 0, an id no other
    input holds), where an unguarded exp(S - L) is NaN and the VJP's gradient 0.  Where a
    scan (``cumsum``, ``linrec``) runs along a symbolic axis, or the forward or a backward reduces one
    (``_long``), ``DRIFTS`` more draws take that axis
    at ``LONG`` and the others at 1 to 3, inputs normal about each drift (int inputs all 1), compared where the VJP
    is finite (a gradient through exp of a running sum overflows as the axis grows, where the
    recurrence need not; a window empties the rows of queries 1024 long beside 1 to 3 keys).  Where
    reductions run over declared axes and a count they give is larger than every constant (``_reduced``:
    ``min(1, sum[d](W·0 + 1) / t)`` is 1 up to t = 64, ``min(1, sum[d, e](W·0 + 1) / t)`` up to 4096), one
    draw more per symbolic axis takes it past that count and the others at 1 to 3 (``_draws``).  Inputs are
    seeded normals at the draw's scale (1, 4, 16), cotangents normals at 1, at ``QUIET`` in the first draw past
    the constants (a term free of them absorbs the gradient whole there); labels (the
    inputs an ``onehot[v]`` operand is computed from, ``approximation.label_inputs``) are
    positions across the whole of ``v``, first and last included, so that a wrong label term is
    read."""
    axes, past, plans, left = _draws(forward, reference, backwards, ln, proved)
    gathered, masks = _labels(forward, backwards, ln, ("gather",)), _masks(forward, backwards, ln)
    labels = {**gathered, **_labels(forward, backwards, ln)}
    data = [i for i, p in enumerate(forward.inputs) if p.integer and i not in labels]  # ids, lengths, masks
    drawn = []
    for plan in plans:
        rng, sizes, drift, empty, beyond = plan.rng, plan.sizes, plan.drift, plan.empty, plan.beyond
        drawn.append(plan.described(axes))
        # a long draw's int inputs (ids, masks) all 1, where each data mask keeps every entry: beside 1 to 3
        # queries, 1024 keys of documents 1 then 2 leave a later query of document 2 no key (a row a mask empties,
        # which the emptied draws look for; these look for an overflow with length)
        args = [(np.ones([sizes[a] for a in p.axes]) if drift else
                 drawn_integers(rng, [sizes[a] for a in p.axes], i in masks,
                                (data.index(i) if beyond is None else len(data) - 1 - data.index(i)) if empty else None,
                                beyond))
                if p.integer and i not in labels else
                _drawn(rng, [sizes[a] for a in p.axes], plan.scale, sizes.get(labels.get(i, ""), 0), i in gathered) +
                (drift if i not in labels else 0.0) for i, p in enumerate(forward.inputs)]
        args = related(forward, args, sizes)  # a forward with relations: inputs it claims something of
        cts = [rng.standard_normal([sizes[a] for a in p.axes]) * (QUIET if plan.quiet else 1.0)
               for p in reference.inputs[len(forward.inputs):]]
        try:
            outs, out_errs = evaluate_bounded(forward, args, sizes=sizes)
            want, want_errs = evaluate_bounded(reference, [*args, *cts], sizes=sizes)
            got = [np.zeros_like(np.asarray(a, np.float64)) for a in args]
            got_errs = [np.zeros_like(g) for g in got]
            exact = [np.zeros(np.shape(a)) for a in args]
            for b, row, gives in zip(backwards, ln.sources, ln.targets, strict=True):
                values = [{"input": args, "output": outs, "cotangent": cts}[kind][i] for kind, i in row]
                errors = [{"input": exact, "output": out_errs, "cotangent": [0.0] * len(cts)}[kind][i]
                          for kind, i in row]
                _relations_within(b, values, errors, sizes, drawn[-1])
                for i, g, e in zip(gives, *evaluate_bounded(b, values, errors, sizes=sizes), strict=True):
                    got[i] = got[i] + g
                    got_errs[i] = got_errs[i] + e + U * np.abs(got[i])  # several backwards' gradients are summed
        except NapkinError as exc:  # not a draw too large to evaluate: ``_draws`` left those out or refused the join
            raise NapkinError(error("lower.backward_wrong", why=f"evaluating them failed: {exc}")) from None
        for k, (p, g, w, eg, ew) in enumerate(zip(forward.inputs, got, want, got_errs, want_errs, strict=True)):
            # the backwards' rounding past the VJP's own, at most ROUNDING_AT_MOST of the gradient at that position
            # (of the larger side's): scaled by the gradient's largest entry, a sum absorbing the small entries
            # whole ((g·exp(X) + Σ_t exp(X)) - Σ_t exp(X) is 0 where the VJP is 1.8e-12 beside 4.1e9) passed
            with np.errstate(invalid="ignore"):
                magnitude = np.maximum(np.abs(np.where(np.isfinite(g), g, 0)), np.abs(np.where(np.isfinite(w), w, 0)))
            bound = SAFETY * (np.minimum(eg, np.maximum(ew, ROUNDING_AT_MOST * magnitude)) + ew)
            with np.errstate(invalid="ignore"):
                close = (g == w) | (np.isnan(g) & np.isnan(w)) | (np.abs(g - w) <= bound)
            if drift:  # a long draw: where the forward itself overflows, the VJP has no value to compare with
                close |= ~np.isfinite(w)
            if not close.all():
                where = tuple(int(i) for i in np.argwhere(~close)[0])
                given = "" if any(i == k for t in ln.targets for i in t) else " (no backward gives it)"
                apart = (f" ({abs(g[where] - w[where]):.3g} apart, where float64's rounding accounts for at most "
                         f"{bound[where]:.3g})" if np.isfinite(g[where]) and np.isfinite(w[where]) else "")
                raise NapkinError(error("lower.backward_wrong", why=(
                    f"d{p.name} at {list(where)} is {g[where]:.6g} from the backwards{given} but {w[where]:.6g} from "
                    f"the VJP{apart}, with sizes {drawn[-1]}"
                    f"{' and labels across the vocabulary' if labels else ''}")))
    return (f"in float64 (within its rounding, lower.roundoff) at {len(drawn)} size draws ({'; '.join(drawn)}; the "
            f"largest constant of the diagrams, rounded up: {past}{''.join('; ' + why for why in left)})"
            f"{', labels across the vocabulary' if labels else ''}")


@dataclass(frozen=True)
class Plan:
    """One draw of the join test (``_draws``, ``_tested``)."""

    #: the draw's seeded generator: its sizes were drawn from it, its inputs are
    rng: np.random.Generator
    #: every axis's size (the declared ones too)
    sizes: dict[str, int]
    #: the normal inputs' scale (``SCALES``)
    scale: float = 1.0
    #: the inputs' offset: a long draw's (``DRIFTS``), 0 in the others
    drift: float = 0.0
    #: whether the data masks empty rows (``EMPTIED``, ``drawn_integers``' ``emptied``)
    empty: bool = False
    #: the constant the ids reach past (``drawn_integers``' ``beyond``; None in the small and the long draws)
    beyond: int | None = None
    #: whether the cotangents are at ``QUIET`` (the first draw past the constants)
    quiet: bool = False
    #: whether the draw is left out where it is too large to evaluate, whatever the join: a draw past a reduced
    #: count (one axis at a time; the others already reach every constant), a long draw along an axis only a
    #: backward reduces; the others are the test itself, and where one is too large an unproved join is untestable
    optional: bool = False

    def described(self, axes: dict[str, int | None]) -> str:
        """The draw as the test's description names it: the symbolic sizes (of ``axes``), scale and drift."""
        return (", ".join(f"{a}={n}" for a, n in self.sizes.items() if axes[a] is None) + f" at scale {self.scale:g}"
                + (f" about {self.drift:+g}" if self.drift else "") + (" with rows the data masks empty" if self.empty
                                                                       else "") + (QUIETLY if self.quiet else ""))


def _draws(forward: Diagram, reference: Diagram, backwards: Sequence[Diagram], ln: Link,
           proved: bool = False) -> tuple[dict[str, int | None], int, list[Plan], list[str]]:
    """The join test's axes (the forward's, and the backwards' declared sizes), the diagrams' largest
    constant (``_constants``), its draws (``_tested``; each one an evaluation of ``forward``, ``reference``
    and ``backwards`` can hold, ``_too_large``), and what it left out.  Where reductions, contractions,
    normalisations or scans run over declared axes, and a count they may give is larger than every constant
    and ``SMALL`` (``_reduced``: d = 64 in ``min(1, sum[d](W·0 + 1) / t)``, 1 up to t = 64; d·e = 4096 in
    ``min(1, sum[d, e](W·0 + 1) / t)``), one draw more per symbolic axis takes that axis past the largest
    such count whose draw an evaluation can hold, by more than ``BESIDE``, and the others at 1 to ``BESIDE``:
    drawing every axis past it put attention's draws at 65⁵ entries, past the machine's memory, and one at a
    time a draw holds at most (that count + 10)·3^(k-1) entries per array of k symbolic axes (with its
    declared ones).  A ``proved`` join skips the counts past ``LARGEST`` rather than being refused as
    untestable for a reduced declared size past it: it rests on its proof.  A draw too large to evaluate is
    left out, and said, where it is ``optional`` or the join ``proved``; otherwise the join is refused as
    untestable."""
    # the forward's axes, and the backwards' declared sizes; an axis only a backward has (a copy
    # ``grad`` makes of a scanned axis, t_2 of t) is bound by the evaluator from what it reads
    axes = {a.name: a.size for d in (forward, *backwards) for a in d.axes
            if a.size is not None or a.name in {b.name for b in forward.axes}}
    nodes = _nodes((forward, *backwards))  # every node of the diagrams, calls inlined, walked once
    past, (largest, counts) = _constants((forward, *backwards), nodes, axes), _reduced(nodes, axes)
    # a proved join rests on its proof: no draw past a count beyond LARGEST, no refusal (a declared model width of
    # 8192 refused a proved join, red team rtmerge2); an unproved one is refused where a reduced declared size is
    largest, counts = (0, [c for c in counts if c <= LARGEST]) if proved else (largest, counts)
    if max(past, largest) > LARGEST:
        raise NapkinError(error("lower.backward_untestable", forward=forward.name, why=(
            f"its diagrams hold a constant of magnitude {max(past, largest)} (rounded up), and the test draws sizes "
            f"past every constant (at most {LARGEST}): prove the join instead")))
    labels = {**_labels(forward, backwards, ln, ("gather",)), **_labels(forward, backwards, ln)}
    # an axis a rename ties to another (rename[t -> s]: a segsum's copy of t) is drawn at its size
    ties = _ties(nodes, axes)
    plans: list[Plan] = []
    data = [i for i, p in enumerate(forward.inputs) if p.integer and i not in labels]  # ids, lengths, masks
    for seed in range(DRAWS + (EMPTIED if data else 0)):
        rng = np.random.default_rng(seed)
        low = 1 if seed % DRAWS == 0 else max(past, SMALL) + 1
        sizes = {a: n if n is not None else int(rng.integers(low, low + 7)) for a, n in axes.items()}
        plans.append(Plan(rng, {a: sizes[ties.get(a, a)] for a in sizes}, SCALES[seed % len(SCALES)], 0.0,
                          seed >= DRAWS, None if low == 1 else past, quiet=seed == 1))  # the first past the constants
    # a scan's axis or one the forward reduces, then those only a backward reduces (optional: the mixture of
    # experts' t at 1024 beside e = d = 64 and f = 128 is past what an evaluation may hold)
    required = {ties.get(a, a) for a in _long(nodes, _nodes((forward,)), axes)}
    longs = list(dict.fromkeys(ties.get(a, a) for a in _long(nodes, nodes, axes)))
    for j, (long, drift) in enumerate((a, d) for a in longs for d in DRIFTS):
        rng = np.random.default_rng(DRAWS + j)  # as before the emptied draws: a join without int inputs is unchanged
        sizes = {a: n if n is not None else LONG if a == long else int(rng.integers(1, BESIDE + 1))
                 for a, n in axes.items()}
        plans.append(Plan(rng, {a: sizes[ties.get(a, a)] for a in sizes}, 1.0, drift, optional=long not in required))
    # every diagram ``_tested`` evaluates (its own relations' too: ``_relations_within``), as the evaluator measures it
    evaluated = (forward, reference, *backwards, *(relation_diagram(b, name)[0] for b in backwards
                                                   for name in relations(b.inputs)))
    spaces = [space for d in evaluated for space in iteration_spaces(inlined(d))]
    counts = [c for c in counts if c > max(past, SMALL)]
    for one in (a for a, n in axes.items() if n is None and a not in ties) if counts else ():
        for count in counts:  # one axis at a time past the largest count an evaluation can hold, the others small
            rng = np.random.default_rng(len(plans))  # past the seeds of the draws before
            sizes = {a: n if n is not None else int(rng.integers(count + BESIDE + 1, count + BESIDE + 8)) if a == one
                     else int(rng.integers(1, BESIDE + 1)) for a, n in axes.items()}
            sizes = {a: sizes[ties.get(a, a)] for a in sizes}
            if count == counts[-1] or _too_large(spaces, sizes) is None:  # the smallest, where none fits: left out
                plans.append(Plan(rng, sizes, beyond=count, optional=True))
                break
    kept, left = [], []
    for plan in plans:
        why = _too_large(spaces, plan.sizes)
        if why is None:
            kept.append(plan)
        elif proved or plan.optional:  # fused_moe: t past f = 128 beside e = 64, d = 64 is 7e7 points
            left.append(f"the draw at {plan.described(axes)} left out: too large to evaluate ({why})")
        else:
            raise NapkinError(error("lower.backward_untestable", forward=forward.name, why=(
                f"a draw at sizes {plan.described(axes)} is too large to evaluate ({why}): prove the join instead")))
    return axes, past, kept, left


def _too_large(spaces: Sequence[tuple[str, ...]], sizes: dict[str, int]) -> str | None:
    """Why an evaluation over ``spaces`` (``evaluate.iteration_spaces``) at ``sizes`` is refused as too
    large (``eval.too_large``: ``evaluate.refuse_too_large``'s measure), or None where it is not."""
    points, space = largest_space(spaces, sizes)
    if points <= MAX_POINTS_EVALUATED:
        return None
    return (f"{points:.3g} points over [{' '.join(space)}] in one box, past the {MAX_POINTS_EVALUATED:.3g} an "
            f"evaluation may hold")


def _reduced(nodes: Sequence[Expr], axes: dict[str, int | None]) -> tuple[int, list[int]]:
    """The largest declared size of ``axes`` that a reduction, contraction, normalisation or scan of ``nodes``
    (``_nodes``) runs over (0 if none), and the counts a term may read through such boxes, largest first: each
    box's product of the declared sizes it runs over (``sum[d, e](W·0 + 1)`` is d·e), and the product of every
    declared size any of them runs over, a bound on several boxes' counts multiplied (``sum[d](V·0 + 1) ·
    sum[e](U·0 + 1)`` is d·e too; not on a power of one, ``square(sum[d](V·0 + 1))``).  A factor
    ``min(1, c / t)`` of such a count c is 1 up to t = c (``_draws`` draws past it)."""
    declared: dict[str, int] = {}
    counts: set[int] = set()
    for node in nodes:
        if isinstance(node, Box) and node.op in OPS and OPS[node.op].kind in _REDUCING:
            sizes = {a: n for a in node.target if (n := axes.get(a))}
            declared |= sizes
            counts |= {math.prod(sizes.values())} if sizes else set()
    counts |= {math.prod(declared.values())} if declared else set()
    return max(declared.values(), default=0), sorted(counts, reverse=True)


def _relations_within(b: Diagram, values: Sequence[object], errors: Sequence[object], sizes: dict[str, int],
                      drawn: str) -> None:
    """Raise ``lower.backward_wrong`` where a relation ``b`` states (``given L = ...``,
    ``terms.relations``) differs from the value the join feeds it by more than ``SAFETY`` times the
    two running error bounds: the pass is claimed only where its relations hold (``prove_join``
    proves it where it can; this is the tested join's check)."""
    names = [p.name for p in b.inputs]
    for name in relations(b.inputs):
        k = names.index(name)
        stated, picked = relation_diagram(b, name)
        (value,), (err,) = evaluate_bounded(stated, [values[i] for i in picked], [errors[i] for i in picked],
                                            sizes=sizes)
        fed = np.asarray(values[k], np.float64)
        with np.errstate(invalid="ignore"):
            close = (value == fed) | (np.isnan(value) & np.isnan(fed)) | \
                (np.abs(value - fed) <= SAFETY * (err + np.asarray(errors[k], np.float64)))
        if not np.all(close):
            where = tuple(int(i) for i in np.argwhere(~np.broadcast_to(close, np.shape(fed)))[0])
            raise NapkinError(error("lower.backward_wrong", why=(
                f"`{b.name}` states `{name}` by a relation that the value fed to it does not satisfy: at {list(where)} "
                f"it is {fed[where]:.6g} and the relation gives {np.broadcast_to(value, fed.shape)[where]:.6g}, "
                f"with sizes {drawn}")))


def _drawn(rng: np.random.Generator, shape: list[int], scale: float, vocabulary: int,
           clamped: bool = False) -> np.ndarray:
    """Seeded normals at ``scale``, or with a ``vocabulary`` (a label input) positions in
    ``[0, vocabulary)``, the first and the last among them where there is room; ``clamped``
    (a gather's positions, which it clamps into the vocabulary) also -1 and ``vocabulary``, and
    a repeated position: a backward dropping row 0, rows past the last or a repeat's second
    read is wrong there."""
    if not vocabulary:
        return scale * rng.standard_normal(shape)
    drawn = rng.integers(-1 if clamped else 0, vocabulary + 1 if clamped else vocabulary, shape)
    flat = drawn.reshape(-1)
    edges = [0, vocabulary - 1, -1, vocabulary, 0] if clamped else [0, vocabulary - 1]
    flat[:len(edges)] = edges[:flat.size]
    return drawn.astype(np.float64)


def drawn_integers(rng: np.random.Generator, shape: list[int], mask: bool = False,
                   emptied: int | None = None, beyond: int | None = None) -> np.ndarray:
    """An ``int`` input (segment ids, lengths): 1s then 2s along its last axis, both present
    where there is room, so that segment ids of queries and keys share their documents and a
    length keeps a key.  A ``mask`` (a ``select``'s) is 0s and 1s instead, 1 at position 0 along
    each axis, so that every row along any axis keeps an entry and the others are masked: 1s and
    2s masked none.

    ``emptied`` (the input's number k among the drawn ``int`` inputs): rows a data mask empties
    too, where a backward's exp(S - L) is exp(-inf + inf) = NaN and the VJP's gradient 0 (README
    "Derived backward").  Position 0 along the last axis is -k (so a length 0, or a document id
    no other input holds: a query with no key), other positions as above; a mask of two or more
    axes is 0 on every slice through position 0 of an axis and 1 at the last position of each axis
    elsewhere (every line along any axis through position 0 of another is empty, the others keep
    an entry), one of one axis or none 0 everywhere.  The last position is then above every other
    value, its own (k + 1 past the largest id drawn), and ``_tested`` numbers the inputs one way in
    the first emptied draw and the other way in the second, so that for each pair of inputs each
    holds the smallest and the largest id in some draw: an order mask ``le(Dx, Dq)`` (a key's
    document at or before the query's) empties the row of a query below every key only where
    the queries' ids hold the smallest (an unguarded exp(S - L) there was NaN, the VJP 0, and
    lowered with the opt-in).

    ``beyond`` (a draw past the diagrams' largest constant, ``_constants``): the ids reach past it
    too, as the sizes do: the last two positions along the last axis (where it has four or more)
    are beyond + 1 and beyond + 2 (at least 3 and 4), so that two documents whose ids a constant
    term would merge are both drawn (``eq(min(Dq, 2), min(Dx, 2))`` is ``eq(Dq, Dx)`` on ids 1 and
    2 alone, and merges documents 3 and 4: a dV of 0.563 where the VJP's is -0.91); a scalar (a
    length) is drawn from 1 to beyond + 2."""
    if mask:
        drawn = np.asarray(rng.integers(0, 2, shape))
        for k in range(len(shape)):
            drawn[(slice(None),) * k + (0 if emptied is None else -1,)] = 1
        if emptied is not None:
            if len(shape) <= 1:
                drawn[...] = 0
            for k in range(len(shape)):
                drawn[(slice(None),) * k + (0,)] = 0
        return drawn.astype(np.float64)
    top = 2 if beyond is None else max(beyond, 2) + 2
    drawn = np.sort(rng.integers(1, 3, shape), axis=-1) if shape else np.asarray(rng.integers(1, top + 1))
    if shape and shape[-1] >= 2:
        drawn[..., 0], drawn[..., -1] = 1, 2
    if shape and shape[-1] >= 4 and beyond is not None:
        drawn[..., -2], drawn[..., -1] = top - 1, top
    if emptied is not None:
        drawn[(..., 0) if shape else ...] = -emptied
        if shape and shape[-1] >= 2:
            drawn[..., -1] = top + 1 + emptied
    return drawn.astype(np.float64)


def _nodes(diagrams: Sequence[Diagram]) -> list[Expr]:
    """Every node of ``diagrams``' terms (calls inlined), as ``walk`` reaches them."""
    return [node for d in diagrams for flat in (inlined(d),)
            for expr in (*(let.expr for let in flat.body), *flat.outputs) for node in walk(expr)]


def _constants(diagrams: Sequence[Diagram], nodes: Sequence[Expr], axes: dict[str, int | None]) -> int:
    """The largest constant of ``diagrams`` (``nodes``: ``_nodes``), rounded up to an integer: each
    finite literal of their terms by its magnitude rounded up (a factor ``min(1, 14.5 / t)`` is 1 up to
    t = 14 and differs from 1 only past 14.5, so the draws take t >= 16), the value of each constant
    term that a term reads (``_folded``, bindings read through: a declared axis's size read as a
    scalar, ``min(1, d / t)`` with d = 64 is 1 up to t = 64; arithmetic of constants, ``exp(3)``,
    ``4 * 4``; not the parts of a constant term, ``rsqrt(d)`` counts 0.125), the integers of their index
    predicates and the values of their integer arithmetic (a window ``s + 4 * 4``), and the sizes of
    declared axes an index predicate compares against (a position along ``d = 64`` reaches 63); not
    the size of a declared axis a reduction runs over (``_reduced``: every symbolic axis drawn past a
    head size of 64 put attention's draws at 65⁵ entries and past the machine's memory; ``_draws``
    draws past it one axis at a time).  A
    guarded shift's -FLOAT_MAX (``max(L, -FLOAT_MAX)``, ``grad._weights``) is not counted: no size
    reaches it, and it is the statistic itself wherever that is not -inf."""
    found = [0]
    guards = {id(node.args[1]) for node in nodes if isinstance(node, Box) and node.op == "maximum"
              and node.args[1] == Const(-FLOAT_MAX)}
    for node in nodes:
        if isinstance(node, Const) and math.isfinite(node.value) and id(node) not in guards:
            found.append(math.ceil(abs(node.value)))
        elif isinstance(node, Box) and node.index is not None:
            found += [abs(n) for n in _index_integers(node.index)]
            found += [axes[a] or 0 for a in node.target if a in axes]
    for d in diagrams:
        flat = inlined(d)
        defs, values = flat.bindings(), dict[int, float | None]()
        for root in (*(let.expr for let in flat.body), *flat.outputs):
            for node in walk(root):
                terms = [node] if node is root else []
                if isinstance(node, (Box, Apply)) and _folded(node, axes, defs, values) is None:
                    terms += node.args
                found += [math.ceil(abs(v)) for t in terms if not isinstance(t, Const)
                          and (v := _folded(t, axes, defs, values)) is not None and math.isfinite(v)]
    return max(found)


def _folded(node: Expr, axes: dict[str, int | None], defs: dict[str, Expr],
            values: dict[int, float | None]) -> float | None:
    """``node``'s value where it is a constant term (no input, no symbolic size: its leaves literals,
    declared axes' sizes and bindings of such terms, scalars throughout), evaluated in float64 as the
    diagrams are; None otherwise (memoised in ``values`` by the node's id)."""
    if id(node) in values:
        return values[id(node)]
    values[id(node)] = None  # a binding read through is no cycle, but stay safe
    value: float | None = None
    if isinstance(node, Const):
        value = node.value
    elif isinstance(node, Size):
        size = axes.get(node.axis)
        value = None if size is None else float(size)
    elif isinstance(node, Var) and node.name in defs and not node.axes:
        value = _folded(defs[node.name], axes, defs, values)
    elif isinstance(node, Box) and not node.axes and node.index is None and not node.target and node.args \
            and all(_folded(a, axes, defs, values) is not None for a in node.args):
        declared = tuple(Axis(a, n) for a, n in axes.items() if n is not None)
        term = replace(node, args=tuple(Const(float(values[id(a)] or 0.0)) for a in node.args))
        try:
            with np.errstate(all="ignore"):
                value = float(np.asarray(evaluate(Diagram("constant", (), (), (term,), ((),), declared), [])))
        except (NapkinError, ValueError, TypeError, ArithmeticError, KeyError):
            value = None
    values[id(node)] = value
    return value


def _long(nodes: Sequence[Expr], reducing: Sequence[Expr], axes: dict[str, int | None]) -> list[str]:
    """The symbolic axes of ``axes`` that a scan (``cumsum``, ``linrec``) of ``nodes`` (``_nodes``) runs along, or
    a reduction (``sum``, ``prod``, ``logsumexp``, ...), a contraction or a normalisation of ``reducing`` (some of
    ``nodes``) runs over, in order: the axes whose length a value may grow with (exp of a running sum or of a sum,
    a product of many entries), which a backward recomputing it reads at that length.  ``_draws`` draws them long
    with ``reducing`` the forward's nodes, and with every node (an axis only a backward reduces, attention's queries
    in dK) where an evaluation can hold the draw: drawn long beside 1 to 3 keys, a mask relative to position (a
    window) empties the later queries' rows, which the other draws do not (an unguarded exp(S - L) is NaN there,
    the VJP's gradient 0)."""
    found: list[str] = []
    for kinds, walked in (({"scan"}, nodes), (_REDUCING, reducing)):
        for node in walked:
            if isinstance(node, Box) and node.op in OPS and OPS[node.op].kind in kinds:
                found += [a for a in node.target if axes.get(a, 0) is None and a not in found]
    return found


#: the kinds of box whose value may grow with the length of the axes they reduce (``_long``)
_REDUCING = frozenset({"scan", "reduce", "contract", "ncontract", "normalise"})


def _ties(nodes: Sequence[Expr], axes: dict[str, int | None]) -> dict[str, str]:
    """Each symbolic axis of ``axes`` that a ``rename`` of ``nodes`` (``_nodes``) ties to
    another, to the first of its tied axes in ``axes``' order: the evaluator reads ``rename[t -> s]``
    only where s has t's size."""
    order = {a: k for k, a in enumerate(axes)}
    root = {a: a for a, n in axes.items() if n is None}

    def find(a: str) -> str:
        while root[a] != a:
            a = root[a]
        return a
    for node in nodes:
        if isinstance(node, Box) and node.op == "rename":
            for src, dst in zip(node.target, node.out, strict=True):
                if src in root and dst in root:
                    first, second = sorted((find(src), find(dst)), key=order.__getitem__)
                    root[second] = first
    return {a: find(a) for a in root if find(a) != a}


def _index_integers(index: Pred | IndexExpr) -> list[int]:
    """The integers of an index expression or predicate, and the value of each of its sub-expressions
    that holds no position (``s + 4 * 4`` reaches 16: a window of width 16)."""
    Found = tuple[list[int], int | None]  # the integers met, and the expression's value where it is one

    def expr(e: IndexExpr) -> Found:
        def arith(op: str, a: Found, b: Found) -> Found:
            value = None if a[1] is None or b[1] is None else INDEX_ARITH[op](a[1], b[1])
            return a[0] + b[0] + ([value] if value is not None else []), value
        return fold_index(e, lambda _: ([], None), lambda n: ([n], n), arith)

    if isinstance(index, (Cmp, Logic)):
        return fold_pred(index, lambda _, a, b: expr(a)[0] + expr(b)[0], lambda _, a, b: a + (b or []))
    return expr(index)[0]


def _labels(forward: Diagram, backwards: Sequence[Diagram], ln: Link,
            reads: tuple[str, ...] = ("onehot",)) -> dict[int, str]:
    """The forward inputs that hold labels, by position, each with the axis it indexes: read
    by a ``onehot`` in the forward, or in a backward that takes them as inputs (with ``reads``
    ("gather",), those read as a ``gather``'s positions instead)."""
    position = {p.name: i for i, p in enumerate(forward.inputs)}
    found = {position[name]: axis for name, axis in label_inputs(inlined(forward), reads).items()
             if name in position}
    for b, row in zip(backwards, ln.sources, strict=True):
        names = {p.name: source for p, source in zip(b.inputs, row, strict=True)}
        for name, axis in label_inputs(inlined(b), reads).items():
            kind, i = names.get(name, ("", -1))
            if kind == "input":
                found.setdefault(i, axis)
    return found


def _masks(forward: Diagram, backwards: Sequence[Diagram], ln: Link) -> set[int]:
    """The forward inputs a ``select`` reads as its mask as they are (through bindings, not through a
    comparison such as ``lt(index[x](x), len)``, whose operands are no masks), in the forward or in a
    backward that takes them as inputs."""
    found: set[int] = set()
    for d, names in ((forward, {p.name: ("input", i) for i, p in enumerate(forward.inputs)}),
                     *((b, {p.name: s for p, s in zip(b.inputs, row, strict=True)})
                       for b, row in zip(backwards, ln.sources, strict=True))):
        flat = inlined(d)
        defs = flat.bindings()
        for expr in (*(let.expr for let in flat.body), *flat.outputs):
            for node in walk(expr):
                if isinstance(node, Box) and node.op == "select":
                    mask = node.args[0]
                    while isinstance(mask, Var) and mask.name in defs:
                        mask = defs[mask.name]
                    kind, i = names.get(mask.name, ("", -1)) if isinstance(mask, Var) else ("", -1)
                    if kind == "input":
                        found.add(i)
    return found


def _tuple(value: object) -> tuple:
    return value if isinstance(value, tuple) else (value,)

#: the docstring line on gradients, by target
GRADIENTS = {
    "pallas": "Gradients: a jax.custom_vjp; residuals are the inputs only; the backward is the diagram's VJP "
              "(napkin_cat.grad) lowered unscheduled to plain JAX, its intermediates materialised whole.",
    "mosaic": "Gradients: a jax.custom_vjp; residuals are the inputs only; the backward is the diagram's VJP "
              "(napkin_cat.grad) lowered unscheduled to plain JAX, its intermediates materialised whole.",
    "jax": "Gradients: jax.grad differentiates this code; the streamed step is checkpointed (the backward keeps "
           "per-chunk carries, not the whole of any streamed axis).",
}


def differentiable(forward: ast.FunctionDef, diagram: Diagram, target: str, params: Sequence[str],
                   reserved: Sequence[str]) -> tuple[list[ast.FunctionDef], str]:
    """The functions to put in the module, the public one last (its first statement a
    docstring for the caller to write), and the docstring's gradient line.

    ``forward`` is named as the public function; ``reserved`` are the module-level names
    (helpers, imports) nothing may shadow."""
    if target == "jax":
        return [forward], GRADIENTS[target]
    public = forward.name
    namer = cg.Namer([*reserved, public, *params])
    try:
        lay = layout(f"{diagram.name}_vjp", vjp(diagram), Schedule(), {}, "jax")
        back_name = namer.fresh(f"{public}_backward")
        back_params = [cg.Namer(reserved).fresh(p) for p, _ in lay.flat.inputs]
        backward = jax_target.emit_function(lay, back_name, back_params, "The VJP diagram, unscheduled.", "float32",
                                            cg.Namer([*reserved, back_name, *back_params]))
    except NapkinError as exc:
        return [forward], f"Gradients: not available (the VJP diagram does not lower: {exc})."
    fwd_name = namer.fresh(f"{public}_forward")
    forward.name = fwd_name
    forward.body = forward.body[1:] if isinstance(forward.body[0], ast.Expr) else forward.body
    forward.body.insert(0, ast.Expr(ast.Constant("The forward kernel (the public function's primal).")))
    keyword = ", interpret=interpret"
    run, run_fwd, run_bwd, args, cts, grads = (namer.fresh(n) for n in ("run", "run_fwd", "run_bwd", "args", "cts",
                                                                        "grads"))
    listed = ", ".join(params)
    text = f'''
def {public}({listed}, *, interpret=None):
    @jax.custom_vjp
    def {run}(*{args}):
        return {fwd_name}(*{args}{keyword})

    def {run_fwd}(*{args}):
        return {fwd_name}(*{args}{keyword}), {args}

    def {run_bwd}({args}, {cts}):
        {grads} = {back_name}(*{args}, *({cts} if isinstance({cts}, tuple) else ({cts},)))
        {grads} = {grads} if isinstance({grads}, tuple) else ({grads},)
        return tuple(g.astype(jnp.result_type(a)) for g, a in zip({grads}, {args}))

    {run}.defvjp({run_fwd}, {run_bwd})
    return {run}({listed})
'''
    wrapper = ast.parse(text).body[0]
    assert isinstance(wrapper, ast.FunctionDef)
    wrapper.body[:0] = [ast.Expr(ast.Constant("")), *_checked_inputs(forward)]
    return [forward, backward, wrapper], GRADIENTS[target]


def _checked_inputs(forward: ast.FunctionDef) -> list[ast.stmt]:
    """The forward's ``bind_sizes`` call, to run in the public function before ``jax.custom_vjp``
    traces the inputs: it reads concrete arrays (an ``int`` input past int32 is refused there,
    not wrapped; ``runtime.bind_sizes``)."""
    found: list[ast.stmt] = [ast.Expr(s.value) for s in forward.body[:3] if isinstance(s, ast.Assign) and isinstance(
        s.value, ast.Call) and isinstance(s.value.func, ast.Name) and s.value.func.id == "bind_sizes"]
    return found[:1]


def joined(forward: ast.FunctionDef, kernels: Sequence[ast.FunctionDef], names: Sequence[str], ln: Link, target: str,
           params: Sequence[str], reserved: Sequence[str]) -> tuple[list[ast.FunctionDef], str]:
    """The forward kernel (under a private name), the backward ``kernels`` (from the theorems
    ``names``) and the public ``jax.custom_vjp`` function last, with the docstring's gradient
    line; as ``differentiable``."""
    public = forward.name
    namer = cg.Namer([*reserved, public, *params, *(k.name for k in kernels)])
    fwd_name = namer.fresh(f"{public}_forward")
    forward.name = fwd_name
    keyword = ", interpret=interpret" if target != "jax" else ""
    run, run_fwd, run_bwd, args, outs, res, cts, tupled = (
        namer.fresh(n) for n in ("run", "run_fwd", "run_bwd", "args", "outs", "res", "cts", "as_tuple"))
    primal = ", ".join(f"{outs}[{j}]" for j in ln.primal) + ("," if len(ln.primal) == 1 else "")
    picked = f"{outs}[{ln.primal[0]}]" if len(ln.primal) == 1 else f"({primal})"
    calls = []
    terms: dict[int, list[str]] = {}
    for k, (kernel, row, gives) in enumerate(zip(kernels, ln.sources, ln.targets, strict=True)):
        operands = ", ".join(f"{ {'input': args, 'output': outs, 'cotangent': cts}[kind] }[{i}]" for kind, i in row)
        got = namer.fresh(f"g{k}")
        calls.append(f"{got} = {tupled}({kernel.name}({operands}{keyword}))")
        for m, i in enumerate(gives):
            terms.setdefault(i, []).append(f"{got}[{m}]")
    summed = ", ".join(f"({' + '.join(terms[i])}).astype(jnp.result_type({args}[{i}]))" if i in terms else
                       f"jnp.zeros_like({args}[{i}])" for i in range(len(params)))
    body = "\n        ".join(calls)
    listed = ", ".join(params)
    text = f'''
def {public}({listed}{", *, interpret=None" if target != "jax" else ""}):
    def {tupled}(value):
        return value if isinstance(value, tuple) else (value,)

    @jax.custom_vjp
    def {run}(*{args}):
        {outs} = {tupled}({fwd_name}(*{args}{keyword}))
        return {picked}

    def {run_fwd}(*{args}):
        {outs} = {tupled}({fwd_name}(*{args}{keyword}))
        return {picked}, ({args}, {outs})

    def {run_bwd}({res}, {cts}):
        {args}, {outs} = {res}
        {cts} = {tupled}({cts})
        {body}
        return ({summed},)

    {run}.defvjp({run_fwd}, {run_bwd})
    return {run}({listed})
'''
    wrapper = ast.parse(text).body[0]
    assert isinstance(wrapper, ast.FunctionDef)
    wrapper.body[:0] = [ast.Expr(ast.Constant("")), *_checked_inputs(forward)]
    saved = f"returns {', '.join(ln.names[j] for j in ln.primal)}" + (
        f" and saves {', '.join(n for j, n in enumerate(ln.names) if j not in ln.primal)} for the backward"
        if len(ln.names) > len(ln.primal) else "")
    line = (f"Gradients: a jax.custom_vjp; the forward kernel {saved}; residuals are the inputs and the forward's "
            f"outputs; the backward kernels {', '.join(names)} (each proved by its theorem, its docstring in this "
            f"module) give the input gradients. That the backward diagrams together are the forward's VJP is "
            f"{ln.trust}." + ("" if ln.proved else " WARNING: the join is not proved; it was lowered on the test "
                                                  "alone (allow_tested_join, --allow-tested-join)."))
    return [forward, *kernels, wrapper], line
