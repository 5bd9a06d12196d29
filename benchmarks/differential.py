"""The recorded differential run (issue 18): random modules with masks on any operand,
random schedules the kernel accepts, lowered to both targets (Pallas in interpret mode) and
compared with the float64 evaluator at ragged sizes, for a bounded time or count.

    .venv/bin/python benchmarks/differential.py --minutes 25 [--cases 4000] [--batch 25]

Each case is ``tests/differential.py``'s ``run_case``, the one CI runs at the hypothesis
profile's count.  Cases are drawn in batches of fresh random seeds (no shrinking: a
mismatch is recorded with its diagram, schedule and sizes, and the run goes on).  Prints
and writes results/differential.json: accepted schedules, per target how many ran, how
many of those Pallas kernels skipped masked chunks, the refusals by code, the runs that
differed only by XLA's jit-only 0·inf fold (``tests/differential.py``: reported apart, not
mismatches), and every mismatch (the run exits 1 if there is one).  Inputs are drawn on the
grid, scaled to scores near 10⁴, offset by up to 10⁴, or zero, on every operand; masks and
fills give ±inf and fully masked rows.
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from harness import machine, write  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.differential import MODULES, TARGETS, XLA_FOLD, run_case  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=25.0, help="start no batch after this long")
    parser.add_argument("--cases", type=int, default=4000, help="start no batch after this many accepted schedules")
    parser.add_argument("--batch", type=int, default=25, help="cases per hypothesis run (a fresh seed each)")
    args = parser.parse_args()
    counts: collections.Counter[str] = collections.Counter()
    mismatches: list[str] = []
    start = time.monotonic()

    def done() -> bool:
        return time.monotonic() - start > args.minutes * 60 or counts["accepted"] >= args.cases

    @settings(max_examples=args.batch, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(module=MODULES, data=st.data())
    def case(module: Any, data: st.DataObject) -> None:  # a batch runs whole: hypothesis wants every case drawn
        counts["drawn"] += 1
        try:
            outcome = run_case(module, data)
        except AssertionError as exc:
            counts["accepted"] += 1
            mismatches.append(str(exc))
            return
        if outcome is None:
            return
        counts["accepted"] += 1
        for target, what in outcome.items():
            counts[f"{target} {what}"] += 1

    while not done():
        case()
        print(f"{time.monotonic() - start:7.0f} s  " + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())),
              flush=True)
    seconds = time.monotonic() - start
    ran = {t: sum(v for k, v in counts.items() if k.startswith(f"{t} ran")) for t in TARGETS}
    folded = {t: counts[f"{t} {XLA_FOLD}"] for t in TARGETS}
    result = {
        "machine": machine(),
        "seconds": round(seconds, 1),
        "drawn": counts["drawn"],
        "accepted_schedules": counts["accepted"],
        "ran": ran,
        "outcomes": dict(sorted((k, v) for k, v in counts.items() if k.startswith(TARGETS))),
        "xla_jit_fold": folded,
        "mismatches": mismatches,
    }
    write("differential", result)
    print(f"accepted schedules {counts['accepted']} in {seconds:.0f} s; ran: "
          + ", ".join(f"{t} {n}" for t, n in ran.items()) + f"; mismatches: {len(mismatches)}; "
          + "of the runs, XLA's jit-only 0·inf fold (reported apart): "
          + ", ".join(f"{t} {n}" for t, n in folded.items()))
    for m in mismatches:
        print(m, file=sys.stderr)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
