"""The long fuzz run of every verb (tests/fuzz_verbs.py): N invocations, counted by outcome.

    .venv/bin/python benchmarks/fuzz_verbs.py --runs 10000 --minutes 600

Runs every verb with every option on generated and edited inputs in several encodings,
special files as inputs and outputs, shipped, unknown and malformed hardware profiles, and
interruptions (in-process KeyboardInterrupts, and processes sent SIGINT or writing to
/dev/full), each bounded in time, until ``--runs`` invocations or ``--minutes`` pass
(whichever first).  Prints the count per verb and exit code and every failure (a traceback, a
hang, an exit code outside the promise, an interruption without its one line, a special output
replaced); exits 1 if there was any.  Writes results/fuzz_verbs.json with the machine and
command.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import machine, write
from hypothesis import HealthCheck, Phase, given, seed, settings

from tests.fuzz_verbs import Invocation, Tally, invocations, prepare, run


def _digest(arg: str) -> str:
    """The content of a regular file an argument names (an input written for this run), hashed."""
    try:
        return hashlib.sha256(Path(arg).read_bytes()).hexdigest() if Path(arg).is_file() else ""
    except OSError:
        return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--minutes", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed (the run is reproducible with it)")
    args = parser.parse_args()
    folder = prepare(Path(tempfile.mkdtemp(prefix="napkin-fuzz-long-")))
    tally = Tally()
    seen: set[tuple[str, ...]] = set()
    stop = time.monotonic() + 60 * args.minutes

    @settings(max_examples=args.runs, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(invocations(folder))
    def one(invocation: Invocation) -> None:
        if time.monotonic() > stop:
            return
        key = (str(invocation), *(_digest(a) for a in invocation.argv))
        if key in seen:  # hypothesis generates some examples twice: each is run and counted once
            return
        seen.add(key)
        outcome = run(invocation)
        tally.add(outcome)
        if not outcome.ok:
            print(f"FAILURE {invocation}\n{outcome.error}", flush=True)
        done = sum(tally.counts.values())
        if done % 100 == 0:
            print(f"... {done} runs, {len(tally.failures)} failures", flush=True)

    start = time.monotonic()
    seed(args.seed)(one)()
    elapsed = time.monotonic() - start
    total = sum(tally.counts.values())
    for key, n in sorted(tally.counts.items()):
        verb, code = key.split(" ")
        print(f"{verb:<7} exit {code:<4} {n}")
    print(f"runs={total} failures={len(tally.failures)} interrupted={tally.interrupted} processes={tally.processes} "
          f"sigint_in_python_startup={tally.startup} seconds={elapsed:.0f}")
    write("fuzz_verbs", {"machine": machine(), "command": " ".join(sys.argv), "runs": total,
                         "failures": tally.failures, "interrupted": tally.interrupted, "processes": tally.processes,
                         "sigint_in_python_startup": tally.startup, "seconds": elapsed, "counts": tally.counts})
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
