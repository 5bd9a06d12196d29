"""Lowering proved schedules to JAX: Pallas kernels and streamed plain-JAX functions.

``lower(theorem, target="pallas" | "mosaic" | "jax", tiles=None, dtype=None, hardware=None, mesh=None)``
returns a ``Lowered``: ``.source`` is a self-contained Python module (built with ``ast``,
byte-identical for the same input) defining one function named after the theorem, and
``.fn`` is that function, taking the diagram's inputs in declared order as jax arrays
(Pallas and Mosaic GPU ones also accept ``interpret=``; ``None`` means "interpret unless on a
GPU"; ``lower.mosaic`` is the Mosaic GPU target).
Partitions at ``mesh`` are realised only with ``mesh=N`` (``lower.mesh``: ``jax.shard_map``
over N devices, the device schedule inside each); without it one device runs everything.

The lowering is a fold over the scheduled IR (``layout`` places the schedule, ``fold``
turns phases into code, ``jaxops`` is the op table), not a template per algorithm.
It takes a ``Theorem`` only: a schedule reaches a kernel only after the trusted kernel
has proved it (``_lower_schedule``, the same on its parts, is this package's internal).
"""

from __future__ import annotations

import ast
import builtins
import linecache
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from napkin_cat import cost, ops
from napkin_cat.cost import hardware as hw
from napkin_cat.cost import optimise
from napkin_cat.diagnostics import NapkinError, error
from napkin_cat.kernel import Theorem
from napkin_cat.lower import backward as backward_target
from napkin_cat.lower import codegen as cg
from napkin_cat.lower import jax as jax_target
from napkin_cat.lower import mesh as mesh_target
from napkin_cat.lower import mosaic as mosaic_target
from napkin_cat.lower import pallas as pallas_target
from napkin_cat.lower.backward import UnprovedJoinWarning
from napkin_cat.lower.runtime import helper_source
from napkin_cat.lower.values import BIG, TINY
from napkin_cat.printer import print_diagram, print_step
from napkin_cat.proof import trust_line
from napkin_cat.schedule.layout import (
    DEFAULT_HARDWARE,
    KERNEL_DTYPES,
    KERNEL_TARGETS,
    PRICED_DTYPE,
    TARGETS,
    Layout,
    broken_nesting,
    fill_values,
    layout,
    padding_law,
    realised_schedule,
)
from napkin_cat.terms import Box, Diagram, Divides, Partition, Schedule

__all__ = ["DEFAULT_HARDWARE", "DEFAULT_TILE", "DTYPES", "KERNEL_DTYPES", "PRICED_DTYPE", "REPRESENTATIVE_SIZE",
           "TARGETS", "Lowered", "UnprovedJoinWarning", "compile_module", "default_tiles", "lower", "realised_schedule"]

#: dtype names accepted by ``dtype=``: every spelling the cost model accepts for a kernel format
DTYPES: dict[str, str] = {**{alias: KERNEL_DTYPES[canon] for alias, canon in hw.DTYPE_ALIASES.items()
                             if canon in KERNEL_DTYPES},
                          **KERNEL_DTYPES, **{name: name for name in KERNEL_DTYPES.values()}}

#: the tile used for a symbolic tile size when no cost model result is available: a power
#: of two that the Triton backend accepts and that keeps interpret-mode grids small
DEFAULT_TILE = 64

#: how many of the cost model's best configurations a target's own rule (``default_tiles``'
#: ``fits``) is tried on
FITTED = 16

#: the size assumed for symbolic axes when the cost model picks default tiles
REPRESENTATIVE_SIZE = 4096

#: what each target's module is, for its docstring
KINDS = {"pallas": "a JAX Pallas kernel", "mosaic": "a JAX Pallas Mosaic GPU kernel (plgpu.kernel)",
         "jax": "plain streamed JAX"}

#: what a chain of each target's kernels is, for its docstring
_KINDS_PLURAL = {"pallas": "JAX Pallas kernels", "mosaic": "JAX Pallas Mosaic GPU kernels",
                 "jax": "plain streamed JAX kernels"}

#: the dtype kernels are emitted in when none is given: f32, except where the target has no f32
#: path (Mosaic GPU's wgmma multiplies f16/bf16 only)
DEFAULT_DTYPE: dict[str, str] = {"mosaic": "bfloat16"}

#: names the emitted module defines or its code reads: no theorem, input or binding may take
#: one (a theorem named `len` would shadow the builtin its helpers call), nor any builtin
_RESERVED = ("jax", "jnp", "lax", "pl", "plgpu", "n", "p", "INF", "BIG", "TINY", "interpret", "bind_sizes",
             "index_range", "round_up", "pow2_extent", "pad_to", "erf", "linrec", "linrec_rows", "split_tiles",
             "merge_tiles", "device_mesh", "shard", "launch",
             *dir(builtins))


