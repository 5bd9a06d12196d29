"""The benchmark scripts keep working: each runs end to end at tiny sizes.

They are measurement tools, so nothing here asserts a speed; it asserts that every case
ran (no error rows), that results are written where asked, and that the GPU script's dry
run (the same code as on the H200, in interpret mode) checks its kernels' correctness.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # each runs a benchmark script end to end (CI runs them)

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _run(args: list[str], tmp_path: Path, timeout: int = 300) -> str:
    env = dict(os.environ, NAPKIN_BENCH_RESULTS=str(tmp_path))
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.parametrize(("script", "size"), [("attention_cpu.py", "256"), ("matmul_cpu.py", "128"),
                                              ("cross_entropy_cpu.py", "512")])
def test_cpu_benchmark_runs_every_case(script: str, size: str, tmp_path: Path) -> None:
    out = _run([str(BENCH / script), "--sizes", size, "--repeats", "1"], tmp_path)
    result = json.loads((tmp_path / script.replace(".py", ".json")).read_text())
    assert result["machine"]["cores"] and result["rows"]
    assert all("error" not in row and row["median_s"] > 0 and row["peak_rss_mib"] > 0 for row in result["rows"])
    assert {row["case"] for row in result["rows"]} >= {"napkin"}
    if script == "attention_cpu.py":
        assert out.strip().splitlines()[-1].startswith("speedup_vs_dpa=")
        assert {row["case"] for row in result["rows"]} == {"napkin", "napkin_default", "naive", "dpa", "hand",
                                                           "napkin_causal", "hand_causal"}
        assert "causal_speedup_vs_hand=" in out.strip().splitlines()[-1]


def test_interleaved_attention_times_the_peers_in_one_process(tmp_path: Path) -> None:
    out = _run([str(BENCH / "attention_cpu.py"), "--interleaved", "--n", "256", "--rounds", "2"], tmp_path)
    lines = out.strip().splitlines()
    assert [line.split()[0] for line in lines[-9:-4]] == ["napkin", "napkin_default", "hand", "napkin_causal",
                                                          "hand_causal"]
    assert [line.split(":")[0] for line in lines[-4:-1]] == ["hand/napkin", "hand/napkin_default",
                                                             "hand_causal/napkin_causal"]
    assert all(re.search(r"median \d+\.\d{3} per round, quartiles .* [0-2] of 2 rounds at >= 1", line)
               for line in lines[-4:-1])
    assert re.fullmatch(r"speedup_vs_hand=\d+\.\d\d causal_speedup_vs_hand=\d+\.\d\d", lines[-1])


def test_decode_benchmark_times_the_split_beside_its_peers_in_one_run(tmp_path: Path) -> None:
    """`--decode`: the split plans (the CPU's and the h200's, ragged blocks of ⌈x/132⌉), the unsplit
    kernel and dot_product_attention at one query over a ragged cache (the split padded), checked
    equal, then timed round by round."""
    out = _run([str(BENCH / "attention_cpu.py"), "--decode", "--x", "1000", "--rounds", "2"], tmp_path)
    lines = out.strip().splitlines()
    assert [line.split()[0] for line in lines[-8:-4]] == ["napkin_split", "napkin_split_h200", "napkin_unsplit",
                                                          "dpa"]
    assert [line.split(":")[0] for line in lines[-4:-1]] == ["dpa/napkin_split", "napkin_unsplit/napkin_split",
                                                             "napkin_split_h200/napkin_split"]
    assert re.fullmatch(r"decode_speedup_vs_dpa=\d+\.\d\d decode_speedup_vs_unsplit=\d+\.\d\d "
                        r"decode_speedup_vs_h200_plan=\d+\.\d\d", lines[-1])


def test_backward_benchmark_runs_every_case(tmp_path: Path) -> None:
    out = _run([str(BENCH / "attention_cpu.py"), "--backward", "--sizes", "512", "--repeats", "1"], tmp_path)
    rows = json.loads((tmp_path / "attention_cpu_backward.json").read_text())["rows"]
    assert {row["case"] for row in rows} == {"napkin_grad", "dpa_grad", "hand_grad", "napkin_causal_grad",
                                             "dpa_causal_grad"}
    assert all("error" not in row and row["median_s"] > 0 for row in rows)
    assert re.fullmatch(r"grad_speedup_vs_dpa=\S+ grad_memory_ratio_vs_dpa=\S+ grad_speedup_vs_hand=\S+ "
                        r"causal_grad_speedup_vs_dpa=\d+\.\d\d", out.strip().splitlines()[-1])


def test_cpu_profile_script_measures_fits_and_ranks_the_choice(tmp_path: Path) -> None:
    out = _run([str(BENCH / "cpu_profile.py"), "--n", "512", "--rounds", "1"], tmp_path)
    result = json.loads((tmp_path / "cpu_profile.json").read_text())
    assert result["rates"]["dot_f32_flops"] > 0 and result["rates"]["read_bytes_per_s"] > 0
    shapes = {(row["gq"], row["sx"]) for row in result["rows"] if row["median_s"] > 0}
    assert {(256, 32), (512, 512)} <= shapes and len(shapes) == len(result["rows"]) >= 10  # the grid up to n = 512
    assert set(result["fit"]) == {"f32_flops", "elementwise_flops", "loop_overhead_s", "rms_residual_s"}
    pick = f"{result['pick']['gq']}x{result['pick']['sx']}"
    assert out.strip().splitlines()[-1].startswith(f"model_pick={pick} ")
    assert out.strip().splitlines()[-1].endswith(f"/{len(shapes)}")


def test_checker_benchmark_runs(tmp_path: Path) -> None:
    _run([str(BENCH / "checker_bench.py"), "--layers", "2", "--repeats", "1"], tmp_path)
    rows = json.loads((tmp_path / "checker_bench.json").read_text())["rows"]
    assert rows and all(row["ok"] for row in rows)


def test_gpu_script_dry_run_checks_its_kernels(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    _run([str(BENCH / "gpu.py"), "--dry-run", "--out", str(out)], tmp_path, timeout=600)
    result = json.loads(out.read_text())
    assert result["dry_run"]
    ours = [r for r in result["rows"] if r["impl"] == "napkin"]
    forward = [r for r in ours if "grad" not in r["kernel"]]
    assert len(forward) == 5  # attention d=64/128 x causal/not, and matmul
    assert all(r["max_err"] < 5e-2 and r["pred_hbm_mb"] >= r["min_hbm_mb"] for r in forward)
    # training: the joined forward and backward kernels' gradient, d = 64, causal and not
    assert sorted(r["kernel"] for r in ours if "grad" in r["kernel"]) == ["attention grad d=64",
                                                                         "attention grad d=64 causal"]
    assert all(r["max_err"] < 5e-2 and r["temp_mb"] > 0 for r in ours if "grad" in r["kernel"])
    hoisted = [r for r in result["rows"] if r["impl"] == "napkin (D hoisted)"]  # the key pass as a chain
    assert len(hoisted) == 2 and all(r["max_err"] < 5e-2 and r["temp_mb"] > 0 for r in hoisted)
    assert all("error" not in r for r in result["rows"])


@pytest.mark.skipif(importlib.util.find_spec("jax_cuda13_plugin") is None or importlib.util.find_spec("absl") is None,
                    reason="benchmarks/mosaic_static.py cross-lowers through Mosaic GPU's MLIR bindings "
                    "(jax-cuda13-plugin==0.11.2) and imports attention_mgpu, which needs absl-py; .ci/setup installs "
                    "both (pinned in .ci/constraints.txt)")
def test_mosaic_static_compares_every_case_at_the_module_level(tmp_path: Path) -> None:
    """napkin's Mosaic GPU flash attention and attention_mgpu, d = 64 and 128, causal and not:
    every case cross-lowers and is counted (no error row), napkin's on one warpgroup with wgmma."""
    _run([str(BENCH / "mosaic_static.py")], tmp_path, timeout=900)
    rows = json.loads((tmp_path / "mosaic_static.json").read_text())["rows"]
    assert len(rows) == 8 and not [r for r in rows if "error" in r], rows
    for row in rows:
        assert row["wgmma"] > 0 and row["tma_load"] > 0 and 0 < row["smem_bytes"] <= 232448, row
        if row["kernel"] == "napkin mosaic":
            assert row["warpgroups"] == 1, row


