"""Pseudocode diagrams: loop nests per level, columns, live buffers, memory and transfers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sympy

from napkin_cat import cli, proof
from napkin_cat.cost import cost, cost_of
from napkin_cat.elaborate import loads
from napkin_cat.pseudo import render
from napkin_cat.schedule.build import program
from napkin_cat.schedule.loopnest import loop_nest
from napkin_cat.schedule.program import max_of
from napkin_cat.terms import Partition, Place, Schedule

ROOT = Path(__file__).resolve().parent.parent
gq, sx, wq, rx, q, x = sympy.symbols("gq sx wq rx q x", positive=True)

TEXT = """
axis t, e
diagram scaled_rows(X: [t e], W: [e]) -> [t e] {
  N = rsqrt(mean[e](square(X)) + 0.001)
  return X * N * W
}
"""


def flash() -> object:
    return proof.theorem(ROOT / "proofs" / "flash_attention.ncd", "flash_attention")


def test_flash_columns_and_residency() -> None:
    prog = cost(flash()).program
    (view,) = prog.views
    ops = [(s.op, s.array) for s in view.steps]
    # Q is loaded once per query tile, before the stream; K and V per chunk; O saved after it
    assert ops[0] == ("load", "Q") and ops[-1] == ("save", "O")
    assert next(s.path for s in view.steps if s.array == "Q" and s.op == "load") == ((0, 0),)
    k_load = next(s for s in view.steps if s.op == "load" and s.array == "K")
    assert len(k_load.path) == 2 and sympy.simplify(k_load.count * k_load.size - q * x * 64 / gq) == 0
    # the state (m, l, o) lives through the whole stream
    states = {b.name for b in view.buffers if b.role == "state"}
    assert states == {"O.m", "O.l", "O.o"}
    # an elementwise box writes over its dying operand: never two score chunks at once
    for s in view.steps:
        assert sum(1 for b in view.live(s.index) if b.array in ("t.1", "S")) <= 1
    assert sympy.expand(view.memory() - (gq * (2 * 64 + sx + 2) + 2 * sx * 64)) == 0


def test_two_level_views() -> None:
    thm = proof.theorem(ROOT / "proofs" / "flash_attention.ncd", "flash_attention_two_level")
    prog = cost(thm).program
    assert [(v.parent, v.level) for v in prog.views] == [("hbm", "smem"), ("smem", "reg")]
    smem, reg = prog.views
    assert sympy.simplify(smem.transfers() - (128 * q + 128 * q * x / gq)) == 0
    assert sympy.simplify(reg.transfers() - (128 * q + 128 * q * x / wq)) == 0
    # state and scores live in registers; SMEM holds only the staged tiles
    assert not any(b.role == "state" for b in smem.buffers)
    assert sympy.expand(smem.memory() - (64 * gq + 128 * sx)) == 0
    text = render(prog)
    assert "== level reg (transfers smem <-> reg" in text
    assert "load K hbm via smem -> reg" in text


def test_render_lists_loops_columns_and_totals() -> None:
    co = cost(flash(), sizes={"q": 1024, "x": 2048})
    text = render(co.program, co.bytes_of)
    assert "parallel for each q-tile of gq (1024/gq tiles) at smem:" in text
    assert "for each x-chunk of sx (2048/sx chunks) at smem via online_softmax:" in text
    assert "live@smem: Q[gq 64]" in text
    assert "memory M_smem" in text and "transfers H_smem" in text and "transfers in bytes" in text


def test_a_masked_stream_says_how_many_chunks_run() -> None:
    """Causal attention at q = x = 1024 with 128-row tiles and 64-key chunks: program i runs
    key chunks 0..2i+1, so 2 + 4 + ... + 16 = 72 of the 8 x 16 = 128 pairs."""
    causal = proof.theorem(ROOT / "proofs" / "flash_attention.ncd", "flash_attention_causal")
    co = cost(causal, sizes={"q": 1024, "x": 1024})
    ((index, runs, full),) = co.program.masked
    assert co.program.nest.loops[index].axis == "x"
    assert (runs.subs({gq: 128, sx: 64}), full.subs({gq: 128, sx: 64})) == (72, 128)
    line = next(line for line in render(co.program, co.bytes_of).splitlines() if "x-chunk" in line)
    assert line.endswith(f"via online_softmax:  [masked: {runs} of the {full} (group, chunk) pairs run]")
    plain = cost(flash(), sizes={"q": 1024, "x": 1024})
    assert "masked" not in render(plain.program, plain.bytes_of)


def test_a_diagram_not_in_the_repo() -> None:
    # row normalisation with the feature axis streamed: X is read twice (the mean, then the
    # scaling after the stream), N and W once per token tile
    module = loads(TEXT)
    schedule = Schedule((Partition("group", "t", "gt", "smem"), Partition("stream", "e", "se", "smem", "sum")))
    co = cost_of(module.diagram("scaled_rows"), schedule)
    t, e, gt = sympy.symbols("t e gt", positive=True)
    view = co.program.views[0]
    assert [s.array for s in view.steps if s.op == "load"].count("X") == 2
    assert sympy.simplify(view.transfers() - (3 * t * e + e * t / gt)) == 0
    # placing the mean in hbm makes it a materialisation boundary: saved, then loaded back
    placed = Schedule(schedule.partitions, (Place(("N",), "hbm"),))
    view2 = cost_of(module.diagram("scaled_rows"), placed).program.views[0]
    assert [s.op for s in view2.steps if s.array == "N"] == ["compute", "save", "load"]


def test_max_of_drops_dominated_columns() -> None:
    a, b = sympy.symbols("a b", positive=True)
    assert max_of([a, a + b, 2 * a + b]) == 2 * a + b
    assert max_of([a * b, a + b]) == sympy.Max(a * b, a + b)


def test_cli_pseudo(capsys) -> None:  # type: ignore[no-untyped-def]
    rc = cli.main(["pseudo", str(ROOT / "proofs" / "matmul.ncd"), "tiled_matmul"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "for each b-chunk of sb (b/sb chunks) at smem via sum:" in out
    assert "memory M_smem = ga*gc + ga*sb + gc*sb" in out


def test_two_accumulators_on_one_stream() -> None:
    module = loads("axis t, v\ndiagram stats(X: [t v]) -> [t], [t] {\n  return max[v](X), sum[v](X)\n}\n")
    schedule = Schedule((Partition("group", "t", "gt", "smem"), Partition("stream", "v", "sv", "smem")))
    view = cost_of(module.diagram("stats"), schedule).program.views[0]
    order = [(s.op, s.array) for s in view.steps if s.op in ("init", "final", "save")]
    for name in {a for _, a in order}:
        assert order.index(("init", name)) < order.index(("final", name)) < order.index(("save", name))
    gt, sv = sympy.symbols("gt sv", positive=True)
    assert sympy.expand(view.memory() - (gt * sv + 2 * gt)) == 0  # X chunk and two running states


def test_a_box_reading_an_output_uses_the_value_on_chip() -> None:
    module = loads("axis t, v\ndiagram f(X: [t v]) -> [t], [t] {\n  A = sum[v](X)\n  return A, A * 2\n}\n")
    schedule = Schedule((Partition("group", "t", "gt", "smem"), Partition("stream", "v", "sv", "smem", "sum")))
    view = cost_of(module.diagram("f"), schedule).program.views[0]
    assert [(s.op, s.array) for s in view.steps if s.array == "A"] == \
        [("init", "A"), ("compute", "A"), ("final", "A"), ("save", "A")]
    t, v = sympy.symbols("t v", positive=True)
    assert sympy.simplify(view.transfers() - (t * v + 2 * t)) == 0
    assert "mul(A, 2)" in render(cost_of(module.diagram("f"), schedule).program)


def test_multi_buffered_chunks_grow_memory_not_transfers() -> None:
    single, double = (cost(flash(), stages=n) for n in (1, 2))
    assert single.first.transfers == double.first.transfers
    # K and V chunks (2·sx·d) are held twice
    assert sympy.expand(double.first.memory - single.first.memory - 2 * sx * 64) == 0
    assert "V[sx 64]x2" in render(double.program)


def test_program_refuses_fewer_than_one_stage() -> None:
    module = loads(TEXT)
    nest = loop_nest(module.diagram("scaled_rows"), Schedule())
    t, e = sympy.symbols("t e", positive=True)
    with pytest.raises(ValueError, match="stages must be at least 1, got 0"):
        program(nest, {"t": t, "e": e}, {}, stages=0)


def test_live_sets_in_bytes_weigh_each_buffer_by_its_array() -> None:
    # Q in 1-byte values, everything else 4: a column's live bytes count Q's buffer once per
    # value and the others four times, and the view's memory is the largest such column
    co = cost(flash(), sizes={"q": 256, "x": 512})
    (view,) = co.program.views
    bytes_of = {name: 1 if name == "Q" else 4 for name in co.bytes_of}
    for s in view.steps:
        live = view.live(s.index)
        q_values = sum((b.size for b in live if b.array == "Q"), sympy.Integer(0))
        expected = 4 * view.live_size(s.index) - 3 * q_values
        assert sympy.expand(view.live_size(s.index, bytes_of) - expected) == 0
    uniform = {name: 4 for name in co.bytes_of}
    assert sympy.expand(view.memory(uniform) - 4 * view.memory()) == 0


def test_a_folded_operand_is_written_as_its_expression() -> None:
    """Regression: a box that reads no input (an index box, rsqrt of a size) gets no column, yet
    its consumer's line named it (`t.3 = mul(t.2, c)`, `t.2` defined nowhere)."""
    module = loads("axis q, x\naxis r = 8\n"
                   "diagram f(S: [q x], c: [], T: [r]) -> [q] {\n"
                   "  B = contract[r](onehot[r](index[q x](q - x)), T)\n"
                   "  return sum[x](S * exp(index[q x](q - x) * c) * rsqrt(r) + B)\n"
                   "}\n")
    schedule = Schedule((Partition("group", "q", "gq", "smem"), Partition("stream", "x", "sx", "smem", "sum")))
    text = render(cost_of(module.diagram("f"), schedule).program)
    assert "mul(index[q x](q - x), c)" in text and "rsqrt(r)" in text
    assert "onehot[r](index[q x](q - x))" in text
    defined = set(re.findall(r"(t\.\d+) = ", text))
    assert set(re.findall(r"\bt\.\d+\b", text)) <= defined  # every t.N read has a column
