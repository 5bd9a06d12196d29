"""Regression tests of issue 33 (hardening, round 2) outside file reading and writing: the
same mistake gets the same exit code and message in every verb, hardware profiles given as
files are checked (tests/test_hardware.py holds the schema's table), `--mesh` is bounded and
its ring is computed, a constant output under a schedule costs and lowers, a full disk on
stdout is one line and exit 74, and Ctrl-C at any moment after napkin's code starts is exit
130 and one line."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import pytest

from napkin_cat import cli
from napkin_cat.cli import main
from napkin_cat.terms import MAX_MESH_DEVICES

ROOT = Path(__file__).resolve().parent.parent
MATMUL = str(ROOT / "examples" / "matmul.ncd")
MATMUL_PROOF = str(ROOT / "proofs" / "matmul.ncd")
RING = str(ROOT / "proofs" / "ring_attention.ncd")
H100 = resources.files("napkin_cat.cost.hardware").joinpath("h100.toml").read_text(encoding="utf-8")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _verbs(tmp_path: Path) -> dict[str, list[str]]:
    """Every verb that takes --hardware, on the matmul proof or diagram."""
    return {"cost": ["cost", MATMUL_PROOF, "tiled_matmul"], "pseudo": ["pseudo", MATMUL_PROOF, "tiled_matmul"],
            "lower": ["lower", MATMUL_PROOF, "tiled_matmul", "--target", "jax", "-o", str(tmp_path / "k.py")],
            "derive": ["derive", MATMUL, "matmul", "--size", "i=64", "--size", "j=64", "--size", "k=64",
                       "--budget", "3", "-o", str(tmp_path / "d.ncd")]}


# ---- --hardware: a name or a .toml file, the same outcome in every verb ------------------------

@pytest.mark.parametrize("verb", ["cost", "pseudo", "lower", "derive"])
def test_a_malformed_profile_file_is_one_located_line_and_exit_1_in_every_verb(verb: str, tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture[str]
                                                                               ) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text(H100.replace("bandwidth = 3.35e12", "bandwidth = inf"))
    code, out, err = run(capsys, *_verbs(tmp_path)[verb], "--hardware", str(broken))
    assert code == 1 and out == "", err
    assert err == f"error: hardware profile {broken}: `levels.hbm.bandwidth` must be a finite positive number, " \
                  "not inf\n"
    assert not (tmp_path / "k.py").exists() and not (tmp_path / "d.ncd").exists()


@pytest.mark.parametrize("verb", ["cost", "pseudo", "lower", "derive"])
def test_an_unknown_profile_or_a_missing_file_is_a_usage_error_in_every_verb(verb: str, tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]
                                                                             ) -> None:
    for hardware, message in (("tpu9", "no hardware profile `tpu9` (profiles: a100, cpu, h100, h200; or the path "
                                       "of a .toml profile file)"),
                              (str(tmp_path / "none.toml"), f"no such file: {tmp_path / 'none.toml'}")):
        code, out, err = run(capsys, *_verbs(tmp_path)[verb], "--hardware", hardware)
        assert code == 2 and out == "" and err == f"napkin {verb}: error: {message}\n", err


def test_a_profile_file_prices_as_the_shipped_profile_does(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text(H100)
    shipped = run(capsys, "cost", MATMUL_PROOF, "tiled_matmul", "--json")
    given = run(capsys, "cost", MATMUL_PROOF, "tiled_matmul", "--json", "--hardware", str(mine))
    assert shipped[0] == given[0] == 0
    assert given[1].replace(f'"hardware": "{mine}"', '"hardware": "h100"') == shipped[1]


# ---- --mesh: bounded, the same in lower and cost; the ring is computed ----------------------------

@pytest.mark.parametrize("value", ["0", "-1", str(MAX_MESH_DEVICES + 1), "1000000", "x"])
def test_a_bad_mesh_is_the_same_usage_error_in_lower_and_cost(value: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    errors = []
    for argv in (["lower", RING, "ring_attention", "--target", "jax", "-o", str(tmp_path / "k.py")],
                 ["cost", RING, "ring_attention"]):
        code, out, err = run(capsys, *argv, "--mesh", value)
        assert code == 2 and out == "", err
        errors.append(err.splitlines()[-1].split(": error: ", 1)[1])
    assert errors[0] == errors[1]
    assert errors[0].startswith("argument --mesh: expected an integer")
    assert not (tmp_path / "k.py").exists()


def test_the_largest_mesh_lowers_at_once_with_the_ring_computed(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`--mesh 1000000` took 87 s and 6.8 GB with the ring's permutation spelled out; the bound
    is 2^16 and the code's size does not depend on it."""
    sizes = []
    for devices in (8, MAX_MESH_DEVICES):
        out = tmp_path / f"ring{devices}.py"
        code, _, err = run(capsys, "lower", RING, "ring_attention", "--target", "jax", "--mesh", str(devices),
                           "-o", str(out))
        assert code == 0, err
        text = out.read_text()
        assert re.search(rf"ring_perm = \[\((j\w*), \(\1 \+ 1\) % {devices}\) for \1 in range\({devices}\)\]", text)
        sizes.append(len(text) - 2 * text.count(str(devices)) * len(str(devices)))
    assert abs(sizes[0] - sizes[1]) < 200  # the same code, only the count differs
    code, out_text, _ = run(capsys, "cost", RING, "ring_attention", "--mesh", str(MAX_MESH_DEVICES))
    assert code == 0 and f"mesh: {MAX_MESH_DEVICES} devices" in out_text


