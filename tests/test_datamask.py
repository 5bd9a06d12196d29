"""Data-dependent masks and gathers (issue 30): integer inputs, comparisons, select, gather.

The evaluator is exact on them (checked against numpy written out by hand), the printer
round-trips them, and every misuse is a located diagnostic, not a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import napkin_cat
from napkin_cat.cost import cost
from napkin_cat.diagnostics import NapkinError
from napkin_cat.elaborate import load, loads
from napkin_cat.lower import lower
from napkin_cat.printer import print_module
from napkin_cat.proof import check_file, prove
from napkin_cat.schedule.datamask import block_liveness
from tests.test_elaborate import one_error

ROOT = Path(__file__).resolve().parent.parent

EXAMPLES = load(ROOT / "examples" / "masked_attention.ncd")


def _softmax_rows(s: np.ndarray) -> np.ndarray:
    """softmax over the last axis, a fully masked (-inf) row giving 0, as the evaluator defines it."""
    m = np.max(s, axis=-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(m), m, 0.0))
    z = np.sum(e, axis=-1, keepdims=True)
    return np.where(z == 0, 0.0, e / np.where(z == 0, 1.0, z))


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
    their kernels skip it; the rows of the two that run it are NaN."""
    thm = _document_theorem()
    rng = np.random.default_rng(0)
    Q, K, V = _qkv(rng, q=150, x=150)
    ids = np.repeat(np.arange(5), 30).astype(np.float64)
    live = block_liveness(ids[:, None] == ids[None, :], 32, 32)
    assert live.sum() == 13 and not live[:3, 4].any() and live[3:, 4].all()
    want = napkin_cat.run(thm.source, Q, K, V, ids, ids)
    poisoned = V.copy()
    poisoned[128:] = np.nan
    lowered = lower(thm, target=target, tiles={"gq": 32, "sx": 32})
    assert "lax.cond(live" in lowered.source
    extra = {"interpret": True} if target == "pallas" else {}
    got = np.asarray(lowered.fn(*(jnp.asarray(a, jnp.float32) for a in (Q, K, poisoned, ids, ids)), **extra))
    assert np.all(np.isnan(got[96:]).any(axis=1))
    assert np.abs(got[:96] - want[:96]).max() < 1e-5
    clean = np.asarray(lowered.fn(*(jnp.asarray(a, jnp.float32) for a in (Q, K, V, ids, ids)), **extra))
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
    ids = np.repeat(np.arange(4), 10).astype(np.float64)
    got = lowered.fn(*(jnp.asarray(a, jnp.float32) for a in (Q, K, V, ids, ids)), interpret=True)
    assert np.abs(np.asarray(got) - napkin_cat.run(thm.source, Q, K, V, ids, ids)).max() < 1e-5


def test_only_masks_read_from_data_are_data_masks() -> None:
    """data_masks finds the select's mask on the document kernel, and leaves the affine causal
    mask (an index predicate) to masks.stream_masks."""
    thm = _document_theorem()
    lay = lower(thm, target="pallas", tiles={"gq": 32, "sx": 32})
    assert "live = jnp.max" in lay.source
    causal = {r.name: r.theorem for r in check_file(ROOT / "proofs" / "flash_attention.ncd")}["flash_attention_causal"]
    assert "live" not in lower(causal, target="pallas", tiles={"gq": 32, "sx": 32}).source


def test_the_cost_of_a_document_mask_is_the_live_fraction_of_its_chunks() -> None:
    """Eight documents of 2048 tokens at q = x = 16384 (blocks of 128 queries, chunks of 64
    keys): the causal document kernel runs the pairs ``block_liveness`` finds live (documents
    and diagonal, about 1/15), and costed at that fraction it moves under a quarter of the
    bytes of the causal kernel (which runs half).  The document mask alone leaves 1/8 live:
    1/4 of the causal stream's chunks, plus its segment ids.  ``--live`` 1 (the default) is the
    bound for any data: every chunk."""
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

    dense = moved(causal)
    assert moved(_document_theorem("flash_causal_document_attention"), live_causal) <= dense / 4
    document = moved(_document_theorem(), live_doc)
    assert dense / 4 < document < dense / 4 * 1.05  # 129 values per key (K, V, the id) against 128
    assert moved(_document_theorem()) > 7 * document  # every chunk (the bound for any data): about 8 times


#: one program per batch element and block of queries, each reading its keys through the page table
#: (the gather mixes the pool axis n, so n is never tiled; the keys run along pages j and slots s,
#: whole in each program: small pools only, as a Triton block holds at most 2^20 values, so this
#: theorem is not among proofs/, whose kernels all cross-lower for the H200 at sizes up to 300)
PAGED = ("group b by 1", "group q by gq")


@pytest.mark.parametrize("target", ["pallas", "jax"])
def test_paged_attention_is_dense_attention_on_the_gathered_keys(target: str) -> None:
    """K and V read from a pool of 7 pages through a page table (9 and -1 lie outside the pool:
    clamped to pages 6 and 0), at a ragged number of queries and pool pages: the kernel equals
    softmax attention over the keys gathered by numpy, as the evaluator does exactly."""
    text = 'use "../examples/masked_attention.ncd"\ntheorem paged: paged_attention {\n' + "\n".join(PAGED) + "\n}\n"
    thm = prove(loads(text, str(ROOT / "proofs" / "paged.ncd")), "paged")
    rng = np.random.default_rng(4)
    b, q, n, s = 2, 20, 7, 16
    Q, Kp, Vp = rng.standard_normal((b, q, 64)), rng.standard_normal((n, s, 64)), rng.standard_normal((n, s, 64))
    page = np.array([[4, 0, 6, 9], [2, 2, 5, -1]])
    K, V = (pool[np.clip(page, 0, n - 1)].reshape(b, -1, 64) for pool in (Kp, Vp))
    scores = np.einsum("bqd,bxd->bqx", Q, K) / 8.0
    dense = np.einsum("bqx,bxd->bqd", _softmax_rows(scores), V)
    assert np.abs(napkin_cat.run(thm.source, Q, Kp, Vp, page) - dense).max() < 1e-12
    lowered = lower(thm, target=target, tiles={"gq": 16})
    extra = {"interpret": True} if target == "pallas" else {}
    got = lowered.fn(*(jnp.asarray(a, jnp.float32) for a in (Q, Kp, Vp, page)), **extra)
    assert np.abs(np.asarray(got) - dense).max() < 1e-5


def test_keys_past_each_length_are_skipped() -> None:
    """Key padding: batch element 0 holds 40 keys, element 1 holds 70 of 128; with chunks of 32
    the chunks past each length are never run (NaN values there never reach the output)."""
    thm = _document_theorem("flash_padded_attention")
    rng = np.random.default_rng(5)
    Q, K, V = _qkv(rng, 2, q=32, x=128)
    length = np.array([40.0, 70.0])
    want = napkin_cat.run(thm.source, Q, K, V, length)
    poisoned = V.copy()
    poisoned[0, 64:] = np.nan
    poisoned[1, 96:] = np.nan
    lowered = lower(thm, target="pallas", tiles={"gq": 32, "sx": 32})
    got = lowered.fn(*(jnp.asarray(a, jnp.float32) for a in (Q, K, poisoned, length)), interpret=True)
    assert np.abs(np.asarray(got) - want).max() < 1e-5
