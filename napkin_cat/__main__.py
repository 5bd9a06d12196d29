"""``python -m napkin_cat`` and the ``napkin`` command (``entry``).

The command line's modules take seconds to load (numpy, sympy, lark); Ctrl-C meanwhile exits
130 with one line, as it does once ``cli.main`` runs.  ``import napkin_cat`` loads none of
them (its public names are imported on first use), so this handler is in place from the
moment napkin's own code starts.
"""

import sys

EXIT_INTERRUPTED = 130


def entry() -> int:
    """Load the command line and run it on ``sys.argv``; 130 if interrupted while loading."""
    try:
        from napkin_cat.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("napkin: interrupted\n")
        return EXIT_INTERRUPTED
    return main()


if __name__ == "__main__":
    sys.exit(entry())
