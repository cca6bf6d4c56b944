"""The policy's pure rules on their own: ordering, projection and the reservation choice
take what they read as arguments and return their answer (with until when it stands),
writing nothing anywhere. (Their use by the pass is checked on both engines by the
other tests of this folder, and against the reference by the differential tests.)"""

from __future__ import annotations

import math

from headway.scheduler.fit import ClusterState, runs_of, sort_pods
from headway.scheduler.model import ClusterSpec, NodeGroup
from headway.scheduler.policy.backfill import choose_reservation, holdable
from headway.scheduler.policy.order import cluster_key, placement_order
from headway.scheduler.policy.projection import project_from, steps_of
from headway.scheduler.resources import Pod, Usage

GI = 2**30


def cluster(name: str, nodes: int = 1, cpu: int = 4, gpu: int = 0) -> ClusterState:
    node = Pod(cpu=cpu * 1000, memory=16 * GI, gpu=gpu, gpu_type="H200" if gpu else None)
    return ClusterState(ClusterSpec(name, (NodeGroup("n", nodes, node),)))


def usage(pods: tuple[Pod, ...]) -> Usage:
    u = Usage()
    for p in pods:
        u.add_pod(p)
    return u


def test_placement_order_is_known_then_most_free_gpu_then_cpu_then_name() -> None:
    a, b, c = cluster("a", cpu=4), cluster("b", cpu=8), cluster("c", gpu=8)
    d = cluster("d")
    d.known = False
    assert [x.name for x in placement_order([d, a, b, c], None)] == ["c", "b", "a", "d"]
    assert cluster_key(a) < cluster_key(d)
    # A warm undeclared environment's cluster goes first, the rest as before.
    assert [x.name for x in placement_order([d, a, b, c], {"a": 1})] == ["a", "c", "b", "d"]


def test_the_reservation_is_the_earliest_fit_ties_to_the_first_in_placement_order() -> None:
    a, b, c = cluster("a"), cluster("b"), cluster("c")
    fits = [("a", (20.0, None), 0, a), ("b", (10.0, None), 1, b), ("c", (10.0, None), 2, c)]
    best, held = choose_reservation(fits)
    assert best == (10.0, b, None) and held == []
    # The rank decides ties, whatever order the fits come in.
    best, _ = choose_reservation(list(reversed(fits)))
    assert best is not None and best[1] is b


def test_a_cluster_whose_fit_cannot_be_computed_is_held_in_placement_order() -> None:
    a, b, c = cluster("a"), cluster("b"), cluster("c")
    best, held = choose_reservation(
        [("c", None, 2, c), ("a", None, 0, a), ("b", (5.0, None), 1, b)]
    )
    assert best == (5.0, b, None) and held == ["a", "c"]
    assert choose_reservation([]) == (None, [])


def test_a_strict_head_holds_the_known_clusters_that_could_ever_take_it() -> None:
    a, b, c = cluster("a"), cluster("b"), cluster("c")
    c.known = False
    assert holdable([a, b, c], lambda x: x.name != "b") == ["a"]


def test_a_projection_returns_when_it_fits_and_until_when_that_stands() -> None:
    c = cluster("c", nodes=1, cpu=4)
    busy = (Pod(cpu=4000, memory=GI),)
    runs = runs_of(sort_pods(busy))
    assert c.place(runs, commit=True) == [0]
    demand = runs_of(sort_pods((Pod(cpu=2000, memory=GI),)))
    need = usage((Pod(cpu=2000, memory=GI),))
    releases = [(10.0, 1, runs, [0], usage(busy))]
    steps = steps_of(c, releases)
    assert [s[:2] for s in steps] == [(10.0, 1)]
    # Work ends ahead: the answer stands for the placement's part for ever (the
    # releases' own horizon, the estimated end, is ``releases_on``'s).
    assert project_from(c, demand, 0.0, False, releases, steps, need) == ((10.0, None), math.inf)
    # Overdue work counted gone "now": the reservation moves with the clock.
    late = [(12.0, 1, runs, [0], usage(busy))]
    assert project_from(c, demand, 12.0, False, late, steps_of(c, late), need) == (
        (12.0, None),
        12.0,
    )
    # Too big for the cluster even empty: never, and that stands.
    big = runs_of(sort_pods((Pod(cpu=8000, memory=GI),)))
    assert project_from(
        c, big, 0.0, False, releases, steps, usage((Pod(cpu=8000, memory=GI),))
    ) == (
        None,
        math.inf,
    )


def test_a_projection_writes_nothing_into_the_cluster() -> None:
    c = cluster("c", nodes=2, cpu=4)
    busy = (Pod(cpu=4000, memory=GI),)
    runs = runs_of(sort_pods(busy))
    c.place(runs, commit=True)
    before = (c.version, list(c.fcpu), c.tcpu)
    releases = [(10.0, 1, runs, [0], usage(busy))]
    demand = runs_of(sort_pods((Pod(cpu=4000, memory=GI), Pod(cpu=4000, memory=GI))))
    need = usage((Pod(cpu=4000, memory=GI), Pod(cpu=4000, memory=GI)))
    got, _ = project_from(c, demand, 0.0, True, releases, steps_of(c, releases), need)
    assert got is not None and got[0] == 10.0 and got[1] is not None
    assert (c.version, list(c.fcpu), c.tcpu) == before
