"""Data-dependent masks and gathers (issue 30): integer inputs, comparisons, select, gather.

The evaluator is exact on them (checked against numpy written out by hand), the printer
round-trips them, and every misuse is a located diagnostic, not a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import napkin_cat
from napkin_cat.cost import CostError, cost
from napkin_cat.diagnostics import NapkinError
from napkin_cat.elaborate import load, loads
from napkin_cat.evaluate import exp_shift
from napkin_cat.lower import lower
from napkin_cat.printer import print_module
from napkin_cat.proof import check_file, check_module, prove
from napkin_cat.schedule.datamask import block_kinds, block_liveness
from tests.test_elaborate import one_error

ROOT = Path(__file__).resolve().parent.parent

EXAMPLES = load(ROOT / "examples" / "masked_attention.ncd")


def _softmax_rows(s: np.ndarray) -> np.ndarray:
    """softmax over the last axis, a fully masked (-inf) row giving 0, as the evaluator defines it."""
    e = np.exp(s - exp_shift(s, (-1,)))
    z = np.sum(e, axis=-1, keepdims=True)
    return np.where(z == 0, 0.0, e / np.where(z == 0, 1.0, z))


def _device(array: np.ndarray) -> Any:
    """An input as a kernel takes it: integers (ids, lengths, page tables) as int32, reals as f32."""
    return jnp.asarray(array, jnp.int32 if np.issubdtype(array.dtype, np.integer) else jnp.float32)


def _qkv(rng: np.random.Generator, *lead: int, q: int = 13, x: int = 11) -> tuple[np.ndarray, ...]:
    return (rng.standard_normal((*lead, q, 64)), rng.standard_normal((*lead, x, 64)),
            rng.standard_normal((*lead, x, 64)))


def test_document_attention_is_exact_with_an_empty_document_row() -> None:
    rng = np.random.default_rng(0)
    Q, K, V = _qkv(rng)
    dq = np.array([0, 0, 0, 1, 1, 1, 1, 2, 2, 5, 5, 7, 7])  # documents 5 and 7 have no key: rows of 0
    dx = np.array([0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3])
    s = np.where(dq[:, None] == dx[None, :], Q @ K.T / 8.0, -np.inf)
    want = _softmax_rows(s) @ V
    got = napkin_cat.run(EXAMPLES.diagram("document_attention"), Q, K, V, dq, dx)
    assert np.abs(got - want).max() < 1e-12
    assert np.all(got[9:] == 0.0)


def test_causal_document_and_key_padding_are_exact() -> None:
    rng = np.random.default_rng(1)
    Q, K, V = _qkv(rng, q=9, x=9)
    d = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2])
    causal = np.arange(9)[:, None] >= np.arange(9)[None, :]
    s = np.where((d[:, None] == d[None, :]) & causal, Q @ K.T / 8.0, -np.inf)
    got = napkin_cat.run(EXAMPLES.diagram("causal_document_attention"), Q, K, V, d, d)
    assert np.abs(got - _softmax_rows(s) @ V).max() < 1e-12
    Qb, Kb, Vb = _qkv(rng, 3)
    length = np.array([11, 4, 0])  # a full row, a short one and an empty one
    s = np.einsum("bqd,bxd->bqx", Qb, Kb) / 8.0
    s = np.where(np.arange(11)[None, None, :] < length[:, None, None], s, -np.inf)
    got = napkin_cat.run(EXAMPLES.diagram("padded_attention"), Qb, Kb, Vb, length)
    assert np.abs(got - np.einsum("bqx,bxd->bqd", _softmax_rows(s), Vb)).max() < 1e-12
    assert np.all(got[2] == 0.0)


GATHER = """axis n, s, b, j, d
diagram read(T: [n s d], page: int [b j]) -> [b j s d] {
  return gather[n](T, page)
}
"""


def test_gather_reads_through_the_page_table_and_clamps_out_of_range_positions() -> None:
    rng = np.random.default_rng(2)
    T = rng.standard_normal((5, 3, 2))
    page = np.array([[4, 0, 2], [1, 7, -3]])  # 7 and -3 lie outside [0, 5): clamped to 4 and 0
    got = napkin_cat.run(loads(GATHER).diagram("read"), T, page)
    assert np.array_equal(got, T[np.clip(page, 0, 4)])


def test_integer_inputs_round_trip_through_the_printer() -> None:
    module = load(ROOT / "examples" / "masked_attention.ncd")
    assert loads(print_module(module), str(ROOT / "examples" / "masked_attention.ncd")) == module
    assert loads(GATHER) == loads(print_module(loads(GATHER)))
    assert "Dq: int [q]" in print_module(module)


def test_an_integer_input_holding_a_fraction_is_refused_when_evaluated() -> None:
    with pytest.raises(NapkinError) as info:
        napkin_cat.run(loads(GATHER).diagram("read"), np.zeros((5, 3, 2)), np.array([[0.5, 1.0]]))
    assert info.value.diagnostics[0].code == "eval.integer"


HEAD = "axis q, x, n, b\n"


@pytest.mark.parametrize(("body", "code", "col"), [
    # a real operand of a comparison, of select's mask, of gather's positions
    ("diagram f(A: [q], B: int [x]) -> [q x] {\n  return eq(A, B)\n}\n", "type.integer_needed", 10),
    ("diagram f(A: [q], S: [q x]) -> [q x] {\n  return select(A, S, 0)\n}\n", "type.integer_needed", 10),
    ("diagram f(T: [n x], P: [b]) -> [b x] {\n  return gather[n](T, P)\n}\n", "type.integer_needed", 10),
    ("diagram f(T: [n x], P: int [b]) -> [b x] {\n  return gather[n](T, P * 0.5)\n}\n", "type.integer_needed", 10),
    # a real argument for an integer input of a diagram used as a box
    ("diagram g(P: int [b]) -> [b] {\n  return P\n}\ndiagram f(A: [b]) -> [b] {\n  return g(A)\n}\n",
     "type.integer_needed", 10),
    # gather's axis: on the positions, missing from the table, or more than one
    ("diagram f(T: [n x], P: int [n]) -> [n x] {\n  return gather[n](T, P)\n}\n", "type.gather_axis", 10),
    ("diagram f(T: [x], P: int [b]) -> [b] {\n  return gather[n](T, P)\n}\n", "type.gather_axis", 10),
    ("diagram f(T: [n x], P: int [b]) -> [b] {\n  return gather[n x](T, P)\n}\n", "box.axis_count", 10),
    ("diagram f(T: [n x], P: int [b]) -> [b x] {\n  return gather[m](T, P)\n}\n", "axis.not_declared", 16),
    # an element type other than int, and int on a lemma parameter
    ("diagram f(A: float [q]) -> [q] {\n  return A\n}\n", "type.dtype", 14),
    ("lemma l(A: int [q]) : A = A\n", "type.integer_lemma", 12),
])
def test_each_misuse_is_a_located_diagnostic(body: str, code: str, col: int) -> None:
    found, line, column, _, _ = one_error(HEAD + body)
    lines = (HEAD + body).splitlines()
    where = 2 if code in ("type.dtype", "type.integer_lemma") else max(
        i for i, text in enumerate(lines, 1) if "return" in text)  # the box is in the last return
    assert (found, line, column) == (code, where, col)


def test_a_dtype_step_on_an_integer_input_is_a_located_error() -> None:
    """Ids are int32 in every kernel: narrowing them is refused at the step, not measured."""
    text = ('use "../examples/masked_attention.ncd"\ntheorem q: document_attention {\n'
            "  dtype K, Dx as bf16 tol 0.01\n}\n")
    (result,) = check_module(loads(text, str(ROOT / "proofs" / "q.ncd")))
    assert not result.ok and result.step == 1 and result.failure is not None
    assert "`Dx` is an integer input" in result.failure.message
    assert result.failure.span is not None and result.failure.span.line == 3


def test_integer_bindings_stay_integer_and_reals_do_not_become_integers() -> None:
    ok = loads(HEAD + "diagram f(P: int [b], T: [n x]) -> [b x] {\n  I = P + 1\n  return gather[n](T, I)\n}\n")
    assert ok.diagram("f").inputs[0].integer
    code, *_ = one_error(HEAD + "diagram f(P: int [b], T: [n x]) -> [b x] {\n"
                         "  I = exp(P)\n  return gather[n](T, I)\n}\n")
    assert code == "type.integer_needed"


# ---- skipping chunks whose data mask is 0 everywhere (schedule/datamask.py, lower/dataskip.py) ----------


def _document_theorem(name: str = "flash_document_attention") -> Any:
    return {r.name: r.theorem for r in check_file(ROOT / "proofs" / "document_attention.ncd")}[name]


@pytest.mark.parametrize("target", ["pallas", "jax"])
def test_chunks_a_document_mask_empties_are_skipped(target: str) -> None:
    """Five documents of 30 tokens, blocks and chunks of 32: 13 of the 25 (block, chunk) pairs
    hold a query and a key of one document (``block_liveness``).  NaN values in the keys of the
    last chunk poison every row of a program that runs it (0 · NaN): the rows of the three
    programs whose documents end before it stay finite, and equal the evaluator, only because
    their kernels skip it; the rows of the two that run it are NaN.  The Pallas kernel loops over
    each program's live chunks from the block mask; plain JAX switches on each chunk's kind."""
    thm = _document_theorem()
    rng = np.random.default_rng(0)
    Q, K, V = _qkv(rng, q=150, x=150)
    ids = np.repeat(np.arange(5), 30)
    live = block_liveness(ids[:, None] == ids[None, :], 32, 32)
    assert live.sum() == 13 and not live[:3, 4].any() and live[3:, 4].all()
    want = napkin_cat.run(thm.source, Q, K, V, ids, ids)
    poisoned = V.copy()
    poisoned[128:] = np.nan
    lowered = lower(thm, target=target, tiles={"gq": 32, "sx": 32})
    assert ("lax.fori_loop(0, live_count, body" if target == "pallas" else "lax.switch(kind") in lowered.source
    extra = {"interpret": True} if target == "pallas" else {}
    got = np.asarray(lowered.fn(*(_device(a) for a in (Q, K, poisoned, ids, ids)), **extra))
    assert np.all(np.isnan(got[96:]).any(axis=1))
    assert np.abs(got[:96] - want[:96]).max() < 1e-5
    clean = np.asarray(lowered.fn(*(_device(a) for a in (Q, K, V, ids, ids)), **extra))
    assert np.abs(clean - want).max() < 1e-5


def test_a_data_mask_on_a_non_absorbing_operand_skips_nothing() -> None:
    """Masking the values (select(M, V, 0)) does not make a chunk's lift the identity (the
    normaliser still sums exp(s - m) there): no chunk is skipped, and the kernel is exact."""
    text = ("axis q, x\naxis d = 4\n"
            "diagram f(Q: [q d], K: [x d], V: [x d], Dq: int [q], Dx: int [x]) -> [q d] {\n"
            "  S = contract[d](Q, K)\n  P = softmax[x](S)\n  O = contract[x](P, select(eq(Dq, Dx), V, 0))\n"
            "  return O\n}\n"
            "theorem t: f {\n  rewrite softmax_contract at P, O\n  group q by gq\n"
            "  stream x by sx via online_softmax\n}\n")
    thm = prove(loads(text), "t")
    lowered = lower(thm, target="pallas", tiles={"gq": 16, "sx": 16})
    assert "live" not in lowered.source
    rng = np.random.default_rng(3)
    Q, K, V = rng.standard_normal((40, 4)), rng.standard_normal((40, 4)), rng.standard_normal((40, 4))
    ids = np.repeat(np.arange(4), 10)
    got = lowered.fn(*(_device(a) for a in (Q, K, V, ids, ids)), interpret=True)
    assert np.abs(np.asarray(got) - napkin_cat.run(thm.source, Q, K, V, ids, ids)).max() < 1e-5


def test_only_masks_read_from_data_are_data_masks() -> None:
    """data_masks finds the select's mask on the document kernel, and leaves the affine causal
    mask (an index predicate) to masks.stream_masks."""
    thm = _document_theorem()
    lay = lower(thm, target="pallas", tiles={"gq": 32, "sx": 32})
    assert "pair_kinds(chunk_kind" in lay.source
    causal = {r.name: r.theorem for r in check_file(ROOT / "proofs" / "flash_attention.ncd")}["flash_attention_causal"]
    assert "live" not in lower(causal, target="pallas", tiles={"gq": 32, "sx": 32}).source


def test_the_cost_of_a_document_mask_is_the_live_fraction_of_its_chunks() -> None:
    """Eight documents of 2048 tokens at q = x = 16384 (blocks of 128 queries, chunks of 64
    keys, bf16 values, int32 ids): a document kernel moves Q, O and Dq once, and the chunks of
    K, V and Dx of the live pairs only (``block_liveness``: 1/8 for the document mask, about
    1/15 with the diagonal too); its block mask, computed before it, reads Dq and Dx once,
    writes the kind of every (program, chunk) pair and reads it back, writes each program's
    live-chunk list and flags (a count, then one entry per chunk), and the kernel reads a count
    per program and a chunk index and a FULL flag per live pair.  The causal document kernel
    moves under a sixth of the bytes of the causal kernel (which runs half its pairs); the
    document mask alone just over a quarter (1/8 of the pairs against a little over 1/2, plus
    the same Q and O).  ``--live`` 1 (the default) is the bound for any data: every chunk."""
    ids = np.repeat(np.arange(8), 2048)
    pos = np.arange(16384)
    same = ids[:, None] == ids[None, :]
    live_causal = float(block_liveness(same & (pos[:, None] >= pos[None, :]), 128, 64).mean())
    live_doc = float(block_liveness(same, 128, 64).mean())
    assert live_doc == 1 / 8 and 1 / 16 < live_causal < 1 / 14
    sizes, at = {"q": 16384, "x": 16384}, {"gq": 128, "sx": 64}
    causal = {r.name: r.theorem for r in check_file(ROOT / "proofs" / "flash_attention.ncd")}["flash_attention_causal"]

    def moved(thm: Any, live: float = 1.0) -> float:
        c = cost(thm, hardware="h200", sizes=sizes, live=live)
        return float(c.at(c.level("smem").transfers_bytes, at))

    def by_hand(live: float) -> float:
        programs, chunks, bf16, int32 = 16384 // 128, 16384 // 64, 2, 4
        q_and_o, dq = 2 * 16384 * 64 * bf16, 16384 * int32
        streamed = live * programs * 16384 * (2 * 64 * bf16 + int32)  # K, V and Dx of the live pairs
        pairs = programs * chunks
        block_mask = 2 * 16384 * int32 + int32 * (2 * pairs + 2 * (pairs + programs) + programs + 2 * live * pairs)
        return q_and_o + dq + streamed + block_mask

    dense = moved(causal)
    causal_document = moved(_document_theorem("flash_causal_document_attention"), live_causal)
    assert causal_document == by_hand(live_causal) and causal_document <= dense / 6
    document = moved(_document_theorem(), live_doc)
    assert document == by_hand(1 / 8) and dense / 4 < document < dense * 0.27
    assert moved(_document_theorem()) == by_hand(1.0)  # every chunk, the bound for any data


def test_integer_inputs_cost_their_own_width_whatever_the_float_dtype() -> None:
    """Segment ids are int32 (``hardware.INT_BYTES``) in an f32, a bf16 and an fp8 kernel alike,
    and a dtype for one is refused rather than silently narrowing an id."""
    thm = _document_theorem()
    for dtype in ("f32", "bf16", "fp8"):
        c = cost(thm, hardware="h200", dtype=dtype)
        assert c.bytes_of["Dq"] == c.bytes_of["Dx"] == 4
    with pytest.raises(CostError, match="integer inputs"):
        cost(thm, hardware="h200", dtypes={"Dx": "bf16"})


@pytest.mark.parametrize("target", ["pallas", "jax"])
def test_ids_stay_exact_in_a_bf16_kernel(target: str) -> None:
    """Ids 300 to 303 are one bf16 value apart at best (bf16 rounds 301 to 300): a kernel that
    stored them in its dtype would merge documents.  Integer inputs are stored and compared as
    int32, so the bf16 kernel keeps every document apart (its error is bf16 rounding of the
    values), whether they are passed as integers or as floats; a complex array is refused."""
    thm = _document_theorem()
    rng = np.random.default_rng(6)
    Q, K, V = _qkv(rng, q=40, x=40)
    ids = np.repeat(np.arange(300, 304), 10)
    want = napkin_cat.run(thm.source, Q, K, V, ids, ids)
    lowered = lower(thm, target=target, tiles={"gq": 16, "sx": 16}, dtype="bfloat16")
    extra = {"interpret": True} if target == "pallas" else {}
    got = np.asarray(lowered.fn(*(_device(a) for a in (Q, K, V, ids, ids)), **extra), np.float64)
    assert np.abs(got - want).max() < 0.05
    floats = lowered.fn(*(jnp.asarray(a, jnp.float32) for a in (Q, K, V, ids, ids)), **extra)
    assert np.array_equal(np.asarray(floats, np.float64), got)
    with pytest.raises(TypeError, match="declared int"):
        lowered.fn(*(_device(a) for a in (Q, K, V)), jnp.asarray(ids, jnp.complex64), _device(ids), **extra)


def _paged_theorem() -> Any:
    return {r.name: r.theorem for r in check_file(ROOT / "proofs" / "paged_attention.ncd")}["flash_paged_attention"]


@pytest.mark.parametrize("target", ["pallas", "jax"])
def test_paged_attention_is_dense_attention_on_the_gathered_keys(target: str) -> None:
    """K and V read from a pool of 7 pages through a page table of 37 pages per sequence (some
    numbers outside the pool: clamped into it), streamed in chunks of 16 pages, at a ragged
    number of queries and pages: the kernel equals softmax attention over the keys numpy
    gathers, as the evaluator does exactly, and reads the pool only at the rows the chunk's page
    numbers name (an indexed load; the pool is never loaded whole)."""
    thm = _paged_theorem()
    rng = np.random.default_rng(4)
    b, q, n, s = 2, 20, 7, 16
    Q, Kp, Vp = rng.standard_normal((b, q, 64)), rng.standard_normal((n, s, 64)), rng.standard_normal((n, s, 64))
    page = rng.integers(-2, n + 3, size=(b, 37))
    K, V = (pool[np.clip(page, 0, n - 1)].reshape(b, -1, 64) for pool in (Kp, Vp))
    scores = np.einsum("bqd,bxd->bqx", Q, K) / 8.0
    dense = np.einsum("bqx,bxd->bqd", _softmax_rows(scores), V)
    assert np.abs(napkin_cat.run(thm.source, Q, Kp, Vp, page) - dense).max() < 1e-12
    lowered = lower(thm, target=target, tiles={"gq": 16, "sj": 16})
    read = "Kp_ref[jnp.asarray(jnp.clip(page_chunk" if target == "pallas" else "jnp.take(Kp"
    assert read in lowered.source and "Kp_block" not in lowered.source
    extra = {"interpret": True} if target == "pallas" else {}
    got = lowered.fn(*(_device(a) for a in (Q, Kp, Vp, page)), **extra)
    assert np.abs(np.asarray(got) - dense).max() < 1e-5


def test_paged_attention_costs_the_pages_it_reads_not_the_pool() -> None:
    """A pool of 4096 pages of 16 slots, 4 sequences of 64 pages, one query each (decoding),
    bf16 values and int32 page numbers: each program moves its query and output, its 64 page
    numbers and the 64 pages of K and V they name, whatever the size of the pool."""
    thm = _paged_theorem()
    for pool in (4096, 100000):
        c = cost(thm, hardware="h200", sizes={"b": 4, "q": 1, "n": pool, "s": 16, "j": 64})
        moved = float(c.at(c.level("smem").transfers_bytes, {"gq": 1, "sj": 16}))
        per_program = 2 * 64 * 2 + 64 * 4 + 2 * 64 * 16 * 64 * 2
        assert moved == 4 * per_program


def test_keys_past_each_length_are_skipped() -> None:
    """Key padding: batch element 0 holds 40 keys, element 1 holds 70 of 128; with chunks of 32
    the chunks past each length are never run (NaN values there never reach the output)."""
    thm = _document_theorem("flash_padded_attention")
    rng = np.random.default_rng(5)
    Q, K, V = _qkv(rng, 2, q=32, x=128)
    length = np.array([40, 70])
    want = napkin_cat.run(thm.source, Q, K, V, length)
    poisoned = V.copy()
    poisoned[0, 64:] = np.nan
    poisoned[1, 96:] = np.nan
    lowered = lower(thm, target="pallas", tiles={"gq": 32, "sx": 32})
    got = lowered.fn(*(_device(a) for a in (Q, K, poisoned, length)), interpret=True)
    assert np.abs(np.asarray(got) - want).max() < 1e-5


def _t5_bucket(relative: np.ndarray, buckets: int = 32, max_distance: int = 128) -> np.ndarray:
    """HF T5's bidirectional ``_relative_position_bucket`` of ``relative`` = key - query."""
    half = buckets // 2
    exact = half // 2
    distance = np.abs(relative)
    scaled = np.log(np.maximum(distance, 1) / exact) / np.log(max_distance / exact) * (half - exact)
    large = np.minimum(exact + scaled.astype(int), half - 1)
    return (relative > 0) * half + np.where(distance < exact, distance, large)


