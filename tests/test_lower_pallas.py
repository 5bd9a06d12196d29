"""The Pallas target (napkin_cat.lower.pallas), run with ``interpret=True`` on CPU.

Every theorem of proofs/ and of tests/lower_cases.EXTRA is lowered and run against the
float64 evaluator at ragged sizes (padding and masking must leave no NaN and no garbage),
in f32 and, for a subset, bf16.  Sizes stay below 100 with 32-wide tiles: interpret mode
discharges the grid into an XLA loop, which is slow for many small blocks.
"""

from __future__ import annotations

import ast
import os
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

import napkin_cat
from napkin_cat import certify, kernel, loads, ops, run
from napkin_cat.certify import accumulators
from napkin_cat.diagnostics import NapkinError
from napkin_cat.lower import lower, realised_schedule
from napkin_cat.proof import check_file, check_module, theorem
from napkin_cat.schedule.layout import padding_law
from napkin_cat.terms import Box, Partition, Var
from tests import lower_cases as cases
from tests.test_crosslower import TRITON_CALL, cuda_hlo

NAMES = sorted(cases.theorems())


@pytest.mark.parametrize(("name", "extreme"), [(n, None) for n in NAMES] + [
    pytest.param(n, sizes, marks=pytest.mark.slow, id=f"{n}-extreme{label}") for n in cases.extreme_names()
    for label, sizes in (("", (17, 60)), ("-short", (1, 4)))])
def test_theorem_matches_evaluator_f32_ragged(name: str, extreme: tuple[int, int] | None) -> None:
    """Every theorem at ragged sizes on normal inputs; every f32 kernel of proofs/ also on
    extreme ones (issue 28: inputs scaled until the scores reach |S| ~ 10⁴, causal rows whose
    tiles are fully masked), at sizes 17 to 59 and 1 to 3 (one key: a backward's S - L is rounding
    noise beside its terms), within the bound README states (``cases.extreme_tolerance``)."""
    thm = cases.theorems()[name]
    if extreme is not None:
        sizes, arrays, largest = cases.extreme_inputs(thm, len(name) + 7, *extreme)
        tol = cases.extreme_tolerance(thm, largest)
    else:
        sizes, arrays = cases.inputs(thm, seed=len(name) + 7)
        tol = cases.tolerance(thm)
    fn = lower(thm, target="pallas", tiles=cases.TILES).fn
    got = cases.as_tuple(jax.jit(lambda *a: fn(*a, interpret=True))(*[jnp.asarray(a, jnp.float32) for a in arrays]))
    for out, want in zip(got, cases.reference(thm, arrays, sizes), strict=True):
        assert out.dtype == jnp.float32
        if extreme is not None:  # an exp past f32's range is ±inf in both
            assert cases.agrees(np.asarray(out, np.float64), want, tol), name
        else:
            assert cases.relative_error(out, want) < tol


def test_the_docstring_states_the_padding_law_of_each_axis_the_theorem_does_not_pad() -> None:
    """Issue 28: a Pallas kernel pads an axis its tiles do not divide (the theorem assumes `sx | x`) with the
    fills of the boxes that consume it; its docstring says how each such padding law is certified, from the
    kernel's oracle (``layout.padding_law``): proved, tested, or not checked (a mixing box's kernel rule)."""
    def padding(name: str, target: str = "pallas") -> list[str]:
        source = lower(cases.theorems()[name], target=target, tiles=cases.TILES).source
        return [line for line in source.splitlines() if line.strip().startswith("Padding (")]

    (flash,) = padding("flash_attention")
    assert "O = ncontract[x] (fills -inf, 0): proved (accumulator online_softmax: proved: laws" in flash
    (grouped,) = padding("grouped_wide")
    assert "softmax[x] (fills -inf): not checked (a kernel rule, MIX_FILL" in grouped
    assert padding("tiled_matmul_padded") == []  # `pad` on every consumed axis: the trust line states its law
    assert padding("flash_attention", "jax") == []  # plain JAX runs the ragged last chunk: nothing is padded
    weights = Box("ncontract", (Var("X0", ("q", "x")), Var("X1", ("x", "d"))), ("q", "d"), ("x",), (),
                  ("exp", "relu", "id"))
    assert padding_law(weights, "x").startswith("tested (accumulator normalised: tested: ")


@pytest.mark.slow
def test_a_padding_law_is_proved_wherever_its_accumulators_laws_are() -> None:
    """Issue 28: a kernel pads an axis the theorem does not (``layout.padding_law``); for every family of
    consuming boxes (each ncontract weight with a zero, each denominator) whose accumulator's laws are proved
    without padding, the padding law is proved too: so a kernel never rests on a padding law weaker than the
    accumulator its theorem streams with (found so, this pins it)."""
    s, v = Var("X0", ("q", "x")), Var("X1", ("x", "d"))
    boxes = [Box(op, (s,), ("q",), ("x",)) for op in ("sum", "mean", "max", "min", "prod", "logsumexp")]
    boxes += [Box("contract", (s, v), ("q", "d"), ("x",))]
    weights = ("id", "square", "abs", "tanh", "relu", "silu", "gelu", "sigmoid", "exp")
    boxes += [Box("ncontract", (s, v), ("q", "d"), ("x",), (), (a1, a2, b))
              for a1 in weights for a2 in weights for b in ("id", "sqrt", "rms")]
    proved = 0
    for box in boxes:
        for name in ops.accumulators_for(box.op, box.params):
            unpadded = certify.accumulator(box, "x", name, False)
            if accumulators.plan(box, "x", name).pad is None or not unpadded.startswith("proved"):
                continue
            proved += 1
            assert padding_law(box, "x", name).startswith(f"proved (accumulator {name}: "), (box, name)
    assert proved >= 16, proved  # as many as were proved when this was written: the check is not vacuous


def test_dtype_steps_store_arrays_in_their_format() -> None:
    """`dtype K, V, S as bf16`: K and V are stored in bf16, S rounded to bf16 in the kernel."""
    src = lower(cases.theorems()["flash_wide_bf16_kv"], target="pallas", tiles=cases.TILES).source
    assert "pad_to(K, (p['x'], p['d']), jnp.bfloat16)" in src and "pad_to(Q, (p['q'], p['d']), jnp.float32)" in src
    assert ".astype(jnp.bfloat16).astype(jnp.float32)" in src


@pytest.mark.parametrize("name", ["flash_attention_causal", "tiled_matmul_padded", "streamed_cross_entropy_index",
                                  "flash_mha", "flash_wide"])
def test_theorem_matches_evaluator_bf16(name: str) -> None:
    thm = cases.theorems()[name]
    sizes, arrays = cases.inputs(thm, seed=5)
    fn = lower(thm, target="pallas", tiles=cases.TILES, dtype="bfloat16").fn
    got = cases.as_tuple(fn(*[jnp.asarray(a, jnp.bfloat16) for a in arrays]))  # interpret: auto on CPU
    for out, want in zip(got, cases.reference(thm, arrays, sizes), strict=True):
        assert out.dtype == jnp.bfloat16
        assert cases.relative_error(out, want) < cases.BF16_TOL


