"""Planted bugs: does the differential test against the reference catch them?

Each mutation rewrites one method of the index layer (the caches and indices of
``scheduler/index/``, the policy's remembered answers, and the grouped node index of ``scheduler/fit.py``) at source level,
one at a time: a remembered answer kept when it should not be, a cache not invalidated,
a flag not cleared. Then the differential drivers of ``test_reference_differential`` run
against it, cheapest first, until one fails (caught: the core decided otherwise than the
reference, or crashed) or all have passed (missed). Every mutation must be caught. First,
every driver runs once with nothing planted: a driver that fails then would make every
"caught" meaningless.

Run it as a script (it prints a table, and exits non-zero if any bug was missed)::

    .venv/bin/python -m tests.scheduler.planted_bugs [MUTATION ...]

It takes about three minutes on a slow 2-core machine, so it is not part of the test
suite. A mutation whose snippet is no longer in the code fails loudly: the code moved,
update the mutation.
"""

from __future__ import annotations
import __future__

import inspect
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from headway.scheduler import cycle
from headway.scheduler.core import Scheduler
from headway.scheduler.fit import ClusterState
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from .test_reference_differential import (
    HOLDING_WALK,
    SEEDED,
    STORIES,
    Differential,
    Mismatch,
    walk,
)


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str  # the bug, in words
    owner: type | ModuleType  # the class whose method is rewritten, or a module's function
    method: str
    old: str  # a snippet of its source, found exactly once
    new: str


MUTATIONS = [
    Mutation(
        "releases-ignore-clock",
        "_releases returns its cached list whatever the clock (releases are times past now)",
        Scheduler,
        "_releases",
        "and hit[3] == now",
        "",
    ),
    Mutation(
        "freed-no-ended-by-then",
        "_freed keeps a projection though completions' work was due after the fit it found",
        Scheduler,
        "_freed",
        "if res is None or fc[2] > res[0]:",
        "if res is None:",
    ),
    Mutation(
        "carried-no-end-check",
        "_carried keeps a projection though an admission ends after the fit it found",
        Scheduler,
        "_carried",
        "if res is not None and ch[2] > res[0]:",
        "if False:",
    ),
    Mutation(
        "holds-not-cleared",
        "a pass starts with the last pass's holds (HeldForGang never cleared)",
        cycle,
        "_begin_pass",
        "self._holds = {}",
        "self._holds = self._holds",
    ),
    Mutation(
        "noroom-not-cleared",
        "a pass starts with the last pass's 'no room for this demand' answers",
        cycle,
        "_begin_pass",
        "self._noroom = set()",
        "self._noroom = self._noroom",
    ),
    Mutation(
        "report-soft-touch",
        "a capacity report is logged as a change of free capacity only (health, node "
        "shapes and known-ness caches stand)",
        Scheduler,
        "report_capacity",
        "self._touch(name, hard=True)",
        "self._touch(name)",
    ),
    Mutation(
        "report-keeps-could-hold",
        "a capacity report of new node shapes leaves what could ever hold a demand as it was",
        Scheduler,
        "report_capacity",
        "self._could_hold = {k: v for k, v in self._could_hold.items() if k[0] != c.index}",
        "pass",
    ),
    Mutation(
        "unheld-ignores-new-holds",
        "_unheld's per-pass answer is reused after more clusters were held",
        Scheduler,
        "_unheld",
        "if hit is not None and hit[0] is order and hit[1] == n:",
        "if hit is not None and hit[0] is order:",
    ),
    Mutation(
        "eligible-ignores-health",
        "_eligible_of's cache of healthy clusters ignores later health changes",
        Scheduler,
        "_eligible_of",
        "if hit is not None and self._kept_since_hard(hit[0]):",
        "if hit is not None:",
    ),
    Mutation(
        "cands-never-refreshed",
        "_cands_of keeps a demand's clusters with room once made (capacity moves ignored)",
        Scheduler,
        "_cands_of",
        "if hit is None or hit.pos != cap_end:",
        "if hit is None:",
    ),
    Mutation(
        "fit-cache-ignores-environments",
        "_earliest_fit's cache ignores environments placed or gone",
        Scheduler,
        "_projection_stands",
        "and entry[1] == self._env_epoch",
        "",
    ),
    Mutation(
        "scan-ignores-clock",
        "_scan's kept reservation walk is reused whatever the clock",
        Scheduler,
        "_scan",
        "and hit[2] <= now <= hit[6]",
        "",
    ),
    Mutation(
        "easy-empty-fit-ignores-now",
        "_empty_fit's EASY placement on an emptied cluster ignores which nodes are busy now",
        Scheduler,
        "_empty_fit",
        "or hit[3] != ver",
        "",
    ),
    Mutation(
        "carry-skips-gates",
        "_carry carries an answer past an admission without asking its gates again",
        Scheduler,
        "_carry",
        "if gated and self._gate(q, rep, rep.usage) is not m[4]:",
        "if False:",
    ),
    Mutation(
        "group-totals-stale",
        "ClusterState._shift_from moves nodes between groups but not the CPU total",
        ClusterState,
        "_shift_from",
        "self.tcpu += _gain(old[1], dc) * k",
        "pass",
    ),
]


