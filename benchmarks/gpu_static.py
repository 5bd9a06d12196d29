"""napkin's flash attention beside JAX's Pallas `mha`, compiled for Hopper without a GPU.

    python benchmarks/gpu_static.py                        # triton importable here
    python benchmarks/gpu_static.py --triton-python PY     # triton in another interpreter
    python benchmarks/gpu_static.py --backward             # the FA-2 backward's key pass instead

Each kernel (napkin's `flash_mha` / `flash_causal_mha` of benchmarks/gpu_attention.ncd at the
tiles the cost model chooses for h200; JAX's `jax.experimental.pallas.ops.gpu.attention.mha`
at its default blocks) is cross-lowered for CUDA against an abstract "NVIDIA H200", and the
Triton IR each `pallas_call` hands to XLA is captured with its `num_warps`, `num_stages` and
grid (a private jax API, pinned to jax 0.11.2: a clear error if it moves).  The `triton`
package (the optional extra `napkin-cat[static-gpu]`; any interpreter that has it, it needs
no jax) compiles each for sm_90a, from the TTIR passes on as XLA does; its bundled `ptxas -v`
gives registers and spill bytes, `cuobjdump -sass` the SASS.  The main loop is the backward
branch spanning the most instructions; per score element it runs loop instructions x 32 x
num_warps / (block_q x block_k).

Cases: bf16, N = 8192, one batch; causal and not; d = 64 and 128; 1 and 16 heads.  napkin's
kernel is also compiled at mha's tiles, which separates its code from its tile choice.  The table
goes to stdout, everything to results/gpu_static.json, and the last line is
`spill_bytes=<max over napkin kernels> sass_per_score_vs_mha=<max ratio napkin/mha>`.
Recipe and the baseline measured by hand: ../README "Kernels" and BENCHMARKS.md.  Numbers come
from the pip Triton, not the one XLA pins: compare kernels compiled by the same compiler.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
N = 8192


# ---- compiling (any interpreter with triton; no jax) ---------------------------------------------

def _counts(body: list[str]) -> dict[str, Any]:
    ops = [t.split()[1] if t.startswith("@") else t.split()[0] for t in body]
    mix = collections.Counter(o.split(".")[0] for o in ops)
    return {"loop": len(body), "mufu_ex2": sum(o.startswith("MUFU.EX2") for o in ops), "mix": dict(mix.most_common()),
            "hgmma": sum(o.startswith("HGMMA") for o in ops),
            "local": sum(o.startswith(("STL", "LDL")) for o in ops),
            "mask": sum(o.startswith(("FSEL", "FSETP")) for o in ops)}


def sass_loop(sass: str) -> dict[str, Any]:
    """Counts over the main loop of ``sass`` (the backward branch spanning the most
    instructions) and, as ``second``, over the longest loop outside it (a causal kernel's
    masked loop on the diagonal chunks; None where there is none)."""
    lines = [(int(m.group(1), 16), m.group(2)) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    loops: list[tuple[int, int]] = []
    for address, text in lines:
        branch = re.search(r"\bBRA\s+(?:`\(\.L_x_\d+\)\s*)?0x([0-9a-f]+)", text)
        if branch and int(branch.group(1), 16) < address:
            loops.append((int(branch.group(1), 16), address))

    def body(span: tuple[int, int]) -> list[str]:
        return [t for a, t in lines if span[0] <= a <= span[1]]
    if not loops:
        return {**_counts([]), "second": None}
    main = max(loops, key=lambda span: len(body(span)))
    apart = [span for span in loops if span[1] < main[0] or span[0] > main[1]]
    second = max(apart, key=lambda span: len(body(span))) if apart else None
    return {**_counts(body(main)), "second": None if second is None else _counts(body(second))}


def loop_loads(ttir: str) -> list[str]:
    """The blocks ``tt.load`` reads inside an ``scf.for`` (a streamed loop) of ``ttir``, each as its
    shape and element type (``64x64 bf16``): what a program loads per chunk."""
    loads, depth, loops = [], 0, []
    for line in ttir.splitlines():
        if "scf.for" in line:
            loops.append(depth)
        if loops and "tt.load" in line:
            block = re.search(r"tensor<([0-9x]+)x!tt\.ptr<(\w+)>>", line)
            loads.append(f"{block.group(1)} {block.group(2)}" if block else "scalar")
        depth += line.count("{") - line.count("}")
        while loops and depth <= loops[-1]:
            loops.pop()
    return loads


def compile_all(folder: Path) -> None:
    """Compile every kernel of ``folder/manifest.json`` and write ``folder/compiled.json``."""
    import triton  # the optional extra
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    tools = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    out = []
    for entry in json.loads((folder / "manifest.json").read_text()):
        # triton.compile starts an IR file after that IR's own stage; XLA runs the TTIR passes
        # (canonicalize, combine: acc + dot(a, b) -> dot(a, b, acc), CSE, ...) on what Pallas
        # hands it (MakeTTIR in its compilation_pipeline_cuda.cc), so run them first.
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        module = ir.parse_mlir_module(str(folder / entry["ttir"]), context)
        module.context = context
        options = backend.parse_options({"num_warps": entry["num_warps"], "num_stages": entry["num_stages"]})
        ttir = folder / f"{entry['id']}.opt.ttir"
        ttir.write_text(str(backend.make_ttir(module, {}, options, target.arch)))
        kernel = triton.compile(str(ttir), target=target,
                                options={"num_warps": entry["num_warps"], "num_stages": entry["num_stages"]})
        ptx, cubin = folder / f"{entry['id']}.ptx", folder / f"{entry['id']}.cubin"
        ptx.write_text(kernel.asm["ptx"])
        cubin.write_bytes(kernel.asm["cubin"])
        info = subprocess.run([str(tools / "ptxas"), "-arch=sm_90a", "-v", "-o", "/dev/null", str(ptx)],
                              capture_output=True, text=True, check=True).stderr
        sass = subprocess.run([str(tools / "cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
        registers = re.search(r"Used (\d+) registers", info)
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", info)
        out.append({"id": entry["id"], "registers": int(registers.group(1)) if registers else None,
                    "spill_store_bytes": int(spills.group(1)) if spills else 0,
                    "spill_load_bytes": int(spills.group(2)) if spills else 0,
                    "shared_bytes": int(kernel.metadata.shared), "sass": sass_loop(sass),
                    "loop_loads": loop_loads(ttir.read_text()),
                    "triton": triton.__version__})
    (folder / "compiled.json").write_text(json.dumps(out, indent=1))


# ---- capturing (this checkout's jax venv) ---------------------------------------------------------

def capture(fn: Any, *args: Any) -> dict[str, Any]:
    """The Triton IR, num_warps, num_stages and grid of the one pallas_call in ``fn(*args)``,
    cross-lowered for CUDA against an abstract H200."""
    seen = capture_all(fn, *args)
    if len(seen) != 1:
        raise RuntimeError(f"expected one pallas_call, captured {len(seen)} (jax's private Triton lowering "
                           "API moved? this script is pinned to jax 0.11.2)")
    return seen[0]


def capture_all(fn: Any, *args: Any) -> list[dict[str, Any]]:
    """``capture`` of every pallas_call in ``fn(*args)``, in the order they are lowered."""
    import jax
    from jax._src.pallas.triton import lowering

    original = lowering.lower_jaxpr_to_triton_module
    seen: list[str] = []

    def keep(*a: Any, **k: Any) -> Any:
        result = original(*a, **k)
        seen.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    h200 = jax.sharding.AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    lowering.lower_jaxpr_to_triton_module = keep
    try:
        with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), (), abstract_device=h200)):
            hlo = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    finally:
        lowering.lower_jaxpr_to_triton_module = original
    configs: list[dict[str, int]] = []
    for key, value in re.findall(r"\b(num_warps|num_stages|grid_[xyz]) = (\d+) : i32", hlo):
        if not configs or key in configs[-1]:  # each pallas_call's backend config lists each key once
            configs.append({})
        configs[-1][key] = int(value)
    if not seen or len(configs) != len(seen):
        raise RuntimeError(f"captured {len(seen)} Triton modules and {len(configs)} launch configs (jax's private "
                           "Triton lowering API moved? this script is pinned to jax 0.11.2)")
    return [{"ttir": ttir, "num_warps": config["num_warps"], "num_stages": config["num_stages"],
             "programs": math.prod(config.get(f"grid_{a}", 1) for a in "xyz")}
            for ttir, config in zip(seen, configs, strict=True)]


def chosen_tiles(thm: Any, sizes: dict[str, int]) -> dict[str, int]:
    """The tiles napkin's cost model chooses for h200 at these sizes (``napkin cost --size``)."""
    from napkin_cat.cost import cost
    from napkin_cat.cost.optimise import search
    from napkin_cat.lower import realised_schedule

    model = cost(thm, realised_schedule(thm.result, thm.schedule, "pallas"), hardware="h200", sizes=sizes,
                 dtype="bf16")
    rows = search(model, top=1, relax=True).rows
    if not rows:
        raise RuntimeError(f"no feasible tiles for {thm.name} at {sizes}")
    return {k: int(v) for k, v in rows[0].tiles.items()}


