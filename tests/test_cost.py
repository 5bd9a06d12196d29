"""The cost model: the paper's closed forms reproduced exactly, quantisation, multi-level,
lower bounds, baselines, time estimates, the CLI, and every theorem in proofs/."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

from napkin_cat import cli, proof
from napkin_cat.cost import cost, cost_of, hardware
from napkin_cat.cost.bounds import diagram_bound, lower_bounds
from napkin_cat.cost.optimise import M_BYTES, M, continuous, multilevel, piecewise, search
from napkin_cat.cost.roofline import timing
from napkin_cat.elaborate import loads
from napkin_cat.terms import Partition, Quantise, Schedule

ROOT = Path(__file__).resolve().parent.parent
a, b, c, q, x, d, gq, sx = sympy.symbols("a b c q x d gq sx", positive=True)

# Names deliberately unlike the paper's: the model must not recognise anything by name.
TEXT = """
axis i, j, k
axis q, x, d
diagram product(L: [i k], R: [k j]) -> [i j] {
  return contract[k](L, R)
}
diagram streamed(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = contract[d](Q, K)
  return ncontract[x; exp, exp, id](S, V)
}
diagram plain(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = contract[d](Q, K)
  P = softmax[x](S)
  return contract[x](P, V)
}
"""
MODULE = loads(TEXT)


def grid(*parts: tuple[str, str, str | int, str]) -> Schedule:
    return Schedule(tuple(Partition(kind, axis, tile, level) for kind, axis, tile, level in parts))


MATMUL = grid(("group", "i", "gi", "smem"), ("group", "j", "gj", "smem"), ("stream", "k", "sk", "smem"))
FLASH = grid(("group", "q", "gq", "smem"), ("stream", "x", "sx", "smem"))
i, j, k = sympy.symbols("i j k", positive=True)


def test_matmul_transfers_memory_flops() -> None:
    co = cost_of(MODULE.diagram("product"), MATMUL)
    gi, gj, sk = sympy.symbols("gi gj sk", positive=True)
    smem = co.level("smem")
    assert sympy.simplify(smem.transfers - (i * j * k / gj + i * j * k / gi + i * j)) == 0
    assert sympy.expand(smem.memory - (gi * gj + gi * sk + sk * gj)) == 0
    assert co.flops == 2 * i * j * k
    assert co.level("hbm").transfers == 0


def test_matmul_optimum_is_square_tiles_and_the_paper_closed_form() -> None:
    opt = continuous(cost_of(MODULE.diagram("product"), MATMUL))
    assert opt is not None
    assert opt.tiles == {"gi": sympy.sqrt(M), "gj": sympy.sqrt(M)}
    assert sympy.Eq(opt.transfers, 2 * i * j * k * M ** sympy.Rational(-1, 2) + i * j).simplify() is sympy.true
    assert opt.beta == sympy.Rational(1, 2)


def test_padded_schedules_have_the_continuous_optimum_of_the_unpadded_one() -> None:
    """Regression: trips ceil(size / tile) made sympy give up ("no closed form") on every
    schedule with `pad`; the relaxation to real tiles is size / tile, as without padding."""
    padded = Schedule(tuple(Partition(p.kind, p.axis, p.tile, p.level, pad=True) for p in MATMUL.partitions))
    co = cost_of(MODULE.diagram("product"), padded)
    assert co.level("smem").transfers.has(sympy.ceiling)
    opt, plain = continuous(co), continuous(cost_of(MODULE.diagram("product"), MATMUL))
    assert opt is not None and plain is not None
    assert opt.tiles == plain.tiles and sympy.simplify(opt.transfers - plain.transfers) == 0


def test_an_optimum_with_several_peak_columns() -> None:
    """Regression: the memory Max was divided by the bytes per value before its columns were
    read (a product, not a Max), so any schedule whose peak column depends on the tiles had
    "no closed form"; here the output tile's column is active only for M >= 12288 values."""
    module = loads("""
axis t, s
axis d = 64
diagram cosine(X: [t d], Y: [s d]) -> [t s] {
  return contract[d](l2norm[d](X), l2norm[d](Y))
}
""")
    co = cost_of(module.diagram("cosine"), grid(("group", "t", "gt", "smem"), ("group", "s", "gs", "smem")))
    assert isinstance(co.first.memory, sympy.Max)
    opt = continuous(co)
    assert opt is not None and opt.beta == sympy.Rational(1, 2)
    tile = sympy.sqrt(M + 4096) - 64  # (g + 64)^2 - 4096 = M: the output tile and both rows
    assert all(sympy.simplify(v - tile) == 0 for v in opt.tiles.values())


