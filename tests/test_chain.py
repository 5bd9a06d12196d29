"""Chained kernels (issue 29 item 2, README "Chained kernels"): a theorem names its kernels with the
arrays each writes to hbm (``kernel NAME, ... { steps }``, the last ``kernel return``).

The cut (``terms.cut``) and the join rule (``kernel.chain``) with their refusals, the printer round
trip, the schedule interpreter, both lowerings and ``jax.grad`` against the evaluator at ragged sizes,
the summed cost with its launches, and ``pseudo``/``draw``.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from napkin_cat import kernel, ops, proof, terms
from napkin_cat.certify import rules
from napkin_cat.cli import main
from napkin_cat.cost import cost
from napkin_cat.cost.chain import chain_report
from napkin_cat.diagnostics import NapkinError
from napkin_cat.draw import draw_svg
from napkin_cat.elaborate import load, loads
from napkin_cat.evaluate import evaluate
from napkin_cat.kernel import KernelError, Theorem
from napkin_cat.lower import lower
from napkin_cat.printer import print_module
from napkin_cat.proof import check_file, check_module, theorem
from napkin_cat.schedule.run import run_schedule
from napkin_cat.search.chains import exposed, hoisted, recomputed
from napkin_cat.search.derive import checked, derive, model_cost, unfused_cost
from napkin_cat.search.rewrite import search

ROOT = Path(__file__).resolve().parent.parent
PROOF = ROOT / "proofs" / "chains.ncd"
TILES = {"gq": 16, "sx": 16, "gp": 16, "gf": 16, "sd": 16, "gt": 16, "sv": 16, "st": 16}


def _chain(name: str) -> Theorem:
    return theorem(PROOF, name)


def _inputs(name: str, seed: int = 0) -> list[np.ndarray]:
    """Ragged sizes: no tile above divides q = 37, x = 29, f = 21, t = 11 or v = 45."""
    rng = np.random.default_rng(seed)
    if name == "attention_then_projection":
        return [rng.standard_normal(s) for s in [(37, 64), (29, 64), (29, 64), (64, 21)]]
    return [rng.standard_normal((11, 45)), rng.integers(0, 45, size=11).astype(float)]


def test_both_chains_check_strictly_as_two_kernels() -> None:
    results = {r.name: r for r in check_file(PROOF, strict=True)}
    assert set(results) == {"attention_then_projection", "mean_cross_entropy_chained"}
    for r in results.values():
        thm = r.theorem
        assert thm is not None and not thm.tested and thm.schedule == terms.Schedule()
        assert len(thm.kernels) == 2 and thm.writes[-1] == ("return",) and "chain" in thm.trust
        assert all(k.schedule.partitions for k in thm.kernels)
    thm = results["attention_then_projection"].theorem
    assert thm is not None and thm.writes == (("A",), ("return",))
    first, second = thm.kernels
    assert [p.name for p in first.source.inputs] == ["Q", "K", "V"]  # W is the projection's only
    assert [p.name for p in second.source.inputs] == ["W", "A"]  # inputs first, then the written arrays
    assert {p.kind for p in first.schedule.partitions} == {"group", "stream"}
    assert any("softmax_contract" in t for t in thm.trust)


def test_a_chain_prints_and_parses_back() -> None:
    module = load(PROOF)
    again = loads(print_module(module), str(PROOF))
    assert again.theorems == module.theorems
    assert [len(t.kernels) for t in again.theorems] == [2, 2]


def test_the_cut_computes_each_written_array_as_the_diagram_binds_it() -> None:
    thm = kernel.unfold(kernel.refl("t", load(ROOT / "examples" / "chains.ncd").diagram("attention_projected")))
    first, second = terms.cut(thm.result, (("S",), ("return",)), ops.integer_valued)
    assert [let.names[0] for let in first.body] == ["S"] and first.out_types == (("q", "x"),)
    assert [let.names[0] for let in second.body] == ["P", "O", "A"]  # everything after S, in order
    arrays = _inputs("attention_then_projection")
    assert [p.name for p in second.inputs] == ["V", "W", "S"]
    out = evaluate(second, [arrays[2], arrays[3], evaluate(first, arrays[:2])])
    np.testing.assert_allclose(out, evaluate(thm.result, arrays), rtol=1e-12, atol=1e-12)


def _whole() -> Theorem:
    return kernel.unfold(kernel.refl("t", load(ROOT / "examples" / "chains.ncd").diagram("attention_projected")))


@pytest.mark.parametrize(("writes", "condition"), [
    ((("return",), ("A",)), "the last kernel, and only it, writes the outputs"),
    ((("W",), ("return",)), "`W` is not a binding"),
    ((("A",), ("A",), ("return",)), "`A` is written twice"),
    ((("A", "A"), ("return",)), "`A` is written twice"),
    ((("O", "S"), ("return",)), "no later kernel reads `S`"),
    ((), "the last kernel, and only it"),
])
def test_the_join_refuses_what_is_not_a_chain(writes: tuple[tuple[str, ...], ...], condition: str) -> None:
    with pytest.raises(KernelError) as info:
        kernel.chain(_whole(), writes, (), None)
    assert info.value.rule == "chain" and condition in info.value.condition


@pytest.mark.parametrize(("reader", "tested"), [
    ("recip(V)", True),          # V = T * 2 carries the rewritten zero's sign to the division
    ("recip(V + 1.0)", False),   # the divisor may not be 0 (T is 0): nothing reads a zero's sign
    ("exp(V)", False),           # nothing divides
])
def test_the_join_counts_a_rewritten_zero_a_later_kernel_divides_by_as_tested(reader: str, tested: bool) -> None:
    """sum[x](X * 0) = -0 is proved over the reals; kernel 1 rewrites T with it (proved: its piece divides by
    nothing), kernel 2 writes V = T * 2, kernel 3 reads V: where it divides by V, recip(+0) = +inf became
    -inf, so kernel 1's rewrites are only tested (finiteness.signed_zero_writes, through kernel 2)."""
    text = ("axis x\nlemma zero(X: [x]) : sum[x](X * 0) = -0\n"
            f"diagram f(A: [x]) -> [] {{\n  T = sum[x](A * 0)\n  V = T * 2\n  U = {reader}\n  return U\n}}\n"
            "theorem t: f {\n  kernel T {\n    rewrite zero at T\n  }\n  kernel V {\n  }\n  kernel return {\n  }\n}\n")
    (loose,) = check_module(loads(text))
    assert loose.theorem is not None
    assert any("T's kernel: its rewrites" in t for t in loose.theorem.tested) is tested
    (strict,) = check_module(loads(text), strict=True)
    assert strict.ok is not tested
    if tested:
        assert strict.failure is not None and strict.step == 1 and "T's kernel: its rewrites" in strict.failure.message