@dataclass(frozen=True)
class Lowered:
    """A lowered theorem: the module's source, its function (``fn``, a ``jax.custom_vjp``
    whose backward is the lowered VJP diagram), the tile sizes by tile name (``tiles``; a
    backward kernel's as ``KERNEL.TILE``), how
    the schedule was placed onto the kernel (``layout``), and ``forward``: the same kernel
    without the custom VJP (``jax.grad`` differentiates through its code; Pallas cannot)."""

    name: str
    target: str
    source: str
    fn: Callable[..., Any]
    tiles: Mapping[str, int]
    layout: Layout
    forward: Callable[..., Any]
    #: the emitted function's name: the theorem's, renamed where it would shadow a name the module uses
    function: str = ""
    #: a chain's kernels' layouts, in the order they run (``layout`` is the last one's)
    layouts: tuple[Layout, ...] = ()


def default_tiles(diagram: Diagram, schedule: Schedule, hardware: str | hw.Hardware | None = None,
                  dtype: str = "bf16", fits: Callable[[dict[str, int]], bool] | None = None,
                  ) -> tuple[dict[str, int], str]:
    """A size for every symbolic tile, and where it came from.

    The cost model's integer search (``optimise.search``: capacities, tensor-core and
    Triton constraints of ``hardware``, default h100 (``lower`` passes its target's
    ``DEFAULT_HARDWARE``); arrays in ``dtype``) picks the tiles
    for symbolic axes of ``REPRESENTATIVE_SIZE``: its best configuration, or with ``fits``
    (a target's own rule, Mosaic GPU's shared memory) the best of its ``FITTED`` best that
    ``fits``; where the model has no result for the
    schedule (a level the profile lacks) or no feasible configuration, every tile is
    ``DEFAULT_TILE``, and the origin says why.  A profile that cannot be loaded is never
    such a case: its ``HardwareError`` propagates.
    """
    names = [p.tile for p in schedule.partitions if isinstance(p.tile, str)]
    if not names:
        return {}, "fixed by the proof"
    profile = _profile(hardware)
    try:
        sizes = {a.name: REPRESENTATIVE_SIZE for a in diagram.axes if a.size is None}
        model = cost.cost_of(diagram, schedule, profile, sizes=sizes, dtype=dtype)
        rows = optimise.search(model, top=1 if fits is None else FITTED, relax=True).rows
        picks = [{n: int(row.tiles[n]) for n in names} for row in rows if set(names) <= set(row.tiles)]
        for rank, pick in enumerate(picks):
            if fits is None or fits(pick):
                where = "optimum" if rank == 0 else f"best configuration that fits (its number {rank + 1})"
                return pick, f"cost model {where} for {profile.key} at symbolic sizes {REPRESENTATIVE_SIZE}"
    except (ValueError, KeyError) as exc:  # e.g. a level the hardware profile lacks
        return {n: DEFAULT_TILE for n in names}, f"default {DEFAULT_TILE} (the cost model could not choose: {exc})"
    return {n: DEFAULT_TILE for n in names}, f"default {DEFAULT_TILE} (no feasible cost-model configuration)"


def _profile(hardware: str | hw.Hardware | None, target: str = "pallas") -> hw.Hardware:
    """The profile a lowering prices on (``hw.load``; the target's ``DEFAULT_HARDWARE`` for
    None); HardwareError for an unknown or malformed one."""
    if isinstance(hardware, hw.Hardware):
        return hardware
    return hw.load(hardware or DEFAULT_HARDWARE[target])


