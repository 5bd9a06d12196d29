"""Per-device memory of ring attention against the number of devices (CPU host devices).

    .venv/bin/python benchmarks/mesh_cpu.py [--sizes 4096] [--devices 1 2 4 8] [--repeats 3]

``ring_attention`` (proofs/ring_attention.ncd) is lowered with ``--target jax --mesh N`` for each
N; its inputs (q = x = SIZE, d = 64, f32) are placed one block per device, and the compiled
executable's ``memory_analysis()`` gives what each device holds: arguments (its blocks of Q, K,
V), output (its block of O) and temporaries (the ring's arriving blocks, one chunk's scores and
the accumulator state).  The run also times the jitted call (host devices share the CPU's
cores, so the times say nothing about a GPU node) and checks the result against float64 numpy.
Host devices come from XLA_FLAGS, set here before jax starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
MOST = 8
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={MOST}").strip()

import harness  # noqa: E402
import jax  # noqa: E402  (after XLA_FLAGS)
import numpy as np  # noqa: E402

from napkin_cat.lower import lower  # noqa: E402
from napkin_cat.proof import theorem  # noqa: E402

TILES = {"gq": 128, "sx": 64}


def measure(devices: int, n: int, repeats: int) -> dict[str, object]:
    thm = theorem(str(ROOT / "proofs" / "ring_attention.ncd"), "ring_attention")
    fn = lower(thm, target="jax", mesh=devices, tiles=TILES).fn
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((n, 64)) for _ in range(3))
    mesh = jax.sharding.Mesh(jax.devices()[:devices], ("mesh",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("mesh", None))
    placed = [jax.device_put(a.astype(np.float32), rows) for a in (q, k, v)]
    compiled = jax.jit(fn).lower(*placed).compile()
    stats = compiled.memory_analysis()
    out = compiled(*placed)
    scores = q @ k.T / 8.0
    p = np.exp(scores - scores.max(axis=1, keepdims=True))
    expected = (p / p.sum(axis=1, keepdims=True)) @ v
    timing = harness.time_call(lambda: compiled(*placed).block_until_ready(), warmup=1, repeats=repeats)
    arg, res, temp = stats.argument_size_in_bytes, stats.output_size_in_bytes, stats.temp_size_in_bytes
    return {"devices": devices, "n": n, "argument_bytes": arg, "output_bytes": res, "temp_bytes": temp,
            "per_device_bytes": arg + res + temp, "kv_whole_bytes": 2 * n * 64 * 4,
            "max_err": float(np.max(np.abs(np.asarray(out) - expected))),
            "output_devices": len(out.sharding.device_set), "median_s": timing["median_s"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = [measure(d, n, args.repeats) for n in args.sizes for d in args.devices]
    print(harness.table(rows, [("n", "q = x"), ("devices", "N"), ("argument_bytes", "arguments B"),
                               ("output_bytes", "output B"), ("temp_bytes", "temporaries B"),
                               ("per_device_bytes", "per device B"), ("kv_whole_bytes", "K+V whole B"),
                               ("max_err", "max |err|"), ("output_devices", "output on"), ("median_s", "median s")]))
    path = harness.write("mesh_cpu", {"machine": harness.machine(), "tiles": TILES, "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
