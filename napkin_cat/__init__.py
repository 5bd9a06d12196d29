"""napkin: neural circuit diagrams as text, proofs that relabellings preserve meaning,
derived IO cost bounds, and lowering to JAX Pallas kernels.

The public API is re-exported here; see README.md for the pipeline.
"""

import os
import sys
import warnings

from napkin_cat.diagnostics import Diagnostic, NapkinError, Span, render
from napkin_cat.elaborate import load, loads
from napkin_cat.evaluate import run
from napkin_cat.kernel import Theorem
from napkin_cat.printer import print_module
from napkin_cat.terms import Diagram, Module

__all__ = ["Diagnostic", "Diagram", "Fused", "Module", "NapkinError", "Span", "Theorem", "attention", "fuse", "load",
           "loads", "print_module", "render", "run"]
__version__ = "0.1.0"

#: the front door for JAX code (``napkin_cat.fused``), loaded on first use: it imports jax
_FRONT_DOOR = ("Fused", "attention", "fuse")


def __getattr__(name: str) -> object:
    if name in _FRONT_DOOR:
        from napkin_cat import fused as front_door

        return getattr(front_door, name)
    raise AttributeError(f"module 'napkin_cat' has no attribute {name!r}")


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


#: XLA:CPU in jaxlib 0.10.2 to 0.11.x miscompiles some broadcast-multiply-reduce fusions (its
#: YNNPACK reduce fusion; jax-ml/jax#39103, #39257): `jnp.sum(w[:, :, None] * where(iota < 3,
#: -2.0, 0.0), axis=1)` at 16x16x16 returns garbage under jit.  The lowered kernels form such
#: terms, so the fusion is switched off before jax starts its CPU backend (README "Kernels").
CPU_WORKAROUND = "--xla_cpu_experimental_ynn_fusion_type=-reduce"


def _avoid_cpu_miscompile() -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_experimental_ynn_fusion_type" in flags:
        return  # the user chose
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is not None and getattr(bridge, "_backends", None):
        warnings.warn(f"jax's backends started before napkin_cat was imported: XLA:CPU results may be "
                      f"miscompiled (jax-ml/jax#39103); set XLA_FLAGS={CPU_WORKAROUND} first", stacklevel=3)
        return
    os.environ["XLA_FLAGS"] = f"{flags} {CPU_WORKAROUND}".strip()


_avoid_cpu_miscompile()
