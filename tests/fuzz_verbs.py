"""Fuzzing every verb of the command line as a user would run it (shared by tests/test_fuzz.py
and the bounded long run, benchmarks/fuzz_verbs.py).

An input is a module text (generated well-typed modules with a theorem whose steps partition
and place the diagram's own axes, or an example proof with a few token edits) and a verb with
arguments: `parse`, `check`, `eval` (sizes 1-4, or a size so large the evaluation must be
refused before allocating), `cost`, `pseudo`, `lower` (both targets) and `draw`, on the
module's diagrams and theorems.  ``run_verb`` runs ``cli.main`` in-process, under a time
bound, and returns the outcome: the exit code, or the traceback of any exception that
escaped (SystemExit from argparse is a usage error, code 2).  The promise: every outcome is
0, 1 or 2 within the bound.
"""

from __future__ import annotations

import contextlib
import io
import re
import signal
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from napkin_cat.cli import main
from napkin_cat.diagnostics import NapkinError
from napkin_cat.elaborate import loads
from tests.strategies import module_texts

ROOT = Path(__file__).resolve().parent.parent
PROOFS = {p.name: p.read_text() for p in (ROOT / "proofs").glob("*.ncd")}
VERBS = ("parse", "check", "eval", "cost", "pseudo", "lower", "draw")
#: seconds one verb run may take before the fuzzer calls it a hang
TIME_BOUND = 60.0
_TOKEN = re.compile(r"\s+|#[^\n]*|\w+|->|>=|<=|==|!=|\S")
_EDITS = ["group", "stream", "by", "pad", "at", "smem", "reg", "via", "online_softmax", "sum", "1", "3", "64",
          "0", "q", "x", "d", "b", "h", "gq", "sx", "}", "{", "\n", "place", "rewrite", "softmax_contract"]


@dataclass(frozen=True)
class Outcome:
    verb: str
    argv: tuple[str, ...]
    code: int | None  # None: an exception escaped (``error`` holds its traceback) or the bound passed
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.code in (0, 1, 2)


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


def run_verb(verb: str, argv: list[str], seconds: float = TIME_BOUND) -> Outcome:
    """Run ``napkin VERB ARGV`` in-process, its output discarded; never raises."""
    sink = io.StringIO()
    try:
        with _bound(seconds), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            code = main([verb, *argv])
    except SystemExit as exc:  # argparse: a usage error
        code = exc.code if isinstance(exc.code, int) else 2
    except _TooSlow:
        return Outcome(verb, tuple(argv), None, f"took longer than {seconds} s")
    except BaseException:  # anything else escaping is what the fuzzer looks for
        return Outcome(verb, tuple(argv), None, traceback.format_exc())
    return Outcome(verb, tuple(argv), code)


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
        steps.append(f"{kind} {draw(st.sampled_from(axes))} by {tile}{via}{pad}")
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


def _names(text: str) -> tuple[list[str], list[str]]:
    return re.findall(r"^diagram (\w+)", text, re.M) or ["f"], re.findall(r"^theorem (\w+)", text, re.M) or ["t0"]


@st.composite
def invocations(draw: st.DrawFn, folder: Path) -> tuple[str, list[str]]:
    """A verb and its arguments on an input written into ``folder`` (which holds examples/
    and proofs/ copies so that the proofs' `use "../examples/..."` resolve)."""
    if draw(st.booleans()):
        name, text = draw(edited_proofs())
        path = folder / "proofs" / f"fuzz_{name}"
    else:
        text = draw(theorem_modules())
        path = folder / "proofs" / "fuzz_generated.ncd"
    path.write_text(text, encoding="utf-8")
    diagrams, theorems = _names(text)
    axes = sorted(set(re.findall(r"\b([a-z]\w*)\b", " ".join(re.findall(r"\[([^\]]*)\]", text)))))
    verb = draw(st.sampled_from(VERBS))
    huge = draw(st.integers(0, 9)) == 0
    sizes = [f"--size={a}={99_999_999_999 if huge else draw(st.integers(1, 4))}"
             for a in axes if draw(st.booleans())]
    out = folder / "out"
    if verb in ("parse", "check"):
        return verb, [str(path)]
    if verb == "eval":
        return verb, [str(path), draw(st.sampled_from(diagrams)), *sizes, f"--seed={draw(st.integers(0, 3))}"]
    theorem = draw(st.sampled_from(theorems))
    if verb in ("cost", "pseudo"):
        extra = ["--json"] if verb == "cost" and draw(st.booleans()) else []
        return verb, [str(path), theorem, *sizes, *extra, f"--dtype={draw(st.sampled_from(('bf16', 'f32', 'f8')))}"]
    if verb == "lower":
        target = draw(st.sampled_from(("jax", "pallas")))
        return verb, [str(path), theorem, f"--target={target}", "-o", str(out / "k.py")]
    subject = draw(st.sampled_from(theorems + diagrams))
    return verb, [str(path), subject, "-o", str(out / "d.svg")]


def prepare(folder: Path) -> Path:
    """Copy the examples and proofs into ``folder`` and make its output folder."""
    for sub in ("examples", "proofs"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
        for p in (ROOT / sub).glob("*.ncd"):
            (folder / sub / p.name).write_text(p.read_text(encoding="utf-8"), encoding="utf-8")
    (folder / "out").mkdir(exist_ok=True)
    return folder
