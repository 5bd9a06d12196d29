"""Fuzzing every verb of the command line as a user would run it (shared by tests/test_fuzz.py
and the bounded long run, benchmarks/fuzz_verbs.py).

An input is a module text (generated well-typed modules with a theorem whose steps partition
and place the diagram's own axes, or an example proof with a few token edits), written in one
of several encodings and line endings (UTF-8, with a BOM, UTF-16, latin-1, CR-only, CRLF, a NUL
byte, a character Python's ``splitlines`` breaks at), or a special file (a FIFO, a device node,
a folder, a symlink to a file that is not .ncd, a missing path).  Every verb runs with every
option (``OPTIONS``, checked against the parser by tests/test_fuzz.py), valid and invalid
values, outputs that are special files too, and hardware profiles that are shipped, unknown,
files, or malformed files (``malformed_profiles``).

``run`` runs one ``Invocation``: in-process through ``cli.main`` (under a time bound, and
perhaps interrupted by a KeyboardInterrupt after a random CPU time, as Ctrl-C would be), or as
a process (``python -m napkin_cat``) sent SIGINT at a random moment or with stdout on
/dev/full.  The promise, checked by ``Outcome.ok``: exit 0, 1 or 2 (130 when interrupted, 74
when stdout is full) within the bound, no traceback, one line for an interruption, and no
special file given as an output replaced.  A SIGINT that lands in Python's own start-up, before
napkin's first line runs, is counted apart (``Outcome.startup``): no code of napkin's can see it.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
import traceback
import types
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from hypothesis import strategies as st

from napkin_cat.cli import main
from napkin_cat.diagnostics import NapkinError
from napkin_cat.elaborate import loads
from tests.strategies import module_texts

ROOT = Path(__file__).resolve().parent.parent
PROOFS = {p.name: p.read_text() for p in (ROOT / "proofs").glob("*.ncd")}
VERBS = ("parse", "eval", "check", "cost", "pseudo", "lower", "derive", "grad", "draw", "lemmas")
#: every option of every verb that the fuzzer draws (tests/test_fuzz.py: the parser has no other)
OPTIONS: dict[str, frozenset[str]] = {
    "parse": frozenset(),
    "eval": frozenset({"--size", "--seed"}),
    "check": frozenset({"--certify", "--strict", "--json", "--quiet"}),
    "cost": frozenset({"--hardware", "--dtype", "--size", "--stages", "--live", "--json", "--mesh"}),
    "pseudo": frozenset({"--hardware", "--dtype", "--size", "--stages", "--live"}),
    "lower": frozenset({"--target", "--tile", "--dtype", "--hardware", "--mesh", "--backward", "--allow-tested-join",
                        "--strict", "--output"}),
    "derive": frozenset({"--hardware", "--dtype", "--size", "--output", "--lower", "--budget", "--seconds",
                         "--max-rewrites"}),
    "grad": frozenset({"--output"}),
    "draw": frozenset({"--output", "--expand", "--steps"}),
    "lemmas": frozenset({"--json"}),
}
#: seconds one verb run may take before the fuzzer calls it a hang (``--certify``: CERTIFY_BOUND)
TIME_BOUND = 60.0
CERTIFY_BOUND = 400.0
_TOKEN = re.compile(r"\s+|#[^\n]*|\w+|->|>=|<=|==|!=|\S")
_EDITS = ["group", "stream", "by", "pad", "at", "smem", "reg", "via", "online_softmax", "sum", "1", "3", "64",
          "0", "q", "x", "d", "b", "h", "gq", "sx", "}", "{", "\n", "place", "rewrite", "softmax_contract", "mesh"]
#: how an input's text is stored: Python's line breaks that are not ``\n`` included
ENCODINGS = ("utf-8-sig", "utf-16", "latin-1", "cr", "crlf", "nul",
             "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")
SPECIAL_INPUTS = ("fifo.ncd", "device.ncd", "folder.ncd", "link.ncd", "missing.ncd")
SPECIAL_OUTPUTS = ("fifo", "device", "folder", "link", "dangling")
#: values a malformed profile puts in place of a number, as TOML
_BAD_VALUES = ("0", "-1", "inf", "-inf", "nan", '"fast"', "[]", "true", "{ a = 1 }", "1" + "0" * 400, "1e400",
               "0.0", "-0.5", "1979-05-27")


@dataclass(frozen=True)
class Invocation:
    verb: str
    argv: tuple[str, ...]
    #: interrupt (in-process: CPU seconds; as a process: wall seconds), or None
    interrupt: float | None = None
    #: run as a process (``python -m napkin_cat``), with stdout on /dev/full if ``full``
    process: bool = False
    full: bool = False
    #: special files given as outputs, which must be left as they were
    guarded: tuple[str, ...] = ()

    def __str__(self) -> str:
        how = (" [process" + (", stdout /dev/full" if self.full else "") + "]") if self.process else ""
        sig = f" [SIGINT after {self.interrupt:.2f} s]" if self.interrupt is not None else ""
        return f"napkin {self.verb} {' '.join(self.argv)}{how}{sig}"


@dataclass(frozen=True)
class Outcome:
    invocation: Invocation
    code: int | None  # None: an exception escaped or the bound passed (``error`` says which)
    error: str = ""
    #: a SIGINT that arrived in Python's start-up, before napkin's code ran
    startup: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.error and self.code is not None


class _TooSlow(BaseException):
    """Raised by the alarm; a BaseException so that no `except Exception` in napkin swallows it."""


@contextlib.contextmanager
def _bound(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: object) -> None:
        raise _TooSlow

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextlib.contextmanager
def _interrupt(cpu_seconds: float | None) -> Iterator[None]:
    """A KeyboardInterrupt after ``cpu_seconds`` of this process's CPU time, as Ctrl-C raises it."""
    if cpu_seconds is None:
        yield
        return

    def fire(signum: int, frame: types.FrameType | None) -> None:
        if frame is not None and "hypothesis" in frame.f_code.co_filename:
            signal.setitimer(signal.ITIMER_VIRTUAL, 1e-3)  # the harness's own code (a gc callback): a moment later
            return
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGVTALRM, fire)
    signal.setitimer(signal.ITIMER_VIRTUAL, max(cpu_seconds, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)


def _bound_of(invocation: Invocation) -> float:
    return CERTIFY_BOUND if "--certify" in invocation.argv else TIME_BOUND


def _exit_codes(invocation: Invocation) -> set[int]:
    codes = {0, 1, 2}
    if invocation.interrupt is not None:
        codes.add(130)
    if invocation.full:
        codes.add(74)
    return codes


def _replaced(invocation: Invocation, kinds: dict[str, int]) -> str:
    """Which guarded output is no longer the special file it was."""
    changed = []
    for path in invocation.guarded:
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            mode = 0
        if stat.S_IFMT(mode) != kinds[path]:
            changed.append(path)
    return f"special output replaced: {', '.join(changed)}" if changed else ""


def _kinds(invocation: Invocation) -> dict[str, int]:
    return {p: stat.S_IFMT(os.lstat(p).st_mode) for p in invocation.guarded}


def run(invocation: Invocation) -> Outcome:
    """Run one invocation (module docstring); never raises."""
    kinds = _kinds(invocation)
    start = time.monotonic()
    outcome = _process(invocation) if invocation.process else _in_process(invocation)
    seconds = time.monotonic() - start
    replaced = _replaced(invocation, kinds)
    if replaced:  # made again, so that later runs meet the special files too
        for path in invocation.guarded:
            _special_output(Path(path))
    return Outcome(invocation, outcome.code, outcome.error or replaced, outcome.startup, seconds)


def run_verb(verb: str, argv: list[str], seconds: float = TIME_BOUND) -> Outcome:
    """``napkin VERB ARGV`` in-process, its output discarded, under a bound of ``seconds``."""
    return _in_process(Invocation(verb, tuple(argv)), seconds)


def _in_process(invocation: Invocation, seconds: float | None = None) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    before = signal.getsignal(signal.SIGINT)  # Python's Ctrl-C handler, or what the process was started with
    returned = False
    try:
        with _bound(seconds or _bound_of(invocation)), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            try:
                with _interrupt(invocation.interrupt):
                    code = main([invocation.verb, *invocation.argv])
                    returned = True
            except SystemExit as exc:  # argparse: a usage error (or --help)
                code = exc.code if isinstance(exc.code, int) else 2
            except KeyboardInterrupt:
                if not returned:
                    raise
    except _TooSlow:
        found = Outcome(invocation, None, f"took longer than {seconds or _bound_of(invocation)} s")
    except BaseException:  # anything else escaping is what the fuzzer looks for
        found = Outcome(invocation, None, traceback.format_exc())
    else:
        found = Outcome(invocation, code, _judge(invocation, code, err.getvalue()))
    if before is not None and signal.getsignal(signal.SIGINT) is not before:  # every later Ctrl-C would be lost
        signal.signal(signal.SIGINT, before)
        return replace(found, error=f"Ctrl-C's handler left replaced\n{found.error}")
    return found


def _judge(invocation: Invocation, code: int, stderr: str) -> str:
    """What is wrong with a run that exited ``code`` printing ``stderr`` ("" if nothing)."""
    if code not in _exit_codes(invocation):
        return f"exit {code}\n{stderr}"
    if "Traceback (most recent call last)" in stderr:
        return f"a traceback on stderr (exit {code})\n{stderr}"
    if code == 130 and not re.search(r"(^|\n)napkin( \w+)?: interrupted\n\Z", stderr):
        return f"interrupted without the one line\n{stderr}"
    return ""


def _process(invocation: Invocation) -> Outcome:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    bound = _bound_of(invocation)
    with contextlib.ExitStack() as stack:
        stdout = stack.enter_context(open("/dev/full", "w")) if invocation.full else subprocess.DEVNULL
        proc = subprocess.Popen([sys.executable, "-m", "napkin_cat", invocation.verb, *invocation.argv],
                                stdout=stdout, stderr=subprocess.PIPE, text=True, env=env)
        try:
            if invocation.interrupt is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(invocation.interrupt)
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=bound)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return Outcome(invocation, None, f"took longer than {bound} s")
    code = proc.returncode
    if code == -signal.SIGINT and invocation.interrupt is not None:
        # Python's own handling of a KeyboardInterrupt nothing caught: napkin's code had not started
        # if no frame of it is in the traceback (or there is none: the signal came before Python's handler)
        if "napkin_cat" not in stderr:
            return Outcome(invocation, code, "", startup=True)
        return Outcome(invocation, code, f"a KeyboardInterrupt escaped\n{stderr}")
    return Outcome(invocation, code, _judge(invocation, code, stderr))


