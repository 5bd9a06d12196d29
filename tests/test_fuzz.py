"""No Python traceback for bad input: random text, and mutations of the example files
(tokens and characters deleted, inserted, swapped), go through parse + elaborate, and the
only exception allowed out is ``NapkinError`` carrying located diagnostics.  Generated
well-typed modules are also evaluated on random inputs under the same rule.  Every verb of
the command line runs with every option on generated modules with theorems and edited bundled
proofs in several encodings, special files, malformed hardware profiles and interruptions
(``tests/fuzz_verbs.py``), each run bounded in time, and must exit 0, 1 or 2 (130 when
interrupted, with one line; 74 on a full stdout) without a traceback; CI runs a short profile,
``benchmarks/fuzz_verbs.py`` the long one (its figure is in BENCHMARKS.md)."""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from napkin_cat import run
from napkin_cat.diagnostics import NapkinError, render
from napkin_cat.elaborate import loads
from napkin_cat.terms import Module
from tests import fuzz_verbs
from tests.fuzz_verbs import OPTIONS, VERBS, Invocation, invocations, prepare, run_verb
from tests.strategies import SIZE_REFUSALS, input_arrays, modules, sizes_for

EXAMPLES = {p.name: p.read_text() for p in (Path(__file__).resolve().parent.parent / "examples").glob("*.ncd")}
TOKEN = re.compile(r"\s+|#[^\n]*|\w+|->|>=|<=|==|!=|\S")
VOCABULARY = [
    "axis", "diagram", "return", "use", "theorem", "lemma", "group", "stream", "place", "dtype", "by", "at", "via",
    "pad", "as", "tol", "and", "or", "not", "inf", "->", "=", ",", ";", ":", "(", ")", "[", "]", "{", "}", "+", "-",
    "*", "/", ">=", "<", "==", "!=", "0", "3", "1.5", "1e-3", "-1", "q", "x", "d", "b", "h", "Q", "K", "S", "P",
    "softmax", "contract", "ncontract", "where", "index", "onehot", "split", "join", "rename", "transpose", "sum",
    "max", "exp", "rsqrt", "attention", "mha", "matmul", "smem", "\n", " ", '"examples/matmul.ncd"', '"nowhere.ncd"',
]
# `use` paths resolve against the module's directory: keep them inside an empty folder
_DIR = Path(tempfile.mkdtemp(prefix="napkin-fuzz-"))


def only_diagnostics(text: str) -> Module | None:
    """Elaborate ``text``; any exception other than NapkinError fails the test."""
    try:
        return loads(text, str(_DIR / "fuzz.ncd"))
    except NapkinError as exc:
        for diag in exc.diagnostics:
            assert diag.message  # every code has a template and its arguments
            render(diag, {str(_DIR / "fuzz.ncd"): text})
        return None


@st.composite
def mutated_examples(draw: st.DrawFn) -> str:
    """An example file with a few token- or character-level edits."""
    text = EXAMPLES[draw(st.sampled_from(sorted(EXAMPLES)))]
    tokens = TOKEN.findall(text)
    for _ in range(draw(st.integers(1, 4))):
        edit = draw(st.sampled_from(("delete", "insert", "swap", "duplicate", "char")))
        i = draw(st.integers(0, len(tokens) - 1))
        if edit == "delete":
            del tokens[i]
        elif edit == "insert":
            tokens.insert(i, draw(st.sampled_from(VOCABULARY)))
        elif edit == "swap":
            j = draw(st.integers(0, len(tokens) - 1))
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif edit == "duplicate":
            tokens.insert(i, tokens[i])
        else:
            flat = "".join(tokens)
            k = draw(st.integers(0, len(flat)))
            char = draw(st.characters(codec="utf-8", exclude_categories=("Cs",)))
            flat = flat[:k] + char + flat[k + draw(st.integers(0, 1)):]
            tokens = TOKEN.findall(flat) or [""]
        if not tokens:
            tokens = [""]
    return "".join(tokens)


@settings(max_examples=150)
@given(mutated_examples())
def test_mutated_examples_give_only_diagnostics(text: str) -> None:
    only_diagnostics(text)


@given(st.lists(st.sampled_from(VOCABULARY), max_size=40).map(" ".join))
def test_token_soup_gives_only_diagnostics(text: str) -> None:
    only_diagnostics(text)


@given(st.text(max_size=200))
def test_random_text_gives_only_diagnostics(text: str) -> None:
    only_diagnostics(text)


def test_the_unmutated_examples_load() -> None:
    for name, text in EXAMPLES.items():
        if "use" not in text.split():
            assert only_diagnostics(text) is not None, name


