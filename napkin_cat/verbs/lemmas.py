"""``napkin lemmas``: the library's lemmas and accumulators with their statements."""

from __future__ import annotations

import argparse
import json

from napkin_cat.certify import catalogue
from napkin_cat.verbs import EXIT_OK, UsageError

__all__ = ["cmd_lemmas"]


def cmd_lemmas(args: argparse.Namespace) -> int:
    """List the library's lemmas and accumulators with their statements."""
    found = [e for e in catalogue.entries() if args.name is None or e.name == args.name]
    if not found:
        known = ", ".join(sorted({e.name for e in catalogue.entries()}))
        raise UsageError(f"no lemma or accumulator `{args.name}` (known: {known})")
    if args.json:
        print(json.dumps([vars(e) for e in found], indent=2))
        return EXIT_OK
    for e in found:
        head = f"{e.statement}  ({e.trust})" if e.kind == "lemma" else \
            f"accumulator {e.name} for {e.applies_to} ({e.trust}):"
        body = "" if e.kind == "lemma" else "\n" + "\n".join(f"  {line}" for line in e.statement.splitlines())
        print(head + body)
    return EXIT_OK
