"""napkin: neural circuit diagrams as text, proofs that relabellings preserve meaning,
derived IO cost bounds, and lowering to JAX Pallas kernels.

The public API is re-exported here; see README.md for the pipeline.
"""

from napkin_cat.diagnostics import Diagnostic, NapkinError, Span, render
from napkin_cat.elaborate import load, loads
from napkin_cat.printer import print_module
from napkin_cat.terms import Diagram, Module

__all__ = ["Diagnostic", "Diagram", "Module", "NapkinError", "Span", "load", "loads", "print_module", "render"]
__version__ = "0.1.0"
