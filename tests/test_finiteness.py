"""The finiteness analysis that discharges a lemma's `when c finite` (napkin_cat.finiteness)."""

from __future__ import annotations

import pytest

from napkin_cat import certify, kernel
from napkin_cat.certify import accumulators, rules
from napkin_cat.elaborate import loads
from napkin_cat.finiteness import finite, unsupported
from napkin_cat.kernel import KernelError
from napkin_cat.proof import check_module
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
    ("exp(where[q x](q >= x, S, -inf) - T)", True),  # exp(-inf) = 0: masked weights
    ("exp(where[q x](q >= x, S, inf))", False),      # exp(inf) = inf
    ("exp(where[q x](q >= x, S, -inf) * -1.0)", False),  # -(-inf) = inf
    ("exp(where[q x](q >= x, S, -inf) - where[q x](q >= x, T, -inf))", False),  # -inf - -inf = NaN
    ("sign(S) * T", True),
    ("T / (S + (1 - square(sign(S))))", True),       # the guarded divisor: 1 where S = 0, S elsewhere
    ("T / (S + (1 - abs(sign(S))))", True),
    ("recip((1 - square(sign(S))) + S)", True),
    ("T / (S + (1 - square(sign(T))))", False),      # guarded by another term: 0 at S = 0, T = 1
    ("T / (S + (1 - sign(S)))", False),              # 0 at S = -1/2
    ("T / (S + (2 - square(sign(S))))", False),      # S + 1 for S != 0: 0 at S = -1
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


def test_an_accumulator_use_on_an_operand_that_may_be_infinite_needs_a_test_with_infinities() -> None:
    """A proved or tested accumulator covers finite operands (a proved one also the -inf masks it
    names); on an operand that may be +inf it is backed only where certify.infinite_tested ran
    it with infinite entries and it agreed with the box.  logsumexp does not (a +inf row: box
    +inf, stream NaN), sum does."""
    for op, name, infinite in (("logsumexp", "logsumexp", ""), ("sum", "sum", " [infinite: X0]")):
        box = next(b for b, axis in certify.representative_boxes() if b.op == op)
        marker = certify.infinite_tested(certify.canonical(box, "x"), "x", name)
        assert marker == " [-inf tested: X0]" + infinite and name in accumulators.accumulators_for(box, "x")
    module = loads("axis q, x\n"
                   "diagram lse(S: [q x]) -> [q] {\n  L = logsumexp[x](where[q x](x <= q, S, inf))\n  return L\n}\n"
                   "diagram total(S: [q x]) -> [q] {\n  L = sum[x](where[q x](x <= q, S, inf))\n  return L\n}\n"
                   "theorem a: lse {\n  stream x by sx via logsumexp\n}\n"
                   "theorem b: total {\n  stream x by sx via sum\n}\n")
    refused, accepted = check_module(module)
    assert refused.failure is not None and "may be infinite here" in refused.failure.message
    assert accepted.ok and any("tested here" in t for t in accepted.theorem.trust)  # tested with +inf, not proved
    diagram = module.diagram("lse")
    term = {"X0": diagram.body[0].expr.args[0]}
    assert unsupported("proved: laws", diagram, term) is not None
    assert unsupported("proved: laws [-inf tested: X0]", diagram, term) is not None  # a +inf mask is no -inf one
    assert unsupported("proved: laws [infinite: X0]", diagram, term) is None
    # bounded tests run on finite inputs: a tested accumulator is held to the same coverage
    # (found by the differential run: a tested normalised state over +inf scores gave NaN for 0)
    assert unsupported("tested: float64", diagram, term) is not None
    assert unsupported("tested: float64 [infinite: X0]", diagram, term) is None
