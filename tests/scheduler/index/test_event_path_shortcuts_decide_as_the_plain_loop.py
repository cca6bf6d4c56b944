"""Shortcuts of the incremental event path (``bench/core_pass.py``'s completions).

- A fit's new reason given to a whole class at once (a class's ``settle_all``, taken by
  the flip of a reason in place when the fit was the class's first member): the same runs, the
  same notes pending, as ``settle`` over the whole class.
- A reserving head's walk over the clusters kept across clock steps while the clock
  stays before every fit's horizon (``index.view.counts``'
  ``reservation_walks_kept_across_clock``).
- The held check's summary of a queue's answers (``index.view.kept_held_summary``) kept
  through a full check that changed no reason.

Each is pinned against the plain loop (``Scheduler(incremental=False)``) on the held
fleet of ``test_rechecks_under_a_held_fleet`` (five clusters filled by ``F0`` to ``F9``, whose estimated
ends are 5, 8, ..., 32; a strict head ``H`` holding them all; four queues below, one
per algorithm, the reserving ones walking all five clusters).

The first and last sections are unit tests of the records' run structure itself
(``index.records``' ``_Class``, ``_noted``): no public surface builds a class with
given runs, so they keep those private names.
"""

from __future__ import annotations

from typing import Any

import pytest
from headway.scheduler import ActionSpec, QueueSpec
from headway.scheduler.core import _Class
from headway.scheduler.index import records
from headway.scheduler.index.view import counts, effects_kept, effects_stand, kept_held_summary
from headway.scheduler.truth import _Action, _Queue

from ..helpers import apply_op
from .test_rechecks_under_a_held_fleet import NODE, _build, _state

# --- settle_all against settle over the whole class ---------------------------------
#
# A class's runs, each (reason, notes pending, members): what settle_all(r) leaves must be
# what settle(0, len, r) leaves, and every member must read the same reasons after.

Run = tuple[str | None, tuple[str, ...], int]

SETTLE_CASES = [
    pytest.param([("NoClusterCapacity", (), 5)], "HeldForGang",
                 id="one-run-takes-a-new-reason-noted-on-the-run"),
    pytest.param([("HeldForGang", (), 5)], "HeldForGang",
                 id="one-run-that-has-the-reason-already-is-left-alone"),
    pytest.param([("HeldForGang", ("NoClusterCapacity", "HeldForGang"), 4)], "NoClusterCapacity",
                 id="one-run-back-to-a-reason-it-has-pending-adds-nothing-to-the-notes"),
    pytest.param([("NoClusterCapacity", (), 1), ("HeldForGang", (), 3)], "HeldForGang",
                 id="two-runs-one-has-it-the-other-takes-it"),
    pytest.param([(None, (), 2), ("BackfillWindow", ("BackfillWindow",), 2),
                  ("NoClusterCapacity", (), 3)], "HeldForGang",
                 id="three-runs-with-different-notes-stay-apart"),
    pytest.param([("HeldForGang", ("HeldForGang",), 2), ("NoClusterCapacity", (), 2)],
                 "HeldForGang",
                 id="runs-that-end-alike-merge"),
]  # fmt: skip


def _class(runs: list[Run]) -> _Class:
    """A class whose members' fields are as the runs say before their notes."""
    seq = 0
    c: _Class | None = None
    for reason, _, n in runs:
        for _ in range(n):
            seq += 1
            a = _Action(ActionSpec(f"a{seq}", "q", (NODE,), seq=seq), 1, (NODE,))
            a.pos = seq
            a._last = reason
            a._reasons = ["Earlier"] if reason is None else ["Earlier", reason]
            if c is None:
                c = _Class(None, a, _Queue(QueueSpec("q")))
            a.cls = c
            c.m.append(a)
    assert c is not None
    # The runs as given (notes pending included), not as append would make them.
    c.starts, c.reasons, c.pend = [], [], []
    at = 0
    for reason, pend, n in runs:
        c.starts.append(at)
        c.reasons.append(reason)
        c.pend.append(pend)
        at += n
    c.lazy = any(c.pend)
    return c