def test_the_join_refuses_a_kernel_about_another_piece() -> None:
    whole = _whole()
    pieces = terms.cut(whole.result, (("A",), ("return",)), ops.integer_valued)
    honest = tuple(kernel.refl(f"k{i}", p) for i, p in enumerate(pieces))
    assert kernel.chain(whole, (("A",), ("return",)), honest, None).kernels == honest
    other = terms.cut(whole.result, (("S",), ("return",)), ops.integer_valued)  # a proved kernel, but of another cut
    for forged in [(kernel.refl("k0", other[0]), honest[1]), honest[::-1], honest[:1]]:
        with pytest.raises(KernelError, match="not about its piece"):
            kernel.chain(whole, (("A",), ("return",)), forged, None)
    nested = kernel.chain(whole, (("A",), ("return",)), honest, None)
    with pytest.raises(KernelError, match="not about its piece"):  # a chain is not a kernel of another
        kernel.chain(whole, (("A",), ("return",)), (nested, honest[1]), None)


def test_a_scheduled_diagram_is_not_cut() -> None:
    text = ('use "chains.ncd"\ntheorem t: attention_projected {\n  group q by gq\n  kernel A {\n  }\n'
            '  kernel return {\n  }\n}\n')
    (result,) = check_module(loads(text, str(ROOT / "examples" / "t.ncd")))
    assert not result.ok and result.step == 2 and result.failure is not None
    assert "chain: the diagram already carries a schedule" in result.failure.message


