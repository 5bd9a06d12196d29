"""Scans: ``cumsum[t](X)`` and the linear recurrence ``linrec[t](A, X)`` (h[t] = A[t]·h[t-1] + X[t]).

The evaluator against a sequential float64 recurrence written here, the typing errors, the
lowering on both targets, cumsum's reverse mode against finite differences.
"""

from __future__ import annotations

import re
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from napkin_cat import kernel, loads, run
from napkin_cat.cost import CostError, cost_of
from napkin_cat.cost.mesh import mesh_cost
from napkin_cat.diagnostics import NapkinError
from napkin_cat.grad import vjp
from napkin_cat.lower import lower, runtime
from napkin_cat.proof import check_module, theorem
from napkin_cat.schedule.run import run_schedule
from napkin_cat.terms import Partition

TEXT = """axis t, d, e
diagram running(X: [t d]) -> [t d] {
  return cumsum[t](X)
}
diagram decayed(A: [t], X: [t d]) -> [t d] {
  return linrec[t](A, X)
}
diagram state(Q: [t d], K: [t d], V: [t e]) -> [t e] {
  H = cumsum[t](K * V)
  return contract[d](Q, H)
}
"""


def _sequential(a: np.ndarray | None, x: np.ndarray) -> np.ndarray:
    """h[0] = x[0], h[t] = a[t] h[t-1] + x[t], one position at a time (axis 0)."""
    h, out = x[0], [x[0]]
    for t in range(1, x.shape[0]):
        h = (h if a is None else a[t] * h) + x[t]
        out.append(h)
    return np.stack(out)


def _inputs(seed: int, t: int = 9, d: int = 3, e: int = 2) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"A": rng.uniform(-1.2, 1.2, t), "X": rng.standard_normal((t, d)), "Q": rng.standard_normal((t, d)),
            "K": rng.standard_normal((t, d)), "V": rng.standard_normal((t, e))}


@pytest.mark.parametrize("seed", range(3))
def test_the_evaluator_runs_the_recurrence(seed: int) -> None:
    m, v = loads(TEXT), _inputs(seed)
    assert np.array_equal(run(m.diagram("running"), v["X"]), _sequential(None, v["X"]))
    assert np.array_equal(run(m.diagram("decayed"), v["A"], v["X"]), _sequential(v["A"], v["X"]))
    state = _sequential(None, v["K"][:, :, None] * v["V"][:, None, :])
    np.testing.assert_allclose(run(m.diagram("state"), v["Q"], v["K"], v["V"]),
                               np.einsum("td,tde->te", v["Q"], state), rtol=1e-12)


def test_a_decay_without_the_axis_is_woven() -> None:
    m = loads("axis t, d\ndiagram f(A: [d], X: [t d]) -> [t d] {\n  return linrec[t](A, X)\n}\n")
    a, x = np.array([0.5, -2.0]), np.random.default_rng(0).standard_normal((4, 2))
    assert np.array_equal(run(m.diagram("f"), a, x), _sequential(np.broadcast_to(a, (4, 2)), x))


@pytest.mark.parametrize(("body", "message"), [
    ("cumsum[t d](X)", "`cumsum` takes 1 axis name(s) in its brackets, got 2"),
    ("cumsum[e](X)", "operand 1 lacks axis `e`"),
    ("linrec[e](X, X)", "operand 2 lacks axis `e`"),
    ("linrec[t](X)", "linrec"),
])
def test_typing_errors_are_located(body: str, message: str) -> None:
    text = f"axis t, d, e\ndiagram f(X: [t d]) -> [t d] {{\n  return {body}\n}}\n"
    with pytest.raises(NapkinError) as info:
        loads(text, "f.ncd")
    (found,) = info.value.diagnostics
    assert message in found.message and found.span is not None and (found.span.file, found.span.line) == ("f.ncd", 3)


@pytest.mark.parametrize("target", ["jax", "pallas"])
@pytest.mark.parametrize("name", ["running", "decayed", "state"])
def test_unscheduled_scans_lower_on_both_targets(target: str, name: str) -> None:
    m, v = loads(TEXT), _inputs(1)
    d = m.diagram(name)
    arrays = [v[p.name] for p in d.inputs]
    got = lower(kernel.refl(name, d), target=target).fn(*[jnp.asarray(a, jnp.float32) for a in arrays])
    np.testing.assert_allclose(np.asarray(got, np.float64), run(d, *arrays), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["state", "decayed"])
