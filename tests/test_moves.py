"""The search's moves (napkin_cat.search.moves): lemma proposals found by matching, axis roles,
relabelling plans as proof steps, and the neighbourhood of the hill climb."""

from __future__ import annotations

from pathlib import Path

from napkin_cat import kernel
from napkin_cat.certify import rules
from napkin_cat.elaborate import load, loads
from napkin_cat.search import moves
from napkin_cat.terms import Partition, Place, Rewrite

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_lemmas_are_matched_through_bindings_not_by_name() -> None:
    module = load(EXAMPLES / "attention.ncd")
    found = moves.proposals(module.diagram("attention"), rules.lemmas_in_scope(module))
    assert Rewrite("softmax_contract", ("P", "O")) in found
    assert all(r.lemma != "l2_contract" for r in found)  # no l2norm box, so no match
    renamed = loads("axis i, j\naxis k = 8\ndiagram f(A: [i k], B: [j k], C: [j k]) -> [i k] {\n"
                    "  T = contract[k](A, B)\n  W = softmax[j](T)\n  R = contract[j](W, C)\n  return R\n}\n")
    assert Rewrite("softmax_contract", ("W", "R")) in moves.proposals(renamed.diagram("f"), rules.library())


def test_a_match_in_the_returned_expression_is_proposed_at_return() -> None:
    alibi = load(EXAMPLES / "attention.ncd").diagram("alibi_attention")  # softmax and contract inline in return
    found = moves.proposals(alibi, rules.library())
    assert Rewrite("softmax_contract", ("return",)) in found
    thm = kernel.rewrite(kernel.refl("t", alibi), rules.library()["softmax_contract"],
                         Rewrite("softmax_contract", ("return",)), {"softmax_contract": "test"})
    assert moves.stream_axes(thm.result) == ("x",)


def test_a_constant_is_matched_as_the_kernel_matches_it() -> None:
    """-0.0 and 0.0 are different constants to the kernel (their products differ in sign), so
    a lemma about one is not proposed on the other: every proposal is one the kernel accepts."""
    module = loads("axis i\nlemma times_zero(A: [i]) : sum[i](A * 0.0) = sum[i](A - A)\n"
                   "diagram f(X: [i]) -> [], [] {\n  Y = sum[i](X * -0.0)\n  Z = sum[i](X * 0.0)\n  return Y, Z\n}\n")
    lemma = rules.lemmas_in_scope(module)["times_zero"]
    found = moves.proposals(module.diagram("f"), {"times_zero": lemma})
    assert found == [Rewrite("times_zero", ("Z",))]
    thm = kernel.refl("t", module.diagram("f"))
    assert kernel.rewrite(thm, lemma, found[0], {"times_zero": "test"}).result != thm.result


def test_axis_roles_give_group_and_stream_candidates() -> None:
    module = load(EXAMPLES / "attention.ncd")
    attention = module.diagram("attention")
    assert moves.group_axes(attention) == ("q",)
    assert moves.stream_axes(attention) == ()  # x is mixed by softmax until the lemma is applied
    thm = kernel.rewrite(kernel.refl("t", attention), rules.library()["softmax_contract"],
                         Rewrite("softmax_contract", ("P", "O")), {"softmax_contract": "test"})
    assert moves.stream_axes(thm.result) == ("x",)
    assert set(moves.accumulator_choices(thm.result, "x")) == {"normalised", "online_softmax"}
    matmul = load(EXAMPLES / "matmul.ncd").diagram("matmul")
    assert (moves.group_axes(matmul), moves.stream_axes(matmul)) == (("a", "c"), ("b",))


def test_plans_become_steps_with_tile_names_apart_from_the_axes() -> None:
    clash = loads("axis gq, q\ndiagram f(X: [gq q]) -> [gq q] {\n  Y = exp(X)\n  return Y * 2\n}\n").diagram("f")
    plan = moves.Plan(groups=("gq", "q"), levels=2, placed=("Y",))
    steps = moves.plan_steps(plan, clash)
    tiles = [s.tile for s in steps if isinstance(s, Partition)]
    assert "gq" not in tiles and len(set(tiles)) == len(tiles)  # `gq` names an axis: the tile is renamed
    assert [s.level for s in steps if isinstance(s, Partition)] == ["smem", "smem"]  # both are batch axes
    assert steps[-1] == Place(("Y",), "smem")
    attention = load(EXAMPLES / "attention.ncd").diagram("attention")
    two = moves.plan_steps(moves.Plan(("q",), (("x", "online_softmax"),), levels=2), attention)
    assert [(s.kind, s.axis, s.tile, s.level, s.via) for s in two if isinstance(s, Partition)] == [
        ("group", "q", "gq", "smem", None), ("stream", "x", "sx", "smem", "online_softmax"),
        ("group", "q", "wq", "reg", None), ("stream", "x", "rx", "reg", "online_softmax")]


def test_neighbours_and_starts_cover_the_plan_space() -> None:
    matmul = load(EXAMPLES / "matmul.ncd").diagram("matmul")
    assert moves.starts(matmul) == [moves.Plan(("a", "c"), (("b", None),)), moves.Plan(("a", "c"))]
    around = set(moves.neighbours(moves.Plan(("a", "c"), (("b", None),)), matmul))
    assert moves.Plan(("c",), (("b", None),)) in around  # drop a group
    assert moves.Plan(("a", "c")) in around  # drop the stream
    assert moves.Plan(("a", "c"), (("b", "sum"),)) in around  # name its accumulator
    assert moves.Plan(("a", "c"), (("b", None),), levels=2) in around  # a second level
    assert all(len(p.streams) <= 1 for p in around)  # b is the only stream candidate


def test_signature_ignores_operand_order_only() -> None:
    module = load(EXAMPLES / "attention.ncd")
    lemmas = rules.library()
    base = kernel.refl("t", module.diagram("attention"))
    swapped = kernel.rewrite(base, lemmas["contract_comm"], Rewrite("contract_comm", ("O",)), {"contract_comm": "t"})
    fused = kernel.rewrite(base, lemmas["softmax_contract"], Rewrite("softmax_contract", ("P", "O")),
                           {"softmax_contract": "t"})
    assert moves.signature(swapped.result) == moves.signature(base.result)
    assert moves.signature(fused.result) != moves.signature(base.result)


def test_split_moves_come_with_the_stream_they_split() -> None:
    """A plan splits only an axis it streams, above every other partition, with the stream's
    accumulator; dropping that stream drops the split."""
    source = load(EXAMPLES / "attention.ncd").diagram("attention")
    diagram = kernel.unfold(kernel.refl("t", source)).result
    plan = moves.Plan(("q",), (("x", "online_softmax"),))
    split = next(p for p in moves.neighbours(plan, diagram) if p.split)
    assert split == moves.Plan(("q",), (("x", "online_softmax"),), split="x")
    steps = moves.plan_steps(split, diagram, pad=True)
    assert steps[0] == Partition("split", "x", "kx", "hbm", "online_softmax", pad=True)
    assert steps[1:] == moves.plan_steps(plan, diagram, pad=True)
    assert all(p.split is None for p in moves.neighbours(split, diagram) if not p.streams)
    assert moves.plan_steps(moves.Plan(split="x"), diagram) == ()  # nothing streamed, nothing split