@pytest.mark.parametrize("target", ["pallas", "jax"])
def test_t5_bias_matches_t5_and_its_table_gets_the_scatter_added_gradient(target: str) -> None:
    """T5's relative-position bias (32 buckets, max distance 128) read through the bucket table of
    distances -128 .. 127, at ragged sizes: the kernel equals attention with the bias T5 computes
    (distances past the table clamped, as T5 clamps them to its last bucket), and the gradient
    of the bias table (napkin's VJP of gather: a scatter-add) matches central differences of the
    numpy reference.  Both tables are read at the rows the positions name, never loaded whole."""
    thm = {r.name: r.theorem for r in check_file(ROOT / "proofs" / "relative_bias.ncd")}["flash_t5_attention"]
    rng = np.random.default_rng(7)
    Q, K, V = _qkv(rng, q=45, x=37)
    table = rng.standard_normal(32)
    bucket = _t5_bucket(np.arange(256) - 128)
    bias_at = _t5_bucket(np.clip(np.arange(37)[None, :] - np.arange(45)[:, None], -128, 127))

    def reference(t: np.ndarray) -> np.ndarray:
        return _softmax_rows(Q @ K.T / 8.0 + t[bias_at]) @ V

    want = reference(table)
    assert np.abs(napkin_cat.run(thm.source, Q, K, V, table, bucket) - want).max() < 1e-12
    lowered = lower(thm, target=target, tiles={"gq": 16, "sx": 16})
    read = "bucket_ref[jnp.asarray(jnp.clip(" if target == "pallas" else "jnp.take(bucket"
    assert read in lowered.source and "bucket_block" not in lowered.source
    extra = {"interpret": True} if target == "pallas" else {}
    args = [_device(a) for a in (Q, K, V, table, bucket)]
    assert np.abs(np.asarray(lowered.fn(*args, **extra)) - want).max() < 1e-5
    grad = jax.grad(lambda t: lowered.fn(*args[:3], t, args[4], **extra).sum())(args[3])
    step = 1e-6
    numeric = [(reference(table + step * e).sum() - reference(table - step * e).sum()) / (2 * step) for e in np.eye(32)]
    assert np.abs(np.asarray(grad) - np.array(numeric)).max() < 1e-4


