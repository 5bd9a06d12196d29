"""The built wheel ships the grammar, the examples, the proofs and the licence; the installed
(not editable) package loads them and runs as ``python -m napkin_cat``; its jax requirement
admits every 0.11.x, so it installs beside another project's jax 0.11 release.

The wheel is built from this checkout, installed with ``pip --target`` into a temporary
folder, and imported in a fresh interpreter whose ``PYTHONPATH`` puts that folder first
(the dependencies come from the running environment) and whose working directory is
outside the checkout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import napkin_cat

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow  # builds and installs a wheel
def test_the_installed_wheel_loads_its_grammar(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(ROOT)],
                   check=True, capture_output=True, text=True)
    (wheel,) = dist.glob("napkin_cat-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "napkin_cat/grammar/ncd.lark" in names
    packaged = {"napkin_cat/elaborate/__init__.py", "napkin_cat/certify/lemmas.ncd",
                "napkin_cat/cost/hardware/h200.toml"}
    assert packaged <= set(names)
    assert not any(n.startswith("tests/") for n in names)
    assert {f"napkin_cat/examples/{p.name}" for p in (ROOT / "examples").glob("*.ncd")} <= set(names)
    assert {f"napkin_cat/proofs/{p.name}" for p in (ROOT / "proofs").glob("*.ncd")} <= set(names)
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target),
                    str(wheel)], check=True, capture_output=True, text=True)
    probe = textwrap.dedent(f"""
        import json, sys
        from importlib import resources
        import numpy as np
        import napkin_cat
        from napkin_cat.syntax import grammar_text
        packaged = resources.files("napkin_cat").joinpath("grammar/ncd.lark")
        module = napkin_cat.load({str(ROOT / "examples" / "matmul.ncd")!r})
        out = napkin_cat.run(module.diagram("matmul"), np.eye(2), np.ones((2, 3)))
        print(json.dumps({{"file": napkin_cat.__file__, "packaged": packaged.is_file(),
                          "same": grammar_text() == packaged.read_text(), "sum": float(out.sum())}}))
    """)
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, check=True, capture_output=True,
                            text=True)
    report = json.loads(result.stdout)
    assert Path(report["file"]).resolve().is_relative_to(target.resolve())
    assert report["packaged"] and report["same"]
    assert report["sum"] == 6.0

    # the shipped proofs check from the installed package (their `use "../examples/..."` resolve)
    proofs = target / "napkin_cat" / "proofs"
    ran = subprocess.run([sys.executable, "-m", "napkin_cat", "check", "-q", str(proofs / "matmul.ncd")], cwd=tmp_path,
                         env=env, capture_output=True, text=True)
    assert ran.returncode == 0 and "theorems checked" in ran.stdout, ran.stderr
    version = subprocess.run([sys.executable, "-m", "napkin_cat", "--version"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"napkin {napkin_cat.__version__}"


def _fake_distribution(site: Path, name: str, version: str) -> None:
    """A bare installed distribution record (what pip leaves in site-packages), no code."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


@pytest.mark.slow  # builds and installs a wheel
def test_the_wheel_installs_beside_another_jax_011(tmp_path: Path) -> None:
    """Offline: the wheel's jax/jaxlib requirements admit a site whose jax is 0.11.0 (another
    project's pin), and every 0.11.x, and no other minor release; CI itself installs 0.11.2."""
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(ROOT)],
                   check=True, capture_output=True, text=True)
    (wheel,) = dist.glob("napkin_cat-*.whl")
    site = tmp_path / "site"
    for name in ("jax", "jaxlib"):
        _fake_distribution(site, name, "0.11.0")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, text=True)
    from importlib import metadata

    (napkin,) = [d for d in metadata.distributions(path=[str(site)]) if d.metadata["Name"] == "napkin-cat"]
    installed = {d.metadata["Name"]: d.version for d in metadata.distributions(path=[str(site)])}
    pins = {r.name: r for r in map(Requirement, napkin.requires or []) if r.name in ("jax", "jaxlib")}
    assert set(pins) == {"jax", "jaxlib"}
    for name, requirement in pins.items():
        assert requirement.specifier.contains(installed[name]), (requirement, installed[name])
        assert all(requirement.specifier.contains(v) for v in ("0.11.2", "0.11.9"))
        assert not any(requirement.specifier.contains(v) for v in ("0.10.9", "0.12.0"))
    constraints = (ROOT / ".ci" / "constraints.txt").read_text()
    assert "jax==0.11.2" in constraints and "jaxlib==0.11.2" in constraints
    assert "-c .ci/constraints.txt" in (ROOT / ".ci" / "setup").read_text()
