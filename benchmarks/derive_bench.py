"""Search time of `napkin derive` against diagram size.

Two families of generated attention diagrams (none of them in examples/):
  boxes  N extra elementwise boxes between the scores and the softmax (more bindings, more
         lemma matches, more nodes for the kernel and the cost model to walk);
  batch  N extra woven batch axes (more group candidates, more tile symbols).

    .venv/bin/python benchmarks/derive_bench.py [--boxes 0 4 8 16] [--batch 0 1 2 3] [--repeats 1]

The first derivation also pays for certifying the lemmas and accumulators it uses (cached
for the process); it is reported as `warm-up` and excluded from the timings.  Prints a table
(candidates checked, stop reason, the schedule found, seconds) and writes
results/derive_bench.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import machine, table, time_call, write

UNARY = ("tanh", "neg", "abs", "square", "sigmoid")
BATCH = ("b", "h", "n", "m", "r", "u")


def attention_source(extra_boxes: int, batch_axes: int) -> str:
    """Attention over [batch.. q d] with ``extra_boxes`` elementwise boxes before the softmax."""
    batch = " ".join(BATCH[:batch_axes])
    lines = [f"axis q, x{''.join(', ' + a for a in BATCH[:batch_axes])}", "axis d = 64",
             f"diagram att(Q: [{batch} q d], K: [{batch} x d], V: [{batch} x d]) -> [{batch} q d] {{",
             "  S0 = contract[d](Q, K) * rsqrt(d)"]
    for k in range(extra_boxes):
        lines.append(f"  S{k + 1} = {UNARY[k % len(UNARY)]}(S{k}) * 0.5")
    lines += [f"  P = softmax[x](S{extra_boxes})", "  O = contract[x](P, V)", "  return O", "}"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--boxes", type=int, nargs="+", default=[0, 4, 8, 16])
    parser.add_argument("--batch", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--budget", type=int, default=2000)
    args = parser.parse_args()

    from napkin_cat.search import derive

    folder = Path(tempfile.mkdtemp(prefix="derive_bench_"))

    def case(extra: int, batch: int) -> tuple[Path, dict[str, int]]:
        path = folder / f"att_{extra}_{batch}.ncd"
        path.write_text(attention_source(extra, batch))
        sizes = {a: 4096 for a in ("q", "x")} | {a: 4 for a in BATCH[:batch]}
        return path, sizes

    def run(path: Path, sizes: dict[str, int]) -> derive.Derivation:
        return derive.derive(path, "att", derive.model_cost("h100", "bf16", sizes), budget=args.budget)

    t0 = time.perf_counter()
    run(*case(0, 0))
    rows: list[dict[str, object]] = [{"family": "warm-up", "n": 0, "median_s": time.perf_counter() - t0}]
    for family, values in (("boxes", args.boxes), ("batch", args.batch)):
        for n in values:
            path, sizes = case(n, 0) if family == "boxes" else case(0, n)
            found = run(path, sizes)
            timing = time_call(lambda p=path, s=sizes: run(p, s), warmup=0, repeats=args.repeats)
            rows.append({"family": family, "n": n, "candidates": len(found.search.candidates),
                         "stopped": found.search.stopped, "helps": found.search.helps,
                         "schedule": found.best.describe(), **timing})
            print(f"  {family} n={n}: {timing['median_s']:.2f} s, {len(found.search.candidates)} candidates",
                  flush=True)
    print(table(rows, [("family", "family"), ("n", "N"), ("candidates", "candidates"), ("stopped", "stopped"),
                       ("median_s", "median s"), ("min_s", "min s"), ("max_s", "max s")]))
    print(f"wrote {write('derive_bench', {'machine': machine(), 'rows': rows})}")


if __name__ == "__main__":
    main()
