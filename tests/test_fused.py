"""The front door (``napkin_cat.fuse``, ``napkin_cat.attention``): a proved kernel as a
jax-callable that follows its inputs' dtype, works under jit/grad/vmap on both targets, and is
cached on disk by the content of everything it depends on."""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import napkin_cat
from napkin_cat import fused, proof
from napkin_cat.diagnostics import NapkinError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh cache folder and an empty in-process memo for every test."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("NAPKIN_CACHE_DIR", str(folder))
    monkeypatch.setattr(fused, "_memo", {})
    return folder


def _qkv(q: int = 40, x: int = 33, d: int = 64, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, d)).astype(np.float32) for n in (q, x, x)]


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scores=lambda s: s, mask=None) -> np.ndarray:
    s = scores(q.astype(np.float64) @ k.T.astype(np.float64) / np.sqrt(q.shape[1]))
    if mask is not None:
        s = np.where(mask(np.arange(q.shape[0])[:, None], np.arange(k.shape[0])[None, :]), s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v.astype(np.float64)


def test_follows_the_inputs_dtype() -> None:
    fa = napkin_cat.fuse(ROOT / "proofs/flash_attention.ncd", "flash_attention", target="jax")
    q, k, v = _qkv()
    want = _attention(q, k, v)
    out = fa(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
    assert out.dtype == jnp.float32 and np.abs(np.asarray(out) - want).max() < 1e-5  # not rounded to bf16
    half = fa(*(jnp.asarray(a, jnp.bfloat16) for a in (q, k, v)))
    assert half.dtype == jnp.bfloat16 and np.abs(np.asarray(half, np.float64) - want).max() < 5e-2
    assert "float32" in fa.source("float32") and "bfloat16" in fa.source("bfloat16")
    wide = fa(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))  # jax without x64: float32
    assert wide.dtype == jnp.float32
    with pytest.raises(TypeError, match="real floating-point"):
        fa(np.ones((4, 64), np.int32), k, v)


@pytest.mark.parametrize("target", ["jax", "pallas"])
def test_jit_grad_and_vmap(target: str) -> None:
    fa = napkin_cat.fuse(ROOT / "proofs/flash_attention.ncd", "flash_attention", target=target,
                         tiles={"gq": 16, "sx": 16})
    q, k, v = _qkv(q=20, x=24)
    assert np.abs(np.asarray(jax.jit(fa)(q, k, v)) - _attention(q, k, v)).max() < 1e-5
    grad = jax.grad(lambda a: jnp.sum(fa(a, k, v) ** 2))(jnp.asarray(q))
    eps, i, j = 1e-3, 3, 5
    bumped = [q.astype(np.float64).copy() for _ in range(2)]
    bumped[0][i, j] += eps
    bumped[1][i, j] -= eps
    central = (np.sum(_attention(bumped[0], k, v) ** 2) - np.sum(_attention(bumped[1], k, v) ** 2)) / (2 * eps)
    assert abs(float(grad[i, j]) - central) < 1e-3 * max(1.0, abs(central))
    batched = jax.vmap(fa)(*(np.stack([a, a[::-1]]) for a in (q, k, v)))
    assert np.abs(np.asarray(batched[1]) - _attention(q[::-1], k[::-1], v[::-1])).max() < 1e-5


def test_a_second_process_reads_the_kernel_from_disk(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first call proves, certifies and lowers; with the in-process memo emptied (as in a
    new process), the same kernel comes from the cache folder without proving anything."""
    q, k, v = _qkv()
    first = napkin_cat.fuse(ROOT / "proofs/flash_attention.ncd", "flash_attention", target="jax")(q, k, v)
    assert len(list(cache.glob("kernel-*.json"))) == 1
    monkeypatch.setattr(fused, "_memo", {})

    def refuse(*_args: object) -> None:
        raise AssertionError("proved again despite the cache")

    monkeypatch.setattr(proof, "prove", refuse)
    again = napkin_cat.fuse(ROOT / "proofs/flash_attention.ncd", "flash_attention", target="jax")(q, k, v)
    assert np.array_equal(np.asarray(first), np.asarray(again))


def test_a_changed_used_file_is_a_new_key(tmp_path: Path, cache: Path) -> None:
    """The key covers the files the theorem's file uses: editing examples/attention.ncd (the
    scale of the scores) builds a new kernel, which computes the edited diagram."""
    (tmp_path / "examples").mkdir()
    (tmp_path / "proofs").mkdir()
    shutil.copy(ROOT / "examples/attention.ncd", tmp_path / "examples/attention.ncd")
    shutil.copy(ROOT / "proofs/flash_attention.ncd", tmp_path / "proofs/flash_attention.ncd")
    q, k, v = _qkv()
    before = napkin_cat.fuse(tmp_path / "proofs/flash_attention.ncd", "flash_attention", target="jax")(q, k, v)
    used = tmp_path / "examples/attention.ncd"
    text = used.read_text()
    assert text.count("* rsqrt(d)") >= 1
    used.write_text(text.replace("* rsqrt(d)", "* rsqrt(d) * 2", 1))
    after = napkin_cat.fuse(tmp_path / "proofs/flash_attention.ncd", "flash_attention", target="jax")(q, k, v)
    assert len(list(cache.glob("kernel-*.json"))) == 2
    assert np.abs(np.asarray(before) - _attention(q, k, v)).max() < 1e-5
    assert np.abs(np.asarray(after) - _attention(q, k, v, scores=lambda s: 2 * s)).max() < 1e-5


def test_strict_by_default(tmp_path: Path) -> None:
    """A theorem resting on a measured dtype claim is refused unless strict=False."""
    path = tmp_path / "bf16.ncd"
    path.write_text(f'use "{ROOT / "examples/attention.ncd"}"\n'
                    "theorem flash_bf16: attention {\n  rewrite softmax_contract at P, O\n  group q by gq\n"
                    "  stream x by sx via online_softmax\n  dtype K, V as bf16 tol 0.05\n}\n")
    q, k, v = _qkv()
    with pytest.raises(NapkinError, match=r"only tested.*strict=False"):
        napkin_cat.fuse(path, "flash_bf16", target="jax")(q, k, v)
    out = napkin_cat.fuse(path, "flash_bf16", target="jax", strict=False)(q, k, v)
    assert np.abs(np.asarray(out) - _attention(q, k, v)).max() < 5e-2
    with pytest.raises(NapkinError, match="unknown theorem `nope`"):
        napkin_cat.fuse(path, "nope", target="jax")(q, k, v)


def test_attention_with_score_and_mask_mods() -> None:
    q, k, v = _qkv(q=37, x=37)
    softcap = napkin_cat.attention("30 * tanh(S / 30)", "q >= x")
    want = _attention(q, k, v, scores=lambda s: 30 * np.tanh(s / 30), mask=lambda i, j: i >= j)
    assert np.abs(np.asarray(jax.jit(softcap)(q, k, v)) - want).max() < 1e-5
    alibi = napkin_cat.attention("S - 0.5 * abs(index[q x](q - x))", head_dim=64)
    rows, cols = np.arange(37)[:, None], np.arange(37)[None, :]
    assert np.abs(np.asarray(alibi(q, k, v)) - _attention(q, k, v, scores=lambda s: s - 0.5 * np.abs(rows - cols))
                  ).max() < 1e-5


def test_attention_refuses_what_is_not_one_expression() -> None:
    with pytest.raises(ValueError, match=r"one \.ncd expression"):
        napkin_cat.attention("S }\ndiagram evil() -> [] {")
    with pytest.raises(NapkinError, match="unknown name `T`"):
        napkin_cat.attention("T * 2")(*_qkv())


def _readme_blocks() -> list[str]:
    """The ```python blocks of README's "From JAX" section, in order."""
    import re

    section = (ROOT / "README.md").read_text(encoding="utf-8").split("## From JAX", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_readme_block_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """README's first "From JAX" block runs as written, and computes what it says."""
    monkeypatch.chdir(ROOT)
    code, _ = _readme_blocks()
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    q, out, dq = (np.asarray(namespace[n], np.float64) for n in ("q", "out", "dq"))  # type: ignore[arg-type]
    assert out.shape == (4, 256, 64) and dq.shape == q.shape and np.isfinite(dq).all()
    want = _attention(q[1], q[1], q[1], scores=lambda s: 30 * np.tanh(s / 30), mask=lambda i, j: i >= j)
    assert np.abs(out[1] - want).max() < 1e-4


@pytest.mark.slow  # derives, proves and lowers three kernels (minutes on 2 cores)
def test_readme_training_block_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """README's training step with the derived backward: its gradients are jax.grad's of the same attention."""
    monkeypatch.chdir(ROOT)
    _, trained = _readme_blocks()
    namespace: dict[str, object] = {}
    exec(compile(trained, "README.md", "exec"), namespace)
    inputs = jax.random.normal(jax.random.key(0), (3, 2, 128, 64))

    def reference(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        s = 30 * jnp.tanh(q @ k.T / 8 / 30)
        return jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((128, 128), bool)), s, -jnp.inf), axis=-1) @ v

    want_grads = jax.grad(lambda q, k, v: jnp.sum(jax.vmap(reference)(q, k, v) ** 2), argnums=(0, 1, 2))(*inputs)
    for got, wanted in zip(namespace["grads"], want_grads, strict=True):  # type: ignore[call-overload]
        np.testing.assert_allclose(np.asarray(got), np.asarray(wanted), atol=1e-3, rtol=1e-3)