def test_attention_transfers_and_memory_match_the_reconstruction() -> None:
    co = cost_of(MODULE.diagram("streamed"), FLASH, accumulators={"ncontract:('x',):('exp', 'exp', 'id')":
                                                                  "online_softmax"})
    smem = co.level("smem")
    assert sympy.simplify(smem.transfers - (2 * q * d + 2 * q * x * d / gq)) == 0
    # Q tile, (m, l, o) state, K and V chunks, one score chunk: gq(2d + sx + 2) + 2 sx d
    assert sympy.expand(smem.memory - (gq * (2 * d + sx + 2) + 2 * sx * d)) == 0
    assert sympy.expand(co.flops - 4 * q * x * d) == 0
    opt = continuous(co)
    assert opt is not None and opt.beta == 1
    assert sympy.simplify(opt.transfers - (2 * q * d + 2 * q * x * d * (2 * d + 2) / M)) == 0


def leading(expr: sympy.Expr) -> sympy.Expr:
    """The coefficient times power of the M_bytes-dependent term with the largest exponent."""
    terms = [t for t in sympy.Add.make_args(sympy.expand(expr)) if t.has(M_BYTES)]
    return max(terms, key=lambda t: -t.as_coeff_exponent(M_BYTES)[1])


@pytest.mark.parametrize(("diagram", "schedule", "ratio"), [("streamed", FLASH, 4), ("product", MATMUL, 2 ** 1.5)])
def test_quantisation_law_fp16_to_fp8(diagram: str, schedule: Schedule, ratio: float) -> None:
    wide = continuous(cost_of(MODULE.diagram(diagram), schedule, dtype="fp16"))
    narrow = continuous(cost_of(MODULE.diagram(diagram), schedule, dtype="fp8_e4m3"))
    assert wide is not None and narrow is not None
    assert sympy.simplify(leading(wide.in_bytes()) / leading(narrow.in_bytes()) - sympy.nsimplify(ratio)) == 0


def test_multilevel_model_is_the_bandwidth_weighted_sum() -> None:
    nested = grid(("group", "i", "gi", "smem"), ("group", "j", "gj", "smem"), ("stream", "k", "sk", "smem"),
                  ("group", "i", "ri", "reg"), ("group", "j", "rj", "reg"), ("stream", "k", "rk", "reg"))
    co = cost_of(MODULE.diagram("product"), nested, hardware="h100")
    result = multilevel(co)
    assert result is not None
    optima, total = result
    assert set(optima) == {"smem", "reg"}
    prof = hardware.load("h100")
    inverse = {"smem": 2 / sympy.nsimplify(prof.level("hbm").bandwidth),
               "reg": 2 / sympy.nsimplify(prof.level("smem").bandwidth)}
    terms = {(2 * i * j * k, sympy.Rational(1, 2)), (i * j, 0)}
    expected = sum(alpha * sum(inverse[lv] * sympy.Symbol(f"M_{lv}", positive=True) ** -beta for lv in inverse)
                   for alpha, beta in terms)
    assert sympy.simplify(total - expected) == 0


def test_arrays_lacking_a_grouped_axis_are_reloaded_by_every_group() -> None:
    co = cost_of(MODULE.diagram("product"), grid(("group", "i", "gi", "smem")))
    gi = sympy.Symbol("gi", positive=True)
    # L is loaded once, R (no i) once per i-group, the result saved once
    assert sympy.simplify(co.level("smem").transfers - (i * k + k * j * i / gi + i * j)) == 0
    assert "re-loaded by every group" in co.convention


def test_lower_bounds_are_recognised_by_structure() -> None:
    for name, kind, expr in (("product", "matmul", 2 * i * j * k / sympy.sqrt(M)),
                             ("streamed", "attention", q * x * d ** 2 / M),
                             ("plain", "attention", q * x * d ** 2 / M)):
        co = cost_of(MODULE.diagram(name), Schedule())
        bound = diagram_bound(lower_bounds(co.program.nest.flat, co.sizes, M))
        assert bound.kind == kind and sympy.simplify(bound.expr - expr) == 0
    opt = continuous(cost_of(MODULE.diagram("product"), MATMUL))
    assert opt is not None
    ratio = sympy.simplify(opt.transfers / (2 * i * j * k / sympy.sqrt(M)))
    assert sympy.simplify(ratio - (1 + sympy.sqrt(M) / (2 * k))) == 0


