"""The `napkin` command line: the only module that prints or exits.

Exit codes: 0 success, 1 an error in the input (diagnostics printed), 2 a usage error
(including an output that cannot or must not be written), 74 standard output or error could
not be written (a full disk; sysexits' EX_IOERR), 130 interrupted (Ctrl-C), 141 the reader
of standard output closed it early (as SIGPIPE would).
The parser is built here from light modules only (``--help`` loads no numpy, sympy, lark or
jax); each subcommand is one ``cmd_*`` function of a module of ``napkin_cat.verbs``, named in
``VERBS`` and imported only when that verb runs, so a verb loads only what it uses; the
outcome of ``lower``, ``cost`` and ``pseudo`` is replayed from napkin's cache when their
inputs are unchanged (``verbs.replay``).
Outputs go through ``files.Outputs``: checked before any long work, never one of the files
read, written atomically.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from napkin_cat import __version__
from napkin_cat.diagnostics import NapkinError, render
from napkin_cat.files import OutputRefused
from napkin_cat.limits import MAX_MESH_DEVICES
from napkin_cat.verbs import DEFAULT_DTYPE, KERNEL_DEFAULT_DTYPE, UsageError
from napkin_cat.verbs.replay import replay

__all__ = ["main"]


EXIT_OK, EXIT_INPUT, EXIT_USAGE, EXIT_IO, EXIT_INTERRUPTED, EXIT_PIPE = 0, 1, 2, 74, 130, 141

#: each subcommand's module in ``napkin_cat.verbs`` (its function is ``cmd_<verb>``), imported
#: when the verb runs: the dispatch that keeps ``--help`` and ``parse`` light (test_imports
#: holds these modules to the import rule as it does written imports)
VERBS: dict[str, str] = {"parse": "text", "grad": "text", "eval": "evaluate", "check": "check", "lemmas": "lemmas",
                         "draw": "draw", "cost": "cost", "pseudo": "cost", "lower": "lower", "derive": "derive"}


def _verb(name: str) -> Callable[[argparse.Namespace], int]:
    """The function of subcommand ``name``, its module imported now."""
    function: Callable[[argparse.Namespace], int] = getattr(
        importlib.import_module(f"napkin_cat.verbs.{VERBS[name]}"), f"cmd_{name}")
    return function


def _fraction(text: str) -> float:
    """An argparse type: a number in (0, 1] (``--live``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0.0 < value <= 1.0:  # NaN fails both comparisons
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text}")
    return value


