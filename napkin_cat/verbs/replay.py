"""A verb's stored outcome, replayed: ``lower``, ``cost`` and ``pseudo`` are deterministic in
their inputs, so a second run with the same inputs prints and writes what the first did
without loading numpy, sympy or jax, parsing, proving or lowering.

The key (``napkin_cat.cache``) covers everything the outcome depends on: the verb and every
option as given, the contents of the .ncd file and of every file it could ``use``
(``cache.closure``), the contents of a ``--hardware`` profile file, napkin's own source, and
the versions of the libraries the verb's result depends on (``LIBRARIES``).  Only a success
is stored (``store``, called by the verb with what it printed and wrote); a failure runs the
verb again and says why.  A replay checks its outputs as the verb does (``files.Outputs``,
with every file of the closure as an input that must not be overwritten) before writing them.
``NAPKIN_CACHE_DIR=`` (empty) turns replays off with the rest of the cache.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

from napkin_cat.cache import cache_folder, closure, key, read, write
from napkin_cat.files import Outputs
from napkin_cat.verbs import EXIT_OK

__all__ = ["LIBRARIES", "replay", "store"]

#: the verbs whose outcome is stored, with the libraries it depends on
LIBRARIES: dict[str, tuple[str, ...]] = {"lower": ("jax", "jaxlib", "numpy", "sympy"), "cost": ("numpy", "sympy"),
                                         "pseudo": ("numpy", "sympy")}


def _key(args: argparse.Namespace) -> tuple[str, list[Path]] | None:
    """The outcome's key and the files it was computed from, or None for a verb not stored."""
    libraries = LIBRARIES.get(args.verb)
    if libraries is None or not os.path.lexists(args.file):
        return None
    files = closure(args.file)
    settings: dict[str, Any] = {name: value for name, value in vars(args).items() if not name.startswith("_")}
    settings["libraries"] = {name: version(name) for name in libraries}
    inputs = [str(p).encode() + b"\0" + body for p, body in sorted(files.items())]
    hardware = getattr(args, "hardware", None)
    if hardware and os.path.isfile(hardware):  # a profile file: its contents (a shipped name is napkin's source)
        try:
            inputs.append(b"hardware\0" + Path(hardware).read_bytes())
        except OSError:
            return None
    return key(f"verb-{args.verb}", settings, inputs), sorted(files)


def _valid(payload: Any) -> bool:
    return isinstance(payload, dict) and isinstance(payload.get("stdout"), str) \
        and isinstance(payload.get("stderr"), str) and isinstance(payload.get("files"), dict) \
        and all(isinstance(k, str) and isinstance(v, str) for k, v in payload["files"].items())


def replay(args: argparse.Namespace) -> int | None:
    """Print and write the stored outcome of ``args``' verb (EXIT_OK), or None if none is stored."""
    found = _key(args)
    if found is None:
        return None
    payload = read(cache_folder(), found[0], _valid)
    if payload is None:
        args._stored_as = found[0]  # the key of the inputs as they were before the verb ran
        return None
    Outputs(found[1]).write_all(payload["files"].items())
    sys.stdout.write(payload["stdout"])
    sys.stderr.write(payload["stderr"])
    return EXIT_OK


def store(args: argparse.Namespace, stdout: str, stderr: str = "", files: dict[str, str] | None = None) -> None:
    """Remember a successful outcome of ``args``' verb: what it printed and the files it wrote."""
    entry_key = getattr(args, "_stored_as", None)
    if entry_key is not None:
        write(cache_folder(), entry_key, {"stdout": stdout, "stderr": stderr, "files": dict(files or {})})