#: diagrams whose contractions look like matmul or attention but break the bound's assumptions
UNBOUNDED = loads("""
axis q, x, t, f
axis d = 32
axis e = 64
diagram distance_scores(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = neg(sum[d](square(Q - K)))
  return contract[x](softmax[x](S), V)
}
diagram unnormalised(Q: [q d], K: [x d], V: [x e]) -> [q e] {
  return contract[x](contract[d](Q, K), V)
}
diagram window(Q: [q d], K: [x d], V: [x d]) -> [q d] {
  S = where[q x](q - x < 8 and x - q < 8, contract[d](Q, K), -inf)
  return contract[x](softmax[x](S), V)
}
diagram hidden(X: [t d], W1: [d f], W2: [f d]) -> [t d] {
  return contract[f](relu(contract[d](X, W1)), W2)
}
""")


@pytest.mark.parametrize("name", ["distance_scores", "unnormalised", "window", "hidden"])
def test_no_structural_bound_where_its_assumptions_fail(name: str) -> None:
    """Regression: a contraction of computed operands (scores contracted again, a broadcast
    difference), one whose result is consumed on chip, or scores behind a sliding-window mask
    got the matmul or attention bound, which schedules beat (H*/bound < 1 was printed)."""
    co = cost_of(UNBOUNDED.diagram(name), Schedule())
    assert diagram_bound(lower_bounds(co.program.nest.flat, co.sizes, M)).kind == "compulsory"


def test_matmul_bound_holds_through_elementwise_prologue_and_epilogue() -> None:
    module = loads("""
axis t, f, d
diagram scaled(X: [t d], G: [d], W: [d f], B: [f]) -> [t f] {
  return gelu(contract[d](X * G, W) + B)
}
""")
    co = cost_of(module.diagram("scaled"), Schedule())
    bound = diagram_bound(lower_bounds(co.program.nest.flat, co.sizes, M))
    t_, f_, d_ = sympy.symbols("t f d", positive=True)
    assert bound.kind == "matmul" and sympy.simplify(bound.expr - 2 * t_ * f_ * d_ / sympy.sqrt(M)) == 0


def test_unfused_attention_baseline_versus_flash() -> None:
    thm = proof.theorem(ROOT / "proofs" / "flash_attention.ncd", "flash_attention")
    symbolic = cost(thm)
    d64 = 64
    # the source diagram, every box its own kernel: Q K^T, the scale, softmax, P V
    assert sympy.expand(symbolic.baseline.transfers - (2 * q * d64 + 2 * x * d64 + 6 * q * x)) == 0
    co = cost(thm, hardware="h100", sizes={"q": 8192, "x": 8192})
    # the configuration that moves least (the best for one head trades traffic for programs)
    least = min(search(co, top=100).rows, key=lambda r: r.transfers["smem"])
    assert least.transfers["smem"] * 10 < float(co.baseline.transfers_bytes)
    t = timing(co, least.tiles)
    assert float(t.serial) >= float(t.overlapped) > 0
    # with the L2 serving K's and V's reloads, hbm serves each byte once: FlashAttention at long
    # sequences is far past hbm's ridge (its bound, if any transfer, is the L2's)
    assert float(t.intensity) > 10 * t.ridge


def test_padded_tiles_round_trips_up_and_dtypes_override() -> None:
    co = cost_of(MODULE.diagram("product"), Schedule((Partition("group", "i", 48, "smem", pad=True),)),
                 sizes={"i": 100, "j": 8, "k": 8}, dtypes={"L": "f32"})
    assert co.flops == 3 * 48 * 2 * 8 * 8  # three padded tiles of 48 rows
    assert co.bytes_of["L"] == 4 and co.bytes_of["R"] == 2
    with pytest.raises(ValueError, match="do not exist"):
        cost_of(MODULE.diagram("product"), MATMUL, dtypes={"nope": "f32"})
    with pytest.raises(ValueError, match="does not use"):
        cost_of(MODULE.diagram("product"), MATMUL, sizes={"zz": 4})
    fixed = loads("axis n = 8\ndiagram twice(X: [n]) -> [n] {\n  return X + X\n}\n")
    with pytest.raises(ValueError, match=r"contradict declared sizes: n=9 \(declared 8\)"):
        cost_of(fixed.diagram("twice"), Schedule(), sizes={"n": 9})


def test_a_level_the_hardware_lacks_is_refused() -> None:
    with pytest.raises(hardware.HardwareError, match="no memory level `l2`"):
        cost_of(MODULE.diagram("product"), grid(("group", "i", "gi", "l2")), hardware="a100")


