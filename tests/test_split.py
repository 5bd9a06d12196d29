"""Split reductions (issue 29 item 1, README "Split reductions"): ``split AXIS by TILE [via ACC]
[pad]`` runs the stream of an axis in parallel programs, one per block, and merges their partial
states with the accumulator's combine.

The kernel's rule (its valid case and each refusal, with the rule's name and condition), the
schedule interpreter, the cost (states, re-reads, programs, the extra launch), both lowerings
against the evaluator at ragged sizes, and the lowering's refusals.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import sympy

from napkin_cat import certify, kernel
from napkin_cat.certify import rules
from napkin_cat.cost import CostError, cost, cost_of, optimise
from napkin_cat.cost.report import format_report, report
from napkin_cat.cost.roofline import timing
from napkin_cat.diagnostics import NapkinError
from napkin_cat.elaborate import loads
from napkin_cat.evaluate import evaluate
from napkin_cat.kernel import KernelError, Theorem
from napkin_cat.lower import lower
from napkin_cat.printer import print_step
from napkin_cat.proof import check_file, prove, theorem
from napkin_cat.schedule.run import run_schedule
from napkin_cat.terms import Partition, Rewrite

ROOT = Path(__file__).resolve().parent.parent
PROOF = ROOT / "proofs" / "flash_decoding.ncd"
ATTENTION = (ROOT / "examples" / "attention.ncd").read_text(encoding="utf-8")


def _decoding() -> Theorem:
    return theorem(PROOF, "flash_decoding")


def _rewritten() -> Theorem:
    """attention after softmax_contract: the normalised contraction a split may stream."""
    thm = kernel.unfold(kernel.refl("t", loads(ATTENTION).diagram("attention")))
    return kernel.rewrite(thm, rules.library()["softmax_contract"], Rewrite("softmax_contract", ("P", "O")),
                          {"softmax_contract": "tested: test"})


def _inputs(q: int, x: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for shape in [(q, 64), (x, 64), (x, 64)]]


def _reference(thm: Theorem, arrays: list[np.ndarray]) -> np.ndarray:
    out = evaluate(thm.source, arrays)  # one output: its array
    return np.asarray(out)


# ---- the kernel's rule ------------------------------------------------------------------------


def test_flash_decoding_checks_strictly_and_records_the_split() -> None:
    results = {r.name: r for r in check_file(PROOF, strict=True)}
    assert set(results) == {"flash_decoding", "flash_decoding_mha"} and all(r.ok for r in results.values())
    result = results["flash_decoding"]
    thm = result.theorem
    assert thm is not None and thm.schedule.split is not None
    assert [p.kind for p in thm.schedule.partitions] == ["split", "stream"]
    assert thm.schedule.split.level == "hbm" and thm.schedule.split.via == "online_softmax"
    assert "split" in thm.trust and not thm.tested  # the combine law is proved, nothing only tested
    assert any(t.startswith("accumulator online_softmax") and "proved" in t for t in thm.trust)
    assert [str(c) for c in thm.constraints] == ["sx | kx"]  # R9: the nested stream divides the block


def _refusal(step: Partition, before: tuple[Partition, ...] = (), thm: Theorem | None = None) -> KernelError:
    current = _rewritten() if thm is None else thm
    for p in before:
        current = (kernel.split if p.kind == "split" else kernel.stream if p.kind == "stream" else
                   lambda t, s, _o: kernel.group(t, s))(current, p, certify.accumulator)
    with pytest.raises(KernelError) as info:
        (kernel.split if step.kind == "split" else kernel.stream)(current, step, certify.accumulator)
    return info.value


def test_the_rule_refuses_each_invalid_split_with_its_name_and_condition() -> None:
    split = Partition("split", "x", "kx", "hbm", "online_softmax")
    plain = kernel.unfold(kernel.refl("t", loads(ATTENTION).diagram("attention")))
    cases = [
        # softmax before the lemma: a box that mixes the axis has no accumulator (R4)
        (_refusal(split, thm=plain), "split", "mixes axis `x` and has no accumulator"),
        # a wrong accumulator for the normalised contraction
        (_refusal(Partition("split", "x", "kx", "hbm", "max")), "split", "accumulator `max` cannot stream"),
        # an accumulator whose laws hold over the reals but that overflows (certify.float_safety)
        (_refusal(Partition("split", "x", "kx", "hbm", "normalised")), "split", "no certified accumulator"),
        # each program folds with another state than the combine step merges (R8)
        (_refusal(Partition("stream", "x", "sx", "smem", "normalised"), (split,)), "nest",
         "is streamed via `online_softmax` at an outer level"),
        # a nested tile that does not divide the block (R9)
        (_refusal(Partition("stream", "x", 64, "smem", "online_softmax"),
                  (Partition("split", "x", 1000, "hbm", "online_softmax"),)), "nest",
         "tile 64 does not divide the `hbm` tile 1000"),
        # a split inside the stream (or any partition below hbm) of the keys (R8: outer levels first)
        (_refusal(split, (Partition("stream", "x", "sx", "smem", "online_softmax"),)), "nest",
         "split at `hbm` comes after a partition at `smem`"),
        (_refusal(split, (Partition("group", "q", "gq"),)), "nest", "split at `hbm` comes after"),
        # a second split of the same axis
        (_refusal(split, (split,)), "nest", "axis `x` is already partitioned at `hbm`"),
        # a stream step handed to the split rule
        (_split_as_stream(), "split", "a stream partition of `x` is not a split step"),
    ]
    for error, rule, condition in cases:
        assert error.rule == rule, (error.rule, error.condition)
        assert condition in error.condition, error.condition


def _split_as_stream() -> KernelError:
    with pytest.raises(KernelError) as info:
        kernel.split(_rewritten(), Partition("stream", "x", "kx", "hbm", "online_softmax"), certify.accumulator)
    return info.value


def test_stream_refuses_a_split_step_and_a_ragged_split_needs_pad() -> None:
    with pytest.raises(KernelError, match=r"stream: a split partition of `x` is not a stream step"):
        kernel.stream(_rewritten(), Partition("split", "x", "kx", "hbm", "online_softmax"), certify.accumulator)
    text = """axis q, d
