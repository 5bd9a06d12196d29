"""One differential case: a random module's diagram under a random schedule that the kernel
accepted step by step, lowered to both targets and run against the float64 evaluator.

Shared by ``tests/test_differential.py`` (CI, at the hypothesis profile's count) and
``benchmarks/differential.py`` (the recorded run).  ``run_case`` returns what happened on
each target, or raises ``AssertionError`` on a mismatch:

- the diagram comes from ``MODULES`` (``strategies.attention_texts`` and ``strategies.modules``:
  masks on any operand, fills that do and do not equal each padding value), unfolded;
  ``strategies.schedule_steps`` proposes rewrites
  and partitions, and each one the kernel refuses is dropped (the kernel's business, tested
  with its reasons elsewhere); a case without a partition is not a schedule (``None``);
- sizes are ragged (1 to 48, so the 16- and 32-wide stream tiles leave a partial chunk),
  multiples of a tile only where a partition without ``pad`` recorded that it divides the axis;
- each input is drawn as one of ``KINDS`` from a drawn seed: on a 0.01 grid in [-3, 3] (no
  subnormals, which f32 flushes); that grid scaled by 10 or 50 (scores of ``d = 4`` dots up to
  |S| ~ 10⁴); offset by ±10², ±10³ or ±10⁴ (large values with small differences, where exp of
  a shifted score must not lose them); or all zero (empty normalisers); every input is rounded
  to f32 first, so the evaluator and the kernels read the same numbers.  ±inf and fully masked
  rows come from the masks and fills (the theorems' domain is finite inputs);
- each target either refuses the schedule with one of ``LOWER_REFUSALS`` (a diagnostic saying
  what the target cannot serve) or runs it (Pallas with ``interpret=True``), and every output
  must equal the evaluator's within f32 tolerance (``lower_cases.agrees``).
  Outputs whose finite magnitude reaches 1e30 are f32 overflow, not a lowering question, nor
  is a case the evaluator itself cannot hold within the tolerance when every input moves by
  2^-20 of itself (ill-conditioned at f32 precision: a normaliser near 0, a cancelling sum),
  or whose answer the evaluator itself cannot reach in f32 (``evaluate.FLOAT32``: a weight that
  underflows to 0 against an infinite value);
  (a stream whose accumulator overflows where the box does not is refused by the kernel's
  stream rule, ``certify.float_safety``).  The nudge moves each input's grid part, not its
  offset: a value 10⁴ + g is exact in f32 and read as is by the kernel;
- XLA:CPU's jit-only 0·inf fold (BENCHMARKS.md runs G, H;
  ``test_lower_jax.py::test_zero_weights_against_infinite_values_under_jit_differ_only_by_xlas_fold``)
  is reported apart, not as a mismatch: where the jitted kernel differs from the evaluator only
  at positions the evaluator says NaN, and the same function run eagerly
  (``jax.disable_jit``) agrees everywhere, the outcome is ``XLA_FOLD`` (the code is right; the
  compiler folded 0·inf to 0).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from napkin_cat import certify, kernel
from napkin_cat.certify import rules
from napkin_cat.diagnostics import NapkinError
from napkin_cat.elaborate import loads
from napkin_cat.evaluate import FLOAT32, evaluate, related
from napkin_cat.lower import lower
from napkin_cat.lower.skip import unmaskable
from napkin_cat.printer import print_diagram, print_step
from napkin_cat.schedule.masks import stream_masks
from napkin_cat.terms import Module, Partition, Rewrite
from tests import lower_cases as cases
from tests.strategies import SIZE_REFUSALS, attention_texts, modules, schedule_steps

__all__ = ["KINDS", "LOWER_REFUSALS", "MODULES", "TARGETS", "XLA_FOLD", "run_case"]

#: the modules a case draws from: three in four of the attention family (``attention_texts``,
#: where masks on scores and values meet accumulators), else any (``modules``)
MODULES = st.integers(0, 3).flatmap(lambda k: modules(max_diagrams=2) if k == 0 else attention_texts().map(loads))

TARGETS = ("jax", "pallas")

#: how an input may be drawn (module docstring), the plain grid twice as often
KINDS = ("grid", "grid", "scaled", "offset", "zero")

#: the outcome of a case that differs only by XLA's jit-only 0·inf fold (module docstring)
XLA_FOLD = "ran, differing only by XLA's jit-only 0·inf fold"

#: what a target may refuse a checked schedule for, each with a diagnostic (diagnostics.py)
LOWER_REFUSALS = frozenset({
    "lower.grid_consumed", "lower.grid_output", "lower.streams", "lower.mixed_partition", "lower.tile_pow2",
    "lower.stream_mixed", "lower.after_axis", "lower.reshape_padded", "lower.no_pad", "lower.unbound_axis",
    "lower.triton_op", "lower.constant",
})


def _schedule(thm: kernel.Theorem, steps: list[Rewrite | Partition]) -> kernel.Theorem:
    """The theorem with every step the kernel accepts, in order."""
    library = rules.library()
    for step in steps:
        try:
            if isinstance(step, Rewrite):
                lemma = library[step.lemma]
                thm = kernel.rewrite(thm, lemma, step, {lemma.name: certify.certify_lemma(lemma).how})
            elif step.kind == "group":
                thm = kernel.group(thm, step)
            else:
                thm = kernel.stream(thm, step, certify.accumulator)
        except kernel.KernelError:
            continue
    return thm


def _sizes(draw: Any, thm: kernel.Theorem) -> dict[str, int]:
    declared = {**thm.source.axis_sizes(), **thm.result.axis_sizes()}
    divisors: dict[str, int] = {}
    for c in thm.constraints:
        if isinstance(c.dividend, str) and isinstance(c.divisor, int):
            divisors[c.dividend] = max(divisors.get(c.dividend, 1), c.divisor)
    sizes = {}
    for axis, size in declared.items():
        if size is not None:
            sizes[axis] = size
        elif axis in divisors:
            sizes[axis] = divisors[axis] * draw(st.integers(1, 2))
        else:
            sizes[axis] = draw(st.integers(1, 48))
    return sizes


def run_case(module: Module, data: st.DataObject,
             compiler_options: dict[str, Any] | None = None) -> dict[str, str] | None:
    """Outcome per target (``"ran"``, for Pallas with ``", skipping masked chunks"`` where
    ``masks.stream_masks`` let it skip and ``", unmasking full chunks"`` where
    ``skip.unmaskable`` let it leave masks out, or the refusal's code), None when no case arises (no
    partition accepted, sizes a reshape cannot honour, f32 overflow); raises AssertionError
    on a kernel that disagrees with the evaluator.  ``compiler_options`` go to XLA's compile
    of each kernel (``jax.stages.Lowered.compile``; the benchmark lowers most cases'
    ``xla_backend_optimization_level``, which leaves the HLO passes as they are)."""
    diagram = data.draw(st.sampled_from(module.diagrams))
    thm = kernel.unfold(kernel.refl("t", diagram))
    thm = _schedule(thm, data.draw(schedule_steps(thm.result)))
    if not thm.schedule.partitions:
        return None
    sizes = _sizes(data.draw, thm)
    if any(isinstance(c.dividend, str) and isinstance(c.divisor, int) and sizes[c.dividend] % c.divisor
           for c in thm.constraints):
        return None  # a declared size that a tile without pad does not divide
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    drawn = [_input(data.draw, rng, [sizes[a] for a in p.axes]) for p in thm.source.inputs]
    arrays = related(thm.source, [base + grid for base, grid in drawn], sizes)  # relations: README "Proofs"
    try:
        want = cases.as_tuple(evaluate(thm.source, arrays, sizes=sizes))
    except NapkinError as exc:
        assert set(exc.codes) <= SIZE_REFUSALS, exc.diagnostics
        return None
    wants = [np.asarray(w, np.float64) for w in want]
    if any(np.any(np.abs(w[np.isfinite(w)]) >= 1e30) for w in wants):
        return None
    # An ill-conditioned case (a normaliser near 0, a sum that cancels) is no lowering question:
    # the float64 evaluator itself leaves the tolerance when the inputs move by a few f32 ulps.
    nudged = related(thm.source, [base + grid * (1 + 2.0**-20 * rng.choice((-1.0, 1.0), np.shape(grid)))
                                  for base, grid in drawn], sizes)
    moved = cases.as_tuple(evaluate(thm.source, nudged, sizes=sizes))
    if not all(cases.agrees(np.asarray(m, np.float64), w) for m, w in zip(moved, wants, strict=True)):
        return None
    # Nor is a case whose answer f32 arithmetic cannot hold: the evaluator itself in f32 leaves
    # the tolerance (a weight that underflows to 0 against an infinite value, an overflow inside).
    with np.errstate(all="ignore"):
        in_f32 = cases.as_tuple(evaluate(thm.source, arrays, sizes=sizes, algebra=FLOAT32))
    if not all(cases.agrees(np.asarray(m, np.float64), w) for m, w in zip(in_f32, wants, strict=True)):
        return None
    outcome: dict[str, str] = {}
    for target in TARGETS:
        try:
            lowered = lower(thm, target=target)
        except NapkinError as exc:
            assert set(exc.codes) <= LOWER_REFUSALS, exc.diagnostics
            outcome[target] = exc.codes[0]
            continue
        options = {"interpret": True} if target == "pallas" else {}
        inputs = [jnp.asarray(a, jnp.float32) for a in arrays]
        jitted = jax.jit(lambda *a, f=lowered.fn, o=options: f(*a, **o)).lower(*inputs)
        got = cases.as_tuple(jitted.compile(compiler_options)(*inputs))
        if not all(cases.agrees(np.asarray(g, np.float64), w) for g, w in zip(got, wants, strict=True)):
            if _xla_fold(lowered.fn, options, inputs, got, wants):
                outcome[target] = XLA_FOLD
                continue
            raise AssertionError(
                f"the {target} kernel differs from the evaluator at {sizes} for\n{print_diagram(thm.result)}"
                + "".join(f"\n  {print_step(p)}" for p in thm.schedule.partitions)
                + "\n  inputs: " + ", ".join(f"{p.name} max |{float(np.max(np.abs(a), initial=0)):.3g}|"
                                             for p, a in zip(thm.source.inputs, arrays, strict=True)))
        lay = lowered.layout
        skips = lay.stream is not None and stream_masks(lay.flat, lay.stream, lay.plans, lay.grid) is not None
        unmasks = bool(unmaskable(lay))
        outcome[target] = "ran" if target != "pallas" else \
            "ran" + (", skipping masked chunks" if skips else "") + (", unmasking full chunks" if unmasks else "")
    return outcome


def _input(draw: Any, rng: np.random.Generator, shape: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """One input as (offset, grid part), their sum exact in f32 (module docstring, ``KINDS``)."""
    kind = draw(st.sampled_from(KINDS))
    grid = rng.integers(-300, 301, shape) / 100
    base = np.zeros(shape)
    if kind == "scaled":
        grid = grid * draw(st.sampled_from((10.0, 50.0)))
    elif kind == "offset":
        base = base + draw(st.sampled_from((1e2, 1e3, 1e4))) * draw(st.sampled_from((1.0, -1.0)))
    elif kind == "zero":
        grid = np.zeros(shape)
    exact = (base + grid).astype(np.float32).astype(np.float64)
    return base, exact - base


def _xla_fold(fn: Any, options: dict[str, Any], inputs: list[Any], got: tuple[Any, ...],
              wants: list[np.ndarray]) -> bool:
    """Whether the jitted kernel's outputs ``got`` differ from ``wants`` only where the
    evaluator says NaN, and the kernel run eagerly agrees everywhere (module docstring)."""
    for g, w in zip(got, wants, strict=True):
        g = np.asarray(g, np.float64)
        if not cases.agrees(g[~np.isnan(w)], w[~np.isnan(w)]):
            return False
    with jax.disable_jit():
        eager = cases.as_tuple(fn(*inputs, **options))
    return all(cases.agrees(np.asarray(e, np.float64), w) for e, w in zip(eager, wants, strict=True))