# β of the leading term of each theorem's optimum, with the reason (paper §4.1).
BETA = {
    "streamed_cross_entropy": 0,  # every array is read once whatever gt is
    "streamed_cross_entropy_index": 0,
    "fused_linear_cross_entropy": 1,  # one tile axis (t): W re-broadcast to every token tile
    "flash_attention": 1,  # K and V re-broadcast to every query tile
    "flash_attention_causal": 1,
    "flash_attention_two_level": 1,
    "flash_mha": 0,  # all tiles fixed integers: nothing to optimise
    "flash_gqa": 1,
    "tiled_matmul": sympy.Rational(1, 2),  # square tiles
    "tiled_matmul_padded": 0,
    "fused_linear": sympy.Rational(1, 2),
    "fused_mlp_first_layer": 1,  # one tile axis: W1, W2 re-broadcast to every token tile
    "flash_sign": 1,
    "flash_rms_attention": 1,
}


#: masks whose ranges a constant bounds (the prefix, the sinks: ``floor(47/sx)`` chunks): the
#: count stays piecewise in the tiles with every size given, so no continuous optimum (the
#: report lists the best integer tiles instead)
PIECEWISE_IN_TILES = {"flash_attention_prefix_lm", "flash_attention_sink_window"}

#: a data mask's block mask (``schedule.program.BlockMask``) moves a few integers per (program,
#: chunk) pair, q·x/(gq·sx): H falls with the chunk tile as well, and its Lagrange conditions
#: have no closed form (the report lists the best integer tiles instead)
BLOCK_MASKED = {"flash_document_attention", "flash_causal_document_attention", "flash_padded_attention"}


def all_theorems() -> list[proof.CheckResult]:
    return [r for p in sorted((ROOT / "proofs").glob("*.ncd")) for r in proof.check_file(p)]


def test_every_theorem_named_in_the_beta_table_is_in_proofs() -> None:
    assert set(BETA) <= {r.name for r in all_theorems()}


@pytest.mark.parametrize("path", sorted((ROOT / "proofs").glob("*.ncd")), ids=lambda p: p.stem)
def test_every_theorem_in_proofs_has_a_cost_and_its_beta(path: Path) -> None:
    """β per theorem from the table; a theorem added later must at least have a paper-shaped β.
    One case per proof file: the files' theorems are spread over the workers (``pytest -n``)."""
    for r in proof.check_file(path):
        assert r.theorem is not None, r.summary()
        co = cost(r.theorem)
        assert co.flops.free_symbols <= set(co.symbols().values())
        if co.program.masked and piecewise(co.first.transfers):
            # a masked stream clips where one symbolic size passes another: no Lagrange
            # optimum until the sizes are given (here all equal)
            assert continuous(co) is None, r.name
            co = cost(r.theorem, sizes={a: 1 << 14 for a, s in co.sizes.items() if isinstance(s, sympy.Symbol)})
            if r.name in PIECEWISE_IN_TILES:
                assert piecewise(co.first.transfers) and continuous(co) is None, r.name
                continue
        if r.name in BLOCK_MASKED:
            assert co.program.block_mask is not None and continuous(co) is None, r.name
            continue
        opt = continuous(co)
        assert opt is not None, r.name
        assert opt.beta == BETA.get(r.name, opt.beta), (r.name, opt.transfers)
        assert opt.beta in (0, sympy.Rational(1, 2), 1), (r.name, opt.transfers)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_json_is_sympy_parsable(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "cost", str(ROOT / "proofs" / "matmul.ncd"), "tiled_matmul", "--json")
    assert rc == 0
    data = json.loads(out)
    names = {"a": a, "b": b, "c": c, "M": M}
    assert sympy.sympify(data["flops"], locals=names) == 2 * a * b * c
    assert [lv["name"] for lv in data["levels"]] == ["hbm", "smem"]
    for lv in data["levels"]:
        sympy.sympify(lv["transfers"]), sympy.sympify(lv["memory"])
    assert sympy.simplify(sympy.sympify(data["optimum"]["transfers"], locals=names)
                          - (2 * a * b * c / sympy.sqrt(M) + a * c)) == 0
    assert sympy.sympify(data["lower_bound"]["expr"], locals=names) == 2 * a * b * c / sympy.sqrt(M)


def test_cli_numeric_table(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "cost", str(ROOT / "proofs" / "flash_attention.ncd"), "flash_attention",
                     "--hardware", "h200", "--size", "q=4096", "--size", "x=4096", "--json")
    assert rc == 0
    data = json.loads(out)
    assert isinstance(data["optimum"]["transfers"], float)
    assert data["configurations"] and data["time"]["serial_s"] >= data["time"]["overlapped_s"]
    rc, out, _ = run(capsys, "cost", str(ROOT / "proofs" / "flash_attention.ncd"), "flash_attention",
                     "--size", "q=4096", "--size", "x=4096")
    assert rc == 0 and "configurations" in out and "serial (sum)" in out and "overlapped (max)" in out


