"""One fault run: the real Temporal dev server, the control-plane worker and one cluster
worker per fleet cluster (simulated by default), each a separate process; a workload
submitted while seeded ``kill -9`` faults hit them; then the audit.

The harness only submits, kills, restarts and reads records; it never repairs anything.
A process that dies on its own is started again (as a Deployment would) and reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headway import protocol
from headway.cli._common import free_port
from headway.protocol import DemandRequest, SubmitRequest
from headway.scheduler.scenario import Fleet, parse_fleet
from headway.workflows import client as hw
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from .audit import Finding, History, PodLine, Report, audit, node_capacities
from .procs import Supervisor, freeze_code, headway_argv, server_command, start_server
from .records import (
    read_histories,
    read_pod_logs,
    replay_failures,
    retrying,
    scheduler_view,
    store_leases,
    store_rows,
)
from .workload import FLEET_YAML, Fault, Planned, make_workload, plan_faults

__all__ = ["SEED_ENV", "RunConfig", "RunResult", "choose_seed", "fault_run", "summaries"]

SEED_ENV = "HEADWAY_FAULT_SEED"
POD_LOG_ENV = "HEADWAY_POD_LOG"
#: One line per run, printed again in pytest's terminal summary (see conftest.py).
summaries: list[str] = []


def choose_seed() -> int:
    """The seed from ``HEADWAY_FAULT_SEED``, else a fresh one; printed either way so any
    run can be replayed."""
    raw = os.environ.get(SEED_ENV)
    seed = int(raw) if raw else random.SystemRandom().randrange(1, 2**31)
    print(f"\nfault seed {seed} (replay: {SEED_ENV}={seed})", file=sys.stderr, flush=True)
    return seed


@dataclass
class RunConfig:
    seed: int
    actions: int = 310
    faults: int | None = None  # None: 6-8, from the seed
    submit_s: float = 30.0
    fault_window_s: float = 70.0
    #: Liveness bound: every action must have ended this long after the last fault.
    recovery_deadline_s: float = 180.0
    #: After the last action ended, the scheduler and the store must be back to zero.
    settle_deadline_s: float = 45.0
    tenant: str = "default"
    submitters: int = 4
    #: The fleet (clusters and the queues' caps) of the run.
    fleet_yaml: str = FLEET_YAML
    #: A cluster worker's backend arguments, by cluster name and data directory
    #: (default: the simulated backend, its state kept in the data directory).
    backend_args: Callable[[str, Path], list[str]] | None = None
    #: The workload and the faults, from the seed's generator (default: the sim run's).
    plan: Callable[[random.Random, list[str]], tuple[list[Planned], list[Fault]]] | None = None
    #: Called before a fault's target is killed (to wait for the moment the fault needs).
    before: Callable[[Fault], Awaitable[None]] | None = None
    #: Called while a fault's target is down (a node lost meanwhile, ...).
    while_down: Callable[[Fault], Awaitable[None]] | None = None
    #: Whether every action should succeed (nothing in the run should fail one).
    expect_success: bool = True
    #: The run's own checks beyond the audit (e.g. which actions a lost node may fail),
    #: given the result before it is summarized.
    judge: Callable[[RunResult], list[Finding]] | None = None


@dataclass
class RunResult:
    config: RunConfig
    data_dir: Path
    planned: list[Planned]
    faults: list[Fault]
    fault_times: list[tuple[float, str]]  # (kill time, target) as executed
    report: Report
    extra: list[Finding]
    started_at: float
    all_ended_at: float | None
    recovery_s: float | None
    run_s: float | None
    submit_retries: int
    already_started: int
    final: dict[str, Any] = field(default_factory=dict)
    histories: dict[str, History] = field(default_factory=dict)
    pod_lines: list[PodLine] = field(default_factory=list)

    @property
    def findings(self) -> list[Finding]:
        return self.report.findings + self.extra

    def figures(self) -> dict[str, Any]:
        kinds = Counter(f.kind for f in self.faults)
        return {
            "seed": self.config.seed,
            **self.report.figures(),
            "faults": dict(kinds),
            "faults_during_submission": sum(f.during_submission for f in self.faults),
            "recovery_s": None if self.recovery_s is None else round(self.recovery_s, 1),
            "run_s": None if self.run_s is None else round(self.run_s, 1),
            "submit_retries": self.submit_retries,
            "already_started_on_retry": self.already_started,
            "other_findings": len(self.extra),
        }

    def summary(self) -> str:
        f = self.figures()
        return (
            f"seed={f['seed']} actions={f['actions']} faults={f['faults']}"
            f" (during submission {f['faults_during_submission']})"
            f" ended_once={f['ended_once']} lost={f['lost']} twice={f['twice']}"
            f" queue_overshoots={f['queue_overshoots']} node_overshoots={f['node_overshoots']}"
            f" states={f['states']} recovery_s={f['recovery_s']} run_s={f['run_s']}"
            f" findings={len(self.findings)} data={self.data_dir}"
        )


def _request(p: Planned, tenant: str) -> SubmitRequest:
    return SubmitRequest(
        action_id=p.action_id,
        queue=p.queue,
        tenant=tenant,
        run=p.run,
        task=p.queue,
        demand=DemandRequest(
            resources=p.resources(), replicas=p.replicas if p.replicas > 1 else None
        ),
        duration_s=p.duration_s,
        estimate_s=p.duration_s,
    )


def _sim_args(name: str, data_dir: Path) -> list[str]:
    # The simulated cluster keeps its pods in a state directory, so a kill -9 of its
    # worker is a worker failure, not the whole cluster vanishing with it.
    return ["--backend", "sim", "--state-dir", str(data_dir / "sim-state" / name)]


class _Run:
    def __init__(self, cfg: RunConfig, data_dir: Path, fleet: Fleet, fleet_path: Path) -> None:
        self.cfg = cfg
        self.data_dir = data_dir
        self.fleet = fleet
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        code = freeze_code(data_dir / "code")
        self.sup = Supervisor(data_dir, env={"PYTHONPATH": str(code)})
        self.pod_logs: list[Path] = []
        self.clusters = [c.name for c in fleet.clusters]
        common = ["--address", self.address, "--tenant", cfg.tenant]
        self.sup.add("temporal-server", server_command(data_dir, self.port))
        self.db = data_dir / "headway.db"
        self.sup.add(
            "control-plane",
            headway_argv(
                *common,
                "worker",
                "control-plane",
                "--fleet",
                str(fleet_path),
                "--database-url",
                f"sqlite:///{self.db}",
            ),
        )
        for name in self.clusters:
            log = data_dir / f"pods-{name}.jsonl"
            self.pod_logs.append(log)
            self.sup.add(
                f"cluster-{name}",
                headway_argv(
                    *common,
                    "worker",
                    "cluster",
                    "--name",
                    name,
                    "--fleet",
                    str(fleet_path),
                    *(cfg.backend_args or _sim_args)(name, data_dir),
                ),
                # The log is the backend's own record, appended by every incarnation.
                env={POD_LOG_ENV: str(log)},
            )
        self.acked: dict[str, float] = {}
        self.submit_retries = 0
        self.already_started = 0
        self.fault_times: list[tuple[float, str]] = []
        self.extra: list[Finding] = []
        self.restarting: set[str] = set()
        #: A workflow of the run fails every task (nondeterminism): nothing will move.
        self.wedged = False

    # --- start-up -----------------------------------------------------------------------

    async def start(self) -> Client:
        await asyncio.to_thread(start_server, self.sup, "temporal-server", self.port)
        for name in self.sup.procs:
            if name != "temporal-server":
                self.sup.start(name)
        client = await retrying(
            lambda: Client.connect(self.address, data_converter=protocol.data_converter())
        )
        await self._wait_pollers(client)
        await hw.ensure_scheduler(client, self.cfg.tenant, list(self.fleet.clusters))
        for spec in self.fleet.queues:
            await hw.upsert_queue(
                client, self.cfg.tenant, spec.to_dict(), list(self.fleet.clusters)
            )
        return client

    async def _wait_pollers(self, client: Client, timeout_s: float = 120.0) -> None:
        wanted = [(protocol.CONTROL_TASK_QUEUE, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)] + [
            (protocol.cluster_task_queue(c), TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
            for c in self.clusters
        ]
        deadline = time.monotonic() + timeout_s
        while wanted:
            dead = [p for p in self.sup.procs.values() if p.popen is not None and not p.alive]
            if dead:
                raise RuntimeError(f"{dead[0].name} exited at start:\n{dead[0].tail()}")
            queue, kind = wanted[0]
            resp = await client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=client.namespace,
                    task_queue=TaskQueue(name=queue),
                    task_queue_type=kind,
                )
            )
            if resp.pollers:
                wanted.pop(0)
                continue
            if time.monotonic() > deadline:
                raise RuntimeError(f"nobody polls {queue}; logs in {self.data_dir / 'logs'}")
            await asyncio.sleep(0.2)

    # --- the three concurrent parts -----------------------------------------------------

    async def submit_all(self, client: Client, planned: list[Planned], t0: float) -> None:
        queue: asyncio.Queue[tuple[int, Planned]] = asyncio.Queue()
        for i, p in enumerate(planned):
            queue.put_nowait((i, p))
        pace = self.cfg.submit_s / max(1, len(planned))

        async def worker() -> None:
            while not queue.empty():
                i, p = queue.get_nowait()
                due = t0 + i * pace
                await asyncio.sleep(max(0.0, due - time.time()))
                req = _request(p, self.cfg.tenant)
                while True:
                    try:
                        sub = await hw.submit_action(client, req)
                    except hw.ActionConflictError:
                        raise  # the harness submitted one id twice differently: its bug
                    except Exception:
                        # The server is down (a fault): try again, as a user's retry would.
                        self.submit_retries += 1
                        await asyncio.sleep(0.5)
                        continue
                    if not sub.created:
                        # An earlier try reached the server, its answer did not reach us.
                        self.already_started += 1
                    break
                self.acked[p.action_id] = time.time()

        await asyncio.gather(*(worker() for _ in range(self.cfg.submitters)))

    async def inject(self, faults: list[Fault], t0: float) -> None:
        for f in faults:
            await asyncio.sleep(max(0.0, t0 + f.at_s - time.time()))
            if self.cfg.before is not None:
                await self.cfg.before(f)
            self.restarting.add(f.target)
            try:
                await asyncio.to_thread(self.sup.kill9, f.target)
                self.fault_times.append((time.time(), f.target))
                print(
                    f"  fault at +{time.time() - t0:5.1f}s: kill -9 {f.target}, down {f.down_s}s",
                    file=sys.stderr,
                    flush=True,
                )
                if self.cfg.while_down is not None:
                    await self.cfg.while_down(f)
                await asyncio.sleep(f.down_s)
                if f.kind == "server":
                    await asyncio.to_thread(start_server, self.sup, f.target, self.port)
                else:
                    self.sup.start(f.target)
            finally:
                self.restarting.discard(f.target)

    async def watch_exits(self, stop: asyncio.Event) -> None:
        """Start again any process that exits without being killed, and report it."""
        while not stop.is_set():
            for proc in self.sup.unplanned_exits():
                if proc.name in self.restarting:
                    continue
                self.extra.append(
                    Finding(
                        "process-exited",
                        proc.name,
                        f"exited on its own (code {proc.popen.returncode if proc.popen else None})"
                        f"; log {proc.log} ends:\n{proc.tail(15)}",
                    )
                )
                if proc.name == "temporal-server":
                    await asyncio.to_thread(start_server, self.sup, proc.name, self.port)
                else:
                    self.sup.start(proc.name)
            await asyncio.sleep(0.5)

    async def wait_all_ended(self, client: Client, n: int, deadline: float) -> float | None:
        """Until Temporal counts ``n`` action workflows and none running; the time it saw
        that, or None at the deadline."""
        base = f"WorkflowType='{protocol.ACTION_WORKFLOW}'"
        checked = time.time()
        while time.time() < deadline:
            if time.time() - checked >= 5.0:
                checked = time.time()
                if _nondeterminism(self.sup):
                    # A workflow that cannot replay fails every task from now on: waiting
                    # out the deadline would only cost CI minutes.
                    self.wedged = True
                    return None
            try:
                total = (await client.count_workflows(base)).count
                running = (
                    await client.count_workflows(f"{base} AND ExecutionStatus='Running'")
                ).count
            except Exception:
                await asyncio.sleep(1.0)
                continue
            if len(self.acked) >= n and total >= n and running == 0:
                return time.time()
            await asyncio.sleep(1.0)
        return None

    def _view_problems(self, queues: dict[str, Any], fleet: dict[str, Any]) -> list[str]:
        """Where the scheduler's own accounting says more than the fleet or a queue allows
        (a stale or doubled capacity report, a release counted twice)."""
        out = []
        for spec in self.fleet.clusters:
            total_gpu = sum(g.count * g.shape.gpu for g in spec.node_groups)
            total_cpu = sum(g.count * g.shape.cpu for g in spec.node_groups)
            nodes = sum(g.count for g in spec.node_groups)
            cap = fleet.get("capacity", {}).get(spec.name)
            if not cap or not cap.get("known"):
                continue
            if cap["free_gpu"] > total_gpu or cap["free_cpu_m"] > total_cpu:
                out.append(
                    f"{spec.name}: the view has {cap['free_gpu']} GPUs and {cap['free_cpu_m']}m"
                    f" free of {total_gpu} and {total_cpu}m (incarnation {cap.get('incarnation')},"
                    f" sequence {cap.get('sequence')})"
                )
            if cap["nodes"] > nodes:  # fewer is a node lost, and true
                out.append(f"{spec.name}: the view has {cap['nodes']} nodes of {nodes}")
        for q in self.fleet.queues:
            st = queues.get(q.name)
            if st is None:
                out.append(f"queue {q.name} is missing")
                continue
            if q.action_concurrency is not None and st["running"] > q.action_concurrency:
                out.append(f"queue {q.name}: running {st['running']} > {q.action_concurrency}")
            if q.run_concurrency is not None and st["runs"] > q.run_concurrency:
                out.append(f"queue {q.name}: runs {st['runs']} > {q.run_concurrency}")
            quota, usage = q.max_resources, st["usage"]
            if quota is not None:
                if quota.cpu is not None and usage["cpu_m"] > quota.cpu:
                    out.append(f"queue {q.name}: cpu {usage['cpu_m']}m > {quota.cpu}m")
                if quota.memory is not None and usage["memory"] > quota.memory:
                    out.append(f"queue {q.name}: memory {usage['memory']} > {quota.memory}")
                if quota.gpu is not None and quota.gpu_type is None and usage["gpu"] > quota.gpu:
                    out.append(f"queue {q.name}: gpu {usage['gpu']} > {quota.gpu}")
            if min(st["running"], st["waiting"], *usage.values()) < 0:
                out.append(f"queue {q.name}: negative accounting {st}")
        return out

    async def sample_views(self, client: Client, stop: asyncio.Event) -> None:
        """Every two seconds or so, the scheduler's own view of queues and capacity; each
        distinct problem it shows is a finding (its first sighting)."""
        seen: set[str] = set()
        while not stop.is_set():
            try:
                queues = await asyncio.wait_for(hw.get_queues(client, self.cfg.tenant), 5)
                fleet = await asyncio.wait_for(hw.get_fleet(client, self.cfg.tenant), 5)
            except Exception:
                pass  # down under a fault: the next sample
            else:
                for problem in self._view_problems(queues, fleet):
                    key = re.sub(r"\d+", "#", problem)  # one finding per kind of problem
                    if key not in seen:
                        seen.add(key)
                        self.extra.append(
                            Finding("scheduler-view", f"at {time.time():.3f}", problem)
                        )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 2.0)

    async def settle(self, client: Client, deadline: float) -> tuple[dict[str, Any], list[str]]:
        """Until the scheduler holds nothing (no action in flight or waiting, no usage)
        and the store has released every lease; what is left at the deadline."""
        view: dict[str, Any] = {}
        problems: list[str] = ["never read"]
        while True:
            try:
                view = await scheduler_view(client, self.cfg.tenant)
                view["fleet"] = await retrying(
                    lambda: hw.get_fleet(client, self.cfg.tenant), timeout_s=15
                )
                view["store"] = store_leases(self.db, self.cfg.tenant)
            except Exception as exc:
                problems = [f"could not read the scheduler or the store: {exc}"]
            else:
                problems = []
                for name, q in view["queues"].items():
                    usage = {k: v for k, v in q["usage"].items() if v}
                    if q["running"] or q["waiting"] or usage or q.get("runs"):
                        problems.append(
                            f"queue {name}: running={q['running']} waiting={q['waiting']}"
                            f" runs={q.get('runs')} usage={usage}"
                        )
                # An idle fleet: the view converges to every node free.
                for spec in self.fleet.clusters:
                    cap = view["fleet"].get("capacity", {}).get(spec.name) or {}
                    total_gpu = sum(g.count * g.shape.gpu for g in spec.node_groups)
                    total_cpu = sum(g.count * g.shape.cpu for g in spec.node_groups)
                    if (cap.get("free_gpu"), cap.get("free_cpu_m")) != (total_gpu, total_cpu):
                        problems.append(
                            f"capacity view of {spec.name} on an idle fleet: {cap}, expected"
                            f" {total_gpu} GPUs and {total_cpu}m free"
                        )
                stats = view["stats"]
                if stats.get("inflight_dispatches"):
                    problems.append(f"inflight_dispatches={stats['inflight_dispatches']}")
                # A lease whose end the scheduler collected stays until a later sync
                # confirms it was consumed (by design); one not done is held for good.
                if view["store"]["not_done"]:
                    problems.append(f"store still holds {view['store']}")
            if not problems or time.time() >= deadline:
                return view, problems
            await asyncio.sleep(1.0)

    async def held_by_scheduler(self, client: Client, final: dict[str, Any]) -> list[Finding]:
        """The actions the scheduler's core still counts running, each with what its own
        workflow says: one that ended holds its queue's slot and quota for good."""
        handle = client.get_workflow_handle(protocol.scheduler_workflow_id(self.cfg.tenant))
        try:
            snap = await retrying(lambda: handle.query("snapshot"), timeout_s=20)
        except Exception as exc:
            return [Finding("not-released", "scheduler", f"cannot read its snapshot: {exc!r}")]
        core = snap["snapshot"]
        final["scheduler_clusters"] = [
            {"name": c["spec"]["name"], "known": c["known"], "free": c["free"]}
            for c in core.get("clusters", [])
        ]
        out = []
        running = [(r[0][0], r[1], r[3]) for r in core.get("running", [])]
        final["scheduler_running"] = running
        for action_id, cluster, start in running:
            wid = protocol.action_workflow_id(self.cfg.tenant, action_id)
            try:
                d = await client.get_workflow_handle(wid).describe()
                seen = f"its workflow is {d.status.name if d.status else '?'}"
                if d.close_time is not None:
                    seen += f", closed at {d.close_time.timestamp():.3f}"
            except Exception as exc:
                seen = f"its workflow cannot be described ({exc!r})"
            out.append(
                Finding(
                    "held-by-scheduler",
                    action_id,
                    f"the scheduler counts it running on {cluster} since {start}; {seen}",
                )
            )
        return out

    async def diagnose(self, client: Client, ids: list[str]) -> tuple[str, list[Finding]]:
        """What the given actions' workflows and the scheduler say of them: counts by
        (workflow state, scheduler state and reason), and a finding for each action the
        two disagree on (admitted by the scheduler but never told, ended but still held).
        """
        groups: Counter[str] = Counter()
        odd: list[Finding] = []
        sched = client.get_workflow_handle(protocol.scheduler_workflow_id(self.cfg.tenant))
        try:
            await asyncio.wait_for(sched.query("stats"), 10)
            answers = True
        except Exception:
            answers = False  # wedged or gone: do not spend a timeout per action on it
        for action_id in ids[:80]:
            try:
                st = await asyncio.wait_for(hw.action_state(client, self.cfg.tenant, action_id), 5)
                wf = st.state
            except Exception as exc:
                wf = f"unqueryable ({type(exc).__name__})"
            try:
                if not answers:
                    raise TimeoutError("the scheduler did not answer its stats query")
                why = await asyncio.wait_for(hw.why(client, self.cfg.tenant, action_id), 5)
                said = f"{why.get('state')}/{why.get('reason')}"
            except Exception as exc:
                said = f"unqueryable ({type(exc).__name__})"
            groups[f"workflow {wf}, scheduler {said}"] += 1
            if said.startswith("running") and wf in ("waiting", "submitting"):
                odd.append(
                    Finding(
                        "admission-undelivered",
                        action_id,
                        f"the scheduler counts it running ({said}); its workflow is {wf}",
                    )
                )
            if said.startswith("running") and wf in ("succeeded", "failed", "cancelled"):
                odd.append(
                    Finding(
                        "end-not-collected",
                        action_id,
                        f"its workflow {wf}; the scheduler still counts it running",
                    )
                )
        lines = [f"{n} x {what}" for what, n in groups.most_common()]
        try:
            view = await asyncio.wait_for(scheduler_view(client, self.cfg.tenant), 15)
            lines.append(f"scheduler: {json.dumps(view, default=str)[:3000]}")
        except Exception as exc:
            lines.append(f"scheduler: cannot query: {exc!r}")
        return "\n".join(lines), odd


