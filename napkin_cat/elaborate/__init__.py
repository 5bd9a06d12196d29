"""Lark tree -> IR terms: name resolution, axis and shape inference, weaving by name.

The elaborator never stops at the first problem: it records a diagnostic, gives the
offending expression no type, and carries on, so one run reports every error of a file
(and of the files it ``use``s).  ``load``/``loads`` raise ``NapkinError`` with all of them.

Typing rules (README, "The language"):
- a binary box broadcasts by name: its type is the union of its operands' axes in order
  of first appearance;
- a box that names axes in brackets acts on them and weaves every other axis;
- a diagram used as a box is woven over the extra axes of its arguments: its outputs get
  those axes in front, and an argument lacking one of them is shared.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from lark import Token, Tree

from napkin_cat import ops
from napkin_cat.diagnostics import Diagnostic, NapkinError, Span, did_you_mean, error
from napkin_cat.elaborate.expr import ExprElaborator, Node, _fmt, _span, _tok, _tokens
from napkin_cat.files import FileRefused, read_source, resolve_source
from napkin_cat.syntax import parse_tree
from napkin_cat.terms import (
    LEVELS,
    MAX_AXIS_SIZE,
    Apply,
    Axes,
    Axis,
    Diagram,
    Expr,
    KernelDecl,
    LemmaDecl,
    Let,
    Module,
    Param,
    Partition,
    Place,
    Quantise,
    Rewrite,
    Step,
    TheoremDecl,
    axes_in_order,
)

__all__ = ["load", "loads"]

#: errors that a `use`d file with errors may cause, since its names are then missing
_MAYBE_IMPORTED = ("name.unknown", "box.unknown", "axis.not_declared")



def load(path: str | Path) -> Module:
    """Read, parse and elaborate an .ncd file (and everything it ``use``s)."""
    return _Loader().load(Path(path))


def loads(text: str, path: str = "<string>") -> Module:
    """Parse and elaborate .ncd source text; ``use`` paths resolve against the folder of
    ``path`` (the cwd for ``<string>``)."""
    base = Path(path).resolve().parent if path != "<string>" else Path.cwd()
    return _Loader().elaborate(_Elaborator(text, path, base, ()))


class _Loader:
    """The files of one ``load``, each read, parsed and elaborated once, memoised by its
    resolved path (a `use` DAG costs its number of files, not its number of paths), in
    dependency order by an explicit stack, not recursion (a `use` chain may be as deep as
    there are files)."""

    def __init__(self) -> None:
        self.done: dict[Path, Module | NapkinError] = {}

    def load(self, path: Path) -> Module:
        try:
            key = resolve_source(path)
            text = read_source(path)
        except FileRefused as exc:
            raise NapkinError(error("file.not_found", path=exc.path, reason=exc.reason)) from None
        # `use` paths are relative to the file's own folder once its links are followed, as for a used file
        return self.elaborate(_Elaborator(text, str(path), key.parent, (key,)))

    def elaborate(self, root: _Elaborator) -> Module:
        """``root``'s module, after every file it uses (depth first; a file in progress that is
        used again is a cycle, which its user reports)."""
        frames = [(root, iter(root.parse()))]
        active = set(root.stack[-1:])
        while True:
            elaborator, pending = frames[-1]
            target = next(pending, None)
            if target is None:
                frames.pop()
                if not frames:
                    return elaborator.module(self.done)
                active.discard(elaborator.stack[-1])
                try:
                    self.done[elaborator.stack[-1]] = elaborator.module(self.done)
                except NapkinError as exc:
                    self.done[elaborator.stack[-1]] = exc
            elif target not in self.done and target not in active:
                try:
                    used = _Elaborator(read_source(target), str(target), target.parent, (*elaborator.stack, target))
                    frames.append((used, iter(used.parse())))
                    active.add(target)
                except FileRefused as exc:
                    self.done[target] = NapkinError(error("file.not_found", path=exc.path, reason=exc.reason))
                except NapkinError as exc:  # it does not parse
                    self.done[target] = exc


class _Elaborator(ExprElaborator):
    def __init__(self, text: str, path: str, base: Path, stack: tuple[Path, ...]):
        self.path = path
        self.base = base
        self.stack = stack  # the resolved files being loaded, from the first to this one
        self.text = text
        self.items: list[Node] = []
        self.used: list[tuple[Token, Path | None]] = []  # each `use` and the file it resolves to
        self.diags: list[Diagnostic] = []
        self.axes: dict[str, Axis] = {}  # everything in scope
        self.own_axes: list[Axis] = []
        self.diagrams: dict[str, Diagram] = {}  # everything in scope
        self.own_diagrams: list[Diagram] = []
        self.lemmas: list[LemmaDecl] = []
        self.failed: set[str] = set()  # diagrams with errors: calls to them report nothing more
        self.integers: set[str] = set()  # the integer-valued arrays of the diagram being elaborated
        self.imported_lemmas: list[LemmaDecl] = []
        self.theorems: list[TheoremDecl] = []
        self.uses: list[str] = []
        self.broken_uses: list[str] = []  # `use`d files with errors: names from them are missing
        self.files: list[str] = [path] if stack else []  # every file read: this one, then the used ones

    # -- helpers ----------------------------------------------------------------------
    def err(self, code: str, where: Node | Token | Span | None, hint: str | None = None, **args: object) -> None:
        span = where if isinstance(where, Span) or where is None else _span(where, self.path)
        if hint is None and self.broken_uses and code in _MAYBE_IMPORTED:
            hint = f"it may be defined in {', '.join(self.broken_uses)}, which has errors"
        self.diags.append(error(code, span, hint, **args))

    def axis_type(self, tree: Node) -> Axes | None:
        names: list[str] = []
        ok = True
        for tok in _tokens(tree):
            if tok.value not in self.axes:
                self.err("axis.not_declared", tok, did_you_mean(tok.value, self.axes), axis=tok.value)
                ok = False
            elif tok.value in names:
                self.err("axis.repeated", tok, axis=tok.value)
                ok = False
            names.append(tok.value)
        return tuple(names) if ok else None

    # -- the module -------------------------------------------------------------------
    def parse(self) -> list[Path]:
        """Parse the text (``NapkinError`` on a syntax error); the resolved files it uses."""
        self.items = list(parse_tree(self.text, self.path).children)
        self.used = [self.use_target(item) for item in self.items if item.data == "use_decl"]
        return [target for _, target in self.used if target is not None]

    def module(self, loaded: dict[Path, Module | NapkinError]) -> Module:
        """Elaborate the parsed items, with the files they use already in ``loaded``."""
        for tok, target in self.used:
            if target is not None:
                self.use(tok, target, loaded)
        items = self.items
        for item in items:
            if item.data == "axis_decl":
                for axis_item in item.children:
                    self.axis(axis_item)
        self.diagrams_of([i for i in items if i.data == "diagram"])
        for item in items:
            if item.data == "lemma":
                self.lemma(item)
            elif item.data == "theorem":
                self.theorem(item)
        if self.diags:
            raise NapkinError(sorted(self.diags, key=_diag_order))
        return Module(
            path=self.path,
            uses=tuple(self.uses),
            axes=tuple(self.own_axes),
            diagrams=tuple(self.own_diagrams),
            theorems=tuple(self.theorems),
            lemmas=tuple(self.lemmas),
            scope_diagrams=tuple(self.diagrams.values()),
            scope_axes=tuple(self.axes.values()),
            scope_lemmas=tuple(self.imported_lemmas + self.lemmas),
            scope_files=tuple(dict.fromkeys(self.files)),
        )

    def use_target(self, item: Node) -> tuple[Token, Path | None]:
        """A `use` and the file it names, resolved (``files.resolve_source``: a path ending in
        .ncd whose links lead to a file ending in .ncd), or None with the error recorded."""
        tok = _tok(item, 0)
        rel = tok.value[1:-1]
        self.uses.append(rel)
        if "\0" in rel or not rel.endswith(".ncd"):
            self.err("use.not_ncd", tok, path=ascii(rel)[1:-1])
            self.broken_uses.append(rel)
            return tok, None
        try:
            return tok, resolve_source(self.base / rel)
        except FileRefused as exc:
            self.err("file.not_found", tok, path=exc.path, reason=exc.reason)
            self.broken_uses.append(rel)
            return tok, None

    def use(self, tok: Token, target: Path, loaded: dict[Path, Module | NapkinError]) -> None:
        """Bring a used file's names into scope.  Only a regular .ncd file within the size
        limit is read (``files.read_source``), and a diagnostic never quotes a used file
        that does not parse as .ncd: its syntax error becomes one line at the `use`."""
        rel = tok.value[1:-1]
        if target in self.stack:
            cycle = " -> ".join(str(p.name) for p in self.stack[self.stack.index(target):]) + f" -> {target.name}"
            self.err("use.cycle", tok, cycle=cycle)
            return
        sub = loaded[target]
        if isinstance(sub, NapkinError):
            for d in sub.diagnostics:
                if d.code == "file.not_found" and d.span is None:
                    d = replace(d, span=_span(tok, self.path))
                elif d.code.startswith("syntax.") and d.span is not None and d.span.file == str(target):
                    self.err("use.not_parsed", tok, path=rel, line=d.span.line, col=d.span.col)
                    continue
                if d not in self.diags:  # a file used along several paths reports its errors once
                    self.diags.append(d)
            self.broken_uses.append(rel)
            return
        self.files.extend(sub.scope_files)
        for axis in sub.scope_axes:
            self.add_axis(axis, tok, own=False)
        for diagram in sub.scope_diagrams:
            prior = self.diagrams.get(diagram.name)
            if prior is not None and prior != diagram:
                self.err("name.duplicate", tok, kind="diagram", name=diagram.name, first=prior.span)
            self.diagrams[diagram.name] = diagram
        self.imported_lemmas.extend(lm for lm in sub.scope_lemmas if lm not in self.imported_lemmas)

    def axis(self, item: Node) -> None:
        name_tok = _tok(item, 0)
        size = _count(_tok(item, 1)) if len(item.children) > 1 else None
        if size is not None and not 0 < size <= MAX_AXIS_SIZE:
            self.err("axis.bad_size", item.children[1], axis=name_tok.value, size=_shown(_tok(item, 1)),
                     limit=MAX_AXIS_SIZE)
            return
        if name_tok.value in ops.OPS or name_tok.value == "inf":
            self.err("name.reserved", name_tok, name=name_tok.value, kind="an axis")
            return
        self.add_axis(Axis(name_tok.value, size, _span(name_tok, self.path)), name_tok, own=True)

    def add_axis(self, axis: Axis, where: Token, own: bool) -> None:
        prior = self.axes.get(axis.name)
        if prior is not None:
            if prior.size != axis.size:
                self.err("axis.size_clash", where, axis=axis.name, size=_size(axis.size),
                         other=_size(prior.size), first=prior.span)
            elif own and any(a.name == axis.name for a in self.own_axes):
                self.err("name.duplicate", where, kind="axis", name=axis.name, first=prior.span)
            return
        self.axes[axis.name] = axis
        if own:
            self.own_axes.append(axis)

    # -- diagrams, in dependency order --------------------------------------------------
    def diagrams_of(self, trees: list[Node]) -> None:
        by_name: dict[str, Node] = {}
        for t in trees:
            name = _tok(t, 0)
            if name.value in by_name or name.value in self.diagrams:
                prior = by_name.get(name.value)
                first = _span(prior, self.path) if prior is not None else self.diagrams[name.value].span
                self.err("name.duplicate", name, kind="diagram", name=name.value, first=first)
                continue
            if name.value in ops.OPS:
                self.err("name.reserved", name, name=name.value, kind="a diagram")
                continue
            by_name[name.value] = t
        calls = {n: [c for c in _calls(t) if c.value in by_name] for n, t in by_name.items()}
        done: set[str] = set()
        bad: set[str] = set()

        def visit(name: str, path: list[str]) -> None:
            if name in done or name in bad:
                return
            if name in path:
                cycle = [*path[path.index(name):], name]
                site = next(c for c in calls[path[-1]] if c.value == name)
                self.err("diagram.recursion", site, name=name, cycle=" -> ".join(cycle))
                bad.update(cycle)
                self.failed.update(cycle)
                return
            for callee in calls[name]:
                visit(callee.value, [*path, name])
            if name not in bad:
                diagram = self.diagram(by_name[name])
                if diagram is not None:
                    self.diagrams[name] = diagram
                    self.own_diagrams.append(diagram)
                else:
                    self.failed.add(name)
                done.add(name)

        for diagram_name in by_name:
            visit(diagram_name, [])

    def params(self, tree: Node | None, lemma: bool = False) -> tuple[list[Param], dict[str, Axes | None]]:
        """The well-typed inputs, and an environment that also binds the ill-typed ones to
        ``None`` so that their uses report nothing more."""
        out: list[Param] = []
        env: dict[str, Axes | None] = {}
        for p in tree.children if tree is not None else []:
            name = _tok(p, 0)
            axes = self.axis_type(p.children[-1])
            dtype = p.children[1] if len(p.children) == 3 else None
            integer = self.dtype(dtype, name, lemma) if isinstance(dtype, Token) else False
            if integer is None:
                axes = None
            if any(q.name == name.value for q in out):
                self.err("name.duplicate", name, kind="input", name=name.value,
                         first=next(q.span for q in out if q.name == name.value))
                continue
            env[name.value] = None
            if self.reserved(name, "an array"):
                continue
            if axes is not None:
                out.append(Param(name.value, axes, _span(name, self.path), integer=bool(integer)))
                env[name.value] = axes
        self.integers = {p.name for p in out if p.integer}
        return out, env

    def dtype(self, tok: Token, name: Token, lemma: bool) -> bool | None:
        """Is an input declared ``int``?  None after reporting a type name that is not ``int``,
        or ``int`` on a lemma parameter."""
        if tok.value != "int":
            self.err("type.dtype", tok, did_you_mean(tok.value, ["int"]), name=tok.value)
            return None
        if lemma:
            self.err("type.integer_lemma", tok, name=name.value)
            return None
        return True

    def reserved(self, name: Token, kind: str) -> bool:
        if name.value in self.axes or name.value == "inf":
            self.err("name.reserved", name, f"`{name.value}` is an axis; pick another array name",
                     name=name.value, kind=kind)
            return True
        return False

    def diagram(self, tree: Node) -> Diagram | None:
        name = _tok(tree, 0)
        rest = tree.children[1:]
        params_tree = rest[0] if rest and isinstance(rest[0], Tree) and rest[0].data == "params" else None
        out_tree = next(c for c in rest if isinstance(c, Tree) and c.data == "out_types")
        stmts = [c for c in rest if isinstance(c, Tree) and c.data in ("let", "ret")]
        n_errors = len(self.diags)
        inputs, env = self.params(params_tree)
        out_types = [self.axis_type(t) for t in out_tree.children]
        first_def: dict[str, Span] = {p.name: p.span for p in inputs if p.span}
        let_names = {tok.value: _span(tok, self.path) for s in stmts if s.data == "let"
                     for tok in s.children if isinstance(tok, Token)}
        given_tree = next((c for c in rest if isinstance(c, Tree) and c.data == "given"), None)
        if given_tree is not None:
            inputs = self.given(given_tree, inputs, env, let_names)
        body: list[Let] = []
        outputs: list[Expr | None] = []
        returned = False
        for stmt in stmts:
            if stmt.data == "let":
                names = [t for t in stmt.children if isinstance(t, Token)]
                expr = self.expr(stmt.children[-1], env, let_names)
                for tok in names:
                    if tok.value in first_def:
                        self.err("name.duplicate", tok, kind="array", name=tok.value, first=first_def[tok.value])
                    self.reserved(tok, "an array")
                    first_def.setdefault(tok.value, _span(tok, self.path))
                if expr is None:
                    for tok in names:
                        env[tok.value] = None
                    continue
                types = self.bind_types(expr, names, stmt)
                if len(names) == 1 and ops.integer_valued(expr, self.integers):
                    self.integers.add(names[0].value)
                for tok, axes in zip(names, types, strict=True):
                    env[tok.value] = axes
                if all(t is not None for t in types):
                    body.append(Let(tuple(t.value for t in names), expr, _span(stmt, self.path)))
            else:
                if returned:
                    self.err("name.duplicate", stmt, kind="return", name="return", first="an earlier return")
                returned = True
                outputs = [self.operand(e, env, {}) for e in stmt.children]
                self.check_return(name.value, stmt, outputs, out_types, stmt.children)
        if not returned:
            self.err("type.return_count", out_tree, diagram=name.value, declared=len(out_types), actual=0)
        results = [o for o in outputs if o is not None]
        if len(self.diags) > n_errors or len(results) != len(outputs) or any(t is None for t in out_types):
            return None
        diagram_axes = self.axes_used(inputs, body, results)
        return Diagram(name.value, tuple(inputs), tuple(body), tuple(results),
                       tuple(out_types), diagram_axes, _span(tree, self.path))  # type: ignore[arg-type]

    def given(self, tree: Node, inputs: list[Param], env: dict[str, Axes | None],
              let_names: dict[str, Span]) -> list[Param]:
        """The inputs with their relations (``given L = expr``, ``Param.given``): each names an
        input once, and its expression reads only the inputs no relation gives (not the input
        itself, nor a binding of the body) and has that input's type."""
        named = [_tok(rel, 0) for rel in tree.children]
        given = {tok.value for tok in named}
        free = {n: axes for n, axes in env.items() if n not in given}
        relations: dict[str, Expr] = {}
        seen: dict[str, Span] = {}
        for rel, tok in zip(tree.children, named, strict=True):
            if tok.value in seen:
                self.err("name.duplicate", tok, kind="relation", name=tok.value, first=seen[tok.value])
                continue
            seen[tok.value] = _span(tok, self.path)
            param = next((p for p in inputs if p.name == tok.value), None)
            if param is None:
                if tok.value not in env:  # an ill-typed input (env None) was reported already
                    self.err("name.unknown", tok, did_you_mean(tok.value, list(env)), kind="input", name=tok.value)
                continue
            reads = [_tok(v, 0) for v in rel.children[1].iter_subtrees_topdown() if v.data == "var"]
            bad = [r for r in reads if r.value in given or r.value in let_names]
            for r in bad:
                self.err("relation.reads", r, input=tok.value, name=r.value,
                         what="the input itself" if r.value == tok.value else
                         "an input a relation gives" if r.value in given else "a binding of the body")
            expr = None if bad else self.operand(rel.children[1], free, {})
            if expr is None:
                continue
            if set(expr.axes) != set(param.axes) or len(expr.axes) != len(param.axes):
                self.err("relation.type", rel.children[1], input=tok.value, declared=_fmt(param.axes),
                         actual=_fmt(expr.axes))
                continue
            if param.integer and not ops.integer_valued(expr, self.integers):  # claimed only where it is an integer
                self.err("relation.integer", rel.children[1], input=tok.value)
                continue
            relations[tok.value] = expr
        return [replace(p, given=relations[p.name]) if p.name in relations else p for p in inputs]

    def bind_types(self, expr: Expr, names: list[Token], stmt: Node) -> list[Axes | None]:
        if isinstance(expr, Apply):
            if len(expr.types) != len(names):
                self.err("type.tuple_arity", stmt, callee=expr.diagram.name, n=len(expr.types))
                return [None] * len(names)
            return list(expr.types)
        if len(names) != 1:
            self.err("type.tuple_arity", stmt, callee="this expression", n=1)
            return [None] * len(names)
        return [expr.axes]

    def check_return(self, name: str, stmt: Node, outputs: list[Expr | None],
                     out_types: list[Axes | None], trees: list[Node]) -> None:
        if len(outputs) != len(out_types):
            self.err("type.return_count", stmt, diagram=name, declared=len(out_types), actual=len(outputs))
            return
        for value, declared, tree in zip(outputs, out_types, trees, strict=True):
            if value is None or declared is None:
                continue
            if set(value.axes) != set(declared) or len(value.axes) != len(declared):
                self.err("type.return_mismatch", tree, declared=_fmt(declared), actual=_fmt(value.axes))

    def axes_used(self, inputs: Iterable[Param], body: Iterable[Let], outputs: Iterable[Expr]) -> tuple[Axis, ...]:
        names = axes_in_order(inputs, [*(let.expr for let in body), *outputs])
        return tuple(self.axes[n] for n in names if n in self.axes)

    # -- lemmas and theorems ----------------------------------------------------------------
    def lemma(self, tree: Node) -> None:
        name = _tok(tree, 0)
        rest = tree.children[1:]
        params_tree = rest[0] if isinstance(rest[0], Tree) and rest[0].data == "params" else None
        params, env = self.params(params_tree, lemma=True)
        n_errors = len(self.diags)
        finite = rest.pop() if isinstance(rest[-1], Tree) and rest[-1].data == "finite" else None
        lhs = self.operand(rest[-2], env, {})
        rhs = self.operand(rest[-1], env, {})
        if lhs is None or rhs is None or len(self.diags) > n_errors:
            return
        if any(lemma.name == name.value for lemma in self.lemmas):
            self.err("name.duplicate", name, kind="lemma", name=name.value,
                     first=next(lm.span for lm in self.lemmas if lm.name == name.value))
            return
        axes = self.axes_used(params, (), (lhs, rhs))
        self.lemmas.append(LemmaDecl(name.value, tuple(params), lhs, rhs, axes, _span(tree, self.path),
                                     tuple(str(t) for t in finite.children) if finite is not None else ()))

    def theorem(self, tree: Node) -> None:
        name, diagram = _tok(tree, 0), _tok(tree, 1)
        if diagram.value not in self.diagrams:
            self.err("name.unknown", diagram, did_you_mean(diagram.value, self.diagrams), kind="diagram",
                     name=diagram.value)
            return
        if any(t.name == name.value for t in self.theorems):
            self.err("name.duplicate", name, kind="theorem", name=name.value,
                     first=next(t.span for t in self.theorems if t.name == name.value))
            return
        blocks = [c for c in tree.children[2:] if isinstance(c, Tree) and c.data == "kernel_block"]
        steps = [self.step(s) for s in tree.children[2:] if s not in blocks]
        kernels = [self.kernel(b) for b in blocks]
        if any(s is None for s in steps) or any(k is None for k in kernels):
            return
        self.theorems.append(TheoremDecl(name.value, diagram.value, tuple(steps), _span(tree, self.path),  # type: ignore[arg-type]
                                         tuple(kernels)))  # type: ignore[arg-type]

    def kernel(self, tree: Node) -> KernelDecl | None:
        writes = tuple(str(t) for t in tree.children if isinstance(t, Token))
        steps = [self.step(s) for s in tree.children if isinstance(s, Tree)]
        return None if any(s is None for s in steps) else KernelDecl(writes, tuple(steps), _span(tree, self.path))  # type: ignore[arg-type]

    def level(self, tree: Node | None, default: str = "smem") -> str | None:
        if tree is None:
            return default
        tok = _tok(tree, 0)
        if tok.value not in LEVELS:
            self.err("name.unknown", tok, did_you_mean(tok.value, LEVELS), kind="memory level", name=tok.value)
            return None
        return str(tok.value)

    def step(self, tree: Node) -> Step | None:
        sp = _span(tree, self.path)
        kids = tree.children
        toks = [str(t) for t in kids if isinstance(t, Token) and t.type == "NAME"]
        sub = {c.data: c for c in kids if isinstance(c, Tree)}
        if tree.data == "rewrite_step":
            return Rewrite(toks[0], tuple(toks[1:]) + tuple(str(t) for t in kids if isinstance(t, Token)
                                                            and t.type == "RETURN"), sp)
        if tree.data in ("group_step", "stream_step", "split_step", "scan_step"):
            tile_tok = _tok(sub["tile"], 0)
            tile: str | int = _count(tile_tok) if tile_tok.type == "INT" else str(tile_tok)
            if isinstance(tile, int) and not 0 < tile <= MAX_AXIS_SIZE:
                self.err("axis.bad_tile", tile_tok, kind=tree.data.removesuffix("_step"), axis=toks[0],
                         size=_shown(tile_tok), limit=MAX_AXIS_SIZE)
                return None
            level = "hbm" if tree.data == "split_step" else self.level(sub.get("at_level"))  # a split's blocks
            via = str(sub["via"].children[0]) if "via" in sub else None  # stay in hbm, one per program
            pad = any(isinstance(t, Token) and t.type == "PAD" for t in kids)
            kind = tree.data.removesuffix("_step")
            return None if level is None else Partition(kind, toks[0], tile, level, via, pad, sp)
        if tree.data == "place_step":
            level = self.level(sub.get("at_level"))
            return None if level is None else Place(tuple(toks), level, sp)
        if tree.data == "dtype_step":
            number = next(t for t in kids if isinstance(t, Token) and t.type == "NUMBER")
            return Quantise(tuple(toks[:-1]), toks[-1], float(number), sp)
        raise AssertionError(tree.data)  # pragma: no cover


def _count(tok: Token) -> int:
    """An integer literal's value; one too long to be a size is any number past the limit."""
    text = str(tok)
    return int(text) if len(text) <= 20 else MAX_AXIS_SIZE + 1


def _shown(tok: Token) -> str:
    text = str(tok)
    return text if len(text) <= 20 else f"{text[:20]}... ({len(text)} digits)"


def _calls(tree: Node) -> list[Token]:
    """The names of every call in a diagram, in source order."""
    out: list[Token] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        if node.data == "call":
            out.append(_tok(node, 0))
        stack.extend(reversed([c for c in node.children if isinstance(c, Tree)]))
    return out


def _size(size: int | None) -> str:
    return "symbolic" if size is None else str(size)


def _diag_order(d: Diagnostic) -> tuple[str, int, int]:
    return (d.span.file, d.span.line, d.span.col) if d.span else ("", 0, 0)

