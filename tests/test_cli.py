"""The `napkin` command line (parse and eval): output, and exit codes 0 ok / 1 error in the
input / 2 usage error.  Commands run in-process through ``main(argv)``; one test runs the
installed console script."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from napkin_cat.cli import main
from napkin_cat.elaborate import load, loads

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ATTENTION = str(EXAMPLES / "attention.ncd")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- parse --------------------------------------------------------------------------------

def test_parse_prints_the_canonical_form(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "parse", ATTENTION)
    assert code == 0 and err == ""
    assert "diagram attention(Q: [q d], K: [x d], V: [x d]) -> [q d] {" in out
    assert "  S = contract[d](Q, K) * rsqrt(d)" in out
    assert loads(out) == load(ATTENTION)


def test_parse_reports_every_error_with_location_and_caret(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.ncd"
    bad.write_text("axis i\ndiagram f(X: [i]) -> [i] {\n  A = exp(Xs)\n  return sum[k](X)\n}\n")
    code, out, err = run(capsys, "parse", str(bad))
    assert code == 1 and out == ""
    assert err.splitlines() == [
        f"{bad}:3:11: error: unknown name `Xs`",
        "    A = exp(Xs)",
        "            ^^",
        "  hint: did you mean `X`?",
        f"{bad}:4:13: error: unknown axis `k`",
        "    return sum[k](X)",
        "              ^^^",
    ]


def test_parse_reports_a_syntax_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "syntax.ncd"
    bad.write_text("axis i\ndiagram f(X: [i]) -> [i] {\n  return exp(X\n}\n")
    code, _, err = run(capsys, "parse", str(bad))
    assert code == 1
    assert err.startswith(f"{bad}:4:1: error: unexpected `}}`; expected `)`, `,`\n  }}\n  ^")


def test_parse_of_a_missing_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "parse", str(tmp_path / "absent.ncd"))
    assert code == 2 and out == ""
    assert err == f"napkin parse: error: no such file: {tmp_path / 'absent.ncd'}\n"


# ---- eval ---------------------------------------------------------------------------------

SUMMARY = re.compile(r"output (\d+): \[([a-z ]*)\] shape=\(([\d, ]*)\) mean=\S+ std=\S+ min=\S+ max=\S+")


def test_eval_prints_shape_and_summary_of_each_output(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "eval", ATTENTION, "mha", "--size", "b=2", "--size", "h=3", "--size", "q=4",
                         "--size", "x=5", "--seed", "7")
    assert code == 0 and err == ""
    (line,) = out.splitlines()
    match = SUMMARY.fullmatch(line)
    assert match is not None, line
    assert match.groups() == ("0", "b h q d", "2, 3, 4, 64")


def test_eval_summarises_the_outputs_on_seeded_normal_inputs(capsys: pytest.CaptureFixture[str]) -> None:
    """The inputs are ``default_rng(seed).standard_normal`` in declared order (README): the
    statistics printed are those of the true product, each in its place."""
    code, out, _ = run(capsys, "eval", str(EXAMPLES / "matmul.ncd"), "matmul", "--size", "a=3", "--size", "b=4",
                       "--size", "c=2", "--seed", "5")
    assert code == 0
    rng = np.random.default_rng(5)
    want = rng.standard_normal((3, 4)) @ rng.standard_normal((4, 2))
    printed = dict(re.findall(r"(mean|std|min|max)=(\S+)", out))
    expected = {"mean": want.mean(), "std": want.std(), "min": want.min(), "max": want.max()}
    assert printed.keys() == expected.keys(), out
    for stat, value in expected.items():
        assert float(printed[stat]) == pytest.approx(value, rel=1e-5), (stat, out)


def test_eval_is_deterministic_per_seed(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("eval", str(EXAMPLES / "matmul.ncd"), "matmul", "--size", "a=3", "--size", "b=4", "--size", "c=2")
    first = run(capsys, *argv, "--seed", "1")
    again = run(capsys, *argv, "--seed", "1")
    other = run(capsys, *argv, "--seed", "2")
    assert first == again and first[0] == 0
    assert other[1] != first[1]


def test_eval_of_several_outputs_and_fully_masked_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "two.ncd"
    path.write_text("axis i = 2, j = 3\n"
                    "diagram two(X: [i j]) -> [i], [i j] {\n"
                    "  return logsumexp[j](where[i j](i > 5, X, -inf)), X\n}\n")
    code, out, _ = run(capsys, "eval", str(path), "two")
    assert code == 0
    first, second = out.splitlines()
    assert first == "output 0: [i] shape=(2,) no finite values"
    assert SUMMARY.fullmatch(second) is not None


@pytest.mark.parametrize(("argv", "message"), [
    (("eval", ATTENTION, "nope"), "no diagram `nope` in"),
    (("eval", ATTENTION, "attention", "--size", "q=2"), "axis `x` is symbolic: give its size with --size x=N"),
    (("eval", ATTENTION, "attention", "--size", "q=two"), "--size expects AXIS=N with N a positive integer"),
    (("eval", ATTENTION, "attention", "--size", "q=0"), "--size expects AXIS=N with N a positive integer"),
    (("eval", ATTENTION, "attention", "--size", "b=2"), "--size names axes that `attention` does not use: b"),
    (("eval", ATTENTION, "attention", "--size", "q=2", "--size", "x=2", "--size", "d=8"),
     "--size contradicts a declared axis size: d=8 (declared 64)"),
])
def test_eval_usage_errors_exit_2(argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("napkin eval: error: ") and message in err


def test_eval_of_a_bad_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.ncd"
    bad.write_text("axis i\ndiagram f(X: [i]) -> [j] { return X }\n")
    code, _, err = run(capsys, "eval", str(bad), "f", "--size", "i=2")
    assert code == 1 and "error: unknown axis `j`" in err


def test_argparse_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in ([], ["frobnicate"], ["eval", ATTENTION]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 2
    assert "usage: napkin" in capsys.readouterr().err


def test_the_console_script() -> None:
    script = Path(sys.executable).parent / "napkin"
    ok = subprocess.run([str(script), "parse", str(EXAMPLES / "matmul.ncd")], capture_output=True, text=True,
                        check=False)
    assert ok.returncode == 0 and "return contract[b](A, B)" in ok.stdout
    bad = subprocess.run([str(script), "eval", str(EXAMPLES / "matmul.ncd"), "matmul"], capture_output=True,
                         text=True, check=False)
    assert bad.returncode == 2 and "give its size with --size" in bad.stderr


def _tested_and_proved(folder: Path) -> None:
    """tested.ncd: theorem `t` rests on a lemma the prover cannot prove (max(-S) = -min(S): true, only
    tested); proved.ncd: theorem `t` rests on a proved one."""
    body = "diagram g(S: [q x]) -> [q] {\n  return {lhs}\n}\ntheorem t: g {\n  rewrite {name} at return\n}\n"
    (folder / "tested.ncd").write_text("axis q, x\nlemma flip(S: [x]) : max[x](neg(S)) = neg(min[x](S))\n"
                                       + body.replace("{lhs}", "max[x](neg(S))").replace("{name}", "flip"))
    (folder / "proved.ncd").write_text("axis q, x\nlemma twice(S: [x]) : sum[x](S + S) = sum[x](S) + sum[x](S)\n"
                                       + body.replace("{lhs}", "sum[x](S + S)").replace("{name}", "twice"))


def test_check_strict_gives_one_verdict_per_file_folder_and_json(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A theorem resting on a lemma the prover cannot prove (max(-S) = -min(S): true, only tested)
    is refused by --strict however it is asked: the file, its folder with a proved file beside
    it, and --json (ok false, the refusal in its record); exit 1 in each, 0 without --strict."""
    _tested_and_proved(tmp_path)
    assert main(["check", "-q", "--strict", str(tmp_path / "proved.ncd")]) == 0
    assert main(["check", "-q", "--strict", str(tmp_path / "tested.ncd")]) == 1
    assert main(["check", "-q", "--strict", str(tmp_path)]) == 1
    assert main(["check", "-q", str(tmp_path)]) == 0  # tested is accepted without --strict
    capsys.readouterr()
    assert main(["check", "--strict", "--json", str(tmp_path)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert (report["ok"], report["theorems"], report["refused"]) == (False, 2, 1)
    (refused,) = [r for r in report["results"] if not r["ok"]]
    assert refused["file"].endswith("tested.ncd") and "only tested" in refused["error"]


def test_lower_strict_refuses_a_theorem_resting_on_a_tested_lemma(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """`lower` lowered a theorem resting on a lemma only tested, with no word but its docstring's trust
    line; `lower --strict` refuses it as `check --strict` does (exit 1, the step located), lowers a proved
    one, and refuses --allow-tested-join beside it (exit 2)."""
    _tested_and_proved(tmp_path)
    out = tmp_path / "k.py"
    assert main(["lower", str(tmp_path / "tested.ncd"), "t", "--target", "jax", "-o", str(out)]) == 0
    out.unlink()
    capsys.readouterr()
    assert main(["lower", str(tmp_path / "tested.ncd"), "t", "--target", "jax", "--strict", "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "only tested" in err and "tested.ncd:7:3: error: strict" in err and not out.exists()
    assert main(["lower", str(tmp_path / "proved.ncd"), "t", "--target", "jax", "--strict", "-o", str(out)]) == 0
    assert main(["lower", str(tmp_path / "proved.ncd"), "t", "--target", "jax", "--strict",
                 "--allow-tested-join", "-o", str(tmp_path / "j.py")]) == 2
