"""How every read command prints: ``-o table|wide|json|yaml`` (``--json`` kept as an
alias), kubectl-like tables of plain columns, ``describe`` blocks of ``Key: value`` lines,
and quantities in Kubernetes units.

Tables are plain aligned columns, not boxes: they fit 80 columns with the default set of
columns (``wide`` adds the rest), never fold a word, and stay greppable.
"""

from __future__ import annotations

import functools
import json
import math
import re
import textwrap
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar, cast

import click
import yaml

from ._specs import format_cpu, format_memory

__all__ = [
    "OUTPUTS",
    "Block",
    "age",
    "duration",
    "emit_structured",
    "fmt_cpu",
    "fmt_gpu",
    "fmt_memory",
    "human_details",
    "output_option",
    "render_table",
    "show",
    "wall_times",
]

F = TypeVar("F", bound=Callable[..., Any])

#: The formats of every read command.
OUTPUTS = ("table", "wide", "json", "yaml")

#: Between two columns, as kubectl does.
_GAP = "   "


def output_option(f: F) -> F:
    """``-o/--output table|wide|json|yaml`` and ``--json`` (the same as ``-o json``; kept
    for the scripts written against the commands that had only ``--json``). The command
    receives ``output`` alone."""

    @functools.wraps(f)
    def wrapper(*args: Any, output: str, as_json: bool, **kwargs: Any) -> Any:
        if as_json:
            if output not in ("table", "json"):
                raise click.BadParameter(f"--json and -o {output} contradict each other")
            output = "json"
        return f(*args, output=output, **kwargs)

    wrapped = click.option(
        "--json", "as_json", is_flag=True, help="Print JSON (the same as -o json)."
    )(wrapper)
    wrapped = click.option(
        "-o",
        "--output",
        type=click.Choice(OUTPUTS),
        default="table",
        show_default=True,
        help="Output format: table (fits 80 columns), wide (every column), json or yaml.",
    )(wrapped)
    return cast(F, wrapped)


def emit_structured(data: Any, output: str) -> bool:
    """Print ``data`` as JSON or YAML when asked; False means the caller prints a table."""
    if output == "json":
        click.echo(json.dumps(data, indent=2, default=str))
    elif output == "yaml":
        click.echo(yaml.safe_dump(_plain(data), sort_keys=False, allow_unicode=True), nl=False)
    else:
        return False
    return True


def _plain(data: Any) -> Any:
    # YAML's safe dumper knows only plain types; tuples and the like become lists.
    if isinstance(data, Mapping):
        return {str(k): _plain(v) for k, v in data.items()}
    if isinstance(data, list | tuple | set | frozenset):
        return [_plain(v) for v in data]
    if isinstance(data, str):
        return str(data)  # a StrEnum (a reason) as its plain value
    if data is None or isinstance(data, bool | int | float):
        return data
    return str(data)