def _count(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum`` (and at most ``maximum``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            bound = f"from {minimum} to {maximum}" if maximum is not None else f"of at least {minimum}"
            raise argparse.ArgumentTypeError(f"expected an integer {bound}, got {value}")
        return value

    return parse


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


_DTYPE_HELP = ("number format of the arrays, as for every verb: f32, bf16, f16 (kernels are emitted in these), "
               "also tf32, f64, fp8e4m3, fp8e5m2 for the cost model; common spellings (float32, bfloat16, "
               "fp16, ...) are accepted")


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each option's default where it has a meaningful one."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required or action.default in (None, False, argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


def _parser() -> argparse.ArgumentParser:
    fmt = _Help
    parser = argparse.ArgumentParser(
        prog="napkin", formatter_class=fmt,
        description="Neural circuit diagrams as text: check relabelling proofs, derive IO costs, lower to JAX kernels.",
        epilog="Exit codes: 0 success, 1 an error in the input, 2 a usage error, 74 standard output could not be "
               "written, 130 interrupted, 141 the reader closed standard output.")
    parser.add_argument("--version", action="version", version=f"napkin {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text, formatter_class=fmt)

    def sizes(p: argparse.ArgumentParser) -> None:
        p.add_argument("--size", action="append", metavar="AXIS=N",
                       help="size of a symbolic axis (repeatable; may not contradict a declared size)")

    p = command("parse", "print the canonical form of an .ncd file")
    p.add_argument("file", help="the .ncd file")
    p.set_defaults(verb="parse")

    p = command("eval", "evaluate a diagram on seeded random inputs (float64)")
    p.add_argument("file", help="the .ncd file")
    p.add_argument("diagram", help="the diagram to evaluate")
    sizes(p)
    p.add_argument("--seed", type=_count(0), default=0, help="seed of the standard-normal inputs (>= 0)")
    p.set_defaults(verb="eval")

    p = command("check", "check the theorems of proof files (files or folders)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="proof files, or folders searched for *.ncd")
    p.add_argument("--certify", action="store_true", help="run the full certification of lemmas and accumulators")
    p.add_argument("--strict", action="store_true",
                   help="refuse theorems resting on a lemma or accumulator only tested (not proved for every size) "
                        "or on a measured dtype claim")
    p.add_argument("--json", action="store_true", help="print one JSON object: every result and the totals")
    p.add_argument("-q", "--quiet", action="store_true", help="print only failures and the totals")
    p.set_defaults(verb="check")

    p = command("lemmas", "list the library's lemmas and accumulators with their statements")
    p.add_argument("name", nargs="?", default=None, help="show only this lemma or accumulator")
    p.add_argument("--json", action="store_true", help="print a JSON list of {kind, name, applies_to, statement}")
    p.set_defaults(verb="lemmas")

    p = command("draw", "draw a diagram or theorem (SVG/PNG), or a theorem's derivation strip")
    p.add_argument("file", help="the .ncd file")
    p.add_argument("name", help="a diagram, or a theorem (drawn under its schedule)")
    p.add_argument("-o", "--output", required=True, help="OUT.svg or OUT.png; a folder with --steps")
    p.add_argument("--expand", action="store_true", help="draw diagrams used as boxes inline")
    p.add_argument("--steps", action="store_true", help="one picture per proof step, and an index.html")
    p.set_defaults(verb="draw")

    p = command("lower", "lower a theorem to a JAX Pallas kernel or streamed plain JAX (a .py module)")
    p.add_argument("file", help="the proof file")
    p.add_argument("theorem", help="the theorem to lower")
    p.add_argument("--target", choices=("pallas", "mosaic", "jax"), default="pallas",
                   help="Pallas kernel (Triton backend), Mosaic GPU kernel (Hopper) or plain JAX")
    p.add_argument("--tile", action="append", metavar="NAME=N",
                   help="a tile size by tile name or axis (repeatable); KERNEL.NAME=N sets one kernel's alone")
    p.add_argument("--dtype", help=f"{_DTYPE_HELP} (default: {KERNEL_DEFAULT_DTYPE}; bf16 for mosaic, whose "
                                   "wgmma has no f32 path)")
    p.add_argument("--hardware", help="hardware profile for default tiles (h100, h200, a100, cpu, or a .toml "
                                      "profile file; default: h100 for pallas, h200 for mosaic, cpu for jax)")
    p.add_argument("--mesh", type=_count(1, MAX_MESH_DEVICES), metavar="N",
                   help=f"run the mesh partitions on N devices (jax.shard_map; 1 to {MAX_MESH_DEVICES})")
    p.add_argument("--backward", metavar="T1,T2", help="theorems of the same file whose kernels compute the "
                   "gradients: the function becomes a jax.custom_vjp (README \"Training\"); `derived` derives "
                   "and proves them from the theorem's VJP")
    p.add_argument("--allow-tested-join", action="store_true", help="lower --backward kernels whose join the "
                   "prover cannot prove, on the float64 test alone (a warning; the docstring says so)")
    p.add_argument("--strict", action="store_true", help="refuse a theorem that rests on anything only tested "
                   "(as `check --strict`; derived backward passes are always proved)")
    p.add_argument("-o", "--output", required=True, help="OUT.py")
    p.set_defaults(verb="lower")

    p = command("grad", "write a diagram's vector-Jacobian product as a diagram (.ncd)")
    p.add_argument("file", help="the .ncd file")
    p.add_argument("diagram", help="the diagram to differentiate")
    p.add_argument("-o", "--output", help="OUT.ncd (default: print it)")
    p.set_defaults(verb="grad")

    p = command("derive", "search for the cheapest checked schedule of a diagram; write the proof")
    p.add_argument("file", help="the .ncd file")
    p.add_argument("diagram", help="the diagram to schedule")
    p.add_argument("--hardware", help="hardware profile (h100, h200, a100, cpu, or a .toml profile file; default: "
                                      "h100, or with --lower the target's: h100 for pallas, cpu for jax)")
    p.add_argument("--dtype", help=f"{_DTYPE_HELP} (default: {DEFAULT_DTYPE}, as `cost`; with --lower "
                                     f"{KERNEL_DEFAULT_DTYPE}, as `lower`)")
    sizes(p)
    p.add_argument("-o", "--output", required=True, help="OUT.ncd, the proof file to write")
    p.add_argument("--lower", choices=("pallas", "jax"), help="also write the kernel next to it (OUT.py)")
    p.add_argument("--budget", type=_count(1), default=2000, help="most candidates to check")
    p.add_argument("--seconds", type=_seconds, default=120.0,
                   help="the search's window (the fusion boundaries included): no candidate is started after it; "
                        "the one being priced then finishes, and the diagram as written and the unfused plan are "
                        "always priced; checking the written proof and --lower come after it")
    p.add_argument("--max-rewrites", type=_count(0), default=2, help="most lemma applications in a row")
    p.set_defaults(verb="derive")

    for name, text in (("cost", "derive a theorem's IO cost, optimum tiles and lower bound"),
                       ("pseudo", "print a theorem's pseudocode diagram (loops, live buffers)")):
        p = command(name, text)
        p.add_argument("file", help="the proof file")
        p.add_argument("theorem", help="the theorem")
        p.add_argument("--hardware", default="h100", help="hardware profile (h100, h200, a100, cpu, or a .toml "
                                                          "profile file)")
        p.add_argument("--dtype", default=DEFAULT_DTYPE, help=_DTYPE_HELP)
        sizes(p)
        p.add_argument("--stages", type=_count(1), default=1,
                       help="buffers per streamed chunk (2: double buffering; Pallas Triton's default is 3)")
        p.add_argument("--live", type=_fraction, default=1.0, metavar="F",
                       help="fraction of the (program, chunk) pairs a mask read from data leaves live, in (0, 1] "
                            "(a document mask: about 1/documents; default 1, every chunk)")
        if name == "cost":
            p.add_argument("--json", action="store_true", help="print sympy-parsable JSON")
            p.add_argument("--mesh", type=_count(1, MAX_MESH_DEVICES), metavar="N",
                           help=f"devices of the mesh level, 1 to {MAX_MESH_DEVICES} (default: the hardware "
                                "profile's devices per node)")
        p.set_defaults(verb=name)
    return parser


class StreamFailed(Exception):
    """Standard output or error could not be written (a full disk, an I/O error): exit 74."""

    def __init__(self, stream: str, cause: OSError):
        super().__init__(f"cannot write standard {stream}: {cause.strerror or type(cause).__name__}")


class _Guarded:
    """A text stream whose write errors, other than a closed pipe, become ``StreamFailed``."""

    def __init__(self, stream: Any, name: str):
        self._stream, self._name = stream, name

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StreamFailed(self._name, exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StreamFailed(self._name, exc) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _silence(stream: Any) -> None:
    """Point ``stream``'s descriptor at /dev/null, so that Python's final flush of what it still
    buffers cannot fail again (and print a traceback) after napkin has reported the failure."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # a test's StringIO has no descriptor
        os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; every outcome is an exit code of the module docstring, with at most
    one line on stderr for an interruption or a failed output stream."""
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Guarded(stdout, "output"), _Guarded(stderr, "error")  # type: ignore[assignment]
    command = "napkin"
    try:
        args = _parser().parse_args(argv)
        command = f"napkin {args.command}"
        return _run(args, command)
    except KeyboardInterrupt:
        _say(stderr, f"{command}: interrupted")
        return EXIT_INTERRUPTED
    except StreamFailed as exc:
        _say(stderr, f"{command}: error: {exc}")
        _silence(stdout)
        return EXIT_IO
    except BrokenPipeError:
        # the reader closed stdout early (`napkin lemmas | head`): stop quietly, as a process
        # killed by SIGPIPE would, and keep Python's final flush from writing to the closed pipe
        _silence(stdout)
        return EXIT_PIPE
    finally:
        sys.stdout, sys.stderr = stdout, stderr


def _say(stream: Any, line: str) -> None:
    """One line on ``stream``, if it can still be written."""
    try:
        stream.write(line + "\n")
        stream.flush()
    except OSError:
        pass


def _run(args: argparse.Namespace, command: str) -> int:
    try:
        replayed = replay(args)  # lower, cost, pseudo: a stored outcome of the same inputs
        code = replayed if replayed is not None else int(_verb(args.verb)(args))
    except (UsageError, OutputRefused) as exc:
        print(f"{command}: error: {exc}", file=sys.stderr)
        code = EXIT_USAGE
    except NapkinError as exc:
        for diag in exc.diagnostics:
            print(render(diag), file=sys.stderr)
        code = EXIT_INPUT
    sys.stdout.flush()  # a full disk is found here, not by Python's flush at exit
    sys.stderr.flush()
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
