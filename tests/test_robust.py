"""Regression tests of issue 15: every verb refuses bad input with a message and the README's
exit code (0 ok, 1 an error in the input, 2 a usage error, 130 interrupted), `use` reads only
regular .ncd files and never quotes one that does not parse, outputs are atomic and never
replace an input, generated code cannot be shadowed, and the small things users expect."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sympy

import napkin_cat
from napkin_cat import cli, files
from napkin_cat.cli import main
from napkin_cat.diagnostics import NapkinError, render
from napkin_cat.elaborate import load, loads
from napkin_cat.syntax import HIDDEN
from napkin_cat.verbs import text as text_verbs  # where `parse` lives: patched to fail on purpose

ROOT = Path(__file__).resolve().parent.parent
ATTENTION = str(ROOT / "examples" / "attention.ncd")
MATMUL_PROOF = str(ROOT / "proofs" / "matmul.ncd")
SECRET = "root:$6$s3cr3t-hash:19000:0:99999:7:::"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- eval -----------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [("--seed", "-5"), ("--seed", "x")])
def test_eval_refuses_a_bad_seed_as_usage(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["eval", ATTENTION, "attention", "--size", "q=2", "--size", "x=2", *argv])
    assert info.value.code == 2 and "--seed" in capsys.readouterr().err


@pytest.mark.parametrize("size", ["q=²", "q=٣", "q=0", "q=" + "9" * 400, "q"])
def test_eval_refuses_a_malformed_size_as_usage(size: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "eval", ATTENTION, "attention", "--size", size, "--size", "x=2")
    assert code == 2 and out == "" and "--size expects AXIS=N" in err and "Traceback" not in err


def test_eval_refuses_a_huge_size_before_allocating(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "eval", ATTENTION, "attention", "--size", "q=99999999999", "--size", "x=2")
    assert code == 1 and "past the 6.71e+07 an evaluation may allocate" in err
    declared = tmp_path / "big.ncd"
    declared.write_text("axis d = 99999999999\ndiagram f(A: [d]) -> [d] { return exp(A) }\n")
    code, _, err = run(capsys, "eval", str(declared), "f")
    assert code == 1 and "evaluating `f` holds 1e+11 points over [d]" in err
    # woven over extra axes: the callee's boxes hold them too
    code, _, err = run(capsys, "eval", ATTENTION, "mha", *(f"--size={a}=128" for a in "bhqx"))
    assert code == 1 and "[b h q d x]" in err


def test_eval_draws_integers_for_an_int_input(capsys: pytest.CaptureFixture[str]) -> None:
    """A standard-normal draw for segment ids was refused (`eval.integer`): an `int` input gets
    small sorted integers, as `check` draws them."""
    masked = str(ROOT / "examples" / "masked_attention.ncd")
    code, out, err = run(capsys, "eval", masked, "document_attention", "--size", "q=8", "--size", "x=8")
    assert code == 0 and err == "" and out.startswith("output 0: [q d] shape=(8, 64)")


def test_evaluate_refuses_complex_inputs() -> None:
    f = loads("axis i\ndiagram f(A: [i]) -> [i] { return exp(A) }\n").diagram("f")
    with pytest.raises(NapkinError) as info:
        napkin_cat.run(f, np.ones(3, dtype=complex))
    assert info.value.codes == ("eval.dtype",) and "complex" in info.value.diagnostics[0].message
    assert np.allclose(napkin_cat.run(f, np.arange(3)), np.exp(np.arange(3)))  # integers are real numbers


# ---- cost -----------------------------------------------------------------------------------

def test_cost_of_a_kernel_that_moves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proof = tmp_path / "t.ncd"
    proof.write_text("axis a\ndiagram f(A: [a]) -> [a] { return A }\ntheorem t: f {}\n")
    code, out, err = run(capsys, "cost", str(proof), "t", "--size", "a=4")
    assert code == 0 and "gain n/a (serial), n/a (overlapped)" in out, err
    assert "no hbm traffic" in out and "nan" not in out
    code, out, _ = run(capsys, "cost", str(proof), "t", "--size", "a=4", "--json")

    def refuse(constant: str) -> None:
        raise AssertionError(f"cost --json printed {constant}, which is not JSON")

    time = json.loads(out, parse_constant=refuse)["time"]
    assert code == 0 and time["gain_vs_unfused_serial"] is None and time["intensity_flop_per_byte"] is None


@pytest.mark.parametrize("verb", ["cost", "pseudo"])
def test_a_defect_inside_the_cost_model_is_not_called_a_usage_error(verb: str, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("an internal invariant broke")

    monkeypatch.setattr(napkin_cat.cost, "cost", broken)
    with pytest.raises(ValueError, match="internal invariant"):
        main([verb, "proofs/flash_attention.ncd", "flash_attention"])
    monkeypatch.undo()
    code, _, err = run(capsys, verb, "proofs/flash_attention.ncd", "flash_attention", "--size", "zz=3")
    assert code == 2 and "zz" in err  # the caller's mistake still is one


def test_cost_of_bundled_gqa_gives_the_optimum_as_a_family(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "cost", str(ROOT / "proofs" / "gqa.ncd"), "flash_gqa", "--size", "b=2",
                         "--size", "h=4", "--size", "g=4", "--size", "q=1024", "--size", "x=1024")
    assert code == 0, err
    assert "continuous optimum at smem (M = capacity in values): gg = 58112/(65*gq)" in out


def test_cost_refuses_a_400_digit_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "cost", MATMUL_PROOF, "tiled_matmul", "--size", "a=" + "9" * 400)
    assert code == 2 and "up to 9007199254740992" in err
    code, _, _ = run(capsys, "cost", MATMUL_PROOF, "tiled_matmul", *(f"--size={a}={2 ** 53}" for a in "abc"))
    assert code == 0


def test_an_optimal_tile_must_be_positive() -> None:
    from napkin_cat.cost.optimise import M, _positive

    a, b = sympy.symbols("a b", positive=True)
    assert _positive(sympy.sqrt(M) * (a + b))
    assert not _positive(-sympy.sqrt(2) * sympy.sqrt(M))
    assert not _positive(sympy.sqrt(M) * (a - b))  # sign undecided; 0 at the probe
    assert not _positive(sympy.sqrt(M) * (b - 2 * a))  # undecided; negative at the probe
    assert _positive(sympy.sqrt(M) * (2 * a - b))
    assert not _positive(sympy.sqrt(a - 2 * b))  # imaginary at the probe


# ---- exit codes -----------------------------------------------------------------------------

@pytest.mark.parametrize("option", [("--dtype", "int8"), ("--hardware", "zz")])
def test_bad_dtype_or_hardware_is_a_usage_error_in_every_verb(option: tuple[str, str], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "k.py")
    for argv in (["lower", MATMUL_PROOF, "tiled_matmul", "-o", out], ["cost", MATMUL_PROOF, "tiled_matmul"],
                 ["pseudo", MATMUL_PROOF, "tiled_matmul"],
                 ["derive", str(ROOT / "examples" / "matmul.ncd"), "matmul", "-o", str(tmp_path / "d.ncd")]):
        code, _, err = run(capsys, *argv, *option)
        assert code == 2 and option[1] in err, (argv, err)
    assert not (tmp_path / "k.py").exists() and not (tmp_path / "d.ncd").exists()


def test_one_dtype_vocabulary_and_the_documented_defaults(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every verb reads --dtype alike; a written kernel is f32 unless asked (`lower`, and `derive
    --lower` when resolved; bf16 on mosaic, resolved by lower() per target), as the Python
    lower() emits it; the cost model prices in bf16."""
    defaults = {verb: {a.dest: a for a in cli._parser()._subparsers._group_actions[0].choices[verb]._actions}[
        "dtype"].default for verb in ("lower", "derive", "cost", "pseudo")}
    assert defaults == {"lower": None, "derive": None, "cost": "bf16", "pseudo": "bf16"}
    out = tmp_path / "k.py"
    code, _, err = run(capsys, "lower", MATMUL_PROOF, "tiled_matmul", "--target", "jax", "--dtype", "fp16",
                       "-o", str(out))
    assert code == 0 and "float16" in out.read_text(), err
    code, _, err = run(capsys, "lower", MATMUL_PROOF, "tiled_matmul", "--dtype", "fp8e4m3", "-o", str(out))
    assert code == 2 and "kernels are emitted in f32, bf16, f16 only" in err


