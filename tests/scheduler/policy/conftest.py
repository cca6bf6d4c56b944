"""``engine``: each policy test runs on the reference pass and on the incremental core."""

from __future__ import annotations

import pytest

from .engines import ENGINES


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name
