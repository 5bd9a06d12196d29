"""``napkin derive``: the untrusted search (rewrite.py) and the proof writer (derive.py).

The search must rediscover the hand-written proofs from the diagrams alone, on the
examples and on generated variants the repository does not contain (renamed axes and
bindings, extra woven batch axes, an extra elementwise box before the normaliser, other
normalisers), say when nothing helps, stop for the stated reason, and write files that
``napkin check`` accepts.  Searches run under the real cost model on the H100 profile at
small sizes; each derivation is computed once per module (the fixture cache).
"""

from __future__ import annotations

import importlib.util
import random
import re
from pathlib import Path

import numpy as np
import pytest

from napkin_cat import certify, cost, kernel, proof, run
from napkin_cat.certify import rules
from napkin_cat.cli import main
from napkin_cat.cost import optimise, roofline
from napkin_cat.elaborate import load, loads
from napkin_cat.search import chains, derive, moves, rewrite
from napkin_cat.terms import Partition, Rewrite

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

#: sizes of the symbolic axes, per example file (axis names repeat across files: b is a batch in one, a
#: contracted axis in another)
SIZES = {"attention.ncd": {"q": 1024, "x": 1024, "b": 2, "h": 4, "g": 4},
         "matmul.ncd": {"a": 1024, "b": 1024, "c": 1024}, "cross_entropy.ncd": {"t": 1024, "v": 8192},
         "mlp.ncd": {"t": 1024, "d": 256, "f": 1024}, "spherical_attention.ncd": {"q": 1024, "x": 1024}}
_CACHE: dict[tuple[str, str, int], derive.Derivation] = {}


def derived(path: Path, diagram: str, max_rewrites: int = 1) -> derive.Derivation:
    key = (str(path), diagram, max_rewrites)
    if key not in _CACHE:
        axes = derive.axes_of(path, diagram)
        sizes = {a: n for a, n in SIZES[path.name].items() if a in axes and axes[a] is None}
        cost = derive.model_cost("h100", "bf16", sizes)
        _CACHE[key] = derive.derive(path, diagram, cost, settings={"hardware": "h100"}, max_rewrites=max_rewrites,
                                    seconds=600)  # results, not speed, are tested here: no time limit on busy CI
    return _CACHE[key]


def partitions(found: derive.Derivation) -> list[tuple[str, str, str | None]]:
    """The best schedule's smem partitions, with the accumulators the kernel chose."""
    assert found.best.theorem is not None
    return [(p.kind, p.axis, p.via) for p in found.best.theorem.schedule.partitions if p.level == "smem"]


def lemmas_used(found: derive.Derivation) -> list[str]:
    return [s.lemma for s in found.best.steps if isinstance(s, Rewrite)]


# ---- the search's pieces ----------------------------------------------------------------------


def test_search_never_picks_the_plain_normalised_contraction_with_exp() -> None:
    """The kernel refuses an accumulator unsafe in floating point, so no candidate uses it."""
    found = derived(EXAMPLES / "attention.ncd", "attention", max_rewrites=2)
    for candidate in found.search.candidates:
        if candidate.theorem is not None:
            assert "normalised" not in {name for _, _, name in candidate.theorem.accumulators}
    assert found.best.theorem is not None


def test_stream_refuses_the_plain_normalised_state_for_one_query() -> None:
    """Decoding attends one query: the scores are [x] alone.  A test that drew six values with
    a std of 1000 peaked at 640, below exp's overflow, and let the unshifted state pass.  With
    no `via`, the stream picks the stable accumulator."""
    decode = loads("axis x\naxis d = 8\ndiagram step(Q: [d], K: [x d], V: [x d]) -> [d] {\n"
                   "  P = softmax[x](contract[d](Q, K))\n  O = contract[x](P, V)\n  return O\n}\n")
    fused = kernel.rewrite(kernel.refl("t", decode.diagram("step")), rules.library()["softmax_contract"],
                           Rewrite("softmax_contract", ("P", "O")), {"softmax_contract": "test"})
    with pytest.raises(kernel.KernelError, match=r"tried normalised: it fails in floating point: on inputs of "
                                                 r"magnitude 1000"):
        kernel.stream(fused, Partition("stream", "x", 4, via="normalised"), certify.accumulator)
    thm = kernel.stream(fused, Partition("stream", "x", 4, via="online_softmax"), certify.accumulator)
    assert thm.accumulators[0][2] == "online_softmax"
    plain = kernel.stream(fused, Partition("stream", "x", 4), certify.accumulator)
    assert plain.accumulators[0][2] == "online_softmax" and plain.schedule.partitions[-1].via == "online_softmax"


# ---- rediscovering the hand-written proofs ---------------------------------------------------


def test_attention_rediscovers_flash_attention_at_no_more_than_the_hand_written_cost(tmp_path: Path) -> None:
    found = derived(EXAMPLES / "attention.ncd", "attention", max_rewrites=2)
    assert "softmax_contract" in lemmas_used(found)
    assert partitions(found) == [("group", "q", None), ("stream", "x", "online_softmax")]
    assert "stream x by sx at smem via online_softmax" in derive.proof_text(found, ROOT / "proofs" / "x.ncd")
    cost = derive.model_cost("h100", "bf16", {"q": 1024, "x": 1024})
    hand = cost(proof.theorem(ROOT / "proofs" / "flash_attention.ncd", "flash_attention"))
    assert found.best.cost is not None and found.best.cost.value <= hand.value
    assert found.search.stopped == "saturated" and found.search.helps
    out = tmp_path / "deep" / "flash.ncd"
    out.parent.mkdir()
    result = derive.write(found, out)
    assert result.ok
    text = out.read_text()
    use = re.search(r'use "(.*)"', text)
    assert use is not None and (out.parent / use[1]).resolve() == (EXAMPLES / "attention.ncd").resolve()
    assert "# Runners-up, and why they lost:" in text and "x the best" in text
    assert re.search(r"gq = \d+", text)  # the chosen tile values, in a comment


