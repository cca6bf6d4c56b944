"""The scheduling cycle: ``schedule`` runs passes until one admits nothing; ``_pass``
visits the queues in order over one snapshot; ``_visit`` and ``_consider`` decide each
waiting action; ``_admit`` records an admission.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .common import _ZERO
from .fit import runs_of, sort_pods
from .index.records import _NO_CHANGE, _apply_due, _Visit
from .index.validity import _skip_visit
from .model import Algorithm, QueueStatus
from .policy.backfill import _joint_extra
from .policy.gates import _org_gated, _reads_running, _reads_runs
from .reasons import Reason
from .resources import Usage
from .truth import Admitted, PassError, _deciding, _EnvInstance

if TYPE_CHECKING:
    from .common import _Reservation
    from .core import Scheduler
    from .fit import ClusterState, Runs
    from .resources import Pod
    from .truth import _Action, _Queue


def schedule(self: Scheduler, now: float) -> list[Admitted]:
    """One scheduling cycle: passes until nothing more starts.

    Raises ``PassError`` (with what was admitted before) if anything inside raises.
    """
    out: list[Admitted] = []
    try:
        self.expire_environments(now)
        while self._pass(now, out):
            pass
        draining = QueueStatus.draining
        if self._draining_at != self._spec_ver:
            self._draining = [q for q in self.queues.values() if q.spec.status is draining]
            self._draining_at = self._spec_ver
        for q in self._draining:
            if q.spec.status is draining:
                self._settle_status(q)
    except Exception as e:
        raise PassError(out, _deciding(e)) from e
    return out


def _pass(self: Scheduler, now: float, out: list[Admitted]) -> int:
    """One pass over the queues in visiting order, in phases:

    1. begin (``_begin_pass``): order the queues, forget the last pass's holds,
       reservations and per-pass answers, and start this pass's effects;
    2. per queue, if its last visit's answers may be kept (``_skip_visit``): what
       changed since (``_changed_since``), whether its answers still stand
       (``_stands``), and if so its holds and reservations made again
       (``_remake_effects``), deciding only actions appended since;
    3. else visit it and record what the visit read (``_visit_and_record``).
    """
    _begin_pass(self)
    started = 0
    # ``_signature`` inlined; the epochs move as earlier queues admit work.
    org = self.org
    orgd = _org_gated(org)
    incremental = self.incremental
    for q in self._qorder:
        sig = (q.epoch, q.spec, self._env_epoch, self._org_epoch if orgd else 0)
        up = len(self._effects)
        if incremental and (not q.last_started or q.mixed):
            kept = _skip_visit(self, q, sig, up, now, out)
            if kept is not None:
                started += kept
                continue
        started += _visit_and_record(self, q, sig, up, now, out, orgd)
    return started


def _begin_pass(self: Scheduler) -> None:
    """Phase 1: the queues in order, and a pass that starts with no holds, no
    reservations and none of the last pass's per-pass answers."""
    self.passes += 1
    if self._qdirty is None or self._qdirty:
        self._reorder()
    self._holds = {}
    self._resv = {}
    self._infeasible = set()
    self._noroom = set()
    self._unheld_cache = {}
    self._chg_cache = {}
    self._dr_cache = {}
    self._exp_cache = {}
    self._held_cache = {}
    self._hsig_cache = {}
    self._hflip_cache = {}
    self._stale_cache = {}
    self._stale_last = None
    self._moved_cache = {}
    self._resv_cache = {}
    # Holds and reservations bind the queues after the one that made them. A queue
    # may be skipped only if what came before it this pass is what came before it
    # last pass: track where this pass's effects first differ from the last's.
    self._prev_effects = self._effects
    self._effects = []
    self._diverged = None