@pytest.mark.parametrize("name", ["attention_then_projection", "mean_cross_entropy_chained"])
def test_the_interpreter_runs_the_kernels_in_order(name: str) -> None:
    thm = _chain(name)
    arrays = _inputs(name)
    sizes = {"attention_then_projection": {"q": 32, "x": 32, "f": 16}, "mean_cross_entropy_chained": {"t": 16, "v": 48}}
    rng = np.random.default_rng(1)  # divisible sizes: the proofs declare no pad
    s = sizes[name]
    arrays = [rng.standard_normal((s["q"], 64)), rng.standard_normal((s["x"], 64)), rng.standard_normal((s["x"], 64)),
              rng.standard_normal((64, s["f"]))] if "q" in s else \
        [rng.standard_normal((s["t"], s["v"])), rng.integers(0, s["v"], size=s["t"]).astype(float)]
    got = run_schedule(thm, arrays, tiles=TILES)
    np.testing.assert_allclose(got[0], evaluate(thm.source, arrays), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("target", ["jax", "pallas"])
@pytest.mark.parametrize("name", ["attention_then_projection", "mean_cross_entropy_chained"])
def test_both_targets_match_the_evaluator_at_ragged_sizes_and_differentiate(name: str, target: str) -> None:
    thm = _chain(name)
    lowered = lower(thm, target=target, tiles=TILES)
    assert len(lowered.layouts) == 2 and lowered.layout is lowered.layouts[-1]
    assert "run in order" in lowered.source and f"{thm.name}_k1" in lowered.source
    arrays = _inputs(name)
    args = [jnp.asarray(a, jnp.float32) for a in arrays]
    np.testing.assert_allclose(np.asarray(lowered.fn(*args)), evaluate(thm.source, arrays), rtol=2e-5, atol=2e-5)
    plain = lower(kernel.unfold(kernel.refl("plain", thm.source)), target="jax")  # the diagram, unscheduled

    def loss(f: object) -> object:
        return jax.grad(lambda z: jnp.sum(jnp.sin(f(z, *args[1:]))))(args[0])  # type: ignore[operator]

    np.testing.assert_allclose(np.asarray(loss(lowered.fn)), np.asarray(loss(plain.fn)), rtol=1e-4, atol=1e-5)


def test_the_cost_sums_the_kernels_and_their_launches() -> None:
    thm = _chain("attention_then_projection")
    sizes = {"q": 4096, "x": 4096, "f": 1024}
    r = chain_report(thm, thm.name, hardware="h200", sizes=sizes)
    assert [k["theorem"] for k in r["kernels"]] == ["attention_then_projection_k1", "attention_then_projection_k2"]
    assert r["launches"] == 2 and r["launch_overhead_s"] == 4e-6
    (buffer,) = r["buffers"]
    assert buffer["array"] == "A" and buffer["values"] == str(4096 * 64) and buffer["readers"] == 1
    each = [k["time"]["grid_serial_s"] for k in r["kernels"]]
    assert r["time"]["serial_s"] == pytest.approx(sum(each) + 4e-6)
    whole = cost(thm, hardware="h200", sizes=sizes)  # the baseline is the whole diagram's
    assert r["time"]["unfused_s"]["serial"] > r["time"]["serial_s"] > 0
    assert whole.baseline.kernels >= 4


def test_cost_pseudo_and_draw_show_every_kernel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(PROOF), "attention_then_projection", "--hardware", "h200", "--size", "q=4096", "--size", "x=4096",
            "--size", "f=1024"]
    assert main(["cost", *args]) == 0
    text = capsys.readouterr().out
    assert "== kernel 1 of 2: attention_then_projection_k1, writes A ==" in text
    assert "== kernel 2 of 2: attention_then_projection_k2, writes the outputs ==" in text
    assert "buffer A [q d]: 262144 values" in text and "2 launches" in text and "chain time: serial" in text
    assert main(["cost", *args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["launches"] == 2
    assert main(["pseudo", *args]) == 0
    text = capsys.readouterr().out
    assert text.index("# kernel 1 of 2") < text.index("save O smem -> hbm") < text.index("# kernel 2 of 2")
    for verb in ("cost", "pseudo"):  # an axis no kernel uses is a usage error, as for one kernel
        assert main([verb, str(PROOF), "mean_cross_entropy_chained", "--size", "zz=3"]) == 2
        assert "does not use: zz" in capsys.readouterr().err
    svg = draw_svg(_chain("attention_then_projection"))
    assert "as 2 kernels run in order" in svg and svg.count("<svg") == 3
    assert main(["lower", str(PROOF), "mean_cross_entropy_chained", "--target", "jax", "-o",
                 str(tmp_path / "k.py")]) == 0
    assert "; " in capsys.readouterr().out  # the tiles of each kernel


# ---- derive: fusion boundaries ------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "name", "sizes"), [
    ("matmul.ncd", "matmul", {"a": 512, "b": 512, "c": 512}),  # the tiled plan is modelled slower than unfused
    ("chains.ncd", "mean_token_loss", {"t": 512, "v": 512}),
])
def test_derive_never_returns_a_plan_slower_than_the_unfused_diagram_and_it_lowers(
        path: str, name: str, sizes: dict[str, int], tmp_path: Path) -> None:
    source = ROOT / "examples" / path
    cost_fn, unfused = model_cost("h100", "bf16", sizes), unfused_cost("h100", "bf16", sizes)
    found = derive(source, name, cost_fn, seconds=20, unfused=unfused, launch_overhead=4e-6)
    plain = kernel.unfold(kernel.refl(name, load(source).diagram(name)))
    best = found.best
    assert best.ok and best.cost is not None and best.cost.value <= unfused(plain).value * (1 + 1e-9)
    unfused_plans = [c for c in found.search.candidates if c.kernels and not any(k.steps for k in c.kernels)]
    assert len(unfused_plans) == 1 and unfused_plans[0].ok  # the unfused diagram is always a candidate
    text, result = checked(found, tmp_path / "derived.ncd")
    assert result.theorem is not None, text
    thm = result.theorem
    rng = np.random.default_rng(0)
    small = {a: 37 for a in sizes}  # ragged for every tile
    arrays = [rng.standard_normal([small[a] for a in p.axes]) for p in thm.source.inputs]
    if name == "mean_token_loss":
        arrays[1] = rng.integers(0, small["v"], size=small["t"]).astype(float)
    want = evaluate(thm.source, arrays)
    for target in ("jax", "pallas"):
        tiles = {k: 16 for k in (best.cost.tiles or {})}
        got = lower(thm, target=target, tiles=tiles).fn(*(jnp.asarray(a, jnp.float32) for a in arrays))
        np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


