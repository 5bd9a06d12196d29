"""Shared pytest set-up: hypothesis profiles.

``ci`` (the default) has no deadline, since the first call of a test pays for parsing the
grammar, a modest number of examples so the whole suite stays fast on two cores, and a
fixed seed per test (``derandomize``) so that a commit passes or fails the same way on
every machine.  ``dev`` explores: many more examples from a fresh random seed each run
(``pytest --hypothesis-profile=dev``); a failure it finds is pinned with ``@example``.

napkin's cache folder (``napkin_cat.cache``: kernels, certificates, replayed verb outcomes)
is a fresh temporary one for every test, inherited by the processes it starts: no test writes
into the user's home, and no test reads what an older run or another test stored (a test that
breaks a verb on purpose must see it run, not a replay of another test's success).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings

#: for what runs outside a test (collection); each test gets its own below
os.environ["NAPKIN_CACHE_DIR"] = _CACHE = tempfile.mkdtemp(prefix="napkin-test-cache-")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def _own_cache_folder(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NAPKIN_CACHE_DIR", str(tmp_path_factory.mktemp("napkin-cache")))

settings.register_profile(
    "ci", deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow], print_blob=True,
    derandomize=True,
)
settings.register_profile("dev", deadline=None, max_examples=500, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")