def _visit_and_record(
    self: Scheduler,
    q: _Queue,
    sig: tuple[Any, ...],
    up: int,
    now: float,
    out: list[Admitted],
    orgd: bool,
) -> int:
    """Phase 3: visit ``q`` and keep what the visit read, for the next pass's phase 2."""
    n_effects = up
    q.last_up_len = up
    q.tail = 0
    # The state as the visit finds it: holds and reservations made by the visit
    # itself are its output, not its input. (What a visit that admitted work
    # changed is in the capacity log, or its records are dropped: see below.)
    q.last_sig = sig
    q.last_hist = self._hist_epoch
    q.cap_pos = self._cap_base + len(self._cap_log)
    q.stale = None
    self._start_visit_records()
    n = self._visit(q, now, out)
    q.horizon = self._horizon
    q.hz = self._vhz
    # Fits asked for outside a visit (``insight``) must not touch its records.
    self._vhz = {}
    q.last_started = n
    mine = self._effects[n_effects:]
    q.last_holds = tuple(self._vholds)
    q.last_resv = tuple((e[1], e[5]) for e in mine if e[0] == "r")
    # A visit that admitted work found its answers at more than one capacity:
    # each at the capacity its admissions before it left. The clusters they
    # took are in the capacity log past the visit's start, so the next check
    # reads those again, as changed, and finds every answer as it would be
    # now. What else an admission moves must not matter: the queue's running
    # work (its gates), the org's (its envelope), environments (``fragile``).
    # Reasons changed in place are not made from such records (see
    # ``_evals_still``): a class member's answer may differ from the one
    # before it there.
    q.mixed = bool(n) and not (self._vfragile or orgd or _reads_running(q.spec))
    if q.mixed:
        q.last_sig = (q.epoch, q.spec, self._env_epoch, 0)
        q.tail = 0
    if n and not q.mixed:
        # Never skipped next time (see above): nothing to record.
        q.evals, q.rooms, q.views = [], {}, {}
    else:
        q.evals = self._vevals
        q.rooms = self._vrooms
        q.views = self._views_before(mine, q.rooms) if q.rooms else {}
    q.hist_dep = self._vhist
    q.fragile = self._vfragile
    q.resv_rec = self._vresv
    return n


def _visit(self: Scheduler, q: _Queue, now: float, out: list[Admitted]) -> int:
    """Phases 3-5 for one queue: gates, fit, admit or record why not."""
    self._counts.visits += 1
    if q.due:
        _apply_due(q)  # before the walk reads the classes and extends the records
    v = _Visit(q, self._eligible(q))
    spec = q.spec
    q.blocked_head = None
    if not self.incremental:
        started = 0
        for a in q.waiting:
            r = self._consider(q, a, v, now, out)
            if r is None:
                started += 1
            else:
                a.note(r)
        if started:
            q.waiting = [a for a in q.waiting if a.state == "waiting"]
        return started
    # Where a gate reads the runs, an action's run is part of what its answer reads.
    run_gates = _reads_runs(spec, self.org)
    # Actions alike in everything the decision reads (demand, environment, run
    # where run caps apply, estimate where reservations apply) get the same answer
    # while the state is unchanged: decide once per class, not once per action.
    # Reservations exist for this visit if an earlier queue made one, or once this
    # queue makes its own (only a reserving queue does).
    mode = (bool(self._resv) or v.reserving, run_gates)
    if q.cls_mode != mode:
        self._build_classes(q, mode)
    if 2 * len(q.cls) > len(q.waiting):
        # Classes of one or two: walking them costs more than the plain loop.
        return self._memo_loop(q, v, now, out, run_gates)
    if not q.runs_ok:
        for c in q.cls.values():
            c.recount()
        q.runs_ok = True
    return self._walk(q, v, now, out, run_gates)