def render_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Plain columns under upper-case headers, left-aligned, three spaces apart (kubectl's
    layout). Cells are shown whole: names are what people grep for."""
    head = [h.upper() for h in headers]
    body = [[show(c) for c in r] for r in rows]
    widths = [len(h) for h in head]
    for r in body:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    lines = []
    for r in [head, *body]:
        cells = [c.ljust(widths[i]) for i, c in enumerate(r)]
        lines.append(_GAP.join(cells).rstrip())
    return "\n".join(lines)


class Block:
    """A ``describe`` view: ``Key: value`` lines, sections indented by two, and tables
    inside a section. Values of consecutive fields at one indent line up (kubectl
    describe's layout)."""

    def __init__(self) -> None:
        # (kind, indent, key or text, value): kind is "field", "section" or "raw".
        self._items: list[tuple[str, int, str, str]] = []

    def field(self, key: str, value: Any, indent: int = 0) -> None:
        self._items.append(("field", indent, key, show(value)))

    def section(self, key: str, indent: int = 0) -> None:
        self._items.append(("section", indent, key, ""))

    def lines(self, text: str, indent: int = 2) -> None:
        for line in text.splitlines():
            self._items.append(("raw", indent, line, ""))

    def table(self, headers: Sequence[str], rows: Iterable[Sequence[Any]], indent: int = 2) -> None:
        self.lines(render_table(headers, rows), indent)

    def render(self) -> str:
        out: list[str] = []
        run: list[tuple[int, str, str]] = []

        def flush() -> None:
            if run:
                width = max(len(k) for _, k, _ in run) + 2
                for i, k, v in run:
                    label = k + ":" if k else ""  # an empty key continues the field above
                    out.extend(_wrapped(" " * i + f"{label:<{width}}", v))
                run.clear()

        for kind, indent, key, value in self._items:
            if kind == "field":
                if run and run[0][0] != indent:
                    flush()
                run.append((indent, key, value))
                continue
            flush()
            out.append(" " * indent + key + (":" if kind == "section" else ""))
        flush()
        return "\n".join(out)


#: Describe views wrap long values here (tables are left whole: see ``render_table``).
WIDTH = 80


def _wrapped(lead: str, value: str) -> list[str]:
    """``lead + value``, the value wrapped under itself when the line would pass WIDTH."""
    room = WIDTH - len(lead)
    if len(lead) + len(value) <= WIDTH or room < 20:
        return [(lead + value).rstrip()]
    # Long words (URLs, ids) stay whole: a link cut in two cannot be clicked.
    parts = textwrap.wrap(value, room, break_on_hyphens=False, break_long_words=False) or [""]
    return [(lead + parts[0]).rstrip()] + [" " * len(lead) + p for p in parts[1:]]


def show(value: Any) -> str:
    """A cell: None is "-", a list is comma-joined, the rest as text."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        return ", ".join(show(v) for v in value) or "-"
    return str(value)


def limit(value: int | None) -> str:
    """A limit knob: None is unlimited."""
    return "unlimited" if value is None else str(value)


def fmt_cpu(millicores: int | None) -> str:
    """Millicores in Kubernetes units: ``2000`` -> ``2``, ``500`` -> ``500m``."""
    return "-" if millicores is None else str(format_cpu(int(millicores)))


def fmt_memory(n: int | None) -> str:
    """Bytes in the largest binary unit that shows them exactly (``64Gi``), else the
    nearest tenth of one (``1.5Gi``) rather than a raw byte count."""
    if n is None:
        return "-"
    exact = format_memory(int(n))
    if isinstance(exact, str) or n < 1024:
        return str(exact)
    for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n >= size:
            return f"{n / size:.1f}{suffix}"
    return str(n)


def fmt_gpu(count: int | None, gpu_type: str | None = None) -> str:
    """GPUs as the file notation writes them: ``8`` or ``H100:8``; none is "-"."""
    if not count:
        return "-" if not gpu_type else f"{gpu_type}:0"
    return f"{gpu_type}:{count}" if gpu_type else str(count)


def duration(seconds: float | None) -> str:
    """A span like kubectl's AGE column: ``45s``, ``3m12s``, ``2h05m``, ``3d4h``."""
    if seconds is None or math.isnan(seconds):
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h}h"


def age(since: float | None, now: float | None = None) -> str:
    """How long ago the unix time ``since`` was (display only; no decision reads it)."""
    if since is None or since <= 0:
        return "-"
    return duration((time.time() if now is None else now) - since)


def iso(ts: float | None) -> str:
    """A unix time as UTC ISO-8601 to the second, or "-"."""
    if ts is None or ts <= 0:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


_AT_T = re.compile(r"\bat t=(\d{9,})\b")


def wall_times(text: str, now: float | None = None) -> str:
    """A scheduler's ``at t=<unix time>`` (from ``headway.scheduler.insight``) as a wall
    clock time and how far away it is: ``at 10:42:07Z (in 13m26s)``."""
    wall = time.time() if now is None else now

    def one(m: re.Match[str]) -> str:
        t = float(m.group(1))
        return f"at {time.strftime('%H:%M:%SZ', time.gmtime(t))} (in {duration(t - wall)})"

    return _AT_T.sub(one, text)


#: Keys of a reason's details that hold bytes, and the one that holds millicores.
_BYTES = ("memory", "ephemeral_storage", "eph")


def human_details(value: Any) -> Any:
    """A reason's details with quantities in Kubernetes units (``64Gi``, ``500m``) instead
    of bytes and millicores, and times as UTC ISO-8601, for text output (json and yaml
    keep the numbers)."""
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if k == "cpu_m" and isinstance(v, int | float) and not isinstance(v, bool):
                out["cpu"] = fmt_cpu(int(v))
            elif k in _BYTES and isinstance(v, int) and not isinstance(v, bool):
                out[k] = fmt_memory(v)
            elif k == "fits_at" and isinstance(v, int | float) and not isinstance(v, bool):
                out[k] = iso(v)  # a unix time (insight's fit forecast): a wall clock time
            else:
                out[k] = human_details(v)
        return out
    if isinstance(value, list | tuple):
        return [human_details(v) for v in value]
    return value


def runtime_option(f: F) -> F:
    """``--default-runtime``: what the forecasts assume for work with no estimate."""
    return click.option(
        "--default-runtime",
        type=click.FloatRange(min=0.0),
        default=3600.0,
        show_default=True,
        help="Seconds assumed for work that declares no estimate and has no history.",
    )(f)
