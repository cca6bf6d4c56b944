"""The carried state: ``to_snapshot`` and ``from_snapshot`` (ground truth only, nothing
remembered; the format crosses continue-as-new, so it changes only compatibly).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .door import Bucket
from .fit import sort_pods
from .model import ActionSpec, ClusterSpec, DemandKind, EnvironmentSpec, OrgLimits, QueueSpec
from .resources import Pod
from .truth import _Action, _EnvInstance, _pod_row, _row_pod

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from .core import Scheduler


def to_snapshot(self: Scheduler) -> dict[str, Any]:
    """The whole state as plain JSON types, compact enough to carry across
    continue-as-new: demands are interned in a table and actions are rows."""
    demand_ix: dict[tuple[Pod, ...], int] = {}
    demands: list[list[list[Any]]] = []

    def dix(pods: tuple[Pod, ...]) -> int:
        k = demand_ix.get(pods)
        if k is None:
            k = demand_ix[pods] = len(demands)
            demands.append([_pod_row(p) for p in pods])
        return k

    for q in self.queues.values():
        self._flush(q)

    def row(a: _Action) -> list[Any]:
        sp = a.spec
        return [
            sp.id,
            sp.queue,
            sp.run,
            sp.task,
            sp.submit,
            sp.seq,
            sp.estimate,
            sp.environment,
            sp.kind.value,
            dix(a.pods),
            a.reasons,
            a.last,
            dict(sp.meta) if sp.meta else None,
        ]

    waiting = [row(a) for q in self.queues.values() for a in q.waiting]
    running = []
    for a in self.actions.values():
        if a.state == "running":
            running.append(
                [
                    row(a),
                    a.cluster,
                    a.nodes,
                    a.start,
                    a.est,
                    a.est_end,
                    a.charged,
                    a.inst.spec.name if a.inst is not None else None,
                ]
            )
    clusters = [
        {
            "spec": c.spec.to_dict(),
            "healthy": c.healthy,
            "known": c.known,
            "names": c.node_names,
            "caps": [_pod_row(p) for p in c.cap],
            "free": [c.fcpu, c.fmem, c.feph, c.fgpu],
        }
        for c in self.clusters.values()
    ]
    envs = [
        {
            "name": n,
            "cluster": i.cluster,
            "nodes": i.nodes,
            "queue": i.queue,
            "expires_at": i.expires_at,
        }
        for n, i in self.envs.items()
    ]
    return {
        "v": 1,
        "clusters": clusters,
        "queues": [q.spec.to_dict() for q in self.queues.values()],
        "org": self.org.to_dict(),
        "env_specs": [e.to_dict() for e in self.env_specs.values()],
        "envs": envs,
        "demands": demands,
        "waiting": waiting,
        "running": running,
        "run_accepted": self.run_accepted,
        "tokens": self.tokens,
        "token_time": self.token_time,
        "queue_tokens": {n: [b.tokens, b.at] for n, b in sorted(self.queue_buckets.items())},
        "history": self.history,
        "unknown_capacity_passes": self.unknown_capacity_passes,
        # Only when there is one, so snapshots of fleets that always report are
        # unchanged (and older snapshots, without it, load as none).
        **(
            {"unknown_capacity_by_cluster": dict(self.unknown_capacity_by_cluster)}
            if self.unknown_capacity_by_cluster
            else {}
        ),
    }


def from_snapshot(d: Mapping[str, Any], incremental: bool | None = None) -> Scheduler:
    """Rebuild a scheduler from ``to_snapshot`` output (nothing remembered)."""
    if d.get("v") != 1:
        raise ValueError(f"snapshot: version {d.get('v')!r} is not supported")
    from .core import Scheduler  # (at run time: core imports this module)

    s = Scheduler(
        [ClusterSpec.from_dict(c["spec"]) for c in d["clusters"]],
        [QueueSpec.from_dict(q) for q in d["queues"]],
        OrgLimits.from_dict(d["org"]),
        [EnvironmentSpec.from_dict(e) for e in d["env_specs"]],
        incremental=incremental,
    )
    for cd in d["clusters"]:
        c = s.clusters[cd["spec"]["name"]]
        caps = [_row_pod(r) for r in cd["caps"]]
        fc, fm, fe, fg = cd["free"]
        frees = [Pod(fc[i], fm[i], fe[i], fg[i], caps[i].gpu_type) for i in range(len(caps))]
        c.set_nodes(caps, frees, cd["names"])
        c.healthy = cd["healthy"]
        c.known = cd["known"]
    # Health and ``known`` were set here, not by a hard change: nothing kept may
    # stand from before.
    s._eligibles.clear()
    s._holdables.clear()
    demands = [tuple(_row_pod(r) for r in pods) for pods in d["demands"]]

    def action(r: list[Any]) -> _Action:
        spec = ActionSpec(
            id=r[0],
            queue=r[1],
            pods=demands[r[9]],
            run=r[2],
            task=r[3],
            submit=r[4],
            seq=r[5],
            estimate=r[6],
            environment=r[7],
            kind=DemandKind(r[8]),
            meta=r[12] or {},
        )
        a = _Action(spec, s._dkey(demands[r[9]]), demands[r[9]])
        a.env_declared = spec.environment is not None and spec.environment in s.env_specs
        a.reasons = list(r[10])
        a.last = r[11]
        s._classify(a)
        s.actions[a.id] = a
        return a

    for e in d["envs"]:
        spec = s.env_specs[e["name"]]
        pods = sort_pods(spec.footprint)
        inst = _EnvInstance(spec, e["cluster"], list(e["nodes"]), pods, e["queue"])
        inst.expires_at = e["expires_at"]
        s.envs[e["name"]] = inst
        q = s.queues.get(inst.queue)
        if q is not None:
            q.usage.add(inst.usage)
    for r in d["waiting"]:
        a = action(r)
        s.queues[a.queue].waiting.append(a)
    for r, cluster, nodes, start, est, est_end, charged, inst_name in d["running"]:
        a = action(r)
        a.state = "running"
        a.cluster = cluster
        a.nodes = list(nodes)
        a.start = start
        a.est = est
        a.est_end = est_end
        a.charged = charged
        q = s.queues[a.queue]
        q.running += 1
        q.run_counts[a.run] = q.run_counts.get(a.run, 0) + 1
        if charged:
            q.usage.add(a.usage)
        s.org_running += 1
        s.org_run_counts[a.run] = s.org_run_counts.get(a.run, 0) + 1
        s.on_cluster.setdefault(cluster, {})[a.id] = a
        if inst_name is not None:
            inst = s.envs[inst_name]
            a.inst = inst
            inst.active += 1
            inst.running[a.id] = a
        elif a.env and not a.env_declared:
            per = s.undeclared_env.setdefault(a.env, {})
            per[cluster] = per.get(cluster, 0) + 1
    s.run_accepted = dict(d["run_accepted"])
    s.tokens = d["tokens"]
    s.token_time = d["token_time"]
    # Snapshots from before per-queue rates have no queue buckets.
    s.queue_buckets = {n: Bucket(k, at) for n, (k, at) in (d.get("queue_tokens") or {}).items()}
    s.history = {k: list(v) for k, v in d["history"].items()}
    s.unknown_capacity_passes = d["unknown_capacity_passes"]
    s.unknown_capacity_by_cluster = dict(d.get("unknown_capacity_by_cluster") or {})
    return s
