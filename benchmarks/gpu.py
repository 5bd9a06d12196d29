"""napkin's generated Pallas kernels on an H200, side by side with JAX's own, in one run.

    python benchmarks/gpu.py                 # on the GPU machine (jax 0.11.2 + CUDA, offline)
    python benchmarks/gpu.py --dry-run       # the same code on CPU, interpret mode, tiny sizes

Self-contained for an offline machine: napkin is imported from this checkout and lark
(the one dependency the GPU image lacks) from the wheel in benchmarks/wheels/, which is
put on sys.path (a pure-Python wheel imports as a zip). It

1. checks every kernel against XLA at one size (flash attention causal and non-causal,
   d = 64 and 128, bf16, at the tiles napkin's cost model chooses for the H200; tiled
   matmul, bf16 in, f32 accumulation; the gradient of attention, forward and backward);
2. times them against `jax.experimental.pallas.ops.gpu.attention.mha`,
   `jax.nn.dot_product_attention(implementation='cudnn')`, naive XLA attention and
   `jnp.dot`, at N = 2k, 8k, 16k with batch × N = 16k tokens and d × heads = 2048; on a GPU
   also napkin's Mosaic GPU kernel (`--target mosaic`) against JAX's FA3-style
   `attention_mgpu` (f16; it needs absl-py, else its row holds the import error);
   training (issue 13): `jax.grad` of Σ out·dO through napkin's proved FlashAttention-2
   forward and backward kernels (proofs/flash_attention_backward.ncd, one head of d = 64,
   vmapped over batch × heads) against `jax.grad` of mha (its own Pallas backward), of cuDNN's and of
   naive XLA attention, with the scratch memory each compiled gradient needs
   (`memory_analysis().temp_size_in_bytes`: N² for those that keep the probabilities), and
   napkin's again with the key pass as the chain that writes D = Σ dO·O first ("D hoisted");
3. prints TFLOP/s and % of the H200's dense bf16 peak, with the cost model's predicted
   HBM bytes and time beside each napkin forward kernel, and writes results/gpu.json.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.extend(str(w) for w in sorted((HERE / "wheels").glob("*.whl")))
warnings.filterwarnings("ignore", message="The Pallas Triton backend is deprecated")
warnings.filterwarnings("ignore", message="jax.experimental.pallas.ops.gpu.attention is deprecated")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

sys.path.insert(0, str(HERE))
from gpu_static import chosen_tiles  # noqa: E402

PEAK_BF16 = 989e12  # H200 SXM dense bf16 tensor-core FLOP/s (H200 datasheet: 1,979 with sparsity)
TOKENS, HIDDEN = 16384, 2048


def bench(fn: Callable[[], Any], warmup: int, iters: int) -> tuple[float, float]:
    """Median and min seconds of ``fn()`` (blocking), after compile and warm-up."""
    jax.block_until_ready(fn())
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def timed(fn: Callable[[], Any], flops: float, dry: bool, iters: int = 20) -> dict[str, float]:
    """A case's row fields: median and min milliseconds (``bench``), TFLOP/s and % of peak; a dry
    run (interpret mode on CPU, where the times mean nothing) calls each case twice: compile, then
    one timed call."""
    median, best = bench(fn, warmup=0 if dry else 3, iters=1 if dry else iters)
    return {"median_ms": median * 1e3, "min_ms": best * 1e3, "tflops": flops / median / 1e12,
            "pct_peak": 100 * flops / median / PEAK_BF16}


def failed(exc: Exception) -> dict[str, str]:
    """The row field of a baseline that cannot run here: reported, not fatal."""
    return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"}


def napkin_theorem(causal: bool) -> Any:
    from napkin_cat.proof import theorem

    return theorem(HERE / "gpu_attention.ncd", "flash_causal_mha" if causal else "flash_mha")


def napkin_attention(thm: Any, tiles: dict[str, int]) -> Any:
    from napkin_cat.lower import lower

    return lower(thm, target="pallas", tiles=tiles, dtype="bf16")


def predicted(thm: Any, sizes: dict[str, int], tiles: dict[str, int]) -> tuple[float, float]:
    """The cost model's HBM bytes and overlapped time for this kernel at these sizes."""
    from napkin_cat.cost import cost
    from napkin_cat.cost.roofline import timing

    c = cost(thm, hardware="h200", sizes=sizes, dtype="bf16")
    hbm_bytes = float(c.at(c.first.transfers_bytes, tiles))
    return hbm_bytes, float(timing(c, tiles).overlapped)