@pytest.mark.parametrize("name", cases.GOLDEN_NAMES)
def test_golden_source(name: str) -> None:
    cases.check_golden(name, "pallas", lower(cases.theorems()[name], target="pallas", tiles=cases.TILES).source)


def _code(source: str) -> str:
    """A generated module without its docstrings (they quote the proof's trust line)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef)) and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant):
            node.body = node.body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def test_kernel_structure_follows_the_schedule() -> None:
    """Groups become the grid, woven batch/heads squeezed grid axes, the stream a fori_loop."""
    lowered = lower(cases.theorems()["flash_mha"], target="pallas")
    src = lowered.source
    # the query blocks first: the fastest program id, so programs running together share K and V
    assert lowered.layout.grid == ("q", "b", "h") and lowered.layout.squeezed == {"b", "h"}
    assert "pl.BlockSpec((None, None, 128, p['d'])" in src
    assert "lax.fori_loop(0, p['x'] // 64" in src and "pl.ds(x_first, 64)" in src
    assert "preferred_element_type=jnp.float32" in src
    assert "-inf" not in _code(src) and "inf)" not in _code(src)  # finite masks only (docstrings may name -inf)


def test_non_power_of_two_tiles_are_padded_per_tile() -> None:
    """group a by 48: each 48-row tile is stored as a 64-row block (Triton needs powers of two)."""
    lowered = lower(cases.theorems()["tiled_matmul_padded"], target="pallas")
    assert lowered.layout.padded_tiles == {"a"}
    assert "split_tiles(" in lowered.source and "merge_tiles(" in lowered.source
    a, b = np.random.default_rng(2).standard_normal((2, 100, 70))
    got = lowered.fn(jnp.asarray(a, jnp.float32), jnp.asarray(b.T, jnp.float32))
    assert cases.relative_error(got, a @ b.T) < cases.F32_TOL


BATCHED = loads("""
axis t, b, f
axis c = 16
diagram mid_batch(X: [t b c], W: [c f]) -> [b t f] {
  return contract[c](X, W)
}
theorem small_tiles: mid_batch {
  group b by 3 pad
  group t by 12 pad
}
theorem batch_pairs: mid_batch {
  group b by 2 pad
  group t by gt
  group f by gf
}
theorem woven_columns: mid_batch {
  group b by 2 pad
  group t by gt
}
diagram patch(X: [t c b], W: [c b f]) -> [t f] {
  return contract[c b](X, W)
}
theorem tiled_patch: patch {
  group t by gt
  group f by gf
}
""")
BATCHED_THEOREMS = {r.name: r.theorem for r in check_module(BATCHED)}


def test_several_padded_tiles_merge_back_in_order() -> None:
    """Regression: with two grouped axes stored as padded blocks (b by 3, t by 12), the output
    tiles were merged right to left at unshifted positions: wrong shape, wrong values."""
    lowered = lower(BATCHED_THEOREMS["small_tiles"], target="pallas")
    assert lowered.layout.padded_tiles == {"b", "t"}
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((23, 3, 16)), rng.standard_normal((16, 5))
    got = lowered.fn(jnp.asarray(x, jnp.float32), jnp.asarray(w, jnp.float32))
    assert cases.relative_error(got, np.einsum("tbc,cf->btf", x, w)) < cases.F32_TOL


@pytest.mark.parametrize("name", ["batch_pairs", "tiled_patch"])
def test_dots_with_several_free_or_contracted_axes_are_two_dimensional(name: str) -> None:
    """Regression: a batch tile [b t c] times [c f], or a contraction over [c b],
    emitted a 3-D dot that the Triton backend refuses ("a and b must be 2D"); the axis
    groups are merged into rows, columns and the contracted dimension."""
    thm = BATCHED_THEOREMS[name]
    lowered = lower(thm, target="pallas", tiles={"gt": 32, "gf": 32})
    assert ".reshape((" in lowered.source
    shapes = {"t": 40, "b": 3, "c": 16, "f": 36}
    specs = [jax.ShapeDtypeStruct(tuple(shapes[a] for a in p.axes), jnp.float32) for p in thm.result.inputs]
    assert TRITON_CALL in cuda_hlo(lowered.fn, *specs)
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(s.shape) for s in specs]
    got = lowered.fn(*(jnp.asarray(a, jnp.float32) for a in arrays))
    assert cases.relative_error(got, cases.reference(thm, arrays, shapes)[0]) < cases.F32_TOL


def test_small_power_of_two_group_tiles_are_blocks_unless_a_dot_needs_more() -> None:
    """Two batch elements per program were stored as blocks of 16 (8x the work): a tile of 2
    is a Triton block; only a dot dimension made of nothing else must reach 16."""
    lowered = lower(BATCHED_THEOREMS["batch_pairs"], target="pallas", tiles={"gt": 32, "gf": 32})
    assert lowered.layout.padded_tiles == frozenset() and "pl.BlockSpec((32, 2, p['c'])" in lowered.source
    lonely = loads("axis b, t, f\naxis c = 16\n"
                   "diagram rows(X: [b c], W: [c f]) -> [b f] { return contract[c](X, W) }\n"
                   "theorem pairs: rows {\n  group b by 2 pad\n  group f by gf\n}\n")
    thm = check_module(lonely)[0].theorem
    assert lower(thm, target="pallas", tiles={"gf": 32}).layout.padded_tiles == {"b"}  # a dot's rows alone


def test_default_tiles_cost_the_kernel_with_woven_axes_on_the_grid() -> None:
    """Regression: the Pallas kernel puts f (woven everywhere, not partitioned) on the grid
    with blocks of one, but the default tiles were costed with f whole in every program, so
    the search chose gt = 4 (a 16-row block with 4 rows used)."""
    thm = BATCHED_THEOREMS["woven_columns"]
    realised = realised_schedule(thm.result, thm.schedule, "pallas")
    assert Partition("group", "f", 1) in realised.partitions
    assert realised_schedule(thm.result, thm.schedule, "jax").partitions == ()  # no stream: plain JAX runs it whole
    lowered = lower(thm, target="pallas", hardware="h200")
    assert lowered.layout.squeezed == {"f"} and lowered.tiles["gt"] >= 16


@pytest.mark.parametrize("empty", ["q", "x"])
def test_an_empty_axis_gives_what_the_jax_target_gives(empty: str) -> None:
    """Regression: a zero-length axis (no queries, or no keys) made a grid of no programs or a
    block larger than its array, and JAX failed with "slice_sizes must be less than or equal
    to operand shape"; one padded tile is run and sliced away."""
    thm = cases.theorems()["flash_attention_causal"]
    sizes = {"q": 0 if empty == "q" else 20, "x": 0 if empty == "x" else 20, "d": 64}
    args = [jnp.ones(tuple(sizes[a] for a in p.axes), jnp.float32) for p in thm.result.inputs]
    got = lower(thm, target="pallas", tiles={"gq": 16, "sx": 16}).fn(*args)
    want = lower(thm, target="jax", tiles={"gq": 16, "sx": 16}).fn(*args)
    assert got.shape == want.shape == (sizes["q"], 64)
    assert np.array_equal(np.asarray(got), np.asarray(want))


