"""The mask analysis shared by the Pallas lowering and the cost model: which stream chunks a
where mask lets a program skip (``masks.stream_masks``/``chunk_range``), the closed-form count
of (group, chunk) pairs that run (``masks.chunk_count``) against a brute-force count, and the
cost model's use of it."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import sympy

from napkin_cat.certify.accumulators import plan
from napkin_cat.cost import cost, cost_of
from napkin_cat.cost.optimise import continuous
from napkin_cat.elaborate import loads
from napkin_cat.evaluate import evaluate
from napkin_cat.lower import codegen as cg
from napkin_cat.lower import lower
from napkin_cat.lower.skip import ordered_runs, stream_runs
from napkin_cat.proof import check_module, theorem
from napkin_cat.schedule.loopnest import flatten
from napkin_cat.schedule.masks import (
    GroupAxis,
    chunk_count,
    chunk_range,
    chunk_runs,
    full_masks,
    full_range,
    masked_fill,
    stream_masks,
)
from napkin_cat.terms import Box, Partition, Schedule, Var
from tests.lower_cases import agrees

# every diagram masks the scores with -inf, the online softmax's padding for them, and
# normalises and contracts them in one box (the softmax_contract rewrite's result)
TEXT = """
axis q, x, d = 8
diagram causal(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = where[q x](q >= x, contract[d](Q, K), -inf)
  return ncontract[x; exp, exp, id](S, V)
}
diagram window(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = where[q x](q >= x and q - x < 40, contract[d](Q, K), -inf)
  return ncontract[x; exp, exp, id](S, V)
}
diagram scaled(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = where[q x](2 * q + 3 >= x, contract[d](Q, K), -inf)
  return ncontract[x; exp, exp, id](S, V)
}
diagram prefix(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = where[q x](x < 50, contract[d](Q, K), -inf)
  return ncontract[x; exp, exp, id](S, V)
}
diagram prefix_lm(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = where[q x](q >= x or x < 50, contract[d](Q, K), -inf)
  return ncontract[x; exp, exp, id](S, V)
}
diagram sink(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = where[q x](q >= x and q - x < 40 or x < 20, contract[d](Q, K), -inf)
  return ncontract[x; exp, exp, id](S, V)
}
diagram bands(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = where[q x]((x < 8 or q - x < 24) and (q >= x or x >= 90), contract[d](Q, K), -inf)
  return ncontract[x; exp, exp, id](S, V)
}
diagram unequal(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = where[q x](q != x, contract[d](Q, K), -inf)
  return ncontract[x; exp, exp, id](S, V)
}
diagram either(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = where[q x](q >= x or x < 4, contract[d](Q, K), -inf)
  return ncontract[x; exp, exp, id](S, V)
}
diagram rows_or(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = where[q x](q >= x or q < 50, contract[d](Q, K), -inf)
  return ncontract[x; exp, exp, id](S, V)
}
diagram unequal_or(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = where[q x](q >= x or q != x + 60, contract[d](Q, K), -inf)
  return ncontract[x; exp, exp, id](S, V)
}
diagram negated_or(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = where[q x](q >= x or not (x < 100), contract[d](Q, K), -inf)
  return ncontract[x; exp, exp, id](S, V)
}
diagram too_many(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = where[q x]((x < 1 or q >= x) and (x < 2 or q >= x + 1) and (x < 3 or q >= x + 2) and (x < 4 or q >= x + 3),
                 contract[d](Q, K), -inf)
  return ncontract[x; exp, exp, id](S, V)
}
diagram zero_fill(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = where[q x](q >= x, contract[d](Q, K), 0)
  return ncontract[x; exp, exp, id](S, V)
}
diagram values(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  W = where[q x](q >= x, V, 0)
  return ncontract[x; exp, exp, id](contract[d](Q, K), W)
}
diagram plain(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  return ncontract[x; exp, exp, id](contract[d](Q, K), V)
}
"""
MODULE = loads(TEXT)
#: the masks above as Python, for the brute force: ``&`` and ``|`` rather than ``and`` and ``or``, so that
#: each holds for integers and, elementwise, for numpy arrays of them (``brute_pairs``)
PREDICATES = {
    "causal": lambda g, i: g >= i,
    "window": lambda g, i: (g >= i) & (g - i < 40),
    "scaled": lambda g, i: 2 * g + 3 >= i,
    "prefix": lambda g, i: i < 50,
    "prefix_lm": lambda g, i: (g >= i) | (i < 50),
    "sink": lambda g, i: ((g >= i) & (g - i < 40)) | (i < 20),
    "bands": lambda g, i: ((i < 8) | (g - i < 24)) & ((g >= i) | (i >= 90)),
}
UNIONS = {"prefix_lm", "sink", "bands"}  # disjunctions: a union of ranges per program
STREAM = "x"


def masks_of(name: str) -> tuple | None:
    flat = flatten(MODULE.diagram(name))
    consumer = next(n for n in flat.nodes if getattr(n.expr, "op", None) == "ncontract")
    assert isinstance(consumer.expr, Box)
    return stream_masks(flat, STREAM, {consumer.name: plan(consumer.expr, STREAM, "online_softmax")}, {"q"})


def brute(name: str, q: int, x: int, gq: int, sx: int) -> int:
    """``brute_pairs`` of one of the masks above."""
    return brute_pairs(PREDICATES[name], q, x, gq, sx)


def brute_pairs(pred: Any, q: int, x: int, gq: int, sx: int) -> int:
    """(q-tile, x-chunk) pairs holding a position where the mask ``pred`` is true."""
    return int(blocks(pred, q, x, gq, sx)[0].sum())


def blocks(pred: Any, q: int, x: int, gq: int, sx: int) -> tuple[np.ndarray, np.ndarray]:
    """Per (q-tile, x-chunk) block, whether the mask ``pred`` holds at some position of it (live)
    and at every position (full), over the padded blocks (a ragged last tile's padded rows
    included, as the kernel's block holds them): ``pred`` at every position at once (numpy)."""
    programs, chunks = math.ceil(q / gq), math.ceil(x / sx)
    g, i = np.arange(programs * gq)[:, None], np.arange(chunks * sx)[None, :]
    holds = np.broadcast_to(pred(g, i), (programs * gq, chunks * sx)).reshape(programs, gq, chunks, sx)
    return holds.any(axis=(1, 3)), holds.all(axis=(1, 3))


def closed(name: str, q: int, x: int, gq: int, sx: int) -> int:
    masks = masks_of(name)
    assert masks is not None
    n = chunk_count(masks, {"q": GroupAxis(sympy.Integer(gq), sympy.ceiling(sympy.Rational(q, gq)))},
                    sympy.Integer(sx), sympy.ceiling(sympy.Rational(x, sx)))
    assert n is not None
    used = {g for sides in masks for side in sides for g, _ in side.coeffs}
    return int(n) * (1 if used else math.ceil(q / gq))  # a mask of x alone: per program


# sizes and tiles with the chunk tile dividing the group tile (the closed form's exactness
# condition), divisible and ragged (padded trips), more queries than keys and fewer
SIZES = [(256, 256, 64, 32), (256, 256, 32, 32), (512, 256, 64, 64), (100, 100, 32, 16),
         (100, 300, 64, 16), (200, 70, 32, 8), (96, 200, 16, 16), (8, 256, 8, 8)]


@pytest.mark.parametrize("name", sorted(PREDICATES))
@pytest.mark.parametrize(("q", "x", "gq", "sx"), SIZES)
def test_chunk_count_matches_brute_force(name: str, q: int, x: int, gq: int, sx: int) -> None:
    assert closed(name, q, x, gq, sx) == brute(name, q, x, gq, sx)


@pytest.mark.parametrize("name", sorted(PREDICATES))
@pytest.mark.parametrize(("q", "x", "gq", "sx"), [(100, 100, 32, 16), (64, 200, 16, 64), (50, 90, 8, 32)])
def test_chunk_range_per_program_is_exact(name: str, q: int, x: int, gq: int, sx: int) -> None:
    """Per program, [lo, hi) is exactly the chunks holding a true position (any tiles: the
    interval arithmetic is exact for one grid axis and these conjunctions); for a disjunction,
    the disjoint runs of ``chunk_runs`` (the lowering's sweep) hold each such chunk exactly
    once, in increasing order, and no other."""
    masks = masks_of(name)
    assert masks is not None and (len(masks) == 1) == (name not in UNIONS)
    trips = math.ceil(x / sx)
    live, _ = blocks(PREDICATES[name], q, x, gq, sx)
    for p in range(math.ceil(q / gq)):
        runs = np.flatnonzero(live[p]).tolist()
        if len(masks) == 1:
            lo, hi = chunk_range(masks[0], {"q": p * gq}, {"q": gq - 1}, sx, trips)
            assert list(range(max(lo, 0), max(hi, lo, 0))) == runs, (p, lo, hi)
        swept = [c for lo, hi in chunk_runs(masks, {"q": p * gq}, {"q": gq - 1}, sx, trips) for c in range(lo, hi)]
        assert swept == runs, (p, swept)


def test_chunk_count_closed_form_for_causal() -> None:
    """With gq = k·sx and q = x: (x/sx)(q/gq + 1)/2 pairs, symbolic in the tiles."""
    gq, sx = sympy.symbols("gq sx", positive=True)
    masks = masks_of("causal")
    assert masks is not None
    n = chunk_count(masks, {"q": GroupAxis(gq, 4096 / gq)}, sx, 4096 / sx, {gq: sympy.Integer(4096)})
    assert n is not None and sympy.simplify(n - sympy.Rational(4096) / sx * (4096 / gq + 1) / 2) == 0


@pytest.mark.parametrize("name", ["unequal", "rows_or", "unequal_or", "negated_or", "too_many", "zero_fill", "values",
                                  "plain"])
def test_unrecognised_masks_keep_every_chunk(name: str) -> None:
    """!=, a disjunction with a disjunct that bounds no stream index (rows below 50 see every
    key, whatever ``q >= x`` skips), with a ``!=`` or a negation, or whose normal form has
    more than ``MAX_DISJUNCTS`` disjuncts, a fill that is not the padding, a mask on the
    values (which do not absorb: the normaliser still needs the chunk), or no mask: no skip,
    full count."""
    assert masks_of(name) is None
    c = cost_of(MODULE.diagram(name), flash(), sizes={"q": 256, "x": 256})
    assert c.program.masked == ()
    full = cost_of(MODULE.diagram("plain"), flash(), sizes={"q": 256, "x": 256})
    assert sympy.simplify(c.first.transfers - full.first.transfers) == 0


def flash(pad: bool = False) -> Schedule:
    return Schedule((Partition("group", "q", "gq", pad=pad),
                     Partition("stream", "x", "sx", via="online_softmax", pad=pad)))


def test_causal_cost_is_about_half_at_large_sizes() -> None:
    sizes = {"q": 1 << 16, "x": 1 << 16}
    tiles = {"gq": 128, "sx": 64}
    causal = cost_of(MODULE.diagram("causal"), flash(), sizes=sizes)
    plain = cost_of(MODULE.diagram("plain"), flash(), sizes=sizes)
    assert len(causal.program.masked) == 1
    for expr in ("flops", "transfers"):
        ours = causal.flops if expr == "flops" else causal.first.transfers
        theirs = plain.flops if expr == "flops" else plain.first.transfers
        ratio = float(causal.at(ours, tiles) / plain.at(theirs, tiles))
        assert 0.5 <= ratio < 0.52, (expr, ratio)
    # memory is per group and unchanged; the continuous optimum still has a closed form
    assert sympy.simplify(causal.first.memory - plain.first.memory) == 0
    opt = continuous(causal)
    assert opt is not None and opt.beta == 1


def test_cost_counts_the_kernels_chunks_ragged() -> None:
    """A padded schedule at ragged sizes: the K and V loads inside the stream are the
    brute-force pair count times a chunk of each (the Q load and O save outside it are not)."""
    q, x, gq, sx = 100, 100, 32, 16
    c = cost_of(MODULE.diagram("window"), flash(pad=True), sizes={"q": q, "x": x})
    pairs = brute("window", q, x, gq, sx)
    outside = 2 * math.ceil(q / gq) * gq * 8  # Q loaded and O saved once per query tile
    assert c.at(c.first.transfers, {"gq": gq, "sx": sx}) == outside + pairs * 2 * sx * 8


def test_symbolic_sizes_give_a_piecewise_count_and_no_optimum() -> None:
    """q and x symbolic: where causal clips depends on q vs x (Min), so no Lagrange optimum."""
    c = cost_of(MODULE.diagram("causal"), flash())
    assert c.first.transfers.has(sympy.Min)
    assert continuous(c) is None
    qq, xx = c.sizes["q"], c.sizes["x"]
    equal = c.at(c.first.transfers, {"q": 4096, "x": 4096, "gq": 64, "sx": 64})
    assert equal == 2 * 4096 * 8 + 2 * 64 * 8 * brute("causal", 4096, 4096, 64, 64)
    assert {qq, xx} <= c.first.transfers.free_symbols


@pytest.mark.parametrize("name", ["causal", "window", "prefix_lm", "sink"])
def test_symbolic_count_at_numbers_is_the_brute_force(name: str) -> None:
    """The count with symbolic sizes and tiles (clips kept as Min/Max/floor) substituted."""
    masks = masks_of(name)
    assert masks is not None
    qq, xx, gq, sx = sympy.symbols("q x gq sx", positive=True)
    n = chunk_count(masks, {"q": GroupAxis(gq, qq / gq)}, sx, xx / sx, {gq: qq, sx: xx})
    assert n is not None
    for q, x, g, s in [(256, 256, 64, 32), (512, 256, 64, 64), (96, 320, 32, 16)]:
        assert n.subs({qq: q, xx: x, gq: g, sx: s}) == brute(name, q, x, g, s), (q, x, g, s)


def test_chunk_count_names_a_missing_grid_axis() -> None:
    masks = masks_of("causal")
    assert masks is not None
    with pytest.raises(ValueError, match="`q`"):
        chunk_count(masks, {}, sympy.Integer(16), sympy.Integer(4))


# ---- the skip rule on every accumulator, a mask on each operand in turn -------------------------

#: (box over S: [q x] and V: [x d] as written, accumulator); {0} and {1} stand for the operands
BOXES = [("sum[x]({0})", "sum"), ("mean[x]({0})", "sum"), ("max[x]({0})", "max"), ("min[x]({0})", "min"),
         ("prod[x]({0})", "prod"), ("logsumexp[x]({0})", "logsumexp"), ("contract[x]({0}, {1})", "sum"),
         ("ncontract[x; exp, exp, id]({0}, {1})", "online_softmax"),
         # (the unshifted `normalised` state of an exponential is refused: it overflows where softmax does not)
         ("ncontract[x; id, square, sqrt]({0}, {1})", "normalised"),
         ("ncontract[x; id, square, rms]({0}, {1})", "normalised")]
CASES = [(form, name, i) for form, name in BOXES for i in range(form.count("{"))]
TEXTS = {-math.inf: "-inf", math.inf: "inf", 0.0: "0", 1.0: "1"}


def _text(form: str, operands: list[str], lines: str = "", theorem: str = "") -> str:
    out = "q d" if "{1}" in form else "q"
    return (f"axis q, x\naxis d = 4\ndiagram f(S: [q x], V: [x d]) -> [{out}] {{\n{lines}"
            f"  return {form.format(*operands)}\n}}\n{theorem}")


def masked_theorem(form: str, name: str, masked: int) -> Any:
    """``form`` with operand ``masked`` replaced by ``M = where[q x](q >= x, operand, pad)``
    (pad: that operand's padding value under ``name``), grouped over q and streamed over x
    with ``name``, padded."""
    box = loads(_text(form, ["S", "V"])).diagram("f").outputs[0]
    assert isinstance(box, Box)
    pads = plan(box, STREAM, name).pad
    assert pads is not None
    operands = ["S", "V"]
    where = f"  M = where[q x](q >= x, {operands[masked]}, {TEXTS[pads[masked]]})\n"
    operands[masked] = "M"
    text = _text(form, operands, where, f"theorem t: f {{\n  group q by gq pad\n  stream x by sx via {name} pad\n}}\n")
    (result,) = check_module(loads(text))
    assert result.theorem is not None, result.failure
    return result.theorem


@pytest.mark.parametrize(("form", "name", "masked"), CASES, ids=[f"{f.split('(')[0]}-{n}-{i}" for f, n, i in CASES])
def test_a_mask_skips_chunks_only_on_an_absorbing_operand(form: str, name: str, masked: int) -> None:
    """Each accumulator with a padding-valued mask on each of its operands in turn: the skip
    rule applies exactly when the operand absorbs (every contraction factor; the scores, not
    the values, of the exponential and normalised states), and the Pallas kernel (interpret
    mode) equals the evaluator at ragged sizes."""
    thm = masked_theorem(form, name, masked)
    target = "jax" if "prod" in form else "pallas"  # Triton has no reduce_prod: the cost still skips
    lowered = lower(thm, target=target, tiles={"gq": 16, "sx": 16})
    lay = lowered.layout
    (acc,) = lay.plans.values()
    skips = stream_masks(lay.flat, STREAM, lay.plans, lay.grid) is not None
    assert skips == (masked in acc.absorbing)
    assert skips == (name not in ("online_softmax", "normalised") or masked == 0)  # the rule, spelt out
    rng = np.random.default_rng(masked)
    sizes = {"q": 40, "x": 70, "d": 4}
    arrays = [rng.standard_normal([sizes[a] for a in p.axes]) for p in thm.source.inputs]
    if "prod" in form:
        arrays = [1.0 + 0.01 * a for a in arrays]
    want = evaluate(thm.source, arrays, sizes=sizes)
    options = {"interpret": True} if target == "pallas" else {}
    got = lowered.fn(*[jnp.asarray(a, jnp.float32) for a in arrays], **options)
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    finite = np.isfinite(want)  # rows with every key masked: ±inf for max/min/logsumexp
    scale = max(1.0, float(np.max(np.abs(want[finite]))))
    assert np.max(np.abs(got - want)[finite]) <= 2e-5 * scale, (form, name, masked)


@pytest.mark.parametrize("values", ["where[x d](d < 2, V, -inf)", "recip(exp(where[x d](d < 2, V, -inf)))",
                                    "log(exp(where[x d](d < 2, V, -inf)))", "rsqrt(exp(where[x d](d < 2, V, -inf)))"])
def test_a_mask_skips_no_chunk_where_another_operand_may_be_infinite(values: str) -> None:
    """The side condition: the masked scores absorb only against finite values.  With values
    that a `-inf` mask makes infinite (exp(-inf) = 0, so recip, log and rsqrt of it are not
    finite), a chunk the scores mask lifts to 0·inf = NaN in the evaluator, so the kernel runs
    it too (no skip) and gives the evaluator's NaN, not a number."""
    text = ("axis q, x\naxis d = 4\ndiagram f(S: [q x], V: [x d]) -> [q d] {\n"
            f"  M = where[q x](q >= x, S, -inf)\n  W = {values}\n"
            "  return ncontract[x; exp, exp, id](M, W)\n}\n"
            "theorem t: f {\n  group q by gq pad\n  stream x by sx via online_softmax pad\n}\n")
    (result,) = check_module(loads(text))
    assert result.theorem is not None, result.failure
    lowered = lower(result.theorem, target="pallas", tiles={"gq": 16, "sx": 16})
    lay = lowered.layout
    assert stream_masks(lay.flat, STREAM, lay.plans, lay.grid) is None
    rng = np.random.default_rng(0)
    sizes = {"q": 40, "x": 37, "d": 4}
    arrays = [rng.standard_normal([sizes[a] for a in p.axes]) for p in result.theorem.source.inputs]
    want = np.asarray(evaluate(result.theorem.source, arrays, sizes=sizes), np.float64)
    got = np.asarray(lowered.fn(*[jnp.asarray(a, jnp.float32) for a in arrays], interpret=True), np.float64)
    assert np.isnan(want).any() and np.isfinite(want).any()
    assert agrees(got, want)


@pytest.mark.parametrize("name", sorted(PREDICATES))
@pytest.mark.parametrize(("q", "x", "gq", "sx"),
                         [(100, 100, 32, 16), (64, 200, 16, 64), (50, 90, 8, 32), (96, 96, 32, 32)])
def test_full_range_per_program_is_exact(name: str, q: int, x: int, gq: int, sx: int) -> None:
    """Per program, ``full_range`` is exactly the chunks on which the mask holds at every
    position of the (padded) block: there the kernel leaves the mask out.  For a disjunction
    each disjunct's full range holds only such chunks (sound), not always all of them: a chunk
    may be full because its positions are covered by different disjuncts (a sink's columns
    and the window's)."""
    flat = flatten(MODULE.diagram(name))
    found = full_masks(flat, STREAM, [n.name for n in flat.nodes], {"q"})
    assert {getattr(flat.node(where).expr, "op", None) for where, _ in found} == {"where"}
    assert (len(found) == 1) == (name not in UNIONS)
    trips = math.ceil(x / sx)
    _, whole = blocks(PREDICATES[name], q, x, gq, sx)
    for p in range(math.ceil(q / gq)):
        full = np.flatnonzero(whole[p]).tolist()
        ranges = [full_range(sides, {"q": p * gq}, {"q": gq - 1}, sx, trips) for _, sides in found]
        each = [set(range(max(lo, 0), max(hi, lo, 0))) for lo, hi in ranges]
        assert all(chunks <= set(full) for chunks in each), (p, ranges)
        if name not in UNIONS:
            assert each == [set(full)], (p, ranges)


@pytest.mark.parametrize("name", ["unequal", "plain"])
def test_masks_that_are_not_affine_conjunctions_are_never_left_out(name: str) -> None:
    flat = flatten(MODULE.diagram(name))
    assert full_masks(flat, STREAM, [n.name for n in flat.nodes], {"q"}) == ()


def test_a_conjunct_on_grid_indices_alone_keeps_the_mask() -> None:
    """``q < 50 and q >= x`` bounds rows the chunk cannot see: leaving the mask out would drop it."""
    text = TEXT.split("diagram causal")[0] + """diagram rows(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = where[q x](q < 50 and q >= x, contract[d](Q, K), -inf)
  return ncontract[x; exp, exp, id](S, V)
}
"""
    flat = flatten(loads(text).diagram("rows"))
    assert full_masks(flat, STREAM, [n.name for n in flat.nodes], {"q"}) == ()


# ---- fills carried through elementwise ops (the causal backward's P = exp(S - L)) ----------------

#: an expression R over M = where(q >= x, S, -inf), Z = where(q >= x, S, 0),
#: N = where(q > x, S, -inf), W = where(q >= x, S, inf) and the inputs S: [q x], L: [q]; the
#: where node whose predicate R's fill is under, and the fill (None: not known)
FILLS = [("M", "M", -math.inf), ("exp(M - L)", "M", 0.0), ("exp(M - L) * (S - L)", "M", 0.0),
         ("(S - L) * exp(M)", "M", 0.0), ("M + S", "M", -math.inf), ("S - M", "M", math.inf),
         ("-M", "M", math.inf), ("relu(M)", "M", 0.0), ("sigmoid(M)", "M", 0.0), ("min(M, S)", "M", -math.inf),
         ("S / M", "M", 0.0), ("Z * S", "Z", 0.0), ("exp(M) * exp(tanh(N))", "M", 0.0), ("M + M", "M", -math.inf),
         ("exp(Z)", "Z", 1.0), ("exp(N)", "N", 0.0), ("sigmoid(-(Z * S))", "Z", 0.5),
         # not known: the result depends on the other operand, or is NaN, or the other may be
         # infinite, or the fill is not a constant, or a reduction mixes the positions
         ("M * S", None, None), ("max(M, S)", None, None), ("Z / S", None, None), ("M / S", None, None),
         ("M - M", None, None), ("exp(M) * log(S)", None, None), ("gelu(M)", None, None), ("S", None, None),
         ("exp(where[q x](q >= x, S, L))", None, None), ("sum[x](exp(M))", None, None),
         ("exp(M) * exp(N)", None, None),  # exp(N) may overflow in float64 (S past 709.8): 0 · inf
         # a zero of either sign (0·S is -0 where S < 0, S / inf where S < 0) carries nothing
         # that tells the signs apart
         ("recip(Z * S)", None, None), ("rsqrt(Z * S)", None, None), ("sigmoid(-recip(Z * S))", None, None),
         ("recip(S / W)", None, None), ("recip(Z)", None, None)]


@pytest.mark.parametrize(("expr", "where", "fill"), FILLS, ids=[e for e, _, _ in FILLS])
def test_a_fill_is_carried_only_where_arithmetic_fixes_it(expr: str, where: str | None, fill: float | None) -> None:
    """``masked_fill``: a where's constant fill, carried through unary ops to their exact value
    and through binary ops where it fixes the result for every finite other operand, under
    that where's predicate; unknown (None) for a product with an infinity, a maximum that keeps
    the finite side, 0/0, -inf - -inf, an operand that may be infinite (log), a NaN (gelu at
    -inf), a fill that is not a constant, a reduction, and a zero whose sign matters
    (``recip(0·S)`` is -inf where S < 0)."""
    out = "q" if expr.startswith("sum") else "q x"
    text = ("axis q, x\ndiagram f(S: [q x], L: [q]) -> [" + out + "] {\n"
            "  M = where[q x](q >= x, S, -inf)\n  Z = where[q x](q >= x, S, 0)\n  N = where[q x](q > x, S, -inf)\n"
            "  W = where[q x](q >= x, S, inf)\n"
            f"  R = {expr}\n  return R\n}}\n")
    flat = flatten(loads(text).diagram("f"))
    defs = {n.name: n.expr for n in flat.nodes}
    found = masked_fill(Var(flat.outputs[0], ()), defs, [name for name, _ in flat.inputs])
    if where is None:
        assert found is None, found
    else:
        assert found == (defs[where].index, fill), found  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["backward_kv", "backward_q"])
