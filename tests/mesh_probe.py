"""Measurements of the mesh lowering on 8 host devices, printed as one JSON object.

Run by tests/test_mesh.py in its own process: XLA_FLAGS=--xla_force_host_platform_device_count=8
must be set before jax starts, so these runs cannot share the test process (nor another test's
under pytest-xdist).  ``python tests/mesh_probe.py CLI_MODULE.py`` also loads the module that
`napkin lower ... --target jax --mesh 8 -o CLI_MODULE.py` wrote and runs its function.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEVICES = 8
if f"--xla_force_host_platform_device_count={DEVICES}" not in os.environ.get("XLA_FLAGS", ""):
    sys.exit(f"set XLA_FLAGS=--xla_force_host_platform_device_count={DEVICES} before running this probe")

import jax  # noqa: E402  (after the device count is checked)
import jax.numpy as jnp  # noqa: E402

from napkin_cat import grad  # noqa: E402
from napkin_cat.elaborate import loads  # noqa: E402
from napkin_cat.evaluate import evaluate  # noqa: E402
from napkin_cat.lower import lower  # noqa: E402
from napkin_cat.proof import prove, theorem  # noqa: E402
from tests import lower_cases as cases  # noqa: E402

PROOFS = ROOT / "proofs" / "ring_attention.ncd"
#: the sharded axis's size read as a scalar: each device must see |q|, not its block's extent
SIZED = """axis q, d
diagram sized(X: [q d], Y: [q d]) -> [q d] {
  return X * rsqrt(q) + Y * q
}
theorem sized: sized {
  group q by gq at mesh
  group q by gr
}
"""

#: causal attention with only the queries sharded: each device runs its shard of ⌈q/8⌉ queries
#: vectorised, and its causal chunk ranges must span the whole shard, not one gq-tile of it
SHARDED_CAUSAL = """use "../examples/attention.ncd"
theorem sharded_causal: causal_attention {
  rewrite softmax_contract at P, O
  group q by mq at mesh
  group q by gq
  stream x by sx via online_softmax
}
"""

#: a ring under a document mask (the data-mask skip inside each device's fold): 37 keys on 8 devices
#: are blocks of 5, shorter than a chunk, so each fold's block mask is its ragged tail alone; built
#: by concatenating it to an empty array, it segfaulted eager jax.shard_map on CPU (jax 0.11)
RING_DOCUMENT = """use "../examples/masked_attention.ncd"
theorem ring_document: document_attention {
  rewrite softmax_contract at P, O
  group q by mq at mesh
  stream x by mx at mesh via online_softmax
  group q by gq
  stream x by sx via online_softmax
}
"""


def _inputs(shapes: list[tuple[int, ...]], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


def _run(fn: Any, source: Any, arrays: list[np.ndarray], **kwargs: Any) -> dict[str, Any]:
    out = fn(*arrays, **kwargs)
    expected = evaluate(source, arrays)
    return {"max_err": float(np.max(np.abs(np.asarray(out) - expected))), "shape": list(out.shape),
            "devices": len(out.sharding.device_set)}


def _extreme(thm: Any, target: str, seed: int, tiles: dict[str, int]) -> dict[str, Any]:
    """The mesh kernel on ``lower_cases.extreme_inputs`` (scores scaled to |S| ≈ 10⁴, ragged sizes that
    8 devices' blocks and the tiles do not divide): does it agree with the evaluator within the
    README's extreme bound (``extreme_tolerance``), and with what error and |S|?"""
    sizes, arrays, largest = cases.extreme_inputs(thm, seed)
    fn = lower(thm, target=target, mesh=DEVICES, tiles=tiles).fn
    options = {"interpret": True} if target == "pallas" else {}
    got = np.asarray(fn(*[jnp.asarray(a, jnp.float32) for a in arrays], **options), np.float64)
    (want,) = cases.reference(thm, arrays, sizes)
    return {"agrees": cases.agrees(got, want, cases.extreme_tolerance(thm, largest)), "largest": largest,
            "max_err": float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))}


