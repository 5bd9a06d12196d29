"""Proof files through the kernel, and `napkin check`."""

from __future__ import annotations

from pathlib import Path

import pytest

from napkin_cat.cli import main
from napkin_cat.diagnostics import NapkinError
from napkin_cat.elaborate import loads
from napkin_cat.proof import check_file, check_module, describe_step, theorem

ROOT = Path(__file__).resolve().parent.parent
PROOFS = ROOT / "proofs"
UNSOUND = Path(__file__).with_name("unsound")


def test_every_proof_file_checks() -> None:
    names = {r.name: r for path in PROOFS.glob("*.ncd") for r in check_file(path)}
    for required in ("tiled_matmul", "flash_attention", "flash_attention_causal", "flash_attention_two_level",
                     "flash_gqa", "flash_sign", "streamed_cross_entropy", "fused_linear"):
        assert names[required].ok, names[required].failure
    assert all(r.ok for r in names.values())


def test_flash_attention_theorem_exposes_the_schedule() -> None:
    thm = theorem(PROOFS / "flash_attention.ncd", "flash_attention")
    kinds = [(p.kind, p.axis, p.tile, p.via) for p in thm.schedule.partitions]
    assert kinds == [("group", "q", "gq", None), ("stream", "x", "sx", "online_softmax")]
    assert thm.schedule.level_of("S") == "smem"
    assert [str(c) for c in thm.constraints] == ["gq | q", "sx | x"]
    assert thm.result.binding("O").expr.op == "ncontract"  # type: ignore[union-attr]
    assert thm.source.binding("P").expr.op == "softmax"  # type: ignore[union-attr]


def test_two_level_records_nested_divisibility() -> None:
    thm = theorem(PROOFS / "flash_attention.ncd", "flash_attention_two_level")
    assert "wq | gq" in [str(c) for c in thm.constraints]
    assert [p.level for p in thm.schedule.partitions] == ["smem", "smem", "reg", "reg"]


def test_summary_lines() -> None:
    (ok,) = [r for r in check_file(PROOFS / "matmul.ncd") if r.name == "tiled_matmul"]
    line = ok.summary()
    assert line.startswith("tiled_matmul ≡: group a by ga at smem; group c by gc at smem; stream b by sb")
    assert "trust:" in line and "accumulator sum" in line and "gc | c" in line
    (bad,) = check_file(UNSOUND / "stream_softmax_before_lemma.ncd")
    assert bad.summary() == "wrong: FAILED at step 2: stream x by sx at smem via online_softmax"
    assert bad.counterexample and "tile by tile" in bad.counterexample


def test_the_trust_line_lists_the_input_relations() -> None:
    """A backward pass is claimed only for inputs where its relations hold (the saved L is the
    forward's logsumexp): the trust line says so, with each relation; a theorem without one
    lists none."""
    results = {r.name: r for r in check_file(PROOFS / "flash_attention_backward.ncd")}
    line = results["flash_attention_backward_q"].summary()
    assert line.endswith("; given L = logsumexp[x](contract[d](Q, K) * rsqrt(d)))"), line
    hoisted = results["flash_attention_causal_backward_kv_hoisted"].summary()  # a chain: its source's relation
    assert "given L = logsumexp[x](where[q x](q >= x, contract[d](Q, K) * rsqrt(d), -inf))" in hoisted, hoisted
    assert "given" not in results["flash_attention_forward"].summary()


def test_no_counterexample_for_an_axis_no_input_carries() -> None:
    """Tiles are simulated by slicing inputs: grouping an absent axis, or one an index box
    makes (each 'tile' then starts at position 0), claimed the untouched diagram summed over
    two tiles as a counterexample."""
    (absent,) = check_file(UNSOUND / "axis_not_in_diagram.ncd")
    assert absent.step == 1 and absent.counterexample is None
    module = loads("axis q, v\ndiagram f(L: [q]) -> [q] {\n  return sum[v](L + index[v](v))\n}\n"
                   "theorem t: f {\n  group v by 2\n}\n")
    (made,) = check_module(module)
    assert made.failure is not None and made.counterexample is None


def test_a_logsumexp_streams_tiles_merge_by_log_add() -> None:
    """A logsumexp stream refused for a +inf operand (its state gives NaN where the box gives
    +inf) is right on seeded normal inputs: its tiles' logsumexps merge by log-add, not by +
    (which printed 6.25 tile by tile against 4.56 as a counterexample it was not)."""
    (refused,) = check_file(UNSOUND / "redteam_split_logsumexp_over_exp.ncd")
    assert refused.step == 1 and refused.failure is not None and "may be infinite" in refused.failure.message
    assert refused.counterexample is None


def test_refusal_carries_location() -> None:
    (bad,) = check_file(UNSOUND / "group_consumed_head_dim.ncd")
    assert bad.failure is not None and bad.failure.span is not None
    assert (bad.failure.span.line, bad.failure.span.col) == (7, 3)
    assert bad.failure.message.startswith("group: ")


def test_theorem_lookup_errors() -> None:
    with pytest.raises(NapkinError, match="unknown theorem `nope`"):
        theorem(PROOFS / "matmul.ncd", "nope")
    with pytest.raises(NapkinError, match="stream: box `softmax"):
        theorem(UNSOUND / "stream_softmax_before_lemma.ncd", "wrong")


