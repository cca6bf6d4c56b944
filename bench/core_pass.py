"""Benchmark: the scheduler core's pass at fleet scale.

100,000 pending actions in 200 queues over 100 clusters x 4 node shapes, a mix of single
pods and gangs (replicas, Ray). Figures (milliseconds unless named otherwise):

- full_pass_ms.nothing_fits: every node is taken by long-running work; a pass that must
  visit every queue (after a fleet-wide capacity change) and give every waiting action
  its reason.
- full_pass_ms.fits: the same backlog, but each pass follows 200 completions, so the
  pass admits work as well as recording reasons.
- incremental_event_ms: one event (an enqueue, or a completion that frees room for one
  action) and the pass it triggers, with the full backlog waiting: 1,000 events, one a
  second on the clock (enough that estimated ends pass, and for a p99 that is not just
  the second largest of a hundred), with the largest and how many took over 1 ms.
  ``young_collections_in_events`` / ``gc_ms_in_events``: the collector's runs that fell
  inside those events, and their time (counted in the figures; the collector runs when
  allocations say, so which events it lands on moves with any change). The events
  start from a collected heap: what setup left is not theirs.
- decisions_per_s: per-action decisions (admit, or a reason) per second in full passes.
- kth_easy_simulate_s: wall time of ``headway simulate --swf KTH-SP2 --algorithm easy``.

Machines here are noisy, so a bare loop (a plain Python loop over the same 100,000
actions) alternates with the timed passes, and the ratio pass/bare loop is reported
beside the absolute figures (``nothing_fits_vs_bare_loop``: median, min, max over the
rounds). ``cpu_ms`` (and
``kth_easy_simulate_cpu_s``) give the CPU time of this thread over the very same calls
(``time.thread_time``): on a shared machine, what the work itself cost, without the
time other processes took the core away.

The full passes and the events each run in a process of their own, on a scheduler
built afresh: a thousand events leave the fleet more open than the full passes mean to
find it (a pass then admits thousands), and full passes on a scheduler built where
another had been freed measured slower (fits p99 40-50 ms in three runs, against 34-36
on one built first).

``calib_us``: the machine's calibration (``python -m timeit "sum(range(10000))"``, best
of 5, microseconds; ``bench/_common.py``) taken at the start and at the end, and their
mean; ``normalized``: every time (and ``decisions_per_s``, the other way) as on a 100 us
machine, ``time * 100 / calib_us`` with the mean (``/work/shared/specs/benchmarks.md``).
The calibration runs in a process of its own and the helper imports nothing of Temporal,
so the heap the KTH run meets here is the one it always met.

Run: ``python bench/core_pass.py`` (under a minute); ``python bench/core_pass.py --phase
passes`` (or ``events``) runs one phase alone and prints its JSON (what
``bench/compare_commits.py`` times). The last line is one JSON object.
"""

from __future__ import annotations

import gc
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from headway.scheduler import (
    ActionSpec,
    Admitted,
    Algorithm,
    ClusterSpec,
    NodeGroup,
    Pod,
    Priority,
    QueueSpec,
    Quota,
    Scheduler,
)
from headway.scheduler.model import DemandKind, ray_demand, replicas_demand
from headway.scheduler.simulator import load_swf, simulate

T = TypeVar("T")

GI = 2**30
N_PENDING = 100_000
N_QUEUES = 200
N_CLUSTERS = 100
ROUNDS = 5
N_EVENTS = 1_000

SHAPES = [
    NodeGroup("cpu", 4, Pod(cpu=32_000, memory=128 * GI)),
    NodeGroup("h100", 4, Pod(cpu=96_000, memory=1024 * GI, gpu=8, gpu_type="H100")),
    NodeGroup("h200", 4, Pod(cpu=96_000, memory=1024 * GI, gpu=8, gpu_type="H200")),
    NodeGroup("himem", 4, Pod(cpu=64_000, memory=1024 * GI)),
]

DEMANDS: list[tuple[DemandKind, tuple[Pod, ...]]] = [
    (DemandKind.single, (Pod(cpu=2_000, memory=8 * GI),)),
    (DemandKind.single, (Pod(cpu=8_000, memory=64 * GI, gpu=1, gpu_type="H100"),)),
    (
        DemandKind.replicas,
        replicas_demand(Pod(cpu=32_000, memory=256 * GI, gpu=8, gpu_type="H200"), 4),
    ),
    (
        DemandKind.ray,
        ray_demand(Pod(cpu=4_000, memory=16 * GI), [(4, Pod(cpu=8_000, memory=32 * GI, gpu=1))]),
    ),
    (DemandKind.single, (Pod(cpu=16_000, memory=512 * GI),)),
]


