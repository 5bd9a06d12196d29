"""Forward and backward kernels joined into one ``jax.custom_vjp`` (``lower(forward,
backward=[...])``, README "Training").

FlashAttention-2 (examples/attention_backward.ncd, checked schedules in
proofs/flash_attention_backward.ncd): the forward also returns L = logsumexp of the scores;
the backward diagrams read it, O and the cotangent dO instead of a second softmax.  They equal
napkin's VJP of attention (``grad.vjp``, itself tested against jax.grad) in float64 at ragged
sizes, causal and not; their kernels on both targets give that gradient within f32 tolerance;
the joined function does too under ``jax.grad``; and every way to join the wrong diagrams is
refused with its message.  The MLP (three backward passes) and cross-entropy (a saved LSE)
are joined the same way.  (Every theorem of proofs/ is also lowered against the evaluator
and cross-lowered for CUDA by test_lower_*.)
"""

from __future__ import annotations

import re
import warnings
from dataclasses import replace
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy

from napkin_cat import grad, kernel, proof, run
from napkin_cat.certify.accumulators import FLOAT_MAX
from napkin_cat.certify.prove import Unproved, prove_join
from napkin_cat.cli import main
from napkin_cat.cost import cost
from napkin_cat.diagnostics import NapkinError
from napkin_cat.elaborate import load, loads
from napkin_cat.evaluate import evaluate
from napkin_cat.lower import lower
from napkin_cat.lower.backward import LONG, UnprovedJoinWarning, link
from tests.lower_cases import proved

ROOT = Path(__file__).resolve().parent.parent
MODULE = load(ROOT / "examples" / "attention_backward.ncd")
PROOFS = ROOT / "proofs" / "flash_attention_backward.ncd"
SIZES = {"q": 37, "x": 53, "d": 64}  # ragged against every tile below
#: (prefix of the diagrams, of the theorems, the plain diagram whose VJP they give)
VARIANTS = [("attention", "flash_attention", "attention"),
            ("causal_attention", "flash_attention_causal", "causal_attention")]


def _inputs(seed: int, sizes: dict[str, int] = SIZES) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((sizes[a], sizes["d"])) for a in ("q", "x", "x", "q")]  # Q, K, V, dO


def _reference(plain: str, arrays: list[np.ndarray], sizes: dict[str, int] = SIZES) -> tuple[np.ndarray, ...]:
    """dQ, dK, dV from the VJP of the plain diagram, in float64."""
    vjp = grad.vjp(MODULE.diagram(plain))
    return tuple(np.asarray(g) for g in evaluate(vjp, arrays, sizes=sizes))