def test_quantised_theorem_is_approximate() -> None:
    module = loads('use "examples/attention.ncd"\n'
                   "theorem q8: attention {\n  dtype K, V as bf16 tol 0.01\n}\n", str(ROOT / "q.ncd"))
    (result,) = check_module(module)
    assert result.ok and result.theorem is not None and not result.theorem.exact
    assert result.summary().startswith("q8 ≈: dtype K, V as bf16 tol 0.01")
    assert describe_step(module.theorems[0].steps[0]) == "dtype K, V as bf16 tol 0.01"


def test_cli_check_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(PROOFS / "matmul.ncd")]) == 0
    out = capsys.readouterr().out
    assert "tiled_matmul ≡" in out and "2 of 2 theorems checked" in out
    assert main(["check", str(UNSOUND / "wrong_accumulator_max.ncd")]) == 1
    captured = capsys.readouterr()
    assert "wrong_accumulator_max.ncd:9:3: error: stream: accumulator `max` cannot stream" in captured.err
    assert "counterexample:" in captured.err
    assert main(["check", str(ROOT / "no_such_dir")]) == 2


def test_cli_check_certify_fails_on_an_uncertified_library_lemma(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """CI runs `napkin check --certify`: a library lemma that fails certification must fail
    the run even if no bundled theorem uses it (it printed FAILED and exited 0)."""
    from napkin_cat import certify
    from napkin_cat.certify import rules

    false = loads("axis x\nlemma max_is_sum(A: [x]) : max[x](A) = sum[x](A)\n").lemmas[0]
    monkeypatch.setattr(rules, "library", lambda: {"max_is_sum": false})
    monkeypatch.setattr(certify, "representative_boxes", lambda: [])  # the lemma alone: fast
    assert main(["check", "--certify", str(PROOFS / "matmul.ncd")]) == 1
    out = capsys.readouterr().out
    assert "lemma max_is_sum: FAILED" in out
    assert out.splitlines()[-1] == "2 of 2 theorems checked; 1 lemma(s) or accumulator(s) FAILED certification"


_SWAPPED = """
axis q, x, d
diagram g(S: [q x], V: [x d]) -> [q d] {
  P = softmax[x](S)
  O = contract[x](V, P)
  return O
}
"""


def test_lemma_mismatch_prints_both_sides_and_hints_at_operand_order() -> None:
    """`contract[x](V, P)` is softmax_contract's left side with the operands swapped: the
    refusal prints the lemma's left side and the binding, and names contract_comm."""
    module = loads(_SWAPPED + "theorem t: g {\n  rewrite softmax_contract at P, O\n}\n")
    (result,) = check_module(module)
    assert result.failure is not None and result.step == 1
    message = result.failure.message
    assert "the left side is `contract[x](softmax[x](S), V)`, `O` is `contract[x](V, softmax[x](S))`" in message
    assert "has its operands in the other order" in message
    assert result.failure.hint == "swap them first: `rewrite contract_comm at O`"
    fixed = loads(_SWAPPED + "theorem t: g {\n  rewrite contract_comm at O\n  rewrite softmax_contract at P, O\n}\n")
    assert check_module(fixed)[0].ok


@pytest.mark.parametrize(("at", "fixed"), [("O", "P, O"), ("return", "P, return")])
def test_lemma_mismatch_at_an_unnamed_binding_hints_at_naming_it(at: str, fixed: str) -> None:
    """`P` is not inlined unless named; the refusal says so with the step that works."""
    text = _SWAPPED.replace("contract[x](V, P)", "contract[x](P, V)")
    if at == "return":
        text = text.replace("  return O", "  return contract[x](P, V)")
    module = loads(text + f"theorem t: g {{\n  rewrite softmax_contract at {at}\n}}\n")
    (result,) = check_module(module)
    assert result.failure is not None and result.step == 1
    what = "the returned expression" if at == "return" else "`O`"
    assert f"{what} is `contract[x](P, V)`; where the left side has `softmax[x](S)`, it has `P`" in \
        result.failure.message
    assert result.failure.hint == f"a binding is inlined only when named: `rewrite softmax_contract at {fixed}`"
    assert check_module(loads(text + f"theorem t: g {{\n  rewrite softmax_contract at {fixed}\n}}\n"))[0].ok


def test_lemma_mismatch_names_the_first_difference() -> None:
    module = loads(_SWAPPED.replace("softmax", "l2norm").replace("contract[x](V, P)", "contract[x](P, V)")
                   + "theorem t: g {\n  rewrite softmax_contract at P, O\n}\n")
    (result,) = check_module(module)
    assert result.failure is not None and result.failure.hint is None
    assert "where the left side has `softmax[x](S)`, it has `l2norm[x](S)`" in result.failure.message


def test_lemma_mismatch_inside_the_binding_names_the_sub_term_it_compared() -> None:
    """Regression: `rewrite softmax_contract at P` with P = softmax[x](contract[d](Q, K)) said
    "where the left side has `softmax[x](S)`, it has `Q`", as if P's root held Q: the comparison
    was against the contraction inside P, which the message did not name."""
    module = loads("axis q, x\naxis d = 4\ndiagram a(Q: [q d], K: [x d], V: [x d]) -> [q d] {\n"
                   "  P = softmax[x](contract[d](Q, K))\n  return contract[x](P, V)\n}\n"
                   "theorem t: a {\n  rewrite softmax_contract at P\n}\n")
    (result,) = check_module(module)
    assert result.failure is not None and result.step == 1
    assert ("`P` is `softmax[x](contract[d](Q, K))`; matched against `contract[d](Q, K)` inside `P`; where the "
            "left side has `softmax[x](S)`, it has `Q`") in result.failure.message