def test_exp2_fold_measures_what_folding_log2e_into_the_scale_costs(tmp_path: Path) -> None:
    """BENCHMARKS.md's reason the Pallas kernels keep exp2((S - m)·log2 e): with scores exact in
    f32 (an exact 1/sqrt(64) scale, or none) folding log2 e into the scale rounds every score,
    far worse than the difference first at large |S|, and it overflows scores near the f32 top."""
    _run([str(BENCH / "exp2_fold.py")], tmp_path)
    result = json.loads((tmp_path / "exp2_fold.json").read_text())
    for row in result["rows"]:
        if row["case"] != "scaled by 1/sqrt(128)" and row["magnitude"] == 1e6:
            assert row["folded"] > 1e4 * row["difference first"], row
    assert result["range"]["difference first"] == [1.0, 0.0]
    assert all(math.isnan(w) for w in result["range"]["folded"])


def test_mesh_benchmark_runs_on_host_devices(tmp_path: Path) -> None:
    _run([str(BENCH / "mesh_cpu.py"), "--sizes", "64", "--devices", "1", "8", "--repeats", "1"], tmp_path)
    rows = json.loads((tmp_path / "mesh_cpu.json").read_text())["rows"]
    assert [row["devices"] for row in rows] == [1, 8]
    assert all(row["max_err"] < 2e-5 and row["output_devices"] == row["devices"] for row in rows)
    assert rows[1]["argument_bytes"] * 8 == rows[0]["argument_bytes"]  # each of 8 devices holds 1/8