@pytest.mark.parametrize(("extra", "message"), [(("nope",), "no theorem `nope`"),
                                                (("flash_attention", "--hardware", "tpu"), "no hardware profile"),
                                                (("flash_attention", "--dtype", "int3"), "unknown dtype")])
def test_cli_usage_errors(capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], message: str) -> None:
    rc, _, err = run(capsys, "cost", str(ROOT / "proofs" / "flash_attention.ncd"), *extra)
    assert rc == 2 and message in err


def test_one_tile_per_axis_costs_the_compulsory_traffic_on_generated_schedules() -> None:
    """Generic invariant over schedules not in the repo: every single group or stream step the
    kernel accepts on an example diagram, with each tile as large as its axis, moves every
    input and output exactly once and does the unscheduled diagram's FLOPs."""
    accepted = 0
    for example in sorted((ROOT / "examples").glob("*.ncd")):
        module = loads(example.read_text(), path=str(example))
        lines = [f'use "../examples/{example.name}"']
        for diagram in module.diagrams[:3]:  # a sample per file keeps the test fast
            for axis in (ax.name for ax in diagram.axes if ax.size is None):
                lines += [f"theorem g_{diagram.name}_{kind}_{axis}: {diagram.name} {{ {kind} {axis} by t_{axis} }}"
                          for kind in ("group", "stream")]
        for result in proof.check_module(loads("\n".join(lines), path=str(ROOT / "proofs" / "generated.ncd"))):
            if result.theorem is None:
                continue  # refused by the kernel (e.g. streaming a mixed axis): nothing to cost
            accepted += 1
            co = cost(result.theorem)
            whole = {co.tiles[lp.tile]: co.sizes[lp.axis] for lp in co.program.nest.loops}
            compulsory = lower_bounds(co.program.nest.flat, co.sizes, M)[-1].expr
            assert sympy.simplify(co.first.transfers.subs(whole) - compulsory) == 0, result.name
            unscheduled = cost_of(result.theorem.result, Schedule()).flops
            assert sympy.simplify(co.flops.subs(whole) - unscheduled) == 0, result.name
    assert accepted >= 20


def test_integer_search_respects_capacity_and_divisibility() -> None:
    thm = proof.theorem(ROOT / "proofs" / "flash_attention.ncd", "flash_attention")
    with pytest.raises(ValueError, match="give q, x"):
        search(cost(thm))
    co = cost(thm, hardware="a100", sizes={"q": 4096, "x": 4096})
    table = search(co, top=20)
    assert table.rows and table.considered >= len(table.rows)
    capacity = hardware.load("a100").level("smem").capacity
    times = [row.seconds for row in table.rows]
    assert times == sorted(times)
    for row in table.rows:  # the profile's launch rule: loaded blocks in shared memory, computed tiles in registers
        assert row.launch is not None and row.launch.fits and row.launch.smem_bytes <= capacity
        for tile in row.tiles.values():
            assert tile & (tile - 1) == 0 and tile >= 16  # Triton powers of two, tl.dot >= 16
        assert row.tiles["gq"] % 16 == 0  # Ampere mma m = 16 for the query rows
        exact = co.at(co.first.transfers_bytes, row.tiles)
        assert float(exact) == pytest.approx(row.transfers["smem"])
    assert any("tensor-core m" in cause for cause in table.constraints["gq"])
    thinned = search(co, limit=4)
    assert thinned.rows and thinned.considered <= 4


ROWS = loads("""
axis t, v
axis d = 48
diagram scaled_rows(X: [t v], L: [t]) -> [t] {
  return sum[v](X) * L
}
diagram mse(P: [t d], Y: [t d]) -> [] {
  return mean[t](sum[d](square(P - Y)))
}
""")


def test_preferred_multiples_are_dropped_when_nothing_meets_them() -> None:
    """Regression: coalescing L (a 1-D [t] input) asked for row tiles of 64, which with a
    whole 32768-wide row cannot fit: "none feasible", and lower fell back to 64 rows. Only the
    backend's requirements are hard; the dropped preferences are reported."""
    co = cost_of(ROWS.diagram("scaled_rows"), grid(("group", "t", "gt", "smem")), hardware="h100",
                 sizes={"t": 4096, "v": 32768})
    assert not search(co).rows  # the schedule search does not price the preferences
    table = search(co, relax=True)
    assert table.rows and table.rows[0].tiles["gt"] < 64
    assert "gt: x64 (128-byte coalescing of L)" in table.relaxed
    assert all(r.memory["smem"] <= hardware.load("h100").level("smem").capacity for r in table.rows)
    roomy = search(cost_of(ROWS.diagram("scaled_rows"), grid(("group", "t", "gt", "smem")), hardware="h100",
                           sizes={"t": 4096, "v": 256}), relax=True)
    assert roomy.relaxed == () and all(r.tiles["gt"] % 64 == 0 for r in roomy.rows)


