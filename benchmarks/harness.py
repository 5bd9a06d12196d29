"""Shared benchmark harness: machine facts, timing, one process per case for peak memory.

Every benchmark script runs each case in a fresh Python process (``--case NAME --n N``)
so that peak RSS (``ru_maxrss``) belongs to that case alone; the parent collects the
child's JSON line, prints a table and writes a JSON file with the machine, versions,
command and raw timings.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: where results are written; tests point NAPKIN_BENCH_RESULTS at a temporary folder
RESULTS = Path(os.environ.get("NAPKIN_BENCH_RESULTS", Path(__file__).resolve().parent / "results"))


def machine() -> dict[str, Any]:
    """Facts that make a timing interpretable: CPU, cores, memory, versions."""
    import jax
    import numpy

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem, 1),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "numpy": numpy.__version__,
        "backend": jax.default_backend(),
        "devices": [d.device_kind for d in jax.devices()],
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }


def time_call(fn: Callable[[], Any], warmup: int = 2, repeats: int = 5) -> dict[str, Any]:
    """Median, min and max wall time of ``fn()`` (which must block until done), after warm-up."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"first_s": first, "median_s": statistics.median(times), "min_s": min(times),
            "max_s": max(times), "times_s": times}


def round_robin(calls: Mapping[Any, Callable[[], Any]], rounds: int) -> dict[Any, list[float]]:
    """Wall times of each of ``calls`` (which must block until done), after one warm-up call
    each: every call once per round, so that a shared machine's drift hits all alike, in a
    seeded random order that never starts with the call that ended the round before, so that
    no call always follows the same one (whose caches it would inherit) or itself."""
    import random

    for fn in calls.values():
        fn()
    times: dict[Any, list[float]] = {key: [] for key in calls}
    order, rng = list(calls), random.Random(0)
    for _ in range(rounds):
        last = order[-1]
        rng.shuffle(order)
        if order[0] == last:
            order[0], order[-1] = order[-1], order[0]
        for key in order:
            t0 = time.perf_counter()
            calls[key]()
            times[key].append(time.perf_counter() - t0)
    return times


def peak_rss_mib() -> float:
    """This process's peak resident set size so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(result: dict[str, Any]) -> None:
    """Print a case's result as the last line of a child process."""
    result["peak_rss_mib"] = peak_rss_mib()
    print(json.dumps(result))


def run_case(script: str, args: Sequence[str], timeout: float = 1800) -> dict[str, Any]:
    """Run one case in a fresh process and parse its JSON line; failures are recorded."""
    cmd = [sys.executable, script, *args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout}s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: {' | '.join(tail)}"}
    return dict(json.loads(lines[-1]))


def table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """A plain-text table; ``columns`` are (key, header) pairs."""
    cells = [[h for _, h in columns]]
    for row in rows:
        cells.append([_fmt(row.get(k)) for k, _ in columns])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def write(name: str, payload: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    partial = path.with_suffix(".json.partial")  # replaced whole: a killed writer leaves the last file
    partial.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(partial, path)
    return path


def napkin_kernel(proof: str, theorem: str, target: str, tiles: dict[str, int] | None = None,
                  backward: Sequence[str] = ()) -> Any:
    """A generated kernel: check the theorem (and its ``backward`` theorems, joined into a
    custom VJP), then lower it (``.fn`` is the callable)."""
    from napkin_cat.lower import lower
    from napkin_cat.proof import theorem as load_theorem

    path = str(Path(__file__).resolve().parent.parent / proof)
    return lower(load_theorem(path, theorem), target=target, tiles=tiles,
                 backward=[load_theorem(path, name) for name in backward])


def driver(name: str, script: str, cases: dict[str, Callable[[int], Callable[[], Any]]],
           default_sizes: list[int], only_large: dict[str, int], describe: str,
           argv: Sequence[str] | None = None, selected: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Parent/child protocol shared by the CPU benchmarks.

    Child: ``--case NAME --n N`` builds the case, times it and prints one JSON line.
    Parent: runs every case (or the ``selected`` ones) at every size in its own process,
    prints a table with ratios against the first, writes results/NAME.json and returns the
    rows.  ``only_large`` maps a case to the largest N it is run at (memory-hungry baselines).
    """
    import argparse

    parser = argparse.ArgumentParser(description=describe)
    parser.add_argument("--sizes", type=int, nargs="+", default=default_sizes)
    parser.add_argument("--case", choices=sorted(cases))
    parser.add_argument("--n", type=int)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.case:
        fn = cases[args.case](args.n)
        child({"case": args.case, "n": args.n, **time_call(fn, repeats=args.repeats)})
        return []
    rows = []
    run = list(selected or cases)
    first = run[0]
    for n in args.sizes:
        for case in run:
            if n > only_large.get(case, 1 << 62):
                continue
            res = run_case(script, ["--case", case, "--n", str(n), "--repeats", str(args.repeats)])
            rows.append({"case": case, "n": n, **res})
            print(f"  {case:>10} n={n:<7} " + (res.get("error") or
                  f"median {res['median_s']:.4f} s  peak {res['peak_rss_mib']:.0f} MiB"), flush=True)
    for row in rows:
        base = next((r for r in rows if r["case"] == first and r["n"] == row["n"] and "median_s" in r), None)
        if base and "median_s" in row:
            row["time_vs_napkin"] = row["median_s"] / base["median_s"]
            row["mem_vs_napkin"] = row["peak_rss_mib"] / base["peak_rss_mib"]
    print(table(rows, [("case", "case"), ("n", "N"), ("median_s", "median s"), ("min_s", "min s"),
                       ("max_s", "max s"), ("peak_rss_mib", "peak MiB"), ("time_vs_napkin", "time/napkin"),
                       ("mem_vs_napkin", "mem/napkin"), ("error", "error")]))
    path = write(name, {"machine": machine(), "rows": rows})
    print(f"wrote {path}")
    return rows
