"""Gradients of lowered kernels.

A Pallas kernel has no reverse mode (``pallas_call`` is not transposable), so on that target
``differentiable`` makes the public function a ``jax.custom_vjp``: the forward kernel under a
private name, the backward (the diagram's VJP, ``napkin_cat.grad``, lowered unscheduled to
plain JAX: every intermediate it recomputes is materialised whole, for attention the q×x
scores and weights once), and the public function, which keeps ``interpret=``, runs the
forward and, under ``jax.grad``/``jax.vjp``, saves only its inputs as residuals and calls the
backward.  The plain-JAX target is differentiated by JAX through its own code: its streamed
step is checkpointed, so its backward keeps per-chunk carries, not q·x values, which the
unscheduled VJP would.  ``GRADIENTS`` is each target's docstring line.  Where the VJP cannot
be lowered, the Pallas function is the forward itself and its docstring says why.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence

from napkin_cat.diagnostics import NapkinError
from napkin_cat.grad import vjp
from napkin_cat.lower import codegen as cg
from napkin_cat.lower import jax as jax_target
from napkin_cat.lower.layout import layout
from napkin_cat.terms import Diagram, Schedule

__all__ = ["GRADIENTS", "differentiable"]

#: the docstring line on gradients, by target
GRADIENTS = {
    "pallas": "Gradients: a jax.custom_vjp; residuals are the inputs only; the backward is the diagram's VJP "
              "(napkin_cat.grad) lowered unscheduled to plain JAX, its intermediates materialised whole.",
    "jax": "Gradients: jax.grad differentiates this code; the streamed step is checkpointed (the backward keeps "
           "per-chunk carries, not the whole of any streamed axis).",
}


def differentiable(forward: ast.FunctionDef, diagram: Diagram, target: str, params: Sequence[str],
                   reserved: Sequence[str]) -> tuple[list[ast.FunctionDef], str]:
    """The functions to put in the module, the public one last (its first statement a
    docstring for the caller to write), and the docstring's gradient line.

    ``forward`` is named as the public function; ``reserved`` are the module-level names
    (helpers, imports) nothing may shadow."""
    if target != "pallas":
        return [forward], GRADIENTS[target]
    public = forward.name
    namer = cg.Namer([*reserved, public, *params])
    try:
        lay = layout(f"{diagram.name}_vjp", vjp(diagram), Schedule(), {}, "jax")
        back_name = namer.fresh(f"{public}_backward")
        back_params = [cg.Namer(reserved).fresh(p) for p, _ in lay.flat.inputs]
        backward = jax_target.emit_function(lay, back_name, back_params, "The VJP diagram, unscheduled.", "float32",
                                            cg.Namer([*reserved, back_name, *back_params]))
    except NapkinError as exc:
        return [forward], f"Gradients: not available (the VJP diagram does not lower: {exc})."
    fwd_name = namer.fresh(f"{public}_forward")
    forward.name = fwd_name
    forward.body = forward.body[1:] if isinstance(forward.body[0], ast.Expr) else forward.body
    forward.body.insert(0, ast.Expr(ast.Constant("The forward kernel (the public function's primal).")))
    keyword = ", interpret=interpret"
    run, run_fwd, run_bwd, args, cts, grads = (namer.fresh(n) for n in ("run", "run_fwd", "run_bwd", "args", "cts",
                                                                        "grads"))
    listed = ", ".join(params)
    text = f'''
def {public}({listed}, *, interpret=None):
    @jax.custom_vjp
    def {run}(*{args}):
        return {fwd_name}(*{args}{keyword})

    def {run_fwd}(*{args}):
        return {fwd_name}(*{args}{keyword}), {args}

    def {run_bwd}({args}, {cts}):
        {grads} = {back_name}(*{args}, *({cts} if isinstance({cts}, tuple) else ({cts},)))
        {grads} = {grads} if isinstance({grads}, tuple) else ({grads},)
        return tuple(g.astype(jnp.result_type(a)) for g, a in zip({grads}, {args}))

    {run}.defvjp({run_fwd}, {run_bwd})
    return {run}({listed})
'''
    wrapper = ast.parse(text).body[0]
    assert isinstance(wrapper, ast.FunctionDef)
    wrapper.body.insert(0, ast.Expr(ast.Constant("")))
    return [forward, backward, wrapper], GRADIENTS[target]
