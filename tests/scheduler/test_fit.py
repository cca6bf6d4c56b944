"""``ClusterState.place`` (best fit, largest first, typed GPUs, gangs all-or-nothing, EASY's
``limit``) and the quantity parsers; the placement rules also as the scheduler decides
them, on both engines (``engine``)."""

from __future__ import annotations

import pytest
from headway.scheduler.fit import ClusterState, runs_of, sort_pods
from headway.scheduler.model import ActionSpec, Algorithm, ClusterSpec, NodeGroup, QueueSpec
from headway.scheduler.resources import (
    Pod,
    QuantityError,
    Quota,
    Usage,
    parse_cpu,
    parse_gpu,
    parse_memory,
    parse_pod,
    parse_quota,
)

from .policy.engines import scheduler_class

GI = 2**30


def gpu_node(n: int = 8, t: str | None = "H200", cpu: int = 16) -> Pod:
    return Pod(cpu=cpu * 1000, memory=256 * GI, gpu=n, gpu_type=t)


def cpu_node(cpu: int = 16) -> Pod:
    return Pod(cpu=cpu * 1000, memory=64 * GI)


def cluster(*groups: tuple[str, int, Pod]) -> ClusterState:
    return ClusterState(ClusterSpec("c", tuple(NodeGroup(n, k, p) for n, k, p in groups)))


def pod(gpu: int = 0, cpu: int = 1, t: str | None = "H200") -> Pod:
    return Pod(cpu=cpu * 1000, memory=GI, gpu=gpu, gpu_type=t if gpu else None)


def place(
    c: ClusterState, *pods: Pod, commit: bool = True, limit: ClusterState | None = None
) -> list[int] | None:
    return c.place(runs_of(sort_pods(pods)), commit=commit, limit=limit)


