"""Every example file parses, round-trips through the printer, and each diagram agrees with
a hand-written numpy reference on random inputs (float64)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from scipy.special import erf, logsumexp

import napkin_cat
from napkin_cat.cli import main
from napkin_cat.proof import check_module

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _softmax(s: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(s - s.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | float = 0.0) -> np.ndarray:
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]) + bias
    return _softmax(s) @ v


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def test_the_examples_exist_and_load() -> None:
    """(Their printer round trip is in test_printer.py.)"""
    files = sorted(EXAMPLES.glob("*.ncd"))
    assert {f.stem for f in files} >= {"matmul", "attention", "mlp", "layernorm", "cross_entropy"}
    for path in files:
        assert napkin_cat.load(path).diagrams, path


def test_matmul(rng: np.random.Generator) -> None:
    d = napkin_cat.load(EXAMPLES / "matmul.ncd").diagram("matmul")
    assert [(p.name, p.axes) for p in d.inputs] == [("A", ("a", "b")), ("B", ("b", "c"))]
    assert d.out_types == (("a", "c"),)
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((4, 5))
    np.testing.assert_allclose(napkin_cat.run(d, a, b), a @ b, rtol=1e-12)


def test_attention_variants(rng: np.random.Generator) -> None:
    m = napkin_cat.load(EXAMPLES / "attention.ncd")
    q, k, v = (rng.standard_normal(s) for s in ((5, 64), (7, 64), (7, 64)))
    np.testing.assert_allclose(napkin_cat.run(m.diagram("attention"), q, k, v), _attention(q, k, v), rtol=1e-10)

    causal = np.where(np.arange(5)[:, None] >= np.arange(7)[None, :], 0.0, -np.inf)
    np.testing.assert_allclose(napkin_cat.run(m.diagram("causal_attention"), q, k, v), _attention(q, k, v, causal),
                               rtol=1e-10)

    qb, kb, vb = (rng.standard_normal(s) for s in ((2, 3, 5, 64), (2, 3, 7, 64), (2, 3, 7, 64)))
    np.testing.assert_allclose(napkin_cat.run(m.diagram("mha"), qb, kb, vb), _attention(qb, kb, vb), rtol=1e-10)

    # GQA: query heads [b h g], K/V heads [b h], each K/V head shared by its g query heads
    qg = rng.standard_normal((2, 3, 4, 5, 64))
    expected = _attention(qg, kb[:, :, None], vb[:, :, None])
    np.testing.assert_allclose(napkin_cat.run(m.diagram("gqa"), qg, kb, vb), expected, rtol=1e-10)


def test_alibi_attention(rng: np.random.Generator) -> None:
    m = napkin_cat.load(EXAMPLES / "attention.ncd")
    qb, kb, vb = (rng.standard_normal(s) for s in ((2, 3, 5, 64), (2, 3, 5, 64), (2, 3, 5, 64)))
    slopes = np.array([0.5, 0.25, 0.125])
    distance = np.arange(5)[:, None] - np.arange(5)[None, :]
    bias = np.where(distance >= 0, -slopes[:, None, None] * distance, -np.inf)
    expected = _attention(qb, kb, vb, bias)
    np.testing.assert_allclose(napkin_cat.run(m.diagram("alibi_mha"), qb, kb, vb, slopes), expected, rtol=1e-10)


def test_mlp(rng: np.random.Generator) -> None:
    m = napkin_cat.load(EXAMPLES / "mlp.ncd")
    x, w1, b1, w2, b2 = (rng.standard_normal(s) for s in ((6, 4), (4, 9), (9,), (9, 4), (4,)))
    expected = _gelu(x @ w1 + b1) @ w2 + b2
    np.testing.assert_allclose(napkin_cat.run(m.diagram("mlp"), x, w1, b1, w2, b2), expected, rtol=1e-10)
    np.testing.assert_allclose(napkin_cat.run(m.diagram("linear"), x, w1, b1), x @ w1 + b1, rtol=1e-12)


def test_layernorm_and_rmsnorm(rng: np.random.Generator) -> None:
    m = napkin_cat.load(EXAMPLES / "layernorm.ncd")
    x, g, b = rng.standard_normal((6, 8)), rng.standard_normal(8), rng.standard_normal(8)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(napkin_cat.run(m.diagram("layernorm"), x, g, b), (x - mu) / np.sqrt(var + 1e-5) * g + b,
                               rtol=1e-10)
    ms = (x**2).mean(-1, keepdims=True)
    np.testing.assert_allclose(napkin_cat.run(m.diagram("rms_norm"), x, g), x / np.sqrt(ms + 1e-6) * g, rtol=1e-10)
    np.testing.assert_allclose(napkin_cat.run(m.diagram("rms_norm_exact"), x, g), x / np.sqrt(ms) * g, rtol=1e-10)


def test_cross_entropy_one_hot_and_index(rng: np.random.Generator) -> None:
    m = napkin_cat.load(EXAMPLES / "cross_entropy.ncd")
    z = rng.standard_normal((6, 11)) * 30  # large logits: the log-sum-exp must stay finite
    labels = rng.integers(0, 11, size=6)
    expected = logsumexp(z, -1) - z[np.arange(6), labels]
    one_hot = np.eye(11)[labels]
    np.testing.assert_allclose(napkin_cat.run(m.diagram("cross_entropy"), z, one_hot), expected, rtol=1e-10)
    np.testing.assert_allclose(napkin_cat.run(m.diagram("cross_entropy_index"), z, labels.astype(float)), expected,
                               rtol=1e-10)
    np.testing.assert_allclose(napkin_cat.run(m.diagram("mean_cross_entropy"), z, labels.astype(float)),
                               expected.mean(),
                               rtol=1e-10)
    h, w = rng.standard_normal((6, 4)), rng.standard_normal((4, 11)) * 5
    logits = h @ w
    np.testing.assert_allclose(napkin_cat.run(m.diagram("linear_cross_entropy"), h, w, labels.astype(float)),
                               logsumexp(logits, -1) - logits[np.arange(6), labels], rtol=1e-10)


def test_readme_ncd_blocks_elaborate_and_its_eval_line_is_current(capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLES.parent)  # the README's commands run from the repository root
    readme = (EXAMPLES.parent / "README.md").read_text()
    blocks = re.findall(r"```ncd\n(.*?)```", readme, flags=re.S)
    assert blocks, "README.md has no ncd code block"
    for block in blocks:  # a block is read as if it were a file in proofs/ (its `use` paths say so)
        module = napkin_cat.loads(block, str(EXAMPLES.parent / "proofs" / "README.ncd"))
        assert module.diagrams or module.theorems
        assert all(result.ok for result in check_module(module))
    command, expected = re.search(r"\.venv/bin/napkin (eval [^\n]+)\n# (output [^\n]+)", readme).groups()  # type: ignore[union-attr]
    assert main(command.split()) == 0
    assert capsys.readouterr().out.strip() == expected