def _read(c: _Class) -> list[tuple[str | None, tuple[str, ...]]]:
    return [(a.last, tuple(a.reasons)) for a in c.m]


@pytest.mark.parametrize(("runs", "r"), SETTLE_CASES)
def test_settle_all_leaves_what_settle_over_the_whole_class_leaves(runs: list[Run], r: str) -> None:
    fast, slow = _class(runs), _class(runs)
    fast.settle_all(r)
    slow.settle(0, len(slow.m), r)
    assert (fast.starts, fast.reasons, fast.pend, fast.lazy) == (
        slow.starts,
        slow.reasons,
        slow.pend,
        slow.lazy,
    )
    assert _read(fast) == _read(slow)
    assert all(a.last == r for a in fast.m)


# --- completions and clock steps under the held fleet --------------------------------
#
# Ops, each followed by a pass: ("finish", action, t), ("cancel", action, t),
# ("submit", queue, action, pods, t), ("tick", t). A gang of two whole nodes finds no
# room while every cluster has a node taken: submitted to a reserving queue whose
# actions all have room, it is the head that reserves (walking the clusters).

Op = tuple[Any, ...]
GANG = (NODE, NODE)

EVENT_CASES = [
    pytest.param(
        [("finish", "F0", 1.0), ("submit", "e", "EG", GANG, 2.0), ("cancel", "EG", 3.0),
         ("submit", "e", "EG2", GANG, 4.0), ("tick", 4.5)], True,
        id="a-new-head-reserves-a-second-later-before-every-estimated-end-the-walk-stands"),
    pytest.param(
        [("finish", "F0", 1.0), ("submit", "e", "EG", GANG, 2.0), ("cancel", "EG", 3.0),
         ("finish", "F3", 3.5), ("submit", "e", "EG2", GANG, 4.0)], True,
        id="a-completion-between-the-walk-asks-again-only-where-capacity-moved"),
    pytest.param(
        [("finish", "F0", 1.0), ("submit", "e", "EG", GANG, 2.0), ("cancel", "EG", 3.0),
         ("submit", "e", "EG2", GANG, 9.0), ("cancel", "EG2", 10.0),
         ("submit", "e", "EG3", GANG, 15.0)], False,
        id="the-clock-passes-estimated-ends-the-walk-is-made-again"),
    pytest.param(
        [("finish", "F0", 1.0), ("submit", "b", "BG", GANG, 2.0), ("finish", "F1", 3.0),
         ("submit", "e", "EG", GANG, 4.0), ("finish", "F6", 5.0), ("cancel", "H", 6.0),
         ("tick", 12.0)], False,
        id="completions-one-second-apart-under-the-hold-then-the-hold-goes"),
    pytest.param(
        [("finish", "F0", 1.0), ("submit", "fill", "F10", (NODE,), 2.0), ("finish", "F2", 3.0),
         ("submit", "fill", "F11", (NODE,), 4.0)], True,
        id="room-comes-and-goes-below-the-hold-the-summary-follows-the-reasons"),
]  # fmt: skip


def _drive(ops: list[Op], incremental: bool) -> tuple[list[Any], int]:
    """The log of every pass, and how many reserving walks were answered from a walk
    made at an earlier clock."""
    s = _build(incremental)
    log: list[Any] = [sorted(x.action_id for x in s.schedule(0.0)), _state(s)]
    before = counts(s).reservation_walks_kept_across_clock
    for i, op in enumerate(ops):
        t = apply_op(s, op, 1000 + i, estimate=10.0)
        log.append(sorted(x.action_id for x in s.schedule(t)))
        log.append(_state(s))
    return log, counts(s).reservation_walks_kept_across_clock - before


@pytest.mark.parametrize(("ops", "walk_kept"), EVENT_CASES)
def test_event_paths_decide_as_the_plain_loop(ops: list[Op], walk_kept: bool) -> None:
    fast, kept = _drive(ops, True)
    plain, _ = _drive(ops, False)
    assert fast == plain
    assert (kept > 0) == walk_kept


