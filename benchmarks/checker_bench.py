"""How long checking takes: `napkin check proofs/`, and parse + elaborate + check of a
generated L-layer transformer (benchmarks/transformer_gen.py) as L grows.

    .venv/bin/python benchmarks/checker_bench.py [--layers 6 12 24 48] [--repeats 3]

Prints a table (median/min/max seconds per stage) and writes results/checker_bench.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import machine, table, time_call, write
from transformer_gen import model

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, nargs="+", default=[6, 12, 24, 48])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from napkin_cat.elaborate import loads
    from napkin_cat.proof import check_file, check_module

    rows = []
    napkin = str(Path(sys.executable).parent / "napkin")
    cold = time_call(lambda: subprocess.run([napkin, "check", str(ROOT / "proofs")], check=True,
                                            capture_output=True), warmup=0, repeats=args.repeats)
    rows.append({"stage": "napkin check proofs/ (new process each)", "size": "all", "ok": True, **cold})
    for path in sorted((ROOT / "proofs").glob("*.ncd")):
        outcome = check_file(path)
        timing = time_call(lambda p=path: check_file(p), warmup=0, repeats=args.repeats)
        rows.append({"stage": f"check {path.name}", "size": len(outcome), "ok": all(r.ok for r in outcome), **timing})
    for layers in args.layers:
        text = model(layers)
        t0 = time.perf_counter()
        module = loads(text, f"transformer{layers}.ncd")
        parse_s = time.perf_counter() - t0
        results = check_module(module)
        ok = all(r.ok for r in results)
        timing = time_call(lambda t=text, n=layers: check_module(loads(t, f"transformer{n}.ncd")),
                           warmup=0, repeats=args.repeats)
        rows.append({"stage": "parse+elaborate", "size": layers, "ok": True, "median_s": parse_s})
        rows.append({"stage": "parse+elaborate+check", "size": layers, "ok": ok, **timing})
    print(table(rows, [("stage", "stage"), ("size", "theorems/layers"), ("ok", "ok"), ("first_s", "first s"),
                       ("median_s", "median s"), ("min_s", "min s"), ("max_s", "max s")]))
    print(f"wrote {write('checker_bench', {'machine': machine(), 'rows': rows})}")


if __name__ == "__main__":
    main()
