"""Reading source files and writing outputs: the only places napkin touches the file system
for a user's paths.

Reading (``read_source``): only regular files are read (a FIFO, a device such as
``/dev/zero``, a folder is refused without blocking or reading), at most
``MAX_SOURCE_BYTES`` of them, as UTF-8 with or without a byte-order mark.  A refusal is a
``FileRefused`` whose reason names no byte of the file.

Writing (``Outputs``): every output is written to a temporary file in its own folder and
renamed over the target, so a failure part-way leaves the old file whole; an output that is
the same file as one read (``os.path.samefile``: the same inode, so hard and symbolic links
count) is refused, and ``check`` finds an unwritable place before any long work starts.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

__all__ = ["MAX_SOURCE_BYTES", "FileRefused", "OutputRefused", "Outputs", "read_source"]

#: the largest .ncd source read (1 MiB): parsing (Lark LALR in pure Python, with positions)
#: is linear but slow, so a 5 MB file took 90 s and 1.25 GB (benchmarks/source_size.py)
MAX_SOURCE_BYTES = 1 << 20


class FileRefused(Exception):
    """A source file that is not read; ``reason`` says why without quoting it."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(f"cannot read {path}: {reason}")
        self.path = str(path)
        self.reason = reason


class OutputRefused(Exception):
    """An output that cannot or must not be written."""


def read_source(path: str | Path, limit: int = MAX_SOURCE_BYTES) -> str:
    """The text of a regular file of at most ``limit`` bytes, decoded as UTF-8 (a leading
    byte-order mark dropped); raises ``FileRefused`` otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO opens without a writer
    except ValueError:
        raise FileRefused(_printable(path), "the path contains a NUL character") from None
    except OSError as exc:
        raise FileRefused(path, exc.strerror or type(exc).__name__) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(path, f"not a regular file ({_kind(info.st_mode)})")
        if info.st_size > limit:
            raise FileRefused(path, f"{info.st_size} bytes, past the limit of {limit} bytes for a source file")
        chunks, total = [], 0
        while chunk := os.read(fd, limit + 1 - total):  # a file that grows while read stops at the limit
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise FileRefused(path, f"more than {limit} bytes, the limit for a source file")
    except OSError as exc:
        raise FileRefused(path, exc.strerror or type(exc).__name__) from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileRefused(path, f"not UTF-8 text (byte {exc.start})") from None


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a pipe"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


def _printable(path: str | Path) -> str:
    return ascii(str(path))[1:-1]


class Outputs:
    """The files a command read (``inputs``), and writing outputs that are none of them."""

    def __init__(self, inputs: Iterable[str | Path] = ()):
        self.inputs = [Path(p) for p in inputs]

    def check(self, path: str | Path) -> Path:
        """Refuse (``OutputRefused``) an output that could not be written or would replace an
        input: a folder, a missing or unwritable folder, or the same file as an input."""
        out = Path(path)
        if "\0" in str(out):
            raise OutputRefused(f"the output path {_printable(out)} contains a NUL character")
        if out.is_dir():
            raise OutputRefused(f"{out} is a folder; name a file inside it")
        folder = out.parent
        if not folder.is_dir():
            raise OutputRefused(f"no such folder for the output: {folder}")
        for source in self.inputs:
            with contextlib.suppress(OSError):
                if out.exists() and os.path.samefile(out, source):
                    raise OutputRefused(f"{out} is the input {source}; write the output to another file")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise OutputRefused(f"cannot write in {folder}: permission denied")
        if out.exists() and not os.access(out, os.W_OK):
            raise OutputRefused(f"cannot write {out}: permission denied")
        return out

    def write(self, path: str | Path, data: str | bytes) -> Path:
        """Write ``data`` (text as UTF-8) to ``path`` atomically, after ``check``: a temporary
        file in the same folder, flushed, then renamed over the target."""
        out = self.check(path)
        payload = data.encode("utf-8") if isinstance(data, str) else data
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
        except OSError as exc:
            raise OutputRefused(f"cannot write in {out.parent}: {exc.strerror or type(exc).__name__}") from None
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            if out.exists():
                os.chmod(tmp, stat.S_IMODE(os.stat(out).st_mode))
            else:
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, out)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise OutputRefused(f"cannot write {out}: {exc.strerror or type(exc).__name__}") from None
        return out
