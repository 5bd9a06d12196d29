"""The recorded differential run (issue 18): random modules with masks on any operand,
random schedules the kernel accepts, lowered to both targets (Pallas in interpret mode) and
compared with the float64 evaluator at ragged sizes, for a bounded time or count.

    .venv/bin/python benchmarks/differential.py --minutes 25 [--cases 4000] [--batch 25]
        [--out differential] [--resume] [--full-every 8] [--seed N]

Each case is ``tests/differential.py``'s ``run_case``, the one CI runs at the hypothesis
profile's count.  Cases are drawn in batches, batch k with hypothesis seed ``seed + k`` (no
shrinking: a mismatch is recorded with its diagram, schedule and sizes, and the run goes on).
After every batch the results so far are written to results/OUT.json (replaced whole, so a
killed run keeps every finished batch): accepted schedules, per target how many ran, how
many of those Pallas kernels skipped masked chunks, the refusals by code, the runs that
differed only by XLA's jit-only 0·inf fold and those that differed only as far as float32
rounding of the reference explains (``tests/differential.py``: each reported apart, not
mismatches), and every mismatch (the run exits 1 if there is one).  ``--resume`` continues
the run recorded there: its counts, time and seed, at its next batch.  Inputs are drawn on the
grid, scaled to scores near 10⁴, offset by up to 10⁴, or zero, on every operand; masks and
fills give ±inf and fully masked rows.

XLA's compile dominated a case (2.6 s of a kernel's 3 s, cProfile; BENCHMARKS.md), almost all
of it LLVM optimising machine code: so every batch but one in ``--full-every`` compiles its
kernels at ``xla_backend_optimization_level`` 0 (0.5 s), which leaves XLA's HLO passes — where
its algebraic folds such as the jit-only 0·inf one happen — as they are; the others at XLA's
default, so the whole default pipeline stays covered.  Both counts are recorded.
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import RESULTS, machine, write  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.differential import F32_ROUNDING, MODULES, TARGETS, XLA_FOLD, run_case  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=25.0, help="start no batch after this long")
    parser.add_argument("--cases", type=int, default=4000, help="start no batch after this many accepted schedules")
    parser.add_argument("--batch", type=int, default=25, help="cases per hypothesis run (a fresh seed each)")
    parser.add_argument("--out", default="differential", help="results/OUT.json, written after every batch")
    parser.add_argument("--resume", action="store_true", help="continue the run recorded in results/OUT.json")
    parser.add_argument("--full-every", type=int, default=8,
                        help="one batch in this many compiles at XLA's default optimisation level")
    parser.add_argument("--seed", type=int, default=None, help="batch k draws with seed SEED + k (default: random)")
    args = parser.parse_args()
    state = _resumed(args.out) if args.resume else {}
    counts: collections.Counter[str] = collections.Counter(state.get("counts", {}))
    mismatches: list[str] = list(state.get("mismatches", []))
    explained: list[str] = list(state.get("f32_rounding_cases", []))
    base = state.get("seed", args.seed if args.seed is not None else random.randrange(2**31))
    batch = state.get("batches", 0)
    before = state.get("seconds", 0.0)
    start = time.monotonic()

    def elapsed() -> float:
        return before + time.monotonic() - start

    def done() -> bool:
        return time.monotonic() - start > args.minutes * 60 or counts["accepted"] >= args.cases

    while not done():
        full = batch % args.full_every == 0
        _batch(counts, mismatches, explained, base + batch, args.batch,
               None if full else {"xla_backend_optimization_level": 0}, "default" if full else "0")
        batch += 1
        write(args.out, _result(counts, mismatches, explained, elapsed(), base, batch, args.full_every, finished=False))
        print(f"{elapsed():7.0f} s  " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())), flush=True)
    result = _result(counts, mismatches, explained, elapsed(), base, batch, args.full_every, finished=True)
    write(args.out, result)
    ran, folded, rounded = result["ran"], result["xla_jit_fold"], result["f32_rounding"]
    print(f"accepted schedules {counts['accepted']} in {elapsed():.0f} s; ran: "
          + ", ".join(f"{t} {n}" for t, n in ran.items()) + f"; mismatches: {len(mismatches)}; "
          + "of the runs, XLA's jit-only 0·inf fold (reported apart): "
          + ", ".join(f"{t} {n}" for t, n in folded.items()) + "; float32 rounding of the reference (reported apart): "
          + ", ".join(f"{t} {n}" for t, n in rounded.items()))
    for m in mismatches:
        print(m, file=sys.stderr)
    return 1 if mismatches else 0


def _batch(counts: collections.Counter[str], mismatches: list[str], explained: list[str], number: int, size: int,
           options: dict[str, Any] | None, level: str) -> None:
    """One hypothesis run of ``size`` cases with seed ``number``, kernels compiled with
    ``options`` (XLA backend optimisation ``level``), counted into ``counts``; each run judged
    float32 rounding described in ``explained``."""

    @seed(number)
    @settings(max_examples=size, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(module=MODULES, data=st.data())
    def case(module: Any, data: st.DataObject) -> None:  # a batch runs whole: hypothesis wants every case drawn
        counts["drawn"] += 1
        try:
            outcome = run_case(module, data, options, explained)
        except AssertionError as exc:
            mismatches.append(str(exc))
            outcome = {}
        if outcome is None:
            return
        counts["accepted"] += 1
        counts[f"accepted at XLA backend optimisation {level}"] += 1
        for target, what in outcome.items():
            counts[f"{target} {what}"] += 1

    case()


def _result(counts: collections.Counter[str], mismatches: list[str], explained: list[str], seconds: float, base: int,
            batches: int, full_every: int, finished: bool) -> dict[str, Any]:
    """The results file: the totals, and what ``--resume`` reads back."""
    return {
        "machine": machine(),
        "finished": finished,
        "seconds": round(seconds, 1),
        "seed": base,
        "batches": batches,
        "full_every": full_every,
        "drawn": counts["drawn"],
        "accepted_schedules": counts["accepted"],
        "accepted_by_xla_backend_optimisation": {
            k.rsplit(" ", 1)[1]: v for k, v in sorted(counts.items()) if k.startswith("accepted at")},
        "ran": {t: sum(v for k, v in counts.items() if k.startswith(f"{t} ran")) for t in TARGETS},
        "outcomes": dict(sorted((k, v) for k, v in counts.items() if k.startswith(TARGETS))),
        "xla_jit_fold": {t: counts[f"{t} {XLA_FOLD}"] for t in TARGETS},
        "f32_rounding": {t: counts[f"{t} {F32_ROUNDING}"] for t in TARGETS},
        "mismatches": mismatches,
        "f32_rounding_cases": explained,
        "counts": dict(counts),
    }


def _resumed(name: str) -> dict[str, Any]:
    """The state of the run recorded in results/NAME.json (``--resume``), or nothing."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        print(f"no run to resume at {path}: starting afresh", file=sys.stderr)
        return {}
    recorded = json.loads(path.read_text())
    return {k: recorded[k] for k in ("counts", "mismatches", "f32_rounding_cases", "seed", "batches", "seconds")
            if k in recorded}


if __name__ == "__main__":
    sys.exit(main())
