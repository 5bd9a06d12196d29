"""Data-dependent masks and gathers (issue 30): integer inputs, comparisons, select, gather.

The evaluator is exact on them (checked against numpy written out by hand), the printer
round-trips them, and every misuse is a located diagnostic, not a traceback.
"""

from __future__ import annotations

import numpy as np
import pytest

import napkin_cat
from napkin_cat.diagnostics import NapkinError
from napkin_cat.elaborate import load, loads
from napkin_cat.printer import print_module
from tests.test_elaborate import one_error

EXAMPLES = napkin_cat.elaborate.load("examples/masked_attention.ncd")


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
    module = load("examples/masked_attention.ncd")
    assert loads(print_module(module), "examples/masked_attention.ncd") == module
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
