"""Reading source files and writing outputs: the only places napkin touches the file system
for a user's paths.

Reading (``read_source``), one rule for every path (an argument, a member of a folder given
to ``check``, a ``use``): the path's resolved target (every symbolic link followed) must be a
regular file whose name ends in ``.ncd``, of at most ``MAX_SOURCE_BYTES``, UTF-8 with or
without a byte-order mark.  Anything else (another suffix, a link to ``/proc/self/environ``,
a FIFO, a device such as ``/dev/zero``, a folder) is refused without blocking or reading:
a ``FileRefused`` whose reason names no byte of the file, so no diagnostic can quote it.
``source_paths`` expands the files and folders a command is given.

Writing (``Outputs``): an output is a regular file or does not exist yet; a symbolic link
is written through (the file it points to is replaced, the link stays) when it points to a
regular file, and refused otherwise; a FIFO, a device node, a socket or a folder is refused
and left as it was.  Every output is written to a temporary file in its target's folder
and renamed over the target only once all the outputs of a write are whole
(``write_all``): a failure or Ctrl-C part-way leaves the old files and no temporary file.
An output that is the same file as one read (``os.path.samefile``: the same inode, so hard
and symbolic links count) is refused, and ``check`` finds an unwritable place before any
long work starts.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

__all__ = ["MAX_SOURCE_BYTES", "SOURCE_SUFFIX", "FileRefused", "OutputRefused", "Outputs", "read_source",
           "resolve_source", "shown", "source_paths"]

#: the largest .ncd source read (1 MiB): parsing (Lark LALR in pure Python, with positions)
#: is linear but slow, so a 5 MB file took 90 s and 1.25 GB (benchmarks/source_size.py)
MAX_SOURCE_BYTES = 1 << 20

#: the only files napkin reads end in this
SOURCE_SUFFIX = ".ncd"


class FileRefused(Exception):
    """A source file that is not read; ``reason`` says why without quoting it."""

    def __init__(self, path: str | Path, reason: str):
        super().__init__(f"cannot read {shown(path)}: {reason}")
        self.path = shown(path)
        self.reason = reason


class OutputRefused(Exception):
    """An output that cannot or must not be written."""


def shown(path: str | Path) -> str:
    """A path as one line of printable text (escaped where it holds a control character)."""
    text = str(path)
    return text if text.isprintable() else ascii(text)[1:-1]


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def resolve_source(path: str | Path, suffix: str = SOURCE_SUFFIX) -> Path:
    """The file ``path`` names, every symbolic link followed; ``FileRefused`` unless it exists
    and its name ends in ``suffix`` (``.ncd``; ``.toml`` for a hardware profile)."""
    try:
        target = Path(os.path.realpath(path, strict=True))
    except ValueError:
        raise FileRefused(path, "the path contains a NUL character") from None
    except OSError as exc:
        raise FileRefused(path, _reason(exc)) from None
    if not target.name.endswith(suffix):
        where = "" if os.path.abspath(path) == str(target) else f" (it leads to {shown(target)})"
        raise FileRefused(path, f"not an {suffix} file{where}; napkin reads only {suffix} files here")
    return target


def read_source(path: str | Path, limit: int = MAX_SOURCE_BYTES, suffix: str = SOURCE_SUFFIX) -> str:
    """The text of the regular file ``path`` resolves to, whose name ends in ``suffix``, of at
    most ``limit`` bytes, decoded as UTF-8 (a leading byte-order mark dropped); raises
    ``FileRefused`` otherwise."""
    target = resolve_source(path, suffix)
    try:  # the resolved path holds no link; O_NOFOLLOW refuses one swapped in since
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:  # O_NONBLOCK: a FIFO opens without a writer
        raise FileRefused(path, _reason(exc)) from None
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
        raise FileRefused(path, _reason(exc)) from None
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileRefused(path, f"not UTF-8 text (byte {exc.start})") from None


def source_paths(items: Iterable[str | Path]) -> list[Path]:
    """The files a command is given: each file as it is, each folder's ``*.ncd`` entries
    (files and links, recursively, in sorted order; links to folders are not entered).  The
    read rule (``read_source``) then decides for each; ``FileRefused`` for a path that is
    neither a file nor a folder, and for a folder holding no ``.ncd`` file."""
    found: list[Path] = []
    for item in items:
        path = Path(item)
        try:
            info = os.stat(path)
        except ValueError:
            raise FileRefused(item, "the path contains a NUL character") from None
        except FileNotFoundError:
            raise FileRefused(item, "no such file or folder") from None
        except OSError as exc:
            raise FileRefused(item, _reason(exc)) from None
        if not stat.S_ISDIR(info.st_mode):
            found.append(path)
            continue
        members: list[Path] = []
        for folder, subfolders, names in os.walk(path, onerror=_raise_walk(item)):
            subfolders.sort()
            entries = [*names, *(s for s in subfolders if os.path.islink(os.path.join(folder, s)))]
            members.extend(Path(folder, n) for n in entries if n.endswith(SOURCE_SUFFIX))
        if not members:  # `check` of a misspelt or emptied folder would say "0 of 0" and pass
            raise FileRefused(item, f"a folder with no {SOURCE_SUFFIX} files")
        found.extend(sorted(members))
    return found


def _raise_walk(item: str | Path) -> Callable[[OSError], None]:
    def fail(exc: OSError) -> None:
        raise FileRefused(exc.filename or item, _reason(exc))

    return fail


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a pipe"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a link"),
                       (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "a special file"


def _printable(path: str | Path) -> str:
    return ascii(str(path))[1:-1]


@contextlib.contextmanager
def _interrupts_held() -> Iterator[Callable[[], bool]]:
    """Hold Ctrl-C (SIGINT) while the block runs: the block may ask whether one came, and
    ``KeyboardInterrupt`` is raised when it ends.  Only Python's own Ctrl-C handler, in the
    main thread, is held; otherwise (another thread, a handler the program installed) a
    signal acts where it lands, and the block's own clean-up handles what it raises."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    if previous is not signal.default_int_handler:
        yield lambda: False
        return
    came: list[int] = []
    other: BaseException | None = None
    try:
        signal.signal(signal.SIGINT, lambda signum, frame: came.append(signum))
        yield lambda: bool(came)
    finally:
        # restored whatever another signal's handler raises meanwhile (a KeyboardInterrupt from an
        # alarm, as the verb fuzzer's are): left installed, the hold swallowed every later Ctrl-C
        while True:
            try:
                signal.signal(signal.SIGINT, previous)
                break
            except KeyboardInterrupt as exc:
                other = exc
        if other is not None:
            raise other
        if came:
            raise KeyboardInterrupt


