"""Shared cases for the lowering tests: every theorem of proofs/ plus theorems on diagrams
that are not in the repository, random inputs at ragged sizes, tolerances.

Tolerances (documented in README "Kernels"): errors are measured relative to the largest
reference magnitude (at least 1).  f32 kernels must agree with the float64 evaluator to
``F32_TOL``; bf16 kernels (inputs and outputs rounded to bf16, 8-bit mantissa, unit
roundoff 2^-8, f32 arithmetic inside) to ``BF16_TOL``.  On extreme inputs
(``extreme_inputs``: scaled until the scores, the operands of exp, softmax, logsumexp and
normalised contractions, reach ``EXTREME`` = 10⁴ in magnitude, or just short of an output f32
cannot hold) the f32 bound grows with the magnitude |S| of the scores' terms (``largest_score``:
Σ_d |q|·|k| for a dot product, |S| + |L| for S - L) as f32's own rounding of them does
(``extreme_tolerance``: ``F32_TOL + EXTREME_SLOPE·|S|``), since a score computed in f32 is off by
about 2⁻²⁴·|S| and exp carries that error into every weight; kernels with ``dtype`` steps are left
out (bf16 scores near 10⁴ are off by 2⁻⁸·|S| ≈ 40: no bound).
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from napkin_cat import loads
from napkin_cat.certify.approximation import label_inputs
from napkin_cat.evaluate import Named, evaluate, related, sample_integers, visitor
from napkin_cat.kernel import Theorem
from napkin_cat.ops import inlined
from napkin_cat.proof import check_file, check_module, prove
from napkin_cat.terms import Box, run_diagram

ROOT = Path(__file__).resolve().parent.parent
F32_TOL = 2e-5
BF16_TOL = 4e-2
#: the largest magnitude ``extreme_inputs`` drives a diagram's values to
EXTREME = 1e4
#: how far past ``EXTREME`` the terms of scores that cancel are driven (``extreme_inputs``)
CANCELLED = 8
#: the f32 bound's growth per unit of that magnitude: 2^-22, four units of f32 roundoff
EXTREME_SLOPE = 2.0**-22

#: small power-of-two tiles for every tile name the proofs use (interpret mode is slow)
TILES = {name: 32 for name in ("ga", "gc", "sb", "gq", "sx", "wq", "rx", "gt", "sv", "gf", "sd", "sf",
                               "sj", "se")} | {"gg": 1}

#: theorems on diagrams that are not in the repo: several accumulators in one loop, masks
#: with grid offsets, a non-power-of-two head dimension, a whole-axis softmax, a per-head
#: input squeezed to a scalar block, the index box
EXTRA = """
axis t, v, q, x, b, h
axis d = 80

diagram stats(X: [t v]) -> [t], [t], [t], [t], [t] {
  return max[v](X), min[v](X), mean[v](X), logsumexp[v](X), sum[v](where[t v](v <= t + 3, exp(X), 0))
}
theorem streamed_stats: stats {
  group t by gt
  stream v by sv
}

diagram wide(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = contract[d](Q, K) * rsqrt(d)
  P = softmax[x](S)
  O = contract[x](P, V)
  return O
}
theorem flash_wide: wide {
  rewrite softmax_contract at P, O
  group q by gq
  stream x by sx via online_softmax
}
theorem flash_wide_bf16_kv: wide {
  rewrite softmax_contract at P, O
  group q by gq
  stream x by sx via online_softmax
  dtype K, V, S as bf16 tol 0.01
}
theorem grouped_wide: wide {
  group q by gq
}

