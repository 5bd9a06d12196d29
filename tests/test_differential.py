"""Differential testing of the whole pipeline (issue 18): random modules with masks on any
operand, random schedules the kernel accepts, lowered to both targets (Pallas in interpret
mode) and compared with the float64 evaluator at ragged sizes (``tests/differential.py``
says how a case is built and judged).  CI runs the hypothesis profile's count;
``benchmarks/differential.py`` runs it for a recorded time (BENCHMARKS.md)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from napkin_cat.terms import Module
from tests.differential import MODULES, run_case

pytestmark = pytest.mark.slow  # lowers random schedules on both targets (CI runs them)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(module=MODULES, data=st.data())
def test_accepted_schedules_lower_to_their_meaning(module: Module, data: st.DataObject) -> None:
    outcome = run_case(module, data)
    assume(outcome is not None)
