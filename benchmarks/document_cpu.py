"""Document-masked attention on this machine's CPU, and its modelled bytes on an H200.

Times the forward of ``flash_document_attention`` and ``flash_causal_document_attention``
(proofs/document_attention.ncd, plain-JAX target by default; ``--target pallas`` runs the Pallas
kernel in interpret mode, far slower) at ``--n`` queries and keys in ``--docs`` equal documents,
jitted, median of ``--repeats`` calls after one warm-up; then prints the cost model's bytes of
each kernel at q = x = 16384, 8 documents, ``gq=128 sx=64``, bf16, as a fraction of the dense
causal kernel's (README "Skipping from data").  Run it from a checkout (``PYTHONPATH`` chooses
which) to compare two versions of the data skip::

    PYTHONPATH=. .venv/bin/python benchmarks/document_cpu.py --n 4096
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from napkin_cat.cost import cost
from napkin_cat.lower import lower
from napkin_cat.proof import check_file
from napkin_cat.schedule.datamask import block_liveness

ROOT = Path(__file__).resolve().parent.parent


def _theorems(name: str) -> dict[str, object]:
    return {r.name: r.theorem for r in check_file(ROOT / "proofs" / name)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--docs", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--target", choices=("jax", "pallas"), default="jax")
    args = parser.parse_args()
    docs = _theorems("document_attention.ncd")
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((args.n, 64)), jnp.float32) for _ in range(3))
    ids = jnp.asarray(np.repeat(np.arange(args.docs), -(-args.n // args.docs))[:args.n], jnp.int32)
    extra = {"interpret": True} if args.target == "pallas" else {}
    for name in ("flash_document_attention", "flash_causal_document_attention"):
        fn = jax.jit(lower(docs[name], target=args.target, tiles={"gq": 128, "sx": 64}).fn, static_argnames=())
        run = (lambda f: lambda: f(q, k, v, ids, ids, **extra).block_until_ready())(fn)
        run()
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            run()
            times.append(time.perf_counter() - start)
        print(f"{name} {args.target} n={args.n} docs={args.docs}: median {statistics.median(times):.4f} s "
              f"(min {min(times):.4f}, {args.repeats} calls)")
    sizes, at = {"q": 16384, "x": 16384}, {"gq": 128, "sx": 64}
    same = np.repeat(np.arange(8), 2048)
    pos = np.arange(16384)
    mask = same[:, None] == same[None, :]
    live = {"flash_document_attention": float(block_liveness(mask, 128, 64).mean()),
            "flash_causal_document_attention": float(block_liveness(mask & (pos[:, None] >= pos[None, :]),
                                                                    128, 64).mean())}

    def moved(thm: object, fraction: float = 1.0) -> float:
        c = cost(thm, hardware="h200", sizes=sizes, live=fraction)  # type: ignore[arg-type]
        return float(c.at(c.level("smem").transfers_bytes, at))

    dense = moved(_theorems("flash_attention.ncd")["flash_attention_causal"])
    for name, fraction in live.items():
        print(f"{name} at 16384, 8 documents, live {fraction:.4f}: {moved(docs[name], fraction) / dense:.4f} "
              f"of the dense causal kernel's bytes")


if __name__ == "__main__":
    main()