def _consider(
    self: Scheduler, q: _Queue, a: _Action, v: _Visit, now: float, out: list[Admitted]
) -> Reason | None:
    """Decide one action: admit it (returns None) or return why not, in phases:

    1. the demand: the action's pods, or its declared environment's footprint;
    2. the gates (``_gate``, in ``GATE_ORDER``): the first that fails is the reason;
    3. a declared environment already running: its cluster or a reason
       (``_consider_env``);
    4. the fit: the clusters in placement order (``_fit_order``), and the first with
       room that no hold or reservation forbids (``_fit_walk``);
    5. admit there (``_admit_fit``), or say why not and act as the queue's algorithm
       says: hold, reserve, or let later actions try (``_why_not``).

    An answer other than an admission leaves, for ``_walk``: the clusters its fit
    found room on (``_cnames``; None: not known), its gates' answer (``_cgate``),
    the fit's record (``_crec``), and whether the fit read a reservation (``_cread``:
    the only place the action's estimate enters it).
    """
    self._counts.fits += 1
    self._cnames = None
    # 1. the demand
    inst = self.envs.get(a.env) if a.env_declared and a.env else None
    if inst is not None:
        demand = _ZERO
        pods: tuple[Pod, ...] = ()
        runs: Runs = ()
    elif a.env_declared and a.env:
        pods = sort_pods(self.env_specs[a.env].footprint)
        runs = runs_of(pods)
        demand = Usage.of(pods)
    else:
        pods = a.pods
        runs = a.runs
        demand = a.usage
    # 2. the gates
    r = self._gate(q, a, demand)
    if r is not None:
        self._cnames = _NO_CHANGE
        self._cgate = r
        self._crec = None
        self._cread = False
        self._block(q, a, v)
        return r
    # 3. a declared environment already running
    if inst is not None:
        return _consider_env(self, q, a, v, inst, now, out)
    # 4. the fit: clusters in placement order; the first with room that no hold or
    # reservation forbids takes the whole gang.
    pref = a.env if a.env and not a.env_declared and a.env in self.undeclared_env else None
    dkey = a.dkey if not a.env_declared else self._dkey(pods)
    if a.env:
        # Where environments run sways the placement order: no shortcut past it.
        self._vfragile = True
    # The clusters with room that a walk reads, once per demand and visit: records
    # are kept only of a visit that admitted nothing, and in one capacity stood
    # still, so every walk of a demand saw the same ones (see ``_still``).
    rooms: set[str] | None = None
    if not v.blocked and dkey not in self._vrooms:
        rooms = self._vrooms[dkey] = set()
    nr_key = (q.spec.clusters, dkey)
    order, names, checked = _fit_order(self, v, pref, nr_key, runs)
    chosen, extras, room, first, first_block, read = _fit_walk(
        self, a, v, order, names, checked, nr_key, dkey, runs, rooms, now
    )
    # 5. admit, or why not
    if chosen is not None:
        _admit_fit(self, q, a, v, chosen, extras, pods, runs, rooms, dkey, now, out)
        return None
    return _why_not(self, q, a, v, room, first, first_block, read, names, dkey, nr_key, runs, now)


def _consider_env(
    self: Scheduler,
    q: _Queue,
    a: _Action,
    v: _Visit,
    inst: _EnvInstance,
    now: float,
    out: list[Admitted],
) -> Reason | None:
    """Phase 3: an action of a declared environment already running goes to its
    cluster, or waits (held, reserved, or its slots full)."""
    holds = self._holds
    resv = self._resv
    self._vfragile = True
    c = self.clusters.get(inst.cluster)
    if c is None or c not in v.elig:
        r = Reason.NoClusterCapacity
    elif v.blocked or c.name in holds:
        r = Reason.HeldForGang
    elif c.name in resv and self._allowed(a, now, resv[c.name], (), c) is None:
        r = Reason.BackfillWindow
    elif inst.active >= inst.spec.slots:
        r = Reason.EnvironmentBusy
    else:
        self._admit(q, a, c, [], inst, now, out)
        v.ver += 1
        return None
    self._block(q, a, v)
    return r


