"""Lowering proved schedules to JAX: Pallas kernels and streamed plain-JAX functions.

``lower(theorem, target="pallas" | "jax", tiles=None, dtype=None, hardware=None)``
returns a ``Lowered``: ``.source`` is a self-contained Python module (built with ``ast``,
byte-identical for the same input) defining one function named after the theorem, and
``.fn`` is that function, taking the diagram's inputs in declared order as jax arrays
(Pallas ones also accept ``interpret=``; ``None`` means "interpret unless on a GPU").

The lowering is a fold over the scheduled IR (``layout`` places the schedule, ``fold``
turns phases into code, ``jaxops`` is the op table), not a template per algorithm.
``lower_schedule`` is the same on a bare ``(name, diagram, schedule)``.
"""

from __future__ import annotations

import ast
import linecache
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from napkin_cat.diagnostics import NapkinError, error
from napkin_cat.lower import codegen as cg
from napkin_cat.lower import jax as jax_target
from napkin_cat.lower import pallas as pallas_target
from napkin_cat.lower.jaxops import BIG, INF, TINY
from napkin_cat.lower.layout import Layout, layout
from napkin_cat.lower.runtime import helper_source
from napkin_cat.printer import print_diagram, print_step
from napkin_cat.terms import Diagram, Partition, Schedule

__all__ = ["DEFAULT_TILE", "DTYPES", "TARGETS", "Lowered", "default_tiles", "lower", "lower_schedule"]

TARGETS = ("pallas", "jax")

#: dtype names accepted by ``dtype=``, by their common spellings
DTYPES: dict[str, str] = {"float32": "float32", "f32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
                          "float16": "float16", "f16": "float16"}

#: the tile used for a symbolic tile size when no cost model result is available: a power
#: of two that the Triton backend accepts and that keeps interpret-mode grids small
DEFAULT_TILE = 64

_RESERVED = ("jax", "jnp", "lax", "pl", "n", "p", "INF", "BIG", "TINY", "interpret", "bind_sizes", "round_up",
             "pow2_extent", "pad_to", "erf", "split_tiles", "merge_tiles", "float", "tuple")


@dataclass(frozen=True)
class Lowered:
    """A lowered theorem: the module's source, its function, and how it was placed."""

    name: str
    target: str
    source: str
    fn: Callable[..., Any]
    tiles: Mapping[str, int]
    layout: Layout


def default_tiles(schedule: Schedule, hardware: str | None = None) -> dict[str, int]:
    """A size for every symbolic tile of the schedule: ``DEFAULT_TILE`` each.

    ``hardware`` is recorded for the cost model's optimiser; until it chooses tiles the
    default is the documented power of two.
    """
    return {p.tile: DEFAULT_TILE for p in schedule.partitions if isinstance(p.tile, str)}


def lower(theorem: Any, target: str = "pallas", tiles: Mapping[str, int] | None = None,
          dtype: Any = None, hardware: str | None = None) -> Lowered:
    """Lower a kernel ``Theorem`` (``.name``, ``.result``, ``.schedule``, ``.trust``)."""
    proof = "; ".join(theorem.trust) if getattr(theorem, "trust", ()) else "kernel rules"
    return lower_schedule(theorem.name, theorem.result, theorem.schedule, target, tiles, dtype, hardware,
                          proved=proof)