def lower(theorem: Theorem, target: str = "pallas", tiles: Mapping[str, int] | None = None,
          dtype: Any = None, hardware: str | hw.Hardware | None = None, mesh: int | None = None,
          backward: Sequence[Theorem] = (), allow_tested_join: bool = False) -> Lowered:
    """Lower a kernel ``Theorem``: its result diagram under its proved schedule (on ``mesh``
    devices: ``lower.mesh``).

    With ``backward`` (theorems whose diagrams compute the gradients from the forward's
    inputs, outputs and cotangents, ``lower.backward``), the function is a ``jax.custom_vjp``
    whose backward runs their kernels (a backward theorem that is a chain, ``kernel.chain``: its
    kernels in order, the arrays between them in HBM); ``tiles`` binds their tile names too, and
    ``NAME.TILE`` binds one kernel's tile alone (a chain's kernel by its name, ``THEOREM_k1``;
    ``Lowered.tiles`` gives the backward kernels' so).  A join the
    prover cannot prove is refused (``lower.backward_unproved``) unless ``allow_tested_join``:
    then it is lowered on the float64 test alone, with a ``UnprovedJoinWarning`` and the trust
    level in the module's docstring (``lower.backward``); one it refuses for a float64 hazard
    (``certify.prove.FloatHazard``) is refused either way.  Refuses
    (NapkinError) what the target cannot serve; a ``TypeError`` for anything but a
    ``Theorem`` (build one with ``napkin_cat.proof.theorem``/``prove`` or the kernel's rules).
    """
    for thm in (theorem, *backward):
        if not isinstance(thm, Theorem):
            raise TypeError(f"lower takes a kernel Theorem, not {type(thm).__name__}: prove the schedule first "
                            "(napkin_cat.proof.theorem(path, name) or kernel.refl for the unscheduled diagram)")
    if backward and mesh is not None:
        raise NapkinError(error("lower.backward_mesh"))
    link = backward_target.link(theorem.source, [b.source for b in backward], allow_tested_join) if backward \
        else None
    kernels = [k.name for k in theorem.kernels] or [k.name for thm in (theorem, *backward)
                                                     for k in (thm.kernels or (thm,))]
    for key in tiles or {}:
        if "." in key and key.split(".", 1)[0] not in kernels:
            raise NapkinError(error("lower.tile_kernel", key=key, kernels=", ".join(kernels)))
    if theorem.kernels:
        if backward or mesh is not None:
            raise NapkinError(error("lower.chain", what="--backward" if backward else "--mesh"))
        return _lower_chain(theorem, target, tiles, dtype, hardware)
    if link is not None and not link.proved:
        warnings.warn(f"{theorem.name}: the join of its backward kernels is not proved; lowered on the test alone: "
                      f"{link.trust}", UnprovedJoinWarning, stacklevel=2)
    return _lower_schedule(theorem.name, theorem.result, theorem.schedule, target, tiles, dtype, hardware,
                           proved=_proof(theorem), mesh=mesh, chosen=theorem.chosen, backward=backward, link=link,
                           constraints=theorem.constraints)


def _kernel_tiles(name: str, tiles: Mapping[str, int] | None) -> dict[str, int]:
    """The tiles that bind kernel ``name``: every plain name, and ``NAME.TILE`` (one kernel's
    own, over the plain one); the kernels of a training step share tile names (the forward's
    and the dQ pass's ``gq``, ``sx``) but not their best sizes."""
    own = {k: v for k, v in (tiles or {}).items() if "." not in k}
    own.update({k.split(".", 1)[1]: v for k, v in (tiles or {}).items() if k.split(".", 1)[0] == name and "." in k})
    return own


def _tile_names(theorem: Theorem) -> set[str]:
    """The symbolic tile names of a kernel's schedule."""
    return {p.tile for p in theorem.schedule.partitions if isinstance(p.tile, str)}


def _proof(theorem: Theorem) -> str:
    """The docstring's ``Proved by:`` line: ``napkin check``'s trust line, its input relations included."""
    return trust_line(theorem) or "kernel rules"


@dataclass(frozen=True)
class _Placed:
    """A schedule placed onto a target: the layout, the tiles by tile name and where they came from."""

    layout: Layout
    tiles: dict[str, int]
    origin: str


def _place(name: str, diagram: Diagram, schedule: Schedule, constraints: Sequence[Divides], target: str,
           tiles: Mapping[str, int] | None, hardware: hw.Hardware,
           chosen: Mapping[tuple[str, str, tuple[str, ...], tuple[str, ...]], str] | None,
           dtype: str = "bfloat16") -> _Placed:
    """The device schedule's layout, with default tiles for the symbolic ones not given (on
    Mosaic GPU, tiles whose kernel in ``dtype`` fits the profile's shared memory with its full
    pipeline at the least sizes: ``mosaic.fits_smem``), refused at tiles that break one of the
    theorem's nested tile assumptions (``constraints``: ``_check_nesting``)."""
    device = schedule.device()  # mesh tiles are the devices' blocks, not chosen here
    given = dict(tiles or {})
    for p in schedule.mesh:
        if p.tile in given and all(p.tile != d.tile for d in device.partitions):
            raise NapkinError(error("lower.mesh_tile", tile=p.tile, axis=p.axis))
    for p in device.partitions:  # a tile given by its axis name binds the symbolic tile too
        if isinstance(p.tile, str) and p.tile not in given and p.axis in given:
            given[p.tile] = given[p.axis]
    missing = [p.tile for p in device.partitions if isinstance(p.tile, str) and p.tile not in given]
    if missing:
        fits = None
        if target == "mosaic":
            def fits(pick: dict[str, int]) -> bool:
                return mosaic_target.fits_smem(lambda: layout(name, diagram, device, {**pick, **given}, target, chosen),
                                               dtype, int(hardware.level("smem").capacity),
                                               int(mosaic_target.mosaic_rules(hardware).get(
                                                   "max_concurrent_steps", mosaic_target.MOSAIC_STEPS)))
        elif target == "pallas" and device.split is not None:
            def fits(pick: dict[str, int]) -> bool:  # tiles the model prices that the layout refuses (a block
                # that is no whole number of chunks under a stream without `pad`)
                try:
                    layout(name, diagram, device, {**pick, **given}, target, chosen)
                except NapkinError:
                    return False
                return True
        defaults, origin = default_tiles(diagram, realised_schedule(diagram, device, target),
                                         hardware.for_mosaic() if target == "mosaic" else hardware,
                                         PRICED_DTYPE.get(target, "bf16"), fits)
        unrealised = sorted(n for n in missing if n not in defaults)  # plain JAX vectorises them whole
        if unrealised:
            defaults |= {n: DEFAULT_TILE for n in unrealised}
            origin += f"; {', '.join(unrealised)}: {DEFAULT_TILE}, not realised by this target"
        origin = f"{', '.join(sorted(given))} given; the others: {origin}" if given else origin
    else:
        defaults, origin = {}, "given" if given else "fixed by the proof"
    picked = {**defaults, **given}
    _check_nesting(name, device, constraints, picked)
    return _Placed(layout(name, diagram, device, picked, target, chosen), picked, origin)


