"""``python -m napkin_cat`` and the ``napkin`` command (``entry``).

The command line's modules take seconds to load (numpy, sympy, lark); Ctrl-C meanwhile exits
130 with one line, as it does once ``cli.main`` runs.  ``import napkin_cat`` loads none of
them (its public names are imported on first use), so this handler is in place from the
moment napkin's own code starts.  Once the command's outcome is settled, a late Ctrl-C is
ignored: Python restores the default SIGINT action while it shuts down, and a signal landing
there would otherwise kill the process (status -2, no message) after its work was done.
"""

import contextlib
import os
import signal
import sys

EXIT_INTERRUPTED = 130


def entry() -> int:
    """Load the command line and run it on ``sys.argv``; 130 if interrupted while loading."""
    try:
        try:
            from napkin_cat.cli import main
        except KeyboardInterrupt:
            sys.stderr.write("napkin: interrupted\n")
            return EXIT_INTERRUPTED
        return main()
    finally:
        # ignore SIGINT from here on (see the module docstring); a signal landing just before
        # the call is retried past, since the command has already said what it had to say
        while True:
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                break
            except KeyboardInterrupt:
                continue


def _exit(code: int) -> None:
    """End ``python -m napkin_cat`` with ``code``.  After an interrupt, CPython 3.12 may still
    hold the note that a KeyboardInterrupt went unhandled (set where one ran through C code
    during an import, though napkin caught it), and ``-m`` then ends the process by SIGINT
    instead of with 130 (measured: one run in three under load); so leave directly."""
    if code != EXIT_INTERRUPTED:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(entry())