def test_fully_masked_rows_and_tiles_stay_finite() -> None:
    """Causal attention with more queries than keys: key tiles beyond the diagonal are fully
    masked for early rows and the last tiles are padding; nothing may become NaN."""
    thm = cases.theorems()["flash_attention_causal"]
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((70, 64)), rng.standard_normal((33, 64)), rng.standard_normal((33, 64))
    got = lower(thm, target="pallas", tiles={"gq": 16, "sx": 16}).fn(*(jnp.asarray(t, jnp.float32) for t in (q, k, v)))
    want = cases.reference(thm, [q, k, v], {"q": 70, "x": 33})[0]
    assert cases.relative_error(got, want) < cases.F32_TOL


def test_head_dimension_not_a_power_of_two_is_padded() -> None:
    lowered = lower(cases.theorems()["flash_wide"], target="pallas", tiles={"gq": 32, "sx": 32})
    assert "pow2_extent(n['d'], 16)" in lowered.source
    q = jnp.ones((40, 80))
    assert lowered.fn(q, q, q).shape == (40, 80)


def test_refused_before_running() -> None:
    """What the Triton backend cannot serve is refused at lowering time, not at run time."""
    with pytest.raises(NapkinError) as err:
        lower(cases.proved("axis t, v\ndiagram f(X: [t v]) -> [t] { return sum[v](X) }", "f", "stream v by 24 via sum"),
              target="pallas")
    assert err.value.codes == ("lower.tile_pow2",)
    assert "power-of-two" in str(err.value)
    prod = "axis t, v\ndiagram p(X: [t v]) -> [t] { return prod[v](X) }"
    with pytest.raises(NapkinError) as err:
        lower(cases.proved(prod, "p", "group t by 16"), target="pallas")
    assert err.value.codes == ("lower.triton_op",)  # Triton has no reduce_prod; the jax target serves it
    # regression: the diagnostic named the generated node `t.1` and had no source position
    diag = err.value.diagnostics[0]
    assert diag.message.startswith("`prod[v]` (prod)") and diag.span is not None and diag.span.line == 2
    x = np.random.default_rng(0).uniform(0.5, 1.5, (20, 30))
    got = lower(cases.proved(prod, "p", "stream v by 16 via prod"), target="jax").fn(jnp.asarray(x))
    assert cases.relative_error(got, x.prod(axis=1)) < cases.F32_TOL


def test_a_split_of_a_padded_axis_is_refused_with_a_way_out() -> None:
    """Windowed pooling splits a whole (padded) axis: refused at the split, with where to
    reshape instead; the jax target runs it."""
    pool = cases.proved("axis t, l, lo\naxis li = 4\n"
                        "diagram pool(X: [t l]) -> [t lo] { return max[li](split[l -> lo li](X)) }", "pool",
                        "group t by 16")
    with pytest.raises(NapkinError) as err:
        lower(pool, target="pallas")
    diag = err.value.diagnostics[0]
    assert diag.code == "lower.reshape_padded" and diag.span is not None and "already split" in str(diag.hint)
    x = np.random.default_rng(1).standard_normal((20, 12))
    got = lower(pool, target="jax").fn(jnp.asarray(x, jnp.float32))
    assert cases.relative_error(got, x.reshape(20, 3, 4).max(axis=2)) < cases.F32_TOL


def test_rename_of_a_padded_axis() -> None:
    """rename keeps the extent, so the renamed axis is padded and masked like the original."""
    rename = "axis t, v, w\ndiagram r(X: [t v]) -> [t] { return sum[w](exp(rename[v -> w](X))) }"
    fn = lower(cases.proved(rename, "r", "group t by 16"), target="pallas").fn
    x = np.random.default_rng(1).standard_normal((20, 30))
    assert cases.relative_error(fn(jnp.asarray(x, jnp.float32)), np.exp(x).sum(axis=1)) < cases.F32_TOL


def test_interpret_false_on_cpu_is_jax_error() -> None:
    """``interpret=False`` asks for the GPU backend; on CPU jax itself refuses ("Only interpret mode is supported")."""
    if jax.default_backend() == "gpu":
        pytest.skip("a GPU is present")
    fn = lower(cases.theorems()["tiled_matmul"], target="pallas", tiles=cases.TILES).fn
    with pytest.raises(Exception, match="interpret mode"):
        fn(jnp.ones((16, 16)), jnp.ones((16, 16)), interpret=False)


@pytest.mark.parametrize("target", ["pallas", "jax"])
def test_stream_over_an_axis_no_box_consumes(target: str) -> None:
    """A stream that nothing consumes is a sequential group: outputs are written per chunk,
    beside accumulators of other outputs."""
    text = "axis t, v\ndiagram f(X: [t v], Y: [v]) -> [t v], [t] { return exp(X) * Y, sum[v](X) }"
    fn = lower(cases.proved(text, "f", "group t by 16", "stream v by 16 via sum"), target=target).fn
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((37, 21)), rng.standard_normal(21)
    scaled, total = fn(jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32))
    assert cases.relative_error(scaled, np.exp(x) * y) < cases.F32_TOL
    assert cases.relative_error(total, x.sum(axis=1)) < cases.F32_TOL


def test_bf16_dot_feeding_a_transpose_runs_in_interpret_mode() -> None:
    """Regression: a bf16 x bf16 -> f32 dot whose result is transposed crashed XLA:CPU in
    interpret mode (no DotThunk for that type); interpreting, operands are rounded to bf16
    and multiplied in f32 (the same products), on a GPU they stay bf16."""
    module = loads("axis q = 40\naxis x = 37\naxis d = 80\n"
                   "diagram t(Q: [q d], K: [x d], V: [x d]) -> [d q] {\n"
                   "  return transpose[d q](contract[x](softmax[x](contract[d](Q, K)), V))\n}\n"
                   "theorem grouped_t: t {\n  group q by 32 pad\n}\n")
    thm = check_module(module)[0].theorem
    lowered = lower(thm, target="pallas", dtype="bfloat16")
    assert "jnp.float32 if interpret else jnp.bfloat16" in lowered.source
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((40, 80)), rng.standard_normal((37, 80)), rng.standard_normal((37, 80))
    got = lowered.fn(*[jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)], interpret=True)
    want = cases.reference(thm, [q, k, v], {"q": 40, "x": 37, "d": 80})[0]
    assert got.dtype == jnp.bfloat16 and cases.relative_error(got, want) < cases.BF16_TOL