# ---- inputs ---------------------------------------------------------------------------------------

@st.composite
def theorem_modules(draw: st.DrawFn) -> str:
    """A generated module with a theorem on one of its diagrams whose steps group, stream
    (maybe padded, maybe via an accumulator) and place that diagram's own axes and names."""
    text = draw(module_texts(max_diagrams=2))
    text = text.split("theorem ", 1)[0]
    try:
        module = loads(text)
    except NapkinError:
        return text
    diagram = draw(st.sampled_from(module.diagrams))
    axes = sorted({a.name for a in diagram.axes}) or ["a"]
    names = sorted({n for let in diagram.body for n in let.names}) or ["A"]
    steps = []
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(("group", "group", "stream", "place")))
        if kind == "place":
            steps.append(f"place {draw(st.sampled_from(names))} at smem")
            continue
        tile = draw(st.sampled_from(("1", "2", "t0", "t1", "t2")))
        via = f" via {draw(st.sampled_from(('sum', 'max', 'online_softmax')))}" \
            if kind == "stream" and draw(st.booleans()) else ""
        pad = " pad" if draw(st.booleans()) else ""
        at = " at mesh" if draw(st.integers(0, 7)) == 0 else ""
        steps.append(f"{kind} {draw(st.sampled_from(axes))} by {tile}{at}{via}{pad}")
    return text + f"theorem t0: {diagram.name} {{\n" + "".join(f"  {s}\n" for s in steps) + "}\n"