def test_derive_plans_a_diagram_with_a_binding_nothing_reads(tmp_path: Path) -> None:
    """A binding read only by a binding the outputs do not need: the unfused plan (a kernel per
    binding) wrote `A`, which no later kernel read, and derive crashed (ValueError from terms.cut,
    found by benchmarks/fuzz_verbs.py).  The plan now writes only the bindings the outputs need."""
    source = tmp_path / "dead.ncd"
    source.write_text("axis a\naxis b\ndiagram dead(X: [a b]) -> [a] {\n  A = exp(X)\n"
                      "  D = sum[b](A)\n  return sum[b](X)\n}\n")
    sizes = {"a": 16, "b": 64}
    found = derive(source, "dead", model_cost("h100", "bf16", sizes), seconds=5,
                   unfused=unfused_cost("h100", "bf16", sizes), launch_overhead=4e-6)
    unfused_plans = [c for c in found.search.candidates if c.kernels and not any(k.steps for k in c.kernels)]
    assert len(unfused_plans) == 1 and unfused_plans[0].ok
    assert [k.writes for k in unfused_plans[0].kernels] == [("return",)]


def test_a_kernel_never_skips_a_chunk_against_infinite_values_an_earlier_kernel_wrote() -> None:
    """Causal attention over values W = exp(V) written by a first kernel: at V = 1000, W is inf, and
    a masked weight 0 times it is NaN in the evaluator, on every query before that key.  The second
    kernel read W as a finite input, so its lowering skipped the masked chunks and returned finite
    rows 0-15 (and --strict accepted the chain); W's values are now read through the kernel that
    wrote it (terms.cut: Param.written), so nothing is skipped and --strict refuses the rewrite."""
    text = ("axis q, x\naxis d = 4\ndiagram f(Q: [q d], K: [x d], V: [x d]) -> [q d] {\n  W = exp(V)\n"
            "  S = contract[d](Q, K)\n  P = softmax[x](where[q x](q >= x, S, -inf))\n  O = contract[x](P, W)\n"
            "  return O\n}\ntheorem t: f {\n  kernel W {\n  }\n  kernel return {\n"
            "    rewrite softmax_contract at P, O\n    group q by 16\n    stream x by 16 via online_softmax\n  }\n}\n")
    module = loads(text)
    (strict,) = check_module(module, strict=True)
    assert strict.failure is not None and "softmax_contract, which is only tested" in strict.failure.message
    (loose,) = check_module(module)
    assert loose.theorem is not None
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((32, 4)) for _ in range(3)]
    arrays[2][20, 0] = 1000.0
    want = evaluate(loose.theorem.source, arrays)
    got = np.asarray(lower(loose.theorem, target="jax").fn(*(jnp.asarray(a, jnp.float32) for a in arrays)))
    np.testing.assert_array_equal(np.isnan(got).any(axis=1), np.isnan(want).any(axis=1))
    assert np.isnan(want[:20, 0]).all() and not np.isnan(want[20:]).any()