def fleet() -> list[ClusterSpec]:
    return [ClusterSpec(f"c{i:03d}", tuple(SHAPES)) for i in range(N_CLUSTERS)]


def queues(rng: random.Random) -> list[QueueSpec]:
    out = []
    algos = [Algorithm.strict, Algorithm.greedy, Algorithm.backfill, Algorithm.easy]
    for i in range(N_QUEUES):
        sel = None
        if i % 3 == 0:
            sel = tuple(sorted({f"c{rng.randrange(N_CLUSTERS):03d}" for _ in range(10)}))
        out.append(
            QueueSpec(
                name=f"q{i:03d}",
                priority=Priority(i % 5),
                algorithm=algos[i % 4],
                action_concurrency=5_000 if i % 2 else None,
                max_resources=Quota(gpu=4_000) if i % 5 == 0 else None,
                clusters=sel,
            )
        )
    return out


def pending(rng: random.Random, n: int, start_seq: int, now: float) -> list[ActionSpec]:
    out = []
    for k in range(n):
        kind, pods = DEMANDS[rng.randrange(len(DEMANDS))]
        q = rng.randrange(N_QUEUES)
        seq = start_seq + k
        out.append(
            ActionSpec(
                id=f"a{seq}",
                queue=f"q{q:03d}",
                pods=pods,
                run=f"r{seq // 50}",
                task=f"t{seq % 97}",
                submit=now,
                seq=seq,
                estimate=float(rng.choice([60, 600, 3600])),
                kind=kind,
            )
        )
    return out


def fill(s: Scheduler, rng: random.Random, now: float) -> list[str]:
    """Occupy the whole fleet with long-running single-node work, one pod per node."""
    big = [
        Pod(cpu=32_000, memory=128 * GI),
        Pod(cpu=96_000, memory=1024 * GI, gpu=8, gpu_type="H100"),
        Pod(cpu=96_000, memory=1024 * GI, gpu=8, gpu_type="H200"),
        Pod(cpu=64_000, memory=1024 * GI),
    ]
    ids = []
    seq = 10_000_000
    for c in range(N_CLUSTERS):
        # One pinned queue per cluster, largest shapes first, so each pod lands on a
        # node of its own shape and the fleet ends exactly full.
        qn = f"filler-{c:03d}"
        s.upsert_queue(
            QueueSpec(
                qn, priority=Priority.critical, algorithm=Algorithm.greedy, clusters=(f"c{c:03d}",)
            )
        )
        for shape in sorted(big, key=lambda p: (-p.gpu, -p.memory, -p.cpu)):
            for _ in range(4):
                seq += 1
                a = ActionSpec(f"f{seq}", qn, (shape,), submit=now, seq=seq, estimate=1e6)
                assert s.submit(a, now) is None
                ids.append(a.id)
    adm = s.schedule(now)
    assert len(adm) == len(ids), (len(adm), len(ids))
    return ids


def invalidate(s: Scheduler) -> None:
    """Force a full pass: every queue is visited, every waiting action decided."""
    s.invalidate()


def bare_loop(s: Scheduler) -> float:
    """Milliseconds of a plain loop over the backlog (the yardstick of a full pass)."""
    t0 = time.perf_counter()
    n = 0
    for q in s.queues.values():
        for a in q.waiting:
            # The field itself, not the ``last`` property (which may first catch the
            # action up with its class): the same bare loop as before that existed.
            if a._last is not None:
                n += 1
    return (time.perf_counter() - t0) * 1000


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p * (len(s) - 1)))]


def pp(xs: list[float], nd: int) -> dict[str, float]:
    """p50 and p99, rounded to ``nd`` places."""
    return {"p50": round(pct(xs, 0.5), nd), "p99": round(pct(xs, 0.99), nd)}


def timed(call: Callable[..., T], *args: Any) -> tuple[T, float, float]:
    """``call(*args)``, with its wall time and this thread's CPU time, in milliseconds."""
    c0 = time.thread_time()
    t0 = time.perf_counter()
    out = call(*args)
    return out, (time.perf_counter() - t0) * 1000, (time.thread_time() - c0) * 1000


def submit_and_pass(s: Scheduler, a: ActionSpec, now: float) -> list[Admitted]:
    """An enqueue event: the submission and the pass it triggers."""
    s.submit(a, now)
    return s.schedule(now)


def finish_and_pass(s: Scheduler, action_id: str, now: float) -> list[Admitted]:
    """A completion event: the end and the pass it triggers."""
    s.finish(action_id, now)
    return s.schedule(now)


