"""Durations and fractions for people: ``12m 30s``, ``3.2 days``, ``45.0%``."""

from __future__ import annotations

__all__ = ["human_duration", "human_percent"]


def human_duration(seconds: float | None) -> str:
    """``None`` -> ``-``; ``0.25`` -> ``250 ms``; ``750`` -> ``12m 30s``; ``3.2 days``."""
    if seconds is None:
        return "-"
    if seconds == 0:
        return "0s"
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 1:
        return f"{sign}{s * 1000:.0f} ms"
    if s < 60:
        return f"{sign}{s:.1f}s" if s < 10 else f"{sign}{s:.0f}s"
    if s < 3600:
        m, rest = divmod(round(s), 60)
        return f"{sign}{m}m {rest}s" if rest else f"{sign}{m}m"
    if s < 86400:
        h, rest = divmod(round(s / 60), 60)
        return f"{sign}{h}h {rest}m" if rest else f"{sign}{h}h"
    return f"{sign}{s / 86400:.1f} days"


def human_percent(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"
