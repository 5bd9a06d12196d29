"""The `mesh` level: ring attention and sharded heads proved, costed and lowered to shard_map.

The runs on 8 devices happen in one subprocess (tests/mesh_probe.py): the host device count
must be fixed before jax starts, which this process (and its pytest-xdist siblings) cannot do.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sympy

from napkin_cat import cli
from napkin_cat.cost import cost
from napkin_cat.cost.hardware import load as load_hardware
from napkin_cat.cost.mesh import mesh_cost
from napkin_cat.diagnostics import NapkinError
from napkin_cat.evaluate import evaluate
from napkin_cat.lower import lower
from napkin_cat.lower.runtime import round_up
from napkin_cat.proof import check_file, theorem
from napkin_cat.schedule.mesh import device_block

ROOT = Path(__file__).resolve().parent.parent
PROOF = ROOT / "proofs" / "ring_attention.ncd"
ATTENTION = ROOT / "examples" / "attention.ncd"
F32 = 4
#: one pytest-xdist worker runs this module (``--dist loadgroup``, pyproject): the probe's
#: subprocess is a fixture, and each worker that ran a test of it would run it again; it is
#: session-scoped, since a module fixture runs again when the worker leaves the module and
#: comes back (it ran twice, 80 s each)
pytestmark = pytest.mark.xdist_group("mesh_probe")


@pytest.fixture(scope="session")
def probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The probe's measurements, with the module `napkin lower --mesh 8` wrote run as well."""
    written = tmp_path_factory.mktemp("mesh") / "X.py"
    assert cli.main(["lower", str(PROOF), "ring_attention", "--target", "jax", "--mesh", "8", "--dtype", "f32",
                     "-o", str(written)]) == 0
    # the probe imports the napkin_cat of this checkout, not whichever one the interpreter has installed
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu", PYTHONPATH=path)
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "mesh_probe.py"), str(written)], env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_the_mesh_theorems_check() -> None:
    results = check_file(PROOF)
    assert {r.name for r in results} == {"ring_attention", "ring_attention_causal", "sharded_mha"}
    assert all(r.ok for r in results), [r.failure for r in results if not r.ok]
    ring = next(r.theorem for r in results if r.name == "ring_attention")
    assert ring is not None
    assert [(p.kind, p.axis, p.level) for p in ring.schedule.mesh] == [("group", "q", "mesh"), ("stream", "x", "mesh")]
    assert [p.level for p in ring.schedule.device().partitions] == ["smem", "smem"]


@pytest.mark.parametrize("case", ["ring_attention/1024", "ring_attention/1000", "ring_attention_causal/1024",
                                  "ring_attention_causal/1000", "ring_attention/q5x3", "sharded_mha/jax",
                                  "sharded_mha/pallas", "sized/jax", "sized/pallas", "sharded_causal/jax",
                                  "ring_document/jax", "cli/1024", "cli/1000"])
def test_mesh_lowering_matches_the_evaluator_sharded_over_8_devices(probe: dict[str, Any], case: str) -> None:
    """``sized``: the sharded axis's size as a scalar (``rsqrt(q)``, ``q``) is the global |q| on
    each device, on both targets (the Pallas kernel once read its block's extent).  ``sharded_causal``:
    a device runs its whole shard of queries (13 of 100) at once, so its causal chunk ranges span the
    shard (they once spanned one gq = 8 tile of it: the last rows of each shard lost keys, 0.06 off).
    ``ring_document``: a document-masked ring whose device blocks are shorter than a chunk (the eager
    shard_map once segfaulted on the block mask's concatenation with an empty array)."""
    assert probe["devices"] == 8
    row = probe[case]
    assert row["max_err"] < 2e-5, row
    assert row["devices"] == 8


@pytest.mark.parametrize("case", ["ring_attention/jax", "ring_attention_causal/jax", "sharded_mha/jax",
                                  "sharded_mha/pallas"])