def test_the_causal_backward_passes_skip_what_the_mask_zeroes(name: str) -> None:
    """FlashAttention-2's causal backward: ``P = exp(S - L)`` and ``dS = P·(dP - D)`` are 0
    where the mask fills the scores with -inf, and they absorb the passes' sums, so each pass
    costs about half its unmasked twin at large sizes and both targets bound its loop (the
    kernels equal the evaluator: test_lower_jax/test_lower_pallas, every theorem of proofs/)."""
    path = str(Path(__file__).resolve().parent.parent / "proofs" / "flash_attention_backward.ncd")
    causal, plain = (theorem(path, f"flash_attention_{kind}{name}") for kind in ("causal_", ""))
    sizes = {"q": 1 << 15, "x": 1 << 15}
    tiles = {"gq": 128, "sx": 64, "gx": 128, "sq": 64}
    ours, theirs = cost(causal, sizes=sizes), cost(plain, sizes=sizes)
    assert len(ours.program.masked) == 1
    ratio = float(ours.at(ours.flops, tiles) / theirs.at(theirs.flops, tiles))
    assert 0.5 <= ratio < 0.52, ratio
    for thm, skips in ((causal, True), (plain, False)):
        lay = lower(thm, target="pallas", tiles=tiles).layout
        assert (stream_masks(lay.flat, lay.stream, lay.plans, lay.grid) is not None) == skips
        assert ("lax.cond(" in lower(thm, target="jax", tiles=tiles).source) == skips  # the chunk skip