def test_a_full_check_that_changes_no_reason_keeps_the_held_summary() -> None:
    """After a completion that frees room for every demand (reasons change in place),
    the summary is made again; a completion after it that changes no reason keeps the
    summaries of the queues checked in full."""
    s = _build(True)
    s.schedule(0.0)
    s.finish("F0", 1.0)
    s.schedule(1.0)
    s.finish("F1", 2.0)
    s.schedule(2.0)
    before = {n: kept_held_summary(s, n) for n in s.queues}
    before = {n: h for n, h in before.items() if h is not None}
    assert before, "no queue took the held path"
    s.finish("F3", 3.0)
    s.schedule(3.0)
    assert {n: kept_held_summary(s, n) for n in before} == before


# --- effects remade by skipped queues: the last pass's tuple kept when alike ----------
#
# A queue found unchanged makes its holds and reservations again, each an effect in the
# pass's list; where the effect is the one the last pass made at that place (same kind,
# cluster, head, time, EASY version, and the very reservation) that tuple is kept.
# Whatever is kept must read as the pass's own holds and reservations say, and the
# decisions must be the plain loop's. (The ops are ``_drive``'s.)

EFFECT_CASES = [
    pytest.param([("tick", 1.0), ("tick", 2.0)], True,
                 id="nothing-changes-every-skipped-queue-keeps-the-last-pass-effects"),
    pytest.param([("finish", "F0", 1.0), ("finish", "F3", 2.0), ("finish", "F6", 3.0)], True,
                 id="completions-below-the-hold-the-unmoved-effects-are-kept"),
    pytest.param([("finish", "F0", 1.0), ("submit", "e", "EG", GANG, 2.0), ("tick", 3.0),
                  ("submit", "e", "ES", (NODE,), 4.0)], True,
                 id="a-reserving-head-then-an-action-after-it-decided-on-the-kept-effects"),
    pytest.param([("finish", "F0", 1.0), ("tick", 8.0), ("finish", "F7", 9.0), ("tick", 30.0)],
                 True, id="the-clock-passes-estimated-ends-reservations-move-then-stand"),
    pytest.param([("cancel", "H", 1.0), ("finish", "F0", 2.0), ("tick", 3.0)], True,
                 id="the-hold-goes-the-effects-diverge-then-stand-again"),
    pytest.param([("tick", 6.0), ("tick", 7.0), ("tick", 9.0)], True,
                 id="past-an-estimated-end-each-pass-reserves-at-its-clock-the-holds-are-kept"),
]  # fmt: skip


def _drive_effects(ops: list[Op], incremental: bool) -> tuple[list[Any], int]:
    """The log of every pass, and how many effects were the last pass's tuples."""
    s = _build(incremental)
    log: list[Any] = [sorted(x.action_id for x in s.schedule(0.0)), _state(s)]
    kept = 0
    for i, op in enumerate(ops):
        t = apply_op(s, op, 1000 + i, estimate=10.0)
        log.append(sorted(x.action_id for x in s.schedule(t)))
        log.append(_state(s))
        assert effects_stand(s), "every effect says what the pass's holds and reservations are"
        kept += effects_kept(s)
    return log, kept


@pytest.mark.parametrize(("ops", "some_kept"), EFFECT_CASES)
def test_kept_effects_read_as_made_and_decide_as_the_plain_loop(
    ops: list[Op], some_kept: bool
) -> None:
    fast, kept = _drive_effects(ops, True)
    plain, _ = _drive_effects(ops, False)
    assert fast == plain
    assert (kept > 0) == some_kept


# --- run notes shared -----------------------------------------------------------------

NOTED_CASES = [
    pytest.param((), "HeldForGang", id="a-first-note"),
    pytest.param(("NoClusterCapacity",), "HeldForGang", id="a-second-note-after-the-first"),
    pytest.param(("HeldForGang", "NoClusterCapacity"), "BackfillWindow",
                 id="a-third-note-in-order"),
]  # fmt: skip


@pytest.mark.parametrize(("p", "r"), NOTED_CASES)
def test_noted_is_the_notes_plus_one_shared_between_runs(p: tuple[str, ...], r: str) -> None:
    got = records._noted(p, r)
    assert got == (*p, r)
    assert records._noted(tuple(p), r) is got
    records._NOTED.clear()
    again = records._noted(p, r)
    assert again == (*p, r)
