"""Hypothesis profiles of the fuzz suite: ``default`` (a few hundred examples per dialect,
the normal test run) and ``soak`` (thousands: ``tox -e fuzz`` sets
``AGENTCOMPACT_FUZZ_PROFILE=soak``)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, database=None, derandomize=False,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.filter_too_much])
settings.register_profile("default", max_examples=int(os.environ.get(
    "AGENTCOMPACT_FUZZ_EXAMPLES", "300")), **_COMMON)  # type: ignore[arg-type]
settings.register_profile("soak", max_examples=int(os.environ.get(
    "AGENTCOMPACT_FUZZ_EXAMPLES", "3000")), **_COMMON)  # type: ignore[arg-type]
PROFILE = os.environ.get("AGENTCOMPACT_FUZZ_PROFILE", "default")