def _masked_theorem(name: str) -> Any:
    """A causal or sliding-window theorem: from proofs/, or tests/generic/attention_variants.ncd."""
    if name in cases.theorems():
        return cases.theorems()[name]
    results = check_file(cases.ROOT / "tests" / "generic" / "attention_variants.ncd")
    return next(r.theorem for r in results if r.name == name)


@pytest.mark.parametrize(("name", "q", "x", "tiles"), [
    ("flash_attention_causal", 100, 77, {"gq": 32, "sx": 32}),  # q > x: ragged x, rows past the keys
    ("flash_attention_causal", 40, 97, {"gq": 16, "sx": 32}),   # q < x, query and key tiles differ
    ("flash_attention_causal", 70, 90, {"gq": 32, "sx": 16}),   # a query tile spans two key chunks
    ("flash_window", 77, 100, {"gq": 32, "sx": 32}),             # the window's lower bound skips too
    ("flash_window", 50, 83, {"gq": 16, "sx": 16}),
])
def test_masked_chunks_are_skipped_soundly(name: str, q: int, x: int, tiles: dict[str, int]) -> None:
    """Chunks a mask fills with -inf (online_softmax's pad) are skipped: the loop bounds
    depend on the program's query offset; the chunks the mask holds on entirely run a body
    without it (``skip.Runs.full``); and the result still matches the evaluator.  The
    causal mask has no lower bound, so no loop runs masked chunks before the unmasked ones
    (an empty loop Triton still compiles and gives registers); the window's has one."""
    thm = _masked_theorem(name)
    lowered = lower(thm, target="pallas", tiles=tiles)
    assert "lax.fori_loop(full_end, end_chunk, body," in lowered.source
    assert lowered.source.count("lax.fori_loop(") == (3 if name == "flash_window" else 2)
    assert ("full_first" in lowered.source) == (name == "flash_window")
    assert "end_chunk = " in lowered.source and "q_first" in lowered.source.split("end_chunk = ")[1].split("\n")[0]
    kept = lowered.source.split("def body_2(")[1].split("return")[0]
    assert "q_first" not in kept and "q_first" in lowered.source.split("def body(")[1].split("return")[0]
    sizes = {a.name: a.size or 24 for a in thm.result.axes} | {"q": q, "x": x}
    rng = np.random.default_rng(q + x)
    arrays = [rng.standard_normal([sizes[a] for a in p.axes]) for p in thm.result.inputs]
    got = lowered.fn(*[jnp.asarray(a, jnp.float32) for a in arrays], interpret=True)
    want = cases.reference(thm, arrays, sizes)[0]
    assert cases.relative_error(got, want) < cases.F32_TOL


def test_a_causal_kernel_with_two_accumulators_has_two_loops() -> None:
    """The training forward (output and log-sum-exp) folds its chunk range through two
    accumulators, so the range's start is an expression, not the literal 0: the masked loop
    before the diagonal's run is left out all the same (its range is empty)."""
    thm = theorem(cases.ROOT / "proofs" / "flash_attention_backward.ncd", "flash_attention_causal_forward")
    source = lower(thm, target="pallas", tiles={"gq": 32, "sx": 32}).source
    assert source.count("lax.fori_loop(") == 2 and "full_first" not in source


def test_unmasked_or_unrecognised_loops_run_every_chunk() -> None:
    """No mask feeding the accumulator, or a disjunction with a disjunct that bounds no key
    (rows below 5 see every key): the loops run every chunk, ``(0, chunks)``; the disjunction's
    other disjunct still holds on the chunks below the diagonal, which run without the mask."""
    plain = lower(cases.theorems()["flash_attention"], target="pallas", tiles=cases.TILES).source
    module = loads("axis q, x, d\ndiagram f(Q: [q d], K: [x d], V: [x d]) -> [q d] {\n"
                   "  S = contract[d](Q, K)\n  P = softmax[x](where[q x](q >= x or q < 5, S, -inf))\n"
                   "  O = contract[x](P, V)\n  return O\n}\n"
                   "theorem t: f {\n  rewrite softmax_contract at P, O\n  group q by gq\n"
                   "  stream x by sx via online_softmax\n}\n")
    results = check_module(module)
    assert results[0].theorem is not None, results[0].failure
    disjunction = lower(results[0].theorem, target="pallas", tiles=cases.TILES).source
    assert "lax.fori_loop(0, p['x'] // 32" in plain and "end_chunk" not in plain
    assert "lax.fori_loop(0, full_end, body_2," in disjunction and "end_chunk" not in disjunction
    assert "lax.fori_loop(full_end, p['x'] // 32, body," in disjunction


def test_several_masked_accumulators_loop_over_the_union_of_their_ranges() -> None:
    """A causal softmax-contract and a max under a window mask: the loops run over the union
    of their ranges (the diagonal's, then what the window's adds past it, here nothing), as
    for a disjunction, and both results stay exact."""
    module = loads("axis q, x, d\ndiagram f(Q: [q d], K: [x d], V: [x d]) -> [q d], [q] {\n"
                   "  S = contract[d](Q, K)\n  P = softmax[x](where[q x](q >= x, S, -inf))\n"
                   "  O = contract[x](P, V)\n  W = where[q x](q - x < 8, S, -inf)\n  return O, max[x](W)\n}\n"
                   "theorem t: f {\n  rewrite softmax_contract at P, O\n  group q by gq\n"
                   "  stream x by sx via online_softmax\n}\n")
    thm = check_module(module)[0].theorem
    lowered = lower(thm, target="pallas", tiles={"gq": 16, "sx": 16})
    assert "run_first_2 = jnp.maximum(" in lowered.source and "in_order = " in lowered.source
    rng = np.random.default_rng(11)
    arrays = [rng.standard_normal(shape) for shape in [(50, 24), (70, 24), (70, 24)]]
    got = lowered.fn(*[jnp.asarray(a, jnp.float32) for a in arrays], interpret=True)
    for out, want in zip(got, cases.reference(thm, arrays, {"q": 50, "x": 70, "d": 24}), strict=True):
        assert cases.relative_error(out, want) < cases.F32_TOL


@pytest.mark.parametrize("target", ["pallas", "jax"])
def test_a_nested_tile_is_named_as_the_compilers_not_given_the_outer_value(target: str) -> None:
    """Regression: with --tile gq=64 --tile wq=48 the docstring said `q: wq = 64`: the register
    tile was shown with the SMEM tile's value, and the 48 the user gave silently vanished (48 is
    now refused: it breaks the theorem's `wq | gq`; 32 keeps the two values apart)."""
    thm = cases.theorems()["flash_attention_two_level"]
    doc = lower(thm, target=target, tiles={"gq": 64, "sx": 64, "wq": 32, "rx": 16}).source
    tiles = next(line for line in doc.splitlines() if "Tiles:" in line)
    assert "q: gq = 64" in tiles and "x: sx = 64" in tiles
    assert "q: wq at reg (not realised: the compiler's)" in tiles and "wq =" not in tiles and "rx =" not in tiles


