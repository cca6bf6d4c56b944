"""``engine``: a test that asks for it runs on the reference pass and on the incremental
core (the policy tables, and the decision tests of queue order and fit)."""

from __future__ import annotations

import pytest

from .policy.engines import ENGINES


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name