@pytest.mark.parametrize(("acc", "body"), [("sum", "sum[x](sigmoid(-recip(Z * S)))"), ("min", "min[x](recip(Z * S))"),
                                           ("max", "max[x](-recip(Z * S))")])
def test_a_signed_zero_is_never_taken_for_the_identity(acc: str, body: str) -> None:
    """0·S is -0 where S < 0, and recip(-0) = -inf: a chunk the mask fills with zeros does not
    lift to the identity through recip, so nothing is skipped, and both targets give the
    evaluator's values (they skipped, and differed, when the zero's sign was dropped)."""
    text = ("axis q, x\ndiagram f(S: [q x]) -> [q] {\n  Z = where[q x](q >= x, S, 0)\n"
            f"  return {body}\n}}\ntheorem t: f {{\n  group q by gq pad\n  stream x by sx via {acc} pad\n}}\n")
    (result,) = check_module(loads(text))
    assert result.theorem is not None, result.failure
    rng = np.random.default_rng(0)
    s = np.abs(rng.standard_normal((32, 32))) + 1
    s[:, 16:] *= -1
    want = np.asarray(evaluate(result.theorem.source, [s], sizes={"q": 32, "x": 32}), np.float64)
    for target in ("pallas", "jax"):
        lowered = lower(result.theorem, target=target, tiles={"gq": 16, "sx": 16})
        lay = lowered.layout
        assert stream_masks(lay.flat, lay.stream, lay.plans, lay.grid) is None
        got = lowered.fn(jnp.asarray(s, jnp.float32), **({"interpret": True} if target == "pallas" else {}))
        assert agrees(np.asarray(got, np.float64), want), (target, got, want)