# issue 18: attention whose values, not scores, are masked; the Pallas kernel skipped the chunks
# above the diagonal because V's fill is V's padding value, though the normaliser still needs them
VALUE_MASKED_DIAGRAM = """
diagram {name}_attention(Q: [q d], K: [x d], V: [x d]) -> [q d] {{
  S = contract[d](Q, K)
  P = {norm}[x](S)
  W = where[q x](q >= x, V, 0)
  O = contract[x](P, W)
  return O
}}
theorem {name}_padded: {name}_attention {{
  rewrite {lemma} at P, O
  group q by gq pad
  stream x by sx via {acc} pad
}}
theorem {name}_derived: {name}_attention {{
  rewrite {lemma} at P, O
  group q by gq at smem
  stream x by sx at smem via {acc}
}}
"""
VALUE_MASKED = loads("axis q, x\naxis d = 16\n" + "".join(
    VALUE_MASKED_DIAGRAM.format(name=name, norm=norm, lemma=lemma, acc=acc) for name, norm, lemma, acc in
    [("softmax", "softmax", "softmax_contract", "online_softmax"), ("l2", "l2norm", "l2_contract", "normalised")]))
VALUE_MASKED_THEOREMS = {r.name: r.theorem for r in check_module(VALUE_MASKED)}


@pytest.mark.parametrize(("name", "q", "x", "tiles"), [
    ("softmax_padded", 32, 64, {"gq": 16, "sx": 16}), ("l2_padded", 32, 64, {"gq": 16, "sx": 16}),
    # what `napkin derive --lower pallas --size q=40 --size x=400` picks for vm and vl: these
    # schedules with gq = 40, sx = 16
    ("softmax_derived", 40, 400, {"gq": 40, "sx": 16}), ("l2_derived", 40, 400, {"gq": 40, "sx": 16}),
])
def test_masked_values_keep_every_chunk(name: str, q: int, x: int, tiles: dict[str, int]) -> None:
    """The kernels matched the evaluator to 0.80 (q=32, x=64) and 0.66 (q=40, x=400) relative
    before chunk skipping asked for an absorbing operand (masks.stream_masks)."""
    thm = VALUE_MASKED_THEOREMS[name]
    assert thm is not None
    rng = np.random.default_rng(q + x)
    arrays = [rng.standard_normal((n, 16)) for n in (q, x, x)]
    got = lower(thm, target="pallas", tiles=tiles).fn(*[jnp.asarray(a, jnp.float32) for a in arrays], interpret=True)
    want = run(thm.source, *arrays)
    assert cases.relative_error(got, want) < cases.F32_TOL


def test_the_cpu_miscompile_workaround_is_on_and_keeps_kernels_exact() -> None:
    """XLA:CPU in jaxlib 0.10.2-0.11.x miscompiles a broadcast-multiply-reduce fusion
    (jax-ml/jax#39103); the differential run found it as Pallas (interpret) kernels off by up
    to 7 where a `where` adds a grouped axis to the values.  Importing napkin_cat switches the
    fusion off (napkin_cat.CPU_WORKAROUND), and this kernel is exact again."""
    assert napkin_cat.CPU_WORKAROUND in os.environ.get("XLA_FLAGS", "")
    thm = cases.proved("axis q, x\naxis d = 4\ndiagram att(Q: [q d], K: [x d], V: [x d]) -> [q d] {\n"
                       "  S = contract[d](Q, K)\n"
                       "  A0 = ncontract[x; id, square, sqrt](where[q x](x > q, S, -2), where[q x](1 < 0, V, -2))\n"
                       "  return A0 * 2\n}", "att", "group q by 4 at smem pad")
    rng = np.random.default_rng(0)
    arrays = [rng.integers(-300, 301, shape) / 100 for shape in ((6, 4), (3, 4), (3, 4))]
    want = run(thm.source, *arrays)
    for target in ("jax", "pallas"):
        fn = lower(thm, target=target).fn
        got = fn(*[jnp.asarray(a, jnp.float32) for a in arrays], **({"interpret": True} if target == "pallas" else {}))
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["pallas", "jax"])
@pytest.mark.parametrize("offset", [1e2, 1e4, 1e6])
def test_exp_of_a_shifted_score_keeps_f32_accuracy_however_large_the_scores(target: str, offset: float) -> None:
    """issue 28: the Pallas kernels wrote exp(S - m) as exp2(S·log2 e - m·log2 e), which rounds
    m·log2 e: 1.7e-2 off at scores near 10⁶.  The difference is now taken first, so scores given
    exactly in f32 (the largest 10⁶ + 10) keep the f32 bound whatever their magnitude."""
    thm = cases.proved("axis q, x, d\ndiagram scored(S: [q x], V: [x d]) -> [q d] {\n  P = softmax[x](S)\n"
                       "  O = contract[x](P, V)\n  return O\n}", "scored",
                       "rewrite softmax_contract at P, O", "group q by gq", "stream x by sx via online_softmax")
    rng = np.random.default_rng(8)
    scores = (offset + 3 * rng.standard_normal((20, 50))).astype(np.float32).astype(np.float64)
    values = rng.standard_normal((50, 8))
    options = {"interpret": True} if target == "pallas" else {}
    fn = lower(thm, target=target, tiles={"gq": 16, "sx": 16}).fn
    got = fn(jnp.asarray(scores, jnp.float32), jnp.asarray(values, jnp.float32), **options)
    assert cases.relative_error(got, cases.reference(thm, [scores, values], {})[0]) < cases.F32_TOL



@pytest.mark.parametrize("target", ["pallas", "jax"])
def test_a_row_of_scores_below_the_guard_is_not_read_as_masked(target: str) -> None:
    """issue 28 (red team rtdeep): the guarded shift max(m, -FLOAT_MAX) was lowered as
    max(m, -BIG) with BIG 0.35 of f32's maximum, so a row whose finite f32 scores all lie
    below -1.19e38 was shifted by -BIG, every weight exp(S + BIG) underflowed to 0 and the
    row read as fully masked: logsumexp -inf for -2e38, softmax's output 0 where the evaluator
    gives V at the row's maximum (relative error 1.0).  BIG is now f32's maximum."""
    scores = np.full((5, 37), -2e38)
    scores[:, 1] = -2.00001e38
    scores[2] = np.linspace(-3.4e38, -1.3e38, 37)
    scores = scores.astype(np.float32).astype(np.float64)
    values = np.arange(37 * 4, dtype=np.float64).reshape(37, 4) / 10
    options = {"interpret": True} if target == "pallas" else {}
    flash = cases.proved("axis q, x, d\ndiagram scored(S: [q x], V: [x d]) -> [q d] {\n  P = softmax[x](S)\n"
                         "  O = contract[x](P, V)\n  return O\n}", "scored",
                         "rewrite softmax_contract at P, O", "group q by gq", "stream x by sx via online_softmax")
    lse = cases.proved("axis q, x\ndiagram lse(S: [q x]) -> [q] {\n  return logsumexp[x](S)\n}", "lse",
                       "group q by gq", "stream x by sx")
    for thm, arrays in ((flash, [scores, values]), (lse, [scores])):
        got = lower(thm, target=target, tiles={"gq": 16, "sx": 16}).fn(*[jnp.asarray(a, jnp.float32) for a in arrays],
                                                                    **options)
        want = cases.reference(thm, arrays, {})[0]
        assert np.all(np.isfinite(want))
        assert cases.relative_error(got, want) < cases.F32_TOL



