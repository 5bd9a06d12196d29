"""Every checked theorem's schedule, run literally by the schedule interpreter, computes
the source diagram (checked numerically): random tile sizes, random axis sizes that respect
the recorded divisibility constraints (any size where ``pad`` is declared), random values.

A forged (kernel-bypassing) unsound schedule is shown to disagree, so the property has teeth.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from napkin_cat import certify, kernel, ops, terms
from napkin_cat.certify.approximation import label_inputs
from napkin_cat.elaborate import loads
from napkin_cat.evaluate import evaluate, related, sample_integers
from napkin_cat.kernel import KernelError, Theorem
from napkin_cat.proof import check_file, check_module, partitions, theorem
from napkin_cat.schedule.run import run_schedule
from napkin_cat.terms import Partition

PROOFS = Path(__file__).resolve().parent.parent / "proofs"
CASES = [(path, r.name) for path in sorted(PROOFS.glob("*.ncd")) for r in check_file(path)]


@cache
def _theorem(path: Path, name: str) -> Theorem:
    return theorem(path, name)


def _draw_sizes(draw: Callable[[st.SearchStrategy[Any]], Any], thm: Theorem) -> tuple[dict[str, int], dict[str, int]]:
    """Tile values (inner tiles dividing outer ones) and axis sizes (divisible unless padded)."""
    declared = thm.result.axis_sizes()
    tiles: dict[str, int] = {}
    by_axis: dict[str, list[Partition]] = {}
    for p in partitions(thm):  # a chain's kernels' too
        by_axis.setdefault(p.axis, []).append(p)
    sizes: dict[str, int] = {}
    for axis, parts in by_axis.items():
        inner = 1
        for p in reversed(parts):  # innermost first: each outer tile a multiple of the inner one
            if isinstance(p.tile, int):
                inner = p.tile
            elif p.tile in tiles:
                inner = tiles[p.tile]
            else:
                choices = [inner * k for k in range(1, 3 if inner > 1 else 4)]
                if declared.get(axis) is not None and not parts[0].pad:  # a declared size: a tile that divides it
                    choices = [c for c in choices if declared[axis] % c == 0]  # type: ignore[operator]
                inner = tiles[p.tile] = draw(st.sampled_from(choices))
        outer = parts[0]
        if declared.get(axis) is not None:
            sizes[axis] = declared[axis]  # type: ignore[assignment]
        elif outer.pad:
            sizes[axis] = draw(st.integers(1, 2 * inner + 1))
        else:
            sizes[axis] = inner * draw(st.integers(1, 3))
    for axis, n in declared.items():
        sizes.setdefault(axis, n if n is not None else draw(st.integers(1, 3)))
    return tiles, sizes


def _broken(thm: Theorem, value: dict[str, int]) -> list[str]:
    """The recorded divisibility constraints that these tile and axis values break."""
    def of(term: int | str) -> int:
        return term if isinstance(term, int) else value[term]

    return [str(c) for c in thm.constraints if of(c.dividend) % of(c.divisor)]


@pytest.mark.parametrize(("path", "name"), CASES, ids=[n for _, n in CASES])
@settings(max_examples=5, deadline=None)
@given(data=st.data())
def test_schedule_interpreter_matches_evaluator(path: Path, name: str, data: st.DataObject) -> None:
    thm = _theorem(path, name)
    tiles, sizes = _draw_sizes(data.draw, thm)
    value = {**tiles, **sizes}
    assert not _broken(thm, value), f"drawn {value} break {_broken(thm, value)}: _draw_sizes must honour them"
    seed = data.draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal([sizes[a] for a in p.axes]) for p in thm.source.inputs]
    labels = label_inputs(thm.result)  # inputs read by onehot[v] hold integer positions along v
    arrays = [rng.integers(0, sizes[labels[p.name]], size=a.shape).astype(float) if p.name in labels else
              sample_integers(rng, a.shape) if p.integer else a for p, a in zip(thm.source.inputs, arrays, strict=True)]
    source_axes = {a.name for a in thm.source.axes}
    arrays = related(thm.source, arrays, {a: n for a, n in sizes.items() if a in source_axes})  # README "Proofs"
    want = evaluate(thm.source, arrays, sizes={a: n for a, n in sizes.items() if a in source_axes})
    got = run_schedule(thm, arrays, sizes=sizes, tiles=tiles)
    wants = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, wants, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9)


@st.composite
def chains(draw: st.DrawFn) -> str:
    """A diagram over q, x, d: a chain of boxes that treat its axes in every way the kernel
    distinguishes (weave, mask, consume, mix, a second pass), its values through `V`."""
    axes, lines = ["q", "x"], []
    for i in range(draw(st.integers(1, 5))):
        a = f"T{i - 1}" if i else "S"
        ax = draw(st.sampled_from(axes))
        forms = [f"exp({a})", f"tanh({a}) * 3", f"{a} + index[{ax}]({ax})", f"softmax[{ax}]({a})",
                 f"{a} - max[{ax}]({a})", f"contract[d]({a}, V)" if "d" in axes else f"{a} * V"]
        if {"q", "x"} <= set(axes):
            forms.append(f"where[q x](q >= x, {a}, -inf)")
        if len(axes) > 1:
            forms.append(f"{draw(st.sampled_from(('sum', 'max', 'logsumexp')))}[{ax}]({a})")
        if "x" in axes:
            forms += [f"contract[x]({a}, V)", f"ncontract[x; exp, exp, id]({a}, V)"]
        form = draw(st.sampled_from(forms))
        if form.startswith(("sum", "max[", "logsumexp")):
            axes.remove(ax)
        elif form.startswith(("contract[x]", "ncontract")):
            axes[axes.index("x")] = "d"
            axes = list(dict.fromkeys(axes))
        elif form.startswith("contract[d]"):
            axes = list(dict.fromkeys([*(a for a in axes if a != "d"), "x"]))
        elif form.endswith("* V"):
            axes = list(dict.fromkeys([*axes, "x", "d"]))
        lines.append(f"  T{i} = {form}")
    out = f"T{len(lines) - 1}"
    return (f"axis q, x, d\ndiagram f(S: [q x], V: [x d]) -> [{' '.join(axes)}] {{\n" + "\n".join(lines)
            + f"\n  return {out}\n}}\n")


@settings(max_examples=100, deadline=None)
@given(chains(), st.data())
def test_every_schedule_the_kernel_accepts_computes_the_diagram(text: str, data: st.DataObject) -> None:
    """The kernel's side conditions on diagrams no proof file contains: up to four random group
    and stream steps (ragged or padded tiles, two levels) on a generated chain; every step the
    kernel accepts is kept, and the schedule, run tile by tile, must compute the diagram.

    (The interpreter keeps whole arrays, so it cannot see a second pass: that refusal is
    tested by its message in test_kernel.py and tests/unsound/.)"""
    diagram = loads(text).diagram("f")
    thm = kernel.unfold(kernel.refl("t", diagram))
    for level in ("smem", "smem", "reg", "reg"):
        step = Partition(data.draw(st.sampled_from(("group", "stream"))), data.draw(st.sampled_from("qxd")),
                         data.draw(st.integers(1, 4)), level, None, data.draw(st.booleans()))
        try:
            thm = kernel.group(thm, step) if step.kind == "group" else kernel.stream(thm, step, certify.accumulator)
        except KernelError:
            continue  # refused: the kernel's business, tested with its reasons in test_kernel.py
    assume(thm.schedule.partitions)
    sizes = {a: data.draw(st.integers(1, 7)) for a in "qxd"}
    assume(not _broken(thm, sizes))  # an integer tile recorded as dividing a symbolic axis
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    arrays = [rng.standard_normal([sizes[a] for a in p.axes]) for p in diagram.inputs]
    want = evaluate(diagram, arrays, sizes=sizes)
    (got,) = run_schedule(thm, arrays, sizes=sizes)
    kept = np.isfinite(want)  # the contract is every finite value: a -inf mask fed to a contraction
    # makes infinities, and their sums are conventions, not real numbers
    np.testing.assert_allclose(got[kept], want[kept], rtol=1e-9, atol=1e-9, err_msg=f"{text}{thm.schedule}")


@settings(max_examples=60, deadline=None)
@given(chains(), st.data())
def test_every_chain_the_join_accepts_computes_the_diagram(text: str, data: st.DataObject) -> None:
    """``terms.cut``, trusted with the kernel's join (``kernel.chain``): for any arrays a generated
    diagram's kernels write (in the diagram's order), the pieces run in order, each on the inputs and
    the arrays written before it, compute the diagram."""
    diagram = loads(text).diagram("f")
    whole = kernel.unfold(kernel.refl("t", diagram))
    names = [let.names[0] for let in whole.result.body]
    kept = data.draw(st.lists(st.booleans(), min_size=len(names), max_size=len(names)))
    writes = (*((n,) for n, keep in zip(names, kept, strict=True) if keep), ("return",))
    pieces = terms.cut(whole.result, writes, ops.integer_valued)
    thm = kernel.chain(whole, writes, tuple(kernel.refl(f"k{i}", p) for i, p in enumerate(pieces)), None)
    assert len(thm.kernels) == len(writes)
    sizes = {a: data.draw(st.integers(1, 5)) for a in "qxd"}
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    arrays = [rng.standard_normal([sizes[a] for a in p.axes]) for p in diagram.inputs]
    want = evaluate(diagram, arrays, sizes=sizes)
    (got,) = run_schedule(thm, arrays, sizes=sizes)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, equal_nan=True, err_msg=f"{text}{writes}")


def test_forged_schedule_is_caught() -> None:
    """Grouping the contracted axis of a matmul (which the kernel refuses) gives wrong values."""
    thm = _theorem(PROOFS / "matmul.ncd", "tiled_matmul")
    forged = thm.schedule.__class__(partitions=(Partition("group", "b", 2),))
    object.__setattr__(thm := _copy(thm), "schedule", forged)  # bypass the kernel, for this test only
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    (got,) = run_schedule(thm, [a, b])
    assert not np.allclose(got, a @ b)


def test_symbolic_tile_needs_a_value() -> None:
    thm = _theorem(PROOFS / "matmul.ncd", "tiled_matmul")
    with pytest.raises(ValueError, match="tile `ga` of axis `a` is symbolic"):
        run_schedule(thm, [np.ones((2, 2)), np.ones((2, 2))])


def test_ragged_padded_tiles() -> None:
    thm = _theorem(PROOFS / "matmul.ncd", "tiled_matmul_padded")
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((50, 33)), rng.standard_normal((33, 64))
    (got,) = run_schedule(thm, [a, b])
    np.testing.assert_allclose(got, a @ b, rtol=1e-10)


def _copy(thm: Theorem) -> Theorem:
    import copy

    return copy.copy(thm)


def test_stream_of_a_woven_axis_writes_every_chunk() -> None:
    """A stream over an axis nothing consumes is a sequential group: chunk outputs are kept."""
    module = loads("axis q, x\ndiagram f(S: [q x]) -> [q x], [q] {\n  E = exp(S)\n  return E, sum[x](E)\n}\n")
    thm = kernel.stream(kernel.refl("t", module.diagram("f")), Partition("stream", "q", 2), certify.accumulator)
    thm = kernel.stream(thm, Partition("stream", "x", 3, pad=True), certify.accumulator)
    s = np.random.default_rng(3).standard_normal((5, 7))
    e, total = run_schedule(thm, [s])
    np.testing.assert_allclose(e, np.exp(s))
    np.testing.assert_allclose(total, np.exp(s).sum(axis=1))


TWO_AXES = """
axis q, x, y
diagram total(A: [q x y]) -> [q] {
  return sum[x y](A)
}
diagram soft_total(A: [q x y]) -> [q] {
  return logsumexp[x y](A)
}
theorem sums: total {
  group q by 4
  stream x by 8 pad
  stream y by 4 pad
}
theorem logsumexps: soft_total {
  stream y by 8 pad
  stream x by 4 pad
}
"""


@pytest.mark.parametrize("name", ["sums", "logsumexps"])
def test_one_box_streamed_along_two_axes_keeps_one_state(name: str) -> None:
    """The inner stream's state is not finalised while an outer stream of another axis the
    box consumes is running: the outer one combines it (ragged tiles masked along both)."""
    (thm,) = [r.theorem for r in check_module(loads(TWO_AXES)) if r.name == name]
    assert thm is not None
    a = np.random.default_rng(2).standard_normal((6, 19, 11))
    (got,) = run_schedule(thm, [a])
    want = a.sum(axis=(1, 2)) if name == "sums" else np.log(np.exp(a).sum(axis=(1, 2)))
    np.testing.assert_allclose(got, want, rtol=1e-12)
