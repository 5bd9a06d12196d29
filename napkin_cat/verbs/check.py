"""``napkin check``: proof files checked (with ``--certify``, the library certified in full)."""

from __future__ import annotations

import argparse
import json
import sys

from napkin_cat import certify
from napkin_cat.certify import Certificate, rules
from napkin_cat.certify.accumulators import accumulators_for
from napkin_cat.diagnostics import NapkinError, render
from napkin_cat.files import FileRefused, source_paths
from napkin_cat.proof import check_file
from napkin_cat.verbs import EXIT_INPUT, EXIT_OK, UsageError

__all__ = ["cmd_check"]


def cmd_check(args: argparse.Namespace) -> int:
    """Check every theorem in the given files and folders; exit 1 if any fails or, with
    ``--certify``, if a library lemma or accumulator fails its full certification."""

    try:
        files = source_paths(args.paths)  # each then read by the one rule of files.read_source
    except FileRefused as exc:
        raise UsageError(str(exc)) from None
    level = "full" if args.certify else "quick"
    uncertified = 0  # library lemmas and accumulators whose full certification failed: CI must fail too
    if args.certify:
        from napkin_cat.certify import prove  # sympy: only the full certification loads it

        for lemma in rules.library().values():
            cert = certify.certify_lemma(lemma, level)
            uncertified += not cert.ok
            if args.json or (args.quiet and cert.ok):
                continue
            print(f"lemma {lemma.name}: {cert.how.split(':')[0] if cert.ok else 'FAILED'} ({cert.how})"
                  + (f": {cert.counterexample}" if cert.counterexample else ""))
        for box, axis in certify.representative_boxes():
            for name in accumulators_for(box, axis):
                cert = certify.certify_accumulator(box, axis, name, True, level)
                plain = certify.canonical(box, axis)
                kernel = certify.prove_representation(plain, axis, name)  # the state the kernels run
                if cert.ok and kernel is not None and not kernel.ok:
                    cert = Certificate(False, f"kernel state: {kernel.counterexample}")
                uncertified += not cert.ok
                how = (prove.prove_accumulator(plain, axis, name, True) or cert.how) if cert.ok else cert.how
                how += f"; kernel state {kernel.how}" if cert.ok and kernel is not None else ""
                if args.json or (args.quiet and cert.ok):
                    continue
                params = f"; {', '.join(box.params)}" if box.params else ""
                print(f"accumulator {name} for {box.op}[{' '.join(box.target)}{params}]: "
                      f"{how.split(':')[0] if cert.ok else 'FAILED'} ({how})")
    theorems, failed, broken = 0, 0, 0
    records: list[dict[str, object]] = []
    for file in files:
        try:
            results = check_file(file, level, args.strict)
        except NapkinError as exc:
            broken += 1
            records.append({"file": str(file), "ok": False, "errors": [render(d) for d in exc.diagnostics]})
            if not args.json:
                for diag in exc.diagnostics:
                    print(render(diag), file=sys.stderr)
            continue
        for result in results:
            theorems += 1
            failed += not result.ok
            records.append({"file": str(file), "theorem": result.name, "ok": result.ok, "summary": result.summary(),
                            "error": render(result.failure) if result.failure is not None else None,
                            "counterexample": result.counterexample})
            if args.json:
                continue
            if not args.quiet:
                print(f"{file}: {result.summary()}", flush=True)
            if not result.ok:
                assert result.failure is not None
                print(render(result.failure), file=sys.stderr)
                if result.counterexample:
                    print(f"  counterexample: {result.counterexample}", file=sys.stderr)
                sys.stderr.flush()
    total = (f"{theorems - failed} of {theorems} theorems checked" + (f", {failed} refused" if failed else "")
             + (f"; {broken} file(s) with errors" if broken else "")
             + (f"; {uncertified} lemma(s) or accumulator(s) FAILED certification" if uncertified else ""))
    if args.json:
        print(json.dumps({"ok": not (failed or broken or uncertified), "theorems": theorems, "refused": failed,
                          "files_with_errors": broken, "uncertified": uncertified, "results": records}, indent=2))
    else:
        print(total)
    return EXIT_INPUT if failed or broken or uncertified else EXIT_OK
