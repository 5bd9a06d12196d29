"""Expressions: box typing, index predicates and diagrams used as boxes (weaving).

A mixin of the elaborator (``napkin_cat.elaborate``): it reports problems through
``self.err`` and reads the scope (``self.axes``, ``self.diagrams``, ``self.failed``).
Checks live here; the typing rule itself is ``ops.result_axes``, shared with the kernel.
"""

from __future__ import annotations

import math
from typing import Any

from lark import Token, Tree

from napkin_cat import ops
from napkin_cat.diagnostics import Span, did_you_mean
from napkin_cat.limits import MAX_INDEX_INT
from napkin_cat.terms import (
    Apply,
    Axes,
    Axis,
    Box,
    Cmp,
    Const,
    Diagram,
    Expr,
    IBin,
    Idx,
    IInt,
    IndexExpr,
    Logic,
    Pred,
    Size,
    Var,
    union_axes,
)

_PRED_NODES = ("compare", "and_", "or_", "not_")

#: a node of the Lark tree that ``syntax.parse_tree`` returns
Node = Tree[Any]


def _span(node: Node | Token, path: str) -> Span:
    if isinstance(node, Token):
        return Span(path, node.line or 0, node.column or 0, node.end_line or 0, node.end_column or 0)
    meta = node.meta
    if getattr(meta, "empty", True):
        return Span(path, 0, 0)
    return Span(path, meta.line, meta.column, meta.end_line, meta.end_column)


def _tok(tree: Node, index: int) -> Token:
    """Child ``index`` of a node, where the grammar puts a token."""
    child = tree.children[index]
    assert isinstance(child, Token), child
    return child


def _tokens(tree: Node | None) -> list[Token]:
    return [c for c in tree.children if isinstance(c, Token)] if tree is not None else []


def _fmt(axes: Axes) -> str:
    return "[" + " ".join(axes) + "]"