def _chunk_functions(source: str, prefix: str) -> list[str]:
    """The source of every function of the generated module whose name starts with ``prefix``."""
    import ast
    return [ast.unparse(node) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef) and node.name.startswith(prefix)]


@pytest.mark.parametrize("target", ["pallas", "jax"])
def test_full_chunks_run_without_their_mask_chain(target: str) -> None:
    """The block mask's FULL chunks (the mask nonzero at every real position) compute the chain
    of selects and wheres as its value operand: the step of a full chunk has neither the
    document select (``!= 0``) nor the causal where (``>=``); a partial chunk's has both."""
    thm = _document_theorem("flash_causal_document_attention")
    source = lower(thm, target=target, tiles={"gq": 16, "sx": 16}).source
    (full,), (partial,) = _chunk_functions(source, "full_chunk"), _chunk_functions(source, "partial_chunk")
    assert "!= 0" not in full and ">=" not in full
    assert "!= 0" in partial and ">=" in partial


def _ragged_cases() -> list[tuple[str, list[np.ndarray]]]:
    rng = np.random.default_rng(8)
    Q, K, V = _qkv(rng, q=45, x=37)
    dq, dx = np.repeat([0, 1, 2], [20, 15, 10]), np.repeat([0, 1, 2], [16, 5, 16])
    Qc, Kc, Vc = _qkv(rng, q=45, x=45)
    d = np.repeat([3, 4, 6], [7, 30, 8])
    Qs, Ks, Vs = _qkv(rng, q=40, x=40)
    Qb, Kb, Vb = _qkv(rng, 3, q=20, x=37)
    return [("flash_document_attention", [Q, K, V, dq, dx]),
            ("flash_causal_document_attention", [Qc, Kc, Vc, d, d]),
            # one document: every real pair is FULL, the last chunk half padding (masked by the padding law)
            ("flash_document_attention", [Qs, Ks, Vs, np.zeros(40, int), np.zeros(40, int)]),
            ("flash_padded_attention", [Qb, Kb, Vb, np.array([37, 16, 5])])]