def test_stream_chunks_are_at_least_the_triton_block() -> None:
    """Regression: with no dot on the streamed axis, the search offered chunks of 1..8 that
    the Pallas lowering refuses (a stream chunk is an unpadded block of at least 16)."""
    co = cost_of(ROWS.diagram("mse"), grid(("stream", "t", "st", "smem")), hardware="h100", sizes={"t": 4096})
    table = search(co, top=50)
    assert table.rows and min(r.tiles["st"] for r in table.rows) == 16


def test_report_says_which_woven_axes_a_pallas_kernel_puts_on_its_grid() -> None:
    """Regression: mha proved with only `group q` was costed with b and h whole in every group
    ("none feasible") while the kernel napkin lowers runs one (b, h) per program; unexplained."""
    from napkin_cat.cost.report import format_report, report

    module = loads("""
axis b, h, q, x
axis d = 64
diagram heads(Q: [b h q d], K: [b h x d], V: [b h x d]) -> [b h q d] {
  return contract[x](softmax[x](contract[d](Q, K)), V)
}
theorem rows: heads {
  group q by gq
}
""")
    thm = next(r.theorem for r in proof.check_module(module))
    data = report(cost(thm), "rows")
    assert data["pallas_grid"]["axes"] == ["b", "h"]
    assert "`group b by 1`; `group h by 1`" in format_report(data)
    assert "pallas_grid" not in report(cost(proof.theorem(ROOT / "proofs" / "flash_attention.ncd", "flash_mha")),
                                       "flash_mha")


def test_time_estimate_combines_flops_and_transfers() -> None:
    thm = proof.theorem(ROOT / "proofs" / "matmul.ncd", "tiled_matmul")
    co = cost(thm, hardware="h100", sizes={"a": 1024, "b": 1024, "c": 1024})
    tiles = {"ga": 128, "gc": 128, "sb": 64}
    t = timing(co, tiles)
    prof = hardware.load("h100")
    # the contraction on tensor cores; its sum over chunks is the MMA's accumulate (no fold)
    assert co.contract_flops == co.flops == 2 * 1024 ** 3 and co.fold_flops == 0
    flop_time = 2 * 1024 ** 3 / prof.peak_flops("bf16")
    moved = float(co.at(co.first.transfers_bytes, tiles))
    once = 3 * 1024 ** 2 * 2  # A and B read, C written, once each from hbm: the re-reads hit the L2
    hbm, l2 = once / prof.level("hbm").bandwidth, moved / prof.level("l2").bandwidth  # type: ignore[operator]
    assert t.flop_time == pytest.approx(flop_time)
    assert dict(t.transfer_times) == pytest.approx({"smem": hbm, "l2": l2})
    assert t.serial == pytest.approx(flop_time + max(hbm, l2))  # the way through the L2 counted once
    assert t.overlapped == pytest.approx(max(flop_time, hbm, l2))
    assert t.intensity == pytest.approx(2 * 1024 ** 3 / once)  # FLOPs per byte hbm serves
    assert t.ridge == pytest.approx(prof.ridge("bf16"))
    # the epilogue's bias add runs on the CUDA cores, at the f32 peak
    linear = cost(proof.theorem(ROOT / "proofs" / "mlp.ncd", "fused_linear"), hardware="h100",
                  sizes={"t": 1024, "d": 1024, "f": 1024})
    assert linear.flops - linear.contract_flops == 1024 ** 2 and linear.fold_flops == 0
    assert timing(linear, {"gt": 128, "gf": 128, "sd": 64}).flop_time == pytest.approx(
        2 * 1024 ** 3 / prof.peak_flops("bf16") + 1024 ** 2 / prof.peak_flops("f32"))


