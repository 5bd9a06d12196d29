"""Certification of lemmas and accumulator laws (verification tiers T1 and T2).

T1, symbolic: both sides are evaluated with the evaluator's own fold over sympy
scalars (``evaluate.SYMBOLIC``) on symbolic inputs, at every assignment of axis sizes up
to a bound, and each entry of the difference must simplify to 0, by cases where running
maxima occur (``certify_cases.symbolic_equal``).
T1½, exact (lemmas): the smallest combinations of sizes up to the lemma's reach
(``certify_reach.reach``; every axis swept independently, ``certify_cases.grid``) on
random rational inputs, every other combination scaled past the lemma's constants
(``certify_reach.scale``), evaluated over sympy and compared to 50 digits.
T2, numeric: float64 evaluation at every combination of sizes up to the lemma's reach,
then on seeded random sizes and values (with fully masked rows for the accumulators with
a running max) must agree to 1e-9.  Lemmas are also evaluated on scaled inputs and on
the inputs where the evaluator's conventions decide values (all-zero and fully or partly
``-inf`` arguments, ``certify_cases.edges``): wherever the left side is finite the right
side must equal it.

Accumulators are certified per consuming box signature (op, target, parameters,
operand types, streamed axis): the recomposition law combine(lift(x), lift(y)) =
lift(x ⊕ y), the update law update(s, y) = combine(s, lift(y)) where the accumulator has a
one-step update, the identity law combine(identity, s) = s, the finaliser law
final(lift(x)) = box(x), with padding lift(x ⊕ fill) = lift(x), and the absorption law
lift(x with input i all fill_i) = identity for every absorbing input i (what lets a kernel
skip a chunk that a mask fills, ``masks.stream_masks``).  The symbolic tier uses the
unguarded forms (exact over the reals), the numeric tier the guarded ones; absorption is
checked by the numeric tier only, since a chunk of scores that are all -inf has no finite
running maximum for the unguarded forms to shift by.  The numeric tier also draws scores
where a normaliser is 0 (all ≤ 0, rows summing to 0, all 0: ``_SCORE_EDGES``), which random
draws almost never are.  A lemma's right side that cannot be evaluated at sizes its left
side admits (a reshape the sizes do not honour) is a counterexample (``_right_side``).

Results are cached, in the process and on disk (``napkin_cat.cache``: a lemma's certificate
and the kernel's oracle ``accumulator`` answer are stored under a key of the lemma's or the
canonical box's full structure (``repr``, which covers every field equality compares), the
level, napkin's own source and the numpy, scipy, sympy and Python versions; a corrupted entry
is computed again).  ``napkin check`` uses the ``quick`` level, ``napkin check
--certify`` the ``full`` one.  Every certificate says what was checked: ``tested: ...``,
or ``proved: ...; tested: ...`` when ``prove`` also proves the lemma at every size (the
kernel's oracle ``accumulator`` likewise answers ``proved`` or ``tested``, and where the kernels
run the state in a float-safe representation, ``accumulators.float_safe``, also its proof by
``certify.represent``, or refuses the accumulator if that fails).  This module
holds the entry points and the tiers; how far a lemma is swept is ``certify_reach``,
the cases and the equality decisions ``certify_cases``.

This package's module is the front: the cached entry points (``certify_lemma``, the
kernel's oracle ``accumulator``) and what they share (``certify.base``), none of it loading
sympy; the tiers themselves are ``certify.tiers``, imported on a cache miss (and for the
names it defines, re-exported here on first use), so that ``napkin check`` with every
certificate stored loads no sympy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from functools import cache
from importlib.metadata import version
from types import ModuleType
from typing import Any

from napkin_cat.cache import cache_folder, key, read, write
from napkin_cat.certify.base import LEVELS, Certificate, canonical, lemma_side, representative_boxes
from napkin_cat.terms import Box, LemmaDecl

__all__ = ["LEMMA_SAFETY_SCALES", "LEVELS", "Certificate", "accumulator", "canonical", "certify_accumulator",
           "certify_lemma", "infinite_tested", "lemma_float_safety", "lemma_side", "prove_representation",
           "representative_boxes"]

#: the tiers' names this module re-exports, each imported on first use (PEP 562)
_TIERS = ("LEMMA_SAFETY_SCALES", "SAFETY_SCALE", "certify_accumulator", "float_safety", "infinite_tested",
          "lemma_float_safety", "prove_representation")


def _tiers() -> ModuleType:
    """The certification tiers (sympy), imported now."""
    from napkin_cat.certify import tiers  # on a cache miss only: it loads sympy

    return tiers


def __getattr__(name: str) -> Any:
    if name not in _TIERS:
        raise AttributeError(f"module 'napkin_cat.certify' has no attribute {name!r}")
    return getattr(_tiers(), name)


#: what a stored result depends on beside its subject and napkin's source: the numeric libraries
#: (read from their installed metadata, so that a cache hit imports none of them)
_LIBRARIES = {name: version(name) for name in ("numpy", "scipy", "sympy")}


def _stored[T](kind: str, settings: dict[str, Any], compute: Callable[[], T], encode: Callable[[T], Any],
               decode: Callable[[Any], T | None]) -> T:
    """``compute()``, or its value stored on disk under ``settings`` (``napkin_cat.cache``);
    ``decode`` answers None for a payload it does not accept (then it is computed again)."""
    folder = cache_folder()
    entry_key = key(kind, settings | _LIBRARIES)
    payload = read(folder, entry_key, lambda p: decode(p) is not None)
    if payload is not None:
        found = decode(payload)
        assert found is not None
        return found
    value = compute()
    write(folder, entry_key, encode(value))
    return value


def _certificate(payload: Any) -> Certificate | None:
    """A stored certificate, or None if the payload is not one."""
    if not (isinstance(payload, dict) and set(payload) == {"ok", "how", "counterexample"}
            and isinstance(payload["ok"], bool) and isinstance(payload["how"], str)
            and (payload["counterexample"] is None or isinstance(payload["counterexample"], str))):
        return None
    return Certificate(payload["ok"], payload["how"], payload["counterexample"])


@cache
def certify_lemma(lemma: LemmaDecl, level: str = "quick") -> Certificate:
    """Check ``lemma`` symbolically up to the level's size bound and numerically at random.

    The float64 tier also checks every size up to the lemma's reach
    (``certify_reach.reach``): every combination of sizes 1..reach, then random sizes up
    to it.  A lemma reaching past ``_MAX_REACH``, or with more than ``_MAX_GRID`` such
    combinations, is refused: bounded certification cannot vouch for it.  A lemma with a
    ``onehot`` box (a value read as a position; also inside a diagram it calls) has no
    symbolic tier (a symbol is never equal to a position, so sympy would see only rows of
    zeros); its float64 tier draws integer-valued inputs in every other case, so both
    branches of the box are exercised.
    A lemma whose sides sympy cannot evaluate (``max(X, recip(0))``: complex infinity is
    not comparable) is refused, and so is one that ``rules.validate`` refuses (sides of
    different types cannot be compared).  Stored on disk (the module docstring).
    """
    return _stored("lemma", {"lemma": repr(lemma), "level": level}, lambda: _tiers().lemma_certificate(lemma, level),
                   asdict, _certificate)


@cache
def accumulator(box: Box, axis: str, name: str, pad: bool) -> str:
    """The kernel's oracle: how ``name`` was certified for ``box`` along ``axis`` (``proved: ...``
    or ``tested: ...``), else why it is refused: its laws fail, or it is unsafe in floating
    point (``float_safety``).  Stored on disk per canonical box (the module docstring)."""
    plain = canonical(box, axis)
    return _stored("accumulator", {"box": repr(plain), "axis": axis, "name": name, "pad": pad},
                   lambda: _tiers().accumulator_answer(plain, axis, name, pad), lambda answer: answer,
                   lambda payload: payload if isinstance(payload, str) else None)