@pytest.mark.parametrize("target", ["pallas", "jax"])
@pytest.mark.parametrize("case", range(4))
def test_block_masked_kernels_equal_the_evaluator_at_ragged_sizes(target: str, case: int) -> None:
    """Document (ids of uneven documents, queries and keys apart), causal document, one document
    (FULL chunks with padding) and key padding, at sizes no tile divides, with tiles of 16: each
    kernel equals the float64 evaluator, its chunks empty, partial and full alike."""
    name, args = _ragged_cases()[case]
    thm = _document_theorem(name)
    want = napkin_cat.run(thm.source, *args)
    lowered = lower(thm, target=target, tiles={"gq": 16, "sx": 16})
    extra = {"interpret": True} if target == "pallas" else {}
    got = np.asarray(lowered.fn(*(_device(a) for a in args), **extra))
    assert np.abs(got - want).max() < 1e-5


def test_the_block_mask_lists_each_programs_live_chunks_in_order() -> None:
    """``runtime.live_chunks``: per program, the count of chunks that are not empty, their
    indices in ascending order (the loop's order: no accumulator need commute), and a 1 for each
    full one, padded to a power of two; ``datamask.block_kinds`` states the kinds in numpy."""
    from napkin_cat.lower.runtime import live_chunks
    kinds = jnp.asarray([[0, 2, 1, 0, 2], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]], jnp.int32)
    plan, flags = (np.asarray(a) for a in live_chunks(kinds))
    assert plan.shape == flags.shape == (3, 16)
    assert plan[0, :4].tolist() == [3, 1, 2, 4] and flags[0, 1:4].tolist() == [1, 0, 1]
    assert plan[1, :2].tolist() == [1, 0] and flags[1, 1] == 0 and plan[2, 0] == 0
    ids = np.repeat([0, 1], [20, 12])  # blocks and chunks of 8: one straddles the boundary
    assert block_kinds(ids[:, None] == ids[None, :], 8, 8).tolist() == [
        [2, 2, 1, 0], [2, 2, 1, 0], [1, 1, 1, 1], [0, 0, 1, 2]]
    assert block_kinds(np.ones((5, 5)), 4, 4).tolist() == [[2, 2], [2, 2]]  # padding is no hole


