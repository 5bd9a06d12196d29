"""napkin's Mosaic GPU flash attention beside JAX's `attention_mgpu`, compared at the module level.

    python benchmarks/mosaic_static.py

No GPU is needed, but Mosaic GPU's MLIR bindings are (`_mosaic_gpu_ext`, in the CUDA plugin
matching jax: `pip install --no-deps jax-cuda13-plugin==0.11.2`), and `attention_mgpu` imports
`absl` (absl-py); the `mosaic` extra names both.  Each kernel
is cross-lowered for CUDA against an abstract "NVIDIA H200"; the Mosaic GPU module each
`plgpu.kernel` lowers to is captured after Mosaic's own passes (layout inference, dialect
lowering: a wrap of `jax.experimental.mosaic.gpu.core.lower_mgpu_module`, a private API pinned
to jax 0.11.2, with a clear error if it moves) and its op sites counted:

- warpgroups: the kernel's block size / 128;
- TMA sites: `cp.async.bulk.tensor` global->shared and shared->global copies;
- wgmma: `wgmma.mma_async` inline-PTX sites; ex2: `ex2.approx` sites (attention_mgpu, with
  `approx_math`) or `math.exp2` ops (napkin, lowered to ex2 later, in C++) (static sites in the
  module; the kernels' loops run their bodies once per KV tile, so a site in a loop is "per
  tile", and sites outside loops, prologues and epilogues, are counted too);
- barriers: `mbarrier.init` and `mbarrier.try_wait` sites, and `setmaxnreg` (register
  reallocation between producer and consumer warpgroups);
- SMEM: the scratch bytes the launch reserves.

The PTX -> SASS step runs in C++ inside the plugin only when a CUDA client compiles, so registers
and SASS need a GPU (benchmarks/gpu.py on the device).  Cases: f16 (attention_mgpu's SMEM is
f16 only), one batch, one head, N = 4096, d = 64 and 128, causal and not; napkin's kernel at the
tiles its cost model picks for h200's [mosaic] rules (`flash_mha` / `flash_causal_mha` of
benchmarks/gpu_attention.ncd, one batch and head); attention_mgpu at block_q = 64, block_kv =
128, max_concurrent_steps = 2 (its benchmark's defaults).  Table to stdout, everything to
results/mosaic_static.json (``NAPKIN_BENCH_RESULTS`` moves the folder, as for every benchmark).
"""

from __future__ import annotations

import json
import re
import sys
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks.harness import RESULTS, machine  # noqa: E402
from napkin_cat import proof  # noqa: E402
from napkin_cat.lower import lower  # noqa: E402

H200 = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
N = 4096
COUNTS = {  # MLIR ops (TMA) and inline-PTX strings (wgmma, ex2, barriers)
    "tma_load": r"nvvm\.cp\.async\.bulk\.tensor\.shared\.cluster\.global",
    "tma_store": r"nvvm\.cp\.async\.bulk\.tensor\.global\.shared",
    "wgmma": r"\"[^\"]*wgmma\.mma_async[^\"]*\"",
    "ex2": r"\"[^\"]*ex2\.approx[^\"]*\"|math\.exp2",
    "mbarrier_init": r"\"[^\"]*mbarrier\.init\.shared[^\"]*\"",
    "mbarrier_wait": r"nvvm\.mbarrier\.try_wait",
    "setmaxnreg": r"\"[^\"]*setmaxnreg[^\"]*\"",
}


def capture() -> list[dict[str, Any]]:
    """Wrap Mosaic GPU's module lowering; returns the list each lowered kernel is appended to."""
    try:
        from jax.experimental.mosaic.gpu import core
        original = core.lower_mgpu_module
    except (ImportError, AttributeError) as exc:
        raise SystemExit(f"mosaic_static.py needs jax 0.11.2's Mosaic GPU core.lower_mgpu_module ({exc}); "
                         "install jax-cuda13-plugin==0.11.2 with --no-deps") from None
    seen: list[dict[str, Any]] = []

    def wrapped(module: Any, launch_ctx: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(module, launch_ctx, *args, **kwargs)
        seen.append({"text": str(module)})
        return out

    core.lower_mgpu_module = wrapped
    return seen


def cross_lower(fn: Any, *specs: jax.ShapeDtypeStruct) -> str:
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), (), abstract_device=H200)):
        return jax.jit(fn).trace(*specs).lower(lowering_platforms=("cuda",)).as_text()  # type: ignore[no-any-return]