def _check_nesting(name: str, device: Schedule, constraints: Sequence[Divides], picked: Mapping[str, int]) -> None:
    """Refuse tiles that break a nested divisibility assumption the theorem records (`rx | sx`: R9, in
    ``constraints``, evaluated by ``layout.broken_nesting``): the kernel realises only the outermost
    tile of an axis, so it would run under a claim the theorem does not make.  The outermost tile's
    own assumption (`sx | x`) is padded over: Pallas and Mosaic GPU pad the axis to whole tiles with
    the fill values of the boxes that meet it (refusing a box with none, ``lower.no_pad``), plain JAX
    runs the ragged last tile."""
    values, seen = [], set()
    for p in device.partitions:  # as ``layout`` reads them: the outermost by name or axis, a nested one by name
        if p.axis in seen:
            values.append(picked.get(p.tile, 0) if isinstance(p.tile, str) else p.tile)
        else:
            values.append(picked.get(p.tile if isinstance(p.tile, str) else p.axis, picked.get(p.axis, 0)))
            seen.add(p.axis)
    if broken := broken_nesting(constraints, device.partitions, values):
        assumption, inner, outer = broken
        raise NapkinError(error("lower.tile_assumption", name=name, assumption=f"`{assumption}`", inner=inner,
                                outer=outer, tiles=", ".join(f"{k}={v}" for k, v in sorted(picked.items()))))


def _target_profile(name: str, target: str, hardware: str | hw.Hardware | None, dtype: Any) -> tuple[hw.Hardware, str]:
    """The hardware profile ``name`` is lowered for on ``target``, and its dtype's name; NapkinError for an
    unknown target, an unknown or malformed profile (never priced silently on another profile or default
    tiles), or the Mosaic GPU target on a profile without its [mosaic] table."""
    if target not in TARGETS:
        raise NapkinError(error("lower.target", target=target, targets=", ".join(TARGETS)))
    dtype_name = _dtype_name(dtype, target)
    try:
        profile = _profile(hardware, target)
    except hw.HardwareError as exc:
        raise NapkinError(error("lower.hardware", reason=str(exc))) from None
    if target == "mosaic" and not profile.mosaic:
        raise NapkinError(error("lower.mosaic", name=name, reason=f"the hardware profile `{profile.key}` has no "
                                "[mosaic] table (wgmma shapes, TMA box, pipeline depth); use h100 or h200"))
    return profile, dtype_name