class Outputs:
    """The files a command read (``inputs``), and writing outputs that are none of them."""

    def __init__(self, inputs: Iterable[str | Path] = ()):
        self.inputs = [Path(p) for p in inputs]

    def check(self, path: str | Path) -> Path:
        """Refuse (``OutputRefused``) an output that could not or must not be written: one
        that exists and is not a regular file (a folder, a FIFO, a device node, a socket), a
        symbolic link to anything but a regular file, a name the system refuses (too long),
        a missing or unwritable folder, or the same file as an input.  Returns ``path``."""
        self._target(path)
        return Path(path)

    def _target(self, path: str | Path) -> Path:
        """The file to replace: ``path``, or the regular file a symbolic link ``path`` points to."""
        out = Path(path)
        if "\0" in str(out):
            raise OutputRefused(f"the output path {_printable(out)} contains a NUL character")
        target = out
        try:
            info: os.stat_result | None = os.lstat(out)
        except FileNotFoundError:
            info = None
        except OSError as exc:  # a name too long, a file where a folder should be, a loop of links
            raise OutputRefused(f"cannot write {shown(out)}: {_reason(exc)}") from None
        if info is not None and stat.S_ISLNK(info.st_mode):
            try:
                info = os.stat(out)
            except OSError as exc:
                raise OutputRefused(f"{shown(out)} is a symbolic link to nothing napkin can write "
                                    f"({_reason(exc)}); it writes through a link only to a regular file") from None
            if not stat.S_ISREG(info.st_mode):
                raise OutputRefused(f"{shown(out)} is a symbolic link to {_kind(info.st_mode)}; napkin writes "
                                    "through a link only to a regular file")
            target = Path(os.path.realpath(out))
        elif info is not None and stat.S_ISDIR(info.st_mode):
            raise OutputRefused(f"{shown(out)} is a folder; name a file inside it")
        elif info is not None and not stat.S_ISREG(info.st_mode):
            raise OutputRefused(f"{shown(out)} is {_kind(info.st_mode)}; napkin writes only regular files")
        folder = target.parent
        if not folder.is_dir():
            raise OutputRefused(f"no such folder for the output: {shown(folder)}")
        for source in self.inputs:
            with contextlib.suppress(OSError):
                if info is not None and os.path.samefile(out, source):
                    raise OutputRefused(f"{shown(out)} is the input {shown(source)}; write the output to another "
                                        "file")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise OutputRefused(f"cannot write in {shown(folder)}: permission denied")
        if info is not None and not os.access(target, os.W_OK):
            raise OutputRefused(f"cannot write {shown(out)}: permission denied")
        return target

    def folder(self, path: str | Path) -> bool:
        """Make ``path`` a folder to write into: an existing folder (or a link to one) is
        used, a missing one is created (True: the caller removes it if its writes fail);
        anything else is refused (``OutputRefused``)."""
        folder = Path(path)
        if "\0" in str(folder):
            raise OutputRefused(f"the output path {_printable(folder)} contains a NUL character")
        try:
            info = os.stat(folder)
        except FileNotFoundError:
            try:
                os.mkdir(folder)
            except OSError as exc:
                raise OutputRefused(f"cannot create the folder {shown(folder)}: {_reason(exc)}") from None
            return True
        except OSError as exc:
            raise OutputRefused(f"cannot write {shown(folder)}: {_reason(exc)}") from None
        if not stat.S_ISDIR(info.st_mode):
            raise OutputRefused(f"{shown(folder)} is {_kind(info.st_mode)}, not a folder")
        return False

    def write(self, path: str | Path, data: str | bytes) -> Path:
        """Write ``data`` (text as UTF-8) to ``path`` atomically, after ``check``: a temporary
        file in the target's folder, flushed, then renamed over the target."""
        return self.write_all([(path, data)])[0]

    def write_all(self, items: Iterable[tuple[str | Path, str | bytes]]) -> list[Path]:
        """Write every ``(path, data)`` or none: each is checked, then written to a temporary
        file, and only when all are whole are they renamed over their targets.  A failure or
        Ctrl-C before the renames removes every temporary file and leaves the targets as they
        were; Ctrl-C during the renames (a few system calls) takes effect once they are done."""
        planned = [(Path(path), self._target(path), data.encode("utf-8") if isinstance(data, str) else data)
                   for path, data in items]
        staged: list[tuple[str, Path]] = []
        with _interrupts_held() as interrupted:
            try:
                for out, target, payload in planned:
                    staged.append((self._stage(out, target, payload), target))
                if interrupted():
                    raise KeyboardInterrupt
                while staged:
                    tmp, target = staged[0]
                    os.replace(tmp, target)
                    staged.pop(0)
            except OSError as exc:
                name = shown(staged[0][1]) if staged else "the outputs"
                raise OutputRefused(f"cannot write {name}: {_reason(exc)}") from None
            finally:
                for tmp, _ in staged:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
        return [out for out, _, _ in planned]

    @staticmethod
    def _stage(out: Path, target: Path, payload: bytes) -> str:
        """A temporary file beside ``target`` holding ``payload``, with the mode the target
        has (or a new file would get)."""
        try:  # the name is cut so that a long target name leaves room for the temporary's
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:64]}.", suffix=".tmp", dir=target.parent)
        except OSError as exc:
            raise OutputRefused(f"cannot write in {shown(target.parent)}: {_reason(exc)}") from None
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            if target.exists():
                os.chmod(tmp, stat.S_IMODE(os.stat(target).st_mode))
            else:
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(tmp, 0o666 & ~umask)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            if isinstance(exc, OSError):
                raise OutputRefused(f"cannot write {shown(out)}: {_reason(exc)}") from None
            raise
        return tmp
