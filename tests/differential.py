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
  Outputs whose finite magnitude reaches 1e30 are f32 overflow, not a lowering question (no
  case: a stream whose accumulator overflows where the box does not is refused by the kernel's
  stream rule, ``certify.float_safety``);
- a kernel that differs from the evaluator only as far as float32 rounding of the reference
  computation explains is ``F32_ROUNDING``, reported apart and counted, not a mismatch: where
  every position it leaves the tolerance at lies within ``SPREADS`` times the spread of the
  float64 answer when every input value, offsets included, moves by ``NUDGE`` (two f32 ulps)
  of itself (``conditioning``: a normaliser near 0, a sum that cancels; a value 10⁴ + g is
  exact in f32, but a kernel's products of it round at 10⁴'s ulp), or where the evaluator
  itself in f32 (``evaluate.FLOAT32``) leaves the tolerance (a weight that underflows to 0
  against an infinite value).  A kernel further off is a mismatch however ill-conditioned the
  case (``tests/test_differential.py`` injects such bugs).  Until 2026-12-05 both were filters
  that dropped the case before it ran, and the nudge moved only each input's grid part, which
  missed differential_40's 4000-fold cancellation of two products 3·(-10⁴ + g);
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

__all__ = ["F32_ROUNDING", "KINDS", "LOWER_REFUSALS", "MODULES", "TARGETS", "XLA_FOLD", "conditioning",
           "judge", "run_case", "within"]

#: the modules a case draws from: three in four of the attention family (``attention_texts``,
#: where masks on scores and values meet accumulators), else any (``modules``)
MODULES = st.integers(0, 3).flatmap(lambda k: modules(max_diagrams=2) if k == 0 else attention_texts().map(loads))

TARGETS = ("jax", "pallas")

#: how an input may be drawn (module docstring), the plain grid twice as often
KINDS = ("grid", "grid", "scaled", "offset", "zero")

#: the outcome of a case that differs only by XLA's jit-only 0·inf fold (module docstring)
XLA_FOLD = "ran, differing only by XLA's jit-only 0·inf fold"

#: the outcome of a case that differs from the evaluator only as far as float32 rounding of the
#: reference computation explains (module docstring: ``conditioning``, ``within``)
F32_ROUNDING = "ran, differing only as float32 rounding explains"

#: ``conditioning``'s nudges: each input value moves by NUDGE of itself (times a standard
#: normal draw: two ulps of f32, whose kernels round every product and sum at one half), in
#: NUDGES draws; ``within`` explains a difference up to SPREADS times the largest move
NUDGE = 2.0**-22
NUDGES = 3
SPREADS = 4

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


def run_case(module: Module, data: st.DataObject, compiler_options: dict[str, Any] | None = None,
             notes: list[str] | None = None) -> dict[str, str] | None:
    """Outcome per target (``"ran"``, for Pallas with ``", skipping masked chunks"`` where
    ``masks.stream_masks`` let it skip and ``", unmasking full chunks"`` where
    ``skip.unmaskable`` let it leave masks out, or the refusal's code), None when no case arises (no
    partition accepted, sizes a reshape cannot honour, f32 overflow); raises AssertionError
    on a kernel that disagrees with the evaluator.  ``compiler_options`` go to XLA's compile
    of each kernel (``jax.stages.Lowered.compile``; the benchmark lowers most cases'
    ``xla_backend_optimization_level``, which leaves the HLO passes as they are).  Each run
    judged ``F32_ROUNDING`` is described in ``notes`` (as a mismatch would be)."""
    diagram = data.draw(st.sampled_from(module.diagrams))
    thm = kernel.unfold(kernel.refl("t", diagram))
    thm = _schedule(thm, data.draw(schedule_steps(thm.result)))
    if not thm.schedule.partitions:
        return None
    sizes = _sizes(data.draw, thm)
    if any(isinstance(c.dividend, str) and isinstance(c.divisor, int) and sizes[c.dividend] % c.divisor
           for c in thm.constraints):
        return None  # a declared size that a tile without pad does not divide
    inputs_seed = data.draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(inputs_seed)
    drawn = [_input(data.draw, rng, [sizes[a] for a in p.axes]) for p in thm.source.inputs]
    kinds = ", ".join(f"{p.name} {kind}" for p, (_, _, kind) in zip(thm.source.inputs, drawn, strict=True))
    return judge(thm, sizes, [base + grid for base, grid, _ in drawn], rng, compiler_options,
                 f"inputs seed {inputs_seed} ({kinds})", notes)