def _lower_schedule(name: str, diagram: Diagram, schedule: Schedule, target: str = "pallas",
                    tiles: Mapping[str, int] | None = None, dtype: Any = None,
                    hardware: str | hw.Hardware | None = None, proved: str = "not proved (a bare schedule)",
                    mesh: int | None = None,
                    chosen: Mapping[tuple[str, str, tuple[str, ...], tuple[str, ...]], str] | None = None,
                    backward: Sequence[Theorem] = (), link: backward_target.Link | None = None,
                    constraints: Sequence[Divides] = ()) -> Lowered:
    """Lower ``diagram`` under ``schedule``, which the caller has proved (on ``mesh`` devices:
    ``lower.mesh``; with ``backward`` kernels joined by ``link``: ``lower``; assuming its tile
    ``constraints``, ``Theorem.constraints``: a bare schedule claims none); refuses
    (NapkinError) what the target cannot serve, and re-checks the schedule's shape (defence
    in depth)."""
    profile, dtype_name = _target_profile(name, target, hardware, dtype)
    if schedule.split is not None and mesh is not None:  # before pricing its tiles
        raise NapkinError(error("lower.split_mesh", axis=schedule.split.axis))
    if mesh is not None and target == "mosaic":
        raise NapkinError(error("lower.mosaic", name=name, reason="a mesh (its kernels are Pallas Triton or plain "
                                "JAX programs per device); use --target pallas or jax"))
    plan = None if mesh is None else mesh_target.mesh_plan(name, schedule, mesh)
    placed = _place(name, diagram, schedule, constraints, target, _kernel_tiles(name, tiles), profile, chosen,
                    dtype_name)
    lay = placed.layout
    if plan is not None:  # each device's block a whole number of the tiles the theorem assumes divide it
        plan = replace(plan, whole=mesh_target.whole_tiles(schedule, constraints, lay.tiles))
    namer = cg.Namer(_RESERVED)
    fname = namer.fresh(name)
    params = [namer.fresh(p) for p, _ in lay.flat.inputs]
    priced = _priced(lay, profile)
    doc = _docstring(lay, target, placed.origin, dtype_name, priced, proved, schedule,
                     None if plan is None else mesh_target.describe(plan, lay))
    functions: list[ast.stmt]
    if plan is not None:
        functions = mesh_target.emit_functions(lay, plan, fname, params, doc, dtype_name, namer)
    else:
        forward = _emit(lay, fname, params, doc, dtype_name, namer, priced, profile)
        if link is None:
            defined, gradients = backward_target.differentiable(forward, diagram, target, params, _RESERVED)
        else:
            kernels, chains = [], []
            for thm in backward:
                if thm.kernels:  # a chain: its kernels, and the function calling them in order as the backward kernel
                    chained = _chain_functions(thm, namer.fresh(thm.name), [namer.fresh(p.name) for p in
                                                                            thm.result.inputs],
                                               target, tiles, profile, dtype_name, namer)
                    run = chained.functions[-1]
                    run.body[0] = ast.Expr(ast.Constant("\n".join([
                        f"`{thm.name}`: {len(chained.layouts)} kernels run in order (proved by {_proof(thm)}):",
                        *chained.docs])))
                    chains += chained.functions[:-1]
                    kernels.append(run)
                    placed.tiles.update({f"{k.name}.{t}": v for k in thm.kernels
                                         for t, v in chained.tiles.items() if t in _tile_names(k)})
                    continue
                back = _place(thm.name, thm.result, thm.schedule, thm.constraints, target,
                              _kernel_tiles(thm.name, tiles), profile, thm.chosen, dtype_name)
                back_name = namer.fresh(thm.name)
                back_priced = _priced(back.layout, profile)
                back_doc = _docstring(back.layout, target, back.origin, dtype_name, back_priced, _proof(thm),
                                      thm.schedule, None)
                back_params = [cg.Namer(_RESERVED).fresh(p) for p, _ in back.layout.flat.inputs]
                kernels.append(_emit(back.layout, back_name, back_params, back_doc, dtype_name,
                                     cg.Namer([*_RESERVED, back_name, *back_params]), back_priced, profile))
                placed.tiles.update({f"{thm.name}.{k}": v for k, v in back.tiles.items()})
            defined, gradients = backward_target.joined(forward, kernels, [t.name for t in backward], link, target,
                                                        params, _RESERVED)
            defined = [defined[0], *chains, *defined[1:]]
        functions, doc = list(defined), doc + gradients + "\n"
    first = functions[0]  # without a mesh, the forward kernel (under a private name when a custom VJP wraps it)
    assert isinstance(first, ast.FunctionDef)
    namespace, source = _module(name, target, functions, doc, fname)
    forward_fn = namespace[fname if plan is not None else first.name]
    return Lowered(name, target, source, namespace[fname], placed.tiles, lay, forward_fn, fname)


def _module(name: str, target: str, functions: list[ast.stmt], doc: str, fname: str) -> tuple[dict[str, Any], str]:
    """The module of ``functions`` (the public one last, its docstring ``doc``) with its imports and helpers,
    compiled: its names and its source."""
    public = functions[-1]
    assert isinstance(public, ast.FunctionDef)
    public.body[0] = ast.Expr(ast.Constant(doc.replace("\n", "\n    ")))
    body = [cg.import_("jax"), cg.import_("jax.numpy", "jnp"), cg.import_("jax", names=("lax",))]
    if target in KERNEL_TARGETS:
        body.append(cg.import_("jax.experimental", names=("pallas as pl",)))
        backend = "triton" if target == "pallas" else "mosaic_gpu"
        body.append(cg.import_("jax.experimental.pallas", names=(f"{backend} as plgpu",)))
    body += [cg.assign("INF", cg.attr("jnp.inf")), cg.assign("BIG", cg.const(BIG)), cg.assign("TINY", cg.const(TINY))]
    helpers = ["bind_sizes"] + (["round_up", "pow2_extent", "pad_to"] if target in KERNEL_TARGETS else [])
    used = {n.id for f in functions for n in ast.walk(f) if isinstance(n, ast.Name)}
    helpers += [h for h in ("round_up", "device_mesh", "shard", "split_tiles", "merge_tiles", "erf", "linrec",
                            "linrec_rows", "launch", "argmax", "topk", "pair_kinds", "live_chunks", "index_range")
                if h in used and h not in helpers]
    body += helper_source(helpers)
    if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "wgmma"
           for f in functions for n in ast.walk(f)):
        body += ast.parse(mosaic_target.WGMMA_SOURCE).body
    body += functions
    summary = doc.splitlines()[0] + f"\n\nGenerated by napkin; the contract is in the docstring of `{fname}`.\n"
    source = cg.module(summary, body)
    return compile_module(source, f"<napkin-{target}:{name}>"), source


