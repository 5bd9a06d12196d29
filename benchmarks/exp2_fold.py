"""Softmax weights under three ways of writing exp(S - m) with exp2, in exact f32 arithmetic.

    python benchmarks/exp2_fold.py

The question (issue 31): the Pallas kernels compute a score's weight as exp2((S - m)·log2 e),
the difference first (issue 28), one FP32 instruction per score more than FlashAttention's forms.
Would folding log2 e into the scores' scale (S2 = t·(scale·log2 e) straight from the dot's t,
the running maximum kept in base-2 units, then exp2(S2 - m2): one instruction fewer) keep the
accuracy?  numpy's float32 operations round as the GPU's FMUL/FADD do, so each form is emulated
exactly (ex2 itself taken exact, as in every form):

- ``difference first``: S = fl(t·scale), exp2(fl(fl(S - m)·log2 e)) (the kernels today);
- ``one FFMA``: exp2(fl(S·log2 e - fl(m·log2 e))) (FlashAttention's);
- ``folded``: S2 = fl(t·fl(scale·log2 e)), exp2(fl(S2 - max S2)).

Rows of 128 scores (spread 3) around |S| = 10², 10⁴, 10⁶ (300 rows each), scaled by 1/√64 (exact in
f32, as 1/√d is for d = 64 and 256), by 1/√128 (rounded: every form then carries S's own rounding)
and unscaled (scores given exactly); the largest absolute error of a row's normalised weights
against float64.  Within one row the one-FFMA form's rounding of m·log2 e is common to every
score and cancels; it shows in an online softmax, where each chunk's maximum is rounded apart
(README "Kernels": 1.7·10⁻² at 10⁶), which this emulation does not model.  Last, the range:
scale 1 (d = 1) and scores near the f32 maximum.  One row per case to stdout; results/exp2_fold.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import RESULTS

F32 = np.float32
LOG2E = F32(1.4426950408889634)


def forms(t: np.ndarray, scale: np.float32 | None) -> dict[str, np.ndarray]:
    """A row's normalised weights under each form; ``t`` the f32 dot results, ``scale`` None
    for scores given exactly."""
    s = t if scale is None else (t * scale).astype(F32)
    m = s.max()
    first = np.exp2(((s - m).astype(F32) * LOG2E).astype(F32))
    ffma = np.exp2((s.astype(np.float64) * float(LOG2E) - float(F32(m * LOG2E))).astype(F32))
    s2 = (t * (LOG2E if scale is None else F32(scale * LOG2E))).astype(F32)
    folded = np.exp2((s2 - s2.max()).astype(F32))
    return {k: w / w.sum() for k, w in (("difference first", first), ("one FFMA", ffma), ("folded", folded))}


def main() -> None:
    rng = np.random.default_rng(0)
    rows = []
    for label, scale in (("scaled by 1/sqrt(64)", F32(0.125)), ("scaled by 1/sqrt(128)", F32(128 ** -0.5)),
                         ("exact scores", None)):
        for magnitude in (1e2, 1e4, 1e6):
            worst: dict[str, float] = {}
            for _ in range(300):
                t = ((magnitude + 3 * rng.standard_normal(128)) / float(scale or 1)).astype(F32)
                exact = t.astype(np.float64) * float(scale or 1)
                want = np.exp(exact - exact.max())
                want /= want.sum()
                for name, got in forms(t, scale).items():
                    worst[name] = max(worst.get(name, 0.0), float(np.max(np.abs(got - want))))
            rows.append({"case": label, "magnitude": magnitude, **worst})
            print(f"{label:22s} |S| ~ {magnitude:.0e}: " + ", ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    with np.errstate(all="ignore"):
        edge = {k: v.tolist() for k, v in forms(np.array([3.0e38, 2.9e38], F32), F32(1.0)).items()}
    print(f"scale 1, S = 3.0e38 and 2.9e38 (weights 1 and 0): {edge}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "exp2_fold.json").write_text(json.dumps({"rows": rows, "range": edge}, indent=1) + "\n")


if __name__ == "__main__":
    main()