def judge(thm: kernel.Theorem, sizes: dict[str, int], values: list[np.ndarray], rng: np.random.Generator,
          compiler_options: dict[str, Any] | None = None, drawn: str = "",
          notes: list[str] | None = None) -> dict[str, str] | None:
    """``run_case`` from the inputs' ``values`` (f32-exact, in the source's input order) on: the
    evaluator's answer, each target run and judged against it (module docstring); ``rng`` draws
    the nudges of ``conditioning``, ``drawn`` says in a mismatch how the inputs were drawn, and
    ``notes`` receives the description of each run judged ``F32_ROUNDING``."""
    arrays = related(thm.source, values, sizes)  # relations: README "Proofs"
    try:
        want = cases.as_tuple(evaluate(thm.source, arrays, sizes=sizes))
    except NapkinError as exc:
        assert set(exc.codes) <= SIZE_REFUSALS, exc.diagnostics
        return None
    wants = [np.asarray(w, np.float64) for w in want]
    if any(np.any(np.abs(w[np.isfinite(w)]) >= 1e30) for w in wants):
        return None
    spreads = conditioning(thm, values, wants, sizes, rng)
    with np.errstate(all="ignore"):
        in_f32 = cases.as_tuple(evaluate(thm.source, arrays, sizes=sizes, algebra=FLOAT32))
    f32_off = not all(cases.agrees(np.asarray(m, np.float64), w) for m, w in zip(in_f32, wants, strict=True))
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
            explained = f32_off or all(within(np.asarray(g, np.float64), w, s)
                                       for g, w, s in zip(got, wants, spreads, strict=True))
            described = (
                f"the {target} kernel differs from the evaluator at {sizes} for\n{print_diagram(thm.result)}"
                + "".join(f"\n  {print_step(p)}" for p in thm.schedule.partitions)
                + "\n  inputs: " + ", ".join(f"{p.name} max |{float(np.max(np.abs(a), initial=0)):.3g}|"
                                             for p, a in zip(thm.source.inputs, arrays, strict=True))
                + (f"; {drawn}" if drawn else "")
                + "\n  largest difference: " + ", ".join(f"{_largest(np.asarray(g, np.float64), w, s)}"
                                                         for g, w, s in zip(got, wants, spreads, strict=True)))
            if not explained:
                raise AssertionError(described)
            if notes is not None:
                notes.append(described + ("; the f32 evaluator leaves the tolerance too" if f32_off else ""))
            outcome[target] = F32_ROUNDING
            continue
        lay = lowered.layout
        skips = lay.stream is not None and stream_masks(lay.flat, lay.stream, lay.plans, lay.grid) is not None
        unmasks = bool(unmaskable(lay))
        outcome[target] = "ran" if target != "pallas" else \
            "ran" + (", skipping masked chunks" if skips else "") + (", unmasking full chunks" if unmasks else "")
    return outcome


