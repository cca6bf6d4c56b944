"""Fitting: does a gang fit on a cluster, and on which nodes.

Placement is best fit, largest pod first: each pod goes to the node with the least free
GPU that holds it, then the least free CPU, then node order. Best fit keeps whole nodes
free, so a later big pod or gang still finds one.

Nodes with identical free vectors are interchangeable except for their order, so a
cluster keeps them grouped by free vector; a placement scans groups, not nodes. A fleet
of a thousand 1-CPU nodes is two groups (free, full), which is what makes simulating
long traces cheap.
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Sequence
from typing import Any

from .model import ClusterSpec
from .resources import Pod

__all__ = ["ClusterState", "GroupKey", "Runs", "runs_of", "sort_pods", "uniform"]

# (free gpu, free cpu, free memory, free eph, gpu type of the node)
GroupKey = tuple[int, int, int, int, str | None]
# A gang as runs of identical pods, largest first: ((pod, count), ...)
Runs = tuple[tuple[Pod, int], ...]


def sort_pods(pods: Sequence[Pod]) -> tuple[Pod, ...]:
    """Largest first (GPU, CPU, memory, ephemeral storage); ties keep declared order."""
    if uniform(pods):
        return tuple(pods)
    return tuple(sorted(pods, key=lambda p: (-p.gpu, -p.cpu, -p.memory, -p.eph)))


def uniform(pods: Sequence[Pod]) -> bool:
    """Is a long gang one pod object repeated (an SWF job, replicas)? Such a gang
    needs no sorting or comparing pod by pod."""
    if len(pods) < 8:
        return False
    p0 = pods[0]
    return all(p is p0 for p in pods)


class ClusterState:
    """Free capacity of one cluster, node by node, and best-fit placement over it."""

    __slots__ = (
        "cap",
        "capv",
        "fcpu",
        "feph",
        "fgpu",
        "fmem",
        "groups",
        "gtype",
        "healthy",
        "index",
        "known",
        "name",
        "node_names",
        "now",
        "okey",
        "okey_at",
        "spec",
        "tcpu",
        "teph",
        "tgpu",
        "tmem",
        "version",
    )

    def __init__(self, spec: ClusterSpec, index: int = 0) -> None:
        self.spec = spec
        self.name = spec.name
        self.index = index
        self.known = spec.reports_capacity
        self.healthy = True
        self.version = 0
        # EASY's projections only: the cluster as it is now. Placing at a later time,
        # nodes that tie under best fit are taken busy-now first (see ``_busy_first``).
        self.now: ClusterState | None = None
        # The placement order key (``index.orders._order_key``) kept for the free state it was
        # made from: ``version`` if ``known``, else ``-1 - version`` (None: none yet).
        self.okey: tuple[Any, ...] = ()
        self.okey_at: int | None = None
        self.node_names: list[str] = []
        self.cap: list[Pod] = []
        for g in spec.node_groups:
            for i in range(g.count):
                self.node_names.append(f"{g.name}-{i}")
                self.cap.append(g.shape)
        self._reset_free()

    def _reset_free(self) -> None:
        self._cap_vectors()
        self.fcpu = [p.cpu for p in self.cap]
        self.fmem = [p.memory for p in self.cap]
        self.feph = [p.eph for p in self.cap]
        self.fgpu = [p.gpu for p in self.cap]
        self.gtype = [p.gpu_type for p in self.cap]
        self._regroup()

    def _cap_vectors(self) -> None:
        cap = self.cap
        self.capv = (
            [p.cpu for p in cap],
            [p.memory for p in cap],
            [p.eph for p in cap],
            [p.gpu for p in cap],
        )

    def _regroup(self) -> None:
        groups: dict[GroupKey, list[int]] = {}
        get = groups.get
        for i, k in enumerate(
            zip(self.fgpu, self.fcpu, self.fmem, self.feph, self.gtype, strict=True)
        ):
            g = get(k)
            if g is None:
                groups[k] = [i]
            else:
                g.append(i)
        self.groups = groups
        self.tcpu = _total(self.fcpu)
        self.tmem = _total(self.fmem)
        self.teph = _total(self.feph)
        self.tgpu = _total(self.fgpu)

    def _key(self, i: int) -> GroupKey:
        return (self.fgpu[i], self.fcpu[i], self.fmem[i], self.feph[i], self.gtype[i])

    def set_nodes(self, caps: Sequence[Pod], frees: Sequence[Pod], names: Sequence[str]) -> None:
        """Replace the node list (a capacity report)."""
        self.cap = list(caps)
        self._cap_vectors()
        self.node_names = list(names)
        self.fcpu = [p.cpu for p in frees]
        self.fmem = [p.memory for p in frees]
        self.feph = [p.eph for p in frees]
        self.fgpu = [p.gpu for p in frees]
        self.gtype = [p.gpu_type for p in caps]
        self._regroup()
        self.version += 1

    def _shell(self) -> ClusterState:
        """A copy sharing the immutable parts (spec, nodes); free state left to the caller."""
        c = ClusterState.__new__(ClusterState)
        c.spec = self.spec
        c.name = self.name
        c.index = self.index
        c.known = self.known
        c.healthy = self.healthy
        c.version = self.version
        c.now = None
        c.okey = ()
        c.okey_at = None
        c.node_names = self.node_names
        c.cap = self.cap
        c.capv = self.capv
        c.gtype = self.gtype
        return c

    def clone(self) -> ClusterState:
        """A scratch copy of the free state, for projections."""
        c = self._shell()
        c.fcpu = self.fcpu[:]
        c.fmem = self.fmem[:]
        c.feph = self.feph[:]
        c.fgpu = self.fgpu[:]
        c.groups = {k: v[:] for k, v in self.groups.items()}
        c.tcpu, c.tmem, c.teph, c.tgpu = self.tcpu, self.tmem, self.teph, self.tgpu
        return c

    def projected(self, releases: Sequence[tuple[Runs, Sequence[int]]]) -> ClusterState:
        """A scratch copy with ``releases`` given back, built in one sweep.

        Cheaper than ``clone`` then ``give`` per release: free vectors are summed per
        node and the groups are rebuilt once.
        """
        return self.with_free(self.released(releases))

    def released(
        self, releases: Sequence[tuple[Runs, Sequence[int]]]
    ) -> tuple[list[int], list[int], list[int], list[int]]:
        """The free vectors (cpu, memory, eph, gpu) with ``releases`` given back."""
        fc, fm, fe, fg = self.fcpu[:], self.fmem[:], self.feph[:], self.fgpu[:]
        n_nodes = len(fc)
        for runs, nodes in releases:
            k = 0
            for pod, n in runs:
                pc, pm, pe, pg = pod.cpu, pod.memory, pod.eph, pod.gpu
                if pm or pe or pg:
                    for j in range(k, k + n):
                        i = nodes[j]
                        if 0 <= i < n_nodes:
                            fc[i] += pc
                            fm[i] += pm
                            fe[i] += pe
                            fg[i] += pg
                else:
                    # CPU only (an SWF job's pods): one vector moves.
                    for i in nodes[k : k + n]:
                        if 0 <= i < n_nodes:
                            fc[i] += pc
                k += n
        return fc, fm, fe, fg

    def with_free(self, free: tuple[list[int], list[int], list[int], list[int]]) -> ClusterState:
        """A scratch copy whose free vectors are ``free`` (taken, not copied)."""
        c = self._shell()
        c.fcpu, c.fmem, c.feph, c.fgpu = free
        c._regroup()
        return c

    # --- mutation ------------------------------------------------------------------

    def _move(self, i: int, pod: Pod, m: int) -> None:
        """Take ``m`` copies of ``pod`` from node ``i`` (negative ``m`` gives back)."""
        old = (self.fgpu[i], self.fcpu[i], self.fmem[i], self.feph[i], self.gtype[i])
        lst = self.groups[old]
        if len(lst) == 1:
            del self.groups[old]
        else:
            lst.remove(i)
        dc, dm, de, dg = pod.cpu * m, pod.memory * m, pod.eph * m, pod.gpu * m
        self.fcpu[i] -= dc
        self.fmem[i] -= dm
        self.feph[i] -= de
        self.fgpu[i] -= dg
        self.tcpu += _gain(old[1], dc)
        self.tmem += _gain(old[2], dm)
        self.teph += _gain(old[3], de)
        self.tgpu += _gain(old[0], dg)
        new = (self.fgpu[i], self.fcpu[i], self.fmem[i], self.feph[i], self.gtype[i])
        g = self.groups.get(new)
        if g is None:
            self.groups[new] = [i]
        else:
            insort(g, i)

    def _shift(self, nodes: Sequence[int], pod: Pod, m: int) -> None:
        """Take ``m`` copies of ``pod`` from each of ``nodes`` at once.

        Nodes that shared a free vector still share one afterwards, so a whole group
        moves as one list operation rather than node by node.
        """
        if len(nodes) == 1:
            self._move(nodes[0], pod, m)
            return
        dc, dm, de, dg = pod.cpu * m, pod.memory * m, pod.eph * m, pod.gpu * m
        by_old: dict[GroupKey, list[int]] = {}
        fg, fc, fm, fe, gt = self.fgpu, self.fcpu, self.fmem, self.feph, self.gtype
        keys = zip(
            map(fg.__getitem__, nodes),
            map(fc.__getitem__, nodes),
            map(fm.__getitem__, nodes),
            map(fe.__getitem__, nodes),
            map(gt.__getitem__, nodes),
            strict=True,
        )
        for i, key in zip(nodes, keys, strict=True):
            g = by_old.get(key)
            if g is None:
                by_old[key] = [i]
            else:
                g.append(i)
        groups = self.groups
        for old, ns in by_old.items():
            lst = groups[old]
            if len(ns) == len(lst):
                del groups[old]
            else:
                drop = set(ns)
                lst[:] = [x for x in lst if x not in drop]
            # Only the dimensions the pod uses move.
            for d, f in ((dc, fc), (dm, fm), (de, fe), (dg, fg)):
                if d:
                    for i in ns:
                        f[i] -= d
            new = (old[0] - dg, old[1] - dc, old[2] - dm, old[3] - de, old[4])
            g = groups.get(new)
            if g is None:
                groups[new] = sorted(ns)
            else:
                g.extend(ns)
                g.sort()
            k = len(ns)
            self.tcpu += _gain(old[1], dc) * k
            self.tmem += _gain(old[2], dm) * k
            self.teph += _gain(old[3], de) * k
            self.tgpu += _gain(old[0], dg) * k

    def _apply(self, runs: Runs, nodes: Sequence[int], sign: int) -> None:
        k = 0
        n_nodes = len(self.fcpu)
        for pod, n in runs:
            end = k + n
            seg = nodes[k:end]
            if n > 1 and len(set(seg)) == n and min(seg) >= 0 and max(seg) < n_nodes:
                # One pod per node (the usual gang of whole-node pods): one shift.
                self._shift(list(seg), pod, sign)
                k = end
                continue
            per_m: dict[int, list[int]] = {}
            j = k
            while j < end:
                i = nodes[j]
                m = 1
                while j + m < end and nodes[j + m] == i:
                    m += 1
                if 0 <= i < n_nodes:
                    per_m.setdefault(m, []).append(i)
                j += m
            for m, ns in per_m.items():
                self._shift(ns, pod, sign * m)
            k = end

    def take(self, runs: Runs, nodes: Sequence[int]) -> None:
        """Reserve a gang on ``nodes`` (as returned by ``place``)."""
        self._apply(runs, nodes, 1)
        self.version += 1

    def give(self, runs: Runs, nodes: Sequence[int]) -> None:
        """Release a gang from ``nodes``."""
        self._apply(runs, nodes, -1)
        self.version += 1

    # --- fitting -------------------------------------------------------------------

    def could_hold(self, runs: Runs) -> bool:
        """Would the gang fit on this cluster if it were empty (node shapes only)?"""
        if not self.known:
            return True
        empty = self.clone()
        empty.fcpu = [p.cpu for p in self.cap]
        empty.fmem = [p.memory for p in self.cap]
        empty.feph = [p.eph for p in self.cap]
        empty.fgpu = [p.gpu for p in self.cap]
        empty._regroup()
        return empty.place(runs, commit=False) is not None

    def place(
        self, runs: Runs, commit: bool = True, limit: ClusterState | None = None
    ) -> list[int] | None:
        """Best-fit placement of a gang, given as runs of identical pods, largest first.

        Returns the node index of each pod (in run order), or None if the whole gang does
        not fit. With ``commit`` the capacity is taken; otherwise the state is left as it
        was. ``limit`` is a second state (EASY's extra): a pod must fit both on its node.

        Best fit places identical pods one after another on the tightest node that holds
        them, and a node that took one stays the tightest until it is full, so a run is
        placed node by node, filling each, in (free GPU, free CPU, node order) order.
        """
        need_cpu = need_mem = need_eph = need_gpu = 0
        for p, n in runs:
            need_cpu += p.cpu * n
            need_mem += p.memory * n
            need_eph += p.eph * n
            need_gpu += p.gpu * n
        if (
            need_cpu > self.tcpu
            or need_mem > self.tmem
            or need_eph > self.teph
            or need_gpu > self.tgpu
        ):
            return None
        if limit is not None and (
            need_cpu > limit.tcpu
            or need_mem > limit.tmem
            or need_eph > limit.teph
            or need_gpu > limit.tgpu
        ):
            # Every pod must fit in the limit too: its totals must hold the gang.
            return None
        if not commit and limit is None and len(runs) == 1:
            # Feasibility of identical pods is a count: no need to pick nodes.
            p, n = runs[0]
            total = 0
            for (fg, fc, fm, fe, gt), idxs in self.groups.items():
                if p.gpu and p.gpu_type is not None and gt != p.gpu_type:
                    continue
                k = _count(fg, fc, fm, fe, p, n)
                if k:
                    total += k * len(idxs)
                    if total >= n:
                        return []
            return None
        moves: list[tuple[list[int], Pod, int]] = []
        out: list[int] = []
        # A lone run that is not kept needs no moves: nothing reads them.
        apply = commit or len(runs) > 1
        for p, n in runs:
            got = self._place_run(p, n, limit, moves, apply)
            if got is None:
                for ns, q, m in reversed(moves):
                    self._shift(ns, q, -m)
                return None
            out.extend(got)
        if commit:
            self.version += 1
        else:
            for ns, q, m in reversed(moves):
                self._shift(ns, q, -m)
        return out

    def _place_run(
        self,
        p: Pod,
        n: int,
        limit: ClusterState | None,
        moves: list[tuple[list[int], Pod, int]],
        apply: bool = True,
    ) -> list[int] | None:
        cands: list[tuple[int, int, list[int], int, GroupKey]] = []
        total = 0
        typed = p.gpu and p.gpu_type is not None
        for key, idxs in self.groups.items():
            if typed and key[4] != p.gpu_type:
                continue
            k = _count(key[0], key[1], key[2], key[3], p, n)
            if k:
                cands.append((key[0], key[1], idxs, k, key))
                total += k * len(idxs)
        if total < n:
            return None
        cands.sort(key=lambda c: (c[0], c[1], c[2][0]))
        out: list[int] = []
        # (pods per node, the nodes' group) -> nodes
        takes: dict[tuple[int, GroupKey], list[int]] = {}
        remaining = n
        j = 0
        nc = len(cands)
        now = self.now
        if limit is not None:
            lg, lc, lm, le = limit.fgpu, limit.fcpu, limit.fmem, limit.feph
        while j < nc and remaining > 0:
            fg, fc = cands[j][0], cands[j][1]
            block = [cands[j]]
            j += 1
            while j < nc and cands[j][0] == fg and cands[j][1] == fc:
                block.append(cands[j])
                j += 1
            if len(block) == 1 and limit is None:
                # Every node of the group holds k: fill them in node order (EASY's
                # projections: busy-now nodes first).
                _, _, idxs, k, key = block[0]
                if now is not None:
                    busy, idle = _busy_first(now, idxs, key)
                    idxs = busy + idle
                full = remaining // k
                ns = idxs[:full]
                if ns:
                    t = takes.get((k, key))
                    if t is None:
                        takes[(k, key)] = ns
                    else:
                        t.extend(ns)
                    if k == 1:
                        out.extend(ns)
                    else:
                        for i in ns:
                            out.extend([i] * k)
                    remaining -= k * len(ns)
                if remaining and full < len(idxs):
                    i = idxs[full]
                    takes.setdefault((remaining, key), []).append(i)
                    out.extend([i] * remaining)
                    remaining = 0
                continue
            if now is not None:
                parts = [(_busy_first(now, idxs, key), k, key) for _, _, idxs, k, key in block]
                seq = sorted((i, k, key) for (busy, _), k, key in parts for i in busy)
                seq += sorted((i, k, key) for (_, idle), k, key in parts for i in idle)
            elif len(block) == 1:
                _, _, idxs, k0, key = block[0]
                seq = [(i, k0, key) for i in idxs]
            else:
                seq = sorted((i, k, key) for _, _, idxs, k, key in block for i in idxs)
            for i, k, key in seq:
                if limit is not None:
                    k = _count(lg[i], lc[i], lm[i], le[i], p, k)
                    if not k:
                        continue
                m = k if k < remaining else remaining
                takes.setdefault((m, key), []).append(i)
                out.extend([i] * m)
                remaining -= m
                if not remaining:
                    break
        if remaining:
            return None
        if apply:
            # Moves are applied after the walk: a node appears once per run, and the
            # walk reads a snapshot of each block, so deferring changes nothing but
            # the cost.
            for (m, key), ns in takes.items():
                self._shift_from(key, ns, p, m)
                moves.append((ns, p, m))
        return out

    def _shift_from(self, old: GroupKey, nodes: list[int], pod: Pod, m: int) -> None:
        """``_shift`` of nodes that all share free vector ``old`` (a group of theirs)."""
        groups = self.groups
        lst = groups[old]
        k = len(nodes)
        if k == len(lst):
            del groups[old]
        elif lst[:k] == nodes:
            del lst[:k]
        else:
            drop = set(nodes)
            lst[:] = [x for x in lst if x not in drop]
        dc, dm, de, dg = pod.cpu * m, pod.memory * m, pod.eph * m, pod.gpu * m
        # Only the dimensions the pod uses move.
        for d, f in ((dc, self.fcpu), (dm, self.fmem), (de, self.feph), (dg, self.fgpu)):
            if d:
                for i in nodes:
                    f[i] -= d
        new = (old[0] - dg, old[1] - dc, old[2] - dm, old[3] - de, old[4])
        g = groups.get(new)
        if g is None:
            groups[new] = sorted(nodes)
        else:
            g.extend(nodes)
            g.sort()
        self.tcpu += _gain(old[1], dc) * k
        self.tmem += _gain(old[2], dm) * k
        self.teph += _gain(old[3], de) * k
        self.tgpu += _gain(old[0], dg) * k


def _busy_first(now: ClusterState, idxs: list[int], key: GroupKey) -> tuple[list[int], list[int]]:
    """A projection's group of nodes (free ``key`` each) split for EASY's head, which
    takes among nodes that tie first those busy now and freed by then (more free in the
    projection than in ``now``), then those as free now as then, each in node order. What
    is free now thus stays in the extra, for work that can start now (classic EASY on
    identical nodes; see simulate.md)."""
    ng, nc, nm, ne = now.fgpu, now.fcpu, now.fmem, now.feph
    g, c, m, e = key[0], key[1], key[2], key[3]
    busy = [i for i in idxs if g > ng[i] or c > nc[i] or m > nm[i] or e > ne[i]]
    if len(busy) == len(idxs):
        return busy, []
    if not busy:
        return [], idxs
    taken = set(busy)
    return busy, [i for i in idxs if i not in taken]


def _total(free: Sequence[int]) -> int:
    """The room of a free vector: an overcommitted node (free below zero, when a capacity
    report finds less than was admitted there) counts as none, so that a total is never
    below what one node alone holds and stays an upper bound of what fits."""
    if not free or min(free) >= 0:
        return sum(free)
    return sum(x for x in free if x > 0)


def _gain(free: int, taken: int) -> int:
    """How a total (``_total``) moves when ``taken`` (negative: given back) leaves a node
    with ``free``: only the part of the node's free above zero counts."""
    after = free - taken
    return (after if after > 0 else 0) - (free if free > 0 else 0)


def _count(fg: int, fc: int, fm: int, fe: int, p: Pod, n: int) -> int:
    """How many copies of ``p`` (at most ``n``) fit in a node with this much free."""
    # Unrolled on purpose: this runs once per node group per fit, millions of times in a
    # full pass, and a loop over (free, demand) pairs costs a tuple build per call.
    k = n
    d = p.gpu
    if d:
        x = fg // d
        if x < k:
            k = x
    d = p.cpu
    if d:
        x = fc // d
        if x < k:
            k = x
    d = p.memory
    if d:
        x = fm // d
        if x < k:
            k = x
    d = p.eph
    if d:
        x = fe // d
        if x < k:
            k = x
    # A node can be overcommitted (free below zero): a capacity report found less than
    # what was admitted there, e.g. a pod from outside Headway. It holds no copy, and a
    # negative count must not cancel another node's room in a sum of counts.
    return k if k > 0 else 0


def runs_of(pods: Sequence[Pod]) -> Runs:
    """Group consecutive identical pods: ``(pod, count)`` runs."""
    if uniform(pods):
        return ((pods[0], len(pods)),)
    out: list[tuple[Pod, int]] = []
    for p in pods:
        # Identity first: a short gang is often one pod object repeated too.
        if out and (out[-1][0] is p or out[-1][0] == p):
            out[-1] = (p, out[-1][1] + 1)
        else:
            out.append((p, 1))
    return tuple(out)