axis x = 100
diagram keys(S: [q x], V: [x d]) -> [q d] {
  return ncontract[x; exp, exp, id](S, V)
}
"""
    thm = kernel.refl("t", loads(text).diagram("keys"))
    with pytest.raises(KernelError, match=r"split: tile 64 does not divide axis `x` of size 100; declare `pad`"):
        kernel.split(thm, Partition("split", "x", 64, "hbm", "online_softmax"), certify.accumulator)
    padded = kernel.split(thm, Partition("split", "x", 64, "hbm", "online_softmax", pad=True), certify.accumulator)
    assert padded.schedule.split is not None and padded.schedule.split.pad


def test_split_round_trips_through_the_printer() -> None:
    module = loads(ATTENTION + "\ntheorem t: attention {\n  rewrite softmax_contract at P, O\n"
                   "  split x by kx via online_softmax pad\n  stream x by sx via online_softmax\n}\n")
    steps = module.theorems[0].steps
    assert print_step(steps[1]) == "split x by kx via online_softmax pad"
    again = loads(ATTENTION + "\ntheorem t: attention {\n" + "".join(f"  {print_step(s)}\n" for s in steps) + "}\n")
    assert again.theorems[0].steps == steps


# ---- the schedule interpreter ------------------------------------------------------------------


@pytest.mark.parametrize(("q", "x", "kx", "sx"), [(1, 100, 32, 16), (3, 77, 64, 8), (1, 5, 16, 4), (2, 48, 16, 16)])
def test_the_interpreter_runs_the_split_as_the_evaluator(q: int, x: int, kx: int, sx: int) -> None:
    thm = _decoding()
    arrays = _inputs(q, x)
    (got,) = run_schedule(thm, arrays, tiles={"kx": kx, "sx": sx})
    np.testing.assert_allclose(got, _reference(thm, arrays), rtol=1e-10, atol=1e-12)


# ---- cost ---------------------------------------------------------------------------------------


def test_cost_counts_the_partial_states_the_re_reads_the_programs_and_the_launch() -> None:
    thm = _decoding()
    c = cost(thm, sizes={"q": 1, "x": 32768}, hardware="h200")
    assert c.split is not None and c.split.axis == "x" and c.split.launches == 2
    at = {"kx": 256, "sx": 64}
    blocks = 32768 // 256
    assert c.at(c.split.blocks, at) == blocks and c.at(c.programs, at) == blocks  # q = 1: the split is the grid
    assert c.at(c.split.states, at) == blocks * (1 + 1 + 64)  # online softmax's (m, l, o) for one query
    assert c.at(c.split.states_bytes, at) == 4 * blocks * 66  # f32
    assert c.at(c.split.rereads, at) == (blocks - 1) * 64  # the query, loaded by every program
    fused = cost_of(thm.result, thm.schedule.unsplit(), sizes={"q": 1, "x": 32768}, hardware="h200",
                    accumulators={"ncontract:('x',):('exp', 'exp', 'id')": "online_softmax"})
    extra = c.at(c.first.transfers, at) - fused.at(fused.first.transfers, at)
    assert extra == 2 * blocks * 66 + (blocks - 1) * 64  # written and read back, plus the re-reads
    merges = c.at(c.split.flops, at)  # the combine: blocks - 1 merges, each rescaling and adding two (m, l, o)
    assert sympy.sympify(c.at(c.flops, at)) == fused.at(fused.flops, at) + merges
    assert 3 * 64 * (blocks - 1) <= merges <= 4 * 64 * (blocks - 1)  # o's two products and sum lead
    t = timing(c, at)
    assert t.overhead == pytest.approx(c.hardware.launch_overhead) and c.hardware.launch_overhead > 0
    text = format_report(report(c, thm.name))
    assert "split: x in ceiling(32768/kx) blocks of kx" in text and "partial states 66*ceiling(32768/kx)" in text


# ---- lowering ------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["jax", "pallas"])
@pytest.mark.parametrize(("q", "x", "kx", "sx"), [(1, 100, 32, 16), (3, 77, 64, 16), (1, 5, 32, 16)])
def test_the_lowered_split_matches_the_evaluator_at_ragged_sizes(target: str, q: int, x: int, kx: int,
                                                                 sx: int) -> None:
    thm = _decoding()
    arrays = _inputs(q, x, seed=x)
    lowered = lower(thm, target=target, tiles={"kx": kx, "sx": sx})
    args = [a.astype(np.float32) for a in arrays]
    got = np.asarray(lowered.fn(*args, interpret=True) if target == "pallas" else lowered.fn(*args))
    want = _reference(thm, arrays)
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-5
    source = lowered.source
    if target == "jax":
        assert "jax.vmap(split_fold)" in source and "split_merge" in source
    else:  # the blocks are the grid's last axis, one row of states each
        assert f"round_up(n['x'], {kx}) // {kx})" in source and "i_split" in source and "split_merge" in source


def _lower_text(steps: str, target: str = "jax", **options: object) -> NapkinError:
    thm = prove(loads(ATTENTION + f"\ntheorem t: attention {{\n  rewrite softmax_contract at P, O\n{steps}\n}}\n"),
                "t")
    with pytest.raises(NapkinError) as info:
        lower(thm, target=target, tiles={"kx": 64, "sx": 16, "gq": 16}, **options)  # type: ignore[arg-type]
    return info.value


def test_the_lowering_refuses_what_it_cannot_run() -> None:
    alone = _lower_text("  split x by kx via online_softmax pad")
    assert "needs each program to stream its block" in str(alone)
    both = "  split x by kx via online_softmax pad\n  stream x by sx via online_softmax"
    assert "a split of `x` runs on one device" in str(_lower_text(both, mesh=2))


def test_two_splits_check_but_cost_and_lowering_take_one() -> None:
    """Two splits are sound (two outer folds, the interpreter runs them), but the cost model and
    the lowering realise one combine step per kernel and say so."""
    text = """axis r, c