# ---- hoisting: a value every program recomputes written once by a first kernel ------------------

HOIST = """axis q, x, e
axis d = 64
diagram pass(A: [q d], B: [x d], C: [q e]) -> [x] {
  S = contract[d](A, B)
  out = contract[q](S, sum[e](exp(C)))
  return out
}
"""
#: candidates per search: unlimited, the plan grouping x is the 43rd of 86 at e = 16384 (50 s at idle); a
#: budget, not seconds, so that the plan does not depend on the machine's load
HOIST_BUDGET = 48


@pytest.mark.parametrize(("e", "chained"), [(16384, True), (1, False)])
def test_a_value_every_program_recomputes_is_hoisted_where_the_model_says_so(e: int, chained: bool) -> None:
    """``sum[e](exp(C))`` lacks x: a program per block of x recomputes it, reading all of C, in
    every chunk of q.  ``exposed`` binds it, ``recomputed`` names it, and ``hoisted`` keeps the
    chain that writes it once where the model prices that cheaper (e = 16384: C is 64 M values
    read by every program) and the one kernel where a launch costs more than it saves (e = 1)."""
    module = loads(HOIST)
    lemmas = rules.lemmas_in_scope(module)
    cost_fn = model_cost("h200", "bf16", {"q": 4096, "x": 4096, "e": e})
    one = search(module, "pass", cost_fn, lemmas=lemmas, theorem_name="t", max_rewrites=0, budget=HOIST_BUDGET,
                 seconds=math.inf)
    thm = one.best.theorem
    assert thm is not None and "x" in {p.axis for p in proof.partitions(thm) if p.kind == "group"}
    assert recomputed(thm) == ()  # an operand, not a binding: nothing to cut at yet
    bound = exposed(module.diagram("pass"), thm)
    assert [let.names[0] for let in bound.body] == ["S", "h", "out"] and exposed(bound, thm) is bound
    within = replace(module, diagrams=(bound,), scope_diagrams=(bound,))
    again = search(within, "pass", cost_fn, lemmas=lemmas, theorem_name="t", max_rewrites=0, budget=HOIST_BUDGET,
                   seconds=math.inf)
    assert again.best.theorem is not None and recomputed(again.best.theorem) == ("h",)
    found = hoisted(again, within, "pass", cost_fn, lemmas=lemmas, theorem_name="t", launch_overhead=4e-6,
                    max_rewrites=0, budget=200, seconds=math.inf, screen=None)
    assert any(c.kernels and c.kernels[0].writes == ("h",) and c.ok for c in found.candidates)  # always priced
    assert bool(found.best.kernels) == chained
    if chained:
        assert found.best.theorem is not None and found.best.theorem.writes == (("h",), ("return",))