@pytest.mark.parametrize("target", ["pallas", "jax"])
@pytest.mark.parametrize("scale", [1e-20, 1e-35, 1e25, 5e37])
def test_scale_invariant_weights_of_a_whole_axis_do_not_underflow(target: str, scale: float) -> None:
    """issue 28 (red team rtdeep): l2norm, rmsnorm and an l2 normalised contraction over a whole
    axis computed Σ s² in f32, which underflows to 0 for scores near 1e-20 (and overflows near
    1e25): the kernel gave 0 where the evaluator's weights are of order 1 (relative error 0.58
    to 1.0, on inputs f32 holds as normal numbers).  Weights invariant under scaling are now
    computed on s divided by the row's largest |s| (``jaxops._scale``)."""
    rng = np.random.default_rng(3)
    scores = (rng.standard_normal((5, 37)) * scale).astype(np.float32).astype(np.float64)
    scores[1] = 0.0  # an all-zero row still gives 0
    values = rng.standard_normal((37, 4))
    text = ("axis q, x, d\ndiagram norms(S: [q x], V: [x d]) -> [q x], [q x], [q d] {\n"
            "  return l2norm[x](S), rmsnorm[x](S), ncontract[x; id, square, sqrt](S, V)\n}")
    _assert_whole_axis_matches(text, "norms", target, scores, values)


def _assert_whole_axis_matches(text: str, name: str, target: str, scores: np.ndarray, values: np.ndarray) -> None:
    """``name`` of ``text`` grouped along q (the axis x whole) matches the evaluator on (S, V), each
    output of order 1 or more somewhere."""
    thm = cases.proved(text, name, "group q by gq")
    options = {"interpret": True} if target == "pallas" else {}
    got = lower(thm, target=target, tiles={"gq": 16}).fn(jnp.asarray(scores, jnp.float32),
                                                         jnp.asarray(values, jnp.float32), **options)
    for out, want in zip(got, cases.reference(thm, [scores, values], {}), strict=True):
        assert np.max(np.abs(want)) > 0.1
        assert cases.relative_error(out, want) < cases.F32_TOL


@pytest.mark.parametrize("target", ["pallas", "jax"])
def test_weights_whose_normaliser_passes_two_to_the_126_are_not_flushed(target: str) -> None:
    """issue 28 (red team rtkern2): ``ncontract[x; gelu, gelu, id]`` (or silu, or ``id`` over
    ``gelu``) at scores near 3e36 has z = Σ gelu(s) near 1e38, an f32, and weights near 1/37; XLA
    divides by the row's z as top·(1/z), whose reciprocal past 2^126 is subnormal and flushed to 0
    on XLA:CPU: the kernel gave 0 where the evaluator's output is 0.29 (both targets).  Past 2^126
    both are quartered first (``jaxops._per_row``; the l2 weights' scale too: the test above at 5e37)."""
    rng = np.random.default_rng(8)
    scores = (3e36 * (1.0 + 0.1 * rng.standard_normal((5, 37)))).astype(np.float32).astype(np.float64)
    values = rng.standard_normal((37, 4)).astype(np.float32).astype(np.float64)
    text = ("axis q, x, d\ndiagram big(S: [q x], V: [x d]) -> [q d], [q d], [q d] {\n"
            "  return ncontract[x; gelu, gelu, id](S, V), ncontract[x; silu, silu, id](S, V), "
            "ncontract[x; id, gelu, id](S, V)\n}")
    _assert_whole_axis_matches(text, "big", target, scores, values)


@pytest.mark.parametrize("target", ["pallas", "jax"])
def test_exp_weights_under_a_square_root_normaliser_do_not_overflow(target: str) -> None:
    """issue 28 (red team rtdeep): a whole-axis ``ncontract[x; exp, exp, sqrt]`` (and rms) read
    exp(s) itself, which overflows f32 at s = 89: scores near 95 (|S| far below 10⁴) gave NaN in
    every entry where the evaluator's output is 2.5e21.  It is now computed on s - m, m the row's
    maximum where finite, and the contraction multiplied by exp(m/4) twice (the normaliser's degree,
    1/2, times m; ``jaxops._contract``; past s = 177: the test below)."""
    rng = np.random.default_rng(5)
    values = rng.standard_normal((37, 4))
    options = {"interpret": True} if target == "pallas" else {}
    text = ("axis q, x, d\ndiagram es(S: [q x], V: [x d]) -> [q d], [q d] {\n"
            "  return ncontract[x; exp, exp, sqrt](S, V), ncontract[x; exp, exp, rms](S, V)\n}")
    thm = cases.proved(text, "es", "group q by gq")
    fn = lower(thm, target=target, tiles={"gq": 16}).fn
    for offset in (0.0, 95.0, 150.0):
        scores = (offset + rng.standard_normal((5, 37))).astype(np.float32).astype(np.float64)
        scores[2, 5:] = -np.inf  # a partly masked row
        got = fn(jnp.asarray(scores, jnp.float32), jnp.asarray(values, jnp.float32), **options)
        for out, want in zip(got, cases.reference(thm, [scores, values], {}), strict=True):
            assert np.max(np.abs(want)) < 1e35
            assert cases.relative_error(out, want) < cases.F32_TOL