def lower_schedule(name: str, diagram: Diagram, schedule: Schedule, target: str = "pallas",
                   tiles: Mapping[str, int] | None = None, dtype: Any = None, hardware: str | None = None,
                   proved: str = "not proved (a bare schedule)") -> Lowered:
    """Lower ``diagram`` under ``schedule``; refuses (NapkinError) what the target cannot serve."""
    if target not in TARGETS:
        raise NapkinError(error("lower.target", target=target, targets=", ".join(TARGETS)))
    dtype_name = _dtype_name(dtype)
    chosen = {**default_tiles(schedule, hardware), **(tiles or {})}
    lay = layout(name, diagram, schedule, chosen, target)
    namer = cg.Namer(_RESERVED)
    fname = namer.fresh(name)
    params = [namer.fresh(p) for p, _ in lay.flat.inputs]
    doc = _docstring(lay, target, chosen, dtype_name, hardware, proved)
    emitter = pallas_target if target == "pallas" else jax_target
    function = emitter.emit_function(lay, fname, params, doc.replace("\n", "\n    "), dtype_name, namer)
    body = [cg.import_("jax"), cg.import_("jax.numpy", "jnp"), cg.import_("jax", names=("lax",))]
    if target == "pallas":
        body.append(cg.import_("jax.experimental", names=("pallas as pl",)))
    body += [cg.assign("INF", cg.const(INF)), cg.assign("BIG", cg.const(BIG)), cg.assign("TINY", cg.const(TINY))]
    helpers = ["bind_sizes"] + (["round_up", "pow2_extent", "pad_to"] if target == "pallas" else [])
    used = {n.id for n in ast.walk(function) if isinstance(n, ast.Name)}
    helpers += [h for h in ("split_tiles", "merge_tiles", "erf") if h in used]
    body += helper_source(helpers)
    body.append(function)
    summary = doc.splitlines()[0] + f"\n\nGenerated by napkin; the contract is in the docstring of `{fname}`.\n"
    source = cg.module(summary, body)
    return Lowered(name, target, source, _compile(source, fname, f"<napkin-{target}:{name}>"),
                   {k: v for k, v in chosen.items()}, lay)


def _dtype_name(dtype: Any) -> str:
    if dtype is None:
        return "float32"
    key = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    if key not in DTYPES:
        raise NapkinError(error("lower.dtype", dtype=key, known=", ".join(sorted(set(DTYPES.values())))))
    return DTYPES[key]


def _compile(source: str, fname: str, filename: str) -> Callable[..., Any]:
    """Execute the module; tracebacks show its lines (registered with linecache)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": filename}
    exec(compile(source, filename, "exec"), namespace)  # the module napkin just generated
    fn: Callable[..., Any] = namespace[fname]
    return fn


def _describe(partition: Partition, lay: Layout) -> str:
    """``axis: tile = N`` for the partition the kernel realises; inner levels are the compiler's."""
    value = lay.tiles.get(partition.axis)
    named = f"{partition.tile} = {value}" if isinstance(partition.tile, str) else str(value)
    return f"{partition.axis}: {named}"


def _docstring(lay: Layout, target: str, tiles: Mapping[str, int], dtype: str, hardware: str | None,
               proved: str) -> str:
    """What the module is: theorem, diagram, schedule, tiles, placement, cost bound, proof."""
    sched = lay.schedule
    steps: Sequence[Any] = (*sched.partitions, *sched.placements, *sched.quantisations)
    lines = [
        f"`{lay.name}` lowered by napkin to {'a JAX Pallas kernel' if target == 'pallas' else 'plain streamed JAX'}.",
        "",
        "Theorem: " + lay.name,
        "Proved by: " + proved,
        "Diagram (as the proof rewrote it):",
        *("    " + line for line in print_diagram(lay.diagram).splitlines()),
        "Schedule: " + ("; ".join(print_step(s) for s in steps) or "none"),
        "Tiles: " + (", ".join(dict.fromkeys(_describe(p, lay) for p in sched.partitions)) or "none"),
        "Placement: " + _placement(lay, target),
        "Cost bound: " + _cost_bound(lay, tiles, hardware),
        f"Dtype: inputs and outputs {dtype}; arithmetic and accumulation in float32.",
    ]
    return "\n".join(lines) + "\n"


def _placement(lay: Layout, target: str) -> str:
    parts = []
    if target == "pallas":
        grid = [f"{a} (one program per position)" if a in lay.squeezed else f"{a} (blocks of {lay.tiles[a]})"
                for a in lay.grid]
        parts.append("grid over " + (", ".join(grid) if grid else "nothing (one program)"))
    elif lay.grid:
        parts.append("vectorised over " + ", ".join(lay.grid))
    if lay.stream is not None:
        accs = sorted({p.name for p in lay.plans.values()})
        parts.append(f"{lay.stream} streamed in chunks of {lay.tiles[lay.stream]} carrying {', '.join(accs)}")
    return "; ".join(parts) or "one call, nothing partitioned"


def _cost_bound(lay: Layout, tiles: Mapping[str, int], hardware: str | None) -> str:
    try:
        from napkin_cat import cost  # type: ignore[attr-defined]
    except ImportError:
        return "not derived (napkin_cat.cost is not available)"
    describe = getattr(cost, "describe_bound", None)
    if describe is None:
        return "not derived (napkin_cat.cost has no describe_bound)"
    return str(describe(lay.diagram, lay.schedule, tiles, hardware))
