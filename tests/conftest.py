"""Shared pytest set-up: hypothesis profiles.

``ci`` (the default) has no deadline, since the first call of a test pays for parsing the
grammar, a modest number of examples so the whole suite stays fast on two cores, and a
fixed seed per test (``derandomize``) so that a commit passes or fails the same way on
every machine.  ``dev`` explores: many more examples from a fresh random seed each run
(``pytest --hypothesis-profile=dev``); a failure it finds is pinned with ``@example``.

napkin's cache folder (``napkin_cat.cache``: kernels, certificates, replayed verb outcomes)
is a fresh temporary one for every test, inherited by the processes it starts: no test writes
into the user's home, and no test reads what an older run or another test stored (a test that
breaks a verb on purpose must see it run, not a replay of another test's success).  One kind
is shared instead: ``sympy.simplify``'s results (``program.simplified``, a pure function of its
key: the expression's ``srepr``, sympy's version and napkin's source) go to one folder per run,
which the xdist workers share, so that a cost one worker or test derived symbolically (seconds to
minutes for a masked schedule's chunk counts) is read back by the other rather than derived again.
A test that picks its own cache folder (or none) keeps it for those too (tests/test_cache.py).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from napkin_cat import cache
from napkin_cat.schedule import program

#: for what runs outside a test (collection); each test gets its own below
os.environ["NAPKIN_CACHE_DIR"] = _CACHE = tempfile.mkdtemp(prefix="napkin-test-cache-")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

#: the simplified expressions' folder of this run: made by the first process (xdist's controller,
#: whose environment its workers inherit), removed when that process exits
_SHARED_VARIABLE = "NAPKIN_TEST_SIMPLIFIED_DIR"
if not os.environ.get(_SHARED_VARIABLE):
    os.environ[_SHARED_VARIABLE] = tempfile.mkdtemp(prefix="napkin-test-simplified-")
    atexit.register(shutil.rmtree, os.environ[_SHARED_VARIABLE], ignore_errors=True)
_SHARED = Path(os.environ[_SHARED_VARIABLE])


@pytest.fixture(autouse=True)
def _own_cache_folder(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    own = tmp_path_factory.mktemp("napkin-cache")
    monkeypatch.setenv("NAPKIN_CACHE_DIR", str(own))

    def simplified_folder() -> Path | None:
        chosen = cache.cache_folder()
        return _SHARED if chosen == own else chosen  # a folder the test chose itself is its own

    monkeypatch.setattr(program, "cache_folder", simplified_folder)

settings.register_profile(
    "ci", deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow], print_blob=True,
    derandomize=True,
)
settings.register_profile("dev", deadline=None, max_examples=500, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")