def free(c: ClusterState) -> list[tuple[int, int]]:
    """(free gpu, free cpu cores) per node."""
    return [(c.fgpu[i], c.fcpu[i] // 1000) for i in range(len(c.fcpu))]


def test_least_free_gpu_first() -> None:
    c = cluster(("g", 2, gpu_node()))
    assert place(c, pod(8)) == [0]  # tie -> node order
    assert place(c, pod(4)) == [1]
    c.give(runs_of((pod(8),)), [0])
    # n0 8 free, n1 4 free: the 4-GPU pod goes where the least GPU is free
    assert place(c, pod(4)) == [1]
    assert place(c, pod(8)) == [0]  # the whole node stayed free
    assert free(c) == [(0, 15), (0, 14)]


def test_cpu_pods_prefer_nodes_without_gpu_then_least_free_cpu() -> None:
    c = cluster(("g", 1, gpu_node()), ("c", 2, cpu_node()))
    assert place(c, pod(cpu=6)) == [1]  # free GPU 0 < 8; CPU tie -> node order
    assert place(c, pod(cpu=4)) == [1]  # least free CPU: 10 < 16
    assert place(c, pod(cpu=16)) == [2]  # a whole node is still there
    assert place(c, pod(8, cpu=8)) == [0]


def test_typed_gpu_never_fits_bare_count_node() -> None:
    c = cluster(("bare", 1, gpu_node(t=None)), ("h200", 1, gpu_node()))
    assert place(c, pod(1)) == [1]  # H200:1 skips the bare node though it is first
    assert place(c, pod(8)) is None  # 7 H200 left; the bare node's 8 do not count
    assert place(c, pod(2, t=None)) == [1]  # a bare demand fits any type: 7 free < 8
    only_bare = cluster(("bare", 2, gpu_node(t=None)))
    assert place(only_bare, pod(1)) is None
    assert not only_bare.could_hold(runs_of((pod(1),)))
    assert only_bare.could_hold(runs_of((pod(1, t=None),)))


def test_bare_demand_least_free_gpu_across_types() -> None:
    c = cluster(("a", 1, gpu_node(t="A100")), ("h", 1, gpu_node()))
    assert place(c, pod(3)) == [1]  # H200:3 -> h: 5 left
    assert place(c, pod(2, t=None)) == [1]  # bare: least free GPU 5 < 8, any type


def test_gang_all_or_nothing_leaves_state_unchanged() -> None:
    c = cluster(("g", 2, gpu_node()))
    before = free(c), c.tgpu, c.tcpu
    assert place(c, pod(6), pod(6), pod(6)) is None  # 18 > 16
    assert place(c, pod(6), pod(6), pod(3)) is None  # totals fit (15), pods do not
    assert (free(c), c.tgpu, c.tcpu) == before
    assert place(c, pod(6), pod(6), pod(2), pod(2)) == [0, 1, 0, 1]
    assert free(c) == [(0, 14), (0, 14)]


def test_run_of_identical_pods_fills_tightest_node_first() -> None:
    c = cluster(("g", 3, gpu_node()))
    assert place(c, *[pod(2)] * 5) == [0, 0, 0, 0, 1]
    assert place(c, pod(6)) == [1]  # 6 free on n1 < 8 on n2
    assert place(c, pod(8)) == [2]


def test_largest_pod_first_within_a_gang() -> None:
    head, worker = pod(1), pod(2)
    assert sort_pods((head, worker, worker)) == (worker, worker, head)
    # ties keep the declared order
    a, b = Pod(cpu=1000, memory=2), Pod(cpu=1000, memory=2)
    assert sort_pods((a, b)) == (a, b)
    c = cluster(("g", 2, gpu_node()))
    c.take(runs_of((pod(6),)), [0])
    c.take(runs_of((pod(5),)), [1])
    # free 2 / 3: worker -> n0 (2), worker -> n1 (3 -> 1), head -> n1
    assert place(c, head, worker, worker) == [0, 1, 1]
    # declared order (head first) would not fit: head -> n0 leaves 1, 2nd worker fails
    c2 = cluster(("g", 2, gpu_node()))
    c2.take(runs_of((pod(6),)), [0])
    c2.take(runs_of((pod(5),)), [1])
    assert c2.place(((head, 1), (worker, 2)), commit=False) is None


def test_place_without_commit_leaves_state() -> None:
    c = cluster(("g", 2, gpu_node()))
    assert place(c, pod(4), commit=False) is not None
    assert free(c) == [(8, 16), (8, 16)]


def test_easy_limit_each_pod_must_fit_the_limit_too() -> None:
    c = cluster(("g", 2, gpu_node()))
    lim = c.clone()
    lim.take(runs_of((pod(8),)), [0])  # the projected head takes node 0 entirely
    assert place(c, pod(4), commit=False) is not None  # (a dry run need not name nodes)
    assert place(c, pod(4), limit=lim) == [1]
    lim.take(runs_of((pod(4), pod(4))), [1, 1])  # the extra on node 1 is used up
    assert place(c, pod(4), limit=lim) is None
    assert place(c, pod(4)) == [1]  # without the limit it fits (node 1 has 4 left)


def test_could_hold_uses_empty_node_shapes() -> None:
    c = cluster(("g", 1, gpu_node()))
    c.take(runs_of((pod(8),)), [0])
    assert c.could_hold(runs_of((pod(8),)))
    assert not c.could_hold(runs_of((pod(9),)))
    unknown = ClusterState(
        ClusterSpec("u", (NodeGroup("g", 1, gpu_node()),), reports_capacity=False)
    )
    assert unknown.could_hold(runs_of((pod(100),)))


def test_take_give_round_trip() -> None:
    c = cluster(("g", 3, gpu_node()), ("c", 2, cpu_node()))
    start = free(c)
    runs = runs_of(sort_pods((pod(2), pod(2), pod(2), pod(cpu=3))))
    nodes = c.place(runs, commit=True)
    assert nodes is not None
    c.give(runs, nodes)
    assert free(c) == start
    assert c.tgpu == 24 and c.tcpu == 80_000


# --------------------------------------------------------------------------- resources


@pytest.mark.parametrize(
    ("value", "expected"),
    [("500m", 500), (2, 2000), ("2", 2000), ("1.5", 1500), (0.25, 250), ("1e3", 1_000_000)],
)
def test_parse_cpu(value: object, expected: int) -> None:
    assert parse_cpu(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("64Gi", 64 * 2**30),
        ("1Ti", 2**40),
        ("1G", 10**9),
        ("129M", 129 * 10**6),
        ("128974848", 128974848),
        (1024, 1024),
        ("1e3", 1000),
        ("1.5Ki", 1536),
    ],
)
def test_parse_memory(value: object, expected: int) -> None:
    assert parse_memory(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [("H200:8", (8, "H200")), (8, (8, None)), ("8", (8, None)), ("A100-80GB:2", (2, "A100-80GB"))],
)
def test_parse_gpu(value: object, expected: tuple[int, str | None]) -> None:
    assert parse_gpu(value) == expected


@pytest.mark.parametrize(
    ("fn", "value", "field"),
    [
        (parse_cpu, "lots", "resources.cpu"),
        (parse_cpu, -1, "resources.cpu"),
        (parse_cpu, True, "resources.cpu"),
        (parse_memory, "64Gx", "shape.memory"),
        (parse_memory, "Gi", "shape.memory"),
        (parse_gpu, "H200:", "resources.gpu"),
        (parse_gpu, "H200:x", "resources.gpu"),
        (parse_gpu, -2, "resources.gpu"),
        (parse_gpu, 1.5, "resources.gpu"),
    ],
)
def test_bad_quantities_name_field_and_value(fn: object, value: object, field: str) -> None:
    with pytest.raises(QuantityError) as ei:
        fn(value, field)  # type: ignore[operator]
    msg = str(ei.value)
    assert field in msg and repr(value) in msg, msg


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        pytest.param("1e30", True, id="1e30 bytes is the largest quantity"),
        pytest.param("1e31", False, id="past 1e30 as a number"),
        pytest.param("1e400", False, id="an exponent no decimal holds cheaply"),
        pytest.param("800000Ei", True, id="a suffixed quantity under the bound"),
        pytest.param("99999999999999999999Ti", False, id="past the bound only with its suffix"),
        pytest.param("1e18Ei", False, id="a small number times the largest suffix"),
    ],
)
def test_a_quantity_past_1e30_with_its_suffix_is_refused_as_too_large(value: str, ok: bool) -> None:
    if ok:
        assert parse_memory(value, "max_resources.memory") > 0
        return
    with pytest.raises(QuantityError) as ei:
        parse_memory(value, "max_resources.memory")
    assert str(ei.value).startswith("max_resources.memory: "), ei.value
    assert "too large a quantity" in str(ei.value), ei.value


