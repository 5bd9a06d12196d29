"""Selection boxes (issue 30): ``argmax[e](X)`` and ``topk[e -> k](X)``, and MoE top-2 routing.

The order is defined (``ops.OPS``): larger first, a NaN above every number, equal values (-0 and
+0, two NaNs) by position, the smaller first.  The evaluator is exact on it (checked against rows
written out by hand and numpy's stable sort); both lowerings give the same positions; every
misuse is a located diagnostic; the MoE layer of examples/moe.ncd equals Mixtral's routing written
in numpy, lowers on both targets at ragged sizes, skips the expert chunks no token of a block
selected, and its gradient through the lowered kernels is the float64 VJP (``napkin_cat.grad``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import napkin_cat
from napkin_cat import grad
from napkin_cat.cli import main
from napkin_cat.cost import cost
from napkin_cat.diagnostics import NapkinError
from napkin_cat.elaborate import loads
from napkin_cat.evaluate import evaluate
from napkin_cat.lower import lower
from napkin_cat.proof import check_file, check_module, prove
from tests.test_elaborate import one_error

ROOT = Path(__file__).resolve().parent.parent

SELECT = """axis r
axis e = 5
axis k = 3
diagram pick(X: [r e]) -> [r], [r k] {
  return argmax[e](X), topk[e -> k](X)
}
theorem rows: pick {
  group r by gr
}
"""

NAN, INF = math.nan, math.inf
#: rows of five and, by the order, their argmax and their top 3 (worked out by hand)
ROWS = [
    ([1.0, 3.0, 3.0, 2.0, -1.0], 1, [1, 2, 3]),        # a tie for the largest: the smaller position first
    ([-0.0, 0.0, -0.0, 0.0, -5.0], 0, [0, 1, 2]),      # -0 = +0: ties, by position
    ([2.0, NAN, 7.0, NAN, INF], 1, [1, 3, 4]),         # NaN above every number, +inf next
    ([-INF, -INF, -INF, -INF, -INF], 0, [0, 1, 2]),    # all -inf: by position
    ([4.0, 4.0, 4.0, 4.0, 4.0], 0, [0, 1, 2]),
    ([-1.0, -2.0, -3.0, -4.0, 9.0], 4, [4, 0, 1]),
    ([NAN, NAN, NAN, NAN, NAN], 0, [0, 1, 2]),
]


def _selection() -> Any:
    return prove(loads(SELECT), "rows")


def test_the_evaluator_ranks_larger_first_nan_first_ties_by_position() -> None:
    x = np.array([row for row, _, _ in ROWS])
    best, top = napkin_cat.run(_selection().source, x)
    assert best.tolist() == [a for _, a, _ in ROWS]
    assert top.tolist() == [t for _, _, t in ROWS]


def test_the_evaluator_is_numpys_stable_descending_sort_on_random_ties() -> None:
    """Small integers tie often: the positions are those of a stable sort of -X."""
    rng = np.random.default_rng(0)
    x = rng.integers(-2, 3, (200, 5)).astype(float)
    best, top = napkin_cat.run(_selection().source, x)
    order = np.argsort(-x, axis=1, kind="stable")
    assert np.array_equal(best, order[:, 0]) and np.array_equal(top, order[:, :3])


@pytest.mark.parametrize("target", ["jax", "pallas"])
def test_both_lowerings_select_the_evaluators_positions(target: str) -> None:
    """The hand-written rows and random ties, 45 rows in blocks of 16 (ragged), |e| = 5 (padded to a
    block of 16 in Pallas: the padding ranks after every real entry, -inf included)."""
    rng = np.random.default_rng(1)
    x = np.concatenate([np.array([row for row, _, _ in ROWS]), rng.integers(-2, 3, (38, 5)).astype(float)])
    want = napkin_cat.run(_selection().source, x)
    lowered = lower(_selection(), target=target, tiles={"gr": 16})
    extra = {"interpret": True} if target == "pallas" else {}
    got = lowered.fn(jnp.asarray(x, jnp.float32), **extra)
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(np.asarray(g), w)


@pytest.mark.parametrize("target", ["jax", "pallas"])
def test_a_bf16_kernel_returns_positions_past_256_exactly(target: str) -> None:
    """A bf16 kernel stores its outputs in bf16, which holds integers exactly only to 256: argmax
    over 1000 entries returned 980 for 981 (both targets).  An integer-valued output is stored in
    float32 whatever the kernel's dtype (Layout.output_dtype)."""
    text = "axis t, e\ndiagram f(X: [t e]) -> [t] {\n  return argmax[e](X)\n}\ntheorem g: f {\n  group t by 16\n}\n"
    thm = prove(loads(text), "g")
    x = np.zeros((20, 1000))
    x[np.arange(20), 981 - np.arange(20)] = 1.0
    extra = {"interpret": True} if target == "pallas" else {}
    got = lower(thm, target=target, dtype="bfloat16").fn(jnp.asarray(x, jnp.float32), **extra)
    assert np.array_equal(np.asarray(got, np.float64), 981 - np.arange(20))


