"""Text -> Lark tree, with syntax errors turned into diagnostics that say what was expected.

The grammar is ``grammar/ncd.lark``; the wheel ships it inside the package as
``napkin_cat/grammar/ncd.lark`` and a source checkout reads it from the repository root.
"""

from __future__ import annotations

import base64
import functools
import io
import re
from importlib import resources
from pathlib import Path
from typing import Any

import lark
from lark import Lark, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lark.lexer import PatternStr

from napkin_cat.cache import cache_folder, key, read, write
from napkin_cat.diagnostics import LINE_BREAK, Diagnostic, NapkinError, Span, error, source_lines

__all__ = ["HIDDEN", "grammar_text", "parse_tree"]

#: readable names for the grammar's named terminals
_FRIENDLY = {
    "NAME": "a name",
    "INT": "an integer",
    "NUMBER": "a number",
    "STRING": "a quoted path",
    "CMP": "a comparison",
    "PAD": "`pad`",
    "$END": "end of file",
}


def grammar_text() -> str:
    """The grammar source: from the installed package, else from the source checkout."""
    packaged = resources.files("napkin_cat").joinpath("grammar/ncd.lark")
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    return (Path(__file__).resolve().parent.parent / "grammar" / "ncd.lark").read_text(encoding="utf-8")


@functools.cache
def _parser() -> Lark:
    """The LALR parser of the grammar, its tables read back from napkin's cache folder when stored
    (building them is about 0.1 s CPU of every process that parses), else built and stored."""
    text = grammar_text()
    folder = cache_folder()
    entry = key("lark", {"lark": lark.__version__}, [text.encode()])
    stored = read(folder, entry, lambda payload: isinstance(payload, str))
    if stored is not None:
        try:
            return Lark.load(io.BytesIO(base64.b64decode(stored)))
        except Exception:  # an entry that does not load (another lark's layout) is built again, as a miss is
            pass
    parser = Lark(text, parser="lalr", propagate_positions=True, maybe_placeholders=False)
    tables = io.BytesIO()
    parser.save(tables)
    write(folder, entry, base64.b64encode(tables.getvalue()).decode("ascii"))
    return parser


@functools.lru_cache(maxsize=64)
def _parsed(text: str) -> Tree[Any]:
    """The tree of ``text`` (with ``\n`` line breaks), parsed once per process: a file that several
    checked files ``use`` is parsed once.  Trees are read, never changed, by the elaborator."""
    return _parser().parse(text)


def _describe(names: set[str] | frozenset[str]) -> str:
    parser = _parser()
    by_name = {t.name: t for t in parser.terminals}
    words = set()
    for name in names:
        term = by_name.get(name)
        if name in _FRIENDLY:
            words.add(_FRIENDLY[name])
        elif term is not None and isinstance(term.pattern, PatternStr):
            words.add(f"`{term.pattern.value}`")
        else:
            words.add(name.lower())
    ordered = sorted(words)
    if len(ordered) > 8:
        ordered = [*ordered[:8], "..."]
    return ", ".join(ordered) if ordered else "nothing"


def _diagnostic(exc: UnexpectedInput, path: str, text: str) -> Diagnostic:
    line = getattr(exc, "line", 0) or 0
    col = getattr(exc, "column", 0) or 0
    if isinstance(exc, UnexpectedEOF) or (isinstance(exc, UnexpectedToken) and exc.token.type == "$END"):
        lines = source_lines(text)
        line, col = len(lines), len(lines[-1]) + 1
        return error("syntax.unexpected_eof", Span(path, line, col), expected=_describe(set(exc.expected)))
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        span = Span(path, line, col, tok.end_line or line, tok.end_column or col + 1)
        kind = _FRIENDLY[tok.type].split(" ", 1)[1] if tok.type in ("NAME", "INT", "NUMBER") else None
        shown = f"{kind} `{tok.value}`" if kind else f"`{tok.value}`"
        return error("syntax.unexpected_token", span, token=shown, expected=_describe(exc.expected))
    assert isinstance(exc, UnexpectedCharacters)
    allowed = exc.allowed or set()
    return error("syntax.unexpected_char", Span(path, line, col, line, col + 1),
                 char=exc.char, expected=_describe(allowed))


#: deepest tree accepted; the elaborator, printer and every fold recurse along expressions
MAX_DEPTH = 200


def _check_depth(tree: Tree[Any], path: str) -> None:
    """Refuse absurdly nested expressions here, so no later recursive pass can overflow."""
    stack: list[tuple[Tree[Any], int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            meta = node.meta
            span = Span(path, meta.line, meta.column) if not getattr(meta, "empty", True) else None
            raise NapkinError(error("syntax.too_deep", span, limit=MAX_DEPTH))
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, Tree))


#: characters that an editor or a code review may show as a line break (vertical tab, the separators
#: U+001C-U+001E, NEL, U+2028, U+2029) or that reorder the text around them (Unicode's bidirectional
#: controls, "Trojan Source"): none ends a line for napkin, so in a comment (or a quoted path) the text
#: after one reads as a line of code or a reordered one that napkin never sees
HIDDEN = re.compile("[\x0b\x1c-\x1e\x85\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _hidden(text: str, path: str) -> Diagnostic | None:
    """A character of ``HIDDEN`` in ``text``, located as the parser counts lines, or None."""
    found = HIDDEN.search(text)
    if found is None:
        return None
    before = source_lines(text[:found.start()])
    line, col = len(before), len(before[-1]) + 1
    return error("syntax.hidden_char", Span(path, line, col, line, col + 1), point=f"{ord(found.group()):04X}")


def parse_tree(text: str, path: str = "<string>") -> Tree[Any]:
    r"""Parse ``text``; raise ``NapkinError`` with a located diagnostic on a syntax error, or where it
    holds a character an editor may show as a line break or reorder text by (``HIDDEN``).
    ``\r\n``, ``\r`` and ``\n`` each end a line (``diagnostics.LINE_BREAK``, as the renderer
    counts them): the grammar sees ``\n`` for each."""
    if (hidden := _hidden(text, path)) is not None:
        raise NapkinError(hidden)
    try:
        tree = _parsed(LINE_BREAK.sub("\n", text))
    except UnexpectedInput as exc:
        raise NapkinError(_diagnostic(exc, path, text)) from None
    _check_depth(tree, path)
    return tree