def test_parse_pod_and_quota() -> None:
    p = parse_pod({"cpu": "500m", "memory": "1Gi", "gpu": "H200:2", "ephemeral_storage": "10Gi"})
    assert p == Pod(500, GI, 10 * GI, 2, "H200")
    with pytest.raises(QuantityError, match=r"resources\.cpus"):
        parse_pod({"cpus": 1})
    q = parse_quota({"gpu": "H200:4"})
    assert q is not None and q.gpu == 4 and q.gpu_type == "H200" and q.cpu is None


def test_quota_typed_vs_bare() -> None:
    running = Usage.of([Pod(gpu=6, gpu_type="H200")])
    a100 = Usage.of([Pod(gpu=4, gpu_type="A100")])
    h200 = Usage.of([Pod(gpu=4, gpu_type="H200")])
    assert Quota(gpu=8).exceeded_by(running, a100)  # bare quota counts every type
    assert not Quota(gpu=8, gpu_type="H200").exceeded_by(running, a100)
    assert Quota(gpu=8, gpu_type="H200").exceeded_by(running, h200)
    assert not Quota(cpu=1000).exceeded_by(Usage(), Usage.of([Pod(cpu=1000)]))  # <= is fine


def _state(c: ClusterState) -> tuple[object, ...]:
    return (c.fcpu, c.fmem, c.feph, c.fgpu, c.tcpu, c.tmem, c.teph, c.tgpu, c.groups)


