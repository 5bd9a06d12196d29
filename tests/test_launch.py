"""How a Pallas kernel is launched (``cost.launch``): warps from the registers its computed
tiles need, pipeline stages from the shared memory its loaded blocks need, one rule for the
tile search, ``napkin cost`` and the generated code (which applies it to its actual blocks)."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
import sympy

from napkin_cat.cost import cost
from napkin_cat.cost import hardware as hw
from napkin_cat.cost.launch import launch, occupancy
from napkin_cat.cost.optimise import search
from napkin_cat.cost.roofline import estimate, timing
from napkin_cat.lower import lower, realised_schedule
from napkin_cat.proof import theorem
from tests.test_crosslower import cuda_hlo

ROOT = Path(__file__).resolve().parent.parent
RULE = hw.load("h200").launch
SMEM = hw.load("h200").level("smem").capacity


def test_the_fewest_warps_whose_budget_holds_the_values_and_the_most_stages_that_fit() -> None:
    per_warp = RULE["register_budget"] * RULE["registers_per_thread"] * 32
    assert launch(4 * per_warp, 1000, 128, **RULE, smem=SMEM) == (4, 3, True)
    assert launch(4 * per_warp + 1, 1000, 128, **RULE, smem=SMEM) == (8, 3, True)
    assert launch(100, SMEM / 2.5, 128, **RULE, smem=SMEM) == (4, 2, True)
    assert launch(8 * per_warp + 1, 1000, 128, **RULE, smem=SMEM) == (8, 3, False)  # no warps hold it
    assert launch(100, SMEM + 1, 128, **RULE, smem=SMEM) == (4, 1, False)  # one copy does not fit
    assert occupancy(per_warp, SMEM / 2, 4, RULE["registers_per_thread"], RULE["register_budget"],
                     262144, SMEM) == 2  # 255 registers x 128 threads: two programs' worth of the file


def test_warps_beyond_the_rows_do_not_count() -> None:
    """8 warps on 64 rows would each take 8 of them, half an MMA fragment: Triton computes the
    rows twice and holds no more values, so 8 warps are not a way to fit 64 rows' values
    (gpu_static: a 64x256 attention tile at 8 warps ran 16.0 SASS per score, at 4 warps 8.3)."""
    per_warp = RULE["register_budget"] * RULE["registers_per_thread"] * 32
    assert RULE["rows_per_warp"] == 16
    assert launch(4 * per_warp + 1, 1000, 127, **RULE, smem=SMEM) == (4, 3, False)
    assert launch(4 * per_warp + 1, 1000, 128, **RULE, smem=SMEM) == (8, 3, True)
    assert launch(100, 1000, 16, **RULE, smem=SMEM) == (4, 3, True)  # the fewest warps always may


@pytest.fixture(scope="module")
def attention() -> object:
    thm = theorem(ROOT / "benchmarks" / "gpu_attention.ncd", "flash_mha")
    sizes = {"b": 1, "h": 16, "q": 8192, "x": 8192, "d": 64}
    return thm, cost(thm, realised_schedule(thm.result, thm.schedule, "pallas"), hardware="h200", sizes=sizes)


def test_attention_keeps_scores_and_states_in_registers_and_blocks_in_shared_memory(attention: object) -> None:
    _, c = attention  # type: ignore[misc]
    values, fixed, staged, rows = (str(e) for e in c.on_chip)
    assert values == "bk*bq + 66*bq"  # the score tile, O's 64 columns, its max and sum per row
    assert (fixed, staged) == ("128*bq", "256*bk")  # Q's block once; K's and V's chunks per stage (bf16)
    assert rows == "bq"  # one query per row of every computed tile (b and h: one per program)


def test_the_tile_search_respects_the_register_budget(attention: object) -> None:
    _, c = attention  # type: ignore[misc]
    rows = search(c, top=50, relax=True).rows
    assert rows and all(r.launch is not None and r.launch.fits for r in rows)
    budget = RULE["register_budget"] * RULE["registers_per_thread"] * 32
    assert all(r.launch.registers <= budget * r.launch.num_warps for r in rows)  # type: ignore[union-attr]
    assert all(r.tiles["bq"] >= RULE["rows_per_warp"] * r.launch.num_warps for r in rows)  # type: ignore[union-attr]
    plan = c.launched({"bq": 64, "bk": 128})
    assert (plan.num_warps, plan.fits) == (4, True)  # 97 values a thread: within 4 warps' budget
    plan = c.launched({"bq": 64, "bk": 256})  # 161 values a thread: past 4 warps' budget (140) ...
    assert (plan.num_warps, plan.fits) == (4, False)  # ... and 8 warps would repeat the 64 rows
    assert c.launched({"bq": 512, "bk": 64}).fits is False  # 66,560 values: past even 16 warps' budget


@pytest.mark.parametrize(("tiles", "warps"), [({"bq": 64, "bk": 64}, 4), ({"bq": 128, "bk": 128}, 8)])
def test_the_kernel_is_launched_as_the_rule_says(attention: object, tiles: dict[str, int], warps: int) -> None:
    thm, c = attention  # type: ignore[misc]
    plan = c.launched(tiles)
    assert plan.num_warps == warps
    fn = lower(thm, target="pallas", tiles=tiles, dtype="bf16", hardware="h200").fn
    spec = jax.ShapeDtypeStruct((1, 16, 8192, 64), jnp.bfloat16)
    hlo = cuda_hlo(fn, spec, spec, spec)
    assert re.search(rf"num_warps = {plan.num_warps} : i32", hlo)
    assert re.search(rf"num_stages = {plan.num_stages} : i32", hlo)


def test_the_static_benchmark_finds_the_main_loop() -> None:
    """benchmarks/gpu_static.py's SASS reading (the compiling half needs the triton package)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_static import sass_loop

    sass = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   MUFU.EX2 R2, R3 ;
        /*0020*/                   FFMA R4, R5, R6, R7 ;
        /*0030*/                   MUFU.EX2 R2, R4 ;
        /*0040*/                   STL [R1], R2 ;
        /*0050*/               @P0 BRA 0x10 ;
        /*0060*/                   FSETP.GE.AND P1, PT, R2, R3, PT ;
        /*0070*/                   FSEL R2, R2, -INF, P1 ;
        /*0080*/               @P0 BRA 0x60 ;
        /*0090*/                   BRA 0x90 ;
    """
    loop = sass_loop(sass)
    assert (loop["loop"], loop["mufu_ex2"], loop["local"]) == (5, 2, 1)
    assert loop["second"] is not None and (loop["second"]["loop"], loop["second"]["mask"]) == (3, 2)


def test_the_static_benchmark_lists_the_blocks_a_loop_loads() -> None:
    """benchmarks/gpu_static.py's ``loop_loads``: the ``tt.load`` blocks inside an ``scf.for``
    (what a program loads per chunk), not those before or after it (loaded once)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_static import loop_loads

    ttir = """
    tt.func public @k(%arg0: !tt.ptr<bf16>) {
      %0 = tt.load %a : tensor<64x64x!tt.ptr<bf16>>
      %1 = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %z) -> (tensor<64x64xf32>) : i32 {
        %2 = tt.load %b : tensor<64x64x!tt.ptr<bf16>>
        %3 = scf.if %p -> (tensor<64xf32>) {
          %4 = tt.load %c : tensor<64x!tt.ptr<f32>>
          scf.yield %4 : tensor<64xf32>
        }
        scf.yield %acc : tensor<64x64xf32>
      }
      %5 = tt.load %d : tensor<64x!tt.ptr<bf16>>
      tt.return
    }
    """
    assert loop_loads(ttir) == ["64x64 bf16", "64 f32"]


