"""The lemma library is named data, validated as rewrite rules when built."""

from __future__ import annotations

from pathlib import Path

import pytest

from napkin_cat.certify import rules
from napkin_cat.diagnostics import NapkinError
from napkin_cat.elaborate import load, loads


def test_library_has_the_issue_lemmas() -> None:
    names = set(rules.library())
    for required in ("softmax_contract", "l2_contract", "rms_contract", "online_softmax_shift", "softmax_shift",
                     "contract_comm", "contract_assoc", "contract_scale", "split_join", "join_split"):
        assert required in names
    assert rules.LIBRARY_PATH.name == "lemmas.ncd"


@pytest.mark.parametrize(("text", "reason"), [
    ("lemma a(A: [x], B: [x]) : sum[x](A) = sum[x](B)", "variable `B` of the right side does not occur on the left"),
    ("lemma b(A: [x]) : A = A", "the left side is a bare variable"),
    ("lemma c(A: [x y]) : exp(A) = exp(A)", "axis `x` is not named by any box on the left side"),
    ("lemma d(A: [x y]) : sum[x](A) = sum[x y](A)", "the sides have different types"),
    ("lemma e(A: [x]) : sum[x](A) = sum[x](A) when Z finite", "`when Z finite` names no variable of the left side"),
    ("lemma e(A: [x]) : sum[x](A) = total(A)", "the right side uses diagram `total` as a box"),
    ("lemma f(A: [x]) : total(A) = sum[x](A)", "the left side uses diagram `total` as a box"),
])
def test_validation_refuses_malformed_rules(text: str, reason: str) -> None:
    callee = "diagram total(B: [x]) -> [] {\n  return sum[x](B)\n}\n"
    lemma = loads("axis x, y\n" + callee + text + "\n").lemmas[0]
    problems = rules.validate(lemma)
    assert any(reason in p.message for p in problems), [p.message for p in problems]
    assert all(p.code == "proof.lemma_invalid" and p.span is not None for p in problems)


def test_scope_merges_and_refuses_clashes() -> None:
    module = loads("axis x\nlemma mine(A: [x]) : sum[x](exp(A)) = sum[x](exp(A))\n")
    scope = rules.lemmas_in_scope(module)
    assert "mine" in scope and "softmax_contract" in scope
    clash = loads("axis x\nlemma softmax_shift(A: [x]) : sum[x](A) = sum[x](A)\n")
    with pytest.raises(NapkinError) as info:
        rules.lemmas_in_scope(clash)
    assert info.value.codes == ("name.duplicate",)
    assert "(first defined at lemmas.ncd)" in info.value.diagnostics[0].message


def test_a_lemma_named_twice_in_a_scope_names_where_it_first_was(tmp_path: Path) -> None:
    """Two used files stating `twice` differently: the refusal points at the other statement,
    not at the library (which has no `twice`)."""
    (tmp_path / "a.ncd").write_text("axis x\nlemma twice(S: [x]) : sum[x](S + S) = sum[x](S) + sum[x](S)\n")
    (tmp_path / "b.ncd").write_text("axis x\nlemma twice(S: [x]) : sum[x](S + S) = sum[x](S)\n")
    (tmp_path / "c.ncd").write_text('use "a.ncd"\nuse "b.ncd"\n')
    with pytest.raises(NapkinError) as info:
        rules.lemmas_in_scope(load(tmp_path / "c.ncd"))
    assert info.value.codes == ("name.duplicate",)
    assert f"(first defined at {tmp_path / 'a.ncd'}:2:1)" in info.value.diagnostics[0].message