def test_the_integer_names_are_found_once_per_layout_for_every_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """One helper (``terms.integer_names``) finds a diagram's integer-valued names, for a chain's cut and for the
    stored dtype of every output; a layout asks it once, not once per output."""
    from napkin_cat import ops, terms
    from napkin_cat.schedule import layout as layout_module
    text = ("axis t, e\ndiagram f(X: [t e]) -> [t], [t], [t] {\n  P = argmax[e](X)\n  Q = P + 1.0\n"
            "  return Q, max[e](X), floor(P * 0.5)\n}\ntheorem g: f {\n  group t by 16\n}\n")
    thm = prove(loads(text), "g")
    assert terms.integer_names(thm.result, ops.integer_valued) == {"P", "Q"}
    calls: list[str] = []
    counted = terms.integer_names

    def counting(diagram: terms.Diagram, judge: Any) -> frozenset[str]:
        calls.append(diagram.name)
        return counted(diagram, judge)
    monkeypatch.setattr(layout_module, "integer_names", counting)
    lay = layout_module.layout("g", thm.result, thm.schedule, {}, "jax")
    assert [lay.output_dtype(k, "bfloat16") for k in range(3)] == ["float32", "bfloat16", "float32"]
    assert len(calls) == 1


def test_a_bf16_kernels_integer_valued_output_is_priced_at_its_stored_width() -> None:
    """The cost model priced an argmax output at the kernel's dtype (2 bytes in bf16) where the targets store it
    in float32 (4 bytes, ``INTEGER_OUTPUT_DTYPE``): bytes moved and memory count it at 4, its input at 2, the
    unfused baseline alike; a real output beside it stays at the kernel's width.  (A chain's written ids:
    test_chain's ``test_a_written_integer_buffer_is_priced_at_its_stored_width``.)"""
    text = ("axis t, e\ndiagram f(X: [t e]) -> [t], [t] {\n  return argmax[e](X), max[e](X)\n}\n"
            "theorem g: f {\n  group t by 16\n}\n")
    thm = prove(loads(text), "g")
    co = cost(thm, hardware="h100", dtype="bf16", sizes={"t": 64, "e": 1000})
    position, largest = co.program.nest.flat.outputs
    assert (co.bytes_of["X"], co.bytes_of[position], co.bytes_of[largest]) == (2, 4, 2)
    moved = 64 * 1000 * 2 + 64 * 4 + 64 * 2
    assert co.level("hbm").memory_bytes == moved and co.first.transfers_bytes == moved
    assert co.baseline.transfers_bytes == moved + 64 * 1000 * 2  # each box its own kernel: X read twice


def test_topk_agrees_with_lax_top_k_where_values_are_distinct() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((64, 5))
    _, top = napkin_cat.run(_selection().source, x)
    assert np.array_equal(top, np.asarray(jax.lax.top_k(jnp.asarray(x), 3)[1]))


def test_a_selection_has_no_gradient_and_its_output_is_an_integer() -> None:
    """The VJP routes nothing through a selection (frameworks do the same): the gradient of
    Σ gather[e](X, argmax[e](X)) (the row maxima) reaches X through the gather only."""
    text = ("axis r\naxis e = 4\ndiagram f(X: [r e]) -> [r] {\n  return gather[e](X, argmax[e](X))\n}\n")
    vjp = grad.vjp(loads(text).diagram("f"))
    x = np.array([[1.0, 5.0, 5.0, 2.0], [0.0, -1.0, 3.0, 3.0]])
    (dx,) = (evaluate(vjp, [x, np.ones(2)], sizes={"r": 2}),)
    assert np.asarray(dx).tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]