def test_a_written_integer_array_stays_integer_in_the_next_kernel() -> None:
    """`E = Dx + 1` of an `int` input is integer (the elaborator types the binding so); written by a
    first kernel, it entered the second as a real input: sampled as normal values by a `dtype`
    measurement, approximable by a `dtype` step, lowered as float32.  terms.cut now gives it the
    binding's `integer` flag, so the kernel's dtype rule refuses approximating it."""
    text = ("axis q, x\naxis d = 4\ndiagram f(Q: [q d], K: [x d], V: [x d], Dq: int [q], Dx: int [x]) -> [q d] {\n"
            "  E = Dx + 1\n  S = contract[d](Q, K)\n  M = select(eq(Dq, E), S, -inf)\n"
            "  O = contract[x](softmax[x](M), V)\n  return O\n}\n")
    module = loads(text)
    (_, second) = terms.cut(kernel.unfold(kernel.refl("t", module.diagram("f"))).result, (("E",), ("return",)),
                            ops.integer_valued)
    assert [(p.name, p.integer) for p in second.inputs] == [("Q", False), ("K", False), ("V", False), ("Dq", True),
                                                             ("E", True)]
    proved = "theorem t: f {\n  kernel E {\n  }\n  kernel return {\n    rewrite softmax_contract at O\n" \
             "    stream x by sx via online_softmax\n  }\n}\n"
    (ok,) = check_module(loads(text + proved), strict=True)
    assert ok.ok
    approximated = proved.replace("via online_softmax\n", "via online_softmax\n    dtype E as bf16 tol 0.5\n")
    (refused,) = check_module(loads(text + approximated))
    assert refused.failure is not None and "`E` is an integer input" in refused.failure.message
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal((37, 4)), rng.standard_normal((29, 4)), rng.standard_normal((29, 4)),
              rng.integers(0, 4, 37).astype(float), rng.integers(0, 3, 29).astype(float)]
    assert ok.theorem is not None
    for target in ("jax", "pallas"):
        fn = lower(ok.theorem, target=target, tiles={"sx": 16}).fn
        got = fn(*(jnp.asarray(a, jnp.float32) for a in arrays[:3]), *(jnp.asarray(a, jnp.int32) for a in arrays[3:]))
        np.testing.assert_allclose(np.asarray(got), evaluate(ok.theorem.source, arrays), rtol=2e-5, atol=2e-5)


def test_a_written_integer_array_past_int32_or_infinite_is_read_as_the_writer_computed_it() -> None:
    """`F = floor(...)` of a real is integer-valued (typed so: it may index or be compared), but it may
    be ±inf (floor of a -inf mask) or past int32 (floor of 1e6 times a score).  Written by a first
    kernel, the second read it as an `int` input, cast to int32: a fully masked row's max was
    -2147483648 where the evaluator gives -inf, and a sum of 1e12-sized floors wrapped.  Both
    targets now read a written array as the writing kernel computed it (Layout.integer)."""
    text = ("axis q, x\ndiagram f(S: [q x]) -> [q] {\n  F = floor(where[q x](q > x, S * 1000000, -inf))\n"
            "  return max[x](F) + sum[x](select(ge(F, 0), F, 0)) * 0.000001\n}\n"
            "theorem t: f {\n  kernel F {\n    group q by 16\n  }\n  kernel return {\n    group q by 16\n  }\n}\n")
    (ok,) = check_module(loads(text), strict=True)
    assert ok.ok and ok.theorem is not None
    s = np.random.default_rng(0).standard_normal((20, 21)) * 1000.0
    want = evaluate(ok.theorem.source, [s])
    assert want[0] == -np.inf and np.max(np.abs(want[1:])) > 2.0 ** 31
    for target in ("jax", "pallas"):
        fn = lower(ok.theorem, target=target).fn
        got = np.asarray(fn(jnp.asarray(s, jnp.float32), **({"interpret": True} if target == "pallas" else {})))
        assert got[0] == -np.inf, target
        np.testing.assert_allclose(got[1:], want[1:], rtol=1e-5)


def test_a_written_integer_buffer_is_priced_at_its_stored_width() -> None:
    """A bf16 chain's written floor `F` is stored in float32 by its writer (``INTEGER_OUTPUT_DTYPE``): the chain's
    buffer line counted it at bf16's 2 bytes; the first kernel's hbm traffic counts it at 4 too."""
    text = ("axis q, x\ndiagram f(S: [q x]) -> [q] {\n  F = floor(S * 1000)\n  return max[x](F)\n}\n"
            "theorem t: f {\n  kernel F {\n    group q by 16\n  }\n  kernel return {\n    group q by 16\n  }\n}\n")
    (ok,) = check_module(loads(text), strict=True)
    assert ok.theorem is not None
    r = chain_report(ok.theorem, "t", hardware="h200", sizes={"q": 64, "x": 32}, dtype="bf16")
    (buffer,) = r["buffers"]
    assert (buffer["array"], buffer["values"], buffer["bytes"]) == ("F", "2048", "8192")
    first = cost(ok.theorem.kernels[0], hardware="h200", sizes={"q": 64, "x": 32}, dtype="bf16")
    assert first.first.transfers_bytes == 2048 * 2 + 2048 * 4


