"""The JAX user's front door: a proved kernel as a jax-callable, cached on disk.

``fuse(path, theorem)`` returns a ``Fused``: call it on jax (or numpy) arrays as you would
the diagram, under ``jax.jit``, ``jax.grad`` and ``jax.vmap``. Each call emits (once) the
kernel for the floating-point type of its inputs — float32, bfloat16 or float16, the
formats kernels are emitted in; float64 inputs run in float32 unless ``jax_enable_x64`` is
set, where they are refused, as are integer and complex inputs — so f32 inputs are never
rounded to bf16 behind the caller's back.

The theorem is checked by the trusted kernel (with ``strict=True``, the default, it must rest
only on proved lemmas and accumulators, as ``napkin check --strict`` demands) and lowered by
``napkin_cat.lower``; the generated module is stored in napkin's cache folder
(``napkin_cat.cache``: ``NAPKIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/napkin``, else
``~/.cache/napkin``; ``cache=False`` or an empty ``NAPKIN_CACHE_DIR`` turns it off) under a
key that covers everything the kernel depends on: the
contents of the .ncd file and of every file it could ``use`` (found by the grammar's
``use "PATH"`` form, comments included, so a file is never left out), the theorem and
backward names, target, dtype, tiles, hardware, strictness, napkin's own source (its
modules, grammar and lemma library, so a changed checkout is a new key, not only a new
version) and the jax version. A later call with the same key, in this process or another,
reads the module back and skips parsing, proving, certifying and lowering. The cached code
is code napkin generated from a checked theorem; the cache folder is trusted as Python's
``__pycache__`` is.

``attention(score_mod=..., mask_mod=...)`` builds FlexAttention-style variants: scores
``S = Q·K / sqrt(d)`` modified by an .ncd expression of ``S`` (e.g. ``"30 * tanh(S / 30)"``;
positions enter as ``index[q x](q - x)``), keys masked where an index predicate of ``q`` and
``x`` fails (e.g. ``"q >= x"``), proved as FlashAttention (online softmax over key chunks).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from napkin_cat import proof
from napkin_cat.cache import cache_folder, key, read, sources, write
from napkin_cat.diagnostics import NapkinError, error
from napkin_cat.elaborate import load, loads
from napkin_cat.kernel import Theorem
from napkin_cat.lower import DEFAULT_HARDWARE, TARGETS, compile_module, lower
from napkin_cat.search.backward import DERIVED, derived
from napkin_cat.terms import Module

__all__ = ["Fused", "attention", "cache_folder", "fuse"]

#: bumped when the cache entry's layout changes
_FORMAT = 1
_lock = threading.Lock()
_memo: dict[str, tuple[Callable[..., Any], str]] = {}


@dataclass(frozen=True)
class Fused:
    """A proved kernel as a jax-callable; see the module docstring.

    ``theorem`` and ``backward`` name the theorems, ``target`` is ``"pallas"`` or ``"jax"``;
    ``source(dtype)`` is the generated module for a dtype (``"float32"``, ...)."""

    theorem: str
    target: str
    backward: tuple[str, ...]
    _build: Callable[[str], tuple[Callable[..., Any], str]] = field(repr=False, compare=False)

    def __call__(self, *arrays: Any) -> Any:
        return self._function(_kernel_dtype(arrays))(*arrays)

    def source(self, dtype: str = "float32") -> str:
        return self._build(dtype)[1]

    def _function(self, dtype: str) -> Callable[..., Any]:
        return self._build(dtype)[0]


def fuse(path: str | Path, theorem: str, *, backward: Sequence[str] | str = (), target: str | None = None,
         tiles: Mapping[str, int] | None = None, hardware: str | None = None, strict: bool = True,
         cache: bool = True) -> Fused:
    """The kernel of ``theorem`` in the .ncd file ``path`` (with ``backward`` theorems of the
    same file as its gradient, as ``napkin lower --backward``; ``backward="derived"`` derives,
    schedules and proves them from the theorem's VJP, ``napkin_cat.search.backward``), lowered for ``target``
    (default: ``"pallas"`` where jax's default backend is a GPU, else ``"jax"``).

    Nothing is read or proved until the first call (or ``source``); errors in the file or
    the proof are raised then as ``NapkinError`` with located diagnostics."""
    where = Path(path)
    return _fused(lambda: sources(where), lambda: load(where), theorem, backward, target, tiles, hardware,
                  strict, cache)


def attention(score_mod: str | None = None, mask_mod: str | None = None, *, head_dim: int | None = None,
              backward: str | None = None, target: str | None = None, tiles: Mapping[str, int] | None = None,
              hardware: str | None = None, cache: bool = True) -> Fused:
    """Attention ``softmax(score_mod(Q·K/sqrt(d)))·V`` over keys where ``mask_mod`` holds,
    as a proved FlashAttention kernel taking ``Q: [q d], K: [x d], V: [x d]`` (``jax.vmap``
    it over batch and heads). ``score_mod`` is an .ncd expression of the scaled scores
    ``S: [q x]`` (``"30 * tanh(S / 30)"``; positions as ``index[q x](q - x)``: ALiBi is
    ``"S - 0.5 * abs(index[q x](q - x))"``; a bare ``q`` is the axis's size, as in .ncd);
    ``mask_mod`` an index predicate (``"q >= x"``, ``"q - x < 256 and q >= x"``).
    ``head_dim`` fixes ``d`` (else it is bound from the inputs).  ``backward="derived"`` gives
    it FlashAttention-2's backward, derived and proved (``fuse``); else its gradient is the
    target's default (``lower.backward``)."""
    text = _attention_text(score_mod, mask_mod, head_dim)
    return _fused(lambda: [text.encode("utf-8")], lambda: loads(text, "<napkin attention>"), "flash",
                  () if backward is None else backward, target, tiles, hardware, True, cache)


def _attention_text(score_mod: str | None, mask_mod: str | None, head_dim: int | None) -> str:
    for what, text in (("score_mod", score_mod), ("mask_mod", mask_mod)):
        if text is not None and (not isinstance(text, str) or not text.strip() or any(c in text for c in "\n\r{};#")):
            raise ValueError(f"{what} must be one .ncd expression on one line (no braces, `;` or comments), "
                             f"got {text!r}")
    if head_dim is not None and (not isinstance(head_dim, int) or head_dim < 1):
        raise ValueError(f"head_dim must be a positive integer, got {head_dim!r}")
    scores = score_mod if score_mod is not None else "S"
    masked = f"where[q x]({mask_mod}, M, -inf)" if mask_mod is not None else "M"
    return "\n".join([
        "axis q, x",
        f"axis d = {head_dim}" if head_dim is not None else "axis d",
        "diagram attention(Q: [q d], K: [x d], V: [x d]) -> [q d] {",
        "  S = contract[d](Q, K) * rsqrt(d)",
        f"  M = {scores}",
        f"  P = softmax[x]({masked})",
        "  O = contract[x](P, V)",
        "  return O",
        "}",
        "theorem flash: attention {",
        "  rewrite softmax_contract at P, O",
        "  group q by gq",
        "  stream x by sx via online_softmax",
        "}",
        "",
    ])


def _fused(sources: Callable[[], list[bytes]], module: Callable[[], Module], theorem: str,
           names: Sequence[str] | str, target: str | None, tiles: Mapping[str, int] | None, hardware: str | None,
           strict: bool, cache: bool) -> Fused:
    if target is not None and target not in TARGETS:
        raise NapkinError(error("lower.target", target=target, targets=", ".join(TARGETS)))
    backward = (names,) if isinstance(names, str) else tuple(names)
    chosen = target or _default_target()
    settings = {"theorem": theorem, "backward": backward, "target": chosen, "hardware": hardware, "strict": strict,
                "tiles": dict(sorted((tiles or {}).items()))}

    def build(dtype: str) -> tuple[Callable[..., Any], str]:
        entry_key = key("kernel", {"format": _FORMAT, "jax": jax.__version__, **settings, "dtype": dtype},
                        sources())
        with _lock:
            if entry_key in _memo:
                return _memo[entry_key]
        folder = cache_folder() if cache else None
        entry = read(folder, entry_key, _valid)
        if entry is None:
            entry = _lowered(module(), theorem, backward, chosen, tiles, hardware, strict, dtype)
            write(folder, entry_key, entry)
        built = _compiled(entry, theorem), entry["source"]
        with _lock:
            _memo[entry_key] = built
        return built

    return Fused(theorem, chosen, backward, build)


def _default_target() -> str:
    return "pallas" if jax.default_backend() == "gpu" else "jax"


def _kernel_dtype(arrays: Sequence[Any]) -> str:
    if not arrays:
        return "float32"
    kind = jax.dtypes.canonicalize_dtype(jnp.result_type(*arrays))
    if not jnp.issubdtype(kind, jnp.floating):
        raise TypeError(f"napkin kernels take real floating-point arrays; the inputs' common type is {kind}")
    if kind.name not in ("float32", "bfloat16", "float16"):
        raise TypeError(f"napkin kernels are emitted in float32, bfloat16 or float16; the inputs' common type is "
                        f"{kind.name}: cast them to one of these first")
    return kind.name


def _lowered(module: Module, theorem: str, backward: tuple[str, ...], target: str, tiles: Mapping[str, int] | None,
             hardware: str | None, strict: bool, dtype: str) -> dict[str, Any]:
    if backward == (DERIVED,):
        found = derived(module, theorem, target=target, hardware=hardware or DEFAULT_HARDWARE[target], strict=strict)
        forward, joined = found.forward, list(found.backward)
    else:
        forward, *joined = [_proved(module, name, strict) for name in (theorem, *backward)]
    lowered = lower(forward, target=target, tiles=tiles, dtype=dtype, hardware=hardware, backward=joined)
    return {"format": _FORMAT, "function": lowered.function, "source": lowered.source,
            "tiles": dict(lowered.tiles), "trust": list(forward.trust)}


def _proved(module: Module, name: str, strict: bool) -> Theorem:
    thm = proof.prove(module, name)
    if strict and thm.tested:
        raise NapkinError(error("fuse.not_proved", name=name, tested="; ".join(thm.tested)))
    return thm


def _compiled(entry: Mapping[str, Any], theorem: str) -> Callable[..., Any]:
    function: Callable[..., Any] = compile_module(entry["source"], f"<napkin-fused:{theorem}>")[entry["function"]]
    return function


def _valid(entry: Any) -> bool:
    """Is ``entry`` a kernel entry of this layout (else it is lowered again)?"""
    return isinstance(entry, dict) and entry.get("format") == _FORMAT and isinstance(entry.get("source"), str) \
        and isinstance(entry.get("function"), str)