@st.composite
def edited_proofs(draw: st.DrawFn) -> tuple[str, str]:
    """(file name, text): a bundled proof with up to two token edits (mostly still checking)."""
    name = draw(st.sampled_from(sorted(PROOFS)))
    tokens = _TOKEN.findall(PROOFS[name])
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.integers(0, len(tokens) - 1))
        edit = draw(st.sampled_from(("delete", "insert", "replace")))
        if edit == "delete":
            del tokens[i]
        elif edit == "insert":
            tokens.insert(i, draw(st.sampled_from(_EDITS)))
        else:
            tokens[i] = draw(st.sampled_from(_EDITS))
    return name, "".join(tokens)


def encoded(text: str, encoding: str) -> bytes:
    """``text`` as stored in ``encoding`` (``ENCODINGS``)."""
    if encoding == "cr":
        return text.replace("\n", "\r").encode()
    if encoding == "crlf":
        return text.replace("\n", "\r\n").encode()
    if encoding == "nul":
        return text.replace("\n", "\n\x00", 1).encode()
    if encoding == "latin-1":
        return ("# caf\xe9\n" + text).encode("latin-1", errors="replace")
    if len(encoding) == 1:  # a line break of Python's splitlines, in a comment and between lines
        return (f"# a{encoding}b\n" + text.replace("\n", encoding + "\n", 1)).encode()
    return text.encode(encoding)