def _memory(name: str, devices: int, q: int, x: int, d: int = 64) -> dict[str, int]:
    """Per-device sizes of the compiled function on inputs already placed one block per device."""
    thm = theorem(PROOFS, name)
    fn = lower(thm, target="jax", mesh=devices, tiles={"gq": 128, "sx": 64}).fn
    mesh = jax.sharding.Mesh(jax.devices()[:devices], ("mesh",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("mesh", None))
    arrays = [jax.device_put(a.astype(np.float32), rows) for a in _inputs([(q, d), (x, d), (x, d)], 0)]
    stats = jax.jit(fn).lower(*arrays).compile().memory_analysis()
    return {"argument": int(stats.argument_size_in_bytes), "output": int(stats.output_size_in_bytes),
            "temp": int(stats.temp_size_in_bytes)}


def _gradient(thm: Any, tiles: dict[str, int], shape: tuple[int, ...] = (1000, 64)) -> dict[str, Any]:
    """jax.grad through the mesh function (jax target, 8 devices) against the float64
    evaluator's VJP (``grad.vjp``): the largest error relative to each gradient's magnitude."""
    arrays = _inputs([shape] * 3, 5)
    (cotangent,) = _inputs([shape], 6)
    want = evaluate(grad.vjp(thm.source), [*arrays, cotangent])
    fn = lower(thm, target="jax", mesh=DEVICES, tiles=tiles).fn
    got = jax.grad(lambda *a: jnp.sum(fn(*a) * cotangent), argnums=(0, 1, 2))(
        *(jnp.asarray(a, jnp.float32) for a in arrays))
    return {"max_rel_err": max(float(np.max(np.abs(np.asarray(g) - w)) / np.max(np.abs(w)))
                               for g, w in zip(got, want, strict=True))}


def main() -> None:
    out: dict[str, Any] = {"devices": len(jax.devices())}
    tiles = {"gq": 128, "sx": 64}
    for name, n in (("ring_attention", 1024), ("ring_attention", 1000), ("ring_attention_causal", 1000),
                    ("ring_attention_causal", 1024)):
        thm = theorem(PROOFS, name)
        fn = lower(thm, target="jax", mesh=DEVICES, tiles=tiles).fn
        out[f"{name}/{n}"] = _run(fn, thm.source, _inputs([(n, 64), (n, 64), (n, 64)], n))
    thm = theorem(PROOFS, "ring_attention")  # fewer keys than devices: most blocks are all padding
    out["ring_attention/q5x3"] = _run(lower(thm, target="jax", mesh=DEVICES, tiles=tiles).fn, thm.source,
                                      _inputs([(5, 64), (3, 64), (3, 64)], 3))
    heads = theorem(PROOFS, "sharded_mha")  # 12 heads over 8 devices: padded to 16
    for target, n in (("jax", 100), ("pallas", 32)):
        fn = lower(heads, target=target, mesh=DEVICES, tiles={"gq": 32, "sx": 16}).fn
        out[f"sharded_mha/{target}"] = _run(fn, heads.source, _inputs([(2, 12, n, 64)] * 3, 7))
    sized = prove(loads(SIZED), "sized")  # 37 rows over 8 devices: blocks of 5, padded
    for target in ("jax", "pallas"):
        fn = lower(sized, target=target, mesh=DEVICES, tiles={"gr": 4}, dtype="float32").fn
        out[f"sized/{target}"] = _run(fn, sized.source, _inputs([(37, 16)] * 2, 8))
    # 100 queries over 8 devices: shards of 13 queries grouped by 8, keys in chunks of 8 (the red team's
    # case: the chunks past the first 8 rows of each shard were skipped, and some run without the mask)
    causal = prove(loads(SHARDED_CAUSAL, str(PROOFS)), "sharded_causal")
    out["sharded_causal/jax"] = _run(lower(causal, target="jax", mesh=DEVICES, tiles={"gq": 8, "sx": 8}).fn,
                                     causal.source, _inputs([(100, 64), (77, 64), (77, 64)], 9))
    document = prove(loads(RING_DOCUMENT, str(PROOFS)), "ring_document")
    ids = [np.sort(np.random.default_rng(10).integers(0, 3, n)).astype(np.float64) for n in (13, 37)]
    ids[0][-1] = 9.0  # a query whose document has no key: a fully masked row
    out["ring_document/jax"] = _run(lower(document, target="jax", mesh=DEVICES, tiles={"gq": 16, "sx": 16}).fn,
                                    document.source, [*_inputs([(13, 64), (37, 64), (37, 64)], 10), *ids])
    for name, target in (("ring_attention", "jax"), ("ring_attention_causal", "jax"), ("sharded_mha", "jax"),
                         ("sharded_mha", "pallas")):
        out[f"extreme/{name}/{target}"] = _extreme(theorem(PROOFS, name), target, len(name), {"gq": 16, "sx": 16})
    for devices in (1, 8):
        out[f"memory/{devices}"] = _memory("ring_attention", devices, 1024, 1024)
    for name in ("ring_attention", "ring_attention_causal"):
        out[f"grad/{name}"] = _gradient(theorem(PROOFS, name), tiles)
    out["grad/sharded_mha"] = _gradient(heads, {"gq": 32, "sx": 16}, shape=(2, 12, 100, 64))
    if len(sys.argv) > 1:  # the module the CLI wrote
        spec = importlib.util.spec_from_file_location("cli_ring", sys.argv[1])
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for n in (1024, 1000):
            out[f"cli/{n}"] = _run(module.ring_attention, thm.source, _inputs([(n, 64), (n, 64), (n, 64)], 11))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