def cases() -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import attention as pallas_attention

    from napkin_cat.lower import lower
    from napkin_cat.proof import theorem

    rows = []
    for causal in (False, True):
        thm = theorem(HERE / "gpu_attention.ncd", "flash_causal_mha" if causal else "flash_mha")
        for d in (64, 128):
            for heads in (1, 16):
                sizes = {"b": 1, "h": heads, "q": N, "x": N, "d": d}
                blocks = pallas_attention.BlockSizes.get_default()
                spec = jax.ShapeDtypeStruct((1, heads, N, d), jnp.bfloat16)
                name = f"{'causal ' if causal else ''}d={d} h={heads}"
                chosen = chosen_tiles(thm, sizes)
                for impl, tiles in (("napkin", chosen), ("napkin at mha's tiles",
                                                         {"bq": blocks.block_q, "bk": blocks.block_k})):
                    kernel = lower(thm, target="pallas", tiles=tiles, dtype="bf16", hardware="h200")
                    rows.append({"case": name, "impl": impl, "block_q": tiles["bq"], "block_k": tiles["bk"],
                                 **capture(lambda q, k, v, fn=kernel.fn: fn(q, k, v, interpret=False), spec, spec,
                                           spec)})
                spec = jax.ShapeDtypeStruct((1, N, heads, d), jnp.bfloat16)  # mha's [batch, seq, heads, d]

                def mha(q: Any, k: Any, v: Any, causal: bool = causal, d: int = d) -> Any:
                    return pallas_attention.mha(q, k, v, None, sm_scale=1 / math.sqrt(d), causal=causal)

                rows.append({"case": name, "impl": "jax mha", "block_q": blocks.block_q, "block_k": blocks.block_k,
                             **capture(mha, spec, spec, spec)})
    return rows