def _lower_chain(theorem: Theorem, target: str, tiles: Mapping[str, int] | None, dtype: Any,
                 hardware: str | hw.Hardware | None) -> Lowered:
    """A chain (``kernel.chain``) as one function: each kernel lowered as ``lower`` lowers a theorem, then called
    in order, the arrays each writes passed to the kernels after it (in HBM); differentiable as one kernel is."""
    profile, dtype_name = _target_profile(theorem.name, target, hardware, dtype)
    namer = cg.Namer(_RESERVED)
    fname = namer.fresh(theorem.name)
    params = [namer.fresh(p.name) for p in theorem.result.inputs]
    chained = _chain_functions(theorem, fname, params, target, tiles, profile, dtype_name, namer)
    doc = "\n".join([f"`{theorem.name}` lowered by napkin to {len(chained.layouts)} "
                     f"{_KINDS_PLURAL[target]} run in order.",
                     "", "Theorem: " + theorem.name, "Proved by: " + _proof(theorem),
                     "Kernels (each array a kernel writes is kept in HBM for the kernels after it):",
                     *chained.docs]) + "\n"
    kernels, forward = chained.functions[:-1], chained.functions[-1]
    defined, gradients = backward_target.differentiable(forward, theorem.result, target, params, _RESERVED)
    functions: list[ast.stmt] = [*kernels, *defined]
    namespace, source = _module(theorem.name, target, functions, doc + gradients + "\n", fname)
    return Lowered(theorem.name, target, source, namespace[fname], chained.tiles, chained.layouts[-1],
                   namespace[defined[0].name], fname, chained.layouts)


@dataclass(frozen=True)
class _Chained:
    """A chain's kernels as functions, the function calling them in order last (its docstring
    empty, for the caller to write), with each kernel's layout, the tiles by tile name and a
    line per kernel for the docstring."""

    functions: list[ast.FunctionDef]
    layouts: tuple[Layout, ...]
    tiles: dict[str, int]
    docs: list[str]


def _chain_functions(theorem: Theorem, fname: str, params: Sequence[str], target: str,
                     tiles: Mapping[str, int] | None, profile: hw.Hardware, dtype_name: str,
                     namer: cg.Namer) -> _Chained:
    """Each kernel of the chain ``theorem`` lowered as ``lower`` lowers a theorem (``NAME.TILE``
    binding one kernel's tile by the kernel's name), and ``fname(params)`` calling them in order,
    each written array passed to the kernels after it: the chain's function, whether it is
    lowered alone (``_lower_chain``) or as a backward kernel (``lower``'s ``backward``)."""
    env = {p.name: name for p, name in zip(theorem.result.inputs, params, strict=True)}
    kernels: list[ast.FunctionDef] = []
    calls, lays, picked, docs = [], [], {}, []
    keyword = ", interpret=interpret" if target in ("pallas", "mosaic") else ""
    for k, writes in zip(theorem.kernels, theorem.writes, strict=True):
        try:
            placed = _place(k.name, k.result, k.schedule, k.constraints, target, _kernel_tiles(k.name, tiles),
                            profile, k.chosen, dtype_name)
        except NapkinError as exc:
            raise _chain_unbound(exc, theorem, k) from None
        kname = namer.fresh(k.name)
        kparams = [cg.Namer(_RESERVED).fresh(p) for p, _ in placed.layout.flat.inputs]
        priced = _priced(placed.layout, profile)
        kdoc = _docstring(placed.layout, target, placed.origin, dtype_name, priced, _proof(k), k.schedule, None)
        kernels.append(_emit(placed.layout, kname, kparams, kdoc, dtype_name,
                             cg.Namer([*_RESERVED, kname, *kparams]), priced, profile))
        args = ", ".join(env[p.name] for p in k.result.inputs)
        if writes == ("return",):
            calls.append(f"return {kname}({args}{keyword})")
        else:
            env.update((n, namer.fresh(n)) for n in writes)
            calls.append(f"{', '.join(env[n] for n in writes)} = {kname}({args}{keyword})")
        lays.append(placed.layout)
        picked.update(placed.tiles)
        wrote = "the outputs" if writes == ("return",) else ", ".join(writes)
        docs.append(f"  {kname}: writes {wrote}; {_placement(placed.layout, target)}")
    star = ", *, interpret=None" if target in ("pallas", "mosaic") else ""
    text = f"def {fname}({', '.join(params)}{star}):\n    ''\n" + "".join(f"    {c}\n" for c in calls)
    run = ast.parse(text).body[0]
    assert isinstance(run, ast.FunctionDef)
    return _Chained([*kernels, run], tuple(lays), picked, docs)