def test_the_reverse_mode_of_scans_matches_finite_differences(name: str) -> None:
    """cumsum's VJP (Σ g - cumsum g + g) and linrec's (its adjoint over a fresh copy of the axis)
    against central differences of the float64 evaluator, along a random direction."""
    m, v = loads(TEXT), _inputs(2)
    d = m.diagram(name)
    rng = np.random.default_rng(3)
    args = [v[p.name] for p in d.inputs]
    g = rng.standard_normal(np.shape(run(d, *args)))
    grads = run(vjp(d), *args, g)
    for i, arg in enumerate(args):
        direction = rng.standard_normal(arg.shape)
        plus, minus = list(args), list(args)
        plus[i], minus[i] = arg + 1e-6 * direction, arg - 1e-6 * direction
        numeric = np.sum(g * (run(d, *plus) - run(d, *minus))) / 2e-6
        assert abs(numeric - np.sum(grads[i] * direction)) < 1e-6 * max(1.0, abs(numeric))


# ---- the chunked scan (kernel.group's `scan`) -------------------------------------------------------

SCHEDULED = TEXT + """diagram nested(X: [t d]) -> [t d] {
  return cumsum[t](cumsum[t](X) * X)
}
diagram woven(A: [t d], X: [t d e]) -> [t e] {
  return sum[d](linrec[t](A, X) * index[t](t - 2))
}
"""


def _scanned(name: str, pad: bool = True, tile: str | int = "c") -> kernel.Theorem:
    d = loads(SCHEDULED).diagram(name)
    return kernel.group(kernel.refl(name, d), Partition("scan", "t", tile, pad=pad))


@pytest.mark.parametrize("name", ["running", "decayed", "state", "nested", "woven"])
@pytest.mark.parametrize(("t", "c"), [(9, 4), (8, 2), (7, 7), (5, 8), (1, 3)])
def test_a_chunked_scan_runs_as_the_evaluator_does(name: str, t: int, c: int) -> None:
    """Accepted: every box weaves t but the scans along it (positional boxes included); the chunks,
    run in order with each scan started from its carry, give the evaluator's values exactly (the
    recurrence is computed in the same order, only cut)."""
    thm = _scanned(name)
    assert thm.trust[-1] == "scan" and thm.schedule.partitions[-1].kind == "scan"
    rng = np.random.default_rng(t)
    arrays = [rng.uniform(-1.1, 1.1, [{"t": t, "d": 3, "e": 2}[a] for a in p.axes]) for p in thm.source.inputs]
    (got,) = run_schedule(thm, arrays, tiles={"c": c})
    assert np.array_equal(got, run(thm.source, *arrays))


def test_the_carry_is_what_the_chunks_need() -> None:
    """The same cut as a group partition (no carry: each tile restarts the sum) is refused, with the
    counterexample that running it tile by tile gives."""
    module = loads(SCHEDULED + "theorem good: running {\n  scan t by 2\n}\ntheorem bad: running {\n  group t by 2\n}\n")
    good, bad = check_module(module)
    assert good.ok and bad.failure is not None
    assert "mixes axis `t`" in bad.failure.message and "tile by tile but" in (bad.counterexample or "")


@pytest.mark.parametrize(("body", "message"), [
    ("sum[t](cumsum[t](X))", "`sum[t]` (the returned expression) consumes axis `t`"),
    ("cumsum[t](softmax[t](X))", "`softmax[t]` (the returned expression) mixes axis `t`"),
    ("rename[s -> t](cumsum[s](rename[t -> s](X)))", "mixes axis `t`; it moves the positions of"),
])
def test_a_chunked_scan_refuses_every_other_box_that_reads_across_positions(body: str, message: str) -> None:
    d = loads(f"axis t, s, d\ndiagram f(X: [t d]) -> [{'d' if body.startswith('sum') else 't d'}] {{\n"
              f"  return {body}\n}}\n").diagram("f")
    with pytest.raises(kernel.KernelError, match="^scan: box .*" + re.escape(message)):
        kernel.group(kernel.refl("f", d), Partition("scan", "t", "c"))