diagram both(A: [r c]) -> [] {
  return sum[r c](A)
}
theorem t: both {
  split r by 4 via sum pad
  split c by 4 via sum pad
}
"""
    thm = prove(loads(text), "t")
    arrays = [np.random.default_rng(1).standard_normal((9, 6))]
    (got,) = run_schedule(thm, arrays)
    np.testing.assert_allclose(got, np.sum(arrays[0]), rtol=1e-12)
    with pytest.raises(CostError, match=r"one split per kernel; this schedule splits r, c"):
        cost(thm)
    with pytest.raises(NapkinError, match=r"one split per kernel; this schedule splits r, c"):
        lower(thm, target="jax")


# ---- ragged blocks: a padded stream inside the split ------------------------------------------


RAGGED = ATTENTION + """
theorem ragged: attention {
  rewrite softmax_contract at P, O
  split x by kx via online_softmax pad
  stream x by sx via online_softmax pad
}
"""


def test_a_padded_stream_inside_a_split_needs_no_chunk_that_divides_the_block() -> None:
    """Blocks sized to the SMs (249 keys of 32768 on 132 SMs) are no whole number of chunks: the stream
    inside the split may be padded, each block's last chunk masked with the accumulator's padding law
    (asked of the nested stream, as of a ragged stream), so no `sx | kx` is recorded.  Without `pad`
    the nested tile must still divide the block, and only a stream directly inside a split is ragged."""
    thm = prove(loads(RAGGED), "ragged")
    assert [(p.kind, p.pad) for p in thm.schedule.partitions] == [("split", True), ("stream", True)]
    assert thm.constraints == () and not thm.tested
    assert _refusal(Partition("stream", "x", 16, "smem", "online_softmax"),
                    (Partition("split", "x", 249, "hbm", "online_softmax", pad=True),)).condition.startswith(
        "tile 16 does not divide the `hbm` tile 249")
    streamed = (Partition("stream", "x", 256, "smem", "online_softmax", pad=True),)
    nested = _refusal(Partition("stream", "x", 100, "reg", "online_softmax", pad=True), streamed)
    assert nested.rule == "nest" and "tile 100 does not divide the `smem` tile 256" in nested.condition


@pytest.mark.parametrize(("q", "x", "kx", "sx"),
                         [(1, 1000, 249, 16), (3, 77, 9, 4), (2, 50, 50, 16), (1, 997, 249, 256)])
def test_ragged_blocks_run_and_lower_on_plain_jax_as_the_evaluator(q: int, x: int, kx: int, sx: int) -> None:
    """x a multiple of neither tile, the chunk longer than the block in the last case: the interpreter
    and the plain-JAX lowering (blocks are slices of any width, each folded chunk by chunk with the
    ragged tail masked) match the evaluator."""
    thm = prove(loads(RAGGED), "ragged")
    arrays = _inputs(q, x, seed=x)
    want = _reference(thm, arrays)
    (got,) = run_schedule(thm, arrays, tiles={"kx": kx, "sx": sx})
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    lowered = lower(thm, target="jax", tiles={"kx": kx, "sx": sx})
    out = np.asarray(lowered.fn(*[a.astype(np.float32) for a in arrays]))
    assert np.max(np.abs(out - want)) / np.max(np.abs(want)) < 1e-5


@pytest.mark.parametrize(("q", "x", "kx", "sx"),
                         [(1, 1000, 249, 16), (3, 77, 9, 16), (2, 100, 32, 16), (1, 997, 249, 256), (2, 500, 100, 32)])
def test_pallas_runs_ragged_blocks_as_the_evaluator(q: int, x: int, kx: int, sx: int) -> None:
    """Pallas programs read K and V whole and load whole chunks from their block's offset: blocks that
    are no whole number of chunks (249 of 16, a 256-key chunk over a 249-key block, a 16-key chunk over
    a 9-key block) match the evaluator in interpret mode, the positions past each block's end masked
    (they hold the next block's keys, not zeros), as whole-chunk blocks (32 of 16) still do."""
    thm = prove(loads(RAGGED), "ragged")
    arrays = _inputs(q, x, seed=x + kx)
    lowered = lower(thm, target="pallas", tiles={"kx": kx, "sx": sx})
    got = np.asarray(lowered.fn(*[a.astype(np.float32) for a in arrays], interpret=True))
    want = _reference(thm, arrays)
    assert got.shape == want.shape and np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-5


def test_ragged_blocks_of_a_plain_sum_lower_on_both_targets() -> None:
    """Nothing in the ragged Pallas split is attention's: a sum over n of A·exp(B) (its padding
    value 0, exp of the next block's B masked after the product) in blocks of 37 rows, chunks of
    16, matches numpy on both targets."""
    text = """
axis n, d
diagram weighted(A: [n d], B: [n d]) -> [d] {
  return sum[n](A * exp(B))
}
theorem t: weighted {
  split n by kn via sum pad
  stream n by sn via sum pad
}
"""
    thm = prove(loads(text), "t")
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((300, 20)), rng.standard_normal((300, 20))
    want = (a * np.exp(b)).sum(axis=0)
    for target in ("jax", "pallas"):
        fn = lower(thm, target=target, tiles={"kn": 37, "sn": 16}).fn
        args = (a.astype(np.float32), b.astype(np.float32))
        got = np.asarray(fn(*args, interpret=True) if target == "pallas" else fn(*args))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.max(np.abs(want)))