HEAD = "axis t, e, n\naxis k = 2\naxis c = 3\naxis s = 6\n"


@pytest.mark.parametrize(("body", "code", "col"), [
    # the number selected: not declared, or more than the axis holds
    ("diagram f(L: [t e]) -> [t n] {\n  return topk[e -> n](L)\n}\n", "type.topk_size", 10),
    ("diagram f(L: [t c]) -> [t s] {\n  return topk[c -> s](L)\n}\n", "type.topk_size", 10),
    # k already on the operand; the axis missing; two axes; a missing or an extra arrow
    ("diagram f(L: [t e k]) -> [t k] {\n  return topk[e -> k](L)\n}\n", "type.axis_exists", 10),
    ("diagram f(L: [t]) -> [t] {\n  return argmax[e](L)\n}\n", "axis.missing", 10),
    ("diagram f(L: [t e]) -> [] {\n  return argmax[t e](L)\n}\n", "box.axis_count", 10),
    ("diagram f(L: [t e]) -> [t k] {\n  return topk[e](L)\n}\n", "box.needs_arrow", 14),
    ("diagram f(L: [t e]) -> [t] {\n  return argmax[e -> k](L)\n}\n", "box.no_arrow", 16),
    # a real value used as a position: a largest logit as gather's positions, half a selection, a real mask
    ("diagram f(L: [t e], W: [e n]) -> [t n] {\n  return gather[e](W, max[e](L))\n}\n",
     "type.integer_needed", 10),
    ("diagram f(L: [t e], W: [e n]) -> [t n] {\n  return gather[e](W, argmax[e](L) * 0.5)\n}\n",
     "type.integer_needed", 10),
    ("diagram f(L: [t e]) -> [t e] {\n  return select(softmax[e](L), L, -inf)\n}\n", "type.integer_needed", 10),
])
def test_each_misuse_is_a_located_diagnostic(body: str, code: str, col: int) -> None:
    found, line, column, _, _ = one_error(HEAD + body)
    assert (found, line, column) == (code, len((HEAD + body).splitlines()) - 1, col)


def test_integer_selections_are_positions_for_gathers_masks_and_int_inputs() -> None:
    module = loads(HEAD + "diagram g(I: int [t]) -> [t] {\n  return I\n}\n"
                          "diagram f(L: [t e], W: [e n]) -> [t n], [t e], [t] {\n"
                          "  return gather[e](W, argmax[e](L)), select(sum[k](onehot[e](topk[e -> k](L))), L, -inf), "
                          "g(argmax[e](L) + 1)\n}\n")
    assert module.diagram("f").out_types == (("t", "n"), ("t", "e"), ("t",))