def test_mesh_kernels_match_the_evaluator_on_extreme_inputs(probe: dict[str, Any], case: str) -> None:
    """Issue 28: the mesh kernels on 8 devices on extreme inputs (scores scaled to |S| ≈ 10⁴ at ragged
    sizes, ``lower_cases.extreme_inputs``) within the README's extreme bound, 2e-5 + 2⁻²²·|S| (the ring
    on Pallas is refused: a pallas_call carries no state between devices)."""
    row = probe[f"extreme/{case}"]
    assert row["largest"] > 1e4 and row["agrees"], row


@pytest.mark.parametrize("case", ["ring_attention", "ring_attention_causal", "sharded_mha"])
def test_jax_grad_through_the_mesh_function_is_the_vjp(probe: dict[str, Any], case: str) -> None:
    """Training through a ring: jax.grad of the sharded function (shard_map, ppermute ring,
    streamed fori_loop) equals the float64 VJP of the diagram (q = x = 1000; 12 heads of 100)."""
    assert probe[f"grad/{case}"]["max_rel_err"] < 1e-4, probe[f"grad/{case}"]


def test_each_device_holds_only_its_share(probe: dict[str, Any]) -> None:
    one, eight = probe["memory/1"], probe["memory/8"]
    block = 1024 // 8 * 64 * F32  # one device's rows of Q, K or V
    assert eight["argument"] == 3 * block and eight["output"] == block
    assert one["argument"] == 3 * 1024 * 64 * F32  # the same function on one device holds everything
    whole_kv = 2 * 1024 * 64 * F32
    assert eight["argument"] + eight["output"] + eight["temp"] < whole_kv  # not even K and V whole
    assert eight["temp"] < one["temp"]


def test_without_mesh_one_device_runs_the_device_schedule() -> None:
    thm = theorem(PROOF, "ring_attention_causal")
    low = lower(thm, target="jax", tiles={"gq": 16, "sx": 16})
    assert "Mesh: not realised" in low.source and "shard_map" not in low.source
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((37, 64)) for _ in range(3)]
    assert np.max(np.abs(np.asarray(low.fn(*arrays)) - evaluate(thm.source, arrays))) < 2e-5


def test_each_device_block_is_whole_tiles_where_the_theorem_assumes_it() -> None:
    """A mesh tile is realised as ⌈|a|/N⌉, but the ring theorem assumes the device's tiles divide it
    (`gq | mq`, `sx | mx`: R9, ``Theorem.constraints``): each block is rounded up to whole tiles, so the
    assumption holds on the realised blocks (at q = 37, x = 45 on one device: blocks of 48, not 37 and 45),
    and the kernel still matches the evaluator.  Heads grouped by 1 on each device (`sharded_mha`) record
    no `1 | gh`, and their blocks stay ⌈|h|/N⌉."""
    thm = theorem(PROOF, "ring_attention")
    assert {"gq | mq", "sx | mx"} <= {str(c) for c in thm.constraints}
    low = lower(thm, target="jax", mesh=1, tiles={"gq": 16, "sx": 16})
    assert "shard_q = round_up(round_up(n['q'], 1) // 1, 16)" in low.source
    assert "x in blocks of ⌈x/1⌉ rounded up to whole tiles of 16" in low.source
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape) for shape in ((37, 64), (45, 64), (45, 64))]
    got = np.asarray(low.fn(*[a.astype(np.float32) for a in arrays]))
    assert got.shape == (37, 64) and np.max(np.abs(got - evaluate(thm.source, arrays))) < 2e-5
    heads = lower(theorem(PROOF, "sharded_mha"), target="jax", mesh=1, tiles={"gq": 16, "sx": 16})
    assert "shard_h = round_up(n['h'], 1) // 1\n" in heads.source and "rounded up" not in heads.source


def _theorem(tmp_path: Path, diagram: str, steps: str) -> Any:
    path = tmp_path / "t.ncd"
    path.write_text(f'use "{ATTENTION}"\ntheorem t: {diagram} {{\n  rewrite softmax_contract at P, O\n{steps}\n}}\n',
                    encoding="utf-8")
    return theorem(path, "t")


