"""Time the cost derivation of every theorem in proofs/ (a benchmark, not a timed test).

    .venv/bin/python benchmarks/cost_bench.py [--repeat N]

Theorems are checked once up front (the kernel and certify are not what is measured).  For
each theorem it times, as the median of N runs: the symbolic cost (``cost.cost``), the
continuous optimum (``optimise.continuous``) and, at sizes of 4096 for every symbolic axis on
h100, the integer configuration search (``optimise.search``).  The issue asks for well
under a second per derivation; the last line reports the slowest.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from napkin_cat import proof  # noqa: E402
from napkin_cat.cost import cost  # noqa: E402
from napkin_cat.cost.optimise import continuous, search  # noqa: E402


def median_time(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    theorems = [r.theorem for path in sorted((ROOT / "proofs").glob("*.ncd")) for r in proof.check_file(path)
                if r.theorem is not None]
    print(f"{'theorem':<32} {'cost (s)':>10} {'optimum (s)':>12} {'search (s)':>11}")
    slowest = 0.0
    for thm in theorems:
        symbolic = median_time(lambda t=thm: cost(t), args.repeat)  # type: ignore[misc]
        c = cost(thm)
        optimum = median_time(lambda c=c: continuous(c), args.repeat)  # type: ignore[misc]
        sizes = {name: 4096 for name, size in c.sizes.items() if size.is_Symbol}
        numeric = cost(thm, sizes=sizes)
        searched = median_time(lambda n=numeric: search(n), args.repeat)  # type: ignore[misc]
        slowest = max(slowest, symbolic + optimum)
        print(f"{thm.name:<32} {symbolic:>10.3f} {optimum:>12.3f} {searched:>11.3f}")
    print(f"slowest derivation (cost + optimum): {slowest:.3f} s over {len(theorems)} theorems")
    return 0


if __name__ == "__main__":
    sys.exit(main())