@pytest.mark.parametrize("target", ["jax", "pallas", "mosaic"])
def test_the_cli_and_python_lower_agree_on_the_default_dtype(target: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from napkin_cat.lower import lower
    from napkin_cat.proof import theorem

    out = tmp_path / "k.py"
    code, _, err = run(capsys, "lower", MATMUL_PROOF, "tiled_matmul", "--target", target, "-o", str(out))
    assert code == 0, err
    written = out.read_text()
    assert written == lower(theorem(MATMUL_PROOF, "tiled_matmul"), target=target).source
    assert f"inputs and outputs {'bfloat16' if target == 'mosaic' else 'float32'}" in written


def test_ctrl_c_exits_130_with_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(text_verbs, "cmd_parse", interrupted)
    code, out, err = run(capsys, "parse", ATTENTION)
    assert code == 130 and out == "" and err == "napkin parse: interrupted\n"


# ---- use ------------------------------------------------------------------------------------

def _use(tmp_path: Path, target: str) -> Path:
    main_file = tmp_path / "main.ncd"
    main_file.write_text(f'use "{target}"\naxis q\n')
    return main_file


@pytest.mark.parametrize("name", ["shadow", "environ.txt", "secret.ncd"])
def test_use_never_shows_a_file_that_is_not_ncd(name: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / name).write_text(SECRET + "\n")
    code, out, err = run(capsys, "parse", str(_use(tmp_path, name)))
    assert code == 1 and out == ""
    assert SECRET not in err and "s3cr3t" not in err
    first, *rest = err.splitlines()
    assert first.endswith(f"`use` reads only .ncd files; `{name}` is not one") or \
        first.endswith(f"`{name}` does not parse as .ncd (line 1, column 1); `napkin parse` on it shows why")
    assert rest == [f'  use "{name}"', "      " + "^" * (len(name) + 2)]  # the user's own line, nothing else


def test_use_refuses_special_and_oversized_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "pipe.ncd")
    (tmp_path / "zero.ncd").symlink_to("/dev/zero")
    (tmp_path / "big.ncd").write_text(" " * (files.MAX_SOURCE_BYTES + 1))
    (tmp_path / "dir.ncd").mkdir()
    expected = {"pipe.ncd": "not a regular file (a pipe)", "zero.ncd": "not an .ncd file (it leads to /dev/zero)",
                "big.ncd": "past the limit of 1048576 bytes", "dir.ncd": "not a regular file (a folder)"}
    for name, reason in expected.items():
        with pytest.raises(NapkinError) as info:  # returns at once: the FIFO is opened without blocking
            load(_use(tmp_path, name))
        (diag,) = info.value.diagnostics
        assert diag.code == "file.not_found" and reason in diag.message, diag.message
    with pytest.raises(NapkinError) as info:
        loads('use "a\0b.ncd"\n', str(tmp_path / "m.ncd"))
    assert info.value.codes == ("use.not_ncd",)