def backward_cases() -> list[dict[str, Any]]:
    """FlashAttention-2's key pass (dK, dV) of proofs/flash_attention_backward.ncd, causal and not:
    as one kernel, and as the chain whose first kernel writes D = Σ_d dO·O once (``_hoisted``),
    each kernel at the tiles the cost model picks for h200; and JAX's `mha` backward at its default
    blocks (its D kernel, then one kernel for dK, dV and dQ).  bf16, N = 8192, d = 64, one head."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu import attention as pallas_attention

    from napkin_cat.lower import lower
    from napkin_cat.proof import theorem

    sizes = {"q": N, "x": N}
    spec = jax.ShapeDtypeStruct((N, 64), jnp.bfloat16)
    args = (spec, spec, spec, spec, jax.ShapeDtypeStruct((N,), jnp.bfloat16), spec)  # Q K V O L dO
    rows = []
    for causal in (False, True):
        case = f"{'causal ' if causal else ''}backward_kv d=64"
        for name in ("backward_kv", "backward_kv_hoisted"):
            thm = theorem(ROOT / "proofs" / "flash_attention_backward.ncd",
                          f"flash_attention{'_causal' if causal else ''}_{name}")
            kernels = thm.kernels or (thm,)
            tiles: dict[str, int] = {}
            for k in kernels:
                tiles |= chosen_tiles(k, {a: n for a, n in sizes.items() if a in k.result.axis_sizes()})
            lowered = lower(thm, target="pallas", tiles=tiles, dtype="bf16", hardware="h200")
            captured = capture_all(lambda *a, fn=lowered.fn: fn(*a, interpret=False), *args)
            for k, c in zip(kernels, captured, strict=True):
                streamed = "sq" in {p.tile for p in k.schedule.partitions}
                rows.append({"case": case, "impl": f"napkin {name}" + (f" ({k.name[-2:]})" if thm.kernels else ""),
                             "block_q": tiles["sq"] if streamed else None, "block_k": tiles["gx"] if streamed else None,
                             "tiles": ", ".join(f"{p.tile}={tiles[p.tile]}" for p in k.schedule.partitions), **c})
        blocks = pallas_attention.BlockSizes.get_default()
        shape = jax.ShapeDtypeStruct((1, N, 1, 64), jnp.bfloat16)

        def mha_backward(q: Any, k: Any, v: Any, do: Any, causal: bool = causal) -> Any:
            def mha(*operands: Any) -> Any:
                return pallas_attention.mha(*operands, None, sm_scale=0.125, causal=causal)

            return jax.vjp(mha, q, k, v)[1](do)

        _, *backward = capture_all(mha_backward, shape, shape, shape, shape)  # the forward's call first
        for label, c in zip(("jax mha backward (D)", "jax mha backward (dK dV dQ)"), backward, strict=True):
            fused = "dQ" in label
            rows.append({"case": case, "impl": label, "block_q": blocks.block_q_dkv if fused else None,
                         "block_k": blocks.block_kv_dkv if fused else None,
                         "tiles": f"{blocks.block_q_dkv}x{blocks.block_kv_dkv}" if fused else f"{blocks.block_q}",
                         **c})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--triton-python", default=sys.executable,
                        help="an interpreter with the triton package (default: this one)")
    parser.add_argument("--compile", type=Path, help=argparse.SUPPRESS)  # the compiling half, run by the first
    parser.add_argument("--backward", action="store_true",
                        help="the key pass of the FA-2 backward (one kernel, D hoisted, JAX's) instead")
    args = parser.parse_args()
    if args.compile:
        compile_all(args.compile)
        return
    sys.path.insert(0, str(ROOT))
    warnings.filterwarnings("ignore", message="The Pallas Triton backend is deprecated")
    warnings.filterwarnings("ignore", message="jax.experimental.pallas.ops.gpu.attention is deprecated")
    rows = backward_cases() if args.backward else cases()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for i, row in enumerate(rows):
            row["id"] = f"k{i}"
            (folder / f"k{i}.ttir").write_text(row.pop("ttir"))
        manifest = [{"id": r["id"], "ttir": f"{r['id']}.ttir", "num_warps": r["num_warps"],
                     "num_stages": r["num_stages"]} for r in rows]
        (folder / "manifest.json").write_text(json.dumps(manifest))
        subprocess.run([args.triton_python, str(Path(__file__).resolve()), "--compile", str(folder)], check=True)
        compiled = {c["id"]: c for c in json.loads((folder / "compiled.json").read_text())}
    for row in rows:
        c = compiled[row.pop("id")]
        row |= {k: v for k, v in c.items() if k != "id"}
        if row["block_q"] is None:  # a kernel with no scores (the backward's D)
            row["sass_per_score"] = row["second_sass_per_score"] = None
            continue
        per_score = 32 * row["num_warps"] / (row["block_q"] * row["block_k"])
        row["sass_per_score"] = row["sass"]["loop"] * per_score
        second = row["sass"]["second"]
        row["second_sass_per_score"] = None if second is None else second["loop"] * per_score
    if args.backward:
        _backward_table(rows)
        return
    header = ("case", "impl", "tiles", "warps/stages", "programs", "registers", "spill B", "shared KiB",
              "loop instr", "MUFU.EX2", "SASS/score", "other loop SASS/score (masks)")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for r in rows:
        print(" | ".join(str(x) for x in (
            r["case"], r["impl"], f"{r['block_q']}x{r['block_k']}", f"{r['num_warps']}/{r['num_stages']}",
            r["programs"], r["registers"], r["spill_store_bytes"] + r["spill_load_bytes"],
            f"{r['shared_bytes'] / 1024:.0f}", r["sass"]["loop"], r["sass"]["mufu_ex2"], f"{r['sass_per_score']:.1f}",
            "-" if r["second_sass_per_score"] is None
            else f"{r['second_sass_per_score']:.1f} ({r['sass']['second']['mask']})")))
    def ratio(impl: str) -> float:
        return max(r["sass_per_score"] / next(m["sass_per_score"] for m in rows if m["impl"] == "jax mha"
                                              and m["case"] == r["case"]) for r in rows if r["impl"] == impl)

    ours = [r for r in rows if r["impl"] == "napkin"]
    spill = max(r["spill_store_bytes"] + r["spill_load_bytes"] for r in ours)
    same = ratio("napkin at mha's tiles")
    print(f"at mha's tiles: sass_per_score_vs_mha={same:.3f}")
    from harness import machine, write

    write("gpu_static", {"machine": machine(), "n": N, "triton": rows[0]["triton"], "rows": rows,
                         "spill_bytes": spill, "sass_per_score_vs_mha": ratio("napkin"),
                         "sass_per_score_vs_mha_at_mha_tiles": same})
    print(f"spill_bytes={spill} sass_per_score_vs_mha={ratio('napkin'):.3f}")


def _backward_table(rows: list[dict[str, Any]]) -> None:
    """The backward rows: per kernel its tiles, launch, registers, the blocks its streamed loop
    loads per chunk (from the TTIR after Triton's passes) and the main loop's SASS."""
    header = ("case", "impl", "tiles", "warps/stages", "programs", "registers", "spill B", "shared KiB",
              "loads per chunk", "loop instr", "LDGSTS+LDG in loop", "SASS/score", "second loop SASS/score")
    print(" | ".join(header))
    print(" | ".join("---" for _ in header))
    for r in rows:
        mix = r["sass"]["mix"]
        second = r["second_sass_per_score"]
        print(" | ".join(str(x) for x in (
            r["case"], r["impl"], r["tiles"], f"{r['num_warps']}/{r['num_stages']}", r["programs"], r["registers"],
            r["spill_store_bytes"] + r["spill_load_bytes"], f"{r['shared_bytes'] / 1024:.0f}",
            ", ".join(r["loop_loads"]) or "-", r["sass"]["loop"], mix.get("LDGSTS", 0) + mix.get("LDG", 0),
            "-" if r["sass_per_score"] is None else f"{r['sass_per_score']:.2f}",
            "-" if second is None else f"{second:.2f}")))
    from harness import machine, write

    write("gpu_static_backward", {"machine": machine(), "n": N, "triton": rows[0]["triton"], "rows": rows})


if __name__ == "__main__":
    main()