def summarise(module: dict[str, Any], hlo: str) -> dict[str, Any]:
    text = module["text"]
    row: dict[str, Any] = {k: len(re.findall(p, text)) for k, p in COUNTS.items()}
    launch = re.search(r"threads\([^)]*\) in \(%\w+ = %c(\d+)", text)
    smem = re.search(r"dynamic_shared_memory_size %c(\d+)", text)
    row["block_threads"] = int(launch.group(1)) if launch else None
    row["warpgroups"] = row["block_threads"] // 128 if row["block_threads"] else None
    row["smem_bytes"] = int(smem.group(1)) if smem else None
    row["custom_calls"] = hlo.count("custom_call @mosaic_gpu")
    return row


def napkin_kernel(causal: bool) -> tuple[Any, dict[str, int]]:
    thm = proof.theorem(str(HERE / "gpu_attention.ncd"), "flash_causal_mha" if causal else "flash_mha")
    low = lower(thm, target="mosaic", dtype="float16")
    fn = low.forward

    def run(q: Any, k: Any, v: Any) -> Any:
        return fn(q[None, None], k[None, None], v[None, None], interpret=False)[0, 0]
    return run, dict(low.tiles)


def mgpu_kernel(d: int, causal: bool) -> Any:
    from jax._src import lib as jaxlib_lib
    from jax.experimental.pallas.ops.gpu import attention_mgpu as am

    if jaxlib_lib.cuda_versions is None:  # the CPU jaxlib has none; attention_mgpu asserts it
        class Versions:
            @staticmethod
            def cuda_runtime_get_version() -> int:
                return 12090
        am.cuda_versions = Versions()  # type: ignore[attr-defined]
    config = am.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2, causal=causal)

    def run(q: Any, k: Any, v: Any) -> Any:
        return am.attention(q[None, :, None], k[None, :, None], v[None, :, None], config)[0, :, 0]
    return run


def main() -> None:
    warnings.simplefilter("ignore", DeprecationWarning)
    seen = capture()
    rows = []
    for d in (64, 128):
        for causal in (False, True):
            spec = jax.ShapeDtypeStruct((N, d), jnp.float16)
            for who in ("napkin mosaic", "attention_mgpu"):
                before = len(seen)
                try:
                    if who == "napkin mosaic":
                        fn, tiles = napkin_kernel(causal)
                        hlo = cross_lower(fn, spec, spec, spec)
                        blocks = "x".join(str(t) for t in tiles.values() if t > 1)
                    else:
                        hlo = cross_lower(mgpu_kernel(d, causal), spec, spec, spec)
                        blocks = "64x128 (x2 compute wg)"
                    row = summarise(seen[before], hlo) if len(seen) > before else {"error": "no module captured"}
                except Exception as exc:  # a lowering failure is a result: record it
                    row = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
                    blocks = "-"
                row.update({"kernel": who, "d": d, "causal": causal, "blocks": blocks})
                rows.append(row)
    keys = ["kernel", "d", "causal", "blocks", "warpgroups", "tma_load", "tma_store", "wgmma", "ex2",
            "mbarrier_init", "mbarrier_wait", "setmaxnreg", "smem_bytes"]
    print("| " + " | ".join(keys) + " |")
    print("|" + " --- |" * len(keys))
    for row in rows:
        if "error" in row:
            print(f"| {row['kernel']} | {row['d']} | {row['causal']} | {row['error']} |")
        else:
            print("| " + " | ".join(str(row.get(k)) for k in keys) + " |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "mosaic_static.json"
    out.write_text(json.dumps({"machine": machine(), "jax": jax.__version__, "N": N, "dtype": "float16",
                               "command": "python benchmarks/mosaic_static.py", "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
