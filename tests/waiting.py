"""Waiting for a live system to reach a state, for tests that drive it from outside
(``from waiting import eventually``: ``tests/`` is on the path of every test)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(
    probe: Callable[[], T | None],
    what: str,
    timeout_s: float = 60.0,
    *,
    every_s: float = 0.3,
    show: Callable[[], object] | None = None,
) -> T:
    """``probe()``'s first answer that is not None, polling every
    ``every_s``; fails naming ``what`` (and what ``show`` says then) after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = probe()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            said = f": {show()}" if show is not None else ""
            raise AssertionError(f"timed out waiting for {what}{said}")
        time.sleep(every_s)