@pytest.mark.parametrize("ids", [np.repeat([3, 4, 6], [7, 46, 8]), np.zeros(61, int)])
def test_the_pallas_block_mask_is_exact_on_real_positions(ids: np.ndarray) -> None:
    """The kinds the Pallas wrapper computes (recorded as they reach ``live_chunks``) are
    ``datamask.block_kinds`` of the causal document mask over the 61 real queries and keys, in
    blocks and chunks of 16 (64 padded): empty above the diagonal and across documents, full
    where the whole real tile is one document below the diagonal (the padded last row and
    column are no hole), partial elsewhere; the kernel runs the count of live chunks each."""
    thm = _document_theorem("flash_causal_document_attention")
    lowered = lower(thm, target="pallas", tiles={"gq": 16, "sx": 16})
    namespace = lowered.forward.__globals__
    recorded: list[np.ndarray] = []
    original = namespace["live_chunks"]

    def recording(kinds: Any) -> Any:
        recorded.append(np.asarray(kinds))
        return original(kinds)

    rng = np.random.default_rng(9)
    Q, K, V = _qkv(rng, q=61, x=61)
    namespace["live_chunks"] = recording
    try:
        got = np.asarray(lowered.forward(*(_device(a) for a in (Q, K, V, ids, ids)), interpret=True))
    finally:
        namespace["live_chunks"] = original
    causal = np.arange(61)[:, None] >= np.arange(61)[None, :]
    want = block_kinds((ids[:, None] == ids[None, :]) & causal, 16, 16)
    assert recorded[0].tolist() == want.tolist() and (want == 2).any() and (want == 0).any()
    assert np.abs(got - napkin_cat.run(thm.source, Q, K, V, ids, ids)).max() < 1e-5
