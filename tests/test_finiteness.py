"""The finiteness analysis that discharges a lemma's `when c finite` (napkin_cat.finiteness)."""

from __future__ import annotations

import math
import sys
from functools import cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from napkin_cat import certify, kernel, ops
from napkin_cat.certify import accumulators, rules
from napkin_cat.elaborate import loads
from napkin_cat.evaluate import FLOAT64, evaluate
from napkin_cat.finiteness import FINITE as FINITE_CLASSES
from napkin_cat.finiteness import RULES, TOP, UNARY, abstract, analyse, class_of, finite, fold_overflows, unsupported
from napkin_cat.kernel import KernelError
from napkin_cat.proof import check_module
from napkin_cat.terms import Box, Diagram, Expr, Rewrite, Var

HEADER = "axis q, x\ndiagram f(S: [q x], T: [q x]) -> [q x] {\n"


def _term(text: str) -> tuple[bool, str]:
    diagram = loads(f"{HEADER}  C = {text}\n  return S - C\n}}\n").diagram("f")
    defs = {let.names[0]: let.expr for let in diagram.body}
    return finite(defs["C"], defs, {p.name for p in diagram.inputs}), text


@pytest.mark.parametrize(("text", "expected"), [
    ("max[x](S)", True),
    ("logsumexp[x](S) * 2.0", True),
    ("S / x", True),                                   # a size is positive
    ("S / exp(T)", False),                             # float64's exp(-800) is 0
    ("S / exp(tanh(T))", True),                        # exp of a value in [-1, 1]
    ("log(sum[x](exp(S)) + 1.0)", False),              # float64's exp(1000) is inf
    ("log(sum[x](exp(tanh(S))) + 1.0)", True),         # a sum of positives (n >= 1) is positive
    ("exp(S)", False),                                 # finite over the reals, inf in float64 past 709.8
    ("exp(T - 5.0)", False),
    ("exp(sigmoid(S) * 700.0)", True),
    ("exp(sigmoid(S) * 710.0)", False),
    ("S * T", True),                                   # |S|, |T| ≤ 2^128: 2^256
    ("square(square(S))", True),
    ("square(square(square(S)))", False),              # S^8 overflows at |S| ≥ 2^128
    ("prod[x](S)", False),                             # a product over many positions overflows
    ("prod[x](tanh(S))", True),                        # ... unless its factors are in [-1, 1] (it may underflow to 0)
    ("recip(square(S) + 1.0)", True),
    ("log(prod[x](sigmoid(S)))", False),               # the product of values in (0, 1) underflows to 0
    ("softmax[x](S) * 1e300", True),                   # softmax weights are at most 1
    ("rmsnorm[x](S)", True),
    ("exp(logsumexp[x](S) - S)", False),               # no relational fact outside a normalisation
    ("log(sum[x](exp(where[q x](x > q, S, -inf))))", False),  # a fully masked row sums exp(-inf) = 0: log 0
    ("recip(exp(where[q x](x > q, S, -inf)))", False),  # exp of a mask is 0 there, not positive
    ("rsqrt(sum[x](exp(where[q x](x > q, S, -inf))))", False),
    ("log(exp(where[q x](x > q, S, -inf)))", False),
    ("sqrt(S - max[x](S))", False),                    # sqrt of a negative is NaN
    ("ncontract[x; id, id, id](S, T)", True),          # S / Σ S, and 0 where Σ S = 0
    ("ncontract[x; recip, exp, id](S, T)", False),     # recip(S) is infinite at S = 0, whatever the normaliser
    ("ncontract[x; exp, log, id](S, T)", False),       # log(S) is NaN at S < 0
    ("ncontract[x; exp, exp, id](S, T)", True),
    ("ncontract[x; square, square, sqrt](S, T)", True),
    ("recip(0.0)", False),
    ("-inf", False),
    ("max[x](where[q x](x > q, S, -inf))", False),     # a fully masked row's maximum is -inf
    ("S / T", False),
    ("log(relu(S))", False),
    ("sqrt(S)", False),
    ("sqrt(square(S))", True),
    ("rsqrt(x) * S", True),
    ("exp(where[q x](q >= x, S, -inf) - T)", False),  # exp(-inf) = 0, but S - T may be 2^129
    ("exp(where[q x](q >= x, tanh(S), -inf) - tanh(T))", True),  # exp(-inf) = 0: masked weights
    ("exp(where[q x](q >= x, S, inf))", False),      # exp(inf) = inf
    ("exp(where[q x](q >= x, S, -inf) * -1.0)", False),  # -(-inf) = inf
    ("exp(where[q x](q >= x, S, -inf) - where[q x](q >= x, T, -inf))", False),  # -inf - -inf = NaN
    ("sign(S) * T", True),
    ("T / (S + (1 - square(sign(S))))", True),       # the guarded divisor: 1 where S = 0, S elsewhere
    ("T / (S + (1 - abs(sign(S))))", True),
    ("recip((1 - square(sign(S))) + S)", True),
    ("T / (S + (1 - square(sign(T))))", False),      # guarded by another term: 0 at S = 0, T = 1
    # guarded by a term a zero's sign apart: exp(recip(-0.0)) = 0, exp(recip(0.0)) = inf, so 0 + (1 - 1)
    ("recip(exp(recip(-0.0)) + (1 - square(sign(exp(recip(0.0))))))", False),
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


def _strict_verdict(text: str, proved: bool, why: str = "") -> None:
    """The one theorem of ``text`` is accepted by ``check --strict`` exactly when ``proved``; refused,
    it rests on a use only tested, and without ``--strict`` its trust line says ``why``."""
    (result,) = check_module(loads(text), strict=True)
    assert result.ok is proved, result.failure
    if not proved:
        assert result.failure is not None and "only tested" in result.failure.message
        (plain,) = check_module(loads(text))
        assert plain.theorem is not None and why in str(plain.theorem.trust)


@pytest.mark.parametrize(("shift", "proved"), [
    ("T", False),              # exp(T) overflows for T in float32's range where exp(T - 5) may not
    ("tanh(T)", True),         # exp of a value in [-1, 1]: no box of the right side overflows
    ("T * 0.001", False),      # still up to 3.4e35 at |T| ≤ 2^128, past 709.8
    ("sigmoid(T) * 700.0", True),  # in (0, 700]: exp of it is finite
])
def test_a_lemma_proof_covers_a_use_only_where_its_right_side_cannot_overflow(shift: str, proved: bool) -> None:
    """``exp(c - 5) = exp(c) · exp(-5)`` is proved over the reals and passes the lemma's float64
    test (its window is narrower than the test's margin); at c = 712 the left side is 1.1e307,
    the right side inf.  Its use is proved only where the right side's boxes cannot overflow."""
    text = ("axis q\nlemma shift_out(c: []) : exp(c - 5.0) = exp(c) * exp(-5.0)\n"
            f"diagram f(T: [q]) -> [q] {{\n  E = exp({shift} - 5.0)\n  return E\n}}\n"
            "theorem t: f {\n  rewrite shift_out at E\n}\n")
    _strict_verdict(text, proved)


@pytest.mark.parametrize(("term", "proved"), [
    ("exp(recip(X - Y))", False),          # X = Y: recip(+0) = inf, after the rewrite recip(-0) = -inf: inf, then 0
    ("exp(recip(square(X) - -1.0))", True),  # the rewritten term is never 0 (it is at least 1)
    ("exp(X - Y) + recip(exp(tanh(Y)))", True),  # a zero may change sign, but nothing divides by a zero
    ("exp(X - Y) + rsqrt(square(Y))", False),  # ... and here something does (rsqrt(0) = inf), elsewhere
    ("tanh(recip(X - Y))", False),         # never 0, but 1 at X = Y and -1 after the rewrite
    ("exp(X - Y) + ncontract[q; recip, exp, id](Y, X)", False),  # recip of a score that may be 0
])
def test_a_lemma_proof_covers_a_use_only_where_no_box_reads_a_zero_s_sign(term: str, proved: bool) -> None:
    """``X - Y = -(Y - X)`` holds over the reals, which have one zero; float64 has two, and
    1/0 = inf, 1/-0 = -inf.  Its use is proved only where no ``recip``, ``rsqrt`` or divisor
    may read a zero (finiteness._zero_sign_read), in the rewritten sides or, where they may be
    0, anywhere in the diagram."""
    text = ("axis q\nlemma flip(X: [], Y: []) : X - Y = neg(Y - X)\n"
            f"diagram f(X: [q], Y: [q]) -> [q] {{\n  return {term}\n}}\n"
            "theorem t: f {\n  rewrite flip at return\n}\n")
    _strict_verdict(text, proved, "may read a zero whose sign")


@pytest.mark.parametrize(("context", "proved"), [
    ("recip(sum[x](A * 0))", False),     # 1/+0 = +inf where 1/-0 = -inf: the zero's sign is read
    ("exp(sum[x](A * 0))", True),        # nothing divides: a zero's sign is never read
    ("recip(sum[x](A * 0) + 1.0)", True),  # the divisor is 1: it may not be 0
    ("sum[x](A * 0) / x", True),          # divides by a size, at least 1
    ("recip(sign(B)) + sum[x](A * 0)", False),  # a divisor that may be 0: its zero could be the rewritten one's
])
def test_a_lemma_proof_covers_a_use_that_may_be_zero_only_where_nothing_divides_by_zero(context: str,
                                                                                        proved: bool) -> None:
    """``sum[x](X * 0) = -0`` is proved over the reals, where 0 has no sign; float64's zeros have one,
    which 1/0 reads (+inf or -inf).  The analysis has one class for both zeros, so a use whose term may
    be 0 is proved only where no box divides by a value that may be 0 (finiteness._zero_sign_read)."""
    text = ("axis x\nlemma zero(X: [x]) : sum[x](X * 0) = -0\n"
            f"diagram f(A: [x], B: []) -> [] {{\n  T = {context}\n  return T\n}}\n"
            "theorem t: f {\n  rewrite zero at T\n}\n")
    _strict_verdict(text, proved)


def test_an_array_an_earlier_kernel_wrote_holds_what_that_kernel_computes() -> None:
    """A chain's kernel reads the arrays written before it as inputs, which are no inputs of the
    domain: exp(T) written by one kernel may be inf in the next (terms.cut's Param.written)."""
    from napkin_cat import terms
    from napkin_cat.finiteness import input_values

    module = loads("axis q, x\ndiagram f(S: [q x], T: [q]) -> [q x] {\n  C = exp(T)\n  D = tanh(T)\n"
                   "  P = softmax[x](S - C - D)\n  return P\n}\n")
    (_, second) = terms.cut(module.diagram("f"), [("C", "D"), ("return",)], ops.integer_valued)
    values = input_values(second.inputs)
    assert values["S"].classes <= FINITE_CLASSES and values["D"].classes <= FINITE_CLASSES
    assert "+inf" in values["C"].classes
    assert finite(Var("D", ("q",)), {}, values) and not finite(Var("C", ("q",)), {}, values)


def test_an_accumulator_use_on_an_operand_that_may_be_infinite_needs_a_test_with_infinities() -> None:
    """A proved or tested accumulator covers finite operands (a proved one also the -inf masks it
    names); on an operand that may be +inf it is backed only where certify.infinite_tested ran
    it with infinite entries and it agreed with the box, or where its proof extends to every
    float64 value.  logsumexp does neither (a +inf row: box +inf, stream NaN), sum does both."""
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
    # sum is tested with +inf, and proved at every float64 value too (prove.extended)
    assert accepted.ok and not any("tested here" in t for t in accepted.theorem.trust)
    assert "[extended: X0]" in "; ".join(accepted.theorem.trust)
    diagram = module.diagram("lse")
    term = {"X0": diagram.body[0].expr.args[0]}
    assert unsupported("proved: laws", diagram, term) is not None
    assert unsupported("proved: laws [-inf tested: X0]", diagram, term) is not None  # a +inf mask is no -inf one
    assert unsupported("proved: laws [infinite: X0]", diagram, term) is None
    # bounded tests run on finite inputs: a tested accumulator is held to the same coverage
    # (found by the differential run: a tested normalised state over +inf scores gave NaN for 0)
    assert unsupported("tested: float64", diagram, term) is not None
    assert unsupported("tested: float64 [infinite: X0]", diagram, term) is None


# ---- every transfer rule against the evaluator --------------------------------------------------

CLASSES = ("-inf", "-", "0", "+", "+inf", "nan")
_AB = "A: [q x], B: [q x]"
#: per op, terms that exercise its rule: (parameters, term); A and B range over every class
TEMPLATES: dict[str, list[tuple[str, str]]] = {
    # A * 1e-60: finite entries far below 1 beside infinite ones (tanh(+inf) is 1, not below 1e-60)
    **{op: [(_AB, f"{op}(A)"), (_AB, f"{op}(A * 1e-60)")] for op in ops.UNARY},
    "add": [(_AB, "A + B"), (_AB, "A / (B + (1 - square(sign(B))))"), (_AB, "recip((1 - abs(sign(A))) + A)")],
    "sub": [(_AB, "A - B")], "mul": [(_AB, "A * B")], "div": [(_AB, "A / B")],
    "maximum": [(_AB, "max(A, B)")], "minimum": [(_AB, "min(A, B)")],
    **{op: [(_AB, f"{op}[x](A)")] for op in ("sum", "max", "min", "prod", "mean", "logsumexp")},
    **{op: [(_AB, f"{op}[x](A)")] for op in ("softmax", "l2norm", "rmsnorm")},
    "cumsum": [(_AB, "cumsum[x](A)")],
    "linrec": [(_AB, "linrec[x](A, B)"), ("A: [x], B: [q x]", "linrec[x](A, B)"),
               ("A: [q], B: [q x]", "linrec[x](A, B)")],
    "contract": [(_AB, "contract[x](A, B)"), (_AB, "contract[](A, B)")],
    "ncontract": [(_AB, f"ncontract[x; {a1}, {a2}, {b}](A, B)") for a1 in ("exp", "id", "recip", "log")
                  for a2 in ("exp", "square", "id") for b in sorted(ops.NORMALISERS)],
    "where": [(_AB, "where[q x](x <= q, A, B)")],
    **{op: [(_AB, f"{op}(index[q](q), index[x](x))"), (_AB, f"{op}(onehot[v](A), index[q x](q - x))")]
       for op in ops.COMPARE},
    "select": [(_AB, "select(eq(index[q](q), index[x](x)), A, B)"), (_AB, "select(onehot[v](A), A, B)")],
    "gather": [(_AB, "gather[x](A, index[q](q))"), (_AB, "gather[x](B, sum[x](onehot[v](A)))")],
    "index": [(_AB, "index[q x](q - x)"), (_AB, "index[q x](q * x - 2)"),
              (_AB, "index[q](q * 4611686018427387904 + 4611686018427387903)")],  # int64 wraps past 2^63
    "onehot": [(_AB, "onehot[v](A)")],
    "argmax": [(_AB, "argmax[x](A)")],
    "topk": [(_AB, "topk[x -> k](A)"), (_AB, "gather[x](B, topk[x -> k](A))")],
    "split": [(_AB, "split[x -> y z](A)")],
    "join": [("A: [q y z], B: [q x]", "join[y z -> x](A)")],
    "rename": [(_AB, "rename[x -> w](A)")],
    "transpose": [(_AB, "transpose[x q](A)")],
}


@pytest.mark.parametrize("op", sorted(ops.UNARY))
def test_an_infinite_entry_with_a_finite_image_maps_to_one(op: str) -> None:
    """``_un`` joins magnitude 2^0 where an op maps ±inf to a finite non-zero value (tanh, sigmoid,
    sign): that value is ±1 in the evaluator."""
    for c, v in (("-inf", -math.inf), ("+inf", math.inf)):
        if UNARY[op][c] in ("-", "+"):
            assert abs(float(FLOAT64.unary[op](np.float64(v)))) == 1.0, (op, c)


def test_every_op_has_a_rule_and_a_test() -> None:
    assert set(RULES) == set(ops.OPS) == set(TEMPLATES)


def test_an_op_without_a_rule_could_be_anything() -> None:
    assert analyse(Box("no_such_op", (), ()), {}, {}) == TOP
    assert analyse(Var("unbound", ()), {}, {}) == TOP


@st.composite
def _entry(draw: st.DrawFn, classes: frozenset[str]) -> float:
    c = draw(st.sampled_from(sorted(classes)))
    # where float64 computes every op as the reals do, and across the domain's range (float32's),
    # where exp, products and reciprocals leave float64's
    magnitude = draw(st.one_of(st.floats(1e-3, 5.0),
                               st.sampled_from((1.5e-45, 1e-30, 1e-8, 30.0, 700.0, 750.0, 1e10, 1e20, 3.4e38))))
    return {"-inf": -math.inf, "-": -magnitude, "0": draw(st.sampled_from((0.0, -0.0))), "+": magnitude,
            "+inf": math.inf, "nan": math.nan}[c]


@cache
def _parsed(params: str, term: str) -> tuple[Expr, Diagram]:
    """``term`` typed (one side of a lemma on ``params``) and as a diagram the evaluator runs."""
    (lemma,) = loads(f"axis q, x, y, z, v, w\naxis k = 1\nlemma f({params}) : {term} = {term}\n").lemmas
    return lemma.lhs, certify.lemma_side(lemma, lemma.lhs)


@pytest.mark.parametrize(("op", "params", "term"), [(op, p, t) for op, ts in TEMPLATES.items() for p, t in ts])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_rule_contains_what_the_evaluator_computes(op: str, params: str, term: str, data: st.DataObject) -> None:
    """For operands drawn from any classes (±inf, ±0, NaN, finite values of either sign), every
    entry the float64 evaluator computes lies in the class set the analysis gives the term, and
    every finite non-zero one within its log2 bounds (a logsumexp of 3.4e38 is 3.4e38)."""
    term_expr, diagram = _parsed(params, term)
    sizes = {"q": data.draw(st.integers(1, 3)), "x": 4, "y": 2, "z": 2, "v": 3}
    if "split" not in term and "join" not in term:
        sizes["x"] = data.draw(st.integers(1, 3))
    classes = {p.name: frozenset(data.draw(st.sets(st.sampled_from(CLASSES), min_size=1))) for p in diagram.inputs}
    arrays = [np.array(data.draw(st.lists(_entry(classes[p.name]), min_size=n, max_size=n)), dtype=float)
              .reshape([sizes[a] for a in p.axes]) for p in diagram.inputs
              for n in [math.prod(sizes[a] for a in p.axes)]]
    value = evaluate(diagram, arrays, sizes=sizes)
    found = abstract(term_expr, {}, classes)
    got = {class_of(float(v)) for v in np.ravel(value)}
    assert got <= found.classes, (term, classes, arrays, value)
    logs = [math.log2(abs(float(v))) for v in np.ravel(value) if math.isfinite(v) and v != 0]
    assert all(found.lo <= m <= found.hi for m in logs), (term, classes, arrays, value, found)


def test_exp_weights_of_a_row_holding_plus_inf_are_nan_not_infinite() -> None:
    """softmax's weights are in [0, 1] where the row's maximum is finite, 0 where it is -inf and
    NaN throughout where it is +inf or NaN (``evaluate.exp_shift``): never ±inf or negative.  The
    rule once composed exp(s) / Σ exp(s) there, the evaluator's old shift of 0, which also holds
    +inf (+inf / a finite sum)."""
    term, _ = _parsed(_AB, "softmax[x](A)")
    for classes in (frozenset(CLASSES), frozenset({"+", "+inf"}), frozenset({"-inf", "+inf"})):
        found = abstract(term, {}, {"A": classes, "B": classes})
        assert found.classes <= frozenset({"0", "+", "nan"}) and "nan" in found.classes, (classes, found)
    assert abstract(term, {}, {"A": frozenset({"-inf", "-"}), "B": frozenset({"-"})}).classes == {"0", "+"}


@pytest.mark.parametrize(("shift", "accepted"), [
    ("max[x](S)", True),
    ("sum[x](exp(M))", False),                     # float64's exp(1000) is inf (issue 28)
    ("sum[x](exp(tanh(M)))", True),                # exp(-inf) = 0: a sum of zeros and positives
    ("log(1.0 + sum[x](exp(tanh(M))))", True),     # 1 + (0 or more) is positive
    ("log(1.0 + sum[x](exp(M)))", False),
    ("exp(max[x](S))", False),
    ("sqrt(sum[x](square(M - max[x](S))))", False),  # (-inf)² = +inf
    ("sum[x](exp(tanh(M)) * S)", True),           # masked weights (0) times finite values
    ("sum[x](exp(M) * S)", False),
    ("sum[x](exp(S) * M)", False),                # a positive weight times -inf
    ("sum[x](recip(exp(M)))", False),              # 1 / exp(-inf) = +inf
    ("max[x](log(exp(M)))", False),                # log(exp(-inf)) = -inf
    ("rsqrt(sum[x](exp(M)))", False),              # a fully masked row: 1 / sqrt(0)
])
def test_a_shift_lemma_applies_where_the_analysis_vouches_for_the_shift(shift: str, accepted: bool) -> None:
    text = (f"axis q, x\ndiagram f(S: [q x]) -> [q x] {{\n  M = where[q x](x >= q + 2, S, -inf)\n"
            f"  P = softmax[x](S - {shift})\n  return P\n}}\n")
    module, lemma = loads(text), rules.library()["softmax_shift"]
    step = Rewrite("softmax_shift", ("P",))
    if accepted:
        thm = kernel.rewrite(kernel.refl("t", module.diagram("f")), lemma, step, {"softmax_shift": "tested: t"})
        assert "lemma softmax_shift" in "; ".join(thm.trust)
    else:
        with pytest.raises(KernelError, match=r"^instantiate: lemma `softmax_shift` holds when `c` is finite"):
            kernel.rewrite(kernel.refl("t", module.diagram("f")), lemma, step, {"softmax_shift": "tested: t"})


# ---- accumulators proved for every float64 value (issue 28) -------------------------------------

def _box(text: str) -> Box:
    """The returned box of a one-line diagram on S: [q x] and T: [q x]."""
    diagram = loads(f"axis q, x\ndiagram f(S: [q x], T: [q x]) -> [q] {{\n  return {text}\n}}\n").diagram("f")
    box = diagram.outputs[0]
    assert isinstance(box, Box)
    return certify.canonical(box, "x")


@pytest.mark.parametrize(("text", "name", "pad", "expected"), [
    ("contract[x](S, T)", "sum", False, True),
    ("contract[x](S, T)", "sum", True, True),
    ("sum[x](S)", "sum", True, True),
    ("max[x](S)", "max", True, True),
    ("min[x](S)", "min", False, True),
    ("mean[x](S)", "sum", False, False),        # its finaliser divides: not claimed
    ("prod[x](S)", "prod", False, False),
    ("logsumexp[x](S)", "logsumexp", False, False),  # a +inf entry: exp(inf - inf) is NaN in the state
    ("ncontract[x; exp, exp, id](S, T)", "online_softmax", False, False),
])
def test_monoid_accumulators_are_proved_for_every_float64_value(text: str, name: str, pad: bool,
                                                                 expected: bool) -> None:
    """prove.extended: a fold of +, max or min over the box it folds holds at ±inf and NaN
    (the flash attention backward's Σ exp(S - L)·dP, where exp may overflow), and the claim
    is what the evaluator and the accumulator run chunk by chunk compute with NaN entries too."""
    from napkin_cat.certify import prove, tiers

    box = _box(text)
    plan = accumulators.plan(box, "x", name)
    assert prove.extended(plan, pad) is expected
    how = certify.accumulator(box, "x", name, pad)
    assert ("[extended: " in how) is expected, how
    if expected:
        assert "[extended: " + ", ".join(f"X{k}" for k in range(len(box.args))) + "]" in how
        for fills in ((math.nan,), (math.inf, -math.inf), (math.nan, math.inf)):
            assert all(tiers._agrees_with(box, "x", name, k, fills) for k in range(len(box.args))), fills


def test_a_padded_contraction_with_an_operand_lacking_the_axis_is_not_extended() -> None:
    """A padded position of contract[x](S, c) is 0 · c: NaN where c is infinite, so the padding
    law holds only for finite c."""
    from napkin_cat.certify import prove

    diagram = loads("axis q, x\ndiagram f(S: [q x], c: [q]) -> [q] {\n  return contract[x](S, c)\n}\n").diagram("f")
    box = diagram.outputs[0]
    assert isinstance(box, Box)
    plan = accumulators.plan(certify.canonical(box, "x"), "x", "sum")
    assert prove.extended(plan, False) and not prove.extended(plan, True)


def test_an_extended_proof_covers_a_use_on_any_operand_under_strict() -> None:
    """A use whose operand may overflow (exp(S - T): S - T may pass 709.8) stays proved where
    the proof names the operand in [extended: ...], and is only tested otherwise."""
    from napkin_cat.finiteness import narrowed

    diagram = loads(f"{HEADER}  P = exp(S - T)\n  return P\n}}\n").diagram("f")
    terms = {"X0": Var("P", ("q", "x")), "X1": Var("S", ("q", "x"))}
    assert not finite(Var("P", ("q", "x")), {"P": diagram.body[0].expr}, {"S", "T"})
    assert narrowed("proved: laws [extended: X0, X1]", diagram, terms) == "proved: laws [extended: X0, X1]"
    assert narrowed("proved: laws [extended: X1]", diagram, terms).startswith("tested here")
    assert unsupported("proved: laws [extended: X0, X1]", diagram, terms) is None
    assert unsupported("tested: float64 [extended: X0, X1]", diagram, terms) is not None  # only a proof names it


def test_a_fold_of_finite_operands_that_may_overflow_is_only_tested() -> None:
    """finiteness.fold_overflows (in narrowed): a proved accumulator's laws hold over the reals, and
    chunking reorders float64's overflow (prod of inputs: inf in order, 2^1001 in chunks of 2;
    tests/unsound/redteam_*_overflows_*), so a fold of finite operands that may reach 2^1024 is
    tested here, which --strict refuses; a sum of inputs (at most 2^191) stays proved."""
    module = loads("axis x\ndiagram p(X: [x]) -> [] {\n  return prod[x](X)\n}\n"
                   "diagram s(X: [x]) -> [] {\n  return sum[x](X * X)\n}\n"
                   "theorem a: p {\n  stream x by 2 via prod\n}\ntheorem b: s {\n  stream x by 2 via sum\n}\n")
    refused, accepted = check_module(module, strict=True)
    assert refused.failure is not None and "only tested" in refused.failure.message
    assert accepted.ok
    loose, _ = check_module(module)
    assert loose.theorem is not None and any("may overflow inside `prod`" in t for t in loose.theorem.trust)


def test_the_normalised_state_may_overflow_where_its_box_does_not() -> None:
    """The normalised accumulator folds Σ a1(s)·v and Σ a2(s) before it divides: the l2 box's
    weights s/√Σ s² are at most 1, but with s = 1e45·sign(X) and v = Y^7 (up to 2^896) the state's
    s·v reaches 2^1045 (tests/unsound/redteam_normalised_state_overflows.ncd), so its fold may
    overflow; with v = Y it cannot."""
    for v, overflows in (("Y * Y * Y * Y * Y * Y * Y", True), ("Y", False)):
        diagram = loads(f"axis x\ndiagram f(X: [x], Y: [x]) -> [] {{\n  S = 1e45 * sign(X)\n  V = {v}\n"
                        "  return ncontract[x; id, square, sqrt](S, V)\n}\n").diagram("f")
        (box,) = diagram.outputs
        assert isinstance(box, Box)
        assert not fold_overflows(box, diagram)  # the box's own fold: weights at most 1
        assert fold_overflows(box, diagram, "normalised") is overflows


def test_a_sum_of_operands_that_may_overflow_is_not_proved_where_its_chunks_reorder_overflow() -> None:
    """sum[x](exp(A) - exp(B)) streamed in chunks of 2: at A = [709, 709, 709, -100], B reversed,
    the entries are a, a, a, -a (a = 8.2e307), inf in order and 1.6e308 in chunks.  [extended: X0]
    backs the operand's inf entries, not its large finite ones overflowing in another order, so the
    fold's overflow narrows the proof to tested (finiteness.narrowed) and --strict refuses it; the
    backward passes of proofs/ stay proved through their relations (L = logsumexp: exp(S - L) ≤ 1)."""
    from napkin_cat.schedule.run import run_schedule

    module = loads("axis x\ndiagram f(A: [x], B: [x]) -> [] {\n  return sum[x](exp(A) - exp(B))\n}\n"
                   "theorem t: f {\n  stream x by 2 via sum\n}\n")
    (loose,) = check_module(module)
    assert loose.theorem is not None
    a, b = np.array([709.0, 709.0, 709.0, -100.0]), np.array([-100.0, -100.0, -100.0, 709.0])
    assert math.isinf(float(evaluate(loose.theorem.source, [a, b])))
    assert math.isfinite(float(run_schedule(loose.theorem, [a, b])[0]))  # the theorem is wrong there
    (strict,) = check_module(module, strict=True)
    assert not strict.ok


def test_a_reduction_over_several_axes_folds_more_entries() -> None:
    """A reduction over k axes folds up to 2^(62k) entries (each axis has up to 2^62 positions),
    not 2^62: the logsumexp of tanh over three axes is up to 1 + 186·ln 2 ≈ 130, so 8 times it
    may pass exp's 709.8, where the bound of one axis's 2^62 entries (≈ 88) vouched it finite."""
    defs = {"L": loads("axis x, y, z\ndiagram f(S: [x y z]) -> [] {\n  L = logsumexp[x y z](tanh(S))\n"
                       "  return L\n}\n").diagram("f").body[0].expr}
    grow = loads("axis x, y, z\ndiagram f(S: [x y z]) -> [] {\n  L = logsumexp[x y z](tanh(S))\n"
                 "  E = exp(8 * L)\n  return E\n}\n").diagram("f")
    assert finite(Var("L", ()), defs, {"S"})
    assert not finite(grow.body[1].expr, {let.names[0]: let.expr for let in grow.body}, {"S"})
    alone = loads("axis x\ndiagram f(S: [x]) -> [] {\n  L = logsumexp[x](tanh(S))\n  E = exp(8 * L)\n"
                  "  return E\n}\n").diagram("f")
    assert finite(alone.body[1].expr, {let.names[0]: let.expr for let in alone.body}, {"S"})


RELATED = ("axis q, x, d\ndiagram f(Q: [q d], K: [x d], T: [q x], L: [q]) -> [q x]\n"
           "    given L = logsumexp[x](contract[d](Q, K) * rsqrt(d)) {{\n"
           "  S = contract[d](Q, K) * rsqrt(d)\n  return {}\n}}\n")


@pytest.mark.parametrize(("term", "bounded"), [
    ("exp(S - L)", True),                          # the scores the relation reduces, shifted by it
    ("exp(contract[d](Q, K) * rsqrt(d) - L)", True),  # the same term written out
    ("exp(T - L)", False),                         # other scores: T - L may pass 709.8
    ("exp(L - S)", False),                         # the other way round: at least 0, unbounded
    ("exp(S + L)", False),
    ("exp(contract[d](Q, K) - L)", False),         # not the same term (unscaled)
])
def test_a_relation_bounds_exp_of_the_scores_shifted_by_their_logsumexp(term: str, bounded: bool) -> None:
    """finiteness._Analysis.shifted: with L given as logsumexp[x](s), exp(s - L) is in [0, 1] (s ≤ max s ≤ L);
    for any other term L is any finite input; and the evaluator agrees on inputs satisfying the relation
    (evaluate.related), extreme scores included."""
    from napkin_cat.evaluate import related
    from napkin_cat.finiteness import finite_in

    diagram = loads(RELATED.format(term)).diagram("f")
    defs = {"S": diagram.body[0].expr}
    assert not finite(diagram.outputs[0], defs, {"Q", "K", "T", "L"})  # without the relation: L is any input
    assert finite_in(diagram, diagram.outputs[0]) is bounded
    if bounded:
        rng = np.random.default_rng(0)
        sizes = {"q": 3, "x": 4, "d": 2}
        for scale in (1.0, 1e3, 1e150):
            drawn = [scale * rng.standard_normal([sizes[a] for a in p.axes]) for p in diagram.inputs]
            args = related(diagram, drawn, sizes)
            s = np.einsum("qd,xd->qx", args[0], args[1]) / np.sqrt(2.0)
            m = s.max(axis=1)
            assert np.allclose(args[3], m + np.log(np.exp(s - m[:, None]).sum(axis=1)), rtol=1e-12)
            p = evaluate(diagram, args)
            assert np.all((p >= 0) & (p <= 1)), (scale, p)


@pytest.mark.parametrize(("slope", "bounded"), [
    ("(gelu(Z) + 0.5 * (1 - square(sign(Z)))) / (Z + (1 - square(sign(Z))))", True),  # examples/mlp_backward.ncd
    ("(gelu(Z) + 0.5 * (1 - square(sign(Z - 0)))) / (Z + (1 - square(sign(Z - 0))))", True),  # grad's form
    ("(gelu(Z) + 0.5 * (1 - square(sign(Z)))) / (T + (1 - square(sign(Z))))", False),  # another divisor
    ("(gelu(T) + 0.5 * (1 - square(sign(Z)))) / (Z + (1 - square(sign(Z))))", False),  # gelu of another term
    ("(exp(Z) + 0.5 * (1 - square(sign(Z)))) / (Z + (1 - square(sign(Z))))", False),
    ("(gelu(Z) + 0.5 * (1 - square(sign(T)))) / (Z + (1 - square(sign(T))))", False),  # not Z's zero test
])
def test_the_gelu_slope_ratio_is_bounded(slope: str, bounded: bool) -> None:
    """finiteness._Analysis.gelu_ratio: (gelu(x) + c·[x = 0]) / (x + [x = 0]) is Φ(x) in [0, 2] for a
    finite x (the MLP backward's gelu slope), checked against the evaluator at extreme and subnormal x;
    any other quotient keeps the generic rule (a ratio of unrelated terms may overflow)."""
    text = f"axis t\ndiagram f(X: [t], T: [t]) -> [t] {{\n  Z = X * X * X * X * X * X * X\n  return {slope}\n}}\n"
    diagram = loads(text).diagram("f")
    value = abstract(diagram.outputs[0], {"Z": diagram.body[0].expr}, {"X": FINITE_CLASSES, "T": FINITE_CLASSES})
    assert (value.classes <= {"0", "+"} and value.hi <= 1.0) is bounded, value
    if bounded:
        tiny = 2.0 ** -149
        x = np.array([0.0, tiny, -tiny, 3 * tiny, 1e-30, -1e-30, 1.0, -1.0, 40.0, -40.0, 2.0**128, -2.0**128])
        got = evaluate(diagram, [x, x])
        assert np.all((got >= 0) & (got <= 2)), got


def test_the_relational_rules_compare_terms_without_unfolding_bindings() -> None:
    """_Analysis.same reads bindings through memoised, so a DAG of 60 doublings (2^60 nodes
    written out) is compared at once; and a zero's sign counts (recip(X·0) is +inf where
    recip(X·-0) is -inf), so the relation's scores are not matched by such a term."""
    body = "".join(f"  A{k + 1} = A{k} + A{k}\n" for k in range(60))
    text = (f"axis x\ndiagram f(X: [x], T: [x]) -> [x] {{\n  A0 = X\n{body}"
            "  Z = A60 * A60\n  return (gelu(Z) + 0.5 * (1 - square(sign(Z)))) / (Z + (1 - square(sign(Z))))\n}\n")
    diagram = loads(text).diagram("f")
    from napkin_cat.finiteness import finite_in

    assert finite_in(diagram, diagram.outputs[0])  # Z = (2^60 X)^2 ≤ 2^376 is finite: Φ(Z) in [0, 2]
    signed = ("axis q, x\ndiagram f(X: [q x], L: [q]) -> [q x] given L = logsumexp[x](recip(X * 0.0)) {\n"
              "  return exp(recip(X * -0.0) - L)\n}\n")
    d = loads(signed).diagram("f")
    assert not finite_in(d, d.outputs[0])


def test_a_contraction_of_three_is_multiplied_in_one_order_whatever_the_shapes() -> None:
    """einsum picked a pairwise order by cost, so by the shapes: of X^5 [x], c [q x], Y^5 [x] it
    multiplied the two vectors first at q = 4 (2^1100 = inf) and c first at q = 1 (2.7e31), so
    `group q by 1` turned the diagram's inf finite.  The evaluator multiplies in the operands'
    order now, and the finiteness rule bounds every partial product (``_product``): A·B·C may be
    inf, so c is not vouched finite in either order."""
    from napkin_cat.finiteness import finite_in
    from napkin_cat.schedule.run import run_schedule

    text = ("axis q, x\ndiagram f(X: [x], Y: [x], Z: [q x]) -> [q] {\n  A = X * X * X * X * X\n"
            "  B = Y * Y * Y * Y * Y\n  C = 1e-300 * sign(Z)\n  return contract[x](A, C, B)\n}\n"
            "theorem t: f {\n  group q by 1\n}\n")
    (result,) = check_module(loads(text), strict=True)
    assert result.theorem is not None
    x = np.array([2.0**110, 2.0**110])
    source = evaluate(result.theorem.source, [x, x, np.ones((4, 2))])
    grouped = run_schedule(result.theorem, [x, x, np.ones((4, 2))])[0]
    assert np.all(np.isfinite(source)) and np.array_equal(source, grouped)
    for order in ("A, C, B", "A, B, C", "C, A, B"):
        diagram = loads(text.split("theorem")[0].replace("A, C, B", order)).diagram("f")
        assert not finite_in(diagram, diagram.outputs[0]), order


_SCALED_WEIGHTS = """axis q, x
diagram f(S: [q x]) -> [q x], [q x], [q x], [q x] {
  H = softmax[x](S * 0.5)
  L = l2norm[x](H) * (l2norm[x](H) * (1 + square(3000)))
  R = softmax[x](S) * (1 + square(3000))
  W = softmax[x](S)
  C = (softmax[x](S) * 1) * (1 + square(3000))
  return L, R, W, C
}
"""


def test_a_rewritten_softmax_weight_scaled_up_is_not_float_safe() -> None:
    """softmax(S)·K equals p·(p·K) with p = l2norm(softmax(S/2)) over the reals; at S = [0, -750]
    and K ≈ 2^23 the weight e^-750 = 2^-1082 rounds to 0 before K scales it, where p·(p·K) keeps
    2^-1059.  A weight of a finite score may be 0 on both sides of a lemma (``_weights``' vanish),
    so the right side's check let it through; scaled by a factor that may pass 1 it is refused
    (``_scales_a_vanished_weight``).  The weights alone stay float-safe: their value is below
    2^-1075 on either side."""
    from napkin_cat.finiteness import float_unsafe_box

    d = loads(_SCALED_WEIGHTS).diagram("f")
    left, right, alone, carried = evaluate(d, [np.array([[0.0, -750.0]])])
    assert left[0, 1] > 0 and right[0, 1] == 0 and alone[0, 1] == 0 and carried[0, 1] == 0
    operands = (Var("S", ("q", "x")),)
    box = float_unsafe_box(d.binding("R").expr, operands, d)
    assert box is not None and box.op == "mul"
    assert float_unsafe_box(d.binding("W").expr, operands, d) is None
    # scaled through a product that carries the weight (by 1, which alone does not scale it up)
    box = float_unsafe_box(d.binding("C").expr, operands, d)
    assert box is not None and box.op == "mul" and box is d.binding("C").expr


@pytest.mark.parametrize(("relation", "unbounded"), [
    ("logsumexp[x](S)", set()),
    ("logsumexp[x](where[q x](q >= x, S, -inf))", set()),          # FlashAttention's causal mask keeps x = 0
    ("max[x](where[q x](not (q < x), S, -inf))", set()),
    ("logsumexp[x](where[q x](q + 1 > x and q >= 0, S, -inf))", set()),
    ("logsumexp[x](where[q x](q > x, S, -inf))", {"-inf"}),          # row 0 keeps no key
    ("max[x](where[q x](x >= q, S, -inf))", {"-inf"}),               # rows past |x| keep none
    ("logsumexp[x](where[q x](q >= x, S, 0))", set()),                # a 0 fill is finite anyway
    ("min[x](where[q x](q >= x, S, -inf))", {"-inf"}),               # -inf is no identity of min
    ("max[x](where[q x](q * 4611686018427387904 >= x, S, -inf))", {"-inf"}),  # may wrap in int64
    ("logsumexp[x](S) + recip(sum[x](S) - sum[x](S))", {"+inf", "-inf"}),
])
def test_a_relation_that_may_not_be_finite_is_found(relation: str, unbounded: set[str]) -> None:
    """finiteness.relation_unbounded: a relation the analysis does not show finite leaves the diagram no
    input where it is not (README "Input relations"); a mask keeps a row only where its predicate
    holds at x = 0 for every q."""
    from napkin_cat.finiteness import relation_unbounded

    module = loads(f"axis q, x\ndiagram f(S: [q x], L: [q]) -> [q] given L = {relation} {{\n  return L\n}}\n")
    assert set(relation_unbounded(module.diagram("f").inputs).get("L", set())) == unbounded


@settings(max_examples=300, deadline=None)
@given(a=st.integers(-3, 3), b=st.integers(-3, 3), c=st.integers(-3, 3),
       op=st.sampled_from([">=", ">", "<=", "<", "==", "!="]), neg=st.booleans())
def test_a_decided_mask_holds_at_the_first_key_of_every_row(a: int, b: int, c: int, op: str, neg: bool) -> None:
    """finiteness._decided against the predicate evaluated: where it says `a·q + c op b·x` (or its
    negation) holds at x = 0 for every q, it does at every q up to 40; where it says it never does, it
    never does."""
    from napkin_cat.finiteness import _decided
    from napkin_cat.terms import Cmp, IBin, Idx, IInt, Logic

    left = IBin("+", IBin("*", IInt(a), Idx("q")), IInt(c))
    pred = Cmp(op, left, IBin("*", IInt(b), Idx("x")))
    full = Logic("not", pred) if neg else pred
    always, never = _decided(full, ("x",))
    compare = {">=": np.greater_equal, ">": np.greater, "<=": np.less_equal, "<": np.less, "==": np.equal,
               "!=": np.not_equal}[op]
    q = np.arange(41)
    holds = compare(a * q + c, 0) != neg
    assert not always or holds.all()
    assert not never or not holds.any()


GUARDED = f"max(L, {-sys.float_info.max!r})"


@pytest.mark.parametrize(("mask", "shift", "nan"), [("q >= x", "L", False), ("q > x", "L", True),
                                                    ("q >= x", GUARDED, False), ("q > x", GUARDED, False)])
def test_a_relation_over_rows_a_mask_may_empty_gives_nan_there(mask: str, shift: str, nan: bool) -> None:
    """finiteness._Analysis.shifted with L's value from its relation (input_values): where the mask may
    empty a row, L is -inf there and exp(s - L) NaN (-inf - -inf), as the evaluator computes it on
    related inputs; elsewhere in [0, 1].  Guarded, exp(s - max(L, -FLOAT_MAX)) (``grad._weights``), it
    is 0 on the emptied row: in [0, 1] everywhere."""
    from napkin_cat.evaluate import related
    from napkin_cat.finiteness import _Analysis, input_values

    text = ("axis q, x\ndiagram f(S: [q x], L: [q]) -> [q x]\n"
            f"    given L = logsumexp[x](where[q x]({mask}, S, -inf)) {{\n"
            f"  M = where[q x]({mask}, S, -inf)\n  return exp(M - {shift})\n}}\n")
    diagram = loads(text).diagram("f")
    value = _Analysis(diagram.bindings(), input_values(diagram.inputs)).value(diagram.outputs[0])
    assert value.classes == ({"0", "+", "nan"} if nan else {"0", "+"}) and value.hi <= 0.0
    rng = np.random.default_rng(0)
    got = evaluate(diagram, related(diagram, [rng.standard_normal((4, 3)), np.zeros(4)], {"q": 4, "x": 3}))
    assert bool(np.isnan(got).any()) is nan and np.all(got[~np.isnan(got)] <= 1)
