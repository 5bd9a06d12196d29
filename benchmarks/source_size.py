"""Parse + elaborate time and peak memory against source file size: why sources are capped.

    .venv/bin/python benchmarks/source_size.py [--kib 64 256 1024]

Each size is a file of repeated small diagrams (a contraction and a scale each), run as
``napkin parse FILE`` in its own process; prints wall seconds and peak RSS, and checks that a
file one byte past ``files.MAX_SOURCE_BYTES`` is refused at once.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import machine, table, write

from napkin_cat.files import MAX_SOURCE_BYTES

#: ``napkin parse FILE`` that reports its own peak RSS (KiB) on its last stderr line
CHILD = ("import resource, sys\nfrom napkin_cat.cli import main\ncode = main(['parse', sys.argv[1]])\n"
         "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\nsys.exit(code)")


def source(size: int) -> str:
    parts, i = ["axis q, x\naxis d = 64\n"], 0
    while sum(map(len, parts)) < size:
        parts.append(f"diagram f{i}(Q: [q d], K: [x d]) -> [q x] {{\n  S = contract[d](Q, K) * rsqrt(d)\n"
                     "  return S\n}\n")
        i += 1
    return "".join(parts)[:size].rsplit("diagram", 1)[0]


def run(path: Path) -> dict[str, object]:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    return {"bytes": path.stat().st_size, "exit": proc.returncode, "seconds": seconds,
            "peak_mib": int(proc.stderr.splitlines()[-1]) / 1024, "refused": "past the limit" in proc.stderr}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kib", type=int, nargs="+", default=[64, 256, 1024])
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="napkin-size-"))
    rows = []
    for kib in args.kib:
        path = folder / f"s{kib}.ncd"
        path.write_text(source(min(kib * 1024, MAX_SOURCE_BYTES)))
        rows.append(run(path))
    over = folder / "over.ncd"
    over.write_text(source(MAX_SOURCE_BYTES) + "#" * (MAX_SOURCE_BYTES + 1 - len(source(MAX_SOURCE_BYTES))))
    rows.append(run(over))
    print(table(rows, [("bytes", "bytes"), ("exit", "exit"), ("seconds", "s"), ("peak_mib", "peak MiB"),
                       ("refused", "refused")]))
    write("source_size", {"machine": machine(), "rows": rows})
    return 0 if rows[-1]["refused"] and all(r["exit"] == 0 for r in rows[:-1]) else 1


if __name__ == "__main__":
    sys.exit(main())