@pytest.mark.parametrize("target", ["pallas", "jax"])
def test_streamed_exp_weights_under_a_square_root_normaliser_do_not_overflow(target: str) -> None:
    """issue 28 (red team: the streamed exp/sqrt states "overflow alike"): streamed via the
    ``normalised`` state, ``ncontract[x; exp, exp, sqrt]`` (and rms) folds Σ exp(s)·v and Σ exp(s),
    inf in f32 at s = 89 where the output is 2.5e21.  ``online_softmax`` now streams them too: its
    state (m, l, o) is relative to exp(m), and its final (o / sqrt(l))·exp(m/2) (l / n for rms),
    exp(m/2) applied as exp(m/4) twice (``accumulators.stable_final``; past s = 177: the test below)."""
    rng = np.random.default_rng(6)
    values = rng.standard_normal((37, 4))
    options = {"interpret": True} if target == "pallas" else {}
    for b in ("sqrt", "rms"):
        text = (f"axis q, x, d\ndiagram es(S: [q x], V: [x d]) -> [q d] {{\n"
                f"  return ncontract[x; exp, exp, {b}](S, V)\n}}")
        thm = cases.proved(text, "es", "group q by gq", "stream x by sx via online_softmax")
        fn = lower(thm, target=target, tiles={"gq": 16, "sx": 16}).fn
        for offset in (0.0, 95.0, 150.0):
            scores = (offset + rng.standard_normal((5, 37))).astype(np.float32).astype(np.float64)
            scores[2, 5:] = -np.inf  # a partly masked row
            scores[3, :] = -np.inf  # a fully masked row: 0
            got = fn(jnp.asarray(scores, jnp.float32), jnp.asarray(values, jnp.float32), **options)
            (want,) = cases.reference(thm, [scores, values], {})
            assert np.max(np.abs(want)) < 1e35 and np.all(want[3] == 0.0)
            assert cases.relative_error(got, want) < cases.F32_TOL


@pytest.mark.xfail(strict=True, reason="grad._ncontract writes the weights of ncontract[x; a1, a2, b] other than "
                   "softmax, l2norm and rmsnorm as a1(S) / b(Σ a2(S)): 0/0 at a row whose Σ is 0 (a fully masked "
                   "row; the evaluator's weights are 0 there) and exp(S) unshifted, inf past S = 89; the Pallas "
                   "target's backward lowers that VJP diagram (red team rtkern2)")
@pytest.mark.parametrize("case", ["masked row", "scores near 100"])
@pytest.mark.parametrize("b", ["sqrt", "rms"])
def test_the_pallas_gradient_of_exp_weights_under_a_square_root(b: str, case: str) -> None:
    """jax.grad of the Pallas kernel of ``ncontract[x; exp, exp, sqrt]`` (rms) by V is Σ_q of the
    weights: 0 from a fully masked row, finite at scores near 100 (weights of order e^50).  Its
    custom VJP gave NaN in every entry of dV in both cases (the JAX target's jax.grad is right)."""
    text = f"axis q, x, d\ndiagram es(S: [q x], V: [x d]) -> [q d] {{\n  return ncontract[x; exp, exp, {b}](S, V)\n}}"
    thm = cases.proved(text, "es", "group q by gq")
    fn = lower(thm, target="pallas", tiles={"gq": 16}).fn
    rng = np.random.default_rng(10)
    scores, values = rng.standard_normal((5, 37)), rng.standard_normal((37, 4)).astype(np.float32)
    if case == "masked row":
        scores[1] = -np.inf
    else:
        scores += 100.0
    scores = scores.astype(np.float32)
    slope = jax.grad(lambda v: jnp.sum(fn(jnp.asarray(scores), v, interpret=True)))(jnp.asarray(values))
    (weights,) = cases.reference(thm, [scores.astype(np.float64), np.eye(37)], {})  # V = I: the weights
    want = np.broadcast_to(weights.sum(axis=0)[:, None], values.shape)
    assert cases.relative_error(slope, want) < cases.F32_TOL


#: (scores' offsets in x's three chunks of 16, the last ragged; the output's largest |entry|, to
#: which the values are scaled): the weights, of order exp(s/2), overflow f32 past s = 177 and
#: underflow past s = -206 where the outputs do not
_ROOT_CASES = {"near 200": ((200.0, 200.0, 200.0), 1e33), "rising": ((190.0, 230.0, 205.0), 1e30),
               "falling": ((300.0, 250.0, 200.0), 1e36), "below overflow": ((270.0, 285.0, 280.0), 2e38),
               "negative": ((-200.0, -190.0, -230.0), 1e-10)}


@pytest.mark.parametrize("target", ["jax", "pallas"])
@pytest.mark.parametrize("steps", [("group q by gq",), ("group q by gq", "stream x by sx via online_softmax")])
@pytest.mark.parametrize("b", ["sqrt", "rms"])
def test_exp_weights_under_a_square_root_past_twice_the_exp_limit(b: str, steps: tuple[str, ...],
                                                                   target: str) -> None:
    """``ncontract[x; exp, exp, sqrt]`` (and rms) at scores near 200 and values near 1e-10: the
    evaluator's output is near 1e33 (an f32), the kernel gave NaN (whole axis: its weights
    exp(s - m/2) = inf) or ±inf (streamed: (o / sqrt(l))·exp(m/2), exp(m/2) = inf past m = 177; red
    team rtmerge2), and 0 at scores near -200 (exp(-100) underflows).  Both forms now keep the
    output relative to exp(m/2) and multiply by exp(m/4) twice (``jaxops._contract``,
    ``accumulators.stable_final``): finite wherever the output is, up to 2e38 (scores near 345), the
    error within F32_TOL of the largest |entry| however small; a fully masked row gives 0, and zero
    values at scores near 400 give 0 (r·exp(m/4) is 0·inf there: r where r = 0 and exp(m/4) = inf)."""
    text = f"axis q, x, d\ndiagram es(S: [q x], V: [x d]) -> [q d] {{\n  return ncontract[x; exp, exp, {b}](S, V)\n}}"
    thm = cases.proved(text, "es", *steps)
    fn = lower(thm, target=target, tiles={"gq": 16, "sx": 16}).fn
    options = {"interpret": True} if target == "pallas" else {}
    rng = np.random.default_rng(3)
    noise, raw = rng.standard_normal((5, 37)), rng.standard_normal((37, 4))
    for offsets, largest in _ROOT_CASES.values():
        scores = np.repeat(offsets, 16)[:37] + noise
        scores[1] = -np.inf  # a fully masked row: 0
        scores[2, 20:] = -np.inf  # a partly masked row
        scores = scores.astype(np.float32).astype(np.float64)
        (unit,) = cases.reference(thm, [scores, raw], {})
        values = (raw * (largest / np.max(np.abs(unit)))).astype(np.float32).astype(np.float64)
        assert np.min(np.abs(values)) > 2.0 ** -126  # normal f32 (XLA:CPU flushes subnormal ones to 0)
        (want,) = cases.reference(thm, [scores, values], {})
        got = np.asarray(fn(jnp.asarray(scores, jnp.float32), jnp.asarray(values, jnp.float32), **options), np.float64)
        assert np.all(np.isfinite(got)) and np.all(got[1] == 0.0), (offsets, got)
        assert np.max(np.abs(got - want)) < cases.F32_TOL * np.max(np.abs(want)), offsets
    zeros = np.zeros((37, 4))
    got = fn(jnp.asarray(400.0 + noise, jnp.float32), jnp.asarray(zeros, jnp.float32), **options)
    assert np.all(np.asarray(got) == 0.0)


