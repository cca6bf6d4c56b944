"""Differential tests: the incremental core decides exactly as the plain loop does.

``Scheduler(incremental=False)`` (or ``core.INCREMENTAL = False``) turns every shortcut
off: every queue is visited every pass and every waiting action is decided on its own,
oldest first - the spec's loop read literally. The default core skips visits whose
inputs did not change and decides once per decision class (``_walk``). Both must give
byte-identical results: same admissions, same clusters and nodes, same reasons.

Scenarios are seeded-random and small, but built so classes are large (a few demand
shapes, estimates and tasks shared by many actions), with every algorithm, run and org
caps, quotas, declared and undeclared environments, gangs, typed GPUs, clusters going
down and up, queue updates mid-run, out-of-order submissions, cancellations and a
snapshot round-trip.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from headway.scheduler import (
    ActionSpec,
    Algorithm,
    ClusterSpec,
    NodeGroup,
    OrgLimits,
    Priority,
    QueueSpec,
    Quota,
    Scheduler,
    core,
)
from headway.scheduler.model import EnvironmentSpec, ray_demand, replicas_demand
from headway.scheduler.resources import Pod
from headway.scheduler.scenario import Scenario, WorkItem
from headway.scheduler.simulator import render_json, simulate

GI = 2**30
ALGOS = [Algorithm.strict, Algorithm.greedy, Algorithm.backfill, Algorithm.easy]
TYPES = ["H200", "A100", None]


@contextmanager
def plain() -> Iterator[None]:
    """Every Scheduler built inside runs without shortcuts."""
    old = core.INCREMENTAL
    core.INCREMENTAL = False
    try:
        yield
    finally:
        core.INCREMENTAL = old


def _pod(rng: random.Random) -> Pod:
    gpus = rng.choice([0, 0, 1, 2, 4])
    return Pod(
        cpu=rng.choice([500, 1000, 4000, 8000]),
        memory=rng.choice([1, 4, 16]) * GI,
        gpu=gpus,
        gpu_type=rng.choice(TYPES) if gpus else None,
    )


def _demand(rng: random.Random) -> tuple[Pod, ...]:
    kind = rng.choice(["single", "single", "replicas", "ray"])
    if kind == "single":
        return (_pod(rng),)
    if kind == "replicas":
        return replicas_demand(_pod(rng), rng.randint(2, 3))
    return ray_demand(_pod(rng), [(rng.randint(1, 2), _pod(rng))])


def _opt(rng: random.Random, xs: list[Any]) -> Any:
    return rng.choice([None, None, *xs])


def _clusters(rng: random.Random) -> list[ClusterSpec]:
    out = []
    for i in range(rng.randint(1, 3)):
        groups = []
        for j in range(rng.randint(1, 2)):
            gpus = rng.choice([0, 4, 8])
            shape = Pod(
                cpu=rng.choice([8, 16, 32]) * 1000,
                memory=rng.choice([32, 64]) * GI,
                gpu=gpus,
                gpu_type=rng.choice(TYPES) if gpus else None,
            )
            groups.append(NodeGroup(f"g{j}", rng.randint(1, 3), shape))
        out.append(ClusterSpec(f"c{i}", tuple(groups), rng.random() > 0.15))
    return out


def _queue(rng: random.Random, name: str, algo: Algorithm, cnames: list[str]) -> QueueSpec:
    quota = None
    if rng.random() < 0.3:
        gq = _opt(rng, [2, 4, 8])
        quota = Quota(
            cpu=_opt(rng, [8000, 16000]),
            gpu=gq,
            gpu_type=rng.choice(TYPES) if gq is not None else None,
        )
    sel = None
    if rng.random() < 0.3:
        sel = tuple(sorted(rng.sample(cnames, rng.randint(1, len(cnames)))))
    capped = rng.random() < 0.4
    return QueueSpec(
        name=name,
        priority=rng.choice(list(Priority)),
        algorithm=algo,
        run_concurrency=_opt(rng, [1, 2, 3]) if capped else None,
        per_run_concurrency=_opt(rng, [1, 2]) if capped else None,
        action_concurrency=_opt(rng, [2, 4, 8]),
        depth=_opt(rng, [20, 40]),
        max_resources=quota,
        clusters=sel,
    )


def scenario(seed: int) -> Scenario:
    """A random scenario whose actions fall into few, large decision classes."""
    rng = random.Random(seed)
    cs = _clusters(rng)
    cnames = [c.name for c in cs]
    qs = [
        _queue(rng, f"q{i}", ALGOS[(seed + i) % 4] if i == 0 else rng.choice(ALGOS), cnames)
        for i in range(rng.randint(1, 4))
    ]
    envs = []
    if rng.random() < 0.3:
        envs.append(
            EnvironmentSpec(
                "ray-env",
                Pod(cpu=4000, memory=8 * GI),
                replicas=rng.randint(1, 2),
                concurrency=rng.randint(1, 3),
                idle_ttl=float(rng.choice([0, 10, 50])),
            )
        )
    org = OrgLimits(
        max_concurrent_runs=_opt(rng, [2, 4]) if rng.random() < 0.3 else None,
        max_concurrent_actions=_opt(rng, [3, 6, 12]),
        max_actions_per_run=_opt(rng, [10, 30]),
    )
    palette = [_demand(rng) for _ in range(rng.randint(1, 4))]
    estimates = [None, 30.0, 120.0, 600.0][: rng.randint(1, 4)]
    n = rng.randint(5, 80)
    work = []
    for i in range(n):
        dur = float(rng.choice([0, 10, 30, 60, 200, 600]))
        env = None
        if rng.random() < 0.15:
            env = "ray-env" if envs and rng.random() < 0.6 else "loose-env"
        spec = ActionSpec(
            id=f"a{i}",
            queue=rng.choice(qs).name,
            pods=rng.choice(palette),
            run=f"r{rng.randint(0, 5)}",
            task=f"t{rng.randint(0, 2)}",
            submit=float(rng.choice([0, 0, 0, 5, 10, 40, 100, 300])),
            # Now and then out of file order: inserted mid-queue.
            seq=i if rng.random() > 0.1 else rng.randint(0, n),
            estimate=rng.choice(estimates),
            environment=env,
        )
        work.append(WorkItem(spec, dur))
    events: list[tuple[float, str, Any]] = []
    for _ in range(rng.randint(0, 3)):
        t = float(rng.choice([5, 20, 50, 150, 400]))
        kind = rng.choice(["update_queue", "cluster_down", "cluster_up"])
        if kind == "update_queue":
            q = rng.choice(qs)
            fields: dict[str, Any] = rng.choice(
                [
                    {"algorithm": rng.choice(ALGOS)},
                    {"run_concurrency": _opt(rng, [1, 2])},
                    {"action_concurrency": _opt(rng, [1, 3, 6])},
                    {"per_run_concurrency": _opt(rng, [1, 2])},
                ]
            )
            events.append((t, kind, (q.name, fields)))
        else:
            events.append((t, kind, rng.choice(cnames)))
    return Scenario(cs, qs, org, envs, work, events)


@pytest.mark.parametrize("seed", range(240))
def test_simulate_matches_the_plain_loop(seed: int) -> None:
    sc = scenario(seed)
    fast = render_json(simulate(sc))
    with plain():
        slow = render_json(simulate(sc))
    assert fast == slow


def _drive(sc: Scenario, seed: int, incremental: bool) -> list[Any]:
    """Drive the core by hand: submissions, completions, cancellations and a snapshot
    round-trip; record every decision and every waiting action's reasons."""
    rng = random.Random(seed)
    s = Scheduler(sc.clusters, sc.queues, sc.org, sc.environments, incremental=incremental)
    log: list[Any] = []
    running: list[str] = []
    work = sorted(sc.workload, key=lambda w: (w.spec.submit, w.spec.seq))
    now = 0.0
    for k, wi in enumerate(work):
        now = max(now, wi.spec.submit)
        log.append(("submit", wi.spec.id, s.submit(wi.spec, now)))
        r = rng.random()
        if r < 0.2 and running:
            s.finish(running.pop(rng.randrange(len(running))), now)
        elif r < 0.3:
            victim = rng.choice(work[: k + 1]).spec.id
            log.append(("cancel", victim, s.cancel(victim, now)))
            if victim in running:
                running.remove(victim)
        if k == len(work) // 2:
            s = Scheduler.from_snapshot(s.to_snapshot())
            s.incremental = incremental
        if rng.random() < 0.5:
            now += 1
            adm = s.schedule(now)
            running.extend(a.action_id for a in adm)
            log.append(("adm", now, adm))
            log.append(
                ("why", sorted((a.id, a.last, tuple(a.reasons)) for a in s.actions.values()))
            )
    while running:
        now += 5
        s.finish(running.pop(0), now)
        adm = s.schedule(now)
        running.extend(a.action_id for a in adm)
        log.append(("adm", now, adm))
    log.append(("why", sorted((a.id, a.last, tuple(a.reasons)) for a in s.actions.values())))
    return log


@pytest.mark.parametrize("seed", range(80))
def test_driven_core_matches_the_plain_loop(seed: int) -> None:
    sc = scenario(1000 + seed)
    assert _drive(sc, seed, True) == _drive(sc, seed, False)