# ---- one exit code per mistake, whatever the verb ------------------------------------------------

@pytest.mark.parametrize(("option", "verbs"), [
    (["--size", "q"], ["eval", "cost", "pseudo", "derive"]),
    (["--size", "q=0"], ["eval", "cost", "pseudo", "derive"]),
    (["--size", "nope=4"], ["eval", "cost", "pseudo", "derive"]),
    (["--dtype", "int3"], ["lower", "cost", "pseudo", "derive"]),
    (["--hardware", "tpu9"], ["lower", "cost", "pseudo", "derive"]),
    (["--stages", "0"], ["cost", "pseudo"]),
    (["--tile", "gq"], ["lower"]),
    (["--tile", "nope=16"], ["lower"]),
    (["--seed", "-1"], ["eval"]),
    (["--budget", "0"], ["derive"]),
    (["--seconds", "inf"], ["derive"]),
    (["--max-rewrites", "-1"], ["derive"]),
    (["--mesh", "0"], ["lower", "cost"]),
])
def test_every_bad_option_is_a_usage_error_in_every_verb_that_takes_it(option: list[str], verbs: list[str],
                                                                      tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    attention = str(ROOT / "proofs" / "flash_attention.ncd")
    argv = {"eval": ["eval", str(ROOT / "examples" / "attention.ncd"), "attention", "--size", "q=4", "--size", "x=4"],
            "cost": ["cost", attention, "flash_attention"], "pseudo": ["pseudo", attention, "flash_attention"],
            "lower": ["lower", attention, "flash_attention", "--target", "jax", "-o", str(tmp_path / "k.py")],
            "derive": ["derive", str(ROOT / "examples" / "attention.ncd"), "attention", "--size", "q=64",
                       "--size", "x=64", "--budget", "2", "-o", str(tmp_path / "d.ncd")]}
    for verb in verbs:
        code, out, err = run(capsys, *argv[verb], *option)
        assert code == 2 and out == "" and f"napkin {verb}: error: " in err, (verb, err)
    assert not (tmp_path / "k.py").exists() and not (tmp_path / "d.ncd").exists()


# ---- a constant binding returned from a scheduled diagram (KeyError in schedule/build.py) ---------

def test_a_constant_output_under_a_stream_costs_and_lowers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    source = tmp_path / "constant.ncd"
    source.write_text("axis i\ndiagram f(X: [i]) -> [i], [] {\n  C = 2\n  Y = X * C\n  return Y, C\n}\n"
                      "theorem t: f {\n  stream i by 16 pad\n}\n")
    for verb in ("cost", "pseudo"):
        code, out, err = run(capsys, verb, str(source), "t")
        assert code == 0 and err == "" and out, err
    assert "compulsory traffic (M -> oo): 2*i + 1" in run(capsys, "cost", str(source), "t")[1]
    from napkin_cat.lower import lower
    from napkin_cat.proof import theorem

    for target in ("jax", "pallas"):
        fn = lower(theorem(source, "t"), target=target, dtype="f32").fn
        y, c = fn(np.arange(20.0, dtype=np.float32))
        np.testing.assert_array_equal(np.asarray(y), 2 * np.arange(20.0))
        assert float(c) == 2.0


# ---- a full disk on stdout: one line, exit 74 ------------------------------------------------------

@pytest.mark.parametrize("argv", [["lemmas"], ["parse", MATMUL], ["--help"], ["check", MATMUL_PROOF]])
def test_stdout_on_a_full_device_is_one_line_and_exit_74(argv: list[str]) -> None:
    with open("/dev/full", "w") as full:
        ran = subprocess.run([sys.executable, "-m", "napkin_cat", *argv], stdout=full, stderr=subprocess.PIPE,
                             text=True, timeout=300)
    assert ran.returncode == cli.EXIT_IO == 74
    command = "napkin" if argv == ["--help"] else f"napkin {argv[0]}"
    assert ran.stderr == f"{command}: error: cannot write standard output: No space left on device\n"


def test_stdout_and_stderr_both_full_still_exit_74() -> None:
    with open("/dev/full", "w") as full:
        ran = subprocess.run([sys.executable, "-m", "napkin_cat", "parse", MATMUL], stdout=full, stderr=full,
                             timeout=300)
    assert ran.returncode == 74


def test_a_failing_stdout_in_process(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import errno

    class Full:
        def write(self, text: str) -> int:
            raise OSError(errno.EIO, "Input/output error")

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stdout", Full())
    assert main(["lemmas"]) == 74
    assert capsys.readouterr().err == "napkin lemmas: error: cannot write standard output: Input/output error\n"
    assert isinstance(sys.stdout, Full)  # restored


# ---- Ctrl-C at any moment: exit 130, one line -------------------------------------------------------

def test_ctrl_c_while_the_command_line_loads_exits_130() -> None:
    """The interrupt lands inside `from napkin_cat.cli import main` (forced here by an import hook)."""
    script = ("import sys\n"
              "class Hook:\n"
              "    def find_spec(self, name, path=None, target=None):\n"
              "        if name == 'napkin_cat.cli':\n"
              "            raise KeyboardInterrupt\n"
              "sys.meta_path.insert(0, Hook())\n"
              "from napkin_cat.__main__ import entry\n"
              "sys.exit(entry())\n")
    ran = subprocess.run([sys.executable, "-c", script, "lemmas"], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 130 and ran.stdout == "" and ran.stderr == "napkin: interrupted\n"


def test_importing_napkin_cat_loads_no_heavy_module() -> None:
    """The `napkin` entry point imports the package before its handler is installed: it must be quick."""
    ran = subprocess.run([sys.executable, "-c", "import sys, napkin_cat, napkin_cat.__main__; "
                          "print(sorted(m for m in ('numpy', 'sympy', 'lark', 'jax') if m in sys.modules))"],
                         capture_output=True, text=True, timeout=120)
    assert ran.stdout == "[]\n", ran.stderr


@pytest.mark.parametrize("delay", [0.3, 1.0, 2.5])
def test_a_real_sigint_at_any_moment_exits_130_with_one_line(delay: float) -> None:
    with subprocess.Popen([sys.executable, "-m", "napkin_cat", "cost", str(ROOT / "proofs" / "flash_attention.ncd"),
                           "flash_attention"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the command finished before the signal")
    assert proc.returncode == 130 and len(err.splitlines()) == 1 and err.endswith(": interrupted\n"), err


def test_a_sigint_after_the_command_ended_cannot_kill_the_process() -> None:
    """Python restores SIGINT's default action while it shuts down: a Ctrl-C landing after the
    command's work (CI saw one at 2.5 s) killed the process with status -2 and no message."""
    script = ("import os, signal, sys\n"
              "from napkin_cat.__main__ import entry\n"
              "code = entry()\n"
              "os.kill(os.getpid(), signal.SIGINT)\n"
              "sys.exit(code)\n")
    ran = subprocess.run([sys.executable, "-c", script, "lemmas"], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0 and ran.stderr == "" and "exp_mul" in ran.stdout, ran.stderr


def test_the_console_script_is_the_guarded_entry() -> None:
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"napkin": "napkin_cat.__main__:entry"}