async def fault_run(cfg: RunConfig, data_dir: Path) -> RunResult:
    """Run the stack under faults, wait for all work to end, and audit the records."""
    rng = random.Random(cfg.seed)
    fleet_path = data_dir / "fleet.yaml"
    fleet_path.write_text(cfg.fleet_yaml)
    fleet = parse_fleet(cfg.fleet_yaml, str(fleet_path))
    clusters = [c.name for c in fleet.clusters]
    if cfg.plan is not None:
        planned, faults = cfg.plan(rng, clusters)
    else:
        planned = make_workload(rng, cfg.actions)
        faults = plan_faults(
            rng,
            clusters,
            count=cfg.faults or rng.randint(6, 8),
            submit_s=cfg.submit_s,
            window_s=cfg.fault_window_s,
        )
    print(
        f"fault plan (seed {cfg.seed}): {len(planned)} actions over {cfg.submit_s}s; "
        + ", ".join(f"+{f.at_s}s {f.target} (down {f.down_s}s)" for f in faults),
        file=sys.stderr,
        flush=True,
    )
    run = _Run(cfg, data_dir, fleet, fleet_path)
    stop = asyncio.Event()
    started_at = time.time()
    final: dict[str, Any] = {}
    try:
        client = await run.start()
        watcher = asyncio.create_task(run.watch_exits(stop))
        sampler = asyncio.create_task(run.sample_views(client, stop))
        t0 = time.time()
        await asyncio.gather(run.submit_all(client, planned, t0), run.inject(faults, t0))
        last_fault = max((t for t, _ in run.fault_times), default=t0)
        seen_end = await run.wait_all_ended(
            client, len(planned), last_fault + cfg.recovery_deadline_s
        )
        if seen_end is None:
            pending = [
                p.action_id
                for p in planned
                if p.action_id not in run.acked
                or not await _closed(client, cfg.tenant, p.action_id)
            ]
            why, odd = await run.diagnose(client, pending)
            run.extra.append(
                Finding(
                    "stuck",
                    f"{len(pending)} action(s)",
                    (
                        "not ended, and never will: a workflow fails every task"
                        if run.wedged
                        else f"not ended {cfg.recovery_deadline_s}s after the last fault"
                    )
                    + f": {pending[:30]}\n{why}",
                )
            )
            run.extra += odd
        settle_s = 5.0 if run.wedged else cfg.settle_deadline_s
        view, problems = await run.settle(client, time.time() + settle_s)
        final = view
        for problem in problems:
            run.extra.append(Finding("not-released", "scheduler/store", problem))
        if problems:
            final["store_rows"] = store_rows(run.db, cfg.tenant)
            run.extra += await run.held_by_scheduler(client, final)
        stop.set()
        await watcher
        await sampler
        # Workers stop before the pod log is read (nothing appends meanwhile); the server
        # stays up until the histories are read.
        for name in run.sup.procs:
            if name != "temporal-server":
                await asyncio.to_thread(run.sup.stop, name)
        histories = await read_histories(client, cfg.tenant, [p.action_id for p in planned])
        ids = [p.action_id for p in planned]
        for wid, failure in await replay_failures(client, ids, cfg.tenant):
            run.extra.append(Finding("replay-nondeterminism", wid, failure))
    finally:
        stop.set()
        await asyncio.to_thread(run.sup.stop_all)
    pod_lines, torn = read_pod_logs(run.pod_logs)
    by_id = {p.action_id: p for p in planned}
    report = audit(
        planned,
        histories,
        pod_lines,
        queues={q.name: q for q in fleet.queues},
        nodes=node_capacities(fleet.clusters),
        torn_lines=len(torn),
        expect_success=cfg.expect_success,
    )
    closes = [h.closed_at for h in histories.values() if h.closed_at is not None]
    all_ended_at = max(closes) if closes and not report.lost else None
    last_kill = max((t for t, _ in run.fault_times), default=None)
    result = RunResult(
        config=cfg,
        data_dir=data_dir,
        planned=planned,
        faults=faults,
        fault_times=run.fault_times,
        report=report,
        extra=run.extra,
        started_at=started_at,
        all_ended_at=all_ended_at,
        recovery_s=(
            all_ended_at - last_kill if all_ended_at is not None and last_kill is not None else None
        ),
        run_s=all_ended_at - started_at if all_ended_at is not None else None,
        submit_retries=run.submit_retries,
        already_started=run.already_started,
        final=final,
        histories=histories,
        pod_lines=pod_lines,
    )
    result.extra += _nondeterminism(run.sup)
    if cfg.judge is not None:
        result.extra += cfg.judge(result)
    (data_dir / "report.json").write_text(
        json.dumps(
            {
                "figures": result.figures(),
                "faults": [f.__dict__ for f in faults],
                "fault_times": run.fault_times,
                "events": [e.__dict__ for e in run.sup.events],
                "findings": [str(f) for f in result.findings],
                "final": final,
                # Per action, what Temporal recorded: the evidence behind a finding.
                "actions": {
                    a: {
                        "queue": by_id[a].queue,
                        "run": by_id[a].run,
                        "replicas": by_id[a].replicas,
                        "acked": run.acked.get(a),
                        **h.__dict__,
                        "dispatches": [d.__dict__ for d in h.dispatches],
                    }
                    for a, h in sorted(histories.items())
                },
            },
            indent=1,
            default=str,
        )
    )
    summaries.append(result.summary())
    print(result.summary(), file=sys.stderr, flush=True)
    return result


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _nondeterminism(sup: Supervisor) -> list[Finding]:
    """A workflow whose replay does not take its recorded path is wedged for good (every
    task fails the same way): one finding per process log that says so, with the run id
    and the first message."""
    out = []
    for proc in sup.procs.values():
        if proc.name == "temporal-server":
            continue  # it logs the workers' failures again
        try:
            text = proc.log.read_text(errors="replace")
        except OSError:
            continue
        hits = [_ANSI.sub("", x) for x in text.splitlines() if "Nondeterminism" in x]
        if hits:
            runs = sorted(set(re.findall(r"run_id=(\S+)", "\n".join(hits))))
            first = re.search(r"message: \"([^\"]*)", hits[0])
            out.append(
                Finding(
                    "nondeterminism",
                    proc.name,
                    f"{len(hits)} failed workflow task(s) of run(s) {runs}:"
                    f" {first.group(1) if first else hits[0][:300]} (log {proc.log})",
                )
            )
    return out


async def _closed(client: Client, tenant: str, action_id: str) -> bool:
    try:
        d = await client.get_workflow_handle(
            protocol.action_workflow_id(tenant, action_id)
        ).describe()
    except Exception:
        return False
    return d.close_time is not None