# ---- the time model (napkin_cat/cost/roofline.py) ------------------------------------------------


def test_the_online_softmax_pays_one_correction_of_its_output_per_chunk(attention: object) -> None:
    """Folding a chunk into the state costs d per row for rescaling O (the add of P·V is the
    MMA's own accumulate) plus a few per-row operations: its update less its lift."""
    _, c = attention  # type: ignore[misc]
    bk = c.tiles["bk"]
    per_row = sympy.simplify(c.fold_flops * bk / (16 * 8192 * 8192))  # per row and chunk
    assert per_row.free_symbols == set() and 64 < per_row < 64 + 16
    assert sympy.simplify(2 * c.fold_flops.subs(bk, 2 * bk) - c.fold_flops) == 0  # once per chunk
    # a matmul streamed over its contracted axis folds for free: the tensor cores accumulate
    mm = theorem(ROOT / "proofs" / "matmul.ncd", "tiled_matmul")
    assert cost(mm, hardware="h200", sizes={"a": 256, "b": 256, "c": 256}).fold_flops == 0


def test_re_reads_come_from_the_l2_while_the_in_flight_programs_fit_it(attention: object) -> None:
    """The query blocks of a head run next to each other (the grid's fastest axis) and read its
    K and V together: at 16 heads of d = 64 and 8k keys (2 MiB a head) the few heads in flight
    fit the H200's 50 MB L2, so hbm serves each byte once and the re-reads are L2 hits; at
    d = 128 and 128k keys one head's K and V (64 MiB) do not fit, and every re-read is hbm's."""
    thm, c = attention  # type: ignore[misc]
    hbm, l2 = (c.hardware.level(n) for n in ("hbm", "l2"))
    tiles = {"bq": 128, "bk": 128}
    t = dict(timing(c, tiles).transfer_times)
    once = 4 * 16 * 8192 * 64 * 2  # Q, K, V read and O written once, bf16
    assert t["smem"] == pytest.approx(once / hbm.bandwidth)
    assert t["l2"] == pytest.approx(float(c.at(c.first.transfers_bytes, tiles)) / l2.bandwidth)
    assert dict(c.loaded_from_hbm) == {"Q": True, "K": True, "V": True}
    big = cost(thm, realised_schedule(thm.result, thm.schedule, "pallas"), hardware="h200",
               sizes={"b": 1, "h": 4, "q": 131072, "x": 131072, "d": 128})
    assert dict(timing(big, tiles).transfer_times)["smem"] == pytest.approx(
        float(big.at(big.first.transfers_bytes, tiles)) / hbm.bandwidth)