@pytest.mark.parametrize(("diagram", "steps", "target", "expect"), [
    ("attention", "group q by mq at mesh\nstream x by mx at mesh via online_softmax\nstream x by sx", "pallas",
     "a Pallas kernel keeps its accumulator state inside one pallas_call"),
    ("attention", "stream x by mx at mesh via online_softmax\nstream x by sx", "jax",
     "needs an axis sharded at mesh as well"),
    ("attention", "group q by mq at mesh\nstream x by mx at mesh via online_softmax", "jax",
     "add `stream x by TILE via ACC` after the mesh partitions"),
    ("mha", "group b by mb at mesh\ngroup h by mh at mesh", "jax", "groups b, h at mesh"),
    ("mha", "group h by mh at mesh\nstream x by mx at mesh via online_softmax\nstream x by sx", "jax",
     "carries both the sharded axis `h` and the ring axis `x`"),
    ("attention", "group q by gq", "jax", "has no partition at mesh"),
    ("causal_attention", "group q by mq at mesh\ngroup q by gq", "pallas", "does not know its shard's offset"),
])
def test_mesh_lowering_refuses_what_it_cannot_run(tmp_path: Path, diagram: str, steps: str, target: str,
                                                  expect: str) -> None:
    thm = _theorem(tmp_path, diagram, steps)
    with pytest.raises(NapkinError) as info:
        lower(thm, target=target, mesh=8, tiles={"gq": 16, "sx": 16})
    assert expect in str(info.value)


def test_mesh_of_no_devices_and_given_mesh_tiles_are_refused() -> None:
    with pytest.raises(NapkinError, match="a mesh has 1 to 65536 devices"):
        lower(theorem(PROOF, "ring_attention"), target="jax", mesh=0)
    with pytest.raises(NapkinError, match="tile `mq` is a mesh tile"):
        lower(theorem(PROOF, "ring_attention"), target="jax", mesh=8, tiles={"mq": 128})


