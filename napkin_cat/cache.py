"""napkin's one cache folder on disk: kernels (``fused``) and certificates (``certify``).

The folder is ``NAPKIN_CACHE_DIR`` (empty: no disk cache), else ``$XDG_CACHE_HOME/napkin``,
else ``~/.cache/napkin``.  An entry is one JSON file named by its key, ``KIND-HASH.json`` with
HASH a SHA-256 of everything the stored result depends on: the caller's parts (a kind, the content and the
settings), napkin's own source (``napkin_hash``: its modules, grammar and lemma library, so a
changed checkout is a new key, not only a new version) and Python's version.  A caller adds
the versions of the libraries its result depends on (jax, numpy, sympy) to its parts.

An entry holds its key and a digest of its payload: one that cannot be read or parsed, whose
key or digest does not match (a truncated or corrupted file, one copied under another name),
or that the caller's ``valid`` refuses is ignored, and the result is computed again and
stored over it.  Entries are written atomically (``files.Outputs``); a folder that cannot be
written is skipped.  The folder is trusted as Python's ``__pycache__`` is: what is read back is
what napkin wrote for that key.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from napkin_cat.files import MAX_SOURCE_BYTES, FileRefused, OutputRefused, Outputs, read_source

__all__ = ["cache_folder", "closure", "key", "napkin_hash", "read", "sources", "write"]

#: bumped when an entry's layout changes
FORMAT = 2
_PACKAGE = Path(__file__).resolve().parent
_lock = threading.Lock()
_own_hash: list[str] = []
#: a string literal, as the grammar's STRING: only a `use_decl` holds one, so every path a file may use is
#: one of these (matching `use` too missed `axis d = 64use "b.ncd"`, which the lexer reads as a use, and a
#: replayed `lower` kept a stale used file's diagram); a string ends at a line's end, which for the parser is
#: each \r too (``diagnostics.LINE_BREAK``): stopping at \n alone, a `"` in a comment on a line ended by a
#: lone \r paired with the opening quote of the next line's `use "b.ncd"`, and b.ncd was left out
_USE = re.compile(r'"([^"\r\n]*)"')


def cache_folder() -> Path | None:
    """Where results are cached: ``NAPKIN_CACHE_DIR`` (empty: no disk cache), else
    ``$XDG_CACHE_HOME/napkin``, else ``~/.cache/napkin``."""
    chosen = os.environ.get("NAPKIN_CACHE_DIR")
    if chosen is not None:
        return Path(chosen) if chosen else None
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "napkin"


def napkin_hash() -> str:
    """napkin's own source (modules, the version in ``__init__``, grammar, lemma library, hardware
    profiles), hashed once per process."""
    with _lock:
        if not _own_hash:
            digest = hashlib.sha256()
            for path in sorted(p for p in _PACKAGE.rglob("*") if p.suffix in (".py", ".ncd", ".lark", ".toml")):
                digest.update(str(path.relative_to(_PACKAGE)).encode() + b"\0" + path.read_bytes())
            grammar = _PACKAGE.parent / "grammar" / "ncd.lark"
            if grammar.is_file():
                digest.update(grammar.read_bytes())
            _own_hash.append(digest.hexdigest())
        return _own_hash[0]


def key(kind: str, settings: Mapping[str, Any], sources: tuple[bytes, ...] | list[bytes] = ()) -> str:
    """The key of a ``kind`` of result computed from ``settings`` (JSON) and ``sources`` (bytes):
    ``KIND-SHA256``, the entry's file name without ``.json``."""
    digest = hashlib.sha256(json.dumps({"format": FORMAT, "kind": kind, "napkin": napkin_hash(),
                                        "python": sys.version, "settings": settings}, sort_keys=True).encode())
    for body in sources:
        digest.update(len(body).to_bytes(8, "little") + body)
    return f"{kind}-{digest.hexdigest()}"


def closure(path: str | Path) -> dict[Path, bytes]:
    """The contents of ``path`` and of every file it could ``use``, transitively (every string
    literal counts, a quoted path in a comment too: a file too many only costs a cache miss), by resolved
    path; a file that cannot be read counts by its reason (elaboration reports it), read by
    the one rule of ``files.read_source``."""
    seen: dict[Path, bytes] = {}
    todo = [Path(path).resolve()]
    while todo:
        here = todo.pop()
        if here in seen:
            continue
        try:
            text = read_source(here, MAX_SOURCE_BYTES)
        except FileRefused as exc:
            seen[here] = f"unreadable: {exc.reason}".encode()
            continue
        seen[here] = text.encode("utf-8")
        todo.extend((here.parent / rel).resolve() for rel in _USE.findall(text))
    return seen


def sources(path: str | Path) -> list[bytes]:
    """``closure(path)`` as a key's sources: each file's resolved path and contents."""
    return [str(p).encode() + b"\0" + body for p, body in sorted(closure(path).items())]


def _digest(entry_key: str, payload: Any) -> str:
    return hashlib.sha256((entry_key + "\0" + json.dumps(payload, sort_keys=True)).encode()).hexdigest()


def read(folder: Path | None, entry_key: str, valid: Callable[[Any], bool]) -> Any | None:
    """The payload stored under ``entry_key`` in ``folder`` (None: no cache), or None: absent,
    unreadable, corrupted (its key or digest does not match) or refused by ``valid``."""
    if folder is None:
        return None
    try:
        entry = json.loads((folder / f"{entry_key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(entry, dict) and entry.get("format") == FORMAT and entry.get("key") == entry_key
            and "payload" in entry and entry.get("digest") == _digest(entry_key, entry["payload"])):
        return None
    payload = entry["payload"]
    return payload if valid(payload) else None


def write(folder: Path | None, entry_key: str, payload: Any) -> None:
    """Store ``payload`` (JSON) under ``entry_key`` in ``folder`` (None: no cache) atomically; a
    folder that cannot be written is skipped."""
    if folder is None:
        return
    entry = {"format": FORMAT, "key": entry_key, "digest": _digest(entry_key, payload), "payload": payload}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        Outputs().write(folder / f"{entry_key}.json", json.dumps(entry, sort_keys=True))
    except (OSError, OutputRefused):
        return