@pytest.mark.parametrize(
    "runs",
    [
        ((Pod(cpu=2000), 3),),  # one pod per node: given back in one shift
        ((Pod(cpu=1000), 4),),  # two pods per node
        ((Pod(cpu=2000, memory=GI), 1), (Pod(cpu=1000), 3)),  # mixed
    ],
)
def test_give_restores_state_and_groups_as_regrouped(runs: tuple[tuple[Pod, int], ...]) -> None:
    c = cluster(("a", 4, Pod(cpu=2000, memory=4 * GI)))
    before = _state(c)
    nodes = c.place(runs)
    assert nodes is not None
    mid = c.clone()
    mid._regroup()
    assert _state(c) == _state(mid)  # groups as a fresh regroup makes them
    c.give(runs, nodes)
    assert _state(c) == before


# --- released: the free vectors with gangs given back (projections read them) -----------

CPU_ONLY = Pod(cpu=1000)
MIXED = Pod(cpu=2000, memory=8 * GI, gpu=1, gpu_type="H200")


@pytest.mark.parametrize(
    ("runs", "nodes"),
    [
        pytest.param(((CPU_ONLY, 3),), [0, 1, 2], id="cpu-only-pods-one-per-node"),
        pytest.param(((CPU_ONLY, 4),), [3, 3, 3, 3], id="cpu-only-pods-stacked-on-one-node"),
        pytest.param(((MIXED, 2),), [1, 2], id="pods-of-every-dimension"),
        pytest.param(((MIXED, 1), (CPU_ONLY, 2)), [0, 0, 1], id="a-gang-of-both-kinds"),
        pytest.param(((CPU_ONLY, 3),), [0, -1, 9], id="nodes-a-report-dropped-are-skipped"),
        pytest.param(((MIXED, 2),), [-1, 1], id="a-dropped-node-of-a-mixed-gang"),
    ],
)
def test_released_gives_back_every_dimension_a_pod_uses(
    runs: tuple[tuple[Pod, int], ...], nodes: list[int]
) -> None:
    c = cluster(("g", 4, gpu_node(4, cpu=8)))
    c.take(((MIXED, 1),), [2])  # free vectors that differ node by node
    before = (c.fcpu[:], c.fmem[:], c.feph[:], c.fgpu[:])
    want = [v[:] for v in before]
    k = 0
    for p, n in runs:
        for i in nodes[k : k + n]:
            if 0 <= i < 4:
                for v, d in zip(want, (p.cpu, p.memory, p.eph, p.gpu), strict=True):
                    v[i] += d
        k += n
    assert [list(v) for v in c.released([(runs, nodes)])] == want
    assert (c.fcpu, c.fmem, c.feph, c.fgpu) == before  # the cluster itself is untouched


def overcommitted() -> ClusterState:
    """Two 4-GPU nodes, the second overcommitted by two GPUs: a capacity report found
    less free than Headway had admitted there (a pod from outside Headway, a node that
    shrank). Recorded live: ``tests/workflows/histories/scheduler_overcommitted_node.json``."""
    c = cluster(("g", 2, gpu_node(4)))
    node = gpu_node(4)
    short = Pod(cpu=node.cpu, memory=node.memory, gpu=-2, gpu_type="H200")
    c.set_nodes([node, node], [node, short], ["n0", "n1"])
    return c


def test_an_overcommitted_node_hides_no_other_nodes_room() -> None:
    # The negative count of the overcommitted node used to cancel node 0's room in the
    # sum: asking said "fits", taking said "no", and the scheduler's pass asserted.
    c = overcommitted()
    assert place(c, pod(1), pod(1), commit=False) is not None
    assert place(c, pod(1), pod(1)) == [0, 0]


def test_an_overcommitted_node_takes_no_pod() -> None:
    c = overcommitted()
    assert place(c, *(pod(1) for _ in range(5)), commit=False) is None
    assert place(c, *(pod(1) for _ in range(4))) == [0, 0, 0, 0]
    assert free(c)[1][0] == -2


