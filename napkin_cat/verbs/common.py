"""What several verbs share that reads an .ncd file: the module, a diagram of it."""

from __future__ import annotations

import os

from napkin_cat.elaborate import load
from napkin_cat.terms import Diagram, Module
from napkin_cat.verbs import UsageError

__all__ = ["diagram_or_usage", "module_or_usage"]


def module_or_usage(path: str) -> Module:
    if not os.path.lexists(path):
        raise UsageError(f"no such file: {path}")
    return load(path)


def diagram_or_usage(module: Module, name: str) -> Diagram:
    try:
        return module.diagram(name)
    except KeyError:
        known = ", ".join(d.name for d in module.scope_diagrams) or "none"
        raise UsageError(f"no diagram `{name}` in {module.path} (diagrams: {known})") from None