def test_napkin_check_locates_the_error_and_eval_refuses_a_symbolic_axis_too_short(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.ncd"
    bad.write_text(HEAD + "diagram f(L: [t c]) -> [t s] {\n  return topk[c -> s](L)\n}\n", encoding="utf-8")
    assert main(["check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:6:10: error: topk[c -> s]: selects 6 positions but `c` has 3" in err
    # |e| is symbolic: checked where it is bound
    with pytest.raises(NapkinError) as info:
        napkin_cat.run(loads(HEAD + "diagram f(L: [t e]) -> [t k] {\n  return topk[e -> k](L)\n}\n").diagram("f"),
                       np.zeros((3, 1)))
    assert info.value.diagnostics[0].code == "eval.topk_size"
    assert "selects 2 positions but `e` has 1" in info.value.diagnostics[0].message


def test_mosaic_refuses_a_selection_with_a_reason() -> None:
    with pytest.raises(NapkinError) as info:
        lower(_theorems()["fused_moe"], target="mosaic", tiles={"gt": 64, "sf": 64}, dtype="bfloat16")
    assert info.value.diagnostics[0].code == "lower.mosaic" and "topk" in info.value.diagnostics[0].message


# ---- MoE top-2 routing (examples/moe.ncd, proofs/moe.ncd) --------------------------------------


def _theorems() -> dict[str, Any]:
    return {r.name: r.theorem for r in check_file(ROOT / "proofs" / "moe.ncd", strict=True)}


def _gelu(x: np.ndarray) -> np.ndarray:
    return x * 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _mixtral(x: np.ndarray, wr: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> np.ndarray:
    """Mixtral's sparse MoE block in numpy: top-2 of the router logits (a stable sort: ties to
    the smaller expert), softmax over the two, Σ gate · FFN_e over the token's experts only."""
    logits = np.stack([x @ wr[:, e] for e in range(wr.shape[1])], axis=1)  # equal columns give equal logits
    top = np.argsort(-logits, axis=1, kind="stable")[:, :2]
    chosen = np.take_along_axis(logits, top, axis=1)
    gates = np.exp(chosen - chosen.max(axis=1, keepdims=True))
    gates /= gates.sum(axis=1, keepdims=True)
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(2):
            e = top[t, j]
            out[t] += gates[t, j] * (_gelu(x[t] @ w1[e]) @ w2[e])
    return out


def _moe_inputs(rng: np.random.Generator, t: int, e: int) -> list[np.ndarray]:
    return [rng.standard_normal((t, 64)), rng.standard_normal((64, e)), rng.standard_normal((e, 64, 128)) / 8,
            rng.standard_normal((e, 128, 64)) / 11]


def test_the_moe_layer_is_mixtrals_sparse_block() -> None:
    """The dense meaning (every expert on every token, gates 0 off the two selected) equals the
    sparse computation; a tie in the logits goes to the smaller expert in both."""
    rng = np.random.default_rng(3)
    x, wr, w1, w2 = _moe_inputs(rng, 9, 64)
    wr[:, 4] = wr[:, 1]  # experts 1 and 4 tie for every token
    wr[:, [1, 4]] += 2.0  # and are chosen often
    got = napkin_cat.run(_theorems()["fused_moe"].source, x, wr, w1, w2)
    assert np.abs(got - _mixtral(x, wr, w1, w2)).max() < 1e-10


def _device(a: np.ndarray) -> Any:
    return jnp.asarray(a, jnp.int32 if np.issubdtype(a.dtype, np.integer) else jnp.float32)


@pytest.mark.parametrize("target", ["jax", "pallas"])
def test_the_fused_moe_kernel_matches_the_evaluator_and_its_gradient_is_the_vjp(target: str) -> None:
    """37 tokens in blocks of 16 (ragged), 64 experts, the hidden axis in chunks of 32: the forward
    equals the evaluator, and jax.grad through the lowered kernel (the router, gate and expert
    weights and the tokens) equals the float64 VJP diagram; the selection itself
    has no gradient, so the router's gradient flows through the two selected logits' softmax."""
    thm = _theorems()["fused_moe"]
    rng = np.random.default_rng(4)
    arrays = _moe_inputs(rng, 37, 64)
    sizes = {"t": 37}
    want = napkin_cat.run(thm.source, *arrays)
    lowered = lower(thm, target=target, tiles={"gt": 16, "sf": 32})
    extra = {"interpret": True} if target == "pallas" else {}
    got = np.asarray(lowered.fn(*(_device(a) for a in arrays), **extra))
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()
    weights = rng.standard_normal((37, 64))
    exact = evaluate(grad.vjp(thm.source), [*arrays, weights], sizes=sizes)

    def loss(*xs: jax.Array) -> jax.Array:
        return jnp.sum(lowered.fn(*xs, **extra) * jnp.asarray(weights, jnp.float32))

    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(*(_device(a) for a in arrays))
    for g, w in zip(grads, exact, strict=True):
        assert np.abs(np.asarray(g) - w).max() < 1e-4 * np.abs(w).max()
    assert np.abs(exact[1]).max() > 0  # the router is trained through the gates


def _routed(rng: np.random.Generator, t: int, e: int, diagonal: bool) -> tuple[np.ndarray, np.ndarray]:
    """Two experts per token, from the chunk of 16 experts its block of 16 tokens owns (diagonal)
    or anywhere; the gates a softmax over the two."""
    mask = np.zeros((t, e), np.int64)
    for token in range(t):
        first = 16 * (token // 16) if diagonal else 0
        span = 16 if diagonal else e
        mask[token, first + rng.choice(span, 2, replace=False)] = 1
    gates = np.where(mask == 1, rng.random((t, e)), 0.0)
    return mask, gates / gates.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("target", ["jax", "pallas"])
def test_grouped_experts_skip_the_chunks_no_token_of_a_block_selected(target: str) -> None:
    """48 tokens in blocks of 16, 64 experts in chunks of 16, block b routed into chunk b only:
    NaN weights in the experts of chunks 2 and 3 would poison every row that runs them (0 · NaN),
    so the first two blocks equal the evaluator (on clean weights) only because their kernels skip
    them.  At 37 tokens (ragged), routed anywhere, the kernel equals the evaluator."""
    thm = _theorems()["grouped_experts"]
    rng = np.random.default_rng(5)
    x, _, w1, w2 = _moe_inputs(rng, 48, 64)
    mask, gates = _routed(rng, 48, 64, diagonal=True)
    want = napkin_cat.run(thm.source, x, mask, gates, w1, w2)
    lowered = lower(thm, target=target, tiles={"gt": 16, "se": 16})
    assert ("lax.fori_loop(0, live_count" if target == "pallas" else "lax.switch(kind") in lowered.source
    extra = {"interpret": True} if target == "pallas" else {}
    poisoned = w1.copy()
    poisoned[32:] = np.nan
    got = np.asarray(lowered.fn(*(_device(a) for a in (x, mask, gates, poisoned, w2)), **extra))
    assert np.isnan(got[32:]).all()
    assert np.abs(got[:32] - want[:32]).max() < 1e-4 * np.abs(want).max()
    x, _, w1, w2 = _moe_inputs(rng, 37, 64)
    mask, gates = _routed(rng, 37, 64, diagonal=False)
    want = napkin_cat.run(thm.source, x, mask, gates, w1, w2)
    got = np.asarray(lowered.fn(*(_device(a) for a in (x, mask, gates, w1, w2)), **extra))
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()


def test_grouped_experts_cost_the_live_fraction_of_expert_chunks() -> None:
    """Every FLOP of the expert kernel is inside the stream over experts, so at a live fraction F
    of (token block, expert chunk) pairs it counts F of the dense FLOPs; the loads of the expert
    weights (the 1/gt term) scale by F too, and the dense layer (--live 1) is the bound."""
    thm = _theorems()["grouped_experts"]
    sizes = {"t": 16384}
    dense, sparse = (cost(thm, hardware="h200", sizes=sizes, live=f) for f in (1.0, 0.25))
    assert float(sparse.flops) * 4 == float(dense.flops)
    at = {"gt": 128, "se": 16}
    smem_dense, smem_sparse = (float(c.at(c.level("smem").transfers_bytes, at)) for c in (dense, sparse))
    assert smem_sparse < smem_dense / 3


def test_a_lemma_about_a_selection_is_tested_on_integers_and_rationals_not_case_split() -> None:
    """The symbolic tier cannot rank symbols, so a lemma with a selection is certified as onehot
    lemmas are (exact rationals and integers, which tie often, and float64): a true one is
    tested (so --strict refuses it: not proved), a false one is refused
    (tests/unsound/argmax_of_abs_lemma.ncd)."""
    text = ("axis e\naxis d = 4\nlemma first_max(X: [e]) : gather[e](X, argmax[e](X)) = max[e](X)\n"
            "diagram pick(X: [d e]) -> [d] {\n  B = gather[e](X, argmax[e](X))\n  return B\n}\n"
            "theorem ok: pick {\n  rewrite first_max at B\n}\n")
    (result,) = check_module(loads(text))
    assert result.ok and result.theorem is not None
    assert any("tested: no sympy (a gather and a selection)" in t for t in result.theorem.trust)
    (strict,) = check_module(loads(text), strict=True)
    assert not strict.ok


def test_argmax_is_numpys_and_jnps_nan_and_ties_included() -> None:
    x = np.array([row for row, _, _ in ROWS])
    best, _ = napkin_cat.run(_selection().source, x)
    assert np.array_equal(best, np.argmax(x, axis=1))
    assert np.array_equal(best, np.asarray(jnp.argmax(jnp.asarray(x), axis=1)))