def _names(text: str) -> tuple[list[str], list[str], list[str], list[str]]:
    """Diagrams, theorems, axes and tile names mentioned in ``text``."""
    diagrams = re.findall(r"^diagram (\w+)", text, re.M) or ["f"]
    theorems = re.findall(r"^theorem (\w+)", text, re.M) or ["t0"]
    axes = sorted(set(re.findall(r"\b([a-z]\w*)\b", " ".join(re.findall(r"\[([^\]]*)\]", text)))))
    tiles = sorted(set(re.findall(r"\bby (\w+)", text)))
    return diagrams, theorems, axes or ["q"], tiles or ["t0"]


def chance(rng: random.Random, p: float) -> bool:
    return rng.random() < p


def malformed_profiles(rng: random.Random) -> str:
    """A shipped profile's text with one or two lines broken: a number replaced by a bad value,
    a line deleted or duplicated, garbage inserted, or the text cut short."""
    key = rng.choice(("h100", "h200", "a100", "cpu"))
    lines = resources.files("napkin_cat.cost.hardware").joinpath(f"{key}.toml").read_text().splitlines()
    for _ in range(rng.randint(1, 2)):
        i = rng.randint(0, len(lines) - 1)
        edit = rng.choice(("value", "value", "value", "delete", "duplicate", "garbage", "cut"))
        if edit == "value" and " = " in lines[i]:
            name = lines[i].split(" = ", 1)[0]
            lines[i] = f"{name} = {rng.choice(_BAD_VALUES)}"
        elif edit == "delete":
            del lines[i]
        elif edit == "duplicate":
            lines.insert(i, lines[i])
        elif edit == "garbage":
            lines.insert(i, rng.choice(("[levels.l3]", "x = ", "= 3", "[peak", "name = 'a\nb'", "\x00",
                                                  "[levels]", "levels = 3", "per = 1", "devices = 1000000")))
        else:
            lines = lines[:i]
        if not lines:
            lines = [""]
    return "\n".join(lines) + "\n"


def hardware(rng: random.Random, folder: Path) -> str:
    """A --hardware value: shipped, unknown, a special file, a profile file or a malformed one."""
    kind = rng.choice(("shipped", "shipped", "malformed", "malformed", "malformed", "file", "unknown",
                                 "special"))
    if kind == "shipped":
        return rng.choice(("h100", "h200", "a100", "cpu", "H100"))
    if kind == "unknown":
        return rng.choice(("tpu", "", "h100.toml", "../h100", "-1"))
    if kind == "special":
        return str(folder / "special" / rng.choice(("fifo.toml", "folder.toml", "link.toml",
                                                               "missing.toml", "device.toml")))
    path = folder / "profiles" / f"p{rng.randint(0, 9)}.toml"
    key = rng.choice(("h100", "h200", "a100", "cpu"))
    text = malformed_profiles(rng) if kind == "malformed" else \
        resources.files("napkin_cat.cost.hardware").joinpath(f"{key}.toml").read_text()
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    return str(path)