def conditioning(thm: kernel.Theorem, values: list[np.ndarray], wants: list[np.ndarray], sizes: dict[str, int],
                 rng: np.random.Generator) -> list[np.ndarray]:
    """Per output, how far the float64 evaluator's answer moves, at each position, when every
    input value moves by ``NUDGE`` of itself (``NUDGES`` draws, each value by an independent normal
    factor; integer inputs stay): the answer's float32 conditioning.  Every operand moves, offsets
    included: a value 10⁴ + g is exact in f32, but a kernel's products and sums of it round at
    10⁴'s ulp (two products 3·10⁴ that cancel to 7.86, BENCHMARKS.md "Rerun on 2026-12-05").
    0 where the answer stays, inf where it leaves or enters a non-finite value."""
    spreads = [np.zeros(np.shape(w)) for w in wants]
    for _ in range(NUDGES):
        nudged = [v if p.integer else v * (1 + NUDGE * rng.standard_normal(np.shape(v)))
                  for p, v in zip(thm.source.inputs, values, strict=True)]
        with np.errstate(all="ignore"):
            moved = cases.as_tuple(evaluate(thm.source, related(thm.source, nudged, sizes), sizes=sizes))
            for k, (m, w) in enumerate(zip(moved, wants, strict=True)):
                m = np.asarray(m, np.float64)
                same = (m == w) | (np.isnan(m) & np.isnan(w))
                apart = np.where(same, 0.0, np.abs(m - w))
                spreads[k] = np.maximum(spreads[k], np.where(np.isnan(apart), np.inf, apart))
    return spreads


def within(got: np.ndarray, want: np.ndarray, spread: np.ndarray, tol: float = 1e-4) -> bool:
    """Whether ``got`` is the evaluator's ``want`` as far as its float32 conditioning
    (``conditioning``'s ``spread``) allows: at every position it agrees (``lower_cases.agrees``),
    or it is finite and within the tolerance plus ``SPREADS`` spreads of a finite answer, or the
    answer itself becomes or leaves a non-finite value under the nudge (an infinite spread)."""
    finite = np.isfinite(want)
    scale = max(1.0, float(np.max(np.abs(want[finite]), initial=0.0)))
    with np.errstate(invalid="ignore"):
        apart = np.abs(got - want)
        close = finite & np.isfinite(got) & (apart <= tol * scale + SPREADS * spread)
    same = (np.isinf(want) & (got == want)) | (np.isnan(want) & np.isnan(got))
    return bool(np.all(close | same | np.isinf(spread)))


def _largest(got: np.ndarray, want: np.ndarray, spread: np.ndarray) -> str:
    """The position where ``got`` leaves ``want`` furthest (a NaN or infinity first): both
    values, and ``conditioning``'s spread there."""
    with np.errstate(invalid="ignore"):
        apart = np.where((got == want) | (np.isnan(got) & np.isnan(want)), 0.0, np.abs(got - want))
    apart = np.where(np.isnan(apart), np.inf, apart)
    at = np.unravel_index(int(np.argmax(apart)), np.shape(apart)) if np.ndim(apart) else ()
    return (f"at {tuple(int(i) for i in at)} kernel {float(got[at]):.9g}, evaluator {float(want[at]):.9g}, "
            f"spread {float(spread[at]):.3g}")


def _input(draw: Any, rng: np.random.Generator, shape: list[int]) -> tuple[np.ndarray, np.ndarray, str]:
    """One input as (offset, grid part, how it was drawn), their sum exact in f32 (module
    docstring, ``KINDS``)."""
    kind = draw(st.sampled_from(KINDS))
    grid = rng.integers(-300, 301, shape) / 100
    base = np.zeros(shape)
    if kind == "scaled":
        factor = draw(st.sampled_from((10.0, 50.0)))
        grid, kind = grid * factor, f"scaled by {factor:g}"
    elif kind == "offset":
        offset = draw(st.sampled_from((1e2, 1e3, 1e4))) * draw(st.sampled_from((1.0, -1.0)))
        base, kind = base + offset, f"offset by {offset:g}"
    elif kind == "zero":
        grid = np.zeros(shape)
    exact = (base + grid).astype(np.float32).astype(np.float64)
    return base, exact - base, kind


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
