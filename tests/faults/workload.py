"""What a fault run submits and which faults it injects, all drawn from one seed.

The fleet is small and the queues are tight on purpose: caps and quotas that bind all
the time are what a lost release or a double admission would break, and nodes that are
mostly full are where a stale capacity view would overcommit.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

__all__ = [
    "FLEET_YAML",
    "Fault",
    "Planned",
    "PodRes",
    "make_workload",
    "plan_faults",
]

GI = 2**30

# Three clusters: two GPU clusters of different node shapes (a 2x8 gang fits only the
# first) and a CPU cluster. Every queue is capped (concurrency, runs, quota) well below
# what the fleet could hold, so the caps, not the capacity, decide most admissions.
FLEET_YAML = """\
clusters:
  - name: gpu-a
    node_groups:
      - {name: a, count: 2, shape: {cpu: 32, memory: 256Gi, gpu: "H100:8", ephemeral_storage: 1Ti}}
  - name: gpu-b
    node_groups:
      - {name: b, count: 3, shape: {cpu: 24, memory: 192Gi, gpu: "H100:4", ephemeral_storage: 1Ti}}
  - name: cpu
    node_groups:
      - {name: c, count: 3, shape: {cpu: 16, memory: 64Gi, ephemeral_storage: 200Gi}}
queues:
  - name: train
    priority: high
    algorithm: strict
    run_concurrency: 2
    max_resources: {gpu: "H100:16"}
    clusters: [gpu-a, gpu-b]
  - name: eval
    priority: medium
    algorithm: backfill
    action_concurrency: 5
    max_resources: {gpu: 6, cpu: 10}
  - name: batch
    priority: low
    algorithm: easy
    action_concurrency: 8
    run_concurrency: 3
    max_resources: {cpu: 24, memory: 96Gi}
    clusters: [cpu]
"""


@dataclass(frozen=True)
class PodRes:
    """One pod's requests in canonical units (millicores, bytes, GPUs)."""

    cpu_m: int
    mem: int
    gpu: int = 0


@dataclass(frozen=True)
class Planned:
    """One action the run submits, as the submitter (not the product) knows it."""

    action_id: str
    queue: str
    run: str
    pod: PodRes
    replicas: int
    gpu_type: str | None
    duration_s: float

    @property
    def pods(self) -> tuple[PodRes, ...]:
        return (self.pod,) * self.replicas

    def resources(self) -> dict[str, str | int | float]:
        """The pod's requests in the notation a user would submit."""
        out: dict[str, str | int | float] = {
            "cpu": f"{self.pod.cpu_m}m",
            "memory": f"{self.pod.mem // GI}Gi",
        }
        if self.pod.gpu:
            out["gpu"] = f"{self.gpu_type}:{self.pod.gpu}" if self.gpu_type else self.pod.gpu
        return out


@dataclass(frozen=True)
class Fault:
    """``kill -9`` of one process at ``at_s`` (seconds after submission starts), started
    again ``down_s`` later."""

    at_s: float
    kind: str  # server | control-plane | cluster
    target: str  # the supervised process name
    down_s: float
    during_submission: bool = field(default=False, compare=False)


def _shape(rng: random.Random, queue: str) -> tuple[PodRes, int, str | None, float]:
    if queue == "train":
        # Gangs only: 2x4, 2x8 (gpu-a alone) and 3x2 GPUs.
        gpu, replicas = rng.choice([(4, 2), (4, 2), (8, 2), (2, 3)])
        return PodRes(4000, 32 * GI, gpu), replicas, "H100", rng.uniform(1.0, 2.0)
    if queue == "eval":
        replicas = rng.choice([1, 1, 1, 2])
        gpu = rng.choice([1, 1, 2])
        typed = rng.choice([None, "H100"])  # untyped and typed GPU demand under one quota
        return PodRes(2000, 8 * GI, gpu), replicas, typed, rng.uniform(0.5, 1.5)
    replicas = rng.choice([1, 1, 2, 3])
    cpu = rng.choice([1000, 2000, 4000]) if replicas == 1 else 2000
    return PodRes(cpu, rng.choice([4, 8, 16]) * GI), replicas, None, rng.uniform(0.3, 1.5)


def make_workload(rng: random.Random, n: int, prefix: str = "f") -> list[Planned]:
    """``n`` actions over the three queues, grouped in runs of 3-8, in submission order.

    Runs of different queues interleave, as several teams submitting at once would.
    """
    weights = {"train": 0.15, "eval": 0.4, "batch": 0.45}
    counts = {q: int(n * w) for q, w in weights.items()}
    counts["batch"] += n - sum(counts.values())
    streams: dict[str, list[Planned]] = {}
    for queue, count in counts.items():
        out: list[Planned] = []
        run_no = 0
        while len(out) < count:
            run_no += 1
            run = f"{queue}-r{run_no}"
            for _ in range(min(rng.randint(3, 8), count - len(out))):
                pod, replicas, gpu_type, duration = _shape(rng, queue)
                out.append(
                    Planned(
                        action_id=f"{prefix}-{queue}-{len(out):03d}",
                        queue=queue,
                        run=run,
                        pod=pod,
                        replicas=replicas,
                        gpu_type=gpu_type,
                        duration_s=round(duration, 2),
                    )
                )
        streams[queue] = out
    order: list[Planned] = []
    while any(streams.values()):
        queue = rng.choices(
            [q for q in streams if streams[q]], [len(v) for v in streams.values() if v]
        )[0]
        order.append(streams[queue].pop(0))
    return order


def plan_faults(
    rng: random.Random,
    clusters: list[str],
    *,
    count: int,
    submit_s: float,
    window_s: float,
    min_gap_s: float = 5.0,
) -> list[Fault]:
    """``count`` (>= 6) kill -9 faults inside ``window_s``: every kind at least once, a
    cluster worker at least twice, and at least two while submission goes on."""
    assert count >= 6
    kinds = ["server", "control-plane", "cluster", "cluster"]
    kinds += rng.choices(["server", "control-plane", "cluster"], weights=[1, 1, 2], k=count - 4)
    rng.shuffle(kinds)
    # Times: two inside the submission window, the rest anywhere in the window, kept
    # min_gap_s apart so each fault meets a system still recovering from the last one
    # sometimes, but not a process that has not even started again.
    while True:
        times = sorted(
            [rng.uniform(2.0, submit_s - 2.0) for _ in range(2)]
            + [rng.uniform(2.0, window_s) for _ in range(count - 2)]
        )
        if all(b - a >= min_gap_s for a, b in itertools.pairwise(times)):
            break
    faults = []
    for at, kind in zip(times, kinds, strict=True):
        if kind == "cluster":
            target = f"cluster-{rng.choice(clusters)}"
            down = rng.uniform(0.5, 5.0)
        elif kind == "control-plane":
            target, down = "control-plane", rng.uniform(0.5, 4.0)
        else:
            target, down = "temporal-server", rng.uniform(0.5, 3.0)
        faults.append(Fault(round(at, 2), kind, target, round(down, 2), at < submit_s))
    return faults