#: (scale of K's first chunk, scale of its other chunks) with Q at 1e-11 or 1: scores near 1e-21,
#: where f32's Σ s² underflowed, near 1e22, where it overflowed, and chunks of different scales
#: (the running scale grows, or stays put, between chunks; the tiny chunk's share 1% or nothing)
_STREAMED_SCALES = {"tiny": (1e-11, 1e-11, 1e-11), "huge": (1.0, 1e21, 1e21), "mixed": (1.0, 1e-22, 1e18),
                    "growing": (1.0, 1e-23, 1e-21), "falling": (1.0, 1e-21, 1e-23)}


@pytest.mark.parametrize("target", ["jax", "pallas"])
@pytest.mark.parametrize("case", sorted(_STREAMED_SCALES))
@pytest.mark.parametrize("name", ["flash_sign", "flash_rms_attention"])
def test_the_streamed_l2_state_holds_tiny_and_huge_scores(name: str, target: str, case: str) -> None:
    """Streamed l2 and rms kernels (``flash_sign``, ``flash_rms_attention``) carry their state
    (Σ s·v, Σ s²) as (m, Σ (s/m)·v, Σ (s/m)²) with m the running max|s| (``accumulators.float_safe``):
    at Q and K of 1e-11 (scores near 1e-21) the state as written gave 0 where the evaluator's
    output reaches 3.9 (issue 28, red team rtdeep); near 1e22 Σ s² overflowed; chunks of different
    scales rescale the state."""
    thm = cases.theorems()[name]
    sizes, arrays = cases.inputs(thm, 0, low=70, high=90)  # three chunks of 32, the last ragged
    q_scale, first, rest = _STREAMED_SCALES[case]
    chunk = np.where(np.arange(sizes["x"]) < 32, first, rest)[:, None]
    arrays = [(a * s).astype(np.float32).astype(np.float64) for a, s in zip(arrays, (q_scale, chunk, 1.0),
                                                                              strict=True)]
    fn = lower(thm, target=target, tiles=cases.TILES).fn
    options = {"interpret": True} if target == "pallas" else {}
    got = fn(*[jnp.asarray(a, jnp.float32) for a in arrays], **options)
    want = cases.reference(thm, arrays, sizes)[0]
    assert np.max(np.abs(want)) > 0.1
    assert cases.relative_error(got, want) < cases.F32_TOL


def _kernel_primitives(fn: Any, *arrays: np.ndarray) -> list[str]:
    """The primitives of the Pallas kernel bodies ``fn`` traces to at these arrays' shapes."""
    found: list[str] = []

    def walk(jaxpr: Any, inside: bool) -> None:
        for eqn in jaxpr.eqns:
            if inside:
                found.append(eqn.primitive.name)
            if eqn.primitive.name == "pallas_call":
                walk(eqn.params["jaxpr"], True)
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub, inside)
    walk(jax.make_jaxpr(lambda *a: fn(*a, interpret=True))(*arrays).jaxpr, False)
    assert found, "no pallas_call"
    return found


def test_padding_masks_are_left_out_where_the_size_fills_the_tiles() -> None:
    """A symbolic axis may be padded, so the kernel masks its padding (``x < n``); traced at a
    size its tile divides, the mask and its compare are gone from the loop (Triton keeps a
    compare and select per score otherwise: 12.1 SASS per score on causal diagonal chunks vs
    8.2), and the kernel still matches the evaluator both ways."""
    thm = cases.theorems()["flash_attention"]
    fn = lower(thm, target="pallas", tiles=cases.TILES).fn
    rng = np.random.default_rng(0)
    for x, compares in ((64, 0), (50, 1)):
        q, k, v = (rng.standard_normal((n, 64)).astype(np.float32) for n in (32, x, x))
        assert _kernel_primitives(fn, q, k, v).count("lt") == compares, x
        want = cases.reference(thm, [q, k, v], {})[0]
        assert cases.relative_error(np.asarray(fn(q, k, v, interpret=True)), want) < cases.F32_TOL


SIGNED_ZEROS = """axis q, x
diagram mx(S: [q x]) -> [q] { return tanh(recip(max[x](S))) }
diagram mn(S: [q x]) -> [q] { return tanh(recip(min[x](S))) }
diagram ew(S: [q x], T: [q x]) -> [q x] { return tanh(recip(max(S, T))) + 2 * tanh(recip(min(S, T))) }
theorem smx: mx { stream x by sx }
theorem smn: mn { stream x by sx }
"""


@pytest.mark.parametrize("n", range(1, 7))
def test_max_min_zero_signs_agree_everywhere(n: int) -> None:
    """max/min order zeros as IEEE 754-2019 maximum/minimum do (-0 < +0; README's op table): on every
    sign pattern of n zeros, mixed with -1 (max) or +1 (min), the evaluator, the schedule interpreter
    (ragged chunks of 2), plain JAX and Pallas interpret give the same signed 1/±0 through tanh (±1), and
    the evaluator's is the rule's (numpy's maximum kept an order-dependent one of equal zeros)."""
    import itertools

    from napkin_cat.evaluate import evaluate
    from napkin_cat.proof import prove
    from napkin_cat.schedule.run import run_schedule

    module = loads(SIGNED_ZEROS)
    for name, other, rule in (("smx", -1.0, np.max), ("smn", 1.0, np.min)):
        rows = np.array(list(itertools.product((0.0, -0.0, other), repeat=n)))
        thm = prove(module, name)
        want = evaluate(thm.source, [rows])
        top = rule(rows, axis=1)  # the rule: a zero max is +0 iff an entry is +0, a zero min -0 iff one is -0
        pos, neg = (((rows == 0) & (np.signbit(rows) == s)).any(axis=1) for s in (False, True))
        zero = np.where(pos, 1.0, -1.0) if name == "smx" else np.where(neg, -1.0, 1.0)
        ieee = np.where(top == 0, zero, np.tanh(1 / np.where(top == 0, 1.0, top)))
        np.testing.assert_array_equal(want, ieee)
        np.testing.assert_array_equal(run_schedule(thm, [rows], tiles={"sx": 2})[0], want)
        x = jnp.asarray(rows, jnp.float32)
        pallas = lower(thm, target="pallas", tiles={"sx": 16}).fn
        got = {"jax": lower(thm, target="jax", tiles={"sx": 2}).fn(x), "pallas": pallas(x, interpret=True)}
        for target, out in got.items():
            assert np.allclose(np.asarray(out, np.float64), want, atol=1e-6), (name, target)
    pairs = np.array(list(itertools.product((0.0, -0.0, -1.0, 1.0), repeat=2))).T.reshape(2, 1, 16)
    ew = kernel.refl("ew", module.diagram("ew"))
    want = evaluate(ew.source, list(pairs))
    for target in ("jax", "pallas"):
        out = lower(ew, target=target).fn(*[jnp.asarray(a, jnp.float32) for a in pairs])
        assert np.allclose(np.asarray(out, np.float64), want, atol=1e-6), target