def naive_attention(q: Any, k: Any, v: Any, causal: bool) -> Any:
    s = jnp.einsum("bhqd,bhxd->bhqx", q, k, preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[2]
        s = jnp.where(jnp.arange(n)[:, None] >= jnp.arange(k.shape[2])[None, :], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1).astype(q.dtype)
    return jnp.einsum("bhqx,bhxd->bhqd", p, v, preferred_element_type=jnp.float32).astype(q.dtype)


def attention_cases(n: int, d: int, causal: bool, dry: bool, tiles: dict[str, int] | None) -> list[dict[str, Any]]:
    """napkin's kernel (at ``tiles``, else the cost model's) and every baseline at one size,
    mha at napkin's tiles; correctness against naive f32 XLA."""
    from jax.experimental.pallas.ops.gpu import attention as pallas_attention

    batch = 1 if dry else max(1, TOKENS // n)
    heads = 2 if dry else HIDDEN // d
    keys = jax.random.split(jax.random.PRNGKey(n + d + causal), 3)
    q, k, v = (jax.random.normal(kk, (batch, heads, n, d), jnp.bfloat16) for kk in keys)
    flops = 4 * batch * heads * n * n * d / (2 if causal else 1)
    thm = napkin_theorem(causal)
    sizes = {"b": batch, "h": heads, "q": n, "x": n, "d": d}
    tiles = tiles or chosen_tiles(thm, sizes)  # as benchmarks/gpu_static.py (and `napkin cost --size`) choose
    kernel = napkin_attention(thm, tiles)
    interpret = True if dry else None
    ours = jax.jit(lambda q, k, v: kernel.fn(q, k, v, interpret=interpret))
    ref = naive_attention(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), causal)
    err = float(jnp.max(jnp.abs(ours(q, k, v).astype(jnp.float32) - ref)))
    hbm, t_pred = predicted(thm, sizes, tiles)
    minimal = 4 * batch * heads * n * d * 2
    qt, kt, vt = (jnp.swapaxes(a, 1, 2) for a in (q, k, v))  # [batch, seq, heads, d] for mha and cudnn
    blocks = pallas_attention.BlockSizes(block_q=tiles["bq"], block_k=tiles["bk"], block_q_dkv=32,
                                         block_kv_dkv=32, block_q_dq=32, block_kv_dq=32)
    cases: dict[str, Callable[[], Any]] = {
        "napkin": lambda: ours(q, k, v),
        "pallas mha": jax.jit(lambda: pallas_attention.mha(qt, kt, vt, None, sm_scale=1 / math.sqrt(d), causal=causal,
                                                            block_sizes=blocks, interpret=dry)),
        "naive xla": jax.jit(lambda: naive_attention(q, k, v, causal)),
    }
    errors: dict[str, Any] = {}
    if not dry:
        cases["cudnn"] = jax.jit(lambda: jax.nn.dot_product_attention(qt, kt, vt, is_causal=causal,
                                                                      implementation="cudnn"))
        cases |= mosaic_cases(thm, q, k, v, qt, kt, vt, causal, ref, errors)
    rows = []
    for name, fn in cases.items():
        row: dict[str, Any] = {"kernel": f"attention d={d}{' causal' if causal else ''}", "impl": name, "n": n}
        try:
            row |= timed(fn, flops, dry)
        except Exception as exc:
            row |= failed(exc)
        if name == "napkin":
            row |= {"max_err": err, "pred_hbm_mb": hbm / 1e6, "min_hbm_mb": minimal / 1e6,
                    "pred_ms": t_pred * 1e3}
        if name in errors:
            row |= {"max_err": errors[name]} if isinstance(errors[name], float) else {"error": errors[name]}
        rows.append(row)
    return rows


def mosaic_cases(thm: Any, q: Any, k: Any, v: Any, qt: Any, kt: Any, vt: Any, causal: bool, ref: Any,
                 errors: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    """The Mosaic GPU rows (a GPU only: attention_mgpu does not run in interpret mode): napkin's
    ``--target mosaic`` kernel (bf16, the tiles its cost model picks within h200's [mosaic] rules)
    and JAX's FA3-style ``attention_mgpu`` (f16 only; its benchmark's blocks 64 x 128, two
    stages); a kernel that fails to lower or run is a row with its error."""
    from napkin_cat.lower import lower

    cases: dict[str, Callable[[], Any]] = {}
    try:
        mosaic = jax.jit(lower(thm, target="mosaic", dtype="bf16").fn)
        errors["napkin mosaic"] = float(jnp.max(jnp.abs(mosaic(q, k, v).astype(jnp.float32) - ref)))
        cases["napkin mosaic"] = lambda: mosaic(q, k, v)
    except Exception as exc:
        errors["napkin mosaic"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    try:  # it imports jax._src.test_util, which needs absl-py
        from jax.experimental.pallas.ops.gpu import attention_mgpu
    except ImportError as exc:
        reason = exc

        def missing() -> Any:
            raise reason
        cases["attention_mgpu"] = missing
        return cases
    q16, k16, v16 = (a.astype(jnp.float16) for a in (qt, kt, vt))
    config = attention_mgpu.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2, causal=causal)
    cases["attention_mgpu"] = jax.jit(lambda: attention_mgpu.attention(q16, k16, v16, config))
    return cases


def backward_cases(n: int, d: int, causal: bool, dry: bool) -> list[dict[str, Any]]:
    """Forward + backward: ``jax.grad`` of Σ attention(Q, K, V)·dO in Q, K and V, each
    implementation against ``jax.grad`` of naive attention in f32."""
    from jax.experimental.pallas.ops.gpu import attention as pallas_attention

    from napkin_cat.lower import lower
    from napkin_cat.proof import theorem

    batch = 1 if dry else max(1, TOKENS // n)
    heads = 2 if dry else HIDDEN // d
    keys = jax.random.split(jax.random.PRNGKey(7 * n + d + causal), 4)
    q, k, v, d_o = (jax.random.normal(kk, (batch, heads, n, d), jnp.bfloat16) for kk in keys)
    path = ROOT / "proofs" / "flash_attention_backward.ncd"
    prefix = "flash_attention_causal" if causal else "flash_attention"
    # on the device each kernel runs at its own cost-model pick (the forward and the dQ pass
    # share tile names, not sizes); interpreted, small tiles keep the dry run quick
    tiles = {"gq": 64, "sx": 32, "gx": 64, "sq": 32, "bq": 64} if dry else None
    interpret = True if dry else None

    def grad_of(forward: Callable[..., Any]) -> Callable[..., Any]:
        return jax.jit(jax.grad(lambda q, k, v: jnp.sum(forward(q, k, v).astype(jnp.float32)
                                                        * d_o.astype(jnp.float32)), argnums=(0, 1, 2)))

    def napkin(kv: str) -> Callable[..., Any]:
        """The training step with the key pass ``kv`` (one kernel, or the chain writing D first)."""
        passes = [theorem(path, f"{prefix}_{kv}"), theorem(path, f"{prefix}_backward_q")]
        kernel = lower(theorem(path, f"{prefix}_forward"), target="pallas", dtype="bf16", tiles=tiles,
                       hardware="h200", backward=passes)
        return grad_of(jax.vmap(jax.vmap(lambda q, k, v: kernel.fn(q, k, v, interpret=interpret))))  # batch, heads

    f32 = [a.astype(jnp.float32) for a in (q, k, v)]
    ref = grad_of(lambda q, k, v: naive_attention(q, k, v, causal))(*f32)
    ours = {"napkin": napkin("backward_kv"), "napkin (D hoisted)": napkin("backward_kv_hoisted")}
    errs = {name: max(float(jnp.max(jnp.abs(g.astype(jnp.float32) - r)) / jnp.max(jnp.abs(r)))
                      for g, r in zip(fn(q, k, v), ref, strict=True)) for name, fn in ours.items()}
    swap = lambda f: lambda q, k, v: jnp.swapaxes(f(*(jnp.swapaxes(a, 1, 2) for a in (q, k, v))), 1, 2)  # noqa: E731
    cases: dict[str, Callable[..., Any]] = {
        **ours,
        "pallas mha": grad_of(swap(lambda q, k, v: pallas_attention.mha(q, k, v, None, sm_scale=1 / math.sqrt(d),
                                                                          causal=causal, interpret=dry))),
        "naive xla": grad_of(lambda q, k, v: naive_attention(q, k, v, causal)),
    }
    if not dry:
        cases["cudnn"] = grad_of(swap(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                                                                    implementation="cudnn")))
    flops = 3.5 * 4 * batch * heads * n * n * d / (2 if causal else 1)  # backward 2.5x the forward (FA-2)
    rows = []
    for name, fn in cases.items():
        row: dict[str, Any] = {"kernel": f"attention grad d={d}{' causal' if causal else ''}", "impl": name, "n": n}
        try:
            row |= timed(lambda fn=fn: fn(q, k, v), flops, dry, iters=10)
            scratch = fn.lower(q, k, v).compile().memory_analysis()
            row["temp_mb"] = None if scratch is None else scratch.temp_size_in_bytes / 2**20
        except Exception as exc:
            row |= failed(exc)
        if name in errs:
            row["max_err"] = errs[name]
        rows.append(row)
    return rows


def matmul_cases(n: int, dry: bool, tiles: dict[str, int]) -> list[dict[str, Any]]:
    from napkin_cat.cost import cost
    from napkin_cat.cost.roofline import timing
    from napkin_cat.lower import lower
    from napkin_cat.proof import theorem

    thm = theorem(ROOT / "proofs" / "matmul.ncd", "tiled_matmul")
    kernel = lower(thm, target="pallas", tiles=tiles, dtype="bf16")
    ka, kb = jax.random.split(jax.random.PRNGKey(n))
    a = jax.random.normal(ka, (n, n), jnp.bfloat16)
    b = jax.random.normal(kb, (n, n), jnp.bfloat16)
    interpret = True if dry else None
    ours = jax.jit(lambda a, b: kernel.fn(a, b, interpret=interpret))
    ref = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32))
    err = float(jnp.max(jnp.abs(ours(a, b).astype(jnp.float32) - ref)) / jnp.max(jnp.abs(ref)))
    c = cost(thm, hardware="h200", sizes={"a": n, "b": n, "c": n}, dtype="bf16")
    hbm = float(c.at(c.first.transfers_bytes, tiles))
    t_pred = float(timing(c, tiles).overlapped)
    flops = 2 * n**3
    rows = []
    for name, fn in {"napkin": lambda: ours(a, b),
                     "jnp.dot": jax.jit(lambda: jnp.dot(a, b, preferred_element_type=jnp.float32))}.items():
        row: dict[str, Any] = {"kernel": "matmul", "impl": name, "n": n}
        row |= timed(fn, flops, dry)
        if name == "napkin":
            row |= {"max_err": err, "pred_hbm_mb": hbm / 1e6, "min_hbm_mb": 3 * n * n * 2 / 1e6,
                    "pred_ms": t_pred * 1e3}
        rows.append(row)
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    cols = [("kernel", "kernel"), ("impl", "impl"), ("n", "N"), ("median_ms", "median ms"), ("min_ms", "min ms"),
            ("tflops", "TFLOP/s"), ("pct_peak", "% peak"), ("max_err", "max err"), ("pred_hbm_mb", "pred HBM MB"),
            ("min_hbm_mb", "min HBM MB"), ("pred_ms", "pred ms"), ("temp_mb", "temp MiB"), ("error", "error")]
    cells = [[h for _, h in cols]] + [[_fmt(r.get(k)) for k, _ in cols] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(cols))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in cells)


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dry-run", action="store_true", help="CPU, interpret mode, tiny sizes")
    parser.add_argument("--sizes", type=int, nargs="+", default=None)
    parser.add_argument("--out", default=str(HERE / "results" / "gpu.json"))
    args = parser.parse_args()
    dry = args.dry_run
    sizes = args.sizes or ([128] if dry else [2048, 8192, 16384])
    attn_tiles = {"bq": 64, "bk": 64} if dry else None  # on the GPU: the cost model's
    mm_tiles = {"ga": 64, "gc": 64, "sb": 32} if dry else {"ga": 128, "gc": 128, "sb": 64}
    print(f"jax {jax.__version__} backend={jax.default_backend()} devices={[d.device_kind for d in jax.devices()]}"
          f"{' (dry run: interpret mode)' if dry else ''}", flush=True)
    if not dry and jax.default_backend() != "gpu":
        sys.exit("no GPU found: run with --dry-run on a CPU")
    rows: list[dict[str, Any]] = []
    for n in sizes:
        for d in (64, 128):
            for causal in (False, True):
                rows += attention_cases(n, d, causal, dry, attn_tiles)
                if d == 64:  # examples/attention_backward.ncd, which the backward proofs use, declares d = 64
                    rows += backward_cases(n, d, causal, dry)
                print(f"attention N={n} d={d} causal={causal} done", flush=True)
        rows += matmul_cases(n, dry, mm_tiles)
    print("\n" + render(rows))
    failed = [r for r in rows if r["impl"] in ("napkin", "napkin (D hoisted)")
              and not r.get("max_err", 1) < (5e-2 if r["kernel"] != "matmul" else 2e-2)]
    grads = {r["kernel"] for r in rows if "grad" in r["kernel"]}
    for kernel in sorted(grads):  # training: napkin's fwd+bwd time and memory over the peers', at the largest N
        at = max(r["n"] for r in rows if r["kernel"] == kernel)
        mine = next(r for r in rows if r["kernel"] == kernel and r["n"] == at and r["impl"] == "napkin")
        for r in rows:
            if r["kernel"] == kernel and r["n"] == at and r["impl"] != "napkin" and "median_ms" in r:
                print(f"{kernel} N={at}: napkin vs {r['impl']}: speedup {r['median_ms'] / mine['median_ms']:.2f}"
                      + (f", scratch memory ratio {r['temp_mb'] / mine['temp_mb']:.2f}"
                         if r.get("temp_mb") and mine.get("temp_mb") else ""))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"jax": jax.__version__, "devices": [d.device_kind for d in jax.devices()],
                               "dry_run": dry, "command": " ".join(sys.argv), "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")
    if failed:
        sys.exit(f"correctness check failed: {[(r['kernel'], r['n'], r.get('max_err')) for r in failed]}")


if __name__ == "__main__":
    main()