# ---- disjunctions: the kernels of proofs/ with prefix-LM and sliding-window-with-sinks masks ----

#: the theorems' masks (examples/attention.ncd) as Python, for the brute force (as ``PREDICATES``)
KERNELS = {"flash_attention_prefix_lm": lambda g, i: (g >= i) | (i < 48),
           "flash_attention_sink_window": lambda g, i: ((g >= i) & (g - i < 64)) | (i < 16)}


def _proof(name: str) -> Any:
    return theorem(str(Path(__file__).resolve().parent.parent / "proofs" / "flash_attention.ncd"), name)


def _emitted_runs(lowered: Any, trips: int) -> Any:
    """The Pallas kernel's chunk runs of one program as the code it emits (``skip.stream_runs``
    and ``skip.ordered_runs``, the arithmetic ``_emit_loop`` writes before its loops), compiled
    into ``f(q_first) -> [((lo, hi), full or None), ...]``."""
    block = cg.Block(cg.Namer(["q_first", "jnp"]))
    runs = stream_runs(lowered.layout, {"q": cg.name("q_first")}, cg.const(trips))
    assert runs is not None and runs.skips
    pieces = ordered_runs(block, runs)
    flat = [e for (lo, hi), full in pieces for e in (lo, hi, *(full or ()))]
    fn = cg.function("runs", ["q_first"], [*block.stmts, ast.Return(cg.tuple_(flat))])
    tree = ast.fix_missing_locations(ast.Module([fn], []))
    scope: dict[str, Any] = {"jnp": jnp}
    exec(compile(tree, "<runs>", "exec"), scope)
    width = 4 if runs.full is not None else 2

    def at(q_first: int) -> list[tuple[tuple[int, int], tuple[int, int] | None]]:
        values = [int(v) for v in scope["runs"](jnp.int32(q_first))]
        return [((values[k], values[k + 1]), (values[k + 2], values[k + 3]) if width == 4 else None)
                for k in range(0, len(values), width)]

    return at


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize(("q", "x", "gq", "sx"), [(300, 290, 32, 16), (200, 333, 64, 16), (130, 250, 16, 32)])
def test_disjunctive_kernels_run_exactly_the_live_chunks(name: str, q: int, x: int, gq: int, sx: int) -> None:
    """Per program, the loops the Pallas kernel emits for a disjunction (a loop per disjoint
    range, in order) run every chunk that holds a true position of the mask exactly once and
    no other: their count is the number of live chunks, and fewer than all where the mask
    leaves a gap (the sinks or prefix, then the window or diagonal); the chunks they run
    unmasked hold the mask at every position of the block."""
    pred = KERNELS[name]
    lowered = lower(_proof(name), target="pallas", tiles={"gq": gq, "sx": sx})
    trips = math.ceil(x / sx)
    at = _emitted_runs(lowered, trips)
    ran_in_all = 0
    live, whole = blocks(pred, q, x, gq, sx)
    for p in range(math.ceil(q / gq)):
        pieces = at(p * gq)
        ran = [c for (lo, hi), _ in pieces for c in range(lo, hi)]
        assert ran == np.flatnonzero(live[p]).tolist(), (p, pieces)
        for (lo, hi), full in pieces:
            assert full is not None
            unmasked = range(max(lo, full[0]), min(hi, full[1]))
            assert all(whole[p, c] for c in unmasked), (p, full)
        ran_in_all += len(ran)
    assert ran_in_all == brute_pairs(pred, q, x, gq, sx) < math.ceil(q / gq) * trips


