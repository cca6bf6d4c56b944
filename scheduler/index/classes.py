"""Decision classes: actions alike in demand, environment and (where it matters) run
and estimate are decided once (``_memo_loop``, ``_walk``, ``_carry``); ``_eval``
records what each decision read.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING

from ..common import _INF, _POS
from ..fit import uniform
from ..index.records import _apply_due, _Class, _Eval
from ..policy.gates import _any_gate_on

if TYPE_CHECKING:
    from typing import Any

    from ..core import Scheduler
    from ..fit import ClusterState, Runs
    from ..index.records import _Visit
    from ..reasons import Reason
    from ..resources import Pod
    from ..truth import Admitted, _Action, _Queue


def _dkey(self: Scheduler, pods: tuple[Pod, ...]) -> int:
    # A long gang of one pod object is keyed by (pod, count): hashing the tuple
    # hashes every pod. (An equal gang of distinct objects may get another key:
    # keys only share work between equal demands, they never tell them apart.)
    key: Any = (pods[0], len(pods)) if uniform(pods) else pods
    k = self._dkeys.get(key)
    if k is None:
        k = self._dkeys[key] = len(self._dkeys)
        if any(p != pods[0] for p in pods):
            self._unlike.add(k)
    return k


def _classify(self: Scheduler, a: _Action) -> None:
    k = (a.dkey, a.env)
    a.ck = self._classes.setdefault(k, len(self._classes))
    ke = (a.dkey, a.env, a.spec.estimate, a.task if a.spec.estimate is None else None)
    a.ck_est = self._classes.setdefault(ke, len(self._classes))


def _could(self: Scheduler, c: ClusterState, runs: Runs, dkey: int) -> bool:
    k = (c.index, dkey)
    v = self._could_hold.get(k)
    if v is None:
        v = self._could_hold[k] = c.could_hold(runs)
    return v


def _settle(self: Scheduler, c: _Class, i: int, j: int, r: str) -> None:
    """``c.settle(i, j, r)``, counted (``index.view.counts``' ``stretches_settled``)."""
    self._counts.stretches_settled += 1
    c.settle(i, j, r)


def _start_visit_records(self: Scheduler) -> None:
    """Empty what a visit records for the next pass (see ``_visit`` and its callers)."""
    self._horizon = _INF
    self._vhz = {}
    self._vevals = []
    self._vseen = {}
    self._vrooms = {}
    self._vhist = self._vfragile = False
    self._vholds = []
    self._vresv = None


def _memo_loop(
    self: Scheduler, q: _Queue, v: _Visit, now: float, out: list[Admitted], run_gates: bool
) -> int:
    """Every waiting action in queue order, answering from a per-class memo."""
    memo: dict[Any, tuple[int, Reason]] = {}
    # Where reservations apply, an action's estimate matters too. It is a function
    # of the declared estimate, or else of the task's history (fixed within a pass).
    resv = self._resv
    started = 0
    ver = v.ver
    get = memo.get
    # Reasons are recorded past the classes' runs: recount them before a walk.
    q.runs_ok = False
    self._flush(q)
    for a in q.waiting:
        key: Any = a.ck_est if resv else a.ck
        if run_gates:
            key = (key, a.run)
        m = get(key)
        if m is not None and m[0] == ver:
            if m[1] != a._last:
                a.note(m[1])
            continue
        r = self._consider(q, a, v, now, out)
        if r is None:
            started += 1
            ver = v.ver
            continue
        a.note(r)
        if v.ver == ver:
            memo[key] = (ver, r)
        else:
            ver = v.ver
    if started:
        for a in q.waiting:
            if a.state != "waiting":
                self._unlist(q, a)
        q.waiting = [a for a in q.waiting if a.state == "waiting"]
    return started


def _walk(
    self: Scheduler, q: _Queue, v: _Visit, now: float, out: list[Admitted], run_gates: bool
) -> int:
    """The memo loop's decisions, made per class instead of per action.

    The loop gives an action the memo's answer for its class if no state change
    (``v.ver``) happened since that answer was computed. So between two state
    changes, all members of a class after the first get the first one's answer.
    The walk merges the classes' heads in queue order (a heap by position) and
    only evaluates an action where the loop would have: a class whose answer is
    known opens a stretch of members that all get it, and the next state change
    (at the position of the action that caused it) closes every open stretch;
    each class's first member after that position is then due again. Closing a
    stretch touches only members whose last reason differs (``_Class.settle``).

    An admission changes less than most state changes: the capacity of the one
    cluster it took (capacity only shrinks within a pass) and the counters the
    gates read. An answer that read neither (its fit found no room there, and its
    gates answer as before) is what the fit would give again: it is carried past
    the admission (``_carry``) instead of made again. Its stretches stay open
    (their members owed the answer are settled when the class is next due), and
    the fit the loop would have made is recorded as it would have been (the
    first member due after the admission joins the answer's ``_Eval``).
    """
    # Per key: [version it stands at, answer, clusters its fit found room on (None:
    # never carried), the action whose fit it is, its gates' answer, its record,
    # whether the loop's next fit of the key is still to be recorded].
    memo: dict[Any, list[Any]] = {}
    # While reservations stand, the memo is by estimate too (``_Class.ck_est``): per
    # class without it (``ck``), an entry of the memo whose fit read no reservation.
    alike: dict[Any, list[Any]] = {}
    share = self._SHARE_ALIKE
    # Read each time: this queue's own reservation (a state change) may add one.
    resv = self._resv
    started = 0
    ver = v.ver
    # Gates an admission can move (every gate reads a counter it moves): an answer is
    # carried past one only if they answer as before.
    gated = _any_gate_on(q.spec, self.org)
    # (position, index, class, first member owed ``rr`` or -1, ``rr``): positions
    # are unique, so entries never compare past the first field.
    heap: list[tuple[int, int, _Class, int, Any]] = [
        (c.m[0].pos, 0, c, -1, None) for c in q.cls.values()
    ]
    heapify(heap)
    # Stretches of classes whose answer is known: (class, first member, answer, key).
    opened: list[tuple[_Class, int, Reason, Any]] = []
    admitted: list[_Action] = []
    while heap:
        pos, i, c, j0, rr = heappop(heap)
        key: Any = c.ck_est if resv else c.ck
        if run_gates:
            key = (key, c.run)
        m = memo.get(key)
        if m is not None and m[0] == ver:
            _known(self, c, i, j0, rr, m, key, bool(resv), opened)
            continue
        if j0 >= 0:
            _settle(self, c, j0, i, rr)
        a = c.m[i]
        # (Where reservations stand: the class's key without its estimate.)
        akey = ((c.ck, c.run) if run_gates else c.ck) if resv else None
        if resv and share and _answer_alike(c, i, alike.get(akey), key, ver, memo, opened):
            continue
        r = self._consider(q, a, v, now, out)
        if r is None:
            started += 1
            admitted.append(a)
            nv = v.ver
            if memo and not a.env:
                self._carry(q, memo, ver, nv, a.cluster, gated)
        else:
            if v.ver == ver:
                m = memo[key] = _answer_of(self, a, r, ver)
                if resv and m[2] is not None and not self._cread:
                    alike[akey] = m
                # The member decided opens the stretch itself: one settle for it
                # and the members that follow with the same answer, not two.
                opened.append((c, i, r, key))
                continue
            _settle(self, c, i, i + 1, r)
            nv = v.ver
        # A state change at ``pos``: what was known holds up to here only (but for
        # answers carried past it, whose stretches stay open).
        _close_stretches(self, heap, opened, memo, pos, nv)
        ver = nv
        opened = []
        if i + 1 < len(c.m):
            heappush(heap, (c.m[i + 1].pos, i + 1, c, -1, None))
    for oc, j0, rr, _k in opened:
        _settle(self, oc, j0, len(oc.m), rr)
    if started:
        _drop_admitted(self, q, admitted)
    return started


def _answer_alike(
    c: _Class,
    i: int,
    b: list[Any] | None,
    key: Any,
    ver: int,
    memo: dict[Any, list[Any]],
    opened: list[tuple[_Class, int, Reason, Any]],
) -> bool:
    """``_walk``: member ``i`` of class ``c`` takes the answer ``b`` of a class alike but
    for its estimate, if ``b`` was made at this state (``ver``) without reading a
    reservation: the fit would end as its did, for this estimate too. Recorded as the
    fit would have been. False: no such answer."""
    if b is None or b[0] != ver:
        return False
    g = b[5]
    if g is not None:
        g.acts.append(c.m[i])
    memo[key] = [ver, b[1], b[2], c.m[i], b[4], g, False]
    opened.append((c, i, b[1], key))
    return True


def _answer_of(self: Scheduler, a: _Action, r: Reason, ver: int) -> list[Any]:
    """``_walk``'s memo entry for ``a``'s answer ``r`` at state ``ver``, from what its
    ``_consider`` left (see ``_walk``; an action of an environment is never carried)."""
    names = self._cnames if not a.env else None
    return [ver, r, names, a, None if names is None else self._cgate, self._crec, False]


def _known(
    self: Scheduler,
    c: _Class,
    i: int,
    j0: int,
    rr: Any,
    m: list[Any],
    key: Any,
    resv: bool,
    opened: list[tuple[_Class, int, Reason, Any]],
) -> None:
    """``_walk``: member ``i`` of class ``c`` is due and its answer is known (memo
    entry ``m`` stands): a stretch opens at it, or the one owed since ``j0`` goes on."""
    r0: Reason = m[1]
    if m[6]:
        # Carried past an admission: the loop would have made the fit again
        # here (its memo was out of date), and recorded it.
        m[6] = False
        g = m[5]
        if g is not None:
            g.acts.append(c.m[i])
            if not resv:
                g.blind = True
    if j0 >= 0:
        if rr == r0:
            opened.append((c, j0, r0, key))
            return
        _settle(self, c, j0, i, rr)
    opened.append((c, i, r0, key))


def _close_stretches(
    self: Scheduler,
    heap: list[tuple[int, int, _Class, int, Any]],
    opened: list[tuple[_Class, int, Reason, Any]],
    memo: dict[Any, list[Any]],
    pos: int,
    nv: int,
) -> None:
    """``_walk`` after a state change at ``pos`` (the state now at version ``nv``):
    each open stretch is settled up to ``pos`` and its class is due again at its next
    member, but for answers carried past the change, whose stretches stay open."""
    for oc, j0, rr, k in opened:
        om = oc.m
        j = bisect_right(om, pos, lo=j0, key=_POS)
        if memo[k][0] == nv:
            if j < len(om):
                heappush(heap, (om[j].pos, j, oc, j0, rr))
            else:
                _settle(self, oc, j0, j, rr)
            continue
        if j > j0:
            _settle(self, oc, j0, j, rr)
        if j < len(om):
            heappush(heap, (om[j].pos, j, oc, -1, None))


def _drop_admitted(self: Scheduler, q: _Queue, admitted: list[_Action]) -> None:
    """The actions ``_walk`` admitted leave their classes and ``q``'s waiting list."""
    for a in admitted:
        self._unlist(q, a)
    w = q.waiting
    if len(admitted) <= 16:
        for a in admitted:
            del w[bisect_left(w, a.pos, key=_POS)]
    else:
        q.waiting = [a for a in w if a.state == "waiting"]


def _carry(
    self: Scheduler,
    q: _Queue,
    memo: dict[Any, list[Any]],
    ver: int,
    nv: int,
    cname: str | None,
    gated: bool,
) -> None:
    """``_walk``'s answers standing at version ``ver`` that an admission on cluster
    ``cname`` (which moved the version to ``nv``) leaves as they are: carried to
    ``nv``.

    An admission (of an action without environment) takes capacity on ``cname``
    alone, uses up only the reservations there, and moves the gates' counters:
    holds, reservations, the visit's block stay. A fit that found no room on
    ``cname`` finds none there now, and the same clusters with room, in the same
    order, everywhere else (only ``cname``'s key moved in the placement order): the
    same answer, if the gates still let it through (and if the demand's best fit is
    monotone: not for a gang of unlike pods). A gate's answer is asked again.
    """
    for m in memo.values():
        if m[0] != ver:
            continue
        names = m[2]
        rep: _Action = m[3]
        if names is None or cname in names or rep.dkey in self._unlike:
            # (Unlike pods: room elsewhere can come back, see ``_unlike``.)
            continue
        if gated and self._gate(q, rep, rep.usage) is not m[4]:
            continue
        m[0] = nv
        m[6] = True


def _build_classes(self: Scheduler, q: _Queue, mode: tuple[bool, bool]) -> None:
    """Group a queue's waiting actions by decision class (``mode``: whether the
    estimate, and the run, are part of the class) and number their positions."""
    self._flush(q)
    q.cls = {}
    q.cls_mode = mode
    q.runs_ok = True
    for i, a in enumerate(q.waiting):
        a.pos = i
        self._enlist(q, a, mode)
    q.next_pos = len(q.waiting)


def _enlist(self: Scheduler, q: _Queue, a: _Action, mode: tuple[bool, bool]) -> None:
    if q.due:
        _apply_due(q)  # a flip reaches the members it found, not one that came later
    base = a.ck_est if mode[0] else a.ck
    pk = (base, a.run) if mode[1] else base
    c = q.cls.get(pk)
    if c is None:
        c = q.cls[pk] = _Class(pk, a, q)
    c.append(a)
    a.cls = c


def _flush(self: Scheduler, q: _Queue) -> None:
    """Bring the fields of every waiting action of ``q`` up to date (see _Class)."""
    if q.due:
        _apply_due(q)
    for c in q.cls.values():
        if c.lazy:
            c.flush()


def _unlist(self: Scheduler, q: _Queue, a: _Action) -> None:
    if q.due:
        _apply_due(q)
    c = a.cls
    assert c is not None
    c.remove(bisect_left(c.m, a.pos, key=_POS))
    if not c.m:
        del q.cls[c.pk]
    a.cls = None


def _eval(
    self: Scheduler,
    a: _Action,
    dkey: int,
    runs: Runs,
    blocked: bool,
    first: str | None,
    reason: Reason,
    blind: bool,
) -> None:
    """Record a fit the visit made: in the record of the fits that ended alike
    before it, if any (a full pass makes thousands of fits, that end in a few
    records: grouped as they come, not made one by one and grouped after).

    Checking them again (``_evals_still``) reads the same clusters and holds for
    each, in any order; only a reservation's verdict depends on the action (its
    estimate), so each record keeps its actions.
    """
    k = (dkey, blocked, first, reason)
    g = self._vseen.get(k)
    if g is None:
        g = self._vseen[k] = _Eval(a, dkey, runs, blocked, first, reason, blind)
        self._counts.records_made += 1
        self._vevals.append(g)
    else:
        g.acts.append(a)
        if blind:
            g.blind = True
    self._crec = g