class ExprElaborator:
    """Elaboration of array expressions, shared state provided by the elaborator."""

    path: str
    axes: dict[str, Axis]
    diagrams: dict[str, Diagram]
    failed: set[str]
    integers: set[str]

    def err(self, code: str, where: Node | Token | Span | None, hint: str | None = None,
            **args: object) -> None:
        raise NotImplementedError

    # -- expressions ------------------------------------------------------------------------
    def expr(self, tree: Node | Token, env: dict[str, Axes | None], later: dict[str, Span]) -> Expr | None:
        """Elaborate one array expression; ``None`` after reporting an error."""
        if isinstance(tree, Token):  # pragma: no cover - the grammar wraps every token
            raise AssertionError(tree)
        kind = tree.data
        sp = _span(tree, self.path)
        if kind == "number":
            text = _tok(tree, 0).value
            value = float(text)
            if math.isinf(value) or (value == 0 and any(c in "123456789" for c in text.lower().split("e")[0])):
                # 1e400 would be inf, 1e-400 zero: printed back as `inf`, `0`, and proved of those
                what = "past the largest finite value" if value else "below the smallest positive value"
                self.err("type.number", tree, text=text, what=what, value="inf" if value else "0")
                return None
            return Const(value, sp)
        if kind == "inf":
            return Const(math.inf, sp)
        if kind == "var":
            return self.var(_tok(tree, 0), env, later)
        if kind == "neg":
            inner = self.operand(tree.children[0], env, later)
            if inner is None:
                return None
            if isinstance(inner, Const):
                return Const(-inner.value, sp)
            return Box("neg", (inner,), inner.axes, span=sp)
        if kind in ops.INFIX:  # the grammar names its infix rules after their ops
            left = self.operand(tree.children[0], env, later)
            right = self.operand(tree.children[1], env, later)
            if left is None or right is None:
                return None
            return Box(kind, (left, right), ops.result_axes(kind, (left.axes, right.axes)), span=sp)
        if kind in _PRED_NODES:
            self.err("type.predicate_outside_where", tree)
            return None
        assert kind == "call", kind
        return self.call(tree, env, later)

    def operand(self, tree: Node, env: dict[str, Axes | None], later: dict[str, Span]) -> Expr | None:
        """An expression used as an operand or output, where a multi-output call is refused."""
        value = self.expr(tree, env, later)
        if isinstance(value, Apply) and len(value.types) != 1:
            self.err("type.tuple_in_expr", tree, callee=value.diagram.name, n=len(value.types))
            return None
        return value

    def operands(self, trees: list[Node], env: dict[str, Axes | None], later: dict[str, Span]) -> list[Expr] | None:
        """Elaborate every argument (reporting each one's errors); None if any failed."""
        args = [self.operand(t, env, later) for t in trees]
        present = [a for a in args if a is not None]
        return present if len(present) == len(args) else None

    def var(self, tok: Token, env: dict[str, Axes | None], later: dict[str, Span]) -> Expr | None:
        name = tok.value
        sp = _span(tok, self.path)
        if name in env:
            axes = env[name]
            return None if axes is None else Var(name, axes, sp)
        if name in later:
            self.err("name.use_before_def", tok, name=name, defined=later[name])
            return None
        if name in self.axes:
            return Size(name, sp)
        self.err("name.unknown", tok, did_you_mean(name, list(env) + list(self.axes)), kind="name", name=name)
        return None

    def call(self, tree: Node, env: dict[str, Axes | None], later: dict[str, Span]) -> Expr | None:
        name = _tok(tree, 0)
        target_tree = next((c for c in tree.children[1:] if isinstance(c, Tree) and c.data == "target"), None)
        args_tree = next((c for c in tree.children[1:] if isinstance(c, Tree) and c.data == "args"), None)
        arg_trees = list(args_tree.children) if args_tree is not None else []
        op = name.value
        if op in self.failed:  # already reported; still check the arguments
            for a in arg_trees:
                self.operand(a, env, later)
            return None
        if op in self.diagrams:
            if target_tree is not None:
                self.err("box.no_target", target_tree, name=op)
                return None
            args = self.operands(arg_trees, env, later)
            return None if args is None else self.apply(self.diagrams[op], args, tree)
        if op in ("max", "min") and target_tree is None:
            op = "maximum" if op == "max" else "minimum"
        if op not in ops.OPS:
            hint = did_you_mean(op, list(ops.OPS) + list(self.diagrams))
            self.err("box.unknown", name, hint, name=op)
            return None
        info = ops.OPS[op]
        target, out, params = self.target(target_tree)
        if not self.check_brackets(info, name, target_tree, target, out, params):
            return None
        if info.kind in ("where", "index"):
            return self.indexed(info, tree, target, arg_trees, env, later)
        if info.arity is not None and len(arg_trees) != info.arity:
            self.err("box.arity", tree, name=name.value, expected=info.arity, got=len(arg_trees))
            return None
        if info.arity is None and not arg_trees:
            self.err("box.arity", tree, name=name.value, expected="one or more", got=0)
            return None
        args = self.operands(arg_trees, env, later)
        if args is None:
            return None
        typed = self.box_type(info, tree, target, out, args)
        if typed is None or not self.integers_ok(info, tree, target, args):
            return None
        return Box(op, tuple(args), typed, target, out or (), params or (), span=_span(tree, self.path))

    def target(self, tree: Node | None) -> tuple[Axes, Axes | None, tuple[str, ...] | None]:
        if tree is None:
            return (), None, None
        names = tuple(t.value for t in _tokens(tree))
        arrow = next((c for c in tree.children if isinstance(c, Tree) and c.data == "arrow"), None)
        plist = next((c for c in tree.children if isinstance(c, Tree) and c.data == "param_list"), None)
        out = tuple(t.value for t in _tokens(arrow)) if arrow is not None else None
        params = tuple(t.value for t in _tokens(plist)) if plist is not None else None
        return names, out, params

    def check_brackets(self, info: ops.OpInfo, name: Token, tree: Node | None,
                       target: Axes, out: Axes | None, params: tuple[str, ...] | None) -> bool:
        if info.target == "none":
            if tree is not None:
                self.err("box.no_target", tree, name=name.value)
                return False
            return True
        if tree is None or (info.target == "required" and not target):
            self.err("box.needs_target", tree or name, name=name.value)
            return False
        ok = True
        for axis in dict.fromkeys(list(target) + list(out or ())):
            if axis not in self.axes:
                self.err("axis.not_declared", tree, did_you_mean(axis, self.axes), axis=axis)
                ok = False
        if len(set(target)) != len(target):
            dup = next(a for a in target if target.count(a) > 1)
            self.err("axis.repeated", tree, axis=dup)
            ok = False
        if info.arrow and out is None:
            example = {"split": "split[q -> qo qi](X)", "join": "join[qo qi -> q](X)",
                       "rename": "rename[x -> y](X)", "topk": "topk[e -> k](L)"}[info.name]
            self.err("box.needs_arrow", tree, name=name.value, example=example)
            ok = False
        if not info.arrow and out is not None:
            self.err("box.no_arrow", tree, name=name.value)
            ok = False
        got = params or ()
        if len(got) != info.nparams:
            expected = "a1, a2, b" if info.nparams == 3 else "none"
            self.err("box.params", tree, name=name.value, expected=expected, got=", ".join(got) or "none")
            ok = False
        elif info.name == "ncontract":
            allowed_a = sorted(set(ops.UNARY) | {"id"})
            for i, (p, allowed) in enumerate(zip(got, (allowed_a, allowed_a, sorted(ops.NORMALISERS)), strict=False)):
                if p not in allowed:
                    self.err("box.param_value", tree, did_you_mean(p, allowed), name=name.value,
                             index=i + 1, allowed=", ".join(allowed), got=p)
                    ok = False
        return ok

    def box_type(self, info: ops.OpInfo, tree: Node, target: Axes, out: Axes | None,
                 args: list[Expr]) -> Axes | None:
        """Check a box's operands against its brackets; the type is ``ops.result_axes``."""
        have = tuple(a.axes for a in args)
        if not self.box_ok(info, tree, target, out or (), have):
            return None
        return ops.result_axes(info.name, have, target, out or ())

    def box_ok(self, info: ops.OpInfo, tree: Node, target: Axes, out: Axes, types: tuple[Axes, ...]) -> bool:
        kind, name = info.kind, info.name
        have = types[0]
        if kind == "transpose" and sorted(target) != sorted(have):
            self.err("type.transpose", tree, axes=" ".join(target), have=_fmt(have))
            return False
        if kind in ("reduce", "normalise", "split", "rename", "join"):
            missing = [a for a in target if a not in have]
            if missing:
                self.err("axis.missing", tree, box=f"{name}[{' '.join(target)}]", axis=missing[0], have=_fmt(have))
                return False
            return kind in ("reduce", "normalise") or self.reshape_ok(name, tree, target, out, have)
        if kind == "scan":  # one axis, along which the recurrence runs; it must be on X (the last operand)
            if len(target) != 1:
                self.err("box.axis_count", tree, name=name, expected=1, place="in its brackets", got=len(target))
                return False
            if target[0] not in types[-1]:
                self.err("axis.not_on_operand", tree, box=f"{name}[{target[0]}]", index=len(types), axis=target[0],
                         have=_fmt(types[-1]))
                return False
        if kind == "onehot":
            if len(target) != 1:
                self.err("box.axis_count", tree, name="onehot", expected=1, place="in its brackets", got=len(target))
                return False
            if target[0] in have:
                self.err("type.axis_exists", tree, box=f"onehot[{target[0]}]", axis=target[0])
                return False
        if kind == "topk" and not self.selection_ok(name, tree, target, out, have):
            return False
        if kind == "gather" and (len(target) != 1 or target[0] not in have or target[0] in types[1]):
            if len(target) != 1:
                self.err("box.axis_count", tree, name="gather", expected=1, place="in its brackets", got=len(target))
            else:
                self.err("type.gather_axis", tree, axis=target[0], have=_fmt(have), positions=_fmt(types[1]))
            return False
        if kind == "ncontract":
            missing = [a for a in target if a not in have]
            if missing:
                self.err("axis.not_on_operand", tree, box=f"ncontract[{' '.join(target)}]",
                         index=1, axis=missing[0], have=_fmt(have))
                return False
        if kind in ("contract", "ncontract"):
            everything = union_axes(*types)
            missing = [a for a in target if a not in everything]
            if missing:
                self.err("axis.missing", tree, box=f"{name}[{' '.join(target)}]", axis=missing[0],
                         have=", ".join(_fmt(t) for t in types))
                return False
        return True

    def selection_ok(self, name: str, tree: Node, target: Axes, out: Axes, have: Axes) -> bool:
        """argmax[e], topk[e -> k]: one axis e of the operand; k one new axis of a declared size
        no larger than |e| (a symbolic |e| is checked where it is bound: ``eval.topk_size``)."""
        if len(target) != 1 or (name == "topk" and len(out) != 1):
            got = len(target) if len(target) != 1 else len(out)
            place = "in its brackets" if len(target) != 1 else "after `->`"
            self.err("box.axis_count", tree, name=name, expected=1, place=place, got=got)
            return False
        if target[0] not in have:
            self.err("axis.missing", tree, box=f"{name}[{target[0]}]", axis=target[0], have=_fmt(have))
            return False
        if not out:
            return True
        (axis,), (k,) = target, out
        if k in have:
            self.err("type.axis_exists", tree, box=f"topk[{axis} -> {k}]", axis=k)
            return False
        count, size = self.axes[k].size, self.axes[axis].size
        if count is None:
            self.err("type.topk_size", tree, axis=axis, k=k,
                     why=f"the number of positions selected is |{k}|, which must be declared (`axis {k} = 2`)")
            return False
        if size is not None and count > size:
            self.err("type.topk_size", tree, axis=axis, k=k,
                     why=f"selects {count} positions but `{axis}` has {size}")
            return False
        return True

    def integers_ok(self, info: ops.OpInfo, tree: Node, target: Axes, args: list[Expr]) -> bool:
        """The operands that must be integers are (comparisons: both; select: the mask; gather:
        the positions), as ``ops.integer_valued`` judges."""
        needed = {"compare": (0, 1), "select": (0,), "gather": (1,)}.get(info.kind, ())
        brackets = f"[{' '.join(target)}]" if target else ""
        ok = True
        for i in needed:
            if not ops.integer_valued(args[i], self.integers):
                self.err("type.integer_needed", tree, box=f"{info.name}{brackets}", index=i + 1)
                ok = False
        return ok

    def reshape_ok(self, name: str, tree: Node, old: Axes, new: Axes, have: Axes) -> bool:
        """split[a -> b c], join[b c -> a], rename[a -> b]: arity, fresh names, sizes."""
        counts = {"join": (None, 1), "split": (1, None), "rename": (1, 1)}[name]
        if counts[0] is not None and len(old) != counts[0]:
            self.err("box.axis_count", tree, name=name, expected=counts[0], place="before `->`", got=len(old))
            return False
        if counts[1] is not None and len(new) != counts[1]:
            self.err("box.axis_count", tree, name=name, expected=counts[1], place="after `->`", got=len(new))
            return False
        if name == "split" and len(new) < 2:
            self.err("box.axis_count", tree, name="split", expected="two or more", place="after `->`", got=len(new))
            return False
        for axis in new:
            if axis in have and axis not in old:
                self.err("type.axis_exists", tree, box=f"{name}[...]", axis=axis)
                return False
        if len(set(new)) != len(new):
            self.err("axis.repeated", tree, axis=next(a for a in new if new.count(a) > 1))
            return False
        sizes_new = [self.axes[a].size for a in new]
        sizes_old = [self.axes[a].size for a in old]
        if all(n is not None for n in sizes_new + sizes_old) and \
                math.prod(sizes_new) != math.prod(sizes_old):  # type: ignore[arg-type]
            self.err("type.split_sizes", tree, axis=" ".join(old), parts=" ".join(new),
                     sizes=" x ".join(map(str, sizes_new)), total=math.prod(sizes_old))  # type: ignore[arg-type]
            return False
        return True

    def indexed(self, info: ops.OpInfo, tree: Node, target: Axes, arg_trees: list[Node],
                env: dict[str, Axes | None], later: dict[str, Span]) -> Expr | None:
        sp = _span(tree, self.path)
        expected = 3 if info.name == "where" else 1
        if len(arg_trees) != expected:
            self.err("box.arity", tree, name=info.name, expected=expected, got=len(arg_trees))
            return None
        if info.name == "index":
            iexpr = self.index_expr(arg_trees[0], target)
            return None if iexpr is None else Box("index", (), target, target, index=iexpr, span=sp)
        if arg_trees[0].data not in _PRED_NODES:
            self.err("type.predicate_expected", arg_trees[0])
            return None
        pred = self.predicate(arg_trees[0], target)
        args = self.operands(arg_trees[1:], env, later)
        if pred is None or args is None:
            return None
        axes = ops.result_axes("where", (args[0].axes, args[1].axes), target)
        return Box("where", tuple(args), axes, target, index=pred, span=sp)

    def predicate(self, tree: Node, axes: Axes) -> Pred | None:
        kind = tree.data
        if kind == "compare":
            left = self.index_expr(tree.children[0], axes)
            right = self.index_expr(tree.children[2], axes)
            return None if left is None or right is None else Cmp(str(tree.children[1]), left, right)
        if kind in ("and_", "or_"):
            left_p = self.predicate_or_report(tree.children[0], axes)
            right_p = self.predicate_or_report(tree.children[1], axes)
            return None if left_p is None or right_p is None else Logic(kind[:-1], left_p, right_p)
        if kind == "not_":
            inner = self.predicate_or_report(tree.children[0], axes)
            return None if inner is None else Logic("not", inner)
        raise AssertionError(kind)  # pragma: no cover

    def predicate_or_report(self, tree: Node, axes: Axes) -> Pred | None:
        if tree.data not in _PRED_NODES:
            self.err("type.predicate_expected", tree)
            return None
        return self.predicate(tree, axes)

    def index_expr(self, tree: Node, axes: Axes) -> IndexExpr | None:
        kind = tree.data
        if kind == "var":
            name = _tok(tree, 0).value
            if name not in axes:
                self.err("type.index_axis", tree, name=name, axes=_fmt(axes))
                return None
            return Idx(name)
        if kind == "number":
            text = str(tree.children[0])
            if not text.isdigit():
                self.err("type.index_expr", tree)
                return None
            if len(text.lstrip("0")) > 19 or int(text) > MAX_INDEX_INT:  # past int64 (and past int()'s digit limit)
                self.err("type.index_int", tree, value=text if len(text) <= 20 else f"{text[:20]}... "
                         f"({len(text)} digits)", limit=MAX_INDEX_INT)
                return None
            return IInt(int(text))
        if kind in ("add", "sub", "mul"):
            left = self.index_expr(tree.children[0], axes)
            right = self.index_expr(tree.children[1], axes)
            symbol = {"add": "+", "sub": "-", "mul": "*"}[kind]
            return None if left is None or right is None else IBin(symbol, left, right)
        if kind == "neg":
            inner = self.index_expr(tree.children[0], axes)
            if isinstance(inner, IInt):
                return IInt(-inner.value)
            return None if inner is None else IBin("*", IInt(-1), inner)
        self.err("type.index_expr", tree)
        return None

    def apply(self, callee: Diagram, args: list[Expr], tree: Node) -> Expr | None:
        if len(args) != len(callee.inputs):
            self.err("box.arity", tree, name=callee.name, expected=len(callee.inputs), got=len(args))
            return None
        woven: list[str] = []
        inner = {a.name for a in callee.axes}
        ok = True
        for i, (arg, param) in enumerate(zip(args, callee.inputs, strict=True)):
            if param.integer and not ops.integer_valued(arg, self.integers):
                self.err("type.integer_needed", tree, box=callee.name, index=i + 1)
                ok = False
                continue
            if not set(param.axes) <= set(arg.axes):
                self.err("type.arg_missing_axis", tree, index=i + 1, callee=callee.name,
                         expected=_fmt(param.axes), actual=_fmt(arg.axes))
                ok = False
                continue
            for axis in arg.axes:
                if axis not in param.axes:
                    if axis in inner:
                        self.err("type.woven_clash", tree, callee=callee.name, axis=axis, index=i + 1)
                        ok = False
                    elif axis not in woven:
                        woven.append(axis)
        if not ok:
            return None
        types = tuple(tuple(woven) + t for t in callee.out_types)
        return Apply(callee, tuple(args), tuple(woven), types, _span(tree, self.path))