diagram alibi(Q: [b h q d], K: [b h x d], V: [b h x d], m: [h]) -> [b h q d] {
  S = contract[d](Q, K) * rsqrt(d) - m * index[q x](q - x)
  M = where[q x](q >= x, S, -inf)
  return contract[x](softmax[x](M), V)
}
theorem alibi_grouped: alibi {
  group q by gq
}
"""


@functools.cache
def theorems() -> dict[str, Any]:
    """Every checked theorem: proofs/*.ncd, then ``EXTRA`` (all must check)."""
    found: dict[str, Any] = {}
    results = [r for path in sorted((ROOT / "proofs").glob("*.ncd")) for r in check_file(path)]
    results += check_module(loads(EXTRA, "<extra>"))
    for result in results:
        assert result.theorem is not None, (result.name, result.failure)
        found[result.name] = result.theorem
    return found


@functools.cache
def extreme_names() -> list[str]:
    """The f32 kernels of proofs/ (no ``dtype`` steps): the extreme-input tests' theorems."""
    return sorted(r.name for path in sorted((ROOT / "proofs").glob("*.ncd")) for r in check_file(path)
                  if r.theorem is not None and not r.theorem.approximations)


def proved(text: str, diagram: str, *steps: str) -> Theorem:
    """The kernel's theorem ``diagram { steps }`` over the module ``text`` (named after the diagram)."""
    body = "\n".join(steps)
    return prove(loads(f"{text}\ntheorem {diagram}: {diagram} {{\n{body}\n}}\n"), diagram)


def inputs(theorem: Any, seed: int, low: int = 17, high: int = 100) -> tuple[dict[str, int], list[np.ndarray]]:
    """Ragged sizes for symbolic axes (batch-like axes small) and float64 inputs."""
    rng = np.random.default_rng(seed)
    diagram = theorem.result
    sizes = {}
    for axis in diagram.axes:
        if axis.size is not None:
            sizes[axis.name] = axis.size
        elif axis.name in ("b", "h", "g"):
            sizes[axis.name] = int(rng.integers(1, 4))
        else:
            sizes[axis.name] = int(rng.integers(low, high))
    arrays = []
    labels = label_inputs(diagram)
    for param in diagram.inputs:
        shape = [sizes[a] for a in param.axes]
        if param.name in labels:  # class labels: integer positions along the one-hot axis
            arrays.append(rng.integers(0, sizes[labels[param.name]], size=shape).astype(np.float64))
        elif param.integer:  # segment ids, lengths, page numbers: a few ragged runs, sorted
            arrays.append(sample_integers(rng, shape))
        else:
            arrays.append(rng.standard_normal(shape))
    return sizes, related(diagram, arrays, sizes)  # an input a relation gives: its value (README "Proofs")


def extreme_inputs(theorem: Any, seed: int, low: int = 17, high: int = 60) -> tuple[dict[str, int], list[np.ndarray],
                                                                                   float]:
    """``inputs`` (sizes from ``low`` to ``high``), every input but labels scaled by powers of two
    until the scores (``largest_score``), or in a diagram without any every value it computes, reach
    ``EXTREME`` in magnitude (or the scores' terms ``CANCELLED`` times it: a backward's S - L over one
    key is rounding noise, which never reaches it), or one step short of an output that f32 cannot hold (finite
    past 1e30, or more entries infinite or NaN than at scale 1: f32 overflow, not a lowering
    question), rounded to f32 (the kernels' inputs exactly); and the largest magnitude of the
    scores' terms |S| (``largest_score``; 0 without scores)."""
    sizes, arrays = inputs(theorem, seed, low=low, high=high)
    labels = label_inputs(theorem.result)
    names = [p.name for p in theorem.source.inputs]
    kept, largest, nonfinite = arrays, 0.0, None
    for step in range(60):
        scaled = [a if name in labels else (a * 2.0**step).astype(np.float32).astype(np.float64)
                  for name, a in zip(names, arrays, strict=True)]
        scaled = [a if name in labels else a.astype(np.float32).astype(np.float64)  # relations recomputed, in f32
                  for name, a in zip(names, related(theorem.result, scaled, sizes), strict=True)]
        with np.errstate(all="ignore"):
            outs = [np.asarray(o, np.float64) for o in reference(theorem, scaled, sizes)]
        count = sum(int(np.sum(~np.isfinite(o))) for o in outs)
        nonfinite = count if nonfinite is None else nonfinite
        if count > nonfinite or any(np.any(np.abs(o[np.isfinite(o)]) >= 1e30) for o in outs):
            break
        score, terms, value = largest_score(theorem.source, scaled, sizes)
        kept, largest = scaled, terms
        if score >= EXTREME or terms >= CANCELLED * EXTREME or (score == 0.0 and value >= EXTREME):
            break
    return sizes, kept, largest


#: the boxes whose first operand is a score: exp carries its absolute error into every weight
SCORED = frozenset({"exp", "softmax", "logsumexp", "ncontract"})
#: the boxes whose value on the operands' magnitudes bounds the magnitudes they round (``largest_score``)
MONOTONE = frozenset({"add", "mul", "div", "neg", "contract", "where", "select", "rename", "transpose", "split",
                      "join"})


def largest_score(diagram: Any, arrays: list[np.ndarray], sizes: dict[str, int]) -> tuple[float, float, float]:
    """The largest finite magnitude of a score (the first operand of a ``SCORED`` box), of the terms
    f32 rounds computing it, and of any value ``diagram`` computes, in float64 (calls inlined).  The
    terms: a score's value on the magnitudes of what it sums, Σ_d |q|·|k| for a dot product,
    |S| + |L| for S - L (the value of a ``MONOTONE`` box on its operands' magnitudes, ``sub`` as
    ``add``): f32 rounds each term, so a score whose terms cancel (a dot product of 1e6-sized terms
    giving 1e4, a backward's S - L near 0) is off by 2⁻²⁴ of its terms, not of its value."""
    flat = inlined(diagram)
    exact = visitor(sizes)
    scores, terms, values = [0.0], [0.0], [0.0]
    absolute: dict[int, tuple[Any, Any]] = {}  # by a value's id: it (kept alive, so no other takes its id), its terms

    def terms_of(v: Any) -> Any:
        return absolute[id(v)][1] if id(v) in absolute else Named(v.axes, np.abs(np.asarray(v.data, np.float64)))

    def magnitude(v: Any) -> float:
        data = np.asarray(v.data, np.float64)
        return float(np.max(np.abs(data[np.isfinite(data)]), initial=0.0))

    def visit(node: Any, kids: Any, env: Any) -> Any:
        value = exact(node, kids, env)
        if isinstance(node, Box) and node.op in SCORED:
            scores.append(magnitude(kids[0]))
            terms.append(magnitude(terms_of(kids[0])))
        if isinstance(node, Box) and node.op in MONOTONE | {"sub"} and isinstance(value, Named):
            box = replace(node, op="add") if node.op == "sub" else node
            absolute[id(value)] = (value, exact(box, tuple(terms_of(k) for k in kids), env))
        values.extend(magnitude(v) for v in (value if isinstance(value, tuple) else (value,)))
        return value

    with np.errstate(all="ignore"):
        run_diagram(flat, [Named(p.axes, a) for p, a in zip(flat.inputs, arrays, strict=True)], visit)
    return max(scores), max(terms), max(values)


def extreme_tolerance(theorem: Any, largest: float) -> float:
    """The f32 bound on extreme inputs (module docstring): ``F32_TOL`` plus ``EXTREME_SLOPE``
    times the scores' largest magnitude."""
    return F32_TOL + EXTREME_SLOPE * largest


def reference(theorem: Any, arrays: list[np.ndarray], sizes: dict[str, int]) -> tuple[np.ndarray, ...]:
    """The float64 evaluator on the theorem's source diagram (what the proof says it equals)."""
    out = evaluate(theorem.source, arrays, sizes=sizes)
    return out if isinstance(out, tuple) else (out,)


def tolerance(theorem: Any) -> float:
    """f32 kernels of exact theorems: F32_TOL; a theorem with ``dtype`` steps: BF16_TOL."""
    return BF16_TOL if getattr(theorem, "approximations", ()) else F32_TOL


def relative_error(got: Any, want: np.ndarray) -> float:
    got = np.asarray(got, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.all(np.isfinite(got)), "non-finite values in a kernel output"
    return float(np.max(np.abs(got - want), initial=0.0) / max(1.0, float(np.max(np.abs(want), initial=0.0))))


def agrees(got: np.ndarray, want: np.ndarray, tol: float = 1e-4) -> bool:
    """The kernel gives the evaluator's value: within ``tol`` (f32 tolerance: 1e-4 of the largest
    finite reference magnitude, at least 1) where the evaluator is finite, the same infinity where
    it gives ±inf (±inf constants stay infinite in kernels, lower/values.py), and NaN where it
    gives NaN (say 0·inf)."""
    finite = np.isfinite(want)
    scale = max(1.0, float(np.max(np.abs(want[finite]), initial=0.0)))
    with np.errstate(invalid="ignore"):  # inf - inf where both are infinite: decided below
        close = finite & (np.abs(got - want) <= tol * scale)
    same = (np.isinf(want) & (got == want)) | (np.isnan(want) & np.isnan(got))
    return bool(np.all(close | same))


def as_tuple(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)


GOLDEN = ROOT / "tests" / "golden" / "lower"
#: the theorems whose generated sources are pinned (one per kind of kernel; every theorem is
#: still lowered, run and cross-lowered, so a new proof needs no golden file)
GOLDEN_NAMES = ("alibi_grouped", "flash_attention", "flash_attention_causal", "flash_gqa", "flash_mha", "flash_sign",
                "flash_wide", "flash_wide_bf16_kv", "fused_mlp_first_layer", "streamed_cross_entropy_index",
                "streamed_stats", "tiled_matmul", "tiled_matmul_padded")
#: docstring lines that quote other modules (the kernel's trust basis, the cost model): the
#: golden files pin the lowering's own output, so these lines are compared as placeholders
VOLATILE = ("Proved by:", "Cost bound:", "Padding (")


def normalised(source: str) -> str:
    lines = []
    for line in source.splitlines():
        stripped = line.strip()
        prefix = next((v for v in VOLATILE if stripped.startswith(v)), None)
        lines.append(line[: line.index(prefix) + len(prefix)] + " ..." if prefix else line)
    return "\n".join(lines) + "\n"


def check_golden(name: str, target: str, source: str) -> None:
    """Compare with tests/golden/lower/NAME.TARGET.py; NAPKIN_UPDATE_GOLDEN=1 rewrites it."""
    path = GOLDEN / f"{name}.{target}.py"
    text = normalised(source)
    if os.environ.get("NAPKIN_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"no golden file {path}; run with NAPKIN_UPDATE_GOLDEN=1"
    assert path.read_text(encoding="utf-8") == text, f"{path} differs; NAPKIN_UPDATE_GOLDEN=1 updates it"
