"""Elaboration: typing and weaving rules, and every error with its code, location and message.

Each bad input must give exactly the diagnostics listed (no cascades from one mistake), and
every error of a file must be reported in one run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from napkin_cat.diagnostics import MESSAGES, NapkinError, render
from napkin_cat.elaborate import load, loads
from napkin_cat.terms import Apply, Box, Const, Size, Var

HEAD = "axis i, j\naxis n = 4\n"


def errors(text: str) -> list[tuple[str, int, int, str, str | None]]:
    """(code, line, col, message, hint) of every diagnostic ``loads`` raises for ``text``."""
    with pytest.raises(NapkinError) as info:
        loads(text, "t.ncd")
    out = []
    for d in info.value.diagnostics:
        assert d.span is not None and d.span.file == "t.ncd", d
        out.append((d.code, d.span.line, d.span.col, d.message, d.hint))
    return out


def one_error(text: str) -> tuple[str, int, int, str, str | None]:
    found = errors(text)
    assert len(found) == 1, found
    return found[0]


# ---- well-typed programs -----------------------------------------------------------------

def test_types_are_inferred_and_boxes_weave_unnamed_axes() -> None:
    m = loads(HEAD + "diagram f(X: [i j], Y: [j n]) -> [i n], [j] {\n"
                     "  S = softmax[j](X) * rsqrt(n)\n"
                     "  T = contract[j](S, Y)\n"
                     "  return T, sum[i](X) - 1\n}\n")
    f = m.diagram("f")
    assert [(p.name, p.axes) for p in f.inputs] == [("X", ("i", "j")), ("Y", ("j", "n"))]
    assert f.out_types == (("i", "n"), ("j",))
    s = f.binding("S").expr
    assert isinstance(s, Box) and s.op == "mul" and s.axes == ("i", "j")
    assert isinstance(s.args[1], Box) and s.args[1].args == (Size("n"),)
    assert f.binding("T").expr.axes == ("i", "n")
    assert f.outputs[0] == Var("T", ("i", "n"))
    assert [a.name for a in f.axes] == ["i", "j", "n"] and f.axis_sizes()["n"] == 4


def test_a_diagram_call_is_woven_over_the_extra_axes_of_its_arguments() -> None:
    m = loads(HEAD + "axis b\n"
                     "diagram f(X: [j], W: [j]) -> [j], [] { return X * W, sum[j](X) }\n"
                     "diagram g(X: [b i j], W: [i j]) -> [b i j], [b i] {\n  A, B = f(X, W)\n  return A, B\n}\n")
    call = m.diagram("g").binding("A").expr
    assert isinstance(call, Apply)
    assert call.woven == ("b", "i") and call.types == (("b", "i", "j"), ("b", "i"))


def test_negative_constants_fold_and_the_module_records_uses_and_scope(tmp_path: Path) -> None:
    (tmp_path / "lib.ncd").write_text("axis i\ndiagram id(X: [i]) -> [i] { return X }\n")
    main = tmp_path / "main.ncd"
    main.write_text('use "lib.ncd"\ndiagram g(X: [i]) -> [i] { return id(X) * -2 }\n')
    m = load(main)
    assert m.uses == ("lib.ncd",) and [d.name for d in m.diagrams] == ["g"]
    assert {d.name for d in m.scope_diagrams} == {"id", "g"} and m.diagram("id").name == "id"
    assert m.diagram("g").outputs[0].args[1] == Const(-2.0)  # type: ignore[union-attr]


# ---- every error: code, location, message --------------------------------------------------

CASES = [
    # unknown names, with "did you mean"
    (HEAD + "diagram f(X: [i]) -> [i] { return exp(Xs) }\n", "name.unknown", 3, 39,
     "unknown name `Xs`", "did you mean `X`?"),
    (HEAD + "diagram f(X: [i]) -> [i] { return sofmax[i](X) }\n", "box.unknown", 3, 35,
     "unknown box `sofmax`", "did you mean `softmax`?"),
    (HEAD + "diagram f(X: [k]) -> [i] { return X }\n", "axis.not_declared", 3, 15, "unknown axis `k`", None),
    (HEAD + "diagram f(X: [i]) -> [] { return sum[jj](X) }\n", "axis.not_declared", 3, 37,
     "unknown axis `jj`", "did you mean `j`?"),
    (HEAD + "theorem t: nope { group i by 4 }\n", "name.unknown", 3, 12, "unknown diagram `nope`", None),
    # size clashes, duplicates, reserved names
    ("axis i = 3\naxis i = 4\n", "axis.size_clash", 2, 6,
     "axis `i` is declared with size 4 here but 3 at t.ncd:1:6", None),
    ("axis i\naxis i\n", "name.duplicate", 2, 6, "duplicate definition of axis `i` (first defined at t.ncd:1:6)",
     None),
    (HEAD + "diagram f(X: [i]) -> [i] { return X }\ndiagram f(X: [i]) -> [i] { return X }\n", "name.duplicate",
     4, 9, "duplicate definition of diagram `f` (first defined at t.ncd:3:1)", None),
    (HEAD + "diagram f(X: [i], X: [j]) -> [i] { return X }\n", "name.duplicate", 3, 19,
     "duplicate definition of input `X` (first defined at t.ncd:3:11)", None),
    (HEAD + "diagram f(X: [i]) -> [i] {\n  A = X\n  A = X\n  return A\n}\n", "name.duplicate", 5, 3,
     "duplicate definition of array `A` (first defined at t.ncd:4:3)", None),
    ("axis i, exp\n", "name.reserved", 1, 9, "`exp` is reserved and cannot name an axis", None),
    (HEAD + "diagram softmax(X: [i]) -> [i] { return X }\n", "name.reserved", 3, 9,
     "`softmax` is reserved and cannot name a diagram", None),
    (HEAD + "diagram f(i: [i]) -> [i] { return i }\n", "name.reserved", 3, 11,
     "`i` is reserved and cannot name an array", "`i` is an axis; pick another array name"),
    ("axis i = 0\n", "axis.bad_size", 1, 10, "axis `i` has size 0; sizes must be positive integers up to "
     "9007199254740992", None),
    # a size past 2^53 (here 400 digits) is refused before the cost model floats it (regression)
    ("axis i = " + "9" * 400 + "\n", "axis.bad_size", 1, 10, "axis `i` has size 99999999999999999999... (400 "
     "digits); sizes must be positive integers up to 9007199254740992", None),
    # a zero tile named the axis `tile` (regression)
    (HEAD + "diagram f(X: [i]) -> [i] { return X }\ntheorem t: f {\n  group i by 0\n}\n", "axis.bad_tile", 5, 14,
     "group `i` by 0: a tile must be a name or a positive integer up to 9007199254740992", None),
    (HEAD + "diagram f(X: [i i]) -> [i] { return X }\n", "axis.repeated", 3, 17,
     "axis `i` appears twice in one array type", None),
    # use before definition, recursion
    (HEAD + "diagram f(X: [i]) -> [i] {\n  A = B\n  B = X\n  return A\n}\n", "name.use_before_def", 4, 7,
     "`B` is used before it is defined (defined at t.ncd:5:3)", None),
    (HEAD + "diagram f(X: [i]) -> [i] { return f(X) }\n", "diagram.recursion", 3, 35,
     "diagram `f` calls itself: f -> f", None),
    (HEAD + "diagram f(X: [i]) -> [i] { return g(X) }\ndiagram g(X: [i]) -> [i] { return f(X) }\n",
     "diagram.recursion", 4, 35, "diagram `f` calls itself: f -> g -> f", None),
    # contraction / reduction over an axis no operand has
    (HEAD + "diagram f(X: [i]) -> [i] { return contract[j](X, X) }\n", "axis.missing", 3, 35,
     "contract[j] needs axis `j` but no operand has it (operand axes: [i], [i])", None),
    (HEAD + "diagram f(X: [i]) -> [] { return logsumexp[j](X) }\n", "axis.missing", 3, 34,
     "logsumexp[j] needs axis `j` but no operand has it (operand axes: [i])", None),
    (HEAD + "diagram f(X: [i], V: [j]) -> [] { return ncontract[j; exp, exp, id](X, V) }\n",
     "axis.not_on_operand", 3, 42, "ncontract[j]: operand 1 lacks axis `j` (it has [i])", None),
    # return type and count
    (HEAD + "diagram f(X: [i]) -> [j] { return X }\n", "type.return_mismatch", 3, 35,
     "return type mismatch: declared [j], got [i]", None),
    (HEAD + "diagram f(X: [i]) -> [i] { return X, X }\n", "type.return_count", 3, 28,
     "`f` declares 1 outputs but returns 2", None),
    (HEAD + "diagram f(X: [i]) -> [i] { A = X }\n", "type.return_count", 3, 22,
     "`f` declares 1 outputs but returns 0", None),
    # arity
    (HEAD + "diagram f(X: [i]) -> [i] { return X }\ndiagram g(X: [i]) -> [i] { return f(X, X) }\n",
     "box.arity", 4, 35, "`f` takes 1 argument(s), got 2", None),
    (HEAD + "diagram f(X: [i]) -> [i] { return exp(X, X) }\n", "box.arity", 3, 35,
     "`exp` takes 1 argument(s), got 2", None),
    (HEAD + "diagram f(X: [i]) -> [i] { return where[i](i > 0, X) }\n", "box.arity", 3, 35,
     "`where` takes 3 argument(s), got 2", None),
    (HEAD + "diagram f(X: [i]) -> [] { return contract[i]() }\n", "box.arity", 3, 34,
     "`contract` takes one or more argument(s), got 0", None),
    # weaving and multi-output calls
    (HEAD + "diagram f(X: [i]) -> [i] { return X }\ndiagram g(X: [j]) -> [j] { return f(X) }\n",
     "type.arg_missing_axis", 4, 35, "argument 1 of `f` must have axes [i]; it has [j]", None),
    (HEAD + "diagram f(X: [i]) -> [] { return sum[i j](X * index[j](j)) }\n"
            "diagram g(X: [i j]) -> [j] { return f(X) }\n", "type.woven_clash", 4, 37,
     "argument 1 of `f` has axis `j`, which `f` uses inside; rename it before weaving", None),
    (HEAD + "diagram t(X: [i]) -> [i], [i] { return X, X }\ndiagram f(X: [i]) -> [i] {\n  A = t(X)\n  return A\n}\n",
     "type.tuple_arity", 5, 3, "`t` returns 2 outputs; bind them with 2 names", None),
    (HEAD + "diagram t(X: [i]) -> [i], [i] { return X, X }\ndiagram f(X: [i]) -> [i] { return exp(t(X)) }\n",
     "type.tuple_in_expr", 4, 39, "`t` returns 2 outputs and cannot be used inside an expression", None),
    # brackets of boxes
    (HEAD + "diagram f(X: [i]) -> [] { return sum(X) }\n", "box.needs_target", 3, 34,
     "`sum` needs target axes in brackets, e.g. `sum[x](...)`", None),
    (HEAD + "diagram f(X: [i]) -> [i] { return exp[i](X) }\n", "box.no_target", 3, 38,
     "`exp` takes no target axes", None),
    (HEAD + "diagram f(X: [i]) -> [i] { return split[i](X) }\n", "box.needs_arrow", 3, 40,
     "`split` needs `->` in its brackets, e.g. `split[q -> qo qi](X)`", None),
    (HEAD + "diagram f(X: [i]) -> [i] { return sum[i -> j](X) }\n", "box.no_arrow", 3, 38,
     "`sum` takes no `->` in its brackets", None),
    (HEAD + "diagram f(X: [i]) -> [i] { return ncontract[i; exp, exp](X, X) }\n", "box.params", 3, 44,
     "`ncontract` takes parameters a1, a2, b; got exp, exp", None),
    (HEAD + "diagram f(X: [i]) -> [i] { return ncontract[i; exp, exp, idd](X, X) }\n", "box.param_value", 3, 44,
     "`ncontract`: parameter 3 must be one of id, rms, sqrt, got `idd`", "did you mean `id`?"),
    # index predicates
    (HEAD + "diagram f(X: [i]) -> [i] { return X >= X }\n", "type.predicate_outside_where", 3, 35,
     "a comparison or logical operator is only allowed as the condition of `where`", None),
    (HEAD + "diagram f(X: [i]) -> [i] { return where[i](X, X, X) }\n", "type.predicate_expected", 3, 44,
     "the first argument of `where` must be a comparison of indices, e.g. `q >= x`", None),
    (HEAD + "diagram f(X: [i]) -> [i] { return where[i](j >= 0, X, X) }\n", "type.index_axis", 3, 44,
     "`j` in an index expression must be one of the box's axes [i]", None),
    (HEAD + "diagram f(X: [i]) -> [i] { return index[i](i * 1.5) }\n", "type.index_expr", 3, 48,
     "index expressions allow integers, axis indices, +, - and * only", None),
    (HEAD + "diagram f(X: [i]) -> [i] { return index[i](i * 9223372036854775808) }\n", "type.index_int", 3, 48,
     "index integer 9223372036854775808 is past 9223372036854775807: positions and index arithmetic are 64-bit "
     "integers", None),
    # reshaping
    ("axis i = 6, a = 4, b = 2\ndiagram f(X: [i]) -> [a b] { return split[i -> a b](X) }\n", "type.split_sizes",
     2, 37, "split[i -> a b]: sizes 4 x 2 do not multiply to 6", None),
    (HEAD + "diagram f(X: [i j]) -> [i j] { return transpose[i](X) }\n", "type.transpose", 3, 39,
     "transpose[i]: must list exactly the operand's axes [i j]", None),
    (HEAD + "diagram f(X: [i j]) -> [i j] { return rename[i -> j](X) }\n", "type.axis_exists", 3, 39,
     "rename[...]: axis `j` is already on the operand", None),
    (HEAD + "diagram f(X: [i]) -> [i] { return onehot[i](X) }\n", "type.axis_exists", 3, 35,
     "onehot[i]: axis `i` is already on the operand", None),
    (HEAD + "diagram f(X: [i]) -> [i] { return onehot[i j](X) }\n", "box.axis_count", 3, 35,
     "`onehot` takes 1 axis name(s) in its brackets, got 2", None),
    (HEAD + "diagram f(X: [i j]) -> [n] { return split[i j -> n](X) }\n", "box.axis_count", 3, 37,
     "`split` takes 1 axis name(s) before `->`, got 2", None),
    (HEAD + "diagram f(X: [i]) -> [n] { return split[i -> n](X) }\n", "box.axis_count", 3, 35,
     "`split` takes two or more axis name(s) after `->`, got 1", None),
    (HEAD + "diagram f(X: [i j]) -> [n] { return join[i j -> n j](X) }\n", "box.axis_count", 3, 37,
     "`join` takes 1 axis name(s) after `->`, got 2", None),
    # input relations (`given`): an expression of the other inputs, of the input's type
    (HEAD + "diagram f(X: [i j], L: [i]) -> [i] given L = sum[j](L) {\n  return L\n}\n", "relation.reads", 3, 53,
     "the relation giving `L` reads `L`, the input itself: a relation is an expression of the diagram's other "
     "inputs", None),
    (HEAD + "diagram f(X: [i j], L: [i]) -> [i] given L = sum[j](Y) {\n  Y = exp(X)\n  return L\n}\n",
     "relation.reads", 3, 53, "the relation giving `L` reads `Y`, a binding of the body: a relation is an "
     "expression of the diagram's other inputs", None),
    (HEAD + "diagram f(X: [i j], L: [i], M: [i]) -> [i] given L = sum[j](X), M = L {\n  return L\n}\n",
     "relation.reads", 3, 69, "the relation giving `M` reads `L`, an input a relation gives: a relation is an "
     "expression of the diagram's other inputs", None),
    (HEAD + "diagram f(X: [i j], L: [i]) -> [i] given L = X {\n  return L\n}\n", "relation.type", 3, 46,
     "the relation giving `L` has type [i j]; the input is declared [i]", None),
    (HEAD + "diagram f(X: [i j], L: int [i]) -> [i] given L = logsumexp[j](X) {\n  return L\n}\n",
     "relation.integer", 3, 50, "the relation giving `L` is not integer-valued, and `L` is declared `int` (exact "
     "integers): give an integer expression (`floor`, a comparison) or declare it real", None),
    (HEAD + "diagram f(X: [i j], L: [i]) -> [i] given M = X {\n  return L\n}\n", "name.unknown", 3, 42,
     "unknown input `M`", None),
    (HEAD + "diagram f(X: [i j], L: [i]) -> [i] given L = sum[j](Z) {\n  return L\n}\n", "name.unknown", 3, 53,
     "unknown name `Z`", None),
]


@pytest.mark.parametrize(("text", "code", "line", "col", "message", "hint"), CASES,
                         ids=[f"{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_error(text: str, code: str, line: int, col: int, message: str, hint: str | None) -> None:
    assert one_error(text) == (code, line, col, message, hint)


def test_all_errors_of_a_file_are_reported_in_one_run() -> None:
    text = (HEAD
            + "diagram f(X: [i]) -> [i] {\n  A = exp(Y)\n  return sum[k](X)\n}\n"  # lines 3-6
            + "diagram g(X: [k]) -> [i] { return h(X) }\n"                         # line 7
            + "diagram h(X: [i]) -> [i] { return h(X) }\n"                         # line 8
            + "diagram u(X: [i]) -> [i] { return f(X) }\n"                         # line 9: f failed, no cascade
            + "axis n = 5\n")                                                      # line 10
    found = [(code, line) for code, line, *_ in errors(text)]
    assert found == [("name.unknown", 4), ("axis.not_declared", 5), ("axis.not_declared", 7),
                     ("diagram.recursion", 8), ("axis.size_clash", 10)]


def test_errors_in_used_files_and_use_cycles(tmp_path: Path) -> None:
    (tmp_path / "a.ncd").write_text('use "b.ncd"\naxis i = 3\n')
    (tmp_path / "b.ncd").write_text('use "a.ncd"\naxis j\n')
    with pytest.raises(NapkinError) as info:
        load(tmp_path / "a.ncd")
    (cycle,) = info.value.diagnostics
    assert cycle.code == "use.cycle" and cycle.message == "`use` cycle: a.ncd -> b.ncd -> a.ncd"
    assert cycle.span is not None and Path(cycle.span.file).name == "b.ncd" and cycle.span.line == 1

    (tmp_path / "c.ncd").write_text("axis i = 4\ndiagram f(X: [i]) -> [i] { return X }\n")
    (tmp_path / "d.ncd").write_text('use "c.ncd"\naxis i = 5\ndiagram g(X: [i]) -> [i] { return f(X) }\n')
    with pytest.raises(NapkinError) as info:
        load(tmp_path / "d.ncd")
    (clash,) = info.value.diagnostics
    assert clash.code == "axis.size_clash" and clash.span is not None and clash.span.line == 2
    assert clash.message.startswith("axis `i` is declared with size 5 here but 4 at ")
    assert clash.message.endswith("c.ncd:1:6")

    (tmp_path / "e.ncd").write_text('use "missing.ncd"\nuse "c.ncd"\naxis q = 0\n')
    with pytest.raises(NapkinError) as info:
        load(tmp_path / "e.ncd")
    assert info.value.codes == ("file.not_found", "axis.bad_size")
    assert "missing.ncd: No such file or directory" in info.value.diagnostics[0].message

    (tmp_path / "bad.ncd").write_text("axis i\ndiagram f(X: [i]) -> [i] { return Y }\n")
    (tmp_path / "uses_bad.ncd").write_text('use "bad.ncd"\n')
    with pytest.raises(NapkinError) as info:
        load(tmp_path / "uses_bad.ncd")
    (inner,) = info.value.diagnostics
    assert inner.code == "name.unknown" and inner.span is not None and inner.span.file.endswith("bad.ncd")


def test_names_missing_after_a_broken_use_point_at_it(tmp_path: Path) -> None:
    (tmp_path / "lib.ncd").write_text("axis i\ndiagram f(X: [i]) -> [i] { return Y }\n")
    (tmp_path / "main.ncd").write_text('use "lib.ncd"\naxis j\ndiagram g(X: [j]) -> [j] { return f(X) }\n')
    with pytest.raises(NapkinError) as info:
        load(tmp_path / "main.ncd")
    by_code = {d.code: d for d in info.value.diagnostics}
    assert sorted(by_code) == ["box.unknown", "name.unknown"]
    inner, outer = by_code["name.unknown"], by_code["box.unknown"]
    assert inner.code == "name.unknown" and inner.span is not None and inner.span.file.endswith("lib.ncd")
    assert outer.code == "box.unknown" and outer.hint == "it may be defined in lib.ncd, which has errors"


def test_using_a_file_twice_is_harmless(tmp_path: Path) -> None:
    (tmp_path / "c.ncd").write_text("axis i = 4\ndiagram f(X: [i]) -> [i] { return X }\n")
    (tmp_path / "twice.ncd").write_text('use "c.ncd"\nuse "c.ncd"\ndiagram g(X: [i]) -> [i] { return f(X) }\n')
    assert load(tmp_path / "twice.ncd").diagram("g").outputs[0].diagram.name == "f"  # type: ignore[union-attr]


def test_a_missing_file_is_an_error_without_a_location(tmp_path: Path) -> None:
    with pytest.raises(NapkinError) as info:
        load(tmp_path / "absent.ncd")
    (diag,) = info.value.diagnostics
    assert diag.code == "file.not_found" and diag.span is None


def test_rendering_is_file_line_col_then_source_line_then_caret() -> None:
    text = HEAD + "diagram f(X: [i]) -> [i] {\n  return exp(Xs)\n}\n"
    with pytest.raises(NapkinError) as info:
        loads(text, "t.ncd")
    rendered = render(info.value.diagnostics[0], {"t.ncd": text})
    assert rendered.splitlines() == [
        "t.ncd:4:14: error: unknown name `Xs`",
        "    return exp(Xs)",
        "               ^^",
        "  hint: did you mean `X`?",
    ]


def test_every_message_code_is_raised_somewhere() -> None:
    """The message table holds no dead entries: each code is named by the code that raises it."""
    package = Path(__file__).resolve().parent.parent / "napkin_cat"
    source = "".join(p.read_text(encoding="utf-8") for p in package.rglob("*.py") if p.name != "diagnostics.py")
    assert [code for code in MESSAGES if f'"{code}"' not in source] == []


@pytest.mark.parametrize(("number", "ok"), [("1e400", False), ("1e-400", False), ("0.5e-323", True),
                                            ("0e999", True), ("0.000", True), ("1.7976931348623157e308", True)])
def test_a_number_float64_cannot_hold_is_refused(number: str, ok: bool) -> None:
    """1e400 would be read as inf and 1e-400 as 0, and a lemma proved of those (README "The language")."""
    text = HEAD + f"diagram f(X: [i]) -> [i] {{\n  return X * {number}\n}}\n"
    if ok:
        assert isinstance(loads(text).diagram("f").outputs[0].args[1], Const)
    else:
        assert one_error(text)[0] == "type.number"
