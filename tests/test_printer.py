"""The canonical printer: ``loads(print_module(m)) == m`` for generated modules and every
example, printing is idempotent, and parentheses appear exactly where precedence needs them."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given

from napkin_cat.elaborate import load, loads
from napkin_cat.printer import print_module
from napkin_cat.terms import Module
from tests.strategies import module_texts, modules

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.ncd"))


@given(modules())
def test_print_then_parse_is_the_identity(module: Module) -> None:
    text = print_module(module)
    again = loads(text)
    assert again == module
    assert print_module(again) == text  # canonical: a fixed point after one print


@given(module_texts(max_diagrams=2))
def test_layout_and_comments_do_not_change_the_module(text: str) -> None:
    relaid = "\n".join(f"# line {n}\n\t{line.strip()}   # trailing" for n, line in enumerate(text.splitlines()))
    assert loads(relaid) == loads(text)
    assert print_module(loads(relaid)) == print_module(loads(text))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_round_trips(path: Path) -> None:
    module = load(path)
    assert loads(print_module(module), str(path)) == module


HEAD = "axis i, j\n"


@pytest.mark.parametrize(("written", "canonical"), [
    ("(X + Y) * X", "(X + Y) * X"),
    ("X + (Y * X)", "X + Y * X"),
    ("X - (Y - X)", "X - (Y - X)"),
    ("(X - Y) - X", "X - Y - X"),
    ("X / (Y / X)", "X / (Y / X)"),
    ("-(X * Y)", "-(X * Y)"),
    ("(-X) * Y", "-X * Y"),
    ("- -X", "--X"),
    ("X * -2", "X * -2"),
    ("neg(-2) + X", "neg(-2) + X"),
    ("-(2) + X", "-2 + X"),
    ("X * (0 - inf)", "X * (0 - inf)"),
    ("max(X, -inf)", "max(X, -inf)"),
    ("X * 1e-05 + 2.50", "X * 1e-05 + 2.5"),
    ("recip(-0.0) + X * -0.0", "recip(-0.0) + X * -0.0"),
    ("where[i j]((i >= j and j > 0) or not (i == 1 or j == 2), X, Y)",
     "where[i j](i >= j and j > 0 or not (i == 1 or j == 2), X, Y)"),
    ("where[i j](i - (j - 1) >= -(j), X, Y)",
     "where[i j](i - (j - 1) >= -1 * j, X, Y)"),
    ("X + index[i j](-3 + (i * (j + 1)))", "X + index[i j](-3 + i * (j + 1))"),
    ("contract[](X, Y) + ncontract[j; exp, exp, id](X, Y)", "contract[](X, Y) + ncontract[j; exp, exp, id](X, Y)"),
])
def test_parentheses_only_where_needed(written: str, canonical: str) -> None:
    module = loads(HEAD + f"diagram f(X: [i j], Y: [j]) -> [i j] {{\n  return {written}\n}}\n")
    printed = print_module(module)
    assert printed.splitlines()[-2] == f"  return {canonical}"
    assert loads(printed) == module


def test_negative_zero_keeps_its_sign() -> None:
    """-0.0 == 0.0 as floats, so module equality cannot see it; recip tells them apart."""
    module = loads(HEAD + "diagram f(X: [i]) -> [i] {\n  return X + recip(-0.0)\n}\n")
    again = loads(print_module(module))
    (out,) = again.diagram("f").outputs
    const = out.args[1].args[0]  # type: ignore[union-attr]
    assert str(const.value) == "-0.0"


def test_rewrite_at_return_round_trips() -> None:
    text = (HEAD + "diagram f(X: [i j], Y: [j]) -> [i] {\n  T = exp(X)\n  return contract[j](softmax[j](T), Y)\n}\n"
            "theorem t: f {\n  rewrite softmax_contract at T, return\n}\n")
    module = loads(text)
    assert module.theorems[0].steps[0].at == ("T", "return")
    assert loads(print_module(module)) == module
    assert "rewrite softmax_contract at T, return" in print_module(module)