def test_the_derived_flash_attention_lowers_to_a_kernel_that_matches_the_evaluator() -> None:
    from napkin_cat.lower import lower

    found = derived(EXAMPLES / "attention.ncd", "attention", max_rewrites=2)
    assert found.best.theorem is not None and found.best.cost is not None
    tiles = {name: min(value, 32) for name, value in found.best.cost.tiles.items()}  # small enough for q = x = 128
    kernel_fn = lower(found.best.theorem, target="jax", tiles=tiles).fn
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((128, 64)).astype(np.float32) for _ in range(3))
    want = run(load(EXAMPLES / "attention.ncd").diagram("attention"), q, k, v)
    np.testing.assert_allclose(np.asarray(kernel_fn(q, k, v)), np.asarray(want), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("diagram", ["causal_attention", "gqa"])
def test_attention_variants_get_the_flash_schedule(diagram: str) -> None:
    found = derived(EXAMPLES / "attention.ncd", diagram)
    assert lemmas_used(found) == ["softmax_contract"]
    assert ("group", "q", None) in partitions(found)
    assert ("stream", "x", "online_softmax") in partitions(found)


def test_matmul_gets_near_square_tiles_that_fill_the_sms() -> None:
    """At 1024^3 on 132 SMs, square 128x128 tiles make 64 programs (half the SMs idle): the
    model takes the squarest tiles that keep the SMs busy (64x128: 128 programs)."""
    found = derived(EXAMPLES / "matmul.ncd", "matmul")
    assert [(k, a) for k, a, _ in partitions(found)] == [("group", "a"), ("group", "c"), ("stream", "b")]
    assert found.best.cost is not None
    ga, gc = found.best.cost.tiles["ga"], found.best.cost.tiles["gc"]
    assert max(ga, gc) <= 2 * min(ga, gc) and (1024 // ga) * (1024 // gc) >= 128


def test_cross_entropy_streams_the_vocabulary() -> None:
    found = derived(EXAMPLES / "cross_entropy.ncd", "cross_entropy")
    assert [(k, a) for k, a, _ in partitions(found)] == [("group", "t"), ("stream", "v")]


def test_spherical_attention_uses_the_l2_lemma_and_the_normalised_state() -> None:
    found = derived(EXAMPLES / "spherical_attention.ncd", "spherical_attention")
    assert lemmas_used(found) == ["l2_contract"]
    assert partitions(found) == [("group", "q", None), ("stream", "x", "normalised")]


def test_mean_cross_entropy_streams_tokens_and_vocabulary_unless_the_lowering_cannot() -> None:
    path = EXAMPLES / "cross_entropy.ncd"
    sizes = {"t": 4096, "v": 65536}  # one token row of logits alone does not fit next to its labels
    found = derive.derive(path, "mean_cross_entropy", derive.model_cost("h100", "bf16", sizes))
    # one program either way: the two orders of the streams differ by about 1 % in modelled time
    assert sorted((k, a) for k, a, _ in partitions(found)) == [("stream", "t"), ("stream", "v")]
    for_jax = derive.derive(path, "mean_cross_entropy", derive.model_cost("h100", "bf16", sizes), lower="jax")
    assert not for_jax.search.helps
    assert "the jax lowering refuses it" in for_jax.verdict()


def test_mlp_fuses_both_layers_streaming_the_hidden_axis() -> None:
    found = derived(EXAMPLES / "mlp.ncd", "mlp")
    assert lemmas_used(found) == []
    assert [(k, a) for k, a, _ in partitions(found)] == [("group", "t"), ("stream", "f")]


# ---- generated variants the repository does not contain ----------------------------------------

_NORMALISERS = {"softmax": ("softmax_contract", "online_softmax"), "l2norm": ("l2_contract", "normalised"),
                "rmsnorm": ("rms_contract", "normalised")}


def variant(seed: int) -> tuple[str, str, str, str, str, bool]:
    """An attention-like diagram with fresh names, extra batch axes, maybe an extra box.

    Returns (source text, query axis, key axis, expected lemma, expected accumulator, whether
    the last contraction's operands are flipped).
    """
    rng = random.Random(seed)
    names = rng.sample(["i", "j", "k", "m", "n", "p", "r", "u", "w", "z"], 3 + 2)
    query, key, feature, *batch = names
    batch = batch[: rng.randint(0, 2)]
    normaliser = rng.choice(sorted(_NORMALISERS))
    extra = rng.choice(["", "tanh(T) * 30", "T - 1.5", "where[{q} {k}]({q} >= {k}, T, -inf)"]).format(q=query,
                                                                                                      k=key)
    if normaliser != "softmax" and "inf" in extra:
        extra = "T * 2"  # a -inf mask only makes sense before a softmax
    b = " ".join(batch)
    flip = rng.random() < 0.5  # operands in the other order: the lemma then needs contract_comm first
    text = (f"axis {query}, {key}{''.join(', ' + a for a in batch)}\naxis {feature} = 64\n"
            f"diagram att(A: [{b} {query} {feature}], B: [{b} {key} {feature}], C: [{b} {key} {feature}]) "
            f"-> [{b} {query} {feature}] {{\n"
            f"  T = contract[{feature}](A, B)\n"
            + (f"  T2 = {extra}\n  W = {normaliser}[{key}](T2)\n" if extra else f"  W = {normaliser}[{key}](T)\n")
            + f"  R = contract[{key}]({'C, W' if flip else 'W, C'})\n  return R\n}}\n")
    lemma, accumulator = _NORMALISERS[normaliser]
    return text, query, key, lemma, accumulator, flip


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 56])  # rms; softmax, flipped; softmax; l2, flipped; causal mask
def test_generated_variants_are_derived_generically(seed: int, tmp_path: Path) -> None:
    text, query, key, lemma, accumulator, flip = variant(seed)
    source = tmp_path / "src" / "variant.ncd"
    source.parent.mkdir()
    source.write_text(text)
    axes = derive.axes_of(source, "att")
    sizes = {a: 4096 if a in (query, key) else 2 for a, n in axes.items() if n is None}
    found = derive.derive(source, "att", derive.model_cost("h100", "bf16", sizes), max_rewrites=2 if flip else 1,
                          seconds=600)
    assert lemma in lemmas_used(found), text
    assert ("group", query, None) in partitions(found) and ("stream", key, accumulator) in partitions(found), text
    (tmp_path / "out").mkdir()
    assert derive.write(found, tmp_path / "out" / "derived.ncd").ok


