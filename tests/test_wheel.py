"""The built wheel ships the grammar, and the installed (not editable) package loads it.

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

ROOT = Path(__file__).resolve().parent.parent


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
