"""The long fuzz run of every verb (tests/fuzz_verbs.py): N invocations, counted by outcome.

    .venv/bin/python benchmarks/fuzz_verbs.py --runs 10000 --minutes 60

Runs generated and edited inputs through parse, check, eval, cost, pseudo, lower and draw
in-process, each bounded by ``TIME_BOUND`` seconds, until ``--runs`` invocations or
``--minutes`` pass (whichever first), then prints the count per verb and exit code, and every
escaped traceback or hang; exits 1 if there was any.  Writes JSON with the machine and command.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import machine, write
from hypothesis import HealthCheck, Phase, given, settings

from tests.fuzz_verbs import invocations, prepare, run_verb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--minutes", type=float, default=60.0)
    args = parser.parse_args()
    folder = prepare(Path(tempfile.mkdtemp(prefix="napkin-fuzz-long-")))
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    failures: list[str] = []
    stop = time.monotonic() + 60 * args.minutes

    @settings(max_examples=args.runs, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(invocations(folder))
    def one(invocation: tuple[str, list[str]]) -> None:
        if time.monotonic() > stop:
            return
        verb, argv = invocation
        outcome = run_verb(verb, argv)
        counts[(verb, str(outcome.code))] += 1
        if not outcome.ok:
            failures.append(f"napkin {verb} {' '.join(argv)}\n{outcome.error}")

    start = time.monotonic()
    one()
    elapsed = time.monotonic() - start
    total = sum(counts.values())
    for (verb, code), n in sorted(counts.items()):
        print(f"{verb:<7} exit {code:<4} {n}")
    print(f"runs={total} tracebacks_or_hangs={len(failures)} seconds={elapsed:.0f}")
    for failure in failures:
        print(failure)
    write("fuzz_verbs", {"machine": machine(), "command": " ".join(sys.argv), "runs": total, "failures": failures,
                         "seconds": elapsed, "counts": {f"{v} {c}": n for (v, c), n in sorted(counts.items())}})
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