def summary(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def setup(now: float) -> tuple[Scheduler, random.Random, list[str], int]:
    """The fleet full, the backlog waiting, one pass made; the scheduler, the random
    source the phases go on with, the running actions and how many wait."""
    rng = random.Random(7)
    s = Scheduler(fleet(), queues(rng))
    running = fill(s, rng, now)
    for a in pending(rng, N_PENDING, 0, now):
        assert s.submit(a, now) is None
    waiting = sum(len(q.waiting) for q in s.queues.values())
    s.schedule(now)  # warm-up: first visit of everything
    return s, rng, running, waiting


def phase_events() -> dict[str, Any]:
    """Incremental events (see the module's docstring)."""
    now = 1000.0
    s, rng, running, _ = setup(now)
    for _ in range(ROUNDS + 1):
        invalidate(s)  # as the full passes leave it
        s.schedule(now)
    # What setup and those passes left for the collector is not the events' work.
    gc.collect()
    inc: list[float] = []
    inc_enq: list[float] = []
    inc_done: list[float] = []
    inc_cpu: list[float] = []
    inc_enq_cpu: list[float] = []
    inc_done_cpu: list[float] = []
    seq = N_PENDING
    gc_in: list[float] = []
    gc_at = [0.0]
    in_event = [False]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if not in_event[0]:
            return
        if phase == "start":
            gc_at[0] = time.perf_counter()
        else:
            gc_in.append((time.perf_counter() - gc_at[0]) * 1000)

    gc.callbacks.append(on_gc)
    for i in range(N_EVENTS):
        now += 1
        if i % 2 == 0:
            (a,) = pending(rng, 1, seq, now)
            seq += 1
            in_event[0] = True
            _, dt, dc = timed(submit_and_pass, s, a, now)
            in_event[0] = False
            inc_enq.append(dt)
            inc_enq_cpu.append(dc)
        else:
            victim = running.pop(rng.randrange(len(running)))
            in_event[0] = True
            adm, dt, dc = timed(finish_and_pass, s, victim, now)
            in_event[0] = False
            running.extend(x.action_id for x in adm)
            inc_done.append(dt)
            inc_done_cpu.append(dc)
        inc.append(dt)
        inc_cpu.append(dc)
    gc.callbacks.remove(on_gc)
    print(
        f"incremental: enqueue p50 {pct(inc_enq, 0.5):.2f} ms p99 {pct(inc_enq, 0.99):.2f} ms;"
        f" completion p50 {pct(inc_done, 0.5):.2f} ms p99 {pct(inc_done, 0.99):.2f} ms;"
        f" max {max(inc):.2f} ms, {sum(x > 1 for x in inc)} of {len(inc)} over 1 ms"
        f" ({len(gc_in)} young collections inside, {sum(gc_in):.1f} ms)",
        file=sys.stderr,
    )
    return {
        "incremental_events": len(inc),
        "incremental_event_ms": {
            "p50": round(pct(inc, 0.5), 3),
            "p99": round(pct(inc, 0.99), 3),
            "max": round(max(inc), 3),
        },
        "incremental_over_1ms": sum(x > 1 for x in inc),
        "young_collections_in_events": len(gc_in),
        "gc_ms_in_events": round(sum(gc_in), 2),
        "incremental_enqueue_ms": pp(inc_enq, 3),
        "incremental_completion_ms": pp(inc_done, 3),
        "cpu_ms": {
            "incremental_event": pp(inc_cpu, 3),
            "incremental_enqueue": pp(inc_enq_cpu, 3),
            "incremental_completion": pp(inc_done_cpu, 3),
        },
    }


def phase_passes() -> dict[str, Any]:
    """Full passes, nothing fits and fits (see the module's docstring)."""
    now = 1000.0
    s, rng, running, waiting = setup(now)
    print(
        f"setup: {waiting} pending in {N_QUEUES} queues, {N_CLUSTERS} clusters x {len(SHAPES)} shapes,"
        f" {len(running)} running",
        file=sys.stderr,
    )

    # --- full pass, nothing fits (the bare loop alternates with it)
    nf: list[float] = []
    ratios: list[float] = []
    nf_cpu: list[float] = []
    for r in range(ROUNDS + 1):
        cal = bare_loop(s)
        invalidate(s)
        adm, dt, dc = timed(s.schedule, now)
        assert not adm
        if r:  # round 0 is the warm-up
            nf.append(dt)
            nf_cpu.append(dc)
            ratios.append(dt / cal)
    decisions_nf = waiting / (statistics.median(nf) / 1000)
    print(
        f"full pass, nothing fits: p50 {pct(nf, 0.5):.1f} ms p99 {pct(nf, 0.99):.1f} ms"
        f" ({statistics.median(ratios):.1f}x a bare loop over the backlog)",
        file=sys.stderr,
    )

    # --- full pass with admissions ("fits")
    fits: list[float] = []
    fits_cpu: list[float] = []
    admitted = 0
    decided = 0
    fit_time = 0.0
    for r in range(ROUNDS + 1):
        now += 10
        for _ in range(200):
            if running:
                s.finish(running.pop(rng.randrange(len(running))), now)
        invalidate(s)
        w = sum(len(q.waiting) for q in s.queues.values())
        adm, dt, dc = timed(s.schedule, now)
        running.extend(x.action_id for x in adm)
        if r:
            fits.append(dt)
            fits_cpu.append(dc)
            admitted += len(adm)
            decided += w
            fit_time += dt / 1000
    print(
        f"full pass, fits: p50 {pct(fits, 0.5):.1f} ms p99 {pct(fits, 0.99):.1f} ms,"
        f" {admitted / ROUNDS:.0f} admitted per pass",
        file=sys.stderr,
    )
    decisions = decided / fit_time if fit_time else 0.0
    return {
        "pending": waiting,
        "queues": N_QUEUES,
        "clusters": N_CLUSTERS,
        "shapes": len(SHAPES),
        "full_pass_ms": {
            "fits": {"p50": round(pct(fits, 0.5), 2), "p99": round(pct(fits, 0.99), 2)},
            "nothing_fits": {"p50": round(pct(nf, 0.5), 2), "p99": round(pct(nf, 0.99), 2)},
        },
        "decisions_per_s": round(max(decisions, decisions_nf)),
        "decisions_per_s_fits": round(decisions),
        "decisions_per_s_nothing_fits": round(decisions_nf),
        "nothing_fits_vs_bare_loop": {k: round(v, 2) for k, v in summary(ratios).items()},
        "cpu_ms": {"full_pass_fits": pp(fits_cpu, 2), "full_pass_nothing_fits": pp(nf_cpu, 2)},
    }


PHASES = {"passes": phase_passes, "events": phase_events}


def run_phase(name: str) -> dict[str, Any]:
    """Run one phase in a process of its own (a fresh heap: a scheduler built where
    another was freed, or after a thousand events, measures differently); its lines
    go to stderr as they come, its result is its last stdout line."""
    proc = subprocess.run(
        [sys.executable, __file__, "--phase", name],
        stdout=subprocess.PIPE,
        text=True,
        check=True,
    )
    got: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return got


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--phase":
        print(json.dumps(PHASES[sys.argv[2]]()))
        return
    from _common import calib_us, calibration, normalize  # type: ignore[import-not-found]

    calib_start = calib_us()
    passes = run_phase("passes")
    events = run_phase("events")

    # --- KTH-SP2 with EASY
    trace = Path(__file__).resolve().parents[2] / "shared" / "traces" / "KTH-SP2-1996-2.1-cln.swf"
    kth_s: float | None = None
    kth_cpu: float | None = None
    if trace.exists():
        sc, skipped = load_swf(trace.read_text(), "easy")
        _, kth_ms, kth_cpu_ms = timed(lambda: simulate(sc, skipped=skipped))
        kth_s, kth_cpu = kth_ms / 1000, kth_cpu_ms / 1000
        print(f"KTH-SP2 easy: {len(sc.workload)} jobs in {kth_s:.1f} s", file=sys.stderr)

    calib = calibration(calib_start, calib_us())
    out: dict[str, Any] = {
        "pending": passes["pending"],
        "queues": N_QUEUES,
        "clusters": N_CLUSTERS,
        "shapes": len(SHAPES),
        "calib_us": calib,
        "rounds": ROUNDS,
        "full_pass_ms": passes["full_pass_ms"],
        **{k: v for k, v in events.items() if k != "cpu_ms"},
        "decisions_per_s": passes["decisions_per_s"],
        "decisions_per_s_fits": passes["decisions_per_s_fits"],
        "decisions_per_s_nothing_fits": passes["decisions_per_s_nothing_fits"],
        "nothing_fits_vs_bare_loop": passes["nothing_fits_vs_bare_loop"],
        "kth_easy_simulate_s": round(kth_s, 2) if kth_s is not None else None,
        "cpu_ms": {**passes["cpu_ms"], **events["cpu_ms"]},
        "kth_easy_simulate_cpu_s": round(kth_cpu, 2) if kth_cpu is not None else None,
    }
    out["normalized"] = normalize(
        {
            k: out[k]
            for k in (
                "full_pass_ms",
                "incremental_event_ms",
                "incremental_enqueue_ms",
                "incremental_completion_ms",
                "gc_ms_in_events",
                "decisions_per_s",
                "decisions_per_s_fits",
                "decisions_per_s_nothing_fits",
                "kth_easy_simulate_s",
                "cpu_ms",
                "kth_easy_simulate_cpu_s",
            )
        },
        calib["mean"],
    )
    print(f"calibration: {calib} us (sum(range(10000)), best of 5)", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