@pytest.mark.parametrize(("opening", "closing"), [("exp(", ")"), ("(-", ")"), ("", " + X")])
def test_deep_nesting_is_a_diagnostic_not_a_crash(opening: str, closing: str) -> None:
    depth = 3000
    text = "axis i\ndiagram f(X: [i]) -> [i] { return " + opening * depth + "X" + closing * depth + " }\n"
    with pytest.raises(NapkinError) as info:
        loads(text, "deep.ncd")
    (diag,) = info.value.diagnostics
    assert diag.code == "syntax.too_deep" and diag.span is not None and diag.span.line == 2
    # a deep but reasonable expression still loads
    shallow = "axis i\ndiagram f(X: [i]) -> [i] { return " + opening * 40 + "X" + closing * 40 + " }\n"
    assert loads(shallow).diagram("f").out_types == (("i",),)


@given(modules(max_diagrams=2), st.data())
def test_generated_modules_evaluate_or_give_diagnostics(module: Module, data: st.DataObject) -> None:
    for diagram in module.diagrams:
        sizes = data.draw(sizes_for(diagram, max_size=3))
        arrays = data.draw(input_arrays(diagram, sizes))
        try:
            result = run(diagram, *arrays, sizes=sizes)
        except NapkinError as exc:
            # well typed, every axis sized, every array shaped: only sizes that a rename or split
            # cannot honour (drawn independently for its axes) may be refused
            assert set(exc.codes) <= SIZE_REFUSALS and all(d.message for d in exc.diagnostics), exc.diagnostics
            continue
        outs = result if isinstance(result, tuple) else (result,)
        for out, axes in zip(outs, diagram.out_types, strict=True):
            assert np.shape(out) == tuple(sizes[a] for a in axes)


# ---- every verb (tests/fuzz_verbs.py): exit 0, 1 or 2 within the time bound, never a traceback ----

_VERBS_DIR = prepare(Path(tempfile.mkdtemp(prefix="napkin-fuzz-verbs-")))


@settings(max_examples=25, deadline=None)
@given(invocations(_VERBS_DIR))
def test_every_verb_gives_an_exit_code_not_a_traceback(invocation: Invocation) -> None:
    outcome = fuzz_verbs.run(invocation)
    assert outcome.ok, f"{invocation}: {outcome.error}"


def test_the_verb_fuzzer_draws_every_verb_and_option() -> None:
    """The fuzzer's ``OPTIONS`` are the parser's: a new verb or option is fuzzed or this fails."""
    from napkin_cat import cli

    parsers = cli._parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(VERBS) == set(parsers)
    for verb, parser in parsers.items():
        options = {max(a.option_strings, key=len) for a in parser._actions if a.option_strings} - {"--help"}
        assert options == OPTIONS[verb], verb


def test_the_verb_fuzzer_sees_escaped_exceptions_and_hangs(monkeypatch: pytest.MonkeyPatch) -> None:
    from napkin_cat.verbs import text as text_verbs  # where `parse` lives: patched to fail on purpose

    def broken(args: object) -> int:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(text_verbs, "cmd_parse", broken)
    outcome = run_verb("parse", [str(_VERBS_DIR / "proofs" / "matmul.ncd")])
    assert not outcome.ok and "ZeroDivisionError: a bug" in outcome.error

    def slow(args: object) -> int:
        while True:
            pass

    monkeypatch.setattr(text_verbs, "cmd_parse", slow)
    outcome = run_verb("parse", ["x.ncd"], seconds=0.2)
    assert not outcome.ok and outcome.error == "took longer than 0.2 s"


def test_the_verb_fuzzer_sees_tracebacks_replaced_special_files_and_silent_interrupts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from napkin_cat.verbs import text as text_verbs  # where `parse` lives: patched to fail on purpose

    def printed(args: object) -> int:
        print("Traceback (most recent call last):", file=sys.stderr)
        return 0

    monkeypatch.setattr(text_verbs, "cmd_parse", printed)
    assert "a traceback on stderr" in fuzz_verbs.run(Invocation("parse", ("x.ncd",))).error
    fifo = str(_VERBS_DIR / "special" / "out_fifo.svg")

    def replacing(args: object) -> int:
        os.replace(_VERBS_DIR / "out" / "made", fifo)
        return 0

    (_VERBS_DIR / "out" / "made").write_text("x")
    monkeypatch.setattr(text_verbs, "cmd_parse", replacing)
    outcome = fuzz_verbs.run(Invocation("parse", ("x.ncd",), guarded=(fifo,)))
    assert outcome.error == f"special output replaced: {fifo}"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # made again for the next runs

    def interrupted(args: object) -> int:
        return 130

    monkeypatch.setattr(text_verbs, "cmd_parse", interrupted)
    assert "interrupted without the one line" in fuzz_verbs.run(Invocation("parse", ("x.ncd",), interrupt=5.0)).error
    assert fuzz_verbs.run(Invocation("parse", ("x.ncd",))).error.startswith("exit 130")
