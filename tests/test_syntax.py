"""Text -> Lark tree: positions kept, comments ignored, and syntax errors that say where and
what was expected."""

from __future__ import annotations

import pytest

from napkin_cat.diagnostics import NapkinError, render
from napkin_cat.syntax import grammar_text, parse_tree


def syntax_error(text: str) -> tuple[str, int, int, str]:
    with pytest.raises(NapkinError) as info:
        parse_tree(text, "s.ncd")
    (diag,) = info.value.diagnostics
    assert diag.span is not None
    return diag.code, diag.span.line, diag.span.col, diag.message


def test_the_grammar_is_the_repository_file() -> None:
    text = grammar_text()
    assert text.startswith("// The .ncd language") and "diagram:" in text


def test_positions_and_comments() -> None:
    tree = parse_tree("# a comment\naxis q, x   # trailing\n\ndiagram f(X: [q]) -> [q] {\n  return X\n}\n")
    axis_decl, diagram = tree.children
    assert axis_decl.data == "axis_decl" and (axis_decl.meta.line, axis_decl.meta.column) == (2, 1)
    assert diagram.data == "diagram" and (diagram.meta.line, diagram.meta.end_line) == (4, 6)
    assert [str(t) for t in tree.scan_values(lambda v: getattr(v, "type", None) == "NAME")][:2] == ["q", "x"]


def test_precedence_follows_arithmetic() -> None:
    expr = parse_tree("diagram f() -> [] { return 1 - 2 * -3 + 4 / 5 }").children[0].children[-1].children[0]
    # ((1 - (2 * (-3))) + (4 / 5))
    assert expr.data == "add"
    left, right = expr.children
    assert left.data == "sub" and left.children[1].data == "mul" and left.children[1].children[1].data == "neg"
    assert right.data == "div"


@pytest.mark.parametrize(("text", "code", "line", "col", "message"), [
    ("axis i\ndiagram g(X: [i]) -> [i] {\n  return exp(X\n}\n", "syntax.unexpected_token", 4, 1,
     "unexpected `}`; expected `)`, `,`"),
    ("axis i $\n", "syntax.unexpected_char", 1, 8,
     "unexpected character '$'; expected `,`, `=`, `axis`, `diagram`, `lemma`, `theorem`, `use`"),
    ("axis i\ndiagram g(X: [i]) -> [i] {\n", "syntax.unexpected_eof", 2, 27,
     "unexpected end of file; expected `return`, `}`, a name"),
    ("axis 3\n", "syntax.unexpected_token", 1, 6, "unexpected number `3`; expected a name"),
    ("diagram f(X: [i]) [i] { return X }", "syntax.unexpected_token", 1, 19,
     "unexpected `[`; expected `->`"),
    ("axis i = x\n", "syntax.unexpected_token", 1, 10, "unexpected name `x`; expected an integer"),
    ('use notquoted\n', "syntax.unexpected_token", 1, 5, "unexpected name `notquoted`; expected a quoted path"),
])
def test_syntax_errors_say_what_was_expected(text: str, code: str, line: int, col: int, message: str) -> None:
    assert syntax_error(text) == (code, line, col, message)


def test_a_syntax_error_renders_with_a_caret() -> None:
    text = "axis i\ndiagram g(X: [i]) -> [i] {\n  return exp(X\n}\n"
    with pytest.raises(NapkinError) as info:
        parse_tree(text, "s.ncd")
    assert render(info.value.diagnostics[0], {"s.ncd": text}).splitlines() == [
        "s.ncd:4:1: error: unexpected `}`; expected `)`, `,`",
        "  }",
        "  ^",
    ]


def test_empty_text_is_an_empty_module() -> None:
    assert parse_tree("").children == []
    assert parse_tree("# only a comment\n").children == []


def test_the_parser_read_back_from_the_cache_parses_and_refuses_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """The LALR tables are stored in napkin's cache folder and read back by the next process:
    the same trees (with positions) and the same syntax errors as a parser built from the grammar."""
    from pathlib import Path

    from napkin_cat import cache, syntax

    text = (Path(__file__).resolve().parent.parent / "examples" / "attention.ncd").read_text()
    bad = "diagram f(A: [x]) -> [x] {\n  return A +\n}\n"

    def outcome() -> tuple[object, list[tuple[int, int, int, int]], object]:
        syntax._parser.cache_clear()
        syntax._parsed.cache_clear()
        tree = parse_tree(text)
        positions = [(t.meta.line, t.meta.column, t.meta.end_line, t.meta.end_column) for t in tree.iter_subtrees()]
        with pytest.raises(NapkinError) as err:
            parse_tree(bad)
        return tree, positions, err.value.diagnostics[0]  # trees compare by rule name and children

    built = outcome()
    folder = cache.cache_folder()
    assert folder is not None and any(p.name.startswith("lark-") for p in folder.iterdir())  # stored
    assert outcome() == built  # read back
    monkeypatch.setenv("NAPKIN_CACHE_DIR", "")  # no cache: built from the grammar
    assert outcome() == built
    syntax._parser.cache_clear()