@pytest.mark.parametrize("name", ["flash_sign", "flash_rms_attention"])
def test_the_float_safe_state_is_priced(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A streamed l2/rms contraction folds the kernels' float-safe state (``accumulators.float_safe``):
    beside the proved plan's fold it pays |s|, its running max and s·(1/k), 3 FLOPs per score, and
    per row and chunk its scales (the rescaling per state entry replaces the proved merge's add)."""
    import napkin_cat.cost as cost_module

    thm = proof.theorem(ROOT / "proofs" / "spherical_attention.ncd", name)
    safe = cost(thm)
    folded = safe.fold_flops
    cost_module._plans.cache_clear()
    monkeypatch.setattr(cost_module, "float_safe", lambda plan: plan)  # priced as the proved plan
    try:
        proved = cost(thm).fold_flops
    finally:
        cost_module._plans.cache_clear()
    q, x, sx, d = safe.sizes["q"], safe.sizes["x"], safe.tiles["sx"], safe.sizes["d"]
    assert sympy.simplify(proved - q * x * (d + 1) / sx) == 0  # o1 + o2, z1 + z2 per row and chunk
    extra = sympy.expand(folded - proved)
    per_chunk = sympy.simplify((extra - 3 * q * x) * sx / (q * x))  # per row and chunk, beyond 3 per score
    assert per_chunk.is_number and 0 < per_chunk < 32, per_chunk


def test_a_stream_via_an_accumulator_a_box_cannot_use_prices_its_own() -> None:
    """A ``via logsumexp`` stream's contraction is summed (the layout's rule): its state is priced
    as the sum's one value per row, not as logsumexp's (m, l), and its plan can be built."""
    from napkin_cat.ops import typed_box
    from napkin_cat.schedule.build import chosen_accumulator
    from napkin_cat.terms import Var

    dot = typed_box("contract", (Var("Z", ("t", "v")), Var("W", ("v",))), ("v",))
    assert chosen_accumulator(dot, None, "logsumexp") == "sum"
    assert chosen_accumulator(typed_box("logsumexp", (Var("Z", ("t", "v")),), ("v",)), None, "logsumexp") == "logsumexp"


@given(st.integers(4, 9), st.integers(4, 9), st.integers(4, 9), st.integers(10, 13))
def test_derived_transfers_never_beat_the_lower_bound(log_gi: int, log_gj: int, log_sk: int, log_n: int) -> None:
    """At any tiles, the derived H is at least the known bound at the memory those tiles use."""
    n = 2 ** log_n
    tiles = {"gi": 2 ** log_gi, "gj": 2 ** log_gj, "sk": 2 ** log_sk, "gq": 2 ** log_gi, "sx": 2 ** log_sk}
    for name, schedule, sizes in (("product", MATMUL, {"i": n, "j": n, "k": n}),
                                  ("streamed", FLASH, {"q": n, "x": n, "d": 2 ** log_gj})):
        co = cost_of(MODULE.diagram(name), schedule, sizes=sizes)
        bound = diagram_bound(lower_bounds(co.program.nest.flat, co.sizes, M)).expr
        memory = co.at(co.first.memory, tiles)
        assert float(co.at(co.first.transfers, tiles)) >= float(bound.subs(M, memory))


def test_readme_cost_examples_are_current(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the README's commands run from the repository root
    readme = (ROOT / "README.md").read_text()
    examples = re.findall(r"```sh\n\.venv/bin/napkin (cost [^\n]+)\n```\n```text\n(.*?)```", readme, flags=re.S)
    assert len(examples) >= 2
    for command, shown in examples:
        rc, out, _ = run(capsys, *command.split())
        assert rc == 0
        for line in shown.splitlines():
            if line.strip() != "...":
                assert line.strip() in out, line


def test_dtype_steps_of_the_schedule_weight_the_bytes() -> None:
    quantised = Schedule(FLASH.partitions, quantisations=(Quantise(("K", "V"), "fp8e4m3", 0.2),))
    co = cost_of(MODULE.diagram("streamed"), quantised, dtype="bf16")
    smem = co.level("smem")
    assert sympy.simplify(smem.transfers_bytes - (2 * 2 * q * d + 2 * q * x * d / gq)) == 0


@pytest.mark.parametrize(("path", "name", "ratio"), [("flash_attention.ncd", "flash_attention", 4),
                                                     ("matmul.ncd", "tiled_matmul", 2 ** 1.5)])
def test_quantisation_law_on_the_proved_theorems(path: str, name: str, ratio: float) -> None:
    thm = proof.theorem(ROOT / "proofs" / path, name)
    wide, narrow = continuous(cost(thm, dtype="f16")), continuous(cost(thm, dtype="fp8e4m3"))
    assert wide is not None and narrow is not None
    assert sympy.simplify(leading(wide.in_bytes()) / leading(narrow.in_bytes()) - sympy.nsimplify(ratio)) == 0


def test_a_whole_axis_tile_is_a_candidate_when_no_power_of_two_divides() -> None:
    """Regression: grouping a value dimension e=48 (coalescing wants x64, Triton powers of two)
    had no configuration at all, so `derive` found nothing for attention with e != d."""
    module = loads("axis q, x\naxis d = 64\naxis e = 48\n"
                   "diagram vdim(Q: [q d], K: [x d], V: [x e]) -> [q e] {\n"
                   "  return ncontract[x; exp, exp, id](contract[d](Q, K), V)\n}\n")
    sched = grid(("group", "q", "gq", "smem"), ("group", "e", "ge", "smem"), ("stream", "x", "sx", "smem"))
    co = cost_of(module.diagram("vdim"), sched, sizes={"q": 4096, "x": 4096})
    table = search(co)
    assert table.rows and {row.tiles["ge"] for row in table.rows} == {48}


def test_a_padded_axis_gets_a_power_of_two_tile_that_covers_it() -> None:
    """Regression: `stream k by sk pad` with k=41 had only the raw 41 (or nothing) as a candidate,
    a stream block the Pallas Triton lowering refuses; one padded block of 64 is legal."""
    sched = Schedule((Partition("group", "i", "gi", "smem", pad=True), Partition("group", "j", "gj", "smem", pad=True),
                      Partition("stream", "k", "sk", "smem", pad=True)))
    co = cost_of(MODULE.diagram("product"), sched, sizes={"i": 100, "j": 77, "k": 41})
    rows = search(co, top=50).rows
    assert rows and all(t & (t - 1) == 0 for row in rows for t in row.tiles.values())
    assert {row.tiles["sk"] for row in rows} == {64} and 128 in {row.tiles["gj"] for row in rows}


def test_a_stationary_point_below_one_position_is_no_optimum() -> None:
    """Regression: a weight matrix that stays whole in every group (here [k j] with k = j = 512,
    256 KiB in f16, over the 227 KiB of SMEM) left the Lagrange tile at M = capacity negative
    (gi = -142.5), and the report printed it with an H* below the compulsory traffic."""
    from napkin_cat.cost.report import format_report, report

    sizes = {"i": 4096, "j": 512, "k": 512}
    co = cost_of(MODULE.diagram("product"), grid(("group", "i", "gi", "smem")), sizes=sizes, dtype="f16")
    assert continuous(co) is not None  # valid for M large: gi = (M - j*k) / (j + k)
    data = report(co, "whole_weight")
    assert data["optimum"] is None and "lower_bound" in data and "ratio" not in data["lower_bound"]
    text = format_report(data)
    assert "no interior optimum" in text and "gi = -142.5 (the axis is 4096)" in text and "H*" not in text


def test_a_structural_bound_below_the_compulsory_traffic_gives_way_to_it() -> None:
    """Regression: decoding attention (two query rows against 4096 keys) reported the attention
    bound N_q·N_x·d²/M = 2.3e2 values as its lower bound, though every key and value must be read
    once (the compulsory traffic, 5.2e5); and its Lagrange tile gq = 5.8e4 was
    longer than q = 2, giving an H* below the compulsory traffic."""
    from napkin_cat.cost.report import report

    co = cost_of(MODULE.diagram("streamed"), FLASH, sizes={"q": 2, "x": 4096, "d": 64}, dtype="f16")
    bounds = lower_bounds(co.program.nest.flat, co.sizes, M)
    assert diagram_bound(bounds).kind == "attention"  # symbolic: the structural bound
    data = report(co, "decode")
    compulsory = 2 * 64 + 2 * 4096 * 64 + 2 * 64
    assert data["lower_bound"]["kind"] == "compulsory" and data["lower_bound"]["value"] == compulsory
    assert "larger here than the attention bound" in data["lower_bound"]["source"]
    assert data["optimum"] is None and "(the axis is 2)" in data["optimum_note"]
    assert data["configurations"]  # the integer tiles are still searched


def test_at_given_sizes_the_notes_say_what_the_tiles_need() -> None:
    """Regression: with every size given, a causal mask's piecewise count still said "give every
    size with --size", and an empty configuration table did not say that unpadded tiles must
    divide q = 300 (no power of two from 16 up does)."""
    from napkin_cat.cost.report import format_report, report

    causal = loads("axis q, x, d\ndiagram c(Q: [q d], K: [x d], V: [x d]) -> [q d] {\n"
                   "  S = where[q x](q >= x, contract[d](Q, K), -inf)\n"
                   "  return ncontract[x; exp, exp, id](S, V)\n}\n").diagram("c")
    data = report(cost_of(causal, FLASH, sizes={"q": 300, "x": 5000, "d": 64}), "causal")
    assert data["optimum"] is None and "--size" not in data["optimum_note"]
    assert "piecewise in the tiles" in data["optimum_note"]
    assert data["configurations"] == []
    assert "without `pad` a tile must divide its axis (gq | q=300, sx | x=5000)" in data["configurations_note"]
    assert data["configurations_note"] in format_report(data)
