"""napkin: neural circuit diagrams as text, proofs that relabellings preserve meaning,
derived IO cost bounds, and lowering to JAX Pallas kernels.

The public API is re-exported here; see README.md for the pipeline.
"""

import sys

from napkin_cat.diagnostics import Diagnostic, NapkinError, Span, render
from napkin_cat.elaborate import load, loads
from napkin_cat.evaluate import run
from napkin_cat.kernel import Theorem
from napkin_cat.printer import print_module
from napkin_cat.terms import Diagram, Module

__all__ = ["Diagnostic", "Diagram", "Module", "NapkinError", "Span", "Theorem", "load", "loads", "print_module",
           "render", "run"]
__version__ = "0.1.0"


def show_in_notebooks() -> bool:
    """Register diagrams and theorems with a running IPython shell, drawn as SVG pictures.

    The IR stays free of display code: the formatter is registered here, and only inside a
    shell (``True`` when one was found).  Called on import; call again in a shell started later.
    """
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is None:
        return False
    # drawing pulls in drawsvg and cairosvg: loaded only where a notebook will show pictures
    from napkin_cat.draw import draw_svg

    formatter = shell.display_formatter.formatters["image/svg+xml"]
    formatter.for_type(Diagram, draw_svg)
    formatter.for_type(Theorem, draw_svg)
    return True


show_in_notebooks()