UNBOUND = """axis t, v
diagram f(L: int [t], W: [v]) -> [t] {
  O = onehot[v](L)
  return sum[v](O * W)
}
theorem g: f {
  kernel O {
    group t by 16
  }
  kernel return {
    group t by 16
  }
}
"""


def test_a_kernel_reading_no_array_along_an_axis_it_uses(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first kernel computes onehot[v](L) and reads nothing along v (W, read by the second, does): the
    chain passes --strict, but the interpreter failed with "axis `v` has no size" and the lowering blamed the
    diagram ("gets its size from no input and has no declared size", which W contradicts).  The interpreter
    takes the size from the chain's inputs; the lowering, whose kernels size themselves from their own
    inputs, refuses naming the axis, the kernel and the array that carries it."""
    path = tmp_path / "unbound.ncd"
    path.write_text(UNBOUND)
    (ok,) = check_file(path, strict=True)
    assert ok.theorem is not None
    rng = np.random.default_rng(0)
    labels, table = rng.integers(0, 5, 20).astype(float), rng.standard_normal(5)
    (got,) = run_schedule(ok.theorem, [labels, table], tiles={})
    np.testing.assert_array_equal(got, table[labels.astype(int)])
    for target in ("jax", "pallas"):
        with pytest.raises(NapkinError) as raised:
            lower(ok.theorem, target=target)
        assert raised.value.codes == ("lower.chain_unbound_axis",)
        assert main(["lower", str(path), "g", "--target", target, "-o", str(tmp_path / "g.py")]) == 1
        err = capsys.readouterr().err
        assert "kernel `g_k1` of chain `g` needs the size of axis `v` (at `O`), but reads no array along it " \
               "(the chain's `W` does)" in err and "Traceback" not in err
        assert not (tmp_path / "g.py").exists()


@pytest.mark.parametrize("target", ["jax", "pallas"])
def test_a_written_id_stays_exact_in_a_bf16_chain(target: str) -> None:
    """`E = Dx + 1` written by a first kernel of a chain lowered at bfloat16 was stored in bf16 by its
    writer (and read in bf16 by the second kernel): ids near 1000 rounded to multiples of 4, so the
    document mask eq(Dq, E) kept the wrong keys (relative error 1 where the one-kernel theorem is
    within bf16's rounding).  An integer-valued output is stored in f32 and a written one read so."""
    text = ("axis q, x\naxis d = 4\ndiagram f(Q: [q d], K: [x d], V: [x d], Dq: int [q], Dx: int [x]) -> [q d] {\n"
            "  E = Dx + 1\n  S = contract[d](Q, K)\n  M = select(eq(Dq, E), S, -inf)\n"
            "  O = contract[x](softmax[x](M), V)\n  return O\n}\ntheorem t: f {\n  kernel E {\n  }\n"
            "  kernel return {\n    rewrite softmax_contract at O\n    stream x by sx via online_softmax\n  }\n}\n")
    (ok,) = check_module(loads(text), strict=True)
    assert ok.theorem is not None
    rng = np.random.default_rng(18)
    arrays = [rng.standard_normal((37, 4)), rng.standard_normal((29, 4)), rng.standard_normal((29, 4)),
              1000.0 + np.sort(rng.integers(0, 4, 37)), 999.0 + np.sort(rng.integers(0, 4, 29))]
    want = evaluate(ok.theorem.source, arrays)
    fn = lower(ok.theorem, target=target, tiles={"sx": 16}, dtype="bfloat16").fn
    got = fn(*(jnp.asarray(a, jnp.float32) for a in arrays[:3]), *(jnp.asarray(a, jnp.int32) for a in arrays[3:]),
             **({"interpret": True} if target == "pallas" else {}))
    assert np.max(np.abs(np.asarray(got, np.float64) - want)) / np.max(np.abs(want)) < 2e-2