def test_differential_run_counts_records_and_resumes(tmp_path: Path) -> None:
    """benchmarks/differential.py: a few cases of tests/differential.py, counted and written
    (the first run); the results file is written after every batch and ``--resume`` continues
    it: the same seed, the next batch, the counts and time added to (the second)."""
    args = [str(BENCH / "differential.py"), "--minutes", "4", "--batch", "2", "--seed", "5", "--out", "d"]
    out = _run([*args, "--cases", "1"], tmp_path)
    first = json.loads((tmp_path / "d.json").read_text())
    assert first["mismatches"] == [] and first["drawn"] >= first["accepted_schedules"] >= 1
    assert sum(first["outcomes"].values()) == 2 * first["accepted_schedules"]  # one outcome per target
    assert f"accepted schedules {first['accepted_schedules']}" in out
    assert first["finished"] and first["batches"] >= 1
    assert first["counts"]["accepted"] == first["accepted_schedules"]
    assert set(first["f32_rounding"]) == {"jax", "pallas"}  # float32 rounding: counted, each run described
    assert len(first["f32_rounding_cases"]) == sum(first["f32_rounding"].values())
    _run([*args, "--cases", str(first["accepted_schedules"] + 1), "--resume", "--seed", "9"], tmp_path)
    second = json.loads((tmp_path / "d.json").read_text())
    assert second["seed"] == 5 and second["batches"] > first["batches"]
    assert second["drawn"] > first["drawn"] and second["seconds"] > first["seconds"]
    assert second["accepted_schedules"] > first["accepted_schedules"]
    assert second["f32_rounding_cases"][:len(first["f32_rounding_cases"])] == first["f32_rounding_cases"]


@pytest.mark.parametrize("names", ["ab", "abcde"])
def test_round_robin_varies_the_order_and_never_repeats_a_call(names: str) -> None:
    """Each call runs once per round (after one warm-up each), never right after itself, and
    (with more than two) after more than one other call: no call inherits one peer's caches."""
    sys.path.insert(0, str(BENCH))
    from harness import round_robin

    seen: list[str] = []
    times = round_robin({k: (lambda k=k: seen.append(k)) for k in names}, 40)
    assert all(len(times[k]) == 40 for k in names) and len(seen) == 41 * len(names)
    assert all(a != b for a, b in itertools.pairwise(seen))
    if len(names) > 2:
        assert all(len({a for a, b in itertools.pairwise(seen) if b == k}) > 1 for k in names)


def test_document_benchmark_times_both_kernels_and_prints_the_modelled_ratios(tmp_path: Path) -> None:
    out = _run([str(BENCH / "document_cpu.py"), "--n", "256", "--repeats", "1"], tmp_path)
    lines = out.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["flash_document_attention", "flash_causal_document_attention"] * 2
    assert all(re.search(r"median \d+\.\d{4} s", line) for line in lines[:2])
    assert all(re.search(r": 0\.\d{4} of the dense causal kernel's bytes$", line) for line in lines[2:])