def _saved(diagrams: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Q, K, V, O, L, dO: what the backward diagrams read (O and L from the forward diagram)."""
    q, k, v, d_o = arrays
    o, lse = evaluate(MODULE.diagram(f"{diagrams}_forward"), [q, k, v], sizes=SIZES)
    return [q, k, v, np.asarray(o), np.asarray(lse), d_o]


@pytest.mark.parametrize(("diagrams", "theorems", "plain"), VARIANTS)
def test_the_backward_diagrams_are_the_vjp_of_attention(diagrams: str, theorems: str, plain: str) -> None:
    arrays = _inputs(0)
    want = _reference(plain, arrays)
    saved = _saved(diagrams, arrays)
    d_k, d_v = evaluate(MODULE.diagram(f"{diagrams}_backward_kv"), saved, sizes=SIZES)
    d_q = evaluate(MODULE.diagram(f"{diagrams}_backward_q"), saved, sizes=SIZES)
    for got, expected in zip((d_q, d_k, d_v), want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    # the statistic matters: a wrong L gives another gradient
    wrong = evaluate(MODULE.diagram(f"{diagrams}_backward_q"), [*saved[:4], saved[4] + 0.5, saved[5]], sizes=SIZES)
    assert not np.allclose(wrong, want[0], rtol=1e-3)


@pytest.mark.parametrize("target", ["jax", "pallas"])
def test_the_lowered_backward_kernels_give_the_gradient(target: str) -> None:
    arrays = _inputs(1)
    want = _reference("attention", arrays)
    options = {"interpret": True} if target == "pallas" else {}
    args = [jnp.asarray(a, jnp.float32) for a in _saved("attention", arrays)]
    kv = lower(proof.theorem(PROOFS, "flash_attention_backward_kv"), target=target, tiles={"gx": 16, "sq": 16})
    q = lower(proof.theorem(PROOFS, "flash_attention_backward_q"), target=target, tiles={"gq": 16, "sx": 16})
    d_k, d_v = jax.jit(lambda *a: kv.fn(*a, **options))(*args)
    d_q = jax.jit(lambda *a: q.fn(*a, **options))(*args)
    for got, expected in zip((d_q, d_k, d_v), want, strict=True):
        scale = float(np.max(np.abs(expected)))
        np.testing.assert_allclose(np.asarray(got, np.float64), expected, rtol=0, atol=1e-4 * scale)


def _joined(theorems: str, target: str, kv: str = "kv") -> object:
    backward = [proof.theorem(PROOFS, f"{theorems}_backward_{part}") for part in (kv, "q")]
    return lower(proof.theorem(PROOFS, f"{theorems}_forward"), target=target, backward=backward,
                 tiles={"gq": 32, "sx": 16, "gx": 16, "sq": 32, "bq": 16})


@pytest.mark.parametrize("kv", ["kv", "kv_hoisted"])
@pytest.mark.parametrize("target", ["jax", "pallas"])
@pytest.mark.parametrize(("diagrams", "theorems", "plain"), VARIANTS)
def test_jax_grad_through_the_joined_kernels_is_attentions(target: str, diagrams: str, theorems: str,
                                                         plain: str, kv: str) -> None:
    """The issue's case: q=100, x=77 (causal 100×100), tiles 32/16, both targets; the key pass
    as one kernel and as the chain that writes D first (``kv_hoisted``)."""
    sizes = {"q": 100, "x": 100 if "causal" in plain else 77, "d": 64}
    arrays = _inputs(2, sizes)
    want = _reference(plain, arrays, sizes)
    lowered = _joined(theorems, target, kv)
    options = {"interpret": True} if target == "pallas" else {}
    d_o = jnp.asarray(arrays[3], jnp.float32)

    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.sum(lowered.fn(q, k, v, **options) * d_o)  # type: ignore[attr-defined]

    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*[jnp.asarray(a, jnp.float32) for a in arrays[:3]])
    for g, expected in zip(got, want, strict=True):
        assert float(np.max(np.abs(np.asarray(g, np.float64) - expected))) < 1e-4 * float(np.max(np.abs(expected)))
    value = lowered.fn(*[jnp.asarray(a, jnp.float32) for a in arrays[:3]], **options)  # type: ignore[attr-defined]
    o, _ = evaluate(MODULE.diagram(f"{diagrams}_forward"), arrays[:3], sizes=sizes)
    assert np.asarray(value).shape == (100, 64) and np.allclose(np.asarray(value), o, atol=1e-5)


def test_the_joined_module_says_what_it_rests_on() -> None:
    source = _joined("flash_attention", "pallas").source  # type: ignore[attr-defined]
    assert "@jax.custom_vjp" in source and "def flash_attention_backward_kv(" in source
    assert "the forward kernel returns O and saves L for the backward" in source
    assert "That the backward diagrams together are the forward's VJP is proved equal to the VJP of the forward " \
           "(napkin_cat.grad) symbolically at every size, on finite real inputs, and tested in float64" in source


@pytest.mark.parametrize(("file", "forward", "backwards", "why"), [
    ("attention_backward", "causal_attention_forward", "causal_attention_backward_kv,causal_attention_backward_q",
     None),
    ("mlp_backward", "mlp_forward", "mlp_backward_x,mlp_backward_w,mlp_backward_b", "a diagram used as a box"),
    ("cross_entropy_backward", "cross_entropy_forward", "cross_entropy_backward", None),
])
def test_each_shipped_join_is_proved_or_says_why_not(file: str, forward: str, backwards: str, why: str | None) -> None:
    """A join the prover cannot prove is refused with its reason; with the opt-in it rests on
    the float64 test alone, and says so."""
    module = load(ROOT / "examples" / f"{file}.ncd")
    diagrams = (module.diagram(forward), [module.diagram(b) for b in backwards.split(",")])
    if why is None:
        ln = link(*diagrams)
        assert ln.proved and ln.trust.startswith("proved equal to the VJP")
        return
    with pytest.raises(NapkinError) as err:
        link(*diagrams)
    assert err.value.codes == ("lower.backward_unproved",)
    assert f"`{forward}` are not proved to give its VJP (certify.prove.prove_join: {why})" in str(err.value)
    ln = link(*diagrams, allow_tested=True)
    assert not ln.proved
    assert ln.trust.startswith(f"tested, not proved ({why}): equal to the VJP of the forward")


def test_the_join_prover_refuses_a_join_that_is_nearly_right() -> None:
    """The symbolic proof is not the float64 test: D off by one part in 10^15 passes
    the float64 test here, and the prover refuses it all the same."""
    text = (ROOT / "examples" / "attention_backward.ncd").read_text().replace(
        'use "attention.ncd"', f'use "{ROOT / "examples" / "attention.ncd"}"')
    module = loads(text.replace("D = contract[d](dO, O)", "D = contract[d](dO, O) * 1.000000000000001"))
    forward = module.diagram("attention_forward")
    backwards = [module.diagram(f"attention_backward_{p}") for p in ("kv", "q")]
    ln = link(forward, backwards, allow_tested=True)  # the float64 test accepts it ...
    assert ln.trust.startswith("tested, not proved (the gradients of Q do not normalise to the same term)")
    with pytest.raises(NapkinError, match="gradients of Q do not normalise"):  # ... lower refuses it unproved
        link(forward, backwards)
    with pytest.raises(Unproved, match="gradients of Q"):  # ... the proof does not
        prove_join(forward, grad.vjp(replace(forward, outputs=forward.outputs[:1], out_types=forward.out_types[:1])),
                   list(zip(backwards, ln.sources, ln.targets, strict=True)))


def test_the_hoisted_key_pass_reads_o_once_per_row_block() -> None:
    """D = Σ_d dO·O depends on the queries alone: the one-kernel key pass loads O in every chunk
    of every program of keys (q·d values per program), the chain's first kernel loads O and dO
    once per block of queries and writes D, and its second kernel reads D (q values per program)
    and never O; the joined module calls the first kernel, then the second with D."""
    sizes = {"q": 4096, "x": 4096}
    one = cost(proof.theorem(PROOFS, "flash_attention_backward_kv"), sizes=sizes, hardware="h200")
    chain = proof.theorem(PROOFS, "flash_attention_backward_kv_hoisted")
    first, second = (cost(k, sizes={a: n for a, n in sizes.items() if a in k.result.axis_sizes()}, hardware="h200")
                     for k in chain.kernels)
    assert [p.name for p in chain.kernels[0].result.inputs] == ["O", "dO"]
    assert "O" not in {p.name for p in chain.kernels[1].result.inputs} and chain.writes == (("D",), ("return",))
    q, d, gx = 4096, 64, sympy.Symbol("gx", positive=True)
    assert sympy.simplify(first.levels[1].transfers - (2 * q * d + q)) == 0  # O, dO read once; D written once
    assert sympy.simplify(one.levels[1].transfers - second.levels[1].transfers - (q * d - q) * 4096 / gx) == 0
    source = _joined("flash_attention", "jax", "kv_hoisted").source  # type: ignore[attr-defined]
    assert re.search(r"\bD = flash_attention_backward_kv_hoisted_k1\(O\w*, dO\w*\)", source)
    assert re.search(r"return flash_attention_backward_kv_hoisted_k2\([^)]*\bD\)", source)


def test_a_wrong_hoist_is_refused() -> None:
    """A first kernel computing another D (dO·dO) is no piece of the key pass: the chain rule
    refuses its theorem; written as the diagram of a chain it is, and the join refuses it."""
    text = (ROOT / "examples" / "attention_backward.ncd").read_text().replace(
        'use "attention.ncd"', f'use "{ROOT / "examples" / "attention.ncd"}"')
    chain = ("theorem hoisted: attention_backward_kv {\n  kernel D {\n    group q by bq\n  }\n"
             "  kernel return {\n    group x by gx\n    stream q by sq via sum\n  }\n}\n")
    wrong = loads(text.replace("D = contract[d](dO, O)", "D = contract[d](dO, dO)") + chain)
    right = proof.theorem(PROOFS, "flash_attention_backward_kv_hoisted")
    bad = proof.prove(wrong, "hoisted")
    with pytest.raises(kernel.KernelError, match="not about its piece"):
        kernel.chain(kernel.refl(right.name, right.source), right.writes, (bad.kernels[0], right.kernels[1]), None)
    forward = proof.theorem(PROOFS, "flash_attention_forward")
    dq = proof.theorem(PROOFS, "flash_attention_backward_q")
    with pytest.raises(NapkinError) as err:
        lower(forward, target="jax", backward=[bad, dq], tiles={"gq": 16, "sx": 16, "gx": 16, "sq": 16, "bq": 16})
    assert err.value.codes == ("lower.backward_unproved",)
    with pytest.raises(NapkinError) as err:
        lower(forward, target="jax", backward=[bad, dq], allow_tested_join=True,
              tiles={"gq": 16, "sx": 16, "gx": 16, "sq": 16, "bq": 16})
    assert err.value.codes == ("lower.backward_wrong",)


# ---- refusals: every way to join the wrong diagrams ---------------------------------------------

FORWARD = """axis q, x
axis d = 4
diagram f(Q: [q d], K: [x d]) -> [q], [q] {
  S = contract[d](Q, K)
  t = sum[x](S)
  m = max[x](S)
  return t, m
}
"""
#: dQ = dt·Σ_x K and dK = Σ_q dt·Q (for every key) for the first output t = Σ_x S; m is saved
RIGHT = ("diagram b(K: [x d], dt: [q], Q: [q d]) -> [q d], [x d] {\n  dQ = dt * sum[x](K)\n"
         "  dK = K * 0 + contract[q](dt, Q)\n  return dQ, dK\n}\n")


def _join(backward_text: str, allow_tested_join: bool = False) -> object:
    forward = proved(FORWARD, "f", "group q by gq")
    back = kernel.refl("b", loads(FORWARD + backward_text).diagram("b"))
    return lower(forward, target="jax", tiles={"gq": 4}, backward=[back], allow_tested_join=allow_tested_join)


def test_a_right_backward_of_another_diagram_is_joined() -> None:
    """The valid case beside the refusals below: t's gradient, m saved (not returned)."""
    fn = _join(RIGHT).fn  # type: ignore[attr-defined]
    rng = np.random.default_rng(4)
    q, k = rng.standard_normal((6, 4)), rng.standard_normal((5, 4))
    got = jax.grad(lambda a, b: jnp.sum(fn(a, b) ** 2), argnums=(0, 1))(jnp.asarray(q, jnp.float32),
                                                                         jnp.asarray(k, jnp.float32))
    t = (q @ k.T).sum(axis=1)
    np.testing.assert_allclose(got[0], 2 * t[:, None] * k.sum(axis=0), rtol=1e-5)
    np.testing.assert_allclose(got[1], np.broadcast_to(2 * t @ q, (5, 4)), rtol=1e-5)


@pytest.mark.parametrize(("old", "new", "code", "says"), [
    ("contract[q](dt, Q)", "contract[q](dt, Q) * 2", "lower.backward_wrong", "dK at"),  # a factor 2 in dK
    ("Q", "R", "lower.backward_input", "`R`"),  # no such forward name (dQ stays)
    ("K: [x d], dt", "K: [d x], dt", "lower.backward_type", "[d x]"),  # typed unlike the forward's K
    ("dK", "gK", "lower.backward_output", "output 1"),  # an output named after no input
    ("-> [q d], [x d]", "-> [q d]", "lower.backward_wrong", "dK at [0, 0] is 0 from the backwards (no backward "
     "gives it)"),  # no gradient of K, which is not zero
    ("dt", "t", "lower.backward_primal", "dt, dm"),  # reads the saved t, no cotangent
])
def test_a_wrong_backward_is_refused(old: str, new: str, code: str, says: str) -> None:
    text = RIGHT.replace(old, new).replace("dR", "dQ")
    if "no backward" in says:
        text = text.replace("return dQ, dK", "return dQ")
    if code == "lower.backward_wrong":  # a resolved join that is wrong: first refused unproved ...
        with pytest.raises(NapkinError) as err:
            _join(text)
        assert err.value.codes == ("lower.backward_unproved",)
        assert "--allow-tested-join" in (err.value.diagnostics[0].hint or "")
    with pytest.raises(NapkinError) as err:  # ... and refused by the test with the opt-in
        _join(text, allow_tested_join=code == "lower.backward_wrong")
    assert err.value.codes == (code,)
    assert says in err.value.diagnostics[0].message, err.value.diagnostics[0].message


def test_a_backward_cannot_join_a_mesh() -> None:
    forward = proved(FORWARD, "f", "group q by gq")
    with pytest.raises(NapkinError) as err:
        lower(forward, target="jax", backward=[forward], mesh=2)
    assert err.value.codes == ("lower.backward_mesh",)


def test_napkin_lower_backward_writes_one_differentiable_module(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fa.py"
    code = main(["lower", str(PROOFS), "flash_attention_forward",
                 "--backward", "flash_attention_backward_kv,flash_attention_backward_q", "--target", "jax",
                 "--dtype", "f32", "--tile", "gq=16", "--tile", "sx=16", "--tile", "gx=16", "--tile", "sq=16",
                 "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    namespace: dict[str, object] = {}
    exec(compile(out.read_text(), str(out), "exec"), namespace)
    fn = namespace["flash_attention_forward"]
    arrays = _inputs(3, {"q": 20, "x": 24, "d": 64})
    got = jax.grad(lambda q: jnp.sum(fn(q, *[jnp.asarray(a, jnp.float32) for a in arrays[1:3]])  # type: ignore[operator]
                                     * jnp.asarray(arrays[3], jnp.float32)))(jnp.asarray(arrays[0], jnp.float32))
    want = _reference("attention", arrays, {"q": 20, "x": 24, "d": 64})[0]
    assert float(np.max(np.abs(np.asarray(got) - want))) < 1e-4 * float(np.max(np.abs(want)))
    capsys.readouterr()
    bad = main(["lower", str(PROOFS), "flash_attention_forward", "--backward", "flash_attention_backward_kv,nope",
                "-o", str(tmp_path / "x.py")])
    assert bad == 2 and "no theorem `nope`" in capsys.readouterr().err


# ---- the other joined pairs of proofs/: the MLP (three backward passes) and cross-entropy -------

@pytest.mark.parametrize("target", ["jax", "pallas"])
def test_jax_grad_through_the_joined_mlp_is_the_mlps(target: str) -> None:
    """dX from the token pass, dW1, dB1, dW2 from the hidden pass, dB2 its own: summed into one
    custom VJP at ragged sizes, equal to the VJP of examples/mlp.ncd's mlp."""
    path = ROOT / "proofs" / "mlp_backward.ncd"
    backward = [proof.theorem(path, f"mlp_backward_{part}") for part in ("x", "w", "b")]
    with pytest.warns(UnprovedJoinWarning, match="mlp_forward: the join of its backward kernels is not proved"):
        lowered = lower(proof.theorem(path, "mlp_forward"), target=target, backward=backward,
                        tiles={"gt": 16, "sf": 16, "gf": 16, "st": 16}, allow_tested_join=True)
    assert "WARNING: the join is not proved" in lowered.source
    rng = np.random.default_rng(5)
    sizes = {"t": 37, "d": 20, "f": 45}
    shapes = [("t", "d"), ("d", "f"), ("f",), ("f", "d"), ("d",), ("t", "d")]
    arrays = [rng.standard_normal([sizes[a] for a in s]) for s in shapes]  # X, W1, B1, W2, B2, dY
    options = {"interpret": True} if target == "pallas" else {}
    d_y = jnp.asarray(arrays[5], jnp.float32)
    got = jax.grad(lambda *a: jnp.sum(lowered.fn(*a, **options) * d_y), argnums=tuple(range(5)))(
        *[jnp.asarray(a, jnp.float32) for a in arrays[:5]])
    want = evaluate(grad.vjp(load(ROOT / "examples" / "mlp.ncd").diagram("mlp")), arrays, sizes=sizes)
    for g, w in zip(got, want, strict=True):
        w = np.asarray(w)
        assert float(np.max(np.abs(np.asarray(g, np.float64) - w))) < 1e-4 * max(1.0, float(np.max(np.abs(w))))


@pytest.mark.parametrize("target", ["jax", "pallas"])
def test_jax_grad_through_the_joined_cross_entropy_is_its_vjp(target: str) -> None:
    """The forward saves LSE; the backward is elementwise; the labels get zeros.  The join is
    proved (``onehot`` is in the prover's fragment): no warning."""
    path = ROOT / "proofs" / "cross_entropy_backward.ncd"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnprovedJoinWarning)
        lowered = lower(proof.theorem(path, "cross_entropy_forward"), target=target,
                        backward=[proof.theorem(path, "cross_entropy_backward")], tiles={"gt": 16, "sv": 32, "gv": 32})
    rng = np.random.default_rng(6)
    z, labels, weights = rng.standard_normal((37, 100)), rng.integers(0, 100, 37).astype(float), rng.standard_normal(37)
    options = {"interpret": True} if target == "pallas" else {}
    got = jax.grad(lambda a, b: jnp.sum(lowered.fn(a, b, **options) * weights), argnums=(0, 1))(
        jnp.asarray(z, jnp.float32), jnp.asarray(labels, jnp.float32))
    want = evaluate(grad.vjp(load(ROOT / "examples" / "cross_entropy.ncd").diagram("cross_entropy_index")),
                    [z, labels, weights])
    assert float(np.max(np.abs(np.asarray(got[0], np.float64) - want[0]))) < 1e-5
    assert not np.any(np.asarray(got[1]))


# ---- the join prover on -inf masks (certify.prove.prove_join) ------------------------------------

def _masked_attention(forward_mask: str, backward_mask: str, forward_bias: str = "",
                      backward_bias: str = "") -> tuple[object, list[object], object]:
    """The causal attention pair of examples/attention_backward.ncd with the given masks (and
    terms added to the scores: an ALiBi bias)."""
    scores = "where[q x]({}, contract[d](Q, K) * rsqrt(d){}, -inf)"
    module = loads(f"""axis q, x
axis d = 4
diagram fwd(Q: [q d], K: [x d], V: [x d]) -> [q d], [q] {{
  S = {scores.format(forward_mask, forward_bias)}
  O = contract[x](softmax[x](S), V)
  L = logsumexp[x](S)
  return O, L
}}
diagram bwd(Q: [q d], K: [x d], V: [x d], O: [q d], L: [q], dO: [q d]) -> [q d], [x d], [x d] {{
  S = {scores.format(backward_mask, backward_bias)}
  P = exp(S - L)
  dS = P * (contract[d](dO, V) - contract[d](dO, O))
  return contract[x](dS, K) * rsqrt(d), contract[q](dS, Q) * rsqrt(d), contract[q](P, dO)
}}
""")
    forward = module.diagram("fwd")
    reference = grad.vjp(replace(forward, outputs=forward.outputs[:1], out_types=forward.out_types[:1]))
    sources = [("input", 0), ("input", 1), ("input", 2), ("output", 0), ("output", 1), ("cotangent", 0)]
    return forward, [(module.diagram("bwd"), sources, (0, 1, 2))], reference


def test_the_join_prover_proves_a_mask_that_keeps_a_key_per_row() -> None:
    forward, backwards, reference = _masked_attention("q >= x", "q >= x")
    assert prove_join(forward, reference, backwards).startswith("proved")  # type: ignore[arg-type]


def test_the_join_prover_refuses_a_mask_whose_index_arithmetic_wraps_int64() -> None:
    """q·3037000500² >= x holds at key 0 of every query over the integers, which the prover read to
    keep every row; 3037000500² is past 2^63, so the evaluator's int64 product is negative at q = 1 and
    the row is fully masked: L = -inf, and the FA-2 backward's exp(S - L) is NaN where the VJP is 0."""
    mask = "q * 3037000500 * 3037000500 >= x"
    forward, backwards, reference = _masked_attention(mask, mask)
    rng = np.random.default_rng(0)
    q, k, v, d_o = (rng.standard_normal((3, 4)) for _ in range(4))
    o, lse = run(forward, q, k, v)  # type: ignore[arg-type]
    assert lse[1] == -np.inf and np.isnan(run(backwards[0][0], q, k, v, o, lse, d_o)[0][1]).all()  # type: ignore[index]
    assert (run(reference, q, k, v, d_o)[0][1] == 0).all()  # type: ignore[arg-type]
    with pytest.raises(Unproved, match="may wrap in int64 at some size"):
        prove_join(forward, reference, backwards)  # type: ignore[arg-type]


#: ALiBi's penalty on the distance to each earlier key (examples/attention.ncd's alibi_attention)
ALIBI = " - 0.5 * index[q x](q - x)"


def test_the_join_prover_proves_an_alibi_bias() -> None:
    """``index`` is the integer value of its expression at each position: exactly the term."""
    forward, backwards, reference = _masked_attention("q >= x", "q >= x", ALIBI, ALIBI)
    assert prove_join(forward, reference, backwards).startswith("proved")  # type: ignore[arg-type]


@pytest.mark.parametrize("wrong", [" - 0.5 * index[q x](q - x + 1)", " - 0.5 * index[q x](x - q)",
                                   " - 0.5 * index[q x](q)"])
def test_the_join_prover_refuses_a_wrong_alibi_bias(wrong: str) -> None:
    """The backward's bias one key off, mirrored, or of the query alone: the weights differ."""
    forward, backwards, reference = _masked_attention("q >= x", "q >= x", ALIBI, wrong)
    with pytest.raises(Unproved, match="do not normalise to the same term"):
        prove_join(forward, reference, backwards)  # type: ignore[arg-type]


def _running_sum(backward: str) -> tuple[object, object, list[object]]:
    module = loads("axis t, d\ndiagram f(X: [t d], W: [d]) -> [t] {\n  return cumsum[t](contract[d](X, W))\n}\n"
                   f"diagram b(X: [t d], W: [d], g: [t]) -> [t d], [d] {{\n  r = {backward}\n"
                   "  return r * W, contract[t](r, X)\n}\n")
    forward = module.diagram("f")
    return forward, grad.vjp(forward), [(module.diagram("b"), [("input", 0), ("input", 1), ("cotangent", 0)], (0, 1))]


def test_the_join_prover_proves_a_running_sum() -> None:
    """cumsum's VJP, the reverse running sum Σ g - cumsum g + g: the same atoms on both sides."""
    forward, reference, backwards = _running_sum("sum[t](g) - cumsum[t](g) + g")
    assert prove_join(forward, reference, backwards).startswith("proved")  # type: ignore[arg-type]


@pytest.mark.parametrize("wrong", ["cumsum[t](g)", "sum[t](g) - cumsum[t](g)", "sum[t](g) - cumsum[t](g * 2) + g"])
def test_the_join_prover_refuses_a_wrong_running_sum(wrong: str) -> None:
    """The forward running sum for the reverse one, the reverse one missing its own position,
    a doubled term: each a different term."""
    forward, reference, backwards = _running_sum(wrong)
    with pytest.raises(Unproved, match="do not normalise to the same term"):
        prove_join(forward, reference, backwards)  # type: ignore[arg-type]


def _weighted(backward: str) -> tuple[object, object, list[object]]:
    module = loads("axis t, d\ndiagram f(X: [t d], B: [d]) -> [t d] {\n  return X * B\n}\n"
                   f"diagram b(X: [t d], g: [t d]) -> [d] {{\n  S = sum[t](X * g)\n  dB = {backward}\n  return dB\n}}\n"
                   "diagram bx(B: [d], g: [t d]) -> [t d] {\n  dX = g * B\n  return dX\n}\n")
    forward = module.diagram("f")
    return forward, grad.vjp(forward), [(module.diagram("b"), [("input", 0), ("cotangent", 0)], (1,)),
                                        (module.diagram("bx"), [("input", 1), ("cotangent", 0)], (0,))]


@pytest.mark.parametrize("wrong", ["S + exp(S) - exp(S)", "log(exp(S))", "S + 0.0 * exp(S)", "S * (exp(S) / exp(S))"])
def test_the_join_prover_refuses_a_backward_that_overflows_where_the_vjp_does_not(wrong: str) -> None:
    """Each is S over the reals, so the gradients normalised to the VJP's and the join was proved
    and lowered; but at X = 30 (t = 32, d = 1), g = 1, S = 960 and exp(S) is inf: the first and
    last give NaN, the second and third inf or NaN, where the VJP's dB is 960 (f32 kernels: at S > 88.7)."""
    forward, reference, backwards = _weighted(wrong)
    b = backwards[0][0]
    x, g = np.full((32, 1), 30.0), np.ones((32, 1))
    assert not np.isfinite(run(b, x, g)).all() and run(reference, x, np.ones(1), g)[1].tolist() == [960.0]  # type: ignore[arg-type]
    with pytest.raises(Unproved, match="gradient of B may overflow in float64 where the VJP's is finite"):
        prove_join(forward, reference, backwards)  # type: ignore[arg-type]
    right = _weighted("S")
    assert prove_join(right[0], right[1], right[2]).startswith("proved")  # type: ignore[arg-type]


_POWER = """axis t
diagram f(X: [t]) -> [t] {
  return X * X * X * X * X * X * X * X
}
diagram b(X: [t], d_out: [t]) -> [t] {
  dX = d_out * 8 * X * X * X * X * X * X * X + exp(X) - exp(X)
  return dX
}
"""


def test_a_backward_that_overflows_where_an_unvouched_vjp_is_finite_is_not_joined() -> None:
    """The red team's X⁸: its VJP 8·X⁷·g may overflow on the domain (X up to f32's 3.4e38), so the
    analysis cannot vouch it finite, and the finiteness check once skipped the backward then: a pass
    adding exp(X) - exp(X) normalises to the VJP and is NaN at X = 800, where the VJP is 1.7e21; the
    float64 test (inputs up to ~60) never reaches it, so `lower` joined it as proved.  Where the VJP is
    not vouched, the backward must compute what the extended reals do (finiteness.float_unsafe_box)."""
    module = loads(_POWER)
    forward, backward = module.diagram("f"), module.diagram("b")
    x, g = np.array([800.0, 1.0]), np.ones(2)
    assert np.isnan(evaluate(backward, [x, g])[0]) and np.isfinite(evaluate(grad.vjp(forward), [x, g])).all()
    with pytest.raises(NapkinError) as err:
        link(forward, [backward])
    assert err.value.codes == ("lower.backward_unproved",)
    assert "gradient of X may overflow in float64 at `sub` where the extended reals do not" in str(err.value)


def test_a_backward_reading_the_sign_of_a_term_that_underflows_is_not_joined() -> None:
    """The red team's sign of an underflow: sign(exp(Σ_t X·1e-4 - 744)) is 1 over the reals, so
    dB = S·sign(...) normalised to the VJP's S, and the float64 test's inputs never underflow it;
    at X = -5000 it is exp(-745.5) = 0 in float64, and dB is 0 where the VJP's is -15000."""
    forward, reference, backwards = _weighted("S * sign(exp(sum[t](X) * 0.0001 - 744))")
    x, g = np.full((3, 2), -5000.0), np.ones((3, 2))
    assert run(backwards[0][0], x, g).tolist() == [0.0, 0.0]  # type: ignore[arg-type]
    assert run(reference, x, np.ones(2), g)[1].tolist() == [-15000.0, -15000.0]  # type: ignore[arg-type]
    with pytest.raises(Unproved, match="takes the sign of a term float64 may round to 0"):
        prove_join(forward, reference, backwards)  # type: ignore[arg-type]


@pytest.mark.parametrize("wrong", ["(S + exp(46.5)) - exp(46.5)", "S - 1e20 + 1e20",
                                   "(S + exp(46.5)) * 1.0 - exp(46.5)",
                                   "sum[t](X * g + exp(46.5)) - sum[t](exp(46.5) + X * 0.0)"])
def test_the_join_prover_refuses_an_absorption_the_vjp_does_not_make(wrong: str) -> None:
    """Each is S over the reals and finite in float64, so the finiteness checks (the VJP's dB is
    vouched finite) let the join be proved and lowered; but at X = 1 (t = 2, d = 1), g = 1, S = 2,
    which exp(46.5) ≈ 1.6e20 (1e20) absorbs whole: dB is 0 where the VJP's is 2, also where the
    absorbing sum reaches the cancelling one through a product or a reduction.  Refused, naming
    the box and its line; the running sum and ALiBi's scores, whose absorbing sums the VJP computes
    too, stay proved (``test_the_join_prover_proves_a_running_sum``, the derived backward's sweep)."""
    forward, reference, backwards = _weighted(wrong)
    x, g = np.ones((2, 1)), np.ones((2, 1))
    assert run(backwards[0][0], x, g).tolist() == [0.0]  # type: ignore[arg-type]
    assert run(reference, x, np.ones(1), g)[1].tolist() == [2.0]  # type: ignore[arg-type]
    with pytest.raises(Unproved, match=r"gradient of B computes `.*` at <string>:7:\d+, where float64 may round "
                                       r"`.*` to its larger operand"):
        prove_join(forward, reference, backwards)  # type: ignore[arg-type]


@pytest.mark.parametrize(("forward", "backward", "scale"), [
    ("X + 0.0 * tanh(X + exp(46.5))", "sum[t](d_out * ((X + exp(46.5)) - exp(46.5)))", "1"),
    ("X + 0.0 * ((X + exp(46.5)) - exp(46.5))", "sum[t](d_out * ((X + exp(46.5)) - exp(46.5)))", "1"),
    ("X + 0.5 * ((X + exp(46.5)) - exp(46.5))", "1.5 * sum[t](d_out * ((X + exp(46.5)) - exp(46.5)))", "1.5"),
])
def test_the_join_prover_refuses_an_absorption_the_vjp_does_not_carry_alike(forward: str, backward: str,
                                                                           scale: str) -> None:
    """The red team's VJPs that compute the backward's absorbing sum X + exp(46.5), or even cancel it,
    where its error does not reach their value as it reaches the backward's: 0.0 · tanh(X + C),
    0.0 · ((X + C) - C), or 0.5 · ((X + C) - C) beside an exact X (dB is 2 at X = 1, t = 2, d = 1,
    g = 1); the join once passed on the shared sum alone, and the backward's (X + C) - C is 0.  The
    VJP must cancel the same sum (``finiteness.cancelling_sums``, as ALiBi's softmax shifts its
    scores) and both gradients must normalise alike with it opaque (``prove._alike_around``)."""
    module = loads(f"axis t, d\ndiagram f(X: [t d], B: [d]) -> [t d] {{\n  return B * ({forward})\n}}\n"
                   f"diagram b(X: [t d], d_out: [t d]) -> [d] {{\n  dB = {backward}\n  return dB\n}}\n"
                   f"diagram bx(B: [d], d_out: [t d]) -> [t d] {{\n  dX = d_out * B * {scale}\n  return dX\n}}\n")
    f, b, bx = module.diagram("f"), module.diagram("b"), module.diagram("bx")
    x, g = np.ones((2, 1)), np.ones((2, 1))
    assert np.asarray(evaluate(b, [x, g])).tolist() == [0.0]
    assert np.asarray(evaluate(grad.vjp(f), [x, np.ones(1), g])[1]).tolist() == [2.0]
    with pytest.raises(NapkinError, match=r"gradient of B computes `X \+ exp\(46.5\) - exp\(46.5\)`") as err:
        link(f, [b, bx])
    assert err.value.codes == ("lower.backward_unproved",)


def test_the_join_prover_refuses_an_absorption_cancelled_by_the_joins_sum() -> None:
    """The red team's split gradient: one backward gives g·(X + C), another 0 - g·C (C = exp(46.5)),
    g·X over the reals, the VJP of X²/2; neither cancels an absorption itself, but the join adds them in
    float64, C - C = 0 at X = 1 where the VJP is 1.  The join's sum is checked as a backward's is."""
    module = loads("axis t\ndiagram f(X: [t]) -> [t] {\n  return 0.5 * X * X\n}\n"
                   "diagram b1(X: [t], d_out: [t]) -> [t] {\n  dX = d_out * (X + exp(46.5))\n  return dX\n}\n"
                   "diagram b2(d_out: [t]) -> [t] {\n  dX = 0.0 - d_out * exp(46.5)\n  return dX\n}\n")
    f, b1, b2 = module.diagram("f"), module.diagram("b1"), module.diagram("b2")
    x, g = np.array([1.0, 2.0]), np.ones(2)
    assert (np.asarray(evaluate(b1, [x, g])) + np.asarray(evaluate(b2, [g]))).tolist() == [0.0, 0.0]
    assert np.asarray(evaluate(grad.vjp(f), [x, g])).tolist() == [1.0, 2.0]
    with pytest.raises(NapkinError, match=r"the join's sum of the backwards' gradients of X may cancel") as err:
        link(f, [b1, b2])
    assert err.value.codes == ("lower.backward_unproved",)


_CENTRED = """axis t
diagram f(X: [t], Y: [t], B: []) -> [] {{
  return B * sum[t]((X - mean[t](X)) * Y)
}}
diagram b(X: [t], Y: [t], d_out: []) -> [] {{
  dB = {backward}
  return dB
}}
diagram bxy(X: [t], Y: [t], B: [], d_out: []) -> [t], [t] {{
  dX = d_out * B * (Y - mean[t](Y))
  dY = d_out * B * (X - mean[t](X))
  return dX, dY
}}
"""


@pytest.mark.parametrize("offset", ["exp(46.5)", "(exp(46.5) + 0.0 * X)"])
def test_the_join_prover_refuses_an_absorption_cancelled_by_a_reduction(offset: str) -> None:
    """The red team's centred weights: dB = g·Σ_t (X - mean X)·(Y + C) is the VJP's g·Σ_t (X - mean X)·Y
    over the reals, the weights summing to 0, and no sum or difference cancels the absorbing Y + C (a
    reduction does), so the join was proved; at X = [1, 2], Y = [0, 1], C = exp(46.5) absorbs Y whole
    and dB is 0 where the VJP's is 0.5.  Scaling C by a fresh δ leaves the gradient's term unchanged:
    C's share cancels (``prove._offsets_cancelled``)."""
    module = loads(_CENTRED.format(backward=f"d_out * sum[t]((X - mean[t](X)) * (Y + {offset}))"))
    f, b, bxy = module.diagram("f"), module.diagram("b"), module.diagram("bxy")
    x, y, one = np.array([1.0, 2.0]), np.array([0.0, 1.0]), np.array(1.0)
    assert float(evaluate(b, [x, y, one])) == 0.0  # type: ignore[arg-type]
    assert float(evaluate(grad.vjp(f), [x, y, one, one])[2]) == 0.5  # type: ignore[arg-type]
    with pytest.raises(NapkinError, match=r"gradient of B computes `Y \+ .*` at <string>:6:\d+, which float64 may "
                                          r"round to its larger operand, and one operand's share") as err:
        link(f, [b, bxy])
    assert err.value.codes == ("lower.backward_unproved",)
    right = loads(_CENTRED.format(backward="d_out * sum[t]((X - mean[t](X)) * Y)"))
    assert link(right.diagram("f"), [right.diagram("b"), right.diagram("bxy")]).proved


def test_the_join_prover_refuses_an_absorption_in_a_saved_output() -> None:
    """The red team's saved sum: the forward saves O = X + C (C = exp(46.5)) beside Y = B·X, and the
    backward's dB = Σ dY·(O - C) is the VJP's Σ dY·X over the reals; O is an input there, so the
    backward's O - C was no cancelled absorption, but float64 absorbed X into O: dB is 0 at X = 1
    (t = 2, d = 1) where the VJP is 2.  The check reads the backward over the VJP's inputs too."""
    module = loads("axis t, d\ndiagram f(X: [t d], B: [d]) -> [t d], [t d] {\n  Y = B * X\n"
                   "  O = X + exp(46.5)\n  return Y, O\n}\n"
                   "diagram b(O: [t d], dY: [t d]) -> [d] {\n  dB = sum[t](dY * (O - exp(46.5)))\n  return dB\n}\n"
                   "diagram bx(B: [d], dY: [t d]) -> [t d] {\n  dX = dY * B\n  return dX\n}\n")
    f, b, bx = module.diagram("f"), module.diagram("b"), module.diagram("bx")
    x, g = np.ones((2, 1)), np.ones((2, 1))
    saved = evaluate(f, [x, np.ones(1)])[1]
    assert np.asarray(evaluate(b, [saved, g])).tolist() == [0.0]
    assert np.asarray(evaluate(grad.vjp(f), [x, np.ones(1), g, np.zeros((2, 1))])[1]).tolist() == [2.0]
    with pytest.raises(NapkinError, match=r"gradient of B computes `X \+ exp\(46.5\) - exp\(46.5\)`") as err:
        link(f, [b, bx])
    assert err.value.codes == ("lower.backward_unproved",)


def test_the_join_prover_refuses_a_softmax_shifted_past_its_scores() -> None:
    """The red team's shifted softmax: dV = g·softmax[x](S + exp(33)) is the VJP's g·softmax[x](S) over
    the reals (the shift is constant along x), so the join was proved, and the float64 test (sizes 1-7
    and past 7, scale 1 to 16) let it through; but S + 2.1e14 keeps S to 1/32 only: at S = [0, 0.01]
    dV is [0.5, 0.5] where the VJP's is [0.4975, 0.5025] (and [0.5, 0.5] at S = [0, 3] with
    exp(46.5)).  The shift's share cancels in the softmax: ``prove._offsets_cancelled``."""
    module = loads("axis x\ndiagram f(S: [x], V: [x]) -> [] {\n  return contract[x](softmax[x](S), V)\n}\n"
                   "diagram b(S: [x], d_out: []) -> [x] {\n  dV = d_out * softmax[x](S + exp(33.0))\n  return dV\n}\n"
                   "diagram bs(S: [x], V: [x], d_out: []) -> [x] {\n  P = softmax[x](S)\n"
                   "  dS = d_out * P * (V - contract[x](P, V))\n  return dS\n}\n")
    f, b, bs = module.diagram("f"), module.diagram("b"), module.diagram("bs")
    s, v, one = np.array([0.0, 0.01]), np.array([1.0, 2.0]), np.array(1.0)
    assert np.asarray(evaluate(b, [s, one])).tolist() == [0.5, 0.5]
    assert np.allclose(evaluate(grad.vjp(f), [s, v, one])[1], [0.4975, 0.5025], atol=1e-5)
    with pytest.raises(NapkinError, match=r"gradient of V computes `S \+ exp\(33\)` .* one operand's share") as err:
        link(f, [b, bs])
    assert err.value.codes == ("lower.backward_unproved",)


_CARRIED = """axis x
diagram f(S: [x], V: [x], B: []) -> [] {{
  return B * {forward}
}}
diagram b(S: [x], V: [x], d_out: []) -> [] {{
  dB = d_out * ({backward})
  return dB
}}
diagram bs(S: [x], V: [x], B: [], d_out: []) -> [x], [x] {{
  P = softmax[x](S)
  {others}
  return dS, dV
}}
"""


@pytest.mark.parametrize(("forward", "backward", "others", "want"), [
    ("logsumexp[x](S) + 0.0 * sum[x](V)", "logsumexp[x](S + exp(46.5)) - exp(46.5)",
     "dS = d_out * B * P\n  dV = 0.0 * V", 3.048587351573742),
    ("contract[x](softmax[x](S), V)", "ncontract[x; exp, exp, id](S, V + exp(46.5)) - exp(46.5)",
     "dS = d_out * B * P * (V - contract[x](P, V))\n  dV = d_out * B * P", 1.9525741268224335),
])
def test_the_join_prover_refuses_an_absorption_carried_by_a_logsumexp_or_a_normalised_contraction(
        forward: str, backward: str, others: str, want: float) -> None:
    """The red team's carried absorptions: logsumexp(S + C) is C + logsumexp(S), a weighted mean of
    V + C is C + the mean of V, so the difference with C is the VJP's term over the reals; but the
    cancelling difference reached the absorbing sum only through boxes said to carry their operand's
    value along (``finiteness._CARRY``), which lacked logsumexp and ncontract: at S = [0, 3], V = [1, 2]
    (C = exp(46.5)) dB is 0 and 32768 where the VJP's is 3.05 and 1.95."""
    module = loads(_CARRIED.format(forward=forward, backward=backward, others=others))
    f, b, bs = module.diagram("f"), module.diagram("b"), module.diagram("bs")
    s, v, one = np.array([0.0, 3.0]), np.array([1.0, 2.0]), np.array(1.0)
    assert abs(float(evaluate(b, [s, v, one])) - want) > 1.0  # type: ignore[arg-type]
    assert float(evaluate(grad.vjp(f), [s, v, one, one])[2]) == pytest.approx(want)  # type: ignore[arg-type]
    with pytest.raises(NapkinError, match=r"gradient of B computes .* where float64 may round `(S|V) \+ exp") as err:
        link(f, [b, bs])
    assert err.value.codes == ("lower.backward_unproved",)


@pytest.mark.parametrize("carried", ["recip(recip(E + exp(46.5)))", "exp(log(E + exp(46.5)))",
                                     "square(sqrt(E + exp(46.5)))", "exp(46.5) / (exp(46.5) / (E + exp(46.5)))"])
def test_the_join_prover_refuses_an_absorption_given_back_by_nonlinear_boxes(carried: str) -> None:
    """The red team's nonlinear carries: E + C with E = exp(tanh X) (C = exp(46.5)) read back through a
    reciprocal of a reciprocal, exp of log, square of sqrt, a quotient's divisor, then less C: E over
    the reals, so dB normalised to the VJP's Σ g·E, and only products, quotients' numerators,
    reductions and reshapes were said to carry an absorbed value; at X = 0 (t = 2), g = 1, dB is 0
    (or -65536) where the VJP's is 2.  C scaled by a fresh exp(δ) wherever the gradient reads it, the
    gradient still normalises to the same term: its share cancels (``prove._offsets_cancelled``)."""
    module = loads("axis t, d\ndiagram f(X: [t d], B: [d]) -> [t d] {\n  return exp(tanh(X)) * B\n}\n"
                   f"diagram b(X: [t d], d_out: [t d]) -> [d] {{\n  E = exp(tanh(X))\n"
                   f"  dB = sum[t](d_out * ({carried} - exp(46.5)))\n  return dB\n}}\n"
                   "diagram bx(X: [t d], B: [d], d_out: [t d]) -> [t d] {\n"
                   "  dX = d_out * B * (1 - square(tanh(X))) * exp(tanh(X))\n  return dX\n}\n")
    f, b, bx = module.diagram("f"), module.diagram("b"), module.diagram("bx")
    x, g = np.zeros((2, 1)), np.ones((2, 1))
    assert abs(np.asarray(evaluate(b, [x, g]))[0] - 2.0) >= 2.0
    assert np.asarray(evaluate(grad.vjp(f), [x, np.ones(1), g])[1]).tolist() == [2.0]
    with pytest.raises(NapkinError, match=r"computes `.*exp\(tanh\(X\)\) \+ exp\(46.5\).*` .* operand's share") as err:
        link(f, [b, bx])
    assert err.value.codes == ("lower.backward_unproved",)


def test_a_saved_output_read_without_its_inputs_is_analysed_as_the_forward_computes_it() -> None:
    """The red team's saved exp: the forward saves O = exp(X) beside Y = X·Z, and the backward's
    dX = dY·Z·(O·0 + 1) reads O but not X, so O was analysed as a finite input and the gradient
    vouched finite (and O·0 + 1 normalises to 1); but O is +inf at X = 800, and dX NaN where the
    VJP's is 1.  O is now analysed as the forward computes it (``Param.written``)."""
    module = loads("axis t\ndiagram f(X: [t], Z: [t]) -> [t], [t] {\n  Y = X * Z\n  O = exp(X)\n  return Y, O\n}\n"
                   "diagram b(Z: [t], O: [t], dY: [t]) -> [t] {\n  dX = dY * Z * (O * 0 + 1)\n  return dX\n}\n"
                   "diagram bz(X: [t], dY: [t]) -> [t] {\n  dZ = dY * X\n  return dZ\n}\n")
    f, b, bz = module.diagram("f"), module.diagram("b"), module.diagram("bz")
    x, one = np.array([800.0, 1.0]), np.ones(2)
    saved = evaluate(f, [x, one])[1]
    assert np.isnan(np.asarray(evaluate(b, [one, saved, one]))[0])
    assert np.asarray(evaluate(grad.vjp(replace(f, outputs=f.outputs[:1], out_types=f.out_types[:1])),
                               [x, one, one])[0]).tolist() == [1.0, 1.0]
    with pytest.raises(NapkinError, match="gradient of X may overflow in float64 where the VJP's is finite") as err:
        link(f, [b, bz])
    assert err.value.codes == ("lower.backward_unproved",)


@pytest.mark.parametrize(("forward_mask", "backward_mask", "why"), [
    # a different mask in the backward: different indicators, different terms
    ("q >= x", "q > x", "gradients of Q do not normalise"),
    # the last rows are fully masked where q ≥ |x|: L = log 0 = -inf, and exp(S - L) =
    # exp(-inf + inf) is NaN there where the VJP gives 0; the prover cannot show a key survives
    ("q < x", "q < x", "not known positive|may be 0"),
    # every row keeps a key (x = q when q < x's size), but not one the prover can name: not proved
    ("q >= x and q - x < 4", "q >= x and q - x < 4", "not known positive|may be 0"),
])
def test_the_join_prover_refuses_masks_it_cannot_show_sound(forward_mask: str, backward_mask: str, why: str) -> None:
    forward, backwards, reference = _masked_attention(forward_mask, backward_mask)
    with pytest.raises(Unproved, match=why):
        prove_join(forward, reference, backwards)  # type: ignore[arg-type]


def test_the_join_prover_refuses_a_minus_inf_mask_read_as_a_number() -> None:
    """A masked value multiplied (contract) is -inf · V, which no symbolic term stands for."""
    module = loads("axis q, x\ndiagram f(S: [q x], V: [x]) -> [q] {\n"
                   "  return contract[x](where[q x](q >= x, S, -inf), V)\n}\n"
                   "diagram b(S: [q x], V: [x], dout: [q]) -> [q x] {\n"
                   "  return where[q x](q >= x, contract[](dout, V), 0)\n}\n")
    forward = module.diagram("f")
    with pytest.raises(Unproved, match="a -inf mask meets `contract`"):
        prove_join(forward, grad.vjp(forward),
                   [(module.diagram("b"), [("input", 0), ("input", 1), ("cotangent", 0)], (0,))])


# ---- joins the prover cannot prove: refused, or with the opt-in refused by the stronger test ----

#: sliding-window attention (width 8): every row keeps a key, but the prover cannot name one; the backward's
#: weights are guarded as the derived backward's (``grad._weights``: exp(S - max(L, -FLOAT_MAX))), 0 on a row
#: the window empties (a query 8 or more past every key: the join test's long draws, q = 1024 beside x of 1 to 3),
#: where exp(S - L) is exp(-inf + inf) = NaN and the VJP's gradient 0
WINDOW = """axis q, x
axis d = 4
diagram fwd(Q: [q d], K: [x d], V: [x d]) -> [q d], [q] {{
  S = where[q x](q >= x and q - x < 8, contract[d](Q, K) * rsqrt(d), -inf)
  O = contract[x](softmax[x](S), V)
  L = logsumexp[x](S)
  return O, L
}}
diagram bwd(Q: [q d], K: [x d], V: [x d], O: [q d], L: [q], dO: [q d]) -> [q d], [x d], [x d] {{
  S = where[q x](q >= x and q - x < {width}, contract[d](Q, K) * rsqrt(d), -inf)
  P = exp(S - max(L, """ + repr(-FLOAT_MAX) + """))
  dS = P * (contract[d](dO, V) - contract[d](dO, O))
  dQ = contract[x](dS, K) * rsqrt(d)
  dK = contract[q](dS, Q) * rsqrt(d)
  dV = contract[q](P, dO)
  return dQ, dK, dV
}}
"""


def _cross_entropy(old: str, new: str) -> tuple[object, list[object]]:
    text = (ROOT / "examples" / "cross_entropy_backward.ncd").read_text().replace(
        'use "cross_entropy.ncd"', f'use "{ROOT / "examples" / "cross_entropy.ncd"}"').replace(old, new)
    module = loads(text)
    return module.diagram("cross_entropy_forward"), [module.diagram("cross_entropy_backward")]


def _window(width: int, guarded: bool = True) -> tuple[object, list[object]]:
    text = WINDOW.format(width=width)
    module = loads(text if guarded else text.replace(f"max(L, {-FLOAT_MAX!r})", "L"))
    return module.diagram("fwd"), [module.diagram("bwd")]


def _factor() -> tuple[object, list[object]]:
    module = loads(FORWARD + RIGHT.replace("dQ = dt * sum[x](K)", "dQ = dt * sum[x](K) * min(1, 8 / x)"))
    return module.diagram("f"), [module.diagram("b")]


def _gathered(backward: str) -> tuple[object, list[object]]:
    module = loads("axis n, i, d\ndiagram f(T: [n d], I: int [i]) -> [i d] {\n  return gather[n](T, I)\n}\n"
                   f"diagram b(I: int [i], d_out: [i d]) -> [n d] {{\n  dT = {backward}\n  return dT\n}}\n")
    return module.diagram("f"), [module.diagram("b")]


def _selected(scores: str) -> tuple[object, list[object]]:
    module = loads("axis q, x\ndiagram f(S: [q x], M: int [q x], V: [x]) -> [q] {\n"
                   "  return contract[x](softmax[x](select(M, S, -inf)), V)\n}\n"
                   "diagram b(S: [q x], M: int [q x], V: [x], d_out: [q]) -> [q x], [x] {\n"
                   f"  P = softmax[x]({scores})\n  dS = d_out * P * (V - contract[x](P, V))\n"
                   "  dV = contract[q](P, d_out)\n  return dS, dV\n}\n")
    return module.diagram("f"), [module.diagram("b")]


@pytest.mark.parametrize(("case", "why", "wrong"), [
    # the red team's unmasked backward: an int mask a select reads was drawn as segment ids, 1s and 2s,
    # which mask nothing, so a backward ignoring the mask passed
    (lambda: _selected("S"), "`select` is outside", "dS at"),
    # the red team's scatter-adds: a table row the int positions never named (the test drew them as
    # segment ids, 1s then 2s) left out, and positions outside [0, |n| - 1], which gather clamps, dropped
    (lambda: _gathered("where[n d](n >= 1, contract[i](onehot[n](I), d_out), 0)"), "`gather` is outside", "dT at"),
    (lambda: _gathered("contract[i](onehot[n](I), d_out)"), "`gather` is outside", "dT at"),
    # the backward's window one key wider: a key 8 behind its query needs q, x > 8 to exist (unguarded: guarded,
    # the prover's overflow check refuses it first, exp(S - max(L, -FLOAT_MAX)) unbounded at the key L leaves out)
    (lambda: _window(9, guarded=False), "not known positive|may be 0", "dQ at"),
    # the label term doubled: read only where a label names a position of the vocabulary
    (lambda: _cross_entropy("- onehot[v](L)", "- onehot[v](L) * 2"), "gradients of Z do not normalise", "dZ at"),
    # a factor that is 1 up to x = 8 and 8/x past it
    (lambda: _factor(), "gradients of Q do not normalise", "dQ at"),
], ids=["select_mask_ignored", "gather_row_0_dropped", "gather_unclamped", "window_off_by_one", "label_term_doubled",
        "size_dependent_factor"])
def test_a_wrong_join_is_refused_unproved_and_with_the_opt_in_by_the_test(case: object, why: str,
                                                                           wrong: str) -> None:
    """Issue 28's wrong joins, each of which the old test (sizes 1-7, normal labels) accepted."""
    forward, backwards = case()  # type: ignore[operator]
    with pytest.raises(NapkinError) as err:
        link(forward, backwards)
    assert err.value.codes == ("lower.backward_unproved",)
    assert re.search(why, str(err.value)), str(err.value)
    with pytest.raises(NapkinError) as err:
        link(forward, backwards, allow_tested=True)
    assert err.value.codes == ("lower.backward_wrong",)
    assert wrong in str(err.value), str(err.value)


#: dQ through a sum that adds and takes away 10^12: right, and off by float64's rounding of 10^12
#: (C a term of the inputs: a constant term past 4096 is one the draws cannot pass, refused as untestable)
#: a sum rounding dQ by up to 1e-4 (the prover would refuse the absorption as a float64 hazard, with
#: or without the opt-in, but it stops first at ``gelu``, outside its fragment: unproved, not a hazard)
CANCELLING = "C = exp(30 + 0 * tanh(sum[x](K)))\n  dQ = dt * ((sum[x](K) + C) - C) + 0 * gelu(Q)"


def test_the_float64_test_allows_rounding_but_not_a_small_error() -> None:
    """The join test compares within the two sides' running error bounds (``lower.roundoff``),
    not a fixed rtol: a cancelling sum that rounds dQ by up to 1e-4, far past rtol 1e-7, is
    joined; a dQ off by one part in 10^8, which rtol 1e-7 let through, is refused."""
    module = loads(FORWARD + RIGHT.replace("dQ = dt * sum[x](K)", CANCELLING))
    forward, backward = module.diagram("f"), module.diagram("b")
    rng = np.random.default_rng(3)
    q, k, dt = 16 * rng.standard_normal((9, 4)), 16 * rng.standard_normal((11, 4)), rng.standard_normal(9)
    got = evaluate(backward, [k, dt, q])[0]
    want = evaluate(grad.vjp(replace(forward, outputs=forward.outputs[:1], out_types=forward.out_types[:1])),
                    [q, k, dt])[0]
    assert not np.allclose(got, want, rtol=1e-7, atol=0)  # the old tolerance refused this right join
    link(forward, [backward], allow_tested=True)
    wrong = loads(FORWARD + RIGHT.replace("dQ = dt * sum[x](K)", "dQ = dt * sum[x](K) * 1.00000001"))
    with pytest.raises(NapkinError) as err:
        link(wrong.diagram("f"), [wrong.diagram("b")], allow_tested=True)
    assert err.value.codes == ("lower.backward_wrong",)
    assert "dQ at" in str(err.value) and "float64's rounding accounts for at most" in str(err.value), str(err.value)


@pytest.mark.parametrize("wrong", [
    "(sum[t](g + exp(46.5)) - cumsum[t](g + exp(46.5)) + (g + exp(46.5))) - (sum[t](g * 0 + exp(46.5)) - "
    "cumsum[t](g * 0 + exp(46.5)) + exp(46.5))",
    "sum[t](g) - (cumsum[t](g + exp(46.5)) - cumsum[t](g * 0 + exp(46.5))) + g",
    "sum[t](g) - (cumsum[t](g + exp(46.5)) - (index[t](t) + 1) * exp(46.5)) + g"])
def test_the_float64_test_refuses_a_gradient_absorbed_whole(wrong: str) -> None:
    """The running sum's gradient through a sum with exp(46.5) ≈ 1.6·10²⁰, taken away again: right over
    the reals, 0 (or 10⁶ off) in float64, and the running error bound (10⁵) covered the whole gradient,
    so the tested join lowered it; the rounding allowed is capped at 10⁻³ of the gradient's size."""
    # C as a term of the inputs: a constant term past 4096 (exp(46.5)) is one the draws cannot pass (untestable)
    module = loads("axis t, d\ndiagram f(X: [t d], W: [d]) -> [t] {\n"
                   "  H = cumsum[t](contract[d](X, W))\n  return H\n}\n"
                   f"diagram b(X: [t d], W: [d], dH: [t]) -> [t d], [d] {{\n  C = exp(46.5 + 0 * tanh(sum[t](dH)))\n"
                   f"  r = {wrong.replace('g', 'dH').replace('exp(46.5)', 'C')}\n"
                   "  dX = r * W\n  dW = contract[t](r, X)\n  return dX, dW\n}\n")
    with pytest.raises(NapkinError) as err:
        link(module.diagram("f"), [module.diagram("b")], allow_tested=True)
    assert err.value.codes == ("lower.backward_wrong",), str(err.value)
    assert "dX at" in str(err.value), str(err.value)


def test_the_tested_path_draws_sizes_past_every_constant_and_labels_across_the_vocabulary() -> None:
    """The right window and the right cross-entropy are lowered with the opt-in; the test's
    draws pass the window's width 8 and hit the first and last labels."""
    ln = link(*_window(8), allow_tested=True)  # type: ignore[arg-type]
    assert not ln.proved and "the largest constant of the diagrams, rounded up: 8" in ln.trust
    # the long draws (x=1024) are "about" a drift; the first past the constants takes cotangents at 2^-60
    drawn = re.findall(r"q=(\d+), x=(\d+) at scale \d+(?:, cotangents at 2\^-60)?;", ln.trust)
    assert len(drawn) == 4 and all(int(q) > 8 and int(x) > 8 for q, x in drawn[1:]), ln.trust
    assert "labels across the vocabulary" in link(*_cross_entropy("", ""), allow_tested=True).trust  # type: ignore[arg-type]


def test_an_unguarded_window_is_refused_at_a_long_draw_of_the_queries() -> None:
    """The right window's backward with its weights unguarded, exp(S - L): exp(-inf + inf) = NaN on a row the
    window empties (a query 8 or more past every key), where the VJP's gradient is 0.  The draws past the
    constants take q and x both from 9 to 15, so no row is empty, and the long draws ran only along the axes the
    forward reduces (x, beside q of 1 to 3): the opt-in lowered it.  An axis only a backward reduces (q, in dK
    and dV) is drawn long too (q = 1024 beside x of 1 to 3), and the join is refused there."""
    forward, backwards = _window(8, guarded=False)
    with pytest.raises(NapkinError) as err:
        link(forward, backwards)  # type: ignore[arg-type]
    assert err.value.codes == ("lower.backward_unproved",), str(err.value)
    with pytest.raises(NapkinError) as err:
        link(forward, backwards, allow_tested=True)  # type: ignore[arg-type]
    assert err.value.codes == ("lower.backward_wrong",), str(err.value)
    assert "is nan from the backwards but 0 from the VJP" in str(err.value), str(err.value)
    assert re.search(rf"with sizes q={LONG}, x=[123] at scale 1 about", str(err.value)), str(err.value)


def test_a_join_whose_constants_are_past_what_the_test_can_draw_is_refused() -> None:
    """The test draws sizes past every integer constant: a window of 5000 keys would need
    arrays of 5001² values per draw (an index constant past 2^31, such as 3037000500, tried to
    allocate 90 GiB); past LARGEST the opt-in refuses with the reason instead."""
    with pytest.raises(NapkinError) as err:
        # unguarded: guarded, the prover's overflow check refuses the keys past the forward's window first
        link(*_window(5000, guarded=False), allow_tested=True)  # type: ignore[arg-type]
    assert err.value.codes == ("lower.backward_untestable",)
    assert "a constant of magnitude 5000" in str(err.value) and "prove the join instead" in str(err.value)


def test_lower_joins_a_tested_window_only_with_the_opt_in() -> None:
    module = loads(WINDOW.format(width=8))
    forward, back = kernel.refl("fwd", module.diagram("fwd")), kernel.refl("bwd", module.diagram("bwd"))
    with pytest.raises(NapkinError) as err:
        lower(forward, target="jax", backward=[back])
    assert err.value.codes == ("lower.backward_unproved",)
    with pytest.warns(UnprovedJoinWarning, match="fwd: the join of its backward kernels is not proved"):
        lowered = lower(forward, target="jax", backward=[back], allow_tested_join=True)
    assert "tested, not proved" in lowered.source and "WARNING: the join is not proved" in lowered.source
    rng = np.random.default_rng(7)
    sizes = {"q": 12, "x": 12, "d": 4}
    q, k, v, d_o = (rng.standard_normal((12, 4)) for _ in range(4))
    got = jax.grad(lambda *a: jnp.sum(lowered.fn(*a) * d_o), argnums=(0, 1, 2))(  # type: ignore[attr-defined]
        *[jnp.asarray(a, jnp.float32) for a in (q, k, v)])
    fwd = module.diagram("fwd")
    want = evaluate(grad.vjp(replace(fwd, outputs=fwd.outputs[:1], out_types=fwd.out_types[:1])), [q, k, v, d_o],
                    sizes=sizes)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), w, atol=1e-4 * float(np.max(np.abs(w))))


def test_napkin_lower_refuses_a_tested_join_without_allow_tested_join(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    path, out = str(ROOT / "proofs" / "mlp_backward.ncd"), str(tmp_path / "mlp.py")
    command = ["lower", path, "mlp_forward", "--target", "jax",
               "--backward", "mlp_backward_x,mlp_backward_w,mlp_backward_b", "-o", out]
    refused = main(command)
    stderr = capsys.readouterr().err
    assert refused == 1 and not Path(out).exists()
    assert "error: the backward passes of `mlp_forward` are not proved to give its VJP" in stderr
    assert "mlp_backward.ncd:" in stderr and "hint:" in stderr
    assert "--allow-tested-join" in stderr
    allowed = main([*command, "--allow-tested-join"])
    stderr = capsys.readouterr().err
    assert allowed == 0, stderr
    assert "warning: mlp_forward: the join of its backward kernels is not proved" in stderr
    assert "WARNING: the join is not proved" in Path(out).read_text()


def test_a_kernel_of_a_training_step_can_take_its_own_tiles() -> None:
    """The forward and the dQ pass share the tile names gq and sx, not their best sizes (the
    forward's own pick ran 20 % fewer instructions per score on Hopper than the shared 64 x 64):
    ``NAME.TILE`` binds one kernel's tile over the plain name, ``Lowered.tiles`` reports the
    backward kernels' under their names, and a kernel that is not lowered is an error."""
    names = ("flash_attention_forward", "flash_attention_backward_kv", "flash_attention_backward_q")
    fwd, *backs = (proof.theorem(PROOFS, n) for n in names)
    tiles = {"gq": 32, "sx": 16, "gx": 32, "sq": 16, "flash_attention_forward.sx": 64}
    lowered = lower(fwd, target="pallas", tiles=tiles, backward=backs)
    assert lowered.tiles["sx"] == 64 and lowered.tiles["flash_attention_backward_q.sx"] == 16
    forward_code, _, rest = lowered.source.partition("def flash_attention_backward_kv(")
    assert "pl.ds(x_first, 64)" in forward_code and "pl.ds(x_first, 16)" in rest and "pl.ds(x_first, 64)" not in rest
    with pytest.raises(NapkinError, match=r"tile `flash_attention_causal_forward.sx` names no kernel being lowered"):
        lower(fwd, target="pallas", tiles={"flash_attention_causal_forward.sx": 64}, backward=backs)


def test_a_normaliser_nested_in_a_sum_over_its_row_is_not_kept_by_the_outer_position_0() -> None:
    """The red team's nested row: Z[x] = Σ_y m(x, y)·exp(T) with m = (y + 6 >= x) keeps key 0 for rows
    x ≤ 6 only, so at |x| = 8, |y| = 1 row 7 is empty, Z = 0 there and D = Π_x sign(Z) = 0: the forward
    w / D · D and its VJP dw are NaN.  The prover once read the row x of Z, bound by the outer product
    as j_x, as a summed axis set to 0 (``_Semantics.kept``), took D as positive and proved dw = dt; the
    float64 test's sizes (|x| - |y| ≤ 6) never empty a row, so `lower` joined it without the opt-in."""
    text = """
axis x, y
diagram f(T: [x y], w: []) -> [] {
  Z = sum[y](where[x y](y + 6 >= x, exp(T), 0))
  D = prod[x](sign(Z))
  t = w / D * D
  return t
}
diagram b(dt: []) -> [] {
  dw = dt * 1
  return dw
}
"""
    module = loads(text)
    forward, backward = module.diagram("f"), module.diagram("b")
    want = evaluate(grad.vjp(forward), [np.zeros((8, 1)), np.array(1.5), np.array(1.0)])
    assert np.isnan(want[1]) and float(evaluate(backward, [np.array(1.0)])) == 1.0  # the join is wrong there
    with pytest.raises(NapkinError) as err:
        link(forward, [backward])
    assert err.value.codes == ("lower.backward_unproved",)
    assert "not known positive" in err.value.diagnostics[0].message


_SHIFTED_STATISTIC = """
axis q, x
diagram f(S: [q x], V: [x]) -> [q], [q] {
  O = contract[x](softmax[x](S), V)
  L = logsumexp[x](S) - 700
  return O, L
}
diagram b(S: [q x], L: [q], dO: [q]) -> [x] given L = logsumexp[x](S) {
  dV = contract[q](exp(S - L), dO) * exp(-700)
  return dV
}
diagram bs(S: [q x], V: [x], O: [q], dO: [q]) -> [q x] {
  P = softmax[x](S)
  dS = P * (dO * V - dO * O)
  return dS
}
"""


def test_a_backward_relation_the_forwards_statistic_does_not_satisfy_is_not_joined() -> None:
    """The red team's shifted statistic: the forward saves L = logsumexp[x](S) - 700 and the key pass,
    stating L = logsumexp[x](S) (so that --strict bounds exp(S - L) by 1 and proves its stream over
    q), compensates with exp(-700).  Over the reals the passes are the VJP, and the float64 test's
    sizes (up to 706 queries) stay finite; but fed the forward's L, exp(S - L) is e^700 = 1e304 per
    query, so at 20000 queries of one key the pass's sum is inf where the VJP is 20000: the pass
    runs outside the domain its theorem is proved on.  prove_join checks each relation of a pass
    against what the join feeds it; with the statistic saved as stated, the join is proved."""
    module = loads(_SHIFTED_STATISTIC)
    forward, dv, ds = (module.diagram(n) for n in ("f", "b", "bs"))
    q = 20000
    S, V, dO = np.zeros((q, 1)), np.ones(1), np.ones(q)
    L = evaluate(forward, [S, V])[1]
    assert np.isinf(evaluate(dv, [S, L, dO])).all() and evaluate(grad.vjp(forward), [S, V, dO, np.zeros(q)])[1][0] == q
    with pytest.raises(NapkinError) as err:
        link(forward, [dv, ds])
    assert err.value.codes == ("lower.backward_unproved",)
    assert "the relation of `b` giving `L` does not hold" in err.value.diagnostics[0].message
    right = loads(_SHIFTED_STATISTIC.replace(" - 700", "").replace(" * exp(-700)", ""))
    assert link(right.diagram("f"), [right.diagram("b"), right.diagram("bs")]).proved


def test_the_tested_join_also_refuses_a_relation_the_forward_does_not_satisfy() -> None:
    """With --allow-tested-join the shifted statistic is refused by the float64 test: L is 700 below
    the relation's logsumexp."""
    module = loads(_SHIFTED_STATISTIC)
    with pytest.raises(NapkinError) as err:
        link(module.diagram("f"), [module.diagram("b"), module.diagram("bs")], allow_tested=True)
    assert err.value.codes == ("lower.backward_wrong",)
    assert "`b` states `L` by a relation that the value fed to it does not satisfy" in err.value.diagnostics[0].message


def test_a_right_backward_of_a_data_mask_is_lowered_with_the_opt_in() -> None:
    """The masked backward the unmasked one is refused beside: the mask's draws (0s and 1s, a kept
    entry on every row) are ones it passes."""
    forward, backwards = _selected("select(M, S, -inf)")
    joined = link(forward, backwards, allow_tested=True)  # type: ignore[arg-type]
    assert not joined.proved and "`select` is outside the proved fragment" in joined.trust