def _chain_unbound(exc: NapkinError, theorem: Theorem, k: Theorem) -> NapkinError:
    """``exc`` from placing kernel ``k`` of the chain ``theorem``, with an axis no input of ``k`` sizes
    (``lower.unbound_axis``) said as the chain's: the kernel is named, and so are the chain's arrays along the
    axis that it does not read (the interpreter, ``run_schedule``, takes the size from them; a lowered kernel
    takes its sizes from its own inputs)."""
    said = []
    for d in exc.diagnostics:
        args = dict(d.args)
        if d.code != "lower.unbound_axis":
            said.append(d)
            continue
        axis = args["axis"]
        inputs = [p.name for p in theorem.result.inputs if axis in p.axes]
        written = [n for kernel, writes in zip(theorem.kernels[:-1], theorem.writes[:-1], strict=True)
                   if kernel is not k for n, axes in zip(writes, kernel.result.out_types, strict=True) if axis in axes]
        arrays = ", ".join(f"`{a}`" for a in inputs + written)
        carriers = f"the chain's {arrays} {'does' if len(inputs + written) == 1 else 'do'}" if arrays else \
            "no array of the chain does"
        said.append(error("lower.chain_unbound_axis", d.span, kernel=k.name, theorem=theorem.name, axis=axis,
                          node=args["node"], carriers=carriers))
    return NapkinError(said)


def _dtype_name(dtype: Any, target: str) -> str:
    if dtype is None:
        return DEFAULT_DTYPE.get(target, "float32")
    key = getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)
    if key.lower() not in DTYPES:
        raise NapkinError(error("lower.dtype", dtype=key, known=", ".join(KERNEL_DTYPES)))
    return DTYPES[key.lower()]


def compile_module(source: str, filename: str) -> dict[str, Any]:
    """Execute a generated module (``Lowered.source``) and return its names; tracebacks show
    its lines (registered with linecache)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"__name__": filename}
    exec(compile(source, filename, "exec"), namespace)  # the module napkin just generated
    return namespace


def _describe(partition: Partition, lay: Layout) -> str:
    """``axis: tile = N`` for the partition the kernel realises (the outermost of its axis);
    a nested one (registers) is the compiler's: named as such, never with the outer value."""
    if partition.kind == "split" and lay.split is not None:
        named = f"{partition.tile} = {lay.split[1]}" if isinstance(partition.tile, str) else str(lay.split[1])
        return f"{partition.axis}: {named} per program (split)"
    outer = next(p for p in lay.schedule.unsplit().partitions if p.axis == partition.axis)
    if partition is not outer:
        return f"{partition.axis}: {partition.tile} at {partition.level} (not realised: the compiler's)"
    value = lay.tiles.get(partition.axis)
    named = f"{partition.tile} = {value}" if isinstance(partition.tile, str) else str(value)
    return f"{partition.axis}: {named}"


def _docstring(lay: Layout, target: str, origin: str, dtype: str, priced: _Priced, proved: str,
               schedule: Schedule, mesh: str | None) -> str:
    """What the module is: theorem, diagram, schedule, tiles, placement, mesh, cost bound, proof."""
    sched = lay.schedule
    steps: Sequence[Any] = (*schedule.partitions, *schedule.placements, *schedule.quantisations)
    lines = [
        f"`{lay.name}` lowered by napkin to {KINDS[target]}.",
        "",
        "Theorem: " + lay.name,
        "Proved by: " + proved,
        "Diagram (as the proof rewrote it):",
        *("    " + line for line in print_diagram(lay.diagram).splitlines()),
        "Schedule: " + ("; ".join(print_step(s) for s in steps) or "none"),
        "Tiles: " + (", ".join(dict.fromkeys(_describe(p, lay) for p in sched.partitions)) or "none")
        + f" ({origin})",
        "Placement: " + _placement(lay, target),
        *(["Mesh: " + (mesh or "not realised: one device runs the whole (give mesh=N, --mesh N, to shard)")]
          if schedule.mesh else []),
        *_padding(lay, schedule),
        "Cost bound: " + _cost_bound(priced),
        f"Dtype: inputs and outputs {dtype}; arithmetic and accumulation in float32." if dtype == "float32" else
        f"Dtype: inputs and outputs {dtype}; every dot's operands rounded to {dtype} (products accumulated in "
        "float32), other arithmetic in float32: roundings of the lowering, beyond the theorem's dtype steps.",
    ]
    return "\n".join(lines) + "\n"