def test_pipelined_attention_is_ranked_by_its_roofline_and_takes_the_tiles_fa2_takes(attention: object) -> None:
    """Compute-bound once the L2 serves K and V: 256x64 and 128x128 tie on tensor-core time, and
    256-row tiles halve only the L2 traffic, which is not the bound, while their 64-key chunks
    double the online softmax's corrections.  The search takes 128x128 at 8 warps (FlashAttention-2's
    and JAX mha's tiles; benchmarks/gpu_static.py)."""
    _, c = attention  # type: ignore[misc]
    rows = search(c, top=8, relax=True).rows
    best = rows[0]
    assert best.tiles == {"bq": 128, "bk": 128} and best.launch is not None and best.launch.overlaps
    t = timing(c, best.tiles)
    assert t.overlapped == t.flop_time < t.serial
    assert best.seconds == pytest.approx(t.overlapped * best.factor)
    wide = next(r for r in rows if r.tiles == {"bq": 256, "bk": 64})
    assert dict(timing(c, wide.tiles).transfer_times)["l2"] < dict(t.transfer_times)["l2"]
    assert timing(c, wide.tiles).flop_time > t.flop_time


def test_only_a_launch_that_overlaps_is_ranked_by_its_roofline(attention: object) -> None:
    _, c = attention  # type: ignore[misc]
    tiles = {"bq": 128, "bk": 128}
    work = [float(c.at(e, tiles)) for e in c.work]
    plan = c.launched(tiles)
    assert plan.num_stages == 3 and plan.overlaps
    piped = estimate(c, work, plan)
    assert piped.ranked == piped.overlapped < piped.serial
    # one stage and one program per SM: loads wait for compute and compute for loads
    alone = dataclasses.replace(plan, num_stages=1, occupancy=1, overlaps=False)
    assert estimate(c, work, alone).ranked == estimate(c, work, None).ranked == piped.serial


def test_a_configurations_transfer_time_counts_the_way_through_the_l2_once(attention: object) -> None:
    _, c = attention  # type: ignore[misc]
    best = search(c, top=1, relax=True).rows[0]
    t = timing(c, best.tiles)
    moved = dict(t.transfer_times)
    assert best.transfer_time == pytest.approx(t.serial - t.flop_time) == pytest.approx(max(moved["smem"], moved["l2"]))
