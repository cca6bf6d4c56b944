"""The fault run, smaller, on the Kubernetes backend (issue #20): the real dev server,
the control-plane worker and a ``--backend kubernetes`` cluster worker as separate
processes, against the project's fake API server served from this process, whose
kubelet the test plays. Besides killing the control plane and the server, the cluster
worker is killed twice, and the second time a node and its pods disappear while it is
down: the restarted worker must report those actions lost (NodeLost or PodLost), never
create their pods again, and finish everything else.

``HEADWAY_FAULT_SEED=N`` replays a run; the seed is printed either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path

import kmock
import pytest

from .audit import Finding
from .kube import (
    CLUSTER,
    KUBE_FLEET_YAML,
    NAMESPACE,
    NODES,
    FaultKube,
    Kubelet,
    kube_plan,
    kubeconfig,
)
from .run import RunConfig, RunResult, choose_seed, fault_run
from .workload import Fault, Planned

pytestmark = [pytest.mark.faults, pytest.mark.integration]

#: How an action whose running pods went with their node may end: reported lost.
LOST = frozenset({"NodeLost", "PodLost"})


def _leftover(kube: FaultKube) -> list[Finding]:
    """Headway's pods still on the cluster once every action ended (cleanup, and the
    restarted worker's sweep of ended actions' pods, must leave none)."""
    left = sorted(
        p["metadata"]["name"]
        for p in kube.live("pods")
        if (p.get("metadata") or {}).get("namespace") == NAMESPACE
    )
    return [Finding("pods-left", CLUSTER, f"pods left after the run: {left}")] if left else []


def _victim_findings(result: RunResult, victims: dict[str, str]) -> list[Finding]:
    """Each action that lost running pods with the node ended attributed (or ran again
    under a new dispatch); every other action succeeded."""
    out = []
    for p in result.planned:
        h = result.histories.get(p.action_id)
        if h is None or h.state is None:
            continue  # lost or unended: the audit reports it
        if p.action_id in victims:
            retried = h.state == "succeeded" and len(h.dispatches) > 1
            if not retried and not (h.state == "failed" and h.reason in LOST):
                out.append(
                    Finding(
                        "node-loss-unattributed",
                        p.action_id,
                        f"its pods went with node {victims[p.action_id]}; it ended {h.state}"
                        f" ({h.reason}) after {len(h.dispatches)} dispatch(es)",
                    )
                )
        elif h.state != "succeeded":
            out.append(Finding("not-succeeded", p.action_id, f"ended {h.state}: {h.reason}"))
    return out


@pytest.mark.timeout(420)
async def test_kubernetes_worker_restart_while_a_node_and_its_pods_disappear(
    tmp_path: Path,
) -> None:
    seed = choose_seed()
    async with FaultKube() as kube, kmock.Server(kube):
        kubelet = Kubelet(kube, durations={})
        for i in range(NODES):
            await kubelet.add_node(f"k-{i}")
        config = kubeconfig(tmp_path / "kubeconfig", str(kube.url))
        lost: list[str] = []
        returns: list[asyncio.Task[None]] = []

        def plan(rng: random.Random, clusters: list[str]) -> tuple[list[Planned], list[Fault]]:
            planned, faults = kube_plan(rng, clusters)
            kubelet.durations.update({p.action_id: p.duration_s for p in planned})
            return planned, faults

        async def come_back(node: str, after_s: float) -> None:
            # A replacement node under the same name, empty, once the worker is back.
            await asyncio.sleep(after_s)
            await kubelet.add_node(node)

        async def before(f: Fault) -> None:
            # The node is lost while its worker is down: kill the worker once something
            # runs (a gang whose creation the kill cuts short is held by its scheduling
            # gate until the worker is back, so nothing might run in the whole outage).
            if f.kind != "lose-node":
                return
            for _ in range(300):
                if kubelet.running_somewhere():
                    return
                await asyncio.sleep(0.1)

        async def while_down(f: Fault) -> None:
            if f.kind != "lose-node":
                return
            node = None
            for _ in range(100):  # the node that runs something, as soon as one does
                node = await kubelet.lose_node()
                if node is not None:
                    break
                await asyncio.sleep(0.1)
            if node is not None:
                lost.append(node)
                returns.append(asyncio.create_task(come_back(node, f.down_s + 8.0)))

        stop = asyncio.Event()
        playing = asyncio.create_task(kubelet.run(stop))
        try:
            result = await fault_run(
                RunConfig(
                    seed=seed,
                    submit_s=15.0,
                    recovery_deadline_s=120.0,
                    fleet_yaml=KUBE_FLEET_YAML,
                    backend_args=lambda _name, _dir: [
                        "--backend",
                        "kubernetes",
                        "--kubeconfig",
                        str(config),
                        "--pod-namespace",
                        NAMESPACE,
                    ],
                    plan=plan,
                    before=before,
                    while_down=while_down,
                    expect_success=False,
                    judge=lambda r: _victim_findings(r, kubelet.victims) + _leftover(kube),
                ),
                tmp_path,
            )
        finally:
            stop.set()
            await playing
            for task in returns:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            kube.drop_watches()
    findings = result.findings
    (tmp_path / "kubelet.log").write_text("\n".join(kubelet.log + kubelet.errors) + "\n")
    # Every write the fake API server took, for a finding to be traced to its writer.
    (tmp_path / "api-writes.log").write_text("\n".join(kube.writes) + "\n")
    head = f"kube fault run, seed {seed} (replay: HEADWAY_FAULT_SEED={seed}); {result.summary()}"
    print(f"{head}; node lost: {lost}, its actions: {sorted(kubelet.victims)}")
    assert not kubelet.errors, f"{head}: the fake kubelet failed: {kubelet.errors[:5]}"
    assert lost, f"{head}: no node was running anything when it was to be lost"
    assert kubelet.victims, f"{head}: the lost node ran no Headway pod"
    assert findings == [], head + "\n" + "\n".join(str(f) for f in findings[:40])
    assert result.report.ended_once == len(result.planned)
