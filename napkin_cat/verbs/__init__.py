"""The command line's verbs: one ``cmd_*`` function per subcommand, in modules grouped by what
they load, so that a verb imports only what it uses (``napkin parse`` no sympy, ``napkin
check`` no jax); ``napkin_cat.cli`` builds the parser from this light module and imports a
verb's module only when that verb runs (``cli.VERBS``).

This module holds what the parser and every verb share: the usage error (exit code 2), the
exit codes a verb returns, the dtype defaults and the ``NAME=N`` option parser.
"""

from __future__ import annotations

from collections.abc import Sequence

from napkin_cat.limits import MAX_AXIS_SIZE

__all__ = ["DEFAULT_DTYPE", "EXIT_INPUT", "EXIT_OK", "KERNEL_DEFAULT_DTYPE", "UsageError", "pairs", "parse_sizes"]


class UsageError(Exception):
    """A command-line mistake (exit code 2)."""


EXIT_OK, EXIT_INPUT = 0, 1

#: the number format the cost model prices in unless ``--dtype`` says otherwise (``cost``,
#: ``pseudo``, ``derive``), as the Python ``cost`` and ``model_cost`` do
DEFAULT_DTYPE = "bf16"
#: the number format a written kernel is emitted in unless ``--dtype`` says otherwise (``lower``,
#: ``derive --lower``), on both targets, as the Python ``lower()`` does: f32 inputs are never
#: rounded behind the caller's back
KERNEL_DEFAULT_DTYPE = "f32"


def pairs(items: Sequence[str] | None, flag: str, what: str) -> dict[str, int]:
    """``NAME=N`` pairs with N a positive integer of ASCII digits up to ``MAX_AXIS_SIZE``."""
    found: dict[str, int] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        ok = sep and name and value.isascii() and value.isdigit() and len(value) <= 20
        if not ok or not 0 < int(value) <= MAX_AXIS_SIZE:
            raise UsageError(f"{flag} expects {what}=N with N a positive integer up to {MAX_AXIS_SIZE}, got {item!r}")
        found[name] = int(value)
    return found


def parse_sizes(items: Sequence[str] | None) -> dict[str, int]:
    """``AXIS=N`` pairs from ``--size``; a malformed pair is a usage error."""
    return pairs(items, "--size", "AXIS")