def _fit_order(
    self: Scheduler,
    v: _Visit,
    pref: str | None,
    nr_key: tuple[Any, int],
    runs: Runs,
) -> tuple[list[ClusterState], frozenset[str] | None, bool]:
    """Phase 4, the order: the clusters a fit walks, in placement order; the names of
    those with room when known (none: ``_NO_CHANGE``); and whether every cluster of the
    order is known to have room (then only holds and reservations are read)."""
    if nr_key in self._noroom:
        return [], _NO_CHANGE, False
    if pref is not None:
        return self._placement_order(v.elig, pref), None, False
    if self.incremental:
        # The order depends on the selector and on what was admitted (the pass
        # fixes health), and so does which clusters have room (within a pass only
        # an admission changes capacity): keep just those, once per pass, demand
        # and admission, so that walks need not ask each cluster again.
        hit = self._cands_of(nr_key, runs, v.elig)
        return hit.order, hit.names, True
    if v.order is None or v.order_ver != self._admissions:
        v.order = self._placement_order(v.elig, None)
        v.order_ver = self._admissions
    return v.order, None, False


def _fit_walk(
    self: Scheduler,
    a: _Action,
    v: _Visit,
    order: list[ClusterState],
    names: frozenset[str] | None,
    checked: bool,
    nr_key: tuple[Any, int],
    dkey: int,
    runs: Runs,
    rooms: set[str] | None,
    now: float,
) -> tuple[ClusterState | None, list[_Reservation], bool, str | None, Reason | None, bool]:
    """Phase 4, the walk: the cluster chosen (None: none) with the reservations whose
    EASY extras it runs in; whether any cluster had room, the first that had, the
    first reason one with room turned the action away, and whether a reservation was
    read (the action's estimate)."""
    holds = self._holds
    resv = self._resv
    first: str | None = None
    room = False
    read = False
    first_block: Reason | None = None
    chosen: ClusterState | None = None
    extras: list[_Reservation] = []
    if checked:
        # The plain walk below, with what it would skip left out: every cluster of
        # ``order`` has room, and a held one turns the action away before anything
        # else is read there, so only the unheld ones are walked. Nothing chosen:
        # the walk read them all, and the first gave the reason.
        if order:
            room = True
            first = order[0].name
            if not v.blocked:
                for c in self._unheld(nr_key, order):
                    rs = resv.get(c.name)
                    if rs:
                        read = True
                        need = self._allowed(a, now, rs, runs, c)
                        if need is None:
                            continue
                        extras = need
                    chosen = c
                    break
                else:
                    if rooms is not None:
                        assert names is not None
                        rooms.update(names)
                    first_block = Reason.HeldForGang if first in holds else Reason.BackfillWindow
        return chosen, extras, room, first, first_block, read
    infeasible = self._infeasible
    feasible = self._feasible
    for c in order:
        if c.known:
            ik = (c.index, dkey)
            if ik in infeasible:
                continue
            if feasible.get(ik) != c.version:
                if self._unfit.get(ik) == c.version or c.place(runs, commit=False) is None:
                    # Capacity only shrinks within a pass: no need to ask again
                    # (for a demand whose best fit is monotone).
                    if dkey not in self._unlike:
                        infeasible.add(ik)
                    self._unfit[ik] = c.version
                    continue
                feasible[ik] = c.version
        room = True
        if first is None:
            first = c.name
        if v.blocked:
            break
        # Not blocked: the walk reads the holds and reservations of every cluster
        # with room (until one takes the action).
        if rooms is not None:
            rooms.add(c.name)
        if c.name in holds:
            first_block = first_block or Reason.HeldForGang
            continue
        rs = resv.get(c.name)
        if rs:
            need = self._allowed(a, now, rs, runs, c)
            if need is None:
                first_block = first_block or Reason.BackfillWindow
                continue
            extras = need
        chosen = c
        break
    return chosen, extras, room, first, first_block, read