@pytest.mark.parametrize("body, sizes, why", [
    # x is mixed and no lemma applies: no relabelling exists, and the whole row does not fit
    ("axis x\ndiagram f(X: [x]) -> [x] {\n  return softmax[x](X)\n}\n", {"x": 1 << 20}, "fits the hardware"),
    # small enough for one kernel: tiling cannot beat it
    ("axis t, v\ndiagram f(Z: [t v]) -> [t] {\n  return logsumexp[v](Z)\n}\n", {"t": 16, "v": 64}, "already fits"),
])
def test_nothing_helps_is_said_and_still_checks(body: str, sizes: dict[str, int], why: str, tmp_path: Path) -> None:
    source = tmp_path / "f.ncd"
    source.write_text(body)
    found = derive.derive(source, "f", derive.model_cost("h100", "bf16", sizes))
    assert not found.search.helps and found.best.steps == ()
    assert found.search.stopped == "saturated"
    assert why in found.verdict()
    out = tmp_path / "f_derived.ncd"
    assert derive.write(found, out).ok
    assert "Nothing helps" in out.read_text()


# ---- stopping, progress, the command line ------------------------------------------------------


def _steps_cost(thm: kernel.Theorem) -> rewrite.Costed:
    """A fast stand-in cost: more partitions are cheaper (exercises the search, not the model)."""
    return rewrite.Costed(10.0 - len(thm.schedule.partitions), True, {}, "stand-in")


def test_the_search_says_why_it_stopped_and_reports_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    module = load(EXAMPLES / "attention.ncd")
    lemmas = rules.lemmas_in_scope(module)
    assert rewrite.search(module, "attention", _steps_cost, lemmas=lemmas, budget=5).stopped == "budget"
    assert rewrite.search(module, "attention", _steps_cost, lemmas=lemmas, seconds=0.0).stopped == "time"
    messages: list[str] = []
    monkeypatch.setattr(rewrite, "_PROGRESS_EVERY", 0.0)
    done = rewrite.search(module, "attention", _steps_cost, lemmas=lemmas, max_rewrites=1, progress=messages.append)
    assert done.stopped == "saturated" and "candidates checked" in messages[-1]
    mlp = load(EXAMPLES / "mlp.ncd")
    refused = [c.refused for c in rewrite.search(mlp, "mlp", _steps_cost, lemmas=rules.lemmas_in_scope(mlp)).candidates
               if c.refused]
    assert refused and all(r.startswith("refused by the kernel at step") for r in refused)