def test_read_source_limits_and_bom(tmp_path: Path) -> None:
    path = tmp_path / "bom.ncd"
    path.write_bytes(b"\xef\xbb\xbfaxis q\n")
    assert files.read_source(path) == "axis q\n"
    assert load(path).axes[0].name == "q"
    with pytest.raises(files.FileRefused, match="NUL"):
        files.read_source("a\0b")
    with pytest.raises(files.FileRefused, match="past the limit of 3 bytes"):
        files.read_source(path, limit=3)
    (tmp_path / "latin.ncd").write_bytes(b"axis \xe9\n")
    with pytest.raises(files.FileRefused, match="not UTF-8"):
        files.read_source(tmp_path / "latin.ncd")


def test_a_source_past_the_limit_is_refused_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "big.ncd"
    big.write_text("axis q\n" + "# filler\n" * (files.MAX_SOURCE_BYTES // 9 + 1))
    code, _, err = run(capsys, "parse", str(big))
    assert code == 1 and "past the limit of 1048576 bytes for a source file" in err


def test_carets_align_under_tabs() -> None:
    text = "axis i\n\tdiagram f(X: [i]) -> [i] {\n\t\treturn Y\n}\n"
    with pytest.raises(NapkinError) as info:
        loads(text, "t.ncd")
    lines = render(info.value.diagnostics[0], {"t.ncd": text}).splitlines()
    assert lines[1:3] == ["  \t\treturn Y", "  \t\t       ^"]


# ---- outputs --------------------------------------------------------------------------------

def _copy_proof(tmp_path: Path) -> Path:
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "matmul.ncd").write_text((ROOT / "examples" / "matmul.ncd").read_text())
    (tmp_path / "proofs").mkdir()
    proof = tmp_path / "proofs" / "matmul.ncd"
    proof.write_text(Path(MATMUL_PROOF).read_text())
    return proof


def test_an_output_never_replaces_an_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    proof = _copy_proof(tmp_path)
    used = tmp_path / "examples" / "matmul.ncd"
    os.link(used, tmp_path / "hard.py")
    (tmp_path / "soft.py").symlink_to(proof)
    os.link(proof, tmp_path / "hard.svg")
    os.link(used, tmp_path / "hard.ncd")
    before = {p: p.read_text() for p in (proof, used)}
    dotted = tmp_path / "proofs" / ".." / "proofs" / "matmul.ncd"
    for out in (proof, tmp_path / "hard.py", tmp_path / "soft.py", dotted):
        code, _, err = run(capsys, "lower", str(proof), "tiled_matmul", "--target", "jax", "-o", str(out))
        assert code == 2 and "is the input" in err, (out, err)
    code, _, err = run(capsys, "draw", str(proof), "tiled_matmul", "-o", str(tmp_path / "hard.svg"))
    assert code == 2 and "is the input" in err
    code, out, err = run(capsys, "derive", str(used), "matmul", "--size", "a=64", "--size", "b=64", "--size", "c=64",
                         "-o", str(tmp_path / "hard.ncd"))
    assert code == 2 and "is the input" in err and "search stopped" not in out
    assert {p: p.read_text() for p in (proof, used)} == before


@pytest.mark.parametrize("verb", ["lower", "derive", "draw"])
def test_an_unusable_output_place_is_a_usage_error_before_work(verb: str, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    proof = _copy_proof(tmp_path)
    argv = {"lower": ["lower", str(proof), "tiled_matmul"], "draw": ["draw", str(proof), "tiled_matmul"],
            "derive": ["derive", str(tmp_path / "examples" / "matmul.ncd"), "matmul", "--size=a=64", "--size=b=64",
                       "--size=c=64"]}[verb]
    suffix = {"lower": ".py", "draw": ".svg", "derive": ".ncd"}[verb]
    (tmp_path / f"folder{suffix}").mkdir()
    for out, message in ((tmp_path / f"folder{suffix}", "is a folder"),
                         (tmp_path / "missing" / f"x{suffix}", "no such folder for the output")):
        code, stdout, err = run(capsys, *argv, "-o", str(out))
        assert code == 2 and message in err and "Traceback" not in err, err
        assert "search stopped" not in stdout


def test_writes_are_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "k.py"
    out.write_text("old contents\n")
    outputs = files.Outputs()

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(files.OutputRefused, match="No space left on device"):
        outputs.write(out, "new contents\n")
    assert out.read_text() == "old contents\n" and sorted(p.name for p in tmp_path.iterdir()) == ["k.py"]
    monkeypatch.undo()
    outputs.write(out, "new contents\n")
    assert out.read_text() == "new contents\n" and sorted(p.name for p in tmp_path.iterdir()) == ["k.py"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_an_unwritable_folder_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(files.OutputRefused, match="permission denied"):
        files.Outputs().check(locked / "x.py")


# ---- generated code -------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["len", "zip", "dict", "any", "max", "jax", "jnp", "range"])
def test_a_theorem_named_like_a_builtin_or_module_lowers_and_runs(name: str, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    proof = tmp_path / "p.ncd"
    proof.write_text(f"axis i, j\ndiagram d(len: [i j], zip: [j]) -> [i] {{\n  dict = contract[j](len, zip)\n"
                     f"  return dict\n}}\ntheorem {name}: d {{\n  group i by gi\n}}\n")
    out = tmp_path / "k.py"
    code, stdout, err = run(capsys, "lower", str(proof), name, "--target", "jax", "--tile", "gi=2", "-o", str(out))
    assert code == 0, err
    emitted = stdout.split("function `")[1].split("`")[0]
    assert emitted == f"{name}_2" and f"\ndef {emitted}(" in out.read_text()
    namespace: dict[str, object] = {}
    exec(compile(out.read_text(), str(out), "exec"), namespace)
    a, b = np.arange(12.0).reshape(3, 4), np.arange(4.0)
    assert np.allclose(np.asarray(namespace[emitted](a, b)), a @ b)  # type: ignore[operator]


def test_a_kernel_refuses_complex_and_integer_inputs() -> None:
    from napkin_cat import proof
    from napkin_cat.lower import lower

    fn = lower(proof.theorem(MATMUL_PROOF, "tiled_matmul"), target="jax", tiles={"ga": 2, "gc": 2, "sb": 2}).fn
    with pytest.raises(TypeError, match="holds complex128 values"):
        fn(np.ones((2, 2), complex), np.ones((2, 2)))
    with pytest.raises(TypeError, match="holds int64 values"):
        fn(np.ones((2, 2)), np.ones((2, 2), np.int64))


# ---- what users expect ----------------------------------------------------------------------

def test_version_and_module_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    import napkin_cat

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out == f"napkin {napkin_cat.__version__}\n"
    ran = subprocess.run([sys.executable, "-m", "napkin_cat", "parse", ATTENTION], capture_output=True, text=True)
    assert ran.returncode == 0 and "diagram attention(" in ran.stdout


def test_lemmas_lists_lemmas_and_accumulators(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "lemmas")
    assert code == 0
    assert "lemma softmax_contract(S: [x], V: [x]) : contract[x](softmax[x](S), V) = ncontract[x; exp, exp, id](S, V)" \
        "  (proved)" in out.splitlines()
    assert "accumulator online_softmax for ncontract[x; exp, exp, id] streaming x (proved):" in out
    code, out, _ = run(capsys, "lemmas", "--json")
    listed = json.loads(out)
    from napkin_cat.certify import rules

    assert {e["name"] for e in listed if e["kind"] == "lemma"} == set(rules.library())
    assert {"sum", "online_softmax", "min", "prod"} <= {e["name"] for e in listed if e["kind"] == "accumulator"}
    # issue 11: every shipped lemma and accumulator is proved for all sizes, none only tested
    assert [e["name"] for e in listed if e["trust"] != "proved"] == []
    assert run(capsys, "lemmas", "nope")[0] == 2


def test_a_reader_that_closes_the_pipe_early_gets_no_traceback() -> None:
    """`napkin lemmas | head -1`: the rest of the output has nowhere to go; exit 141 quietly.
    (The reader here closes before the first write, so the write fails whatever the pipe holds.)"""
    with subprocess.Popen([sys.executable, "-m", "napkin_cat", "lemmas"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        err = proc.stderr.read().decode()
        assert proc.wait(timeout=120) == 141 and "Traceback" not in err, err


def test_check_json_and_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.ncd"
    bad.write_text('use "' + str(ROOT / "examples" / "matmul.ncd") + '"\ntheorem t: matmul {\n  group b by gb\n}\n')
    code, out, err = run(capsys, "check", "--json", MATMUL_PROOF, str(bad))
    report = json.loads(out)
    assert code == 1 and err == "" and report["ok"] is False and report["refused"] == 1
    oks = [r["ok"] for r in report["results"]]
    assert oks == [True] * (len(oks) - 1) + [False] and report["theorems"] == len(oks)
    assert "group" in report["results"][-1]["error"]
    code, out, err = run(capsys, "check", "-q", MATMUL_PROOF, str(bad))
    assert code == 1 and out == f"{len(oks) - 1} of {len(oks)} theorems checked, 1 refused\n" and "error" in err


def test_every_argument_has_help_and_defaults_are_shown() -> None:
    parser = cli._parser()
    for name, sub in parser._subparsers._group_actions[0].choices.items():
        for action in sub._actions:
            assert action.help, (name, action.dest)
        text = sub.format_help()
        for action in sub._actions:
            if action.default not in (None, False, "==SUPPRESS==") and not action.required:
                assert f"(default: {action.default})" in " ".join(text.split()), (name, action.dest)


def test_repository_files_users_expect() -> None:
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "shared/" not in readme and "](../" not in readme  # `use "../examples/..."` is inside the repository
    assert "-m \"not slow\"" in readme and "130" in readme


def test_a_cost_table_with_more_columns_than_the_picture_keeps_its_totals(monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression (the long verb fuzz run): a theorem whose unfolded program had more columns
    than its picture raised IndexError in draw_cost.crowded."""
    from napkin_cat import draw, proof
    from napkin_cat.draw.cost import CostTable

    thm = proof.theorem(MATMUL_PROOF, "tiled_matmul")
    monkeypatch.setattr(draw, "cost_table", lambda theorem: CostTable((("M smem", {0: "1", 99: "2"}),), ("total",)))
    svg = draw.draw_svg(thm)
    assert "per-column costs omitted" in svg and "total" in svg


# ---- issue 33: one rule for reads, special files never replaced, all-or-nothing outputs ------

#: every verb that reads a file, with FILE for the file and OUT for an output in the same folder
READING_VERBS = {
    "parse": ["parse", "FILE"], "check": ["check", "FILE"], "eval": ["eval", "FILE", "f"],
    "cost": ["cost", "FILE", "t"], "pseudo": ["pseudo", "FILE", "t"], "lower": ["lower", "FILE", "t", "-o", "OUT.py"],
    "draw": ["draw", "FILE", "f", "-o", "OUT.svg"], "grad": ["grad", "FILE", "f", "-o", "OUT.ncd"],
    "derive": ["derive", "FILE", "f", "-o", "OUT.ncd"],
}


def _argv(verb: str, file: Path, out_folder: Path) -> list[str]:
    return [str(file) if a == "FILE" else str(out_folder / a[3:]) if a.startswith("OUT") else a
            for a in READING_VERBS[verb]]


@pytest.mark.parametrize("verb", sorted(READING_VERBS))
def test_no_verb_shows_a_file_that_is_not_ncd(verb: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The file named, a `.ncd` link to it, a folder holding that link and a file that `use`s
    it: each is refused in one line and no byte of the file is printed or written."""
    secret = tmp_path / "environ.txt"
    secret.write_text(SECRET + "\naxis q\n")
    (tmp_path / "leak.ncd").symlink_to(secret)
    user = tmp_path / "user.ncd"
    user.write_text('use "leak.ncd"\naxis i\ndiagram f(X: [i]) -> [i] { return X }\ntheorem t: f {}\n')
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "member.ncd").symlink_to(secret)
    outs = tmp_path / "outs"
    outs.mkdir()
    cases = [(secret, f"cannot read {secret}: not an .ncd file"),
             (tmp_path / "leak.ncd", f"not an .ncd file (it leads to {secret})"),
             (user, f"not an .ncd file (it leads to {secret})")]
    if verb == "check":
        cases.append((folder, f"not an .ncd file (it leads to {secret})"))
    for file, reason in cases:
        code, out, err = run(capsys, *_argv(verb, file, outs))
        assert code == 1 and "s3cr3t" not in out + err and "Traceback" not in err, (file, out, err)
        assert reason in err and len(err.splitlines()) == (3 if file == user else 1), (file, err)
        assert list(outs.iterdir()) == []


def test_check_of_a_folder_never_prints_the_environment(tmp_path: Path) -> None:
    """The reported leak: a `*.ncd` link to /proc/self/environ in a folder given to `check`."""
    (tmp_path / "env.ncd").symlink_to("/proc/self/environ")
    (tmp_path / "ok.ncd").write_text("axis q\n")
    ran = subprocess.run([sys.executable, "-m", "napkin_cat", "check", str(tmp_path)], capture_output=True,
                         text=True, env={**os.environ, "NAPKIN_PLANTED": "s3cr3t-value"}, timeout=300)
    assert ran.returncode == 1 and "s3cr3t-value" not in ran.stdout + ran.stderr
    assert "/environ); napkin reads only .ncd files" in ran.stderr and "1 file(s) with errors" in ran.stdout


def test_a_device_node_named_ncd_is_not_read(tmp_path: Path) -> None:
    node = tmp_path / "zero.ncd"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero's numbers
    except PermissionError:
        pytest.skip("creating a device node needs root")
    with pytest.raises(files.FileRefused, match=r"not a regular file \(a character device\)"):
        files.read_source(node)


def test_check_reads_a_folders_ncd_entries_once_without_entering_links(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.ncd").write_text("axis x\n")
    (tmp_path / "b.ncd").write_text("axis b\n")
    (tmp_path / "notes.txt").write_text("not read\n")
    (tmp_path / "dir.ncd").mkdir()  # a folder named like a source is entered, not read
    (tmp_path / "dir.ncd" / "y.ncd").write_text("axis y\n")
    (tmp_path / "loop").symlink_to(tmp_path)  # a link to a folder is not entered
    (tmp_path / "link.ncd").symlink_to(tmp_path / "a")  # a .ncd link is a member: the read rule refuses it
    found = files.source_paths([tmp_path])
    assert [p.relative_to(tmp_path).as_posix() for p in found] == ["a/x.ncd", "b.ncd", "dir.ncd/y.ncd", "link.ncd"]
    with pytest.raises(files.FileRefused, match=r"not an \.ncd file"):
        files.read_source(tmp_path / "link.ncd")
    with pytest.raises(files.FileRefused, match="no such file or folder"):
        files.source_paths([tmp_path / "absent"])
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not read\n")
    with pytest.raises(files.FileRefused, match=r"a folder with no \.ncd files"):  # `check` said 0 of 0, exit 0
        files.source_paths([tmp_path / "empty"])


def _special_outputs(folder: Path) -> dict[str, Path]:
    """A FIFO, a copy of /dev/null's device node (as root), and links to each, to nothing and
    to a folder: every kind of output napkin must refuse and leave as it was."""
    made = {"fifo": folder / "fifo", "link to fifo": folder / "to_fifo", "dangling link": folder / "dangling",
            "link to folder": folder / "to_folder"}
    os.mkfifo(made["fifo"])
    made["link to fifo"].symlink_to("fifo")
    made["dangling link"].symlink_to("nowhere")
    made["link to folder"].symlink_to(folder)
    with contextlib.suppress(PermissionError):
        os.mknod(folder / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        made["device"] = folder / "null"
        (folder / "to_null").symlink_to("null")
        made["link to device"] = folder / "to_null"
    return made


def _state(folder: Path) -> dict[str, tuple[int, int, str]]:
    return {p.name: (os.lstat(p).st_mode, os.lstat(p).st_rdev, os.readlink(p) if p.is_symlink() else "")
            for p in folder.iterdir()}


@pytest.mark.parametrize("verb", ["lower", "grad", "draw", "derive"])
def test_special_files_given_to_o_are_left_as_they_were(verb: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    proof = _copy_proof(tmp_path)
    argv = {"lower": ["lower", str(proof), "tiled_matmul", "--target", "jax"],
            "grad": ["grad", str(tmp_path / "examples" / "matmul.ncd"), "matmul"],
            "draw": ["draw", str(proof), "tiled_matmul"],
            "derive": ["derive", str(tmp_path / "examples" / "matmul.ncd"), "matmul", "--size=a=8", "--size=b=8",
                       "--size=c=8"]}[verb]
    suffix = {"lower": ".py", "grad": ".ncd", "draw": ".svg", "derive": ".ncd"}[verb]
    folder = tmp_path / "outs"
    folder.mkdir()
    made = _special_outputs(folder)
    before = _state(folder)
    for kind, target in made.items():
        named = target.with_name(target.name + suffix)
        os.rename(target, named)
        code, out, err = run(capsys, *argv, "-o", str(named))
        os.rename(named, target)
        assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, (kind, err)
        assert "search stopped" not in out
    assert _state(folder) == before, "an output replaced a special file or left a temporary one"
    if verb == "derive":  # a link to a regular file is written through (lower, grad and draw alike)
        real = folder / "real.ncd"
        real.write_text("old\n")
        (folder / "link.ncd").symlink_to("real.ncd")
        code, _, err = run(capsys, *argv, "--budget", "3", "-o", str(folder / "link.ncd"))
        assert code == 0, err
        assert os.readlink(folder / "link.ncd") == "real.ncd" and real.read_text().startswith("# Derived by")
        assert run(capsys, "check", str(folder / "link.ncd"))[0] == 0  # its `use` is relative to real.ncd's folder


def test_a_link_to_a_regular_file_is_written_through(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "elsewhere").mkdir()
    real = tmp_path / "elsewhere" / "real.ncd"
    real.write_text("old\n")
    real.chmod(0o640)
    link = tmp_path / "link.ncd"
    link.symlink_to(real)
    code, _, err = run(capsys, "grad", ATTENTION, "attention", "-o", str(link))
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(real) and "attention_vjp" in real.read_text()
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert sorted(p.name for p in (tmp_path / "elsewhere").iterdir()) == ["real.ncd"]


def test_an_interrupted_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C as a KeyboardInterrupt raised inside the write, and as a real SIGINT while it is
    under way: no output, no temporary file, the old contents kept; the CLI exits 130."""
    old = tmp_path / "a.py"
    old.write_text("old\n")
    fsync = os.fsync
    calls: list[int] = []

    def interrupt_second(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            raise KeyboardInterrupt
        fsync(fd)

    monkeypatch.setattr(os, "fsync", interrupt_second)
    with pytest.raises(KeyboardInterrupt):
        files.Outputs().write_all([(old, "new\n"), (tmp_path / "b.py", "new\n")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py"] and old.read_text() == "old\n"

    def signal_then_sync(fd: int) -> None:
        os.kill(os.getpid(), signal.SIGINT)  # held until the staged files are whole, then nothing is renamed
        fsync(fd)

    monkeypatch.setattr(os, "fsync", signal_then_sync)
    with pytest.raises(KeyboardInterrupt):
        files.Outputs().write_all([(old, "new\n"), (tmp_path / "b.py", "new\n")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py"] and old.read_text() == "old\n"
    code, out, err = run(capsys, "grad", ATTENTION, "attention", "-o", str(tmp_path / "g.ncd"))
    assert code == 130 and err == "napkin grad: interrupted\n" and out == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.py"]
    monkeypatch.undo()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is restored


def test_the_ctrl_c_hold_is_undone_when_another_signal_interrupts_its_undoing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt from another signal's handler (an alarm, as the verb fuzzer raises them)
    landing as the hold restored Python's Ctrl-C handler left the hold's handler installed, and every
    later Ctrl-C in the process was swallowed (a write test then saw no KeyboardInterrupt)."""
    real = signal.signal
    landed: list[object] = []

    def interrupted_once(signum: int, handler: Any) -> Any:
        if handler is signal.default_int_handler and not landed:
            landed.append(handler)
            raise KeyboardInterrupt  # as if an alarm's handler ran just here
        return real(signum, handler)

    monkeypatch.setattr(files.signal, "signal", interrupted_once)
    with pytest.raises(KeyboardInterrupt), files._interrupts_held():
        pass
    assert landed and signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_derive_lower_that_fails_writes_neither_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from napkin_cat import lower as lowering
    from napkin_cat.diagnostics import error

    def refuse(*args: object, **kwargs: object) -> None:
        raise NapkinError(error("lower.streams", None, axes="a, b"))

    monkeypatch.setattr(lowering, "lower", refuse)  # the lowering `derive --lower` imports when it runs
    out = tmp_path / "d.ncd"
    code, stdout, err = run(capsys, "derive", str(ROOT / "examples" / "matmul.ncd"), "matmul", "--size=a=8",
                            "--size=b=8", "--size=c=8", "--budget", "3", "--lower", "jax", "-o", str(out))
    assert code == 1 and "this schedule streams a, b" in err and "wrote" not in stdout
    assert list(tmp_path.iterdir()) == []


def test_draw_steps_writes_all_pictures_or_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    code, _, err = run(capsys, "draw", MATMUL_PROOF, "tiled_matmul", "--steps", "-o", str(tmp_path / "strip"))
    assert code == 2 and "No space left on device" in err and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("verb", ["lower", "grad", "draw", "derive"])
def test_an_output_name_too_long_is_a_usage_error(verb: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    long = str(tmp_path / ("x" * 300))
    argv = {"lower": ["lower", MATMUL_PROOF, "tiled_matmul", "-o", long + ".py"],
            "grad": ["grad", ATTENTION, "attention", "-o", long + ".ncd"],
            "draw": ["draw", MATMUL_PROOF, "tiled_matmul", "-o", long + ".svg"],
            "derive": ["derive", str(ROOT / "examples" / "matmul.ncd"), "matmul", "--size=a=8", "--size=b=8",
                       "--size=c=8", "-o", long + ".ncd"]}[verb]
    code, out, err = run(capsys, *argv)
    assert code == 2 and err.endswith(": File name too long\n") and len(err.splitlines()) == 1, err
    assert out == "" and list(tmp_path.iterdir()) == []
    code, _, err = run(capsys, "draw", MATMUL_PROOF, "tiled_matmul", "--steps", "-o", long)
    assert code == 2 and err.endswith(": File name too long\n")
    code, _, err = run(capsys, "check", long + ".ncd")
    assert code == 2 and err.endswith(": File name too long\n")


# ---- issue 33: `use` loads each file once, without recursion ---------------------------------

def test_a_use_dag_loads_each_file_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """18 levels of two files, each using both files of the next: 2^17 paths, 35 files. Loading once
    per path took 68 s; counting the reads is the check (a wall-clock bound varied with the machine)."""
    from napkin_cat import elaborate

    levels = 18
    for level in range(levels):
        for side in "ab":
            uses = "".join(f'use "l{level + 1}{s}.ncd"\n' for s in "ab") if level + 1 < levels else ""
            (tmp_path / f"l{level}{side}.ncd").write_text(f"{uses}axis x{level}{side}\n")
    reads: list[Path] = []
    real = elaborate.read_source
    monkeypatch.setattr(elaborate, "read_source", lambda path: reads.append(Path(path)) or real(path))
    module = load(tmp_path / "l0a.ncd")
    assert len(reads) == len(set(reads)) == 1 + 2 * (levels - 1)
    assert {a.name for a in module.scope_axes} == {"x0a"} | {f"x{k}{s}" for k in range(1, levels) for s in "ab"}


def test_a_use_chain_340_deep_loads_and_a_cycle_is_located(tmp_path: Path) -> None:
    depth = 340
    for k in range(depth):
        (tmp_path / f"c{k}.ncd").write_text((f'use "c{k + 1}.ncd"\n' if k + 1 < depth else "") + f"axis a{k}\n")
    assert len(load(tmp_path / "c0.ncd").scope_axes) == depth
    (tmp_path / f"c{depth - 1}.ncd").write_text('use "c0.ncd"\naxis last\n')
    with pytest.raises(NapkinError) as info:
        load(tmp_path / "c0.ncd")
    (cycle,) = info.value.diagnostics
    assert cycle.code == "use.cycle" and cycle.span is not None and cycle.span.file.endswith(f"c{depth - 1}.ncd")
    assert cycle.message.startswith("`use` cycle: c0.ncd -> c1.ncd -> ") and cycle.span.line == 1


def test_a_file_used_along_two_paths_reports_its_error_once(tmp_path: Path) -> None:
    (tmp_path / "a.ncd").write_text('use "c.ncd"\naxis a\n')
    (tmp_path / "b.ncd").write_text('use "c.ncd"\naxis b\n')
    (tmp_path / "c.ncd").write_text("axis c = 0\n")
    (tmp_path / "main.ncd").write_text('use "a.ncd"\nuse "b.ncd"\n')
    with pytest.raises(NapkinError) as info:
        load(tmp_path / "main.ncd")
    assert info.value.codes == ("axis.bad_size",)


# ---- issue 33: line endings -------------------------------------------------------------------

@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_every_line_ending_gives_a_located_error(newline: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Old-Mac CR-only files were one comment: `check` said 0 of 0 and exited 0."""
    bad = tmp_path / "bad.ncd"
    bad.write_bytes(newline.join(["# a broken file", "axis i", "diagram f(X: [i]) -> [i] {", "  return Y", "}",
                                  "theorem t: f {}", ""]).encode())
    code, out, err = run(capsys, "check", str(bad))
    assert code == 1 and "0 of 0 theorems checked; 1 file(s) with errors" in out
    assert err.splitlines()[:3] == [f"{bad}:4:10: error: unknown name `Y`", "    return Y", "           ^"]
    bad.write_bytes(newline.join(["# fine", "axis i", "diagram f(X: [i]) -> [i] { return X }", "theorem t: f {}",
                                  ""]).encode())
    assert run(capsys, "check", str(bad))[:2] == (0, f"{bad}: t ≡: no steps  (trust: refl)\n"
                                                     "1 of 1 theorems checked\n")


#: every character `str.splitlines` breaks at besides \n and \r: none ends a line of .ncd
OTHER_BREAKS = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("char", OTHER_BREAKS, ids=lambda c: f"U+{ord(c):04X}")
def test_parser_and_renderer_count_lines_alike(char: str, tmp_path: Path) -> None:
    assert len(f"a{char}b".splitlines()) == 2
    bad = tmp_path / "bad.ncd"
    bad.write_text(f"# a{char}comment\naxis i\ndiagram f(X: [i]) -> [i] {{\n  return Y\n}}\n", encoding="utf-8")
    with pytest.raises(NapkinError) as info:
        load(bad)
    (diag,) = info.value.diagnostics
    if HIDDEN.match(char):  # an editor may show it as a line break: refused, even in a comment
        assert diag.code == "syntax.hidden_char" and render(diag).splitlines()[0].startswith(f"{bad}:1:4: error:")
    else:
        assert render(diag).splitlines() == [f"{bad}:4:10: error: unknown name `Y`", "    return Y", "           ^"]
    # on the line quoted, it is shown as one visible column, so the quote stays one line
    bad.write_text(f"axis i\ndiagram f(X: [i]) -> [i] {{ return X{char} + Y }}\n", encoding="utf-8")
    with pytest.raises(NapkinError) as info:
        load(bad)
    (diag,) = info.value.diagnostics
    assert diag.span is not None and diag.span.line == 2
    lines = render(diag).splitlines()
    assert len(lines) == 3 and lines[1] == "  diagram f(X: [i]) -> [i] { return X\ufffd + Y }"
    caret = lines[2].index("^")  # under the unknown `Y`, or under the character where it is not whitespace
    assert caret == 2 + diag.span.col - 1 and lines[1][caret] == ("Y" if diag.code == "name.unknown" else "\ufffd")


# ---- issue 33: grad output always parses -------------------------------------------------------

def test_grad_of_a_diagram_without_inputs_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "c.ncd"
    source.write_text("axis i = 4\ndiagram c() -> [i] { return onehot[i](2) }\n")
    code, out, err = run(capsys, "grad", str(source), "c", "-o", str(tmp_path / "c_vjp.ncd"))
    assert code == 1 and out == "" and sorted(p.name for p in tmp_path.iterdir()) == ["c.ncd"]
    assert err.splitlines()[0] == f"{source}:2:1: error: `c` has no inputs: its vector-Jacobian product would have " \
        "no outputs, and a diagram returns at least one (there is nothing to differentiate)"


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.ncd")), ids=lambda p: p.stem)
def test_grad_output_of_every_example_diagram_parses(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    module = load(path)
    assert module.diagrams
    for diagram in module.diagrams:
        code, out, err = run(capsys, "grad", str(path), diagram.name)
        assert code == 0, err
        assert loads(out).diagram(f"{diagram.name}_vjp").inputs[0].name == diagram.inputs[0].name