def test_ragged_blocks_cross_lower_for_cuda_and_mosaic_refuses_a_split() -> None:
    """The ragged Pallas kernel is one Triton call for an abstract H200 (every op on power-of-two
    chunks; K and V one whole block each), bf16 and f32; Mosaic GPU refuses the split with its reason."""
    jax = pytest.importorskip("jax")
    from tests.test_crosslower import TRITON_CALL, cuda_hlo

    thm = prove(loads(RAGGED), "ragged")
    for dtype in ("float32", "bfloat16"):
        specs = [jax.ShapeDtypeStruct(shape, np.dtype(dtype) if dtype == "float32" else jax.numpy.bfloat16)
                 for shape in [(1, 64), (32768, 64), (32768, 64)]]
        lowered = lower(thm, target="pallas", tiles={"kx": 249, "sx": 16}, dtype=dtype)
        assert cuda_hlo(lowered.fn, *specs).count(TRITON_CALL) == 1
    with pytest.raises(NapkinError, match=r"cannot be lowered for Mosaic GPU: a split of `x`"):
        lower(thm, target="mosaic", tiles={"kx": 249, "sx": 16})


def test_the_cost_of_ragged_blocks_counts_the_longest_program() -> None:
    """At q = 1, x = 32768 on the h200 the tile search also tries blocks of ⌈x / SMs⌉ (and of two
    waves) for a padded split over a padded stream: 249 keys make 132 programs, one wave; the longest
    program holds 249 keys against 248.2 on average (x1.003), still under the 128 programs of 256 keys
    that whole power-of-two chunks give (x1.03)."""
    thm = prove(loads(RAGGED), "ragged")
    c = cost(thm, sizes={"q": 1, "x": 32768}, hardware="h200")
    rows = optimise.search(c, top=10**6, relax=True).rows
    best = rows[0]
    assert best.tiles["kx"] == 249 and best.programs == 132
    assert best.factor == pytest.approx(132 * 249 / 32768)
    whole = [r for r in rows if r.tiles["kx"] == 256]
    assert whole and whole[0].factor == pytest.approx(132 / 128) and best.seconds < whole[0].seconds
    assert {r.tiles["kx"] for r in rows} >= {249, 125}  # one and two programs per SM