def test_a_scan_partition_records_its_divisibility_and_nests_like_a_group() -> None:
    thm = _scanned("state", pad=False)
    assert [str(c) for c in thm.constraints] == ["c | t"]
    with pytest.raises(kernel.KernelError, match="axis `t` is already partitioned at `smem`"):
        kernel.group(thm, Partition("scan", "t", "c"))
    with pytest.raises(kernel.KernelError, match="mixes axis `t`"):  # a group of the scanned axis: refused
        kernel.group(thm, Partition("group", "t", "r", level="reg"))


# ---- the proofs: chunked causal linear attention and Mamba-2's SSD, lowered ------------------------

PROOFS = Path(__file__).resolve().parent.parent / "proofs" / "scans.ncd"


def _linear_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """out[t] = q_t · H_t with H_t = H_{t-1} + k_t v_tᵀ, one position at a time (float64); batch
    and head axes in front."""
    h = np.zeros((*q.shape[:-2], q.shape[-1], v.shape[-1]))
    out = []
    for t in range(q.shape[-2]):
        h = h + k[..., t, :, None] * v[..., t, None, :]
        out.append(np.einsum("...d,...de->...e", q[..., t, :], h))
    return np.stack(out, axis=-2)


def _ssd(a: np.ndarray, b: np.ndarray, c: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Mamba-2's recurrence: H_t = exp(A_t) H_{t-1} + B_t X_tᵀ, Y_t = C_t · H_t (float64); ``a`` is
    [.. t] per head, ``b``/``c`` [.. t n] shared by the heads, ``x`` [.. t p]."""
    h = np.zeros((*x.shape[:-2], b.shape[-1], x.shape[-1]))
    out = []
    for t in range(x.shape[-2]):
        h = np.exp(a[..., t])[..., None, None] * h + b[..., t, :, None] * x[..., t, None, :]
        out.append(np.einsum("...n,...np->...p", c[..., t, :], h))
    return np.stack(out, axis=-2)


@pytest.mark.parametrize("target", ["jax", "pallas"])
@pytest.mark.parametrize("name", ["linear_attention_chunked", "linear_attention_mha_chunked", "ssd_chunked",
                                  "ssd_mha_chunked"])
@pytest.mark.parametrize(("t", "c"), [(37, 16), (16, 16), (5, 16), (64, 32)])
def test_chunked_proofs_lower_and_match_the_sequential_recurrence(target: str, name: str, t: int, c: int) -> None:
    """Each theorem of proofs/scans.ncd checks --strict, lowers on both targets (chunks of c in an
    in-kernel loop whose carry is each scan's state) and matches the recurrence above, run in
    float64, to 1e-5 relative to the largest output, at ragged lengths (f32 kernels)."""
    thm = theorem(PROOFS, name)
    assert not thm.tested and thm.schedule.partitions[-1].kind == "scan"
    rng = np.random.default_rng(t + len(name))
    sizes = {"t": t, "b": 2, "h": 3, "d": 4, "e": 3, "n": 4, "p": 3}
    arrays = {p.name: rng.standard_normal([sizes[a] for a in p.axes]) for p in thm.source.inputs}
    if "A" in arrays:  # log-decays of Mamba-2: negative, a[t] = exp(A[t]) in (0, 1)
        arrays["A"] = -np.abs(arrays["A"]) * 0.5
    names = [p.name for p in thm.source.inputs]
    if name == "ssd_mha_chunked":  # B and C lack the head axis: shared by the heads
        want = _ssd(arrays["A"], arrays["B"][:, None], arrays["C"][:, None], arrays["X"])
    else:
        want = (_ssd if "ssd" in name else _linear_attention)(*(arrays[k] for k in names))
    fn = lower(thm, target=target, tiles={"c": c}).fn
    got = np.asarray(fn(*[jnp.asarray(arrays[k], jnp.float32) for k in names]), np.float64)
    assert got.shape == want.shape
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))


@pytest.mark.parametrize("axis", [0, 1])
def test_both_linrec_helpers_run_the_recurrence(axis: int) -> None:
    """runtime.linrec (an associative scan) and runtime.linrec_rows (Triton's loop over positions)
    against the float64 recurrence, along either axis."""
    rng = np.random.default_rng(axis)
    a, x = rng.uniform(-1.1, 1.1, (6, 5)), rng.standard_normal((6, 5))
    want = np.moveaxis(_sequential(np.moveaxis(a, axis, 0), np.moveaxis(x, axis, 0)), 0, axis)
    for helper in (runtime.linrec, runtime.linrec_rows):
        got = helper(jnp.asarray(a, jnp.float32), jnp.asarray(x, jnp.float32), axis)
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5)



@pytest.mark.parametrize("target", ["jax", "pallas"])
def test_a_masked_decay_of_minus_inf_gives_the_recurrences_infinities(target: str) -> None:
    """issue 28 (red team rtdeep): the plain-JAX linrec's associative scan reassociates
    A₂·(A₁·h + X₁) as (A₁·A₂)·h + A₂·X₁, so a decay masked to -inf (a `--strict` theorem) gave
    inf - inf = NaN in 22 of 48 entries where the evaluator's recurrence gives ±inf; the scan now
    runs in order when the chunk holds a non-finite A or X."""
    (result,) = check_module(loads(
        "axis t, d\ndiagram lr(A: [t], X: [t d]) -> [t d] {\n"
        "  return linrec[t](where[t](t == 5 or t == 16, 0 - inf, A), where[t](t == 17, inf, X))\n}\n"
        "theorem sc_lr: lr {\n  scan t by c pad\n}\n", "<test>"))
    thm = result.theorem
    rng = np.random.default_rng(0)
    for t in (16, 40):
        a, x = rng.uniform(-1, 1, t), rng.standard_normal((t, 3))
        with np.errstate(all="ignore"):
            want = run(thm.source, a, x)
        options = {"interpret": True} if target == "pallas" else {}
        got = np.asarray(lower(thm, target=target, tiles={"c": 16}).fn(jnp.asarray(a, jnp.float32),
                                                                       jnp.asarray(x, jnp.float32), **options))
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.sum(np.isinf(want)) > 10
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_scan_at_mesh_is_refused_by_the_lowering_and_the_cost_model() -> None:
    """The kernel admits a scan at any level (chunks in order are chunks in order); no backend passes a
    carry from device to device, so lowering with --mesh and costing the mesh refuse it by name."""
    module = loads(TEXT + "theorem m: state {\n  scan t by c at mesh\n}\n")
    (result,) = check_module(module)
    assert result.theorem is not None
    with pytest.raises(NapkinError, match="scans `t` at mesh"):
        lower(result.theorem, target="jax", tiles={"c": 4}, mesh=2)
    with pytest.raises(CostError, match="scans t at mesh"):
        mesh_cost(cost_of(result.theorem.result, result.theorem.schedule), 2)


ZEROS = ("axis t\ndiagram running(X: [t]) -> [t] {\n  return recip(cumsum[t](X))\n}\n"
         "diagram decayed(A: [t], X: [t]) -> [t] {\n  return recip(linrec[t](A, X))\n}\n")


@pytest.mark.parametrize("target", ["jax", "pallas"])
@pytest.mark.parametrize("name", ["running", "decayed"])
@pytest.mark.parametrize("chunk", [None, 16])
def test_a_running_sum_of_negative_zeros_is_the_evaluators_zero(target: str, name: str, chunk: int | None) -> None:
    """X = -0.0, -0.0, ... (positive decays, 22 positions): every lowered scan (XLA's cumsum and
    associative scan, Triton's position loop, a chunk's select) starts from +0, as the evaluator's `sum`
    does; its scan kept h[0] = X[0] = -0.0, so 1/h was -inf by the evaluator and +inf by every kernel."""
    d = loads(ZEROS).diagram(name)
    x = np.array([-0.0] * 3 + [1.0, -1.0, -0.0, 2.0] * 5 + [-0.0])
    arrays = [np.linspace(0.5, 2.0, x.size), x][-len(d.inputs):]
    thm = kernel.refl(name, d)
    if chunk is not None:
        thm = kernel.group(thm, Partition("scan", "t", "c", pad=True))
    fn = lower(thm, target=target, tiles={"c": chunk} if chunk else None).fn
    got = np.asarray(fn(*[jnp.asarray(a, jnp.float32) for a in arrays]), np.float64)
    np.testing.assert_allclose(got, run(d, *arrays), rtol=1e-5)  # an inf's sign exactly