def test_free_totals_count_an_overcommitted_node_as_no_room() -> None:
    c = overcommitted()
    assert c.tgpu == 4  # not 4 - 2: the totals bound what fits from above
    c.give(runs_of((pod(1),)), [1])  # a release on the overcommitted node: still none
    assert (c.fgpu[1], c.tgpu) == (-1, 4)
    c.give(runs_of((pod(1), pod(1))), [1, 1])
    assert (c.fgpu[1], c.tgpu) == (1, 5)
    assert place(c, *(pod(1) for _ in range(5))) == [1, 0, 0, 0, 0]
    assert c.tgpu == 0


# --- the same placement rules, as the scheduler decides them, on both engines ----------
#
# One cluster, one greedy queue; each step submits an action and runs a pass (or ends
# a running one). The nodes each admission lands on (in the gang's largest-first
# order), None for an action left waiting, or the door's reason for one refused (no
# node shape of the cluster could ever hold it) are worked out by hand from the rules
# above (the cases mirror the ``place`` tests).

# (id, pods, nodes | None | refusal), or (id, (), None): the running action ends.
Step = tuple[str, tuple[Pod, ...], list[int] | str | None]

FIT_CASES = [
    pytest.param([("g", 2, gpu_node())],
                 [("a", (pod(8),), [0]), ("b", (pod(4),), [1]), ("a", (), None),
                  ("c", (pod(4),), [1]), ("d", (pod(8),), [0])],
                 id="least-free-gpu-first-a-whole-node-kept-free"),
    pytest.param([("g", 1, gpu_node()), ("c", 2, cpu_node())],
                 [("a", (pod(cpu=6),), [1]), ("b", (pod(cpu=4),), [1]),
                  ("c", (pod(cpu=16),), [2]), ("d", (pod(8, cpu=8),), [0])],
                 id="cpu-pods-prefer-nodes-without-gpu-then-least-free-cpu"),
    pytest.param([("bare", 1, gpu_node(t=None)), ("h200", 1, gpu_node())],
                 [("a", (pod(1),), [1]), ("b", (pod(8),), None), ("c", (pod(2, t=None),), [1])],
                 id="a-typed-gpu-never-fits-a-bare-count-node-a-bare-demand-fits-any"),
    pytest.param([("g", 2, gpu_node())],
                 [("a", (pod(6), pod(6), pod(6)), "Unschedulable"),
                  ("b", (pod(6), pod(6), pod(3)), "Unschedulable"),
                  ("c", (pod(6), pod(6), pod(2), pod(2)), [0, 1, 0, 1])],
                 id="a-gang-all-or-nothing-totals-that-fit-are-not-enough"),
    pytest.param([("g", 3, gpu_node())],
                 [("a", (pod(2),) * 5, [0, 0, 0, 0, 1]), ("b", (pod(6),), [1]),
                  ("c", (pod(8),), [2])],
                 id="identical-pods-fill-the-tightest-node-first"),
    pytest.param([("g", 2, gpu_node())],
                 [("a", (pod(6),), [0]), ("b", (pod(5),), [1]),
                  ("c", (pod(1), pod(2), pod(2)), [0, 1, 1])],
                 id="the-largest-pods-of-a-gang-placed-first"),
]  # fmt: skip


@pytest.mark.parametrize(("groups", "steps"), FIT_CASES)
def test_the_scheduler_places_by_the_fit_rules(
    groups: list[tuple[str, int, Pod]], steps: list[Step], engine: str
) -> None:
    spec = ClusterSpec("c", tuple(NodeGroup(n, k, p) for n, k, p in groups))
    s = scheduler_class(engine)([spec], [QueueSpec("q", algorithm=Algorithm.greedy)])
    # Nodes are named by group, numbered within it; listed in node order.
    names = [f"{n}-{j}" for n, k, _ in groups for j in range(k)]
    for i, (aid, pods, nodes) in enumerate(steps):
        t = float(i)
        if not pods:
            s.finish(aid, t)
            continue
        refused = s.submit(ActionSpec(aid, "q", pods, submit=t, seq=i), t)
        if isinstance(nodes, str):
            assert refused == nodes
            continue
        assert refused is None
        got = {x.action_id: list(x.nodes) for x in s.schedule(t)}
        assert got.get(aid) == (None if nodes is None else [names[j] for j in nodes]), (aid, got)