def _admit_fit(
    self: Scheduler,
    q: _Queue,
    a: _Action,
    v: _Visit,
    chosen: ClusterState,
    extras: list[_Reservation],
    pods: tuple[Pod, ...],
    runs: Runs,
    rooms: set[str] | None,
    dkey: int,
    now: float,
    out: list[Admitted],
) -> None:
    """Phase 5, admitted: place the gang on ``chosen`` (in the EASY extras it runs
    in), start its declared environment if it has one, and record the admission."""
    if rooms is not None:
        # A walk that places the action stops there: it did not read every
        # cluster with room, so the next walk of this demand records them.
        del self._vrooms[dkey]
    before = chosen.version
    if chosen.known:
        limit = _joint_extra(extras) if extras else None
        nodes = chosen.place(runs, commit=True, limit=limit)
        assert nodes is not None
        for used in extras:
            self._use_up(used, runs, nodes)
    else:
        nodes = []
    new_inst = None
    if a.env_declared and a.env:
        new_inst = _EnvInstance(self.env_specs[a.env], chosen.name, nodes, pods, q.spec.name)
        self.envs[a.env] = new_inst
        q.usage.add(new_inst.usage)
    self._admit(q, a, chosen, nodes, new_inst, now, out)
    if chosen.known and new_inst is None:
        self._chain_admit(chosen, before, a.est_end)
    v.ver += 1


def _why_not(
    self: Scheduler,
    q: _Queue,
    a: _Action,
    v: _Visit,
    room: bool,
    first: str | None,
    first_block: Reason | None,
    read: bool,
    names: frozenset[str] | None,
    dkey: int,
    nr_key: tuple[Any, int],
    runs: Runs,
    now: float,
) -> Reason:
    """Phase 5, not admitted: the reason (room held or reserved, or none), recorded
    for the index layer; a head with no room anywhere then acts by its queue's
    algorithm (``strict`` holds, ``backfill``/``easy`` reserve, ``greedy`` lets
    later actions try)."""
    blocked = v.blocked
    resv = self._resv
    self._cnames = names
    self._cgate = None
    self._cread = read
    if room:
        r = first_block or Reason.HeldForGang
        self._eval(a, dkey, runs, blocked, first, r, not resv)
        self._block(q, a, v)
        return r
    self._eval(a, dkey, runs, blocked, None, Reason.NoClusterCapacity, not resv)
    # Capacity only shrinks within a pass: no cluster of this selector will have room
    # for this demand again in it (when its best fit is monotone).
    if dkey not in self._unlike:
        self._noroom.add(nr_key)
    if v.strict and not v.blocked:
        self._block(q, a, v)
        self._hold_all(self._holdable(q.spec.clusters, v.elig, runs, dkey), a.id)
    elif v.reserving and not v.reserved:
        v.reserved = True
        v.ver += 1
        q.blocked_head = a.id
        self._reserve(
            a, runs, dkey, q.spec.clusters, v.elig, now, q.spec.algorithm is Algorithm.easy
        )
    return Reason.NoClusterCapacity


def _admit(
    self: Scheduler,
    q: _Queue,
    a: _Action,
    c: ClusterState,
    nodes: list[int],
    inst: _EnvInstance | None,
    now: float,
    out: list[Admitted],
) -> None:
    a.state = "running"
    a.cluster = c.name
    a.start = now
    a.est = self.estimate(a.task, a.spec.estimate)
    a.est_end = now + a.est if a.est is not None else None
    if inst is not None:
        a.inst = inst
        inst.active += 1
        inst.running[a.id] = a
        inst.expires_at = None
        a.nodes = []
    else:
        a.nodes = nodes
        a.charged = True
        q.usage.add(a.usage)
    q.running += 1
    q.run_counts[a.run] = q.run_counts.get(a.run, 0) + 1
    self.org_running += 1
    self.org_run_counts[a.run] = self.org_run_counts.get(a.run, 0) + 1
    self.on_cluster[c.name][a.id] = a
    if a.env and not a.env_declared:
        per = self.undeclared_env.setdefault(a.env, {})
        per[c.name] = per.get(c.name, 0) + 1
    if not c.known:
        self.unknown_capacity_passes += 1
        n = self.unknown_capacity_by_cluster.get(c.name, 0)
        self.unknown_capacity_by_cluster[c.name] = n + 1
    self._admissions += 1
    self._mark_head(q)
    self._touch(c.name)
    self._org_epoch += 1
    self._env_epoch += inst is not None
    q.epoch += 1
    q.tail = -1
    names = c.node_names
    out.append(
        Admitted(
            a.id,
            c.name,
            tuple(names[i] for i in a.nodes if i < len(names)),
            tuple(a.reasons),
        )
    )
