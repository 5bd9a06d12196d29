"""The derived streamed backward (napkin_cat.search.backward): FlashAttention-2's plan derived
from a forward theorem, each pass proved, the join proved, and ``jax.grad`` through the lowered
kernels equal to the float64 VJP at ragged sizes."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from napkin_cat import proof
from napkin_cat.cli import main
from napkin_cat.diagnostics import NapkinError
from napkin_cat.elaborate import load, loads
from napkin_cat.evaluate import evaluate
from napkin_cat.grad import vjp
from napkin_cat.lower import UnprovedJoinWarning, compile_module, lower
from napkin_cat.lower.backward import drawn_integers
from napkin_cat.proof import check_module
from napkin_cat.search.backward import DerivedBackward, derived, passes, saving
from napkin_cat.terms import Box, Module, Var, walk

ROOT = Path(__file__).resolve().parent.parent
PROOFS = ROOT / "proofs"
#: the candidates each search of ``derived`` checks here, with no time limit (``seconds=math.inf``), so
#: the plans tested are the same on every machine however loaded (a 5 s limit stopped sink_window's
#: dK/dV search after 2 candidates under load).  Unlimited, a search checks 1 to 273 candidates
#: (attention's passes 31 and 33) and most find their plan among their first 4 (the largest plan is
#: the second candidate), a hoisting chain's pieces (which get an eighth: 3) at their first or
#: second; paged attention's dK/dV pass finds its plan at candidate 21 (with 16 it kept the diagram
#: as written), the chained attention_then_projection's forward at 21 and its first pass at 41 (the
#: best of 24 here).  BENCHMARKS.md "The derived backward's search budget"
SEARCH_BUDGET = 24


def _derived(module: Module, theorem: str, target: str) -> DerivedBackward:
    """``derived`` as every test here runs it: the cpu profile for the jax target, the h100's for
    pallas, each search stopped by ``SEARCH_BUDGET`` alone."""
    return derived(module, theorem, target=target, hardware="cpu" if target == "jax" else "h100",
                   budget=SEARCH_BUDGET, seconds=math.inf)


def _tuple(value: object) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _check_gradients(path: Path, theorem: str, target: str, seed: int = 0,
                     found: DerivedBackward | None = None) -> str | None:
    """Derive (unless ``found`` is that derivation), lower and differentiate ``theorem`` (or a
    diagram without one); compare with the float64 VJP at ragged sizes.  Returns None where the
    join was proved, else the warning that it was lowered on the test alone (opted in)."""
    module = load(path)
    if found is None:
        found = _derived(module, theorem, target)
    # tiles of 16 and ragged sizes: several chunks, the last one partial
    tiles = {str(p.tile): 16 for thm in (found.forward, *found.backward) for p in proof.partitions(thm)
             if isinstance(p.tile, str) and p.level != "mesh"}
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always", UnprovedJoinWarning)
        lowered = lower(found.forward, target=target, dtype="float32", backward=list(found.backward), tiles=tiles,
                        allow_tested_join=True)
    why = next((str(w.message) for w in warned if issubclass(w.category, UnprovedJoinWarning)), None)
    fn = compile_module(lowered.source, f"<derived:{theorem}>")[lowered.function]
    source = module.diagram(next((t.diagram for t in module.theorems if t.name == theorem), theorem))
    rng = np.random.default_rng(seed)
    # ragged: streamed axes odd in 33..59, other tiled axes odd in 17..29, axes tiled by 1 (batch, heads) 3
    streamed = {p.axis for thm in (found.forward, *found.backward) for p in proof.partitions(thm)
                if p.kind == "stream"}
    tiled = {p.axis for p in proof.partitions(found.forward) if p.tile != 1}
    sizes = {a.name: a.size if a.size is not None else int(rng.integers(33, 60)) | 1 if a.name in streamed else
             int(rng.integers(17, 30)) | 1 if a.name in tiled else 3 for a in found.forward.source.axes}
    # int inputs (segment ids, lengths) as the join's test draws them: every row keeps a key
    args = [drawn_integers(rng, shape) if p.integer else rng.standard_normal(shape)
            for p in source.inputs for shape in ([sizes[a] for a in p.axes],)]
    outs = _tuple(evaluate(source, args, sizes=sizes))
    cts = [rng.standard_normal(np.shape(o)) for o in outs]
    want = _tuple(evaluate(vjp(source), [*args, *cts], sizes=sizes))
    options = {"interpret": True} if target != "jax" else {}

    def loss(*xs: jax.Array) -> jax.Array:
        return sum(jnp.sum(o * c) for o, c in zip(_tuple(fn(*xs, **options)), cts, strict=True))

    floats = tuple(i for i, p in enumerate(source.inputs) if not p.integer)

    def loss_of_floats(*xs: jax.Array) -> jax.Array:
        full = [jnp.asarray(a, jnp.float32) for a in args]  # kernels take int inputs as floats
        for i, x in zip(floats, xs, strict=True):
            full[i] = x
        return loss(*full)

    got = jax.jit(jax.grad(loss_of_floats, argnums=tuple(range(len(floats)))))(*(jnp.asarray(args[i], jnp.float32)
                                                                          for i in floats))
    for p, g, w in zip([source.inputs[i] for i in floats], got, [want[i] for i in floats], strict=True):
        w = np.asarray(w, np.float64)
        scale = max(1.0, float(np.max(np.abs(w))))
        np.testing.assert_allclose(np.asarray(g, np.float64), w, atol=2e-4 * scale, rtol=2e-4,
                                   err_msg=f"{theorem}: d{p.name} at {sizes}")
    return why


# ---- attention: the plan the hand-written files show -----------------------------------------------


@pytest.fixture(scope="module")
def attention():
    return _derived(load(PROOFS / "flash_attention.ncd"), "flash_attention", "jax")


def test_forward_saves_the_row_statistic(attention):
    forward = attention.forward.source
    assert [o.name for o in forward.outputs] == ["O", "L"]
    (stat,) = [let.expr for let in forward.body if let.names == ("L",)]
    assert isinstance(stat, Box) and stat.op == "logsumexp" and stat.target == ("x",)
    assert attention.forward.name == "flash_attention"  # the user's steps, on the saving forward


def test_passes_read_the_statistic_not_a_second_softmax(attention):
    for thm in attention.backward:
        diagram = thm.source
        ops = {n.op for let in diagram.body for n in walk(let.expr) if isinstance(n, Box)}
        assert "softmax" not in ops and "logsumexp" not in ops, thm.name
        assert {"O", "L", "dO"} <= {p.name for p in diagram.inputs}, thm.name
        # D = Σ_d dO·O, a reduction of the saved output, not of a q×x array
        assert any(isinstance(n, Box) and n.op == "contract" and n.target == ("d",)
                   and {getattr(a, "name", None) for a in n.args} == {"dO", "O"}
                   for let in diagram.body for n in walk(let.expr)), thm.name


def test_passes_group_their_gradients_own_axes(attention):
    plans = {}
    for thm in attention.backward:
        grads = tuple(o.name for o in thm.source.outputs)
        plans[grads] = [(p.kind, p.axis, p.via) for p in proof.partitions(thm)]
    assert set(plans) == {("dQ",), ("dK", "dV")}
    assert plans[("dQ",)] == [("group", "q", None), ("stream", "x", "sum")]
    assert plans[("dK", "dV")] == [("group", "x", None), ("stream", "q", "sum")]
    assert all(kind != "split" for plan in plans.values() for kind, _, _ in plan)  # no sum across programs


def test_derived_text_checks_as_a_proof_file(attention):
    """``DerivedBackward.text`` is an .ncd file whose theorems the kernel accepts under --strict."""
    results = check_module(loads(attention.text, "derived.ncd"), strict=True)
    assert [r.name for r in results] == [attention.forward.name, *(b.name for b in attention.backward)]
    assert all(r.ok for r in results), [r.summary() for r in results]


def _largest_array(jaxpr: Any) -> int:
    """The most elements of any value a jaxpr (and the jaxprs inside it) computes."""
    most = 0
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            most = max(most, int(np.prod(getattr(var.aval, "shape", ()))))
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    most = max(most, _largest_array(inner))
    return most


@pytest.mark.parametrize("target", ["jax", "pallas"])
def test_attention_backward_stores_no_q_by_x_array(attention, target):
    """The whole training step (forward, dQ pass, dK/dV pass) traced at q = x = 1024: no value
    it computes, inside the loops included, has q·x elements, while the unscheduled VJP's does.
    (On the cpu profile the dK/dV pass is a chain, D hoisted into a first kernel, its second
    kernel's tiles named ``gx2``, ``sq2``: ``search.chains``.)"""
    found = attention if target == "jax" else _derived(load(PROOFS / "flash_attention.ncd"), "flash_attention",
                                                        target)
    tiles = {"gq": 64, "sx": 64, "gx": 64, "sq": 64, "gx2": 64, "sq2": 64}
    lowered = lower(found.forward, target=target, dtype="float32", backward=list(found.backward), tiles=tiles)
    fn = compile_module(lowered.source, "<derived>")[lowered.function]
    n, d = 1024, 64
    q = jnp.ones((n, d), jnp.float32)
    options = {"interpret": True} if target != "jax" else {}
    step = jax.make_jaxpr(jax.grad(lambda q, k, v: jnp.sum(fn(q, k, v, **options)), argnums=(0, 1, 2)))(q, q, q)
    assert _largest_array(step.jaxpr) < n * n // 4
    plain = lower(proof.theorem(PROOFS / "flash_attention.ncd", "flash_attention"), target="pallas", dtype="float32",
                  tiles={"gq": 64, "sx": 64})
    unscheduled = compile_module(plain.source, "<plain>")[plain.function]
    vjp_step = jax.make_jaxpr(jax.grad(lambda q: jnp.sum(unscheduled(q, q, q, interpret=True))))(q)
    assert _largest_array(vjp_step.jaxpr) >= n * n  # the check sees a q×x array where there is one


def test_attention_gradients_match_the_vjp(attention):
    """The fixture's derivation (the one ``_check_gradients`` makes for the jax target), not a second one."""
    assert _check_gradients(PROOFS / "flash_attention.ncd", "flash_attention", "jax", found=attention) is None


# ---- every kernel without a hand-written backward ---------------------------------------------------

EXAMPLES = ROOT / "examples"
#: the files whose kernels have hand-written backwards (README "Training"), in proofs/ and examples/
HAND_WRITTEN = {"flash_attention_backward.ncd", "mlp_backward.ncd", "cross_entropy_backward.ncd",
                "attention_backward.ncd"}
_PROVED = [(path, t.name, t.diagram) for path in sorted(PROOFS.glob("*.ncd")) if path.name not in HAND_WRITTEN
           for t in load(path).theorems]
#: every theorem of proofs/, then every diagram of examples/ that no theorem of proofs/ schedules
#: (those are derived from the diagram alone: ``derived`` searches their forward too)
KERNELS = [(f"proofs/{path.name}", theorem) for path, theorem, _ in _PROVED] + [
    (f"examples/{path.name}", d.name) for path in sorted(EXAMPLES.glob("*.ncd")) if path.name not in HAND_WRITTEN
    for d in load(path).diagrams if d.name not in {diagram for _, _, diagram in _PROVED}]
#: the kernels whose join is lowered on the float64 test alone (README "Derived backward"): the
#: prover's reason.  A data mask (`eq`, `lt` of ids or lengths) can empty a row, where the derived
#: backward's guarded weights are 0 as the VJP's (``test_a_document_mask_can_empty_a_row``).
TESTED_JOINS = {
    "proofs/document_attention.ncd:flash_document_attention": "`eq` is outside the proved fragment",
    "proofs/document_attention.ncd:flash_causal_document_attention": "`eq` is outside the proved fragment",
    "proofs/document_attention.ncd:flash_padded_attention": "`lt` is outside the proved fragment",
    "proofs/mlp.ncd:fused_mlp_first_layer": "`gelu` is outside the proved fragment",
    "proofs/paged_attention.ncd:flash_paged_attention": "`gather` is outside the proved fragment",
    "proofs/relative_bias.ncd:flash_t5_attention": "`gather` is outside the proved fragment",
    "proofs/relative_bias.ncd:flash_t5_bucket_attention": "not known positive",  # log of the distance, 0 at q = x
    "examples/masked_attention.ncd:t5_bias": "not known positive",
    "proofs/scans.ncd:ssd_chunked": "reshapes an axis",
    "proofs/scans.ncd:ssd_mha_chunked": "reshapes an axis",
    "proofs/spherical_attention.ncd:flash_sign": "may be 0 and is not a case split on one row",
    "proofs/spherical_attention.ncd:flash_rms_attention": "may be 0 and is not a case split on one row",
    "examples/layernorm.ncd:layernorm": "not known positive",
    "examples/layernorm.ncd:rms_norm_exact": "may be 0 and is not a case split on one row",
    "proofs/flash_attention.ncd:flash_alibi": "a nested reduction over the same axis",
    "proofs/moe.ncd:grouped_experts": "`gelu` is outside the proved fragment",
    "examples/moe.ncd:route": "`topk` is outside the proved fragment",
    # its passes differ from the VJP by the rounding of the saved L (4.4e-7 of one entry at scale
    # 16), within the test's running error bounds (``lower.roundoff``), which rtol 1e-7 was not
    "proofs/moe.ncd:fused_moe": "`topk` is outside the proved fragment",
}
#: the kernels whose derived backward is refused: the error's text.  ``busiest`` (an argmax) has
#: no gradient
REFUSED = {
    "examples/moe.ncd:busiest": "no input has a gradient",
}
#: the unmarked sample, the cheapest of each kind: an example diagram without a theorem, a join
#: proved with `onehot`, a join tested for its listed reason (attention: ``test_attention_gradients...``)
SAMPLE = ["examples/layernorm.ncd:rms_norm", "proofs/cross_entropy.ncd:streamed_cross_entropy_index",
          "examples/layernorm.ncd:rms_norm_exact"]
#: swept by a test of its own above
ATTENTION = "proofs/flash_attention.ncd:flash_attention"


def _swept(kernel: str) -> None:
    file, theorem = kernel.split(":")
    if kernel in REFUSED:
        with pytest.raises(NapkinError, match=REFUSED[kernel]):
            _check_gradients(ROOT / file, theorem, "jax")
        return
    why = _check_gradients(ROOT / file, theorem, "jax")
    assert (why is None) == (kernel not in TESTED_JOINS), f"{kernel}: join {'proved' if why is None else why}"
    assert why is None or TESTED_JOINS[kernel] in why, why


def test_the_sweep_covers_examples_without_a_theorem():
    swept = {f"{f}:{t}" for f, t in KERNELS}
    assert set(SAMPLE) <= swept and set(TESTED_JOINS) | set(REFUSED) <= swept and ATTENTION in swept
    assert any(k in TESTED_JOINS for k in SAMPLE) and not all(k in TESTED_JOINS for k in SAMPLE)
    assert {"examples/layernorm.ncd:layernorm", "examples/attention.ncd:alibi_attention"} <= swept
    assert "examples/attention.ncd:attention" not in swept  # scheduled by proofs/flash_attention.ncd's theorems


def test_derived_names_a_theorem_or_a_diagram():
    with pytest.raises(NapkinError) as err:
        derived(load(EXAMPLES / "layernorm.ncd"), "layer_norm")
    assert err.value.codes == ("name.unknown",)
    assert "layernorm" in (err.value.diagnostics[0].hint or "")  # the names it knows


def test_a_document_mask_can_empty_a_row():
    """A query whose document has no key has L = log 0 = -inf: the derived passes read the weights as
    exp(S - max(L, -FLOAT_MAX)) (``grad._weights``), 0 there (exp(S - L) was exp(-inf + inf) = NaN), and
    equal the VJP's gradient, finite, on the emptied row as on the others (float64, the diagrams)."""
    module = load(PROOFS / "document_attention.ncd")
    forward = saving(module.diagram("document_attention"), "fwd")
    rng = np.random.default_rng(2)
    sizes = {"q": 3, "x": 4, "d": 64}
    values = {"Q": rng.standard_normal((3, 64)), "K": rng.standard_normal((4, 64)), "V": rng.standard_normal((4, 64)),
              "Dq": np.array([0.0, 1.0, 5.0]), "Dx": np.array([0.0, 0.0, 1.0, 1.0]),  # document 5 has no key
              "dO": rng.standard_normal((3, 64))}
    outs = evaluate(forward.diagram, [values[p.name] for p in forward.diagram.inputs], sizes=sizes)
    values |= {o.name: v for o, v in zip(forward.diagram.outputs, outs, strict=True) if isinstance(o, Var)}
    assert any(np.isneginf(v).any() for k, v in values.items() if k.startswith("L"))  # the emptied row's statistic
    got: dict[str, np.ndarray] = {}
    for b in passes(forward, "bwd"):
        got |= {o.name: g for o, g in zip(b.outputs, _tuple(evaluate(b, [values[p.name] for p in b.inputs],
                                                                        sizes=sizes)), strict=True)}
    want = _tuple(evaluate(vjp(module.diagram("document_attention")),
                           [values[n] for n in ("Q", "K", "V", "Dq", "Dx", "dO")], sizes=sizes))
    for name, w in zip(("dQ", "dK", "dV"), want, strict=False):
        assert np.isfinite(w).all() and np.isfinite(got[name]).all()
        np.testing.assert_allclose(got[name], w, atol=1e-12, rtol=1e-9)


#: the data-masked kernels, with inputs that empty a row: a query (5) whose document (7) holds no key,
#: a batch element (1) of length 0; and the target
EMPTIED = [("flash_document_attention", "document_attention", {"Dq": (5, 7.0)}, "jax"),
           pytest.param("flash_causal_document_attention", "causal_document_attention", {"Dq": (5, 7.0)}, "jax",
                        marks=pytest.mark.slow),
           pytest.param("flash_padded_attention", "padded_attention", {"len": (1, 0.0)}, "jax",
                        marks=pytest.mark.slow),
           pytest.param("flash_document_attention", "document_attention", {"Dq": (5, 7.0)}, "pallas",
                        marks=pytest.mark.slow)]


@pytest.mark.parametrize(("theorem", "diagram", "emptied", "target"), EMPTIED)
def test_an_emptied_row_keeps_the_lowered_gradient_right(theorem: str, diagram: str,
                                                          emptied: dict[str, tuple[int, float]], target: str):
    """The gap the opt-in left (README "Derived backward"): the derived backward, lowered with
    ``allow_tested_join``, at q = 33, x = 35 with a row the data mask empties, gave every dV entry
    NaN (document: |dV| <= 1.25 in the VJP; padded: batch element 0's) from exp(S - L) =
    exp(-inf + inf); its weights are now guarded (``grad._weights``), and dQ, dK, dV are finite and
    within the f32 tolerance of the float64 VJP (Pallas: in interpret mode)."""
    module = load(PROOFS / "document_attention.ncd")
    found = _derived(module, theorem, target)
    tiles = {str(p.tile): 16 for thm in (found.forward, *found.backward) for p in proof.partitions(thm)
             if isinstance(p.tile, str) and p.level != "mesh"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnprovedJoinWarning)
        lowered = lower(found.forward, target=target, dtype="float32", backward=list(found.backward), tiles=tiles,
                        allow_tested_join=True)
    fn = compile_module(lowered.source, f"<derived:{theorem}>")[lowered.function]
    options = {"interpret": True} if target != "jax" else {}
    source = module.diagram(diagram)
    rng = np.random.default_rng(0)
    sizes = {"b": 3, "q": 33, "x": 35, "d": 64}
    args = []
    for p in source.inputs:
        shape = [sizes[a] for a in p.axes]
        value = np.full(shape, float(sizes["x"])) if p.integer else rng.standard_normal(shape)  # ids 35, length 35
        if p.name in emptied:
            at, v = emptied[p.name]
            value[at] = v
        args.append(value)
    outs = _tuple(evaluate(source, args, sizes=sizes))
    cts = [rng.standard_normal(np.shape(o)) for o in outs]
    want = _tuple(evaluate(vjp(source), [*args, *cts], sizes=sizes))
    floats = [i for i, p in enumerate(source.inputs) if not p.integer]

    def loss(*xs: jax.Array) -> jax.Array:
        full = [jnp.asarray(a, jnp.float32) for a in args]
        for i, x in zip(floats, xs, strict=True):
            full[i] = x
        return sum(jnp.sum(o * c) for o, c in zip(_tuple(fn(*full, **options)), cts, strict=True))

    got = jax.grad(loss, argnums=tuple(range(len(floats))))(*(jnp.asarray(args[i], jnp.float32) for i in floats))
    for i, g in zip(floats, got, strict=True):
        assert np.isfinite(want[i]).all() and np.isfinite(np.asarray(g)).all(), source.inputs[i].name
        np.testing.assert_allclose(np.asarray(g, np.float64), want[i], atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("kernel", SAMPLE)
def test_sampled_kernels_derive_a_backward(kernel):
    _swept(kernel)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", [f"{f}:{t}" for f, t in KERNELS if f"{f}:{t}" not in {*SAMPLE, ATTENTION}])
def test_every_kernel_derives_a_backward(kernel):
    _swept(kernel)


@pytest.mark.slow
@pytest.mark.parametrize(("file", "theorem"), [("flash_attention.ncd", "flash_attention_causal"),
                                               ("spherical_attention.ncd", "flash_sign")])
def test_pallas_interpret_gradients(file, theorem):
    _check_gradients(PROOFS / file, theorem, "pallas")


# ---- the front doors ----------------------------------------------------------------------------------


def test_cli_lowers_a_derived_backward(tmp_path, capsys):
    out = tmp_path / "fa.py"
    code = main(["lower", str(PROOFS / "flash_attention.ncd"), "flash_attention", "--target", "jax", "--backward",
                 "derived", "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    text = out.read_text()
    assert "jax.custom_vjp" in text and "saves L for the backward" in text and "proved equal to the VJP" in text


def test_fused_attention_with_a_derived_backward():
    import napkin_cat

    softcap = napkin_cat.attention(score_mod="30 * tanh(S / 30)", mask_mod="q >= x", backward="derived",
                                   target="jax", cache=False)
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal((45, 16)), jnp.float32) for _ in range(3))
    grads = jax.grad(lambda q, k, v: jnp.sum(softcap(q, k, v) ** 2), argnums=(0, 1, 2))(q, k, v)

    def reference(q, k, v):
        s = 30 * jnp.tanh(q @ k.T / 4.0 / 30)
        s = jnp.where(jnp.tril(jnp.ones((45, 45), bool)), s, -jnp.inf)
        return jax.nn.softmax(s, axis=-1) @ v

    want = jax.grad(lambda q, k, v: jnp.sum(reference(q, k, v) ** 2), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(grads, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-3, rtol=1e-3)


def test_the_derived_passes_give_each_statistic_as_the_forwards_logsumexp():
    """search.backward.passes: each pass reading a statistic L states it as the forward's
    logsumexp over the inputs (Param.given), which the forward's saved L satisfies
    (evaluate.related computes the same value), and the printed pass parses back with it."""
    from napkin_cat.evaluate import related
    from napkin_cat.printer import print_diagram
    from napkin_cat.terms import relations

    module = load(EXAMPLES / "attention.ncd")
    forward = saving(module.diagram("attention"), "fwd")
    (stat,) = forward.statistics
    rng = np.random.default_rng(0)
    sizes = {"q": 3, "x": 5, "d": 64}
    values = {p.name: 30 * rng.standard_normal([sizes[a] for a in p.axes]) for p in forward.diagram.inputs}
    outs = evaluate(forward.diagram, [values[p.name] for p in forward.diagram.inputs], sizes=sizes)
    values |= {o.name: v for o, v in zip(forward.diagram.outputs, outs, strict=True) if isinstance(o, Var)}
    for b in passes(forward, "bwd"):
        assert stat in relations(b.inputs), b.name
        values |= {p.name: rng.standard_normal([sizes[a] for a in p.axes]) for p in b.inputs if p.name not in values}
        drawn = related(b, [values[p.name] + (p.name == stat) for p in b.inputs], sizes)
        assert np.allclose(drawn[[p.name for p in b.inputs].index(stat)], values[stat], rtol=1e-12)
        axes = "axis " + ", ".join(a.name for a in b.axes) + "\n"
        assert loads(axes + print_diagram(b)).diagram(b.name).inputs == b.inputs


BIAS = """axis q, x, r
diagram biased(S: [q x], T: [r], bucket: int [q x]) -> [q x] {
  return S + gather[r](T, bucket)
}
theorem tiled_bias: biased {
  group q by gq
}
"""


@pytest.mark.parametrize("target", ["jax", "pallas"])
def test_a_gathered_table_of_symbolic_size_gets_its_gradient(tmp_path, target):
    """The gradient of a table read by a gather is a scatter-add of the cotangent at the positions:
    its pass reads neither the table nor anything else along the table's axis `r`, so it takes the
    table as an input for its size (``search.backward._sizing``; without it, lowering failed with
    "axis `r` ... gets its size from no input").  The gradients match the float64 VJP."""
    path = tmp_path / "bias.ncd"
    path.write_text(BIAS)
    found = _derived(load(path), "tiled_bias", target)
    table_pass = next(thm for thm in found.backward if thm.result.out_types == (("r",),))
    assert [p.name for p in table_pass.result.inputs if "r" in p.axes] == ["T"]
    why = _check_gradients(path, "tiled_bias", target, found=found)
    assert why is not None and "`gather` is outside the proved fragment" in why


def test_the_budget_reaches_every_search():
    """``budget`` bounds each search ``derived`` runs: with one candidate a pass's search prices only
    the diagram as written, so no pass is partitioned (``SEARCH_BUDGET`` finds FlashAttention-2's
    plan: ``test_passes_group_their_gradients_own_axes``), and the forward keeps its theorem's steps."""
    found = derived(load(PROOFS / "flash_attention.ncd"), "flash_attention", target="jax", hardware="cpu",
                    budget=1, seconds=math.inf)
    assert [p.kind for p in proof.partitions(found.forward)] == ["group", "stream"]
    assert len(found.backward) == 2 and all(not proof.partitions(thm) for thm in found.backward)
