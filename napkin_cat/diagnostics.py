"""Source spans, diagnostics and their rendering.

Every message a user can see for bad input is a template in ``MESSAGES``, keyed by a
short code; code raises ``NapkinError`` carrying one or more ``Diagnostic``s, and only
``cli`` prints them.  Rendering follows compilers users know: ``FILE:LINE:COL: error:
message``, the source line, a caret under the span, then an optional hint.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from napkin_cat.files import FileRefused, read_source

__all__ = [
    "MESSAGES",
    "Diagnostic",
    "NapkinError",
    "Span",
    "did_you_mean",
    "error",
    "render",
    "source_lines",
]

#: what ends a line of source: ``\r\n``, ``\r`` or ``\n``, and nothing else (the parser reads
#: the text with each of them made ``\n``, so the two count lines alike; the other characters
#: ``str.splitlines`` breaks at, such as form feed or U+2028, end no line)
LINE_BREAK = re.compile(r"\r\n?|\n")


def source_lines(text: str) -> list[str]:
    """The lines of ``text`` as the parser counts them (``LINE_BREAK``)."""
    lines = LINE_BREAK.split(text)
    return lines[:-1] if lines and lines[-1] == "" and len(lines) > 1 else lines


@dataclass(frozen=True)
class Span:
    """A region of a source file; lines and columns count from 1."""

    file: str
    line: int
    col: int
    end_line: int = 0
    end_col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


#: The one table of user-facing messages.  Keys are stable codes (tests match on them).
MESSAGES: dict[str, str] = {
    # syntax
    "syntax.unexpected_token": "unexpected {token}; expected {expected}",
    "syntax.unexpected_char": "unexpected character {char!r}; expected {expected}",
    "syntax.unexpected_eof": "unexpected end of file; expected {expected}",
    "syntax.hidden_char": "character U+{point} may show as a line break or reorder the text around it, so the line "
                          "would not read as napkin reads it (the rest of a comment looking like code); remove it",
    "syntax.too_deep": "expression nested more than {limit} levels deep; name intermediate results with `=`",
    # files and modules
    "file.not_found": "cannot read {path}: {reason}",
    "use.cycle": "`use` cycle: {cycle}",
    "use.not_ncd": "`use` reads only .ncd files; `{path}` is not one",
    "use.not_parsed": "`{path}` does not parse as .ncd (line {line}, column {col}); `napkin parse` on it shows why",
    # names
    "name.unknown": "unknown {kind} `{name}`",
    "name.duplicate": "duplicate definition of {kind} `{name}` (first defined at {first})",
    "name.use_before_def": "`{name}` is used before it is defined (defined at {defined})",
    "name.reserved": "`{name}` is reserved and cannot name {kind}",
    "diagram.recursion": "diagram `{name}` calls itself: {cycle}",
    # axes and types
    "axis.size_clash": "axis `{axis}` is declared with size {size} here but {other} at {first}",
    "axis.not_declared": "unknown axis `{axis}`",
    "axis.repeated": "axis `{axis}` appears twice in one array type",
    "axis.missing": "{box} needs axis `{axis}` but no operand has it (operand axes: {have})",
    "axis.not_on_operand": "{box}: operand {index} lacks axis `{axis}` (it has {have})",
    "axis.bad_size": "axis `{axis}` has size {size}; sizes must be positive integers up to {limit}",
    "axis.bad_tile": "{kind} `{axis}` by {size}: a tile must be a name or a positive integer up to {limit}",
    "type.return_mismatch": "return type mismatch: declared {declared}, got {actual}",
    "relation.reads": "the relation giving `{input}` reads `{name}`, {what}: a relation is an expression of the "
                      "diagram's other inputs",
    "relation.type": "the relation giving `{input}` has type {actual}; the input is declared {declared}",
    "relation.integer": "the relation giving `{input}` is not integer-valued, and `{input}` is declared `int` (exact "
                        "integers): give an integer expression (`floor`, a comparison) or declare it real",
    "type.return_count": "`{diagram}` declares {declared} outputs but returns {actual}",
    "type.arg_missing_axis": "argument {index} of `{callee}` must have axes {expected}; it has {actual}",
    "type.predicate_outside_where": "a comparison or logical operator is only allowed as the condition of `where`",
    "type.predicate_expected": "the first argument of `where` must be a comparison of indices, e.g. `q >= x`",
    "type.number": "the number `{text}` is {what} of float64, napkin's constants: the checker would prove a "
                   "statement about {value}, not the one written",
    "type.dtype": "unknown element type `{name}`: an input is real (no type name) or `int`",
    "type.integer_lemma": "lemma parameter `{name}`: lemmas range over real arrays; `int` is for diagram inputs",
    "type.integer_needed": "{box}: operand {index} must be an integer (an `int` input, a position, a comparison, "
                           "a `floor` or integer arithmetic of them); it is real",
    "type.gather_axis": "gather[{axis}]: axis `{axis}` must be on the table (operand 1, {have}) and not on the "
                        "positions (operand 2, {positions})",
    "type.topk_size": "topk[{axis} -> {k}]: {why}",
    "type.index_axis": "`{name}` in an index expression must be one of the box's axes {axes}",
    "type.index_expr": "index expressions allow integers, axis indices, +, - and * only",
    "type.index_int": "index integer {value} is past {limit}: positions and index arithmetic are 64-bit integers",
    "type.tuple_arity": "`{callee}` returns {n} outputs; bind them with {n} names",
    "type.tuple_in_expr": "`{callee}` returns {n} outputs and cannot be used inside an expression",
    "type.split_sizes": "split[{axis} -> {parts}]: sizes {sizes} do not multiply to {total}",
    "type.woven_clash": (
        "argument {index} of `{callee}` has axis `{axis}`, which `{callee}` uses inside; rename it before weaving"
    ),
    "type.axis_exists": "{box}: axis `{axis}` is already on the operand",
    "type.transpose": "transpose[{axes}]: must list exactly the operand's axes {have}",
    # boxes
    "box.unknown": "unknown box `{name}`",
    "box.arity": "`{name}` takes {expected} argument(s), got {got}",
    "box.axis_count": "`{name}` takes {expected} axis name(s) {place}, got {got}",
    "box.needs_target": "`{name}` needs target axes in brackets, e.g. `{name}[x](...)`",
    "box.no_target": "`{name}` takes no target axes",
    "box.needs_arrow": "`{name}` needs `->` in its brackets, e.g. `{example}`",
    "box.no_arrow": "`{name}` takes no `->` in its brackets",
    "box.params": "`{name}` takes parameters {expected}; got {got}",
    "box.param_value": "`{name}`: parameter {index} must be one of {allowed}, got `{got}`",
    # evaluation
    "eval.arity": "`{diagram}` takes {expected} inputs, got {got}",
    "eval.rank": "input `{name}` must have {rank} axes {axes}, got an array of shape {shape}",
    "eval.size": "axis `{axis}` has size {expected} but input `{name}` has {got} along it",
    "eval.unbound": "axis `{axis}` has no size: give it with sizes={{'{axis}': N}}",
    "eval.too_large": "evaluating `{diagram}` holds {points:.3g} points over [{axes}] in one box, past the "
        "{limit:.3g} an evaluation may allocate",
    "eval.dtype": "input `{name}` holds {kind} values; napkin evaluates real numbers",
    "eval.integer": "input `{name}` is declared `int` but holds {value!r}, not an integer",
    "eval.range": "input `{name}` holds {value!r} at {index}, outside float32's range (0 or 2^-149 <= |x| <= 2^128), "
        "the domain napkin's proofs and kernels take",
    "eval.topk_size": "topk[{axis} -> {k}] selects {count} positions but `{axis}` has {size}",
    "eval.size_binding": "size for axis `{axis}` must be a positive integer, got {got!r}",
    # lowering (napkin_cat.lower refuses what a target cannot serve, before anything runs)
    "lower.target": "unknown lowering target `{target}`; targets: {targets}",
    "lower.mosaic": "`{name}` cannot be lowered for Mosaic GPU: {reason}",
    "lower.dtype": "unknown dtype `{dtype}`; known: {known}",
    "lower.hardware": "{reason}",
    "hardware.profile": "hardware profile {path}: {reason}",
    "lower.tile_kernel": "tile `{key}` names no kernel being lowered; NAME.TILE binds a tile of one of: {kernels}",
    "lower.tile_unbound": "tile `{tile}` of axis `{axis}` has no positive integer size; give it with --tile {tile}=N",
    "lower.tile_pow2": "tile {tile} of axis `{axis}`: the Pallas GPU (Triton) backend needs power-of-two blocks "
        "of at least {least} (or groups of 1)",
    "lower.mixed_partition": "axis `{axis}` is both grouped and streamed; a kernel walks an axis one way",
    "lower.streams": "the lowering streams one axis per kernel; this schedule streams {axes}",
    "lower.grid_consumed": "axis `{axis}` cannot be a grid axis: `{node}` ({op}) reads across its positions, and "
        "grid programs run in parallel",
    "lower.grid_output": "grid axis `{axis}` is not on output {index}: every program would write all of it",
    "lower.triton_op": "`{node}` ({op}) needs `{missing}`, which the Pallas Triton backend cannot lower; use "
        "--target jax",
    "lower.stream_mixed": "`{node}` ({op}) reads across positions of the streamed axis `{axis}`; rewrite it into "
        "a consuming box first",
    "lower.after_axis": "`{node}` needs the whole streamed axis `{axis}` after its accumulators finish (a second pass)",
    "lower.reshape_padded": "`{node}` ({op}) reshapes axis `{axis}`, which is padded to whole blocks",
    "lower.no_pad": "`{node}` ({op}) consumes or mixes the padded axis `{axis}` and no padding value leaves it "
        "unchanged",
    "lower.unbound_axis": "axis `{axis}` of `{node}` gets its size from no input and has no declared size",
    "lower.chain_unbound_axis": "kernel `{kernel}` of chain `{theorem}` needs the size of axis `{axis}` (at "
        "`{node}`), but reads no array along it ({carriers}); a kernel takes its sizes from its "
        "own inputs: declare the size (`axis {axis} = N`) or cut the chain where the kernel reads an array along "
        "`{axis}`",
    "lower.mesh_tile": "tile `{tile}` is a mesh tile: each device's block of `{axis}` is ⌈|{axis}|/N⌉ for N "
        "devices (--mesh N), not a given size",
    "fuse.not_proved": "theorem `{name}` rests on what is only tested ({tested}); napkin_cat.fuse takes proved "
        "theorems (strict=False to accept it)",
    "lower.backward_mesh": "a forward with backward kernels runs on one device: lower it without --mesh",
    "lower.backward_input": "input `{name}` of backward `{diagram}` is none of the forward's inputs ({inputs}), "
        "named outputs ({outputs}) or output cotangents ({cotangents})",
    "lower.backward_type": "input `{name}` of backward `{diagram}` has axes [{got}]; the forward's `{name}` has "
        "[{want}]",
    "lower.backward_output": "output {index} of backward `{diagram}` must be a binding named d + a forward input "
        "({names}), typed as that input",
    "lower.backward_primal": "no backward reads a cotangent of the forward's outputs ({cotangents}): nothing to "
        "differentiate",
    "lower.backward_wrong": "the backward passes do not give the forward's VJP (napkin_cat.grad): {why}",
    "lower.backward_untestable": "the join of `{forward}`'s backward passes cannot be tested: {why}",
    "lower.backward_derived": "cannot derive a backward for `{diagram}`: {why}",
    "lower.backward_unproved": "the backward passes of `{forward}` are not proved to give its VJP "
        "(certify.prove.prove_join: {why})",
    "lower.mesh_devices": "--mesh {devices}: a mesh has 1 to {limit} devices",
    "lower.mesh_none": "--mesh {devices}: `{name}` has no partition at mesh (`group AXIS by TILE at mesh` shards "
        "an axis, `stream AXIS by TILE at mesh via ACC` rings one)",
    "lower.mesh_scan": "`{name}` scans `{axis}` at mesh: its chunks run one after another, each from the carry of "
        "the one before, which no device-to-device code passes; scan at hbm or below",
    "lower.mesh_axes": "a mesh of one axis shards at most one axis and rings at most one; `{name}` {what} at mesh",
    "lower.mesh_ring_alone": "the ring of `{axis}` needs an axis sharded at mesh as well (each device keeps its "
        "tile of it): add `group AXIS by TILE at mesh` for an axis every output carries",
    "lower.mesh_ring_device": "the ring of `{axis}` folds each block into the accumulator state by streaming it on "
        "the device: add `stream {axis} by TILE via ACC` after the mesh partitions",
    "lower.mesh_ring_output": "output {index} carries the ring axis `{axis}`: no device holds all of it",
    "lower.mesh_both": "input `{name}` carries both the sharded axis `{group}` and the ring axis `{ring}`: the "
        "devices of a ring must hold the same block of `{group}`, which a mesh of one axis cannot give",
    "lower.mesh_output": "output {index} lacks the sharded axis `{axis}`: every device would write all of it",
    "lower.split_pallas": "--target pallas cannot run the split of `{axis}`: {why}; use --target jax",
    "lower.split_many": "the lowering runs one split per kernel; this schedule splits {axes}",
    "lower.chain": "a chain of kernels as the forward lowers on one device without a custom backward (a backward "
        "theorem may be a chain); {what} is not supported",
    "lower.split_mesh": "a split of `{axis}` runs on one device; lowering it with --mesh is not supported",
    "lower.split_stream": "the split of `{axis}` needs each program to stream its block (`stream {axis} by TILE "
        "via ACC` after the split); this schedule {what}",
    "lower.tile_assumption": "tiles {tiles} break `{name}`'s assumption {assumption}: {inner} does not divide {outer} "
        "(an inner tile divides the tile outside it, R9); the theorem claims nothing at these tiles",
    "lower.split_tile": "the split's block of {block} is not a multiple of the stream's chunk of {tile} along `{axis}`",
    "lower.split_output": "output {index} carries the split axis `{axis}`; a split writes no output along its axis",
    "lower.mesh_pallas_ring": "--target pallas cannot run the ring of `{axis}`: a Pallas kernel keeps its "
        "accumulator state inside one pallas_call and returns only the final value, while a ring carries the "
        "state from block to block; use --target jax",
    "lower.mesh_pallas_offset": "--target pallas: `{node}` reads positions along `{axis}`, which the mesh shards, "
        "and the Pallas kernel on each device does not know its shard's offset; use --target jax",
    "lower.constant": "the constant {value} is outside float32's range ({low} to {high} in magnitude, or 0): a "
        "kernel would compute with another number; fold it with the constants next to it (`A * (1e-39 * 1e38)` "
        "is lowered as `A * 0.1`) or rescale",
    # gradients
    "grad.no_inputs": "`{diagram}` has no inputs: its vector-Jacobian product would have no outputs, and a "
        "diagram returns at least one (there is nothing to differentiate)",
    # proofs (napkin_cat.kernel refuses; napkin_cat.proof reports)
    "proof.refused": "{rule}: {reason}",
    "proof.unknown_lemma": "unknown lemma `{name}`",
    "proof.lemma_invalid": "lemma `{name}`: {reason}",
    "proof.not_certified": "lemma `{name}` fails certification: {reason}",
}


@dataclass(frozen=True)
class Diagnostic:
    """One user-facing problem: a message code, its arguments and where it happened."""

    code: str
    args: tuple[tuple[str, object], ...] = ()
    span: Span | None = None
    hint: str | None = None
    severity: str = field(default="error")

    @property
    def message(self) -> str:
        return MESSAGES[self.code].format(**dict(self.args))


def error(code: str, span: Span | None = None, hint: str | None = None, **args: object) -> Diagnostic:
    """Build a diagnostic; ``code`` must be a key of ``MESSAGES``."""
    assert code in MESSAGES, code
    return Diagnostic(code, tuple(sorted(args.items())), span, hint)


class NapkinError(Exception):
    """Raised for bad input; carries every diagnostic found (never a bug)."""

    def __init__(self, diagnostics: Diagnostic | Sequence[Diagnostic]):
        diags = (diagnostics,) if isinstance(diagnostics, Diagnostic) else tuple(diagnostics)
        assert diags, "NapkinError needs at least one diagnostic"
        self.diagnostics: tuple[Diagnostic, ...] = diags
        super().__init__("\n".join(d.message for d in diags))

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(d.code for d in self.diagnostics)


def did_you_mean(name: str, candidates: Iterable[str]) -> str | None:
    """A hint naming the closest candidate, if any is close."""
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else None


def render(diag: Diagnostic, sources: dict[str, str] | None = None) -> str:
    """``FILE:LINE:COL: error: message``, then the line and a caret, then the hint."""
    if diag.span is None:
        out = [f"{diag.severity}: {diag.message}"]
    else:
        span = diag.span
        out = [f"{span}: {diag.severity}: {diag.message}"]
        text = (sources or {}).get(span.file)
        if text is None:
            try:  # read as the elaborator read it: regular files only, BOM dropped
                text = read_source(span.file)
            except FileRefused:
                text = None
        lines = source_lines(text) if text is not None else []
        if 1 <= span.line <= len(lines):
            # a character the terminal would not show as one column (a control character, a
            # line or page separator) is shown as U+FFFD, so the quote stays one line and the caret aligned
            line = "".join(c if c == "\t" or c.isprintable() else "\ufffd" for c in lines[span.line - 1])
            width = 1
            if span.end_line == span.line and span.end_col > span.col:
                width = span.end_col - span.col
            out.append(f"  {line}")
            indent = "".join("\t" if c == "\t" else " " for c in line[:span.col - 1])  # tabs keep the caret aligned
            out.append("  " + indent + " " * (span.col - 1 - len(indent)) + "^" * max(1, width))
    if diag.hint:
        out.append(f"  hint: {diag.hint}")
    return "\n".join(out)
