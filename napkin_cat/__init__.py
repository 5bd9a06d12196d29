"""napkin: neural circuit diagrams as text, proofs that relabellings preserve meaning,
derived IO cost bounds, and lowering to JAX Pallas kernels.

The public API is re-exported here; see README.md for the pipeline.
"""

import os
import sys
import warnings

__all__ = ["Diagnostic", "Diagram", "Fused", "Module", "NapkinError", "Span", "Theorem", "attention", "fuse", "load",
           "loads", "print_module", "render", "run"]
__version__ = "0.1.0"

#: where each public name lives: imported on first use (PEP 562), so that ``import napkin_cat``
#: (which the ``napkin`` command does before anything else) loads no numpy, sympy or lark and
#: Ctrl-C in the command's first seconds reaches its handler (``__main__``)
_EXPORTS: dict[str, str] = {
    "Diagnostic": "napkin_cat.diagnostics", "NapkinError": "napkin_cat.diagnostics", "Span": "napkin_cat.diagnostics",
    "render": "napkin_cat.diagnostics", "load": "napkin_cat.elaborate", "loads": "napkin_cat.elaborate",
    "run": "napkin_cat.evaluate", "Theorem": "napkin_cat.kernel", "print_module": "napkin_cat.printer",
    "Diagram": "napkin_cat.terms", "Module": "napkin_cat.terms",
    # the front door for JAX code (README "From JAX"): it imports jax
    "Fused": "napkin_cat.fused", "attention": "napkin_cat.fused", "fuse": "napkin_cat.fused",
}


def __getattr__(name: str) -> object:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'napkin_cat' has no attribute {name!r}")
    import importlib  # only when a public name is first used

    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


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
    formatter.for_type(__getattr__("Diagram"), draw_svg)
    formatter.for_type(__getattr__("Theorem"), draw_svg)
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