def _cost(*extra: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert cli.main(["cost", str(PROOF), "ring_attention", "--json", *extra]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def test_cost_has_a_mesh_level(capsys: pytest.CaptureFixture[str]) -> None:
    q = x = 131072
    data = _cost("--size", f"q={q}", "--size", f"x={x}", capsys=capsys)
    levels = {lv["name"]: lv for lv in data["levels"]}
    assert [lv["name"] for lv in data["levels"]][:3] == ["mesh", "hbm", "smem"]
    assert levels["mesh"]["parent"] is None and levels["hbm"]["parent"] == "mesh"
    mesh = data["mesh"]
    assert mesh["devices"] == load_hardware("h100").devices == 8
    block = x // 8 * 64  # one device's block of K (or V), in values
    assert int(mesh["receives_per_device"]) == int(mesh["sends_per_device"]) == 7 * 2 * block
    assert int(mesh["sends_bytes_per_device"]) == 2 * 7 * 2 * block  # bf16
    assert int(mesh["memory_per_device"]) == 2 * (q // 8 * 64) + 2 * 2 * block  # Q, O; K, V held and arriving
    assert int(levels["hbm"]["transfers"]) == 8 * 7 * 2 * block
    times = mesh["time_s"]
    assert times["interconnect"] == pytest.approx(2 * 7 * 2 * block / 450e9)
    assert times["overlapped"] == max(times["compute"], times["hbm"], times["interconnect"])
    assert times["serial"] == pytest.approx(times["compute"] + times["hbm"] + times["interconnect"])


def test_cost_mesh_devices_option_and_symbolic_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    data = _cost("--mesh", "4", capsys=capsys)
    assert data["mesh"]["devices"] == 4
    # whole tiles of gq and sx (the theorem assumes `gq | mq`, `sx | mx`), as the lowering realises them
    assert data["mesh"]["blocks"] == {"mq": "gq*ceiling(ceiling(q/4)/gq)", "mx": "sx*ceiling(ceiling(x/4)/sx)"}
    assert data["mesh"]["sends_per_device"] == "384*sx*ceiling(ceiling(x/4)/sx)"  # 3 blocks of K and of V, d = 64


def test_cost_prices_the_device_blocks_the_lowering_realises() -> None:
    """One definition of a device's block (``schedule.mesh``) for cost and lowering: at q = 37, x = 45
    on 4 devices with gq = sx = 16, the lowering's blocks are ⌈37/4⌉ = 10 and ⌈45/4⌉ = 12 rounded up to
    16 (the theorem assumes `gq | mq`, `sx | mx`), and the cost prices those, not 10 and 12, its FLOPs
    and hbm traffic those of a block of 16 queries, not 37/4; at sizes
    the devices divide into whole tiles (q = x = 256: 64) and where no tile is assumed to divide the
    mesh tile (`sharded_mha`'s heads, grouped by 1 on each device) the blocks are ⌈|a|/N⌉."""
    thm = theorem(PROOF, "ring_attention")
    tiles = {"gq": 16, "sx": 16}
    low = lower(thm, target="jax", mesh=4, tiles=tiles)
    extents = dict(re.findall(r"shard_(\w+) = (.+)", low.source))
    for q, x, want in ((37, 45, 16), (256, 256, 64)):
        realised = {a: eval(extents[a], {"round_up": round_up, "n": {"q": q, "x": x}}) for a in ("q", "x")}
        assert realised == {"q": want, "x": want}
        c = cost(thm, sizes={"q": q, "x": x})
        m = mesh_cost(c, 4)
        assert m is not None
        assert {k: c.at(v, tiles) for k, v in m.blocks.items()} == {"mq": want, "mx": want}
        assert c.at(m.sends, tiles) == 3 * 2 * want * 64  # 3 blocks of K and of V, d = 64
        # a device's FLOPs and hbm traffic: the diagram's at q = its block (all of x passes through it)
        one = cost(thm, sizes={"q": want, "x": x})
        assert c.at(m.flops, tiles) == one.at(one.flops, tiles)
        assert c.at(m.hbm_bytes, tiles) == one.at(one.first.transfers_bytes, tiles)
    heads = mesh_cost(cost(theorem(PROOF, "sharded_mha")), 4)
    assert heads is not None and {k: str(v) for k, v in heads.blocks.items()} == {"gh": "ceiling(h/4)"}


def test_device_block_is_the_lowerings_run_time_rounding() -> None:
    """The lowering computes each block at run time as ``round_up(round_up(|a|, N) // N, t)``: the
    same number as ``device_block``, empty axes included, and the symbolic form agrees at numbers."""
    q, t = sympy.Symbol("q", positive=True), sympy.Symbol("t", positive=True)
    for size in range(0, 70):
        for devices in (1, 3, 4, 8):
            for tile in (1, 5, 16):
                want = round_up(round_up(size, devices) // devices, tile)
                assert device_block(size, devices, tile) == want
                if size:
                    assert device_block(q, devices, t).subs({q: size, t: tile}) == want


def test_profiles_cite_their_interconnect() -> None:
    for key in ("h100", "h200", "a100"):
        profile = load_hardware(key)
        assert profile.devices == 8
        link = profile.level("mesh").bandwidth
        assert link is not None and link < profile.level("hbm").bandwidth  # type: ignore[operator]


def test_readme_mesh_section_is_current(probe: dict[str, Any], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the README's commands run from the repository root
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## Past one device", 1)[1].split("\n## ", 1)[0]
    (command,) = re.findall(r"\.venv/bin/napkin (lower [^\n]+)", section)
    out = tmp_path / "ring.py"
    assert cli.main([*command.split()[:-2], "-o", str(out)]) == 0
    assert "def ring_attention(Q, K, V):" in out.read_text(encoding="utf-8")
    shown = re.search(r"# \((\d+), (\d+)\) (\d+)", section)  # what the README says the function gives
    assert shown is not None
    rows, cols, devices = map(int, shown.groups())
    assert probe["cli/1000"]["shape"] == [rows, cols] and probe["cli/1000"]["devices"] == devices
