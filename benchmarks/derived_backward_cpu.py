"""Peak memory (and time) of a training step's gradient on the CPU: softcapped causal attention's
derived streamed backward against the unscheduled VJP; f32, d = 64, one head.

`derived` is `napkin_cat.attention(score_mod="30 * tanh(S / 30)", mask_mod="q >= x",
backward="derived")` on the plain-JAX target: the forward saves L, the backward passes are the
ones `napkin_cat.search.backward` derives, schedules (`derive`'s search) and proves, joined by a
proved `custom_vjp`; `jax.grad` of Σ out·dO with respect to Q, K and V.  `vjp` is the same
attention's VJP diagram (`napkin_cat.grad.vjp`) lowered unscheduled to plain JAX, what a Pallas
kernel without a backward runs for its gradient: it stores the q×x scores and weights.

    .venv/bin/python benchmarks/derived_backward_cpu.py [--sizes N ...] [--repeats R]

Each case runs in its own process (peak RSS is per case); the last line is
`memory_ratio_vs_vjp=X` (the VJP's peak over the derived backward's at the largest N both ran).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import driver

D = 64
SCORE, MASK = "30 * tanh(S / 30)", "q >= x"
TILES = {"gq": 1024, "sx": 512, "gx": 1024, "sq": 512}


def _inputs(n: int) -> list[Any]:
    import jax
    import jax.numpy as jnp

    return [jax.random.normal(jax.random.PRNGKey(i), (n, D), jnp.float32) for i in range(4)]


def derived(n: int) -> Callable[[], Any]:
    import jax
    import jax.numpy as jnp

    import napkin_cat

    attention = napkin_cat.attention(score_mod=SCORE, mask_mod=MASK, head_dim=D, backward="derived", target="jax",
                                     tiles={k: min(n, t) for k, t in TILES.items()})
    q, k, v, d_o = _inputs(n)
    fn = jax.jit(jax.grad(lambda q, k, v: jnp.sum(attention(q, k, v) * d_o), argnums=(0, 1, 2)))
    return lambda: jax.block_until_ready(fn(q, k, v))


def vjp(n: int) -> Callable[[], Any]:
    import jax

    from napkin_cat import kernel
    from napkin_cat.elaborate import loads
    from napkin_cat.fused import _attention_text
    from napkin_cat.grad import vjp as diagram_vjp
    from napkin_cat.lower import lower

    source = loads(_attention_text(SCORE, MASK, D), "<attention>").diagram("attention")
    backward = diagram_vjp(source)
    lowered = lower(kernel.refl(backward.name, backward), target="jax", dtype="float32")
    fn = jax.jit(lowered.fn)
    args = _inputs(n)
    return lambda: jax.block_until_ready(fn(*args))


CASES = {"derived": derived, "vjp": vjp}


def main() -> None:
    rows = driver("derived_backward_cpu", __file__, CASES, default_sizes=[16384], only_large={},
                  describe=__doc__.splitlines()[0])
    peaks = {(r["case"], r["n"]): r["peak_rss_mib"] for r in rows if "peak_rss_mib" in r}
    both = sorted(n for (case, n) in peaks if case == "derived" and ("vjp", n) in peaks)
    if both:
        print(f"memory_ratio_vs_vjp={peaks[('vjp', both[-1])] / peaks[('derived', both[-1])]:.2f}")


if __name__ == "__main__":
    main()
