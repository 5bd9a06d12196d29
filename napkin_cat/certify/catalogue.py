"""The library's lemmas and accumulators with their statements, for ``napkin lemmas``.

A lemma's statement is its equation as written in ``lemmas.ncd``; an accumulator's is the
box family it streams (on the canonical box ``certify.representative_boxes`` certifies it
for), its state, identity, padding values and its ``lift``, ``combine`` and ``final``
diagrams, whose laws ``napkin check --certify`` certifies.  Each entry says its trust level:
``proved`` where the symbolic prover (``certify.prove``) proves it for every size, else
``tested`` (bounded certification only; ``napkin check --strict`` refuses theorems resting on it).
"""

from __future__ import annotations

from dataclasses import dataclass

from napkin_cat import certify
from napkin_cat.certify import accumulators, prove, rules
from napkin_cat.printer import print_diagram, print_lemma

__all__ = ["Entry", "entries"]


@dataclass(frozen=True)
class Entry:
    """One lemma or accumulator: ``kind`` is ``lemma`` or ``accumulator``; ``statement`` is text;
    ``trust`` is ``proved`` or ``tested``."""

    kind: str
    name: str
    applies_to: str
    statement: str
    trust: str


def entries() -> list[Entry]:
    """Every library lemma (in file order), then every accumulator of every box family."""
    found = [Entry("lemma", lm.name, "any diagram matching its left side", print_lemma(lm),
                   _trust(prove.prove_lemma(lm))) for lm in rules.library().values()]
    for box, axis in certify.representative_boxes():
        params = f"; {', '.join(box.params)}" if box.params else ""
        family = f"{box.op}[{' '.join(box.target)}{params}] streaming {axis}"
        for name in accumulators.accumulators_for(box, axis):
            acc = accumulators.plan(box, axis, name)
            state = ", ".join(f"{n}: [{' '.join(axes)}]" for n, axes in acc.state)
            pad = "none" if acc.pad is None else ", ".join(f"{v:g}" for v in acc.pad)
            lines = [f"state ({state}); identity ({', '.join(f'{v:g}' for v in acc.identity)}); padding ({pad})",
                     *(print_diagram(d) for d in (acc.lift, acc.combine, acc.final))]
            proved = prove.prove_accumulator(certify.canonical(box, axis), axis, name, False)
            found.append(Entry("accumulator", name, family, "\n".join(lines), _trust(proved)))
    return found


def _trust(proved: str | None) -> str:
    return "tested" if proved is None else "proved"
