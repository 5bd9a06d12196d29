"""The finiteness analysis that discharges a lemma's `when c finite` (napkin_cat.finiteness)."""

from __future__ import annotations

import pytest

from napkin_cat import kernel
from napkin_cat.certify import rules
from napkin_cat.elaborate import loads
from napkin_cat.finiteness import finite
from napkin_cat.kernel import KernelError
from napkin_cat.terms import Box, Rewrite, Var

HEADER = "axis q, x\ndiagram f(S: [q x], T: [q x]) -> [q x] {\n"


def _term(text: str) -> tuple[bool, str]:
    diagram = loads(f"{HEADER}  C = {text}\n  return S - C\n}}\n").diagram("f")
    defs = {let.names[0]: let.expr for let in diagram.body}
    return finite(defs["C"], defs, {p.name for p in diagram.inputs}), text


@pytest.mark.parametrize(("text", "expected"), [
    ("max[x](S)", True),
    ("logsumexp[x](S) * 2.0", True),
    ("S / x", True),                                   # a size is positive
    ("S / exp(T)", True),
    ("log(sum[x](exp(S)) + 1.0)", False),              # a sum of positives is not tracked: refused, not guessed
    ("recip(0.0)", False),
    ("-inf", False),
    ("max[x](where[q x](x > q, S, -inf))", False),     # a fully masked row's maximum is -inf
    ("S / T", False),
    ("log(relu(S))", False),
    ("sqrt(S)", False),
    ("sqrt(square(S))", True),
    ("rsqrt(x) * S", True),
])
def test_finite_vouches_only_for_what_holds_on_every_finite_input(text: str, expected: bool) -> None:
    assert _term(text)[0] is expected, text


def test_a_binding_is_read_through() -> None:
    diagram = loads(f"{HEADER}  M = where[q x](x > q, S, -inf)\n  C = max[x](M)\n  return S - C\n}}\n").diagram("f")
    defs = {let.names[0]: let.expr for let in diagram.body}
    assert not finite(defs["C"], defs, {"S", "T"})


def test_a_shift_lemma_applies_to_a_finite_shift_only() -> None:
    text = ("axis q, x\ndiagram f(S: [q x]) -> [q x] {\n  P = softmax[x](S - max[x](S))\n  return P\n}\n"
            "diagram g(S: [q x]) -> [q x] {\n  M = where[q x](x <= q, S, -inf)\n  P = softmax[x](M - max[x](M))\n"
            "  return P\n}\n")
    module, lemma = loads(text), rules.library()["softmax_shift"]
    step = Rewrite("softmax_shift", ("P",))
    thm = kernel.rewrite(kernel.refl("t", module.diagram("f")), lemma, step, {"softmax_shift": "tested: t"})
    assert "lemma softmax_shift" in "; ".join(thm.trust)
    with pytest.raises(KernelError, match=r"^instantiate: lemma `softmax_shift` holds when `c` is finite"):
        kernel.rewrite(kernel.refl("t", module.diagram("g")), lemma, step, {"softmax_shift": "tested: t"})


@pytest.mark.parametrize(("text", "expected"), [
    ("where[q x](x <= q, S, -inf)", True),
    ("where[q x](x <= q, S, -inf) - max[x](T)", True),
    ("where[q x](x <= q, S, -inf) * 0.5", True),
    ("where[q x](x <= q, S, -inf) * -0.5", False),     # a negative scale turns -inf into +inf
    ("max[x](T) - where[q x](x <= q, S, -inf)", False),  # finite - (-inf) is +inf
    ("where[q x](x <= q, S, inf)", False),
    ("where[q x](x <= q, S, -inf) + where[q x](x >= q, T, -inf)", True),
])
def test_masked_allows_minus_inf_and_nothing_worse(text: str, expected: bool) -> None:
    from napkin_cat.finiteness import masked

    diagram = loads(f"{HEADER}  C = {text}\n  return C\n}}\n").diagram("f")
    defs = {let.names[0]: let.expr for let in diagram.body}
    assert masked(defs["C"], defs, {"S", "T"}) is expected, text


def test_a_proof_covers_a_use_only_on_its_domain() -> None:
    """A proof on finite inputs, naming S as also proved with masks: a masked S keeps it
    proved, a masked V (not named) or an S that may be +inf makes the use only tested."""
    from napkin_cat.finiteness import narrowed

    diagram = loads(f"{HEADER}  M = where[q x](x <= q, S, -inf)\n  return M\n}}\n").diagram("f")
    how = "proved: test [-inf masks: S]"
    masked_s = {"S": Var("M", ("q", "x")), "V": Var("T", ("q", "x"))}
    assert narrowed(how, diagram, masked_s) == how
    assert narrowed(how, diagram, {"S": Var("T", ("q", "x")), "V": Var("M", ("q", "x"))}).startswith("tested here")
    assert narrowed("proved: test", diagram, masked_s).startswith("tested here")
    plus = Box("neg", (Var("M", ("q", "x")),), ("q", "x"))
    assert narrowed(how, diagram, {"S": plus}).startswith("tested here")
