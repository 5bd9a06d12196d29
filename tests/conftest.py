"""Shared pytest set-up: hypothesis profiles.

``ci`` (the default) has no deadline, since the first call of a test pays for parsing the
grammar, and a modest number of examples so the whole suite stays fast on two cores.
``dev`` runs many more examples: ``pytest --hypothesis-profile=dev``.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", deadline=None, max_examples=40, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.register_profile("dev", deadline=None, max_examples=500, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")