@st.composite
def invocations(draw: st.DrawFn, folder: Path) -> Invocation:
    """A verb with options on an input written into ``folder`` (which holds examples/ and
    proofs/ copies so that the proofs' `use "../examples/..."` resolve, and ``prepare``'s
    special files).  The texts come from hypothesis's strategies, every other choice from a
    ``random.Random`` it seeds (uniform: hypothesis favours the ends of a range, which would
    make a rare choice, say a process or an early signal, a frequent one)."""
    rng = draw(st.randoms(use_true_random=True))
    if chance(rng, 0.5):
        name, text = draw(edited_proofs())
        path = folder / "proofs" / f"fuzz_{name}"
    else:
        text = draw(theorem_modules())
        path = folder / "proofs" / "fuzz_generated.ncd"
    encoding = rng.choice(ENCODINGS) if chance(rng, 0.3) else "utf-8"  # most runs reach past the parser
    path.write_bytes(encoded(text, encoding))
    if rng.randint(0, 19) == 0:  # a special file in place of the input
        path = folder / "special" / rng.choice(SPECIAL_INPUTS)
    diagrams, theorems, axes, tiles = _names(text)
    verb = rng.choice(VERBS)
    guarded: list[str] = []

    def maybe(option: str, good: tuple[str, ...], bad: tuple[str, ...] = (), p: float = 0.5) -> list[str]:
        """With probability ``p``, ``option`` with a value: a bad one (a usage error) one time in six."""
        if not chance(rng, p):
            return []
        return [option, rng.choice(bad if bad and chance(rng, 1 / 6) else good)]

    def flag(option: str) -> list[str]:
        return [option] if chance(rng, 0.5) else []

    def sizes(p: float = 0.5, sizes: tuple[int, ...] = (1, 2, 3, 4)) -> list[str]:
        """Each axis sized with probability ``p``; one time in ten, too large; sometimes malformed."""
        huge = rng.randint(0, 9) == 0
        out = [f"--size={a}={99_999_999_999 if huge else rng.choice(sizes)}" for a in axes if chance(rng, p)]
        if rng.randint(0, 9) == 0:
            out.append(f"--size={rng.choice(('q', 'q=0', 'q=-1', '=3', 'q=x', 'nope=4', 'q=1' + '0' * 30))}")
        return out

    def output(suffix: str) -> list[str]:
        if rng.randint(0, 7) == 0:
            special = str(folder / "special" / f"out_{rng.choice(SPECIAL_OUTPUTS)}{suffix}")
            guarded.append(special)
            return ["-o", special]
        return ["-o", str(folder / "out" / f"out{suffix}")]

    def common() -> list[str]:
        dtype = maybe("--dtype", ("bf16", "f32", "f16", "fp8e4m3", "tf32", "float32"), ("int8", ""))
        return [*dtype, *(["--hardware", hardware(rng, folder)] if chance(rng, 0.5) else [])]

    argv: list[str]
    if verb == "parse":
        argv = [str(path)]
    elif verb == "check":
        paths = [str(path)] + ([str(folder / "proofs")] if rng.randint(0, 9) == 0 else [])
        argv = [*paths, *flag("--strict"), *flag("--json"), *flag("-q"),
                *(["--certify"] if rng.randint(0, 199) == 0 else [])]
    elif verb == "lemmas":
        argv = [*([rng.choice(("softmax_contract", "online_softmax", "sum", "nope"))]
                  if chance(rng, 0.5) else []), *flag("--json")]
    elif verb == "eval":
        argv = [str(path), rng.choice(diagrams), *sizes(),
                *maybe("--seed", ("0", "1", "3", str(2**70)), ("-1", "x"))]
    elif verb == "grad":
        argv = [str(path), rng.choice(diagrams), *(output(".ncd") if chance(rng, 0.5) else [])]
    elif verb == "draw":
        steps = flag("--steps")
        suffix = "" if steps and chance(rng, 0.5) else rng.choice((".svg", ".png", ".txt"))
        argv = [str(path), rng.choice(theorems + diagrams), *output(suffix), *flag("--expand"), *steps]
    elif verb in ("cost", "pseudo"):
        argv = [str(path), rng.choice(theorems), *sizes(), *common(),
                *maybe("--stages", ("1", "2", "3"), ("0", "x")),
                *maybe("--live", ("1", "0.5", "0.125"), ("0", "1.5", "nan", "x"))]
        if verb == "cost":
            argv += [*flag("--json"), *maybe("--mesh", ("1", "4", "8", "65536"), ("0", "-1", "65537", "x"))]
    elif verb == "lower":
        tile = [f"--tile={rng.choice(tiles + axes)}={rng.choice(('16', '16', '64', '64', '32', '1', '0', 'x'))}"
                for _ in range(rng.choice((0, 0, 0, 1, 1, 2)))]
        argv = [str(path), rng.choice(theorems), *maybe("--target", ("jax", "pallas", "mosaic"), ("cuda",)), *tile,
                *common(), *maybe("--mesh", ("1", "2", "8", "65536"), ("0", "65537"), p=0.15),
                *maybe("--backward", (",".join(theorems[:2]), ","), ("nope",), p=0.1), *flag("--allow-tested-join"),
                *flag("--strict"), *output(".py")]
    else:  # derive: small budgets, so a run stays within the bound
        argv = [str(path), rng.choice(diagrams), *sizes(0.95, (16, 64, 128)), *common(),
                *maybe("--lower", ("jax", "pallas")), *maybe("--budget", ("1", "3", "5"), ("0",), p=1.0),
                *maybe("--seconds", ("2", "5"), ("0", "inf", "nan"), p=1.0),
                *maybe("--max-rewrites", ("0", "1", "2"), ("-1",)), *output(".ncd" if chance(rng, 0.9) else ".py")]
    process = rng.randint(0, 24) == 0
    interrupt = None
    if rng.randint(0, 9) == 0 or (process and chance(rng, 0.5)):
        interrupt = rng.uniform(0.0, 4.0 if process else 1.5)
    full = process and chance(rng, 0.5)
    return Invocation(verb, tuple(argv), interrupt, process, full, tuple(guarded))