@pytest.mark.parametrize("name", sorted(KERNELS))
@pytest.mark.parametrize("target", ["pallas", "jax"])
def test_disjunctive_kernels_match_the_evaluator_at_ragged_sizes(name: str, target: str) -> None:
    """Both targets skip (Pallas: loops over the disjoint ranges; plain JAX: a ``lax.cond`` on
    whether the chunk lies in any range) and equal the evaluator at ragged sizes where
    the sinks or prefix and the window are separate runs of chunks."""
    thm = _proof(name)
    tiles = {"gq": 32, "sx": 16}
    lowered = lower(thm, target=target, tiles=tiles)
    if target == "pallas":
        # two runs, each masked, unmasked, masked; prefix-LM's both start at chunk 0 and hold
        # from there, so no masked loop precedes their unmasked ones
        loops = 4 if name == "flash_attention_prefix_lm" else 6
        assert lowered.source.count("lax.fori_loop(") == loops and "run_first_2" in lowered.source
    else:
        assert "jnp.logical_or(jnp.logical_and(j >= " in lowered.source
    sizes = {"q": 201, "x": 187, "d": 64}
    rng = np.random.default_rng(len(name))
    arrays = [rng.standard_normal([sizes[a] for a in p.axes]) for p in thm.source.inputs]
    want = np.asarray(evaluate(thm.source, arrays, sizes=sizes), np.float64)
    options = {"interpret": True} if target == "pallas" else {}
    got = lowered.fn(*[jnp.asarray(a, jnp.float32) for a in arrays], **options)
    assert agrees(np.asarray(got, np.float64), want)


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_disjunctive_cost_counts_the_kernels_chunks(name: str) -> None:
    """The cost of a disjunctive mask: the loads inside the stream are the brute-force count
    of live (program, chunk) pairs times a chunk of K and V, at ragged padded sizes and with
    symbolic tiles substituted; at 32k tokens the sliding window with sinks moves a small
    fraction of causal attention's bytes and FLOPs, and prefix-LM about causal's."""
    thm = _proof(name)
    c = cost(thm, sizes={"q": 4096, "x": 4096})
    assert len(c.program.masked) == 1
    for gq, sx in [(64, 16), (32, 32), (128, 64)]:
        pairs = brute_pairs(KERNELS[name], 4096, 4096, gq, sx)
        outside = 2 * (4096 // gq) * gq * 64  # Q loaded and O saved once per query tile
        assert c.at(c.first.transfers, {"gq": gq, "sx": sx}) == outside + pairs * 2 * sx * 64, (gq, sx)
    sizes, tiles = {"q": 1 << 15, "x": 1 << 15}, {"gq": 128, "sx": 64}
    ours, causal = cost(thm, sizes=sizes), cost(_proof("flash_attention_causal"), sizes=sizes)
    ratio = {expr: float(ours.at(getattr(ours, expr) if expr == "flops" else ours.first.transfers, tiles)
                         / causal.at(getattr(causal, expr) if expr == "flops" else causal.first.transfers, tiles))
             for expr in ("flops", "transfers")}
    if name == "flash_attention_sink_window":
        # 4.5 of causal's 257 chunks per program on average (1.75 %), Q and O outside the stream
        assert all(r < 0.03 for r in ratio.values()), ratio
    else:
        assert all(1 <= r < 1.001 for r in ratio.values()), ratio  # the 48-key prefix lies in the first chunk


@pytest.mark.parametrize("target", ["pallas", "jax"])
def test_a_disjunct_that_bounds_no_key_keeps_every_chunk_on_both_targets(target: str) -> None:
    """``q >= x or q < 50``: the first disjunct alone would stop each program at its diagonal,
    but rows below 50 see every key, so no chunk is skipped and both kernels equal the
    evaluator at ragged sizes (a skip by the first disjunct drops those rows' later keys)."""
    text = TEXT + "theorem t: rows_or {\n  group q by gq pad\n  stream x by sx via online_softmax pad\n}\n"
    (result,) = [r for r in check_module(loads(text)) if r.name == "t"]
    assert result.theorem is not None, result.failure
    lowered = lower(result.theorem, target=target, tiles={"gq": 16, "sx": 16})
    lay = lowered.layout
    assert stream_masks(lay.flat, STREAM, lay.plans, lay.grid) is None
    sizes = {"q": 70, "x": 90, "d": 8}
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal([sizes[a] for a in p.axes]) for p in result.theorem.source.inputs]
    want = np.asarray(evaluate(result.theorem.source, arrays, sizes=sizes), np.float64)
    options = {"interpret": True} if target == "pallas" else {}
    got = np.asarray(lowered.fn(*[jnp.asarray(a, jnp.float32) for a in arrays], **options), np.float64)
    assert agrees(got, want)
