"""Measure this CPU for napkin's `cpu` hardware profile (napkin_cat/cost/hardware/cpu.toml) and
check the tile choice that profile drives against measured times.

    .venv/bin/python benchmarks/cpu_profile.py [--n 4096 8192] [--rounds 7]

1. **Rates**: XLA:CPU's f32 dot (1024 x 64 by 64 x 1024, a score tile's) for reference, and a
   read of 512 MiB (a sum) for the memory bandwidth.
2. **A grid** per n of napkin's streamed attention (`flash_attention_prescaled` of
   proofs/flash_attention.ncd, the plain-JAX target, f32, d = 64, q = x = n) at query blocks
   `gq` and key chunks `sx`, powers of two, timed round-robin: every configuration once per
   round, the median of `--rounds`, so that a shared machine's drift hits all alike.
3. **A fit** of the grid's times, less the bytes at the read bandwidth (the time model's terms
   as `napkin_cat.cost` counts them at each configuration), to the contraction FLOPs over a
   rate plus the fold FLOPs over an elementwise rate plus the loop trips times a loop overhead
   (least squares over every n: at one n the contraction FLOPs are the same for every tile,
   so two sizes are what identify that rate, the attention kernel's own, its elementwise boxes
   included). The profile's peak (every dtype's: the plain-JAX target multiplies in f32 on a
   CPU), `elementwise` and `loop_overhead` come from here.
4. **The check**: the tiles `optimise.search` chooses on the `cpu` profile at q = x = the last
   n, their measured time and rank among that grid's.

Last line: `model_pick=GQxSX pick_vs_best=R rank=K/M` (R: the pick's measured time over the
grid's best). JSON to results/cpu_profile.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import machine, round_robin, time_call, write

D = 64


def _median(fn: Any) -> float:
    return float(time_call(fn, warmup=1, repeats=7)["median_s"])


def rates() -> dict[str, float]:
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    out = {}
    a = jax.random.normal(key, (1024, D), jnp.float32)
    b = jax.random.normal(key, (D, 1024), jnp.float32)
    dot = jax.jit(jnp.dot)
    out["dot_f32_flops"] = 2 * 1024 * D * 1024 / _median(lambda: jax.block_until_ready(dot(a, b)))
    y = jnp.ones((128 * 2**20,), jnp.float32)
    total = jax.jit(jnp.sum)
    out["read_bytes_per_s"] = y.size * 4 / _median(lambda: jax.block_until_ready(total(y)))
    return out


def grid(n: int, rounds: int, tiles: list[tuple[int, int]]) -> dict[tuple[int, int], float]:
    import jax

    from napkin_cat.lower import lower
    from napkin_cat.proof import theorem

    thm = theorem(str(Path(__file__).resolve().parent.parent / "proofs" / "flash_attention.ncd"),
                  "flash_attention_prescaled")
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q, k, v = (jax.random.normal(x, (n, D), jax.numpy.float32) for x in keys)
    calls = {}
    for gq, sx in tiles:
        fn = jax.jit(lower(thm, target="jax", tiles={"gq": gq, "sx": sx}, dtype="f32").fn)
        calls[gq, sx] = lambda fn=fn: jax.block_until_ready(fn(q, k, v))
    return {t: statistics.median(ts) for t, ts in round_robin(calls, rounds).items()}


def model(n: int) -> Any:
    from napkin_cat.cost import cost
    from napkin_cat.lower import realised_schedule
    from napkin_cat.proof import theorem

    thm = theorem(str(Path(__file__).resolve().parent.parent / "proofs" / "flash_attention.ncd"),
                  "flash_attention_prescaled")
    return cost(thm, realised_schedule(thm.result, thm.schedule, "jax"), hardware="cpu", sizes={"q": n, "x": n},
                dtype="f32")


def main() -> None:
    import numpy as np

    from napkin_cat.cost.optimise import search

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[4096, 8192],
                        help="q = x, one grid each (default 4096 8192); the choice is ranked at the last")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    measured = rates()
    for k, v in measured.items():
        print(f"{k}: {v:.4g}")
    rows, design, target = [], [], []
    for n in args.n:
        c = model(n)
        pick = {k: int(v) for k, v in search(c, top=1).rows[0].tiles.items()}
        tiles = sorted({(gq, sx) for gq in (256, 512, 1024, 2048, 4096, 8192, 16384)
                        for sx in (32, 64, 128, 256, 512, 1024, 2048) if gq <= n and sx <= n}
                       | {(pick["gq"], pick["sx"])})
        for (gq, sx), t in grid(n, args.rounds, tiles).items():
            at = {"gq": gq, "sx": sx}
            terms = {name: float(c.at(e, at)) for name, e in (("contract", c.contract_flops), ("fold", c.fold_flops),
                                                              ("iterations", c.iterations),
                                                              ("bytes", c.first.transfers_bytes))}
            rows.append({"n": n, "gq": gq, "sx": sx, "median_s": t, **terms})
            design.append([terms["contract"], terms["fold"], terms["iterations"]])
            target.append(t - terms["bytes"] / measured["read_bytes_per_s"])
    (per_contract, per_fold, per_trip), *_ = np.linalg.lstsq(np.array(design), np.array(target), rcond=None)
    fit = {name: float(1 / per) if per > 0 else None
           for name, per in (("f32_flops", per_contract), ("elementwise_flops", per_fold))}
    fit["loop_overhead_s"] = float(per_trip)
    residual = [t - float(np.dot(x, (per_contract, per_fold, per_trip))) for x, t in zip(design, target, strict=True)]
    fit["rms_residual_s"] = float(np.sqrt(np.mean(np.square(residual))))
    print(f"fit over n = {', '.join(map(str, args.n))}: contractions {fit['f32_flops'] or float('nan'):.4g} FLOP/s, "
          f"elementwise {fit['elementwise_flops'] or float('nan'):.4g} FLOP/s, loop overhead {per_trip:.4g}s per trip; "
          f"rms residual {fit['rms_residual_s']:.3g}s")
    n = args.n[-1]
    ranked = sorted((r for r in rows if r["n"] == n), key=lambda r: r["median_s"])
    print(f"at n = {n}:\ngq     sx     median_s  iterations")
    for r in ranked:
        mark = "  <- the cpu profile's choice" if (r["gq"], r["sx"]) == (pick["gq"], pick["sx"]) else ""
        print(f"{r['gq']:<6} {r['sx']:<6} {r['median_s']:.4f}    {r['iterations']:.0f}{mark}")
    rank = 1 + next(i for i, r in enumerate(ranked) if (r["gq"], r["sx"]) == (pick["gq"], pick["sx"]))
    ratio = ranked[rank - 1]["median_s"] / ranked[0]["median_s"]
    write("cpu_profile", {"machine": machine(), "n": args.n, "rounds": args.rounds, "rates": measured, "fit": fit,
                          "pick": pick, "rows": rows})
    print(f"model_pick={pick['gq']}x{pick['sx']} pick_vs_best={ratio:.2f} rank={rank}/{len(ranked)}")


if __name__ == "__main__":
    main()