def test_seconds_is_one_window_and_no_pricing_starts_past_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`derive --seconds 2 --budget 1` ran past 60 s on a loaded machine: the fusion-boundary phase had a window of
    its own after the search's, and a boundary's second piece was priced even when its first had spent the window
    (a search prices the diagram it is given whatever its window).  A clock that moves 10 s per pricing and
    nowhere else: the search prices while its 15 s last, the boundaries get what is left (nothing), the unfused
    plan is priced as the one plan always offered, and the search says the boundaries went untried."""
    clock = [0.0]
    fake = type("Clock", (), {"monotonic": staticmethod(lambda: clock[0])})
    for module in (rewrite, chains, derive):
        monkeypatch.setattr(module, "time", fake, raising=False)
    priced: list[str] = []

    def cost_fn(thm: kernel.Theorem) -> rewrite.Costed:
        priced.append(thm.name)
        clock[0] += 10.0
        return _steps_cost(thm)

    def unfused_fn(thm: kernel.Theorem) -> rewrite.Costed:
        priced.append("unfused")
        clock[0] += 10.0
        return rewrite.Costed(100.0, False, {}, "stand-in unfused")

    found = derive.derive(EXAMPLES / "attention.ncd", "attention", cost_fn, seconds=15.0, unfused=unfused_fn)
    assert priced == ["attention_derived", "attention_derived", "unfused"]
    assert found.search.stopped == "time" and re.search(r"fusion-boundary phase with (\d+) of \1 boundaries "
                                                        r"untried", found.search.detail)
    # a boundary's window spent by its first piece: the second is not priced (15 s: the unfused plan, one piece)
    module = load(EXAMPLES / "attention.ncd")
    lemmas = rules.lemmas_in_scope(module)
    one = rewrite.search(module, "attention", cost_fn, lemmas=lemmas, budget=1)
    priced.clear()
    both = chains.with_boundaries(one, module, "attention", cost_fn, unfused_fn, lemmas=lemmas,
                                  theorem_name="attention_derived", launch_overhead=0.0, max_rewrites=1, budget=8,
                                  seconds=15.0, screen=None)
    assert len(priced) == 2 and priced[0] == "unfused" and priced[1].endswith("_k1_derived")
    assert both.stopped == "time" and "untried" in both.detail


def test_cli_derive_writes_a_checked_proof_and_a_kernel(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mm.ncd"
    code = main(["derive", str(EXAMPLES / "matmul.ncd"), "matmul", "--size", "a=2048", "--size", "b=2048",
                 "--size", "c=2048", "-o", str(out), "--lower", "jax"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    # the tiled kernel, or the unfused diagram (one unscheduled kernel: XLA's dot) where the cpu profile models
    # that faster: derive never returns a plan modelled slower than the unfused diagram
    assert "search stopped: saturated" in printed
    assert "group a by ga" in printed or "best: kernel return {}" in printed
    assert main(["check", str(out)]) == 0
    spec = importlib.util.spec_from_file_location("mm_kernel", out.with_suffix(".py"))
    assert spec is not None and spec.loader is not None
    written = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(written)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((300, 100)), rng.standard_normal((100, 260))  # ragged against the tiles
    name = re.search(r"^theorem (\w+):", out.read_text(), flags=re.M)
    assert name is not None  # the kernel is the function named after the theorem
    got = np.asarray(getattr(written, name[1])(a.astype(np.float32), b.astype(np.float32)), dtype=np.float64)
    # bf16 operands and output (the derive default): within 2% of the largest entry
    assert got.shape == (300, 260) and np.abs(got - a @ b).max() < 2e-2 * np.abs(a @ b).max()


@pytest.mark.parametrize("argv, message", [
    (["--size", "a=8", "-o", "X.ncd"], "are symbolic: give their sizes"),
    (["--size", "a=8", "--size", "b=8", "--size", "c=8", "--size", "zz=3", "-o", "X.ncd"], "does not use: zz"),
    (["--size", "a=8", "--size", "b=8", "--size", "c=8", "-o", "X.txt"], "ending in .ncd"),
    (["--size", "a=8", "--size", "b=8", "--size", "c=8", "--hardware", "tpu", "-o", "X.ncd"], "no hardware profile"),
    (["--size", "a=8", "--size", "b=8", "--size", "c=8", "-o", "X.missing/out.ncd"], "no such folder"),
    (["--size", "a=8", "--size", "b=8", "--size", "c=8", "-o", "SOURCE"], "write the output to another file"),
])
def test_cli_derive_usage_errors(argv: list[str], message: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    argv = [str(tmp_path / a) if a.startswith("X.") else a for a in argv]
    argv = [str(EXAMPLES / "matmul.ncd") if a == "SOURCE" else a for a in argv]
    assert main(["derive", str(EXAMPLES / "matmul.ncd"), "matmul", *argv]) == 2
    assert message in capsys.readouterr().err


def test_readme_derive_command_gives_the_theorem_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)  # the README's commands run from the repository root
    readme = (ROOT / "README.md").read_text()
    found = re.search(r"\.venv/bin/napkin (derive [^\n]+)\n```\n```text\n(theorem .*?\n\})", readme, flags=re.S)
    assert found is not None, "README.md has no derive example"
    argv = found[1].split()
    argv[argv.index("-o") + 1] = str(tmp_path / "derived.ncd")
    assert main(argv) == 0, capsys.readouterr().err
    assert found[2] in (tmp_path / "derived.ncd").read_text()


def test_the_benchmark_generates_attention_diagrams_of_growing_size() -> None:
    spec = importlib.util.spec_from_file_location("derive_bench", ROOT / "benchmarks" / "derive_bench.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    small, large = (loads(bench.attention_source(n, k)).diagram("att") for n, k in ((0, 0), (8, 3)))
    assert len(large.body) == len(small.body) + 8
    assert len(large.inputs[0].axes) == len(small.inputs[0].axes) + 3
    assert moves.group_axes(large)[:3] == ("b", "h", "n")  # the extra batch axes are group candidates


# ---- regressions from diagrams users write (found by red-teaming, not in examples/) -------------


def _derive_text(text: str, diagram: str, sizes: dict[str, int], tmp_path: Path) -> derive.Derivation:
    path = tmp_path / "user.ncd"
    path.write_text(text, encoding="utf-8")
    return derive.derive(path, diagram, derive.model_cost("h100", "bf16", sizes), max_rewrites=1, seconds=600,
                         lower="pallas")


def test_ragged_sizes_get_padded_partitions(tmp_path: Path) -> None:
    """q=2000, x=3000 have no power-of-two tile that is x64: every unpadded plan had zero
    configurations and derive said "nothing helps"; the same plan with `pad` fits."""
    text = ("axis q, x\naxis d = 64\ndiagram attn(Q: [q d], K: [x d], V: [x d]) -> [q d] {\n"
            "  P = softmax[x](contract[d](Q, K))\n  O = contract[x](P, V)\n  return O\n}\n")
    found = _derive_text(text, "attn", {"q": 2000, "x": 3000}, tmp_path)
    assert found.search.helps and found.best.theorem is not None
    parts = [p for p in found.best.theorem.schedule.partitions if p.level == "smem"]
    assert [(p.kind, p.axis, p.via, p.pad) for p in parts] == [("group", "q", None, True),
                                                               ("stream", "x", "online_softmax", True)]
    assert derive.write(found, tmp_path / "out.ncd").theorem is not None


def test_a_value_dim_unlike_the_head_dim_is_derived(tmp_path: Path) -> None:
    """V: [x e] with e=48: grouping e had no tile (none is a power of two and x64), which
    stranded the search's starts; the whole axis is now a candidate."""
    text = ("axis q, x\naxis d = 64\naxis e = 48\ndiagram attn(Q: [q d], K: [x d], V: [x e]) -> [q e] {\n"
            "  P = softmax[x](contract[d](Q, K))\n  O = contract[x](P, V)\n  return O\n}\n")
    found = _derive_text(text, "attn", {"q": 4096, "x": 4096}, tmp_path)
    assert ("stream", "x", "online_softmax") in partitions(found)