def _padding(lay: Layout, schedule: Schedule) -> list[str]:
    """The docstring's ``Padding:`` line: each box that consumes or mixes an axis the kernel pads past its
    size (``Layout.may_pad``) though the theorem declares no ``pad`` for it, with its fills and how its
    padding law is certified (``layout.padding_law``): the theorem assumes its tiles divide such an axis."""
    declared = {p.axis for p in schedule.partitions if p.pad}
    laws = []
    for node in lay.flat.nodes:
        box = node.expr
        if not isinstance(box, Box) or ops.OPS[box.op].kind not in ("reduce", "normalise", "contract", "ncontract",
                                                                      "topk"):
            continue  # the boxes ``jaxops.mask_padded`` masks
        for axis in box.target:
            if axis in declared or not lay.may_pad(axis):
                continue
            fills = ", ".join(f"{f:g}" for f in fill_values(box, axis) or ())
            plan = lay.plans.get(node.name)
            laws.append(f"{node.name} = {box.op}[{axis}] (fills {fills}): "
                        f"{padding_law(box, axis, plan.name if plan is not None else None)}")
    if not laws:
        return []
    return ["Padding (axes the theorem assumes its tiles divide, padded where they do not; the padding law: "
            "padded positions change nothing): " + "; ".join(laws)]


def _placement(lay: Layout, target: str) -> str:
    parts = []
    if target in KERNEL_TARGETS:
        grid = [f"{a} (one program per position)" if a in lay.squeezed else f"{a} (blocks of {lay.tiles[a]})"
                for a in lay.grid]
        parts.append("grid over " + (", ".join(grid) if grid else "nothing (one program)"))
    elif lay.grid:
        parts.append("vectorised over " + ", ".join(lay.grid))
    if lay.split is not None:
        where = "the grid's last axis" if target in KERNEL_TARGETS else "jax.vmap over the blocks"
        parts.append(f"{lay.split[0]} split in blocks of {lay.split[1]} ({where}), their states combined in order "
                     "(lax.fori_loop)")
    if lay.stream is not None:
        accs = sorted({p.name for p in lay.plans.values()})
        parts.append(f"{lay.stream} streamed in chunks of {lay.tiles[lay.stream]} carrying {', '.join(accs)}")
    return "; ".join(parts) or "one call, nothing partitioned"


@dataclass(frozen=True)
class _Priced:
    """A kernel's cost model (``cost.cost_of`` of its realised schedule on ``hardware``, the
    target's ``DEFAULT_HARDWARE`` unless given), derived once for its docstring's cost bound
    and its launch: None, with why, where the model has no result for the schedule; the tiles
    by tile name."""

    model: cost.Cost | None
    why: str
    tiles: dict[str, int]


def _priced(lay: Layout, hardware: hw.Hardware) -> _Priced:
    schedule = realised_schedule(lay.diagram, lay.schedule, lay.target)
    tiles = {p.tile: lay.split[1] if p.kind == "split" and lay.split else lay.tiles[p.axis]
             for p in schedule.partitions if isinstance(p.tile, str)}
    try:
        return _Priced(cost.cost_of(lay.diagram, schedule, hardware), "", tiles)
    except (ValueError, KeyError) as exc:
        return _Priced(None, str(exc), tiles)


def _emit(lay: Layout, fname: str, params: Sequence[str], doc: str, dtype: str, namer: cg.Namer,
          priced: _Priced, hardware: hw.Hardware) -> ast.FunctionDef:
    """One kernel's function on its target; a Pallas kernel is launched by ``_launch_rule``, a
    Mosaic GPU one under the profile's Mosaic rules."""
    if lay.target == "mosaic":
        return mosaic_target.emit_function(lay, fname, params, doc, dtype, namer, hardware.mosaic,
                                           int(hardware.level("smem").capacity))
    if lay.target != "pallas":
        return jax_target.emit_function(lay, fname, params, doc, dtype, namer)
    return pallas_target.emit_function(lay, fname, params, doc, dtype, namer, _launch_rule(priced))


def _launch_rule(priced: _Priced) -> pallas_target.LaunchRule | None:
    """What the Pallas kernel's launch is chosen from (``cost.launch``): its on-chip needs at
    these tiles; None where the cost model has no result for the schedule or the profile no
    launch rules (Triton's defaults then)."""
    model = priced.model
    if model is None or not model.hardware.launch:
        return None
    values, fixed, staged, rows = (model.at(e, priced.tiles) for e in model.on_chip)
    return pallas_target.LaunchRule(values, fixed, staged, rows, model.hardware.launch,
                                    model.hardware.level(model.program.compute_level).capacity)


def _cost_bound(priced: _Priced) -> str:
    """H at the first level below HBM (values moved), symbolic and at the chosen tiles, and FLOPs."""
    model = priced.model
    if model is None:
        return f"not derived ({priced.why})"
    level = model.first
    return (f"H_{level.name} = {level.transfers} values between hbm and {level.name}"
            f" (= {model.at(level.transfers, priced.tiles)} at these tiles); FLOPs = {model.flops}")