def prepare(folder: Path) -> Path:
    """Copy the examples and proofs into ``folder``, make its output folder, and the special
    files inputs and outputs may name (a device node only where this process may make one)."""
    for sub in ("examples", "proofs"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
        for p in (ROOT / sub).glob("*.ncd"):
            (folder / sub / p.name).write_text(p.read_text(encoding="utf-8"), encoding="utf-8")
    for sub in ("out", "profiles", "special"):
        (folder / sub).mkdir(exist_ok=True)
    special = folder / "special"
    secret = special / "secret.txt"
    secret.write_text("SECRET=do-not-print\n")
    for suffix in (".ncd", ".toml"):
        os.mkfifo(special / f"fifo{suffix}")
        (special / f"folder{suffix}").mkdir()
        (special / f"link{suffix}").symlink_to(secret)
        _device(special / f"device{suffix}")
    for suffix in ("", ".svg", ".png", ".txt", ".py", ".ncd"):
        for kind in SPECIAL_OUTPUTS:
            _special_output(special / f"out_{kind}{suffix}")
    return folder


def _special_output(path: Path) -> None:
    """(Re)make the special output ``path`` names (``out_KIND...``), whatever is there now."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    kind = path.name.split("_", 1)[1].split(".", 1)[0]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "link":
        path.symlink_to(path.parent / "secret.txt")
    elif kind == "dangling":
        path.symlink_to(path.parent / "nowhere" / "x")
    else:
        _device(path)


def _device(path: Path) -> None:
    """A copy of /dev/null's node (root only), else a symlink to /dev/null."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError):
        path.symlink_to("/dev/null")


@dataclass
class Tally:
    """Counts per verb and exit code, and what went wrong."""

    counts: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    startup: int = 0
    interrupted: int = 0
    processes: int = 0

    def add(self, outcome: Outcome) -> None:
        inv = outcome.invocation
        key = f"{inv.verb} {outcome.code}"
        self.counts[key] = self.counts.get(key, 0) + 1
        self.startup += outcome.startup
        self.interrupted += inv.interrupt is not None
        self.processes += inv.process
        if not outcome.ok:
            self.failures.append(f"{inv}\n{outcome.error}")