def test_cli_derive_refuses_a_size_that_contradicts_a_declared_one(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    """Regression: `--size d=32` against `axis d = 64` searched anyway and wrote the diagram as
    written ("the cost model refused it"); it is a usage error like in `napkin cost`."""
    argv = ["derive", str(EXAMPLES / "attention.ncd"), "attention", "--size", "q=64", "--size", "x=64",
            "--size", "d=32", "-o", str(tmp_path / "out.ncd")]
    assert main(argv) == 2
    assert "contradicts declared sizes: d=32 (declared 64)" in capsys.readouterr().err
    assert not (tmp_path / "out.ncd").exists()


def test_a_row_too_wide_for_the_preferred_tile_is_tiled_one_row_at_a_time(tmp_path: Path) -> None:
    """Regression: the gradient of cross-entropy w.r.t. 4096 logits per row fits only a few rows
    per group, below the 64-row coalescing preference of the labels; derive said "none of the 7
    tile configurations allowed by the hardware fits" while `napkin cost` found small tiles.
    Such relaxed tiles are used, and rank after every plan that meets the preferences
    (cross_entropy keeps its group-and-stream schedule: the test above).  At 32000 logits per
    row no tile fits at all, both say so: a row of them alone is past a program's register
    budget (cost.launch)."""
    source = tmp_path / "grad.ncd"
    source.write_text("axis t, v\ndiagram ce_grad(Z: [t v], L: [t]) -> [t v] {\n"
                      "  return softmax[v](Z) - onehot[v](L)\n}\n")
    cost = derive.model_cost("h200", "bf16", {"t": 4096, "v": 4096})
    found = derive.derive(source, "ce_grad", cost, settings={"hardware": "h200"}, seconds=600)
    assert found.best.cost is not None and found.best.cost.fits and found.best.cost.tiles["gt"] < 64
    assert found.best.cost.relaxed and "without the preferred gt: x64" in found.best.cost.summary
    assert partitions(found) == [("group", "t", None)]
    wide = derive.derive(source, "ce_grad", derive.model_cost("h200", "bf16", {"t": 4096, "v": 32000}),
                         settings={"hardware": "h200"}, seconds=600)
    assert not wide.search.helps and "in the register budget" in wide.verdict()


def test_for_pallas_a_schedule_is_costed_as_the_kernel_runs_it(tmp_path: Path) -> None:
    """Regression: for grouped-query decoding (g = 4 query heads per K/V head, woven) derive
    --lower pallas chose `group b by 1; group h by 1; stream x`, costed with g whole in every
    program; the Pallas kernel puts g on the grid one head per program and loads K and V four
    times.  Costed as realised, grouping g (K and V loaded once per head) wins.  With 32 heads
    both plans keep every SM busy (128 programs against 512), so only the traffic tells them
    apart (with 8 heads, grouping g leaves 32 programs for 132 SMs and the two are even)."""
    source = tmp_path / "decode.ncd"
    source.write_text("axis x, b, h\naxis g = 4\naxis d = 64\n"
                      "diagram decode(Q: [b h g d], K: [b h x d], V: [b h x d]) -> [b h g d] {\n"
                      "  P = softmax[x](contract[d](Q, K) * rsqrt(d))\n  O = contract[x](P, V)\n  return O\n}\n")
    sizes = {"b": 4, "h": 32, "x": 4096}
    found = derive.derive(source, "decode", derive.model_cost("h200", "bf16", sizes, target="pallas"),
                          settings={"hardware": "h200"}, lower="pallas", seconds=600)
    assert ("group", "g", None) in partitions(found)
    assert found.best.cost is not None and found.best.cost.tiles.get("gg") == 4


def test_derive_keeps_the_sms_busy_when_a_grid_that_does_exists_at_similar_traffic(tmp_path: Path) -> None:
    """Sigmoid attention, one head, q = x = 4096 on h200: before the time model knew the grid,
    derive took gq = 1024 (4 programs on 132 SMs, quoted at the whole chip's bandwidth).  Now
    no tile configuration with at least as many programs as SMs moves at most 1.1x the bytes of
    the chosen one unless the chosen one has that many programs itself."""
    source = tmp_path / "sigmoid.ncd"
    source.write_text("axis q, x\naxis d = 64\n"
                      "diagram sigmoid_attention(Q: [q d], K: [x d], V: [x d]) -> [q d] {\n"
                      "  S = contract[d](Q, K) * rsqrt(d)\n  return contract[x](sigmoid(S), V)\n}\n")
    sizes = {"q": 4096, "x": 4096}
    found = derive.derive(source, "sigmoid_attention", derive.model_cost("h200", "bf16", sizes),
                          settings={"hardware": "h200"}, seconds=600)
    assert found.best.cost is not None and found.best.theorem is not None
    c = cost.cost(found.best.theorem, hardware="h200", sizes=sizes, dtype="bf16")
    rows = optimise.search(c, top=10**6, relax=True).rows
    chosen = next(r for r in rows if r.tiles == found.best.cost.tiles)
    sms = c.hardware.sms
    assert chosen.programs >= 32  # not the 4 of gq = 1024
    busy = [r for r in rows if r.programs >= sms]
    hbm = c.first.name
    assert chosen.programs >= sms or not any(r.transfers[hbm] <= 1.1 * chosen.transfers[hbm] for r in busy)
    assert chosen.factor == cost.parallel_factor(chosen.programs, sms) and chosen.seconds == rows[0].seconds


def test_parallel_factor_counts_waves() -> None:
    assert cost.parallel_factor(132, 132) == 1 and cost.parallel_factor(264, 132) == 1
    assert cost.parallel_factor(66, 132) == 2  # half the SMs idle
    assert cost.parallel_factor(133, 132) == pytest.approx(2 * 132 / 133)  # a second wave of one program
    assert cost.parallel_factor(1, 132) == 132 and cost.parallel_factor(0, 132) == 1


@pytest.mark.parametrize(("example", "diagram", "theorem", "grouped", "sizes"), [
    ("attention_backward", "attention_backward_kv", "flash_attention_backward_kv", "x", {"q": 1024, "x": 1024}),
    ("attention_backward", "attention_backward_q", "flash_attention_backward_q", "q", {"q": 1024, "x": 1024}),
    ("mlp_backward", "mlp_backward_x", "mlp_backward_x", "t", {"t": 4096, "d": 1024, "f": 4096}),
    # d = 256: the weight pass holds dW1 and dW2 for its hidden units whole along d, 2·d·gf values,
    # within a program's register budget (cost.launch) at d = 256, not at 1024 (tiles of 16)
    ("mlp_backward", "mlp_backward_w", "mlp_backward_w", "f", {"t": 4096, "d": 256, "f": 4096}),
    ("cross_entropy_backward", "cross_entropy_backward", "cross_entropy_backward", "t", {"t": 4096, "v": 32768})])
def test_derive_finds_backward_schedules(example: str, diagram: str, theorem: str, grouped: str,
                                         sizes: dict[str, int]) -> None:
    """The backward passes of examples/*_backward.ncd: derive finds schedules no costlier than
    the hand proofs of proofs/*_backward.ncd (attention: keys grouped and queries streamed for
    dK, dV, the other way round for dQ; the MLP: tokens grouped for dX, hidden units for the
    weights; cross-entropy: elementwise from the saved LSE), and `napkin cost` prices them."""
    cost_fn = derive.model_cost("h100", "bf16", sizes)
    found = derive.derive(EXAMPLES / f"{example}.ncd", diagram, cost_fn, settings={"hardware": "h100"}, seconds=600)
    hand = cost_fn(proof.theorem(ROOT / "proofs" / f"{example.replace('attention', 'flash_attention')}.ncd", theorem))
    assert found.best.cost is not None and hand.fits
    assert found.best.cost.value <= hand.value * (1 + 1e-9)
    assert ("group", grouped) in [(k, a) for k, a, _ in partitions(found)]


# ---- split reductions (issue 29; README "Split reductions") --------------------------------------


def _decoding(tmp_path: Path, x: int) -> tuple[derive.Derivation, Path]:
    """derive of one-query attention over ``x`` keys on the h200, written and checked."""
    found = derive.derive(EXAMPLES / "attention.ncd", "attention", derive.model_cost("h200", "bf16", {"q": 1, "x": x}),
                          settings={"hardware": "h200"}, seconds=600)
    out = tmp_path / f"decode_{x}.ncd"
    assert derive.write(found, out).ok
    return found, out


@pytest.mark.slow
def test_decoding_derives_a_split_that_checks_costs_and_lowers(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 29's done-when: one query over 32768 keys on the h200.  Unsplit, the grid is one
    program on 132 SMs; the cost model alone picks the split (no rule knows decoding): ragged blocks
    of ⌈32768/132⌉ = 249 keys, one program per SM (whole power-of-two chunks would leave 128), far
    cheaper than every unsplit plan and the unfused diagram; the written proof checks --strict,
    `napkin cost` shows both kernels and the combine's traffic, and the plan at its derived tiles
    lowers on both targets, matches the evaluator at ragged sizes and cross-lowers for CUDA."""
    import jax

    from napkin_cat.lower import lower
    from tests.test_crosslower import TRITON_CALL, cuda_hlo

    found, out = _decoding(tmp_path, 32768)
    best = found.best
    assert best.theorem is not None and best.cost is not None
    split = best.theorem.schedule.split
    assert split is not None and split.axis == "x" and split.via == "online_softmax" and split.pad
    c = cost.cost(best.theorem, hardware="h200", sizes={"q": 1, "x": 32768}, dtype="bf16")
    row = optimise.search(c, top=1, relax=True).rows[0]
    assert row.tiles == best.cost.tiles and dict(row.tiles)[str(split.tile)] == 249
    assert row.programs >= c.hardware.sms == 132  # one wave, every SM one block; the longest holds 249 keys
    assert row.factor == pytest.approx(cost.parallel_factor(row.programs, c.hardware.sms) * 132 * 249 / 32768)
    unsplit = [k for k in found.search.candidates if k.ok and k.theorem and k.theorem.schedule.split is None]
    assert unsplit and all(k.cost and best.cost.value * 10 < k.cost.value for k in unsplit)
    whole = [k for k in found.search.candidates if k.ok and k.cost and k.theorem and k.theorem.schedule.split
             and not k.theorem.schedule.split.pad]  # blocks of whole chunks: 128 programs
    assert whole and all(best.cost.value < k.cost.value for k in whole if k.cost)
    baseline = found.search.baseline.cost
    assert baseline is not None and best.cost.value < baseline.value  # the unfused diagram, launches counted
    assert main(["check", "--strict", str(out)]) == 0
    capsys.readouterr()
    assert main(["cost", str(out), "attention_derived", "--hardware", "h200", "--size", "q=1",
                 "--size", "x=32768"]) == 0
    report = capsys.readouterr().out
    assert "partial states" in report and "written and read back" in report and "2 launches" in report
    bench = (ROOT / "benchmarks" / "decode_h200.ncd").read_text(encoding="utf-8")  # the CPU benchmark's plan

    def steps(text: str) -> list[str]:
        return [line.strip() for line in text.split("{", 1)[1].split("}", 1)[0].splitlines() if line.strip()]

    assert steps(bench.split("theorem", 1)[1]) == steps(out.read_text(encoding="utf-8").split("\ntheorem", 1)[1])

    thm, tiles = best.theorem, dict(best.cost.tiles)
    diagram = load(EXAMPLES / "attention.ncd").diagram("attention")
    rng = np.random.default_rng(1)
    for x in (1000, 3 * 249 + 1):  # no block or chunk divides them
        q, k, v = (rng.standard_normal((n, 64)).astype(np.float32) for n in (1, x, x))
        want = np.asarray(run(diagram, q, k, v))
        for target in ("jax", "pallas"):
            fn = lower(thm, target=target, tiles=tiles).fn
            got = np.asarray(fn(q, k, v, interpret=True) if target == "pallas" else fn(q, k, v))
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    specs = [jax.ShapeDtypeStruct((n, 64), jax.numpy.bfloat16) for n in (1, 32768, 32768)]
    fn = lower(thm, target="pallas", tiles=tiles, dtype="bfloat16", hardware="h200").fn
    assert cuda_hlo(fn, *specs).count(TRITON_CALL) == 1


@pytest.mark.slow
def test_a_long_prompt_keeps_the_unsplit_flash_attention() -> None:
    """At q = x = 16384 the query tiles alone fill the h200: a split was considered (and would
    have cost its partial states' traffic) but the unsplit FlashAttention schedule wins."""
    sizes = {"q": 16384, "x": 16384}
    found = derive.derive(EXAMPLES / "attention.ncd", "attention", derive.model_cost("h200", "bf16", sizes),
                          settings={"hardware": "h200"}, seconds=600)
    assert found.best.theorem is not None and found.best.theorem.schedule.split is None
    assert partitions(found) == [("group", "q", None), ("stream", "x", "online_softmax")]
    splits = [k for k in found.search.candidates if k.ok and k.theorem and k.theorem.schedule.split is not None]
    assert splits and found.best.cost is not None
    assert all(k.cost and found.best.cost.value < k.cost.value for k in splits)


#: candidates each search of the sweep below prices (the rewrite search, then the fusion boundaries'):
#: enough for the flash plans of attention, mha and the masked variants (16 left mha unscheduled)
EXAMPLE_BUDGET = 32


def _example_diagrams() -> list[tuple[str, str]]:
    return [(path.name, d.name) for path in sorted(EXAMPLES.glob("*.ncd")) for d in load(path).diagrams]


@pytest.mark.slow
@pytest.mark.parametrize(("example", "diagram"), _example_diagrams())
def test_every_example_diagram_derives_a_plan_that_lowers_on_both_targets(example: str, diagram: str) -> None:
    """Issue 29: every plan derive returns lowers, splits and fusion boundaries among the candidates
    (every symbolic axis 512 on the h100: mlp's hidden axis is split there), and none is modelled
    slower than the unfused diagram, which is always a candidate."""
    from napkin_cat.lower import lower

    path = EXAMPLES / example
    sizes = {a: 512 for a, n in derive.axes_of(path, diagram).items() if n is None}
    unfused = derive.unfused_cost("h100", "bf16", sizes)
    # a budget of candidates: the claim holds for whatever plan the search returns when it stops
    # (the unfused diagram is a candidate from the start), so the plan tested is the same on every
    # machine fast enough to price EXAMPLE_BUDGET candidates in the 30 s cap (a masked diagram's first
    # flash candidates take seconds each to price: on a busy machine the cap stops it after a dozen),
    # and the diagrams with many rewrites (mha, alibi_mha, gqa) stop at the budget, not at the cap
    found = derive.derive(path, diagram, derive.model_cost("h100", "bf16", sizes), budget=EXAMPLE_BUDGET,
                          seconds=30, unfused=unfused, launch_overhead=4e-6)
    best = found.best
    assert best.ok and best.theorem is not None and best.cost is not None
    plain = kernel.unfold(kernel.refl(diagram, load(path).diagram(diagram)))
    assert best.cost.value <= unfused(plain).value * (1 + 1e-9)
    for target in ("jax", "pallas"):
        lower(best.theorem, target=target, tiles=dict(best.cost.tiles))


# ---- scans: the chunked schedule proposed --------------------------------------------------------


def test_scan_candidates_are_axes_only_scans_mix() -> None:
    """An axis is a `scan` candidate where every box weaves it but the scans along it (cumsum, linrec);
    a box that consumes it (`sum[t]`) or mixes it otherwise (`softmax[t]`) leaves none, and the plan
    writes the scan after the groups, at the outer level only."""
    m = load(EXAMPLES / "scans.ncd")
    for name in ("linear_attention", "linear_attention_mha", "ssd", "ssd_mha"):
        assert moves.scan_axes(kernel.unfold(kernel.refl(name, m.diagram(name))).result) == ("t",)
    for body, out in (("sum[t](cumsum[t](X))", "d"), ("cumsum[t](softmax[t](X))", "t d"), ("cumsum[d](X)", "t d")):
        other = loads(f"axis t, d\ndiagram f(X: [t d]) -> [{out}] {{\n  return {body}\n}}\n").diagram("f")
        assert "t" not in moves.scan_axes(other)
    diagram = kernel.unfold(kernel.refl("ssd_mha", m.diagram("ssd_mha"))).result
    steps = moves.plan_steps(moves.Plan(("b", "h"), scans=("t",), levels=2), diagram)
    assert [(s.kind, s.axis, s.level) for s in steps if isinstance(s, Partition)] == [
        ("group", "b", "smem"), ("group", "h", "smem"), ("scan", "t", "smem"), ("group", "h", "reg")]
    assert any(p.scans == ("t",) for p in moves.starts(diagram))


@pytest.mark.slow
def test_linear_attention_derives_the_chunked_scan_that_checks_and_lowers(tmp_path: Path) -> None:
    """Issue 29: derive proposes `scan` for a running state.  Causal linear attention with heads
    (d = e = 16, 2048 positions, the h200) unfused writes the (t d e) state to hbm; the derived plan
    scans t in chunks, a fraction of the unfused time; its proof checks --strict, and the plan
    derived at a ragged length (padded) lowers on both targets and matches a sequential float64
    recurrence at a length no chunk divides."""
    from napkin_cat.lower import lower

    path = EXAMPLES / "scans.ncd"
    plans = {}
    for t in (2048, 2047):
        sizes = {"b": 2, "h": 16, "t": t, "d": 16, "e": 16}
        found = derive.derive(path, "linear_attention_mha", derive.model_cost("h200", "bf16", sizes),
                              settings={"hardware": "h200"}, seconds=600)
        thm, best = found.best.theorem, found.best.cost
        assert thm is not None and best is not None
        assert ("scan", "t") in [(p.kind, p.axis) for p in thm.schedule.partitions]
        baseline = found.search.baseline.cost
        assert baseline is not None and best.value * 2 < baseline.value
        out = tmp_path / f"la_{t}.ncd"
        assert derive.write(found, out).ok
        assert main(["check", "--strict", str(out)]) == 0
        plans[t] = found
    ragged = plans[2047].best
    assert ragged.theorem is not None and ragged.cost is not None
    assert all(p.pad for p in ragged.theorem.schedule.partitions if p.kind == "scan")
    tiles = {name: {"c": 16}.get(name[0], 1) for name in ragged.cost.tiles}
    rng = np.random.default_rng(3)
    b, h, t, d = 2, 3, 37, 16
    q, k = (rng.standard_normal((b, h, t, d)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((b, h, t, d)).astype(np.float32)
    state = np.cumsum(k.astype(np.float64)[..., :, None] * v.astype(np.float64)[..., None, :], axis=2)
    want = np.einsum("bhtd,bhtde->bhte", q.astype(np.float64), state)
    for target in ("jax", "pallas"):
        fn = lower(ragged.theorem, target=target, tiles=tiles).fn
        got = np.asarray(fn(q, k, v, interpret=True) if target == "pallas" else fn(q, k, v))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_tiles_without_the_preferred_multiples_are_priced_as_padded_to_them() -> None:
    """``optimise.padding``: a tile that lacks a preferred multiple runs as if padded to it, so an
    array's hbm traffic grows by its contiguous tile's ratio and the contraction FLOPs by the worst
    contraction's product of its m, n, k ratios; tiles that meet every multiple cost nothing extra."""
    def rule(*wants: tuple[int, str, str]) -> optimise._TileRule:
        return optimise._TileRule(1, True, 1, [], [], 0, wants)

    rules = {"gp": rule((64, "X", "coalesce"), (8, "S", "n")), "ct": rule((64, "A", "coalesce")),
             "sn": rule((16, "S", "k")), "gq": rule((64, "S", "m"))}
    assert optimise.padding(rules, {"gp": 64, "ct": 128, "sn": 16, "gq": 64}) == roofline.NO_PADDING
    assert optimise.padding(rules, {"gp": 16, "ct": 32, "sn": 16, "gq": 64}) == ((("A", 2.0), ("X", 4.0)), 1.0)
    assert optimise.padding(rules, {"gp": 64, "ct": 64, "sn": 8, "gq": 16}) == ((), 8.0)  # S: k 2x times m 4x
    assert optimise.padding(rules, {"gp": 4, "ct": 64, "sn": 16, "gq": 64}) == ((("X", 16.0),), 2.0)  # n: 4 of 8
    # the loads of each array grow by its own factor, the rest of the traffic by the largest of the others
    pad = roofline.Padding((("L", 32.0), ("O", 2.0)))
    assert pad.moved(1000.0, [("Z", 600.0, 600.0), ("L", 10.0, 10.0)]) == (600 + 320 + 390 * 2, [600, 600, 320, 320])
