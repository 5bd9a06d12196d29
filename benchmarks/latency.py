"""CPU seconds of the everyday verbs (issue 32's targets), each a fresh ``napkin`` process.

    .venv/bin/python benchmarks/latency.py [--repeats 3] [--only help check ...] [--label after]

Each case is run once to warm it (Python's bytecode caches, napkin's cache folder; its cost is
recorded as ``first_cpu_s``, the cold number), then ``--repeats`` times; a run's cost is the
user + system CPU seconds of its process (from ``wait4``), not wall time, since the machine is
shared.  The cache folder is a fresh temporary one per invocation of this script
(``NAPKIN_CACHE_DIR``), so "warm" means warmed by this script's own first run, never by an
older cache.  Prints a table with the cold and the median (min, max) CPU seconds and each
case's target, and writes results/latency[_LABEL].json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import machine, table, write

ROOT = Path(__file__).resolve().parent.parent
PROOF = "proofs/flash_attention.ncd"
THEOREM = "flash_attention"

#: name -> (napkin arguments, target CPU seconds); ``{out}`` is a temporary folder
CASES: dict[str, tuple[list[str], float]] = {
    "help": (["--help"], 0.3),
    "check": (["check", "proofs/"], 1.0),
    "cost": (["cost", PROOF, THEOREM], 1.0),
    "lower": (["lower", PROOF, THEOREM, "--target", "jax", "-o", "{out}/kernel.py"], 1.0),
    "derive": (["derive", "examples/attention.ncd", "attention", "--size", "q=4096", "--size", "x=4096",
                "-o", "{out}/derived.ncd"], 3.0),
}


def cpu_seconds(argv: list[str], env: dict[str, str]) -> float:
    """User + system CPU seconds of one run of ``argv`` (its children included), which must succeed."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    out = proc.stdout.read() if proc.stdout else b""
    err = proc.stderr.read() if proc.stderr else b""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {(err or out).decode()[-800:]}")
    return float(usage.ru_utime + usage.ru_stime)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", nargs="+", choices=sorted(CASES), help="run only these cases")
    parser.add_argument("--label", default="", help="suffix of the results file (before, after)")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="napkin-latency-") as tmp:
        env = dict(os.environ, NAPKIN_CACHE_DIR=str(Path(tmp) / "cache"), PYTHONPATH=str(ROOT))
        for name in args.only or CASES:
            napkin_args, target = CASES[name]
            command = [sys.executable, "-m", "napkin_cat", *(a.replace("{out}", tmp) for a in napkin_args)]
            first = cpu_seconds(command, env)  # the warm-up: a cold cache folder
            times = [cpu_seconds(command, env) for _ in range(args.repeats)]
            median = statistics.median(times)
            rows.append({"case": name, "command": " ".join(["napkin", *napkin_args]).replace("{out}", "OUT"),
                         "median_cpu_s": median, "min_cpu_s": min(times), "max_cpu_s": max(times),
                         "target_cpu_s": target, "meets": median <= target, "cpu_s": times, "first_cpu_s": first})
            print(f"  {name:>7} median {median:.3f} s CPU (target {target} s)", flush=True)
    print(table(rows, [("case", "case"), ("first_cpu_s", "first (cold) s"), ("median_cpu_s", "median CPU s"),
                       ("min_cpu_s", "min"),
                       ("max_cpu_s", "max"), ("target_cpu_s", "target"), ("meets", "meets"), ("command", "command")]))
    path = write("latency" + (f"_{args.label}" if args.label else ""), {"machine": machine(), "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