def _module_of(fn: Any) -> ModuleType:
    """Where a method's code lives: ``Scheduler``'s methods are functions of the modules
    of ``scheduler/`` (truth, policy, index) bound to the class, not of ``core``."""
    return sys.modules[fn.__module__]


@contextmanager
def planted(m: Mutation) -> Iterator[None]:
    """``m`` in place: its method recompiled from the mutated source, in its module."""
    raw = m.owner.__dict__[m.method]
    fn = raw.__func__ if isinstance(raw, staticmethod) else raw
    # (Snippets are matched as they stand in the file, indented; the method is dedented
    # after, to be compiled on its own.)
    src = inspect.getsource(fn)
    if src.count(m.old) != 1:
        raise RuntimeError(
            f"{m.name}: {m.old!r} is not found exactly once in {m.owner.__name__}.{m.method}"
            " (the code moved: update the mutation)"
        )
    mod = _module_of(fn)
    same = _compiled(mod, src, m.method)
    if getattr(same, "__func__", same).__code__.co_code != fn.__code__.co_code:
        # The file is not what was imported (edited since): the source read is not the
        # method's, and neither would the mutant be.
        raise RuntimeError(f"{m.name}: {mod.__file__} changed since it was imported: run again")
    setattr(m.owner, m.method, _compiled(mod, src.replace(m.old, m.new), m.method, m.name))
    try:
        yield
    finally:
        setattr(m.owner, m.method, raw)


def _compiled(mod: ModuleType, src: str, name: str, label: str = "original") -> Any:
    """The method defined by ``src`` (indented as in its class), compiled in ``mod``."""
    code = compile(
        textwrap.dedent(src),
        f"<{label}>",
        "exec",
        flags=__future__.annotations.compiler_flag,
        dont_inherit=True,
    )
    ns: dict[str, Any] = {}
    exec(code, mod.__dict__, ns)
    return ns[name]


# --- the differential drivers, cheapest first --------------------------------------------


def _seeded(families: list[str], every: bool = False) -> Callable[[], None]:
    def run() -> None:
        for f in families:
            one, quick, all_seeds = SEEDED[f]
            for seed in all_seeds if every else quick:
                one(seed)

    return run


def _seeds(family: str, seeds: Iterable[int]) -> Callable[[], None]:
    def run() -> None:
        for seed in seeds:
            SEEDED[family][0](seed)

    return run


def _walks(
    seeds: range, steps: int, profile: str | None = None, weights: Any = None
) -> Callable[[], None]:
    def run() -> None:
        for seed in seeds:
            walk(seed, steps, profile, weights)

    return run


def _stories() -> None:
    for story in STORIES:
        story()


def _stateful(examples: int, steps: int) -> Callable[[], None]:
    def run() -> None:
        run_state_machine_as_test(
            Differential,
            settings=settings(
                max_examples=examples,
                stateful_step_count=steps,
                deadline=None,
                database=None,
                # The same examples for every mutation, run after run.
                derandomize=True,
                # Caught is caught: no time spent making the example small.
                phases=[Phase.generate],
                report_multiple_bugs=False,
                suppress_health_check=list(HealthCheck),
            ),
        )

    return run


DRIVERS: list[tuple[str, Callable[[], None]]] = [
    ("stories", _stories),
    ("today's seeds", _seeded([f for f in SEEDED if f != "reserving"])),
    ("reserving", _seeds("reserving", range(300))),
    ("holding walks", _walks(range(60), 200, "holding", HOLDING_WALK)),
    ("walks", _walks(range(100), 300)),
    ("stateful", _stateful(30, 100)),
]


@dataclass
class Outcome:
    mutation: Mutation
    caught_by: str | None  # the driver that failed first; None: missed
    how: str  # "mismatch" (decided otherwise than the reference) or the crash's type
    seconds: float


def hunt(m: Mutation) -> Outcome:
    t0 = time.perf_counter()
    with planted(m):
        for name, drive in DRIVERS:
            try:
                drive()
            except Mismatch:
                return Outcome(m, name, "mismatch", time.perf_counter() - t0)
            except Exception as e:  # the mutated core crashed: the test fails too
                return Outcome(m, name, type(e).__name__, time.perf_counter() - t0)
    return Outcome(m, None, "", time.perf_counter() - t0)


def baseline() -> None:
    """Every driver passes on the core as it is: else a mutant 'caught' means nothing."""
    for name, drive in DRIVERS:
        try:
            drive()
        except Exception as e:
            raise RuntimeError(f"{name} fails without any planted bug: {e}") from e


def main(argv: list[str]) -> int:
    names = set(argv)
    todo = [m for m in MUTATIONS if not names or m.name in names]
    t0 = time.perf_counter()
    baseline()
    print(f"baseline (no bug planted): every driver passes ({time.perf_counter() - t0:.1f} s)")
    out = []
    width = max(len(m.name) for m in todo)
    print(f"{'mutation':<{width}}  result  {'by':<18}  {'how':<10}  seconds")
    for m in todo:
        o = hunt(m)
        out.append(o)
        res = "caught" if o.caught_by else "MISSED"
        by = o.caught_by or "-"
        print(f"{m.name:<{width}}  {res:<6}  {by:<18}  {o.how:<10}  {o.seconds:7.1f}", flush=True)
    missed = [o for o in out if not o.caught_by]
    print(f"{len(out) - len(missed)} of {len(out)} caught")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
