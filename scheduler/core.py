"""The admission pass: one owner per shard, one pass, no locks.

``Scheduler`` holds the whole picture of one shard in memory (every waiting action, every
queue and quota, every cluster's free capacity node by node) and decides, in one
deterministic pass over that snapshot, which actions start where. It does no I/O and
reads no clock: the caller passes ``now``. The scheduler workflow and ``headway
simulate`` drive this same class.

One scheduling cycle, in phases (after Kueue's ``schedule``):

1. order the queues: priority descending; among equals, the one whose next action was
   submitted first; then by name;
2. for each queue, filter clusters to its selector and to the healthy ones;
3. for each waiting action, oldest first, check the gates in order (action, run and
   per-run concurrency, ``max_resources``, the org envelope) - a failed gate is the
   action's reason for this pass;
4. find a cluster with room whose nodes fit every pod (best fit, all or nothing), in
   placement order, that no hold or reservation forbids;
5. admit (reserve counts and resources) or record the reason; a blocked head holds
   (``strict``) or reserves (``backfill``/``easy``) capacity for the rest of the pass;
6. repeat the pass until nothing more starts.

Ordering (which action next) is kept apart from fitting (``fit.ClusterState``); a "no" is
a ``Reason`` returned as data, never an exception.

This module holds ``Scheduler``'s state (``__init__``, by concern) and binds its methods,
which live with their concern: ground truth in ``truth`` and ``snapshot``; the cycle in
``cycle``; policy in ``policy.order``, ``policy.gates``, ``policy.backfill`` and
``policy.projection``; the index layer (answers remembered between events) in ``index``,
whose ``index.validity`` says when a queue's remembered visit stands (and
``index.orders`` when the kept orders do). See
docs/scheduler-internals.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from . import cycle as _cycle
from . import snapshot as _snapshot
from . import truth as _truth
from .common import _INF, _Reservation, _ScanOut, _Step
from .door import Bucket
from .fit import ClusterState
from .index import answers as _index_answers
from .index import classes as _index_classes
from .index import evals as _index_evals
from .index import held as _index_held
from .index import log as _index_log
from .index import orders as _index_orders
from .index import projections as _index_projections
from .index import reservations as _index_reservations
from .index import still as _index_still
from .index import validity as _index_validity
from .index.orders import _order_key as _order_key
from .index.records import _Cands, _Eval, _HeldFlips, _ResvRecord
from .index.records import _Class as _Class
from .index.view import Counts as _Counts
from .model import ClusterSpec, EnvironmentSpec, OrgLimits, QueueSpec
from .policy import backfill as _policy_backfill
from .policy import gates as _policy_gates
from .reasons import Reason
from .resources import Usage
from .truth import Admitted as Admitted
from .truth import Expired as Expired
from .truth import NodeReport as NodeReport
from .truth import PassError as PassError
from .truth import _Action, _EnvInstance, _Queue

__all__ = ["Admitted", "NodeReport", "Scheduler"]

INCREMENTAL = True
"""Default of ``Scheduler(incremental=...)``: False makes every visit the plain loop."""


class Scheduler:
    """The whole state of one shard and the pass that decides over it.

    Args:
        clusters: the fleet known up front (node groups per cluster).
        queues: initial queues.
        org: the tenant's envelope.
        environments: declared reusable environments.
        incremental: False turns every shortcut off (no skipped visits, no decision
            classes: each waiting action decided on its own, oldest first). Decisions
            and reasons are the same either way; the plain form is the reference the
            differential tests compare against. None: the module's ``INCREMENTAL``.
    """

    # ``_walk`` gives a class the answer of one alike but for its estimate, when that
    # fit read no reservation (the tests turn it off to compare the records).
    _SHARE_ALIKE = True

    def __init__(
        self,
        clusters: Sequence[ClusterSpec] = (),
        queues: Sequence[QueueSpec] = (),
        org: OrgLimits | None = None,
        environments: Sequence[EnvironmentSpec] = (),
        incremental: bool | None = None,
    ) -> None:
        self.incremental = INCREMENTAL if incremental is None else incremental
        self._init_truth(org, environments)
        self._init_index()
        for c in clusters:
            self.add_cluster(c)
        for q in queues:
            self.upsert_queue(q)
        self._init_pass_scratch()

    def _init_truth(self, org: OrgLimits | None, environments: Sequence[EnvironmentSpec]) -> None:
        """Ground truth: what happened (``truth.py``), and the counters the control plane
        reads."""
        self.clusters: dict[str, ClusterState] = {}
        self.queues: dict[str, _Queue] = {}
        self.org = org or OrgLimits()
        self.env_specs: dict[str, EnvironmentSpec] = {e.name: e for e in environments}
        self.envs: dict[str, _EnvInstance] = {}
        self.actions: dict[str, _Action] = {}
        self.on_cluster: dict[str, dict[str, _Action]] = {}
        self.org_running = 0
        self.org_run_counts: dict[str, int] = {}
        self.run_accepted: dict[str, int] = {}
        self.tokens: float | None = None
        self.token_time = 0.0
        # Each rate-limited queue's own token bucket (``door.Bucket``), by queue; a queue
        # not here has a full one.
        self.queue_buckets: dict[str, Bucket] = {}
        self.history: dict[str, list[float]] = {}
        self.undeclared_env: dict[str, dict[str, int]] = {}
        self.unknown_capacity_passes = 0
        # The same per cluster, as data for the control plane's metrics and warnings
        # (the core itself neither logs nor exports).
        self.unknown_capacity_by_cluster: dict[str, int] = {}
        self.passes = 0
        self.skipped_visits = 0
        # Visits that decided only the actions appended since the last (``_visit_tail``).
        self.tail_visits = 0
        self._admissions = 0

    def _init_index(self) -> None:
        """The index layer's state kept from pass to pass (``index/``): the capacity log,
        epochs, and remembered answers with what they were made at."""
        # Epochs: bumped whenever something a queue's visit depends on changes.
        # Which clusters' capacity changed, in order: (name, hard). A hard change (health,
        # a report, a new spec) may change more than free capacity. Queues keep their
        # position in it (``_Queue.cap_pos``); ``_cap_base`` counts entries dropped.
        self._cap_log: list[tuple[str, bool]] = []
        self._cap_base = 0
        # Per cluster, the log position of its latest entry; and of the latest hard one
        # (anywhere): what moved since a position, without reading the log.
        self._touched: dict[str, int] = {}
        self._hard_at = -1
        self._selsets: dict[tuple[str, ...], frozenset[str]] = {}
        # ``_changes``' answers within a pass: per log position, the log's end they were
        # read up to, each cluster named since (whether hard), and the answer by selector.
        self._chg_cache: dict[
            int, tuple[int, dict[str, bool], dict[Any, frozenset[str] | set[str] | None]]
        ] = {}
        # ``_evals_still``'s changed clusters that are healthy, which have room for each
        # demand, and their placement order keys, per ``_changes`` answer (by identity)
        # within a pass.
        self._dr_cache: dict[
            int,
            tuple[
                Any,
                list[ClusterState],
                dict[int, list[ClusterState]],
                dict[str, tuple[Any, ...]],
            ],
        ] = {}
        # What the visit in progress depends on (copied to its queue when it ends).
        self._vevals: list[_Eval] = []
        # ``_vevals`` by how they ended (``_merge_evals``' key): a fit that ends like
        # one before joins its record as it is made (see ``_eval``).
        self._vseen: dict[tuple[Any, ...], _Eval] = {}
        self._vrooms: dict[int, set[str]] = {}
        self._vhist = False
        self._vfragile = False
        self._vholds: list[tuple[str, str]] = []
        # Per head, per cluster: the (cluster, head) pair its visits record, kept from
        # pass to pass. A blocked head holds the same clusters every pass: a full pass
        # would otherwise make thousands of pairs that outlive it, and the collector
        # walks each of them (see ``_hold``).
        self._hold_pairs: dict[str, dict[str, tuple[str, str]]] = {}
        # Per (selector, demand): ``_holdable``'s answer, with the capacity log
        # position of the last hard change it stands at.
        self._holdables: dict[tuple[Any, int], tuple[int, list[str]]] = {}
        # Per selector: ``_eligible``'s healthy clusters, with the capacity log position
        # of the last hard change they stand at.
        self._eligibles: dict[Any, tuple[int, list[ClusterState]]] = {}
        self._vresv: _ResvRecord | None = None
        # ``_evals_still``'s fits whose reason changes in place (see ``_flip``), and
        # whether a strict head's fit among them no longer holds clusters.
        self._flips: list[_Eval] = []
        self._unhold = False
        self._env_epoch = 0
        self._org_epoch = 0
        self._hist_epoch = 0
        self._dkeys: dict[Any, int] = {}
        # Demands of unlike pods (a cpu-heavy pod and a memory-heavy one): best fit of
        # such a gang is not monotone in free capacity (another admission can move its
        # first pod elsewhere and make room for the second), so "no room" is never
        # remembered for them within a pass (``_infeasible``, ``_noroom``); answers
        # dated by a cluster's version (one free state) still are.
        self._unlike: set[int] = set()
        self._classes: dict[tuple[Any, ...], int] = {}
        self._could_hold: dict[tuple[int, int], bool] = {}
        # The queues in visiting order, their sort keys in the same order and by queue
        # name, and the queues whose head may have changed since (``_mark_head``): each
        # is put back where its key now goes. None: a policy changed (a priority, a
        # queue added or removed), sort them all again.
        self._qorder: list[_Queue] = []
        self._qkeyed: list[tuple[Any, ...]] = []
        self._qkeys: dict[str, tuple[Any, ...]] = {}
        # (A dict, not a set: processed in the order marked, not by object address. The
        # result is the same either way; the order of work is reproducible too.)
        self._qdirty: dict[_Queue, None] | None = None
        # The queues that were draining when a policy last changed (``upsert_queue``,
        # ``remove_queue`` bump ``_spec_ver``): only a policy change makes one draining,
        # so these are all that ``schedule`` need look at to settle.
        self._spec_ver = 0
        self._draining: list[_Queue] = []
        self._draining_at = -1
        # Work done, counted for ``index.view.counts`` (never read by a decision).
        self._counts = _Counts()

    def _init_pass_scratch(self) -> None:
        """Per-pass scratch (emptied at the start of each ``_pass``) and the remembered
        answers keyed by cluster version or capacity log position."""
        self._holds: dict[str, str] = {}  # cluster -> the head holding it
        self._resv: dict[str, list[_Reservation]] = {}
        self._infeasible: set[tuple[int, int]] = set()
        # Per (cluster, demand): the cluster version at which it last had room, or
        # had none. A version names one free state (``add_cluster`` keeps versions
        # rising), so these answers carry over from pass to pass.
        self._feasible: dict[tuple[int, int], int] = {}
        self._unfit: dict[tuple[int, int], int] = {}
        self._noroom: set[tuple[Any, int]] = set()
        # Per selector: the placement order (no environment); per (selector, demand):
        # the clusters in it with room. Each with the capacity log's end when made:
        # every change to a cluster is logged (``_touch``), so while the log stands
        # still they hold, from pass to pass.
        # (With each cluster's key, as a list in order and by name.)
        self._orders: dict[
            Any, tuple[int, list[ClusterState], list[tuple[Any, ...]], dict[str, tuple[Any, ...]]]
        ] = {}
        self._cands: dict[tuple[Any, int], _Cands] = {}
        # Per (selector, demand): ``_unheld``'s answer for a ``_cands`` list, within a pass.
        self._unheld_cache: dict[
            tuple[Any, int], tuple[list[ClusterState], int, list[ClusterState]]
        ] = {}
        self._fit_cache: dict[tuple[int, int, bool], tuple[Any, ...]] = {}
        # Per (selector, demand, EASY): ``_scan``'s fits, by cluster, with the capacity
        # log position, environment epoch and clock they were found at.
        self._scans: dict[
            tuple[Any, int, bool],
            tuple[int, int, float, dict[str, Any], _ScanOut, dict[str, float], float],
        ] = {}
        # Per (cluster, demand, EASY): the demand placed on the cluster emptied, with
        # the node list it was made for (see ``_empty_fit``).
        self._empties: dict[tuple[int, int, bool], tuple[Any, bool, ClusterState, int]] = {}
        # Per cluster: whether giving back all of ``_releases``' list (the one named)
        # empties it.
        self._rel_empty: dict[int, tuple[Any, bool]] = {}
        # Per cluster: the free totals after each distinct time of ``_releases``' list
        # (the one named), shared by every demand projected there (see ``_steps``).
        self._rel_steps: dict[int, tuple[Any, list[_Step]]] = {}
        # Per demand: its total.
        self._needs: dict[int, Usage] = {}
        # Per cluster: (base, last, latest end, earliest end) of the run of admissions
        # that moved it from version ``base`` to ``last`` with nothing else between, and
        # when those actions are expected to end (see ``_carried``).
        self._chain: dict[int, tuple[int, int, float, float]] = {}
        # Per cluster: (base, last, latest estimated end) of the run of completions that
        # moved it from version ``base`` to ``last`` with nothing else between (see
        # ``_freed``).
        self._fchain: dict[int, tuple[int, int, float]] = {}
        # Per cluster: its releases in time order as of (state, version, env epoch, now),
        # shared by the projections of every demand there (see ``_releases``).
        self._rel_cache: dict[int, tuple[Any, ...]] = {}
        # Until when on the clock what the visit in progress read stands (the earliest
        # of the windows noted by ``_note_window``; projections return theirs as data).
        self._horizon = _INF
        # ``_horizon`` per cluster read (see ``_Queue.hz``), for the visit in progress.
        self._vhz: dict[str, float] = {}
        # Per pass: a ``_changes`` answer (by identity) joined with clusters whose
        # answers expired, shared by the queues that have both alike.
        self._exp_cache: dict[tuple[int, frozenset[str]], tuple[Any, set[str]]] = {}
        # Per pass: ``_all_held``'s answers, by (selector, number of holds).
        self._held_cache: dict[tuple[Any, int], bool] = {}
        # Per pass: ``_held_still``'s verdict on the fits, by (selector, fits' summary).
        self._hsig_cache: dict[tuple[Any, tuple[int, ...]], bool] = {}
        # Per pass: where that verdict failed, how the answers moved (``_held_flips``),
        # by (selector, fits' summary, changed set's identity), with the changed set.
        self._hflip_cache: dict[
            tuple[Any, tuple[int, ...], int], tuple[Any, _HeldFlips | None]
        ] = {}
        self._hsig_intern: dict[tuple[int, ...], tuple[int, ...]] = {}
        # Per pass: ``q.stale`` joined with a changed set, by their identities (queues
        # that stood alike share the answer).
        self._stale_cache: dict[tuple[int, int], tuple[Any, Any, frozenset[str]]] = {}
        self._stale_last: tuple[Any, Any, frozenset[str]] | None = None
        # Per pass: ``_soft_since(pos, 64)`` by (pos, log end), for ``_any_room``.
        self._moved_cache: dict[tuple[int, int], set[str] | None] = {}
        # Per pass: ``_held_still``'s answer for a reservation record, by what the
        # answer reads (see there).
        self._resv_cache: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self._effects: list[tuple[Any, ...]] = []
        self._prev_effects: list[tuple[Any, ...]] = []
        self._diverged: int | None = None
        # What the last ``_consider`` that gave a reason read (see there).
        self._cnames: frozenset[str] | None = None
        self._cgate: Reason | None = None
        self._crec: _Eval | None = None
        self._cread = False

    # truth
    add_cluster = _truth.add_cluster
    _retake = _truth._retake
    set_cluster_health = _truth.set_cluster_health
    report_capacity = _truth.report_capacity
    upsert_queue = _truth.upsert_queue
    update_queue = _truth.update_queue
    remove_queue = _truth.remove_queue
    set_org = _truth.set_org
    _cluster = _truth._cluster
    estimate = _truth.estimate
    _keep_queue_bucket = _truth._keep_queue_bucket
    submit = _truth.submit
    cancel = _truth.cancel
    finish = _truth.finish
    expire_environments = _truth.expire_environments
    expire_waiting = _truth.expire_waiting
    _next_expiry = _truth._next_expiry
    next_wakeup = _truth.next_wakeup
    _settle_status = _truth._settle_status
    state = _truth.state
    reason = _truth.reason
    reasons = _truth.reasons
    waiting_count = _truth.waiting_count
    running_count = _truth.running_count
    queue_stats = _truth.queue_stats
    waiting_reasons = _truth.waiting_reasons

    # snapshot
    to_snapshot = _snapshot.to_snapshot
    from_snapshot = staticmethod(_snapshot.from_snapshot)

    # index.log
    _touch = _index_log._touch
    invalidate = _index_log.invalidate
    _changes = _index_log._changes
    _selset = _index_log._selset
    _effect = _index_log._effect
    _signature = _index_log._signature
    _soft_since = _index_log._soft_since

    # index.still
    _classes_as_now = _index_still._classes_as_now
    _visit_tail = _index_still._visit_tail
    _still = _index_still._still
    _all_held = _index_still._all_held
    _any_room = _index_still._any_room

    # index.held
    _held_still = _index_held._held_still
    _held_flips = _index_held._held_flips
    _held_flips_apply = _index_held._held_flips_apply
    _held_flip = _index_held._held_flip
    _resv_answer = _index_held._resv_answer
    _held_summary = _index_held._held_summary
    _new_head = _index_held._new_head
    _views_same = _index_held._views_same
    _room = _index_held._room
    _view = _index_held._view
    _views_before = _index_held._views_before
    _all_read = _index_held._all_read
    _resv_now = _index_held._resv_now
    _resv_move = _index_held._resv_move

    # index.evals
    _evals_still = _index_evals._evals_still
    _any_allowed = _index_evals._any_allowed
    _first_of = _index_evals._first_of
    _alone = staticmethod(_index_evals._alone)
    _flip = staticmethod(_index_evals._flip)

    # index.classes
    _dkey = _index_classes._dkey
    _classify = _index_classes._classify
    _could = _index_classes._could
    _start_visit_records = _index_classes._start_visit_records
    _memo_loop = _index_classes._memo_loop
    _walk = _index_classes._walk
    _carry = _index_classes._carry
    _build_classes = _index_classes._build_classes
    _enlist = _index_classes._enlist
    _flush = _index_classes._flush
    _unlist = _index_classes._unlist
    _eval = _index_classes._eval

    # index.answers
    _eligible = _index_answers._eligible
    _eligible_of = _index_answers._eligible_of
    _cands_of = _index_answers._cands_of
    _unheld = _index_answers._unheld
    _allowed = _index_answers._allowed

    # index.validity
    _kept_since_hard = _index_validity._kept_since_hard
    _projection_stands = _index_validity._projection_stands
    _note_window = _index_validity._note_window
    _note_horizons = _index_validity._note_horizons

    # index.orders (the rules: policy.order)
    _mark_head = _index_orders._mark_head
    _reorder = _index_orders._reorder
    _placement_order = _index_orders._placement_order
    _base_order = _index_orders._base_order

    # policy.gates
    _gate = _policy_gates._gate
    _use_up = staticmethod(_policy_gates._use_up)

    # policy.backfill
    _block = _policy_backfill._block
    _reserve = _policy_backfill._reserve

    # index.reservations (the rules: policy.backfill)
    _holdable = _index_reservations._holdable
    _hold_all = _index_reservations._hold_all
    _hold = _index_reservations._hold
    _reserve_on = _index_reservations._reserve_on
    _scan = _index_reservations._scan
    _scanned = _index_reservations._scanned

    # index.projections (the rules: policy.projection)
    _earliest_fit = _index_projections._earliest_fit
    _carried = _index_projections._carried
    _freed = _index_projections._freed
    _chain_free = _index_projections._chain_free
    _chain_admit = _index_projections._chain_admit
    _project = _index_projections._project
    _releases = _index_projections._releases
    _steps = _index_projections._steps
    _empty_fit = _index_projections._empty_fit

    # cycle
    schedule = _cycle.schedule
    _pass = _cycle._pass
    _visit = _cycle._visit
    _consider = _cycle._consider
    _admit = _cycle._admit
