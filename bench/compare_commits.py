"""Two commits side by side: the core's figures and ``headway simulate`` on KTH-SP2.

Issue #21 asks that after the core redesign no figure be more than 1.3x worse than
before, on the same machine in the same run. This makes a git worktree of each commit
under /tmp (side A, default ``d208c1a``, the last commit before the redesign's week;
side B, default ``HEAD``), and runs each side's package, never this checkout's: the
package is the repository root (``package-dir = {"headway" = "."}``; the editable
install maps ``headway`` to this checkout and ``.venv/mypy-path/headway`` links it the
same way), so each side runs with ``PYTHONPATH`` at a directory of its own holding one
symlink, ``headway -> <worktree>``. Entries of ``PYTHONPATH`` come before the editable
finder (which setuptools appends to ``sys.meta_path``); the script checks it, printing
where ``headway`` and ``headway.scheduler.core`` were imported from on each side.

Per side, each round:

- ``bench/core_pass.py --phase passes`` and ``--phase events`` (each a process of its
  own, as ``core_pass.py`` runs them): full passes over 100,000 pending actions (fits,
  nothing fits; wall and thread CPU time, decisions per second) and 1,000 events with
  their passes (p50, p99, largest; enqueue and completion apart). ``--core-pass
  current`` (the default) runs this checkout's ``bench/core_pass.py`` against each
  side's package: its phases are those of both default sides' own copies (the file did
  not change from d208c1a to the redesign's first commits but for the calibration,
  which is not in the phases), and it names the sizes in its JSON. ``--core-pass own``
  runs each worktree's own copy instead. core_pass's own KTH figure (``simulate`` called
  in-process) is not run: the ``simulate`` runs below measure the same work.
- ``headway simulate --swf KTH-SP2 --algorithm A -o FILE`` for A in strict, greedy,
  backfill, easy: the wall time and the CPU time (user + system, from the child's
  rusage) of the whole command, startup included. Each side's results (the JSON of
  ``-o``) must be byte-identical to the other side's, except ``easy``, which 22698d4
  changed by design (EASY's head takes busy-now nodes first); the summary of each
  side's ``easy`` run is reported instead.

Order: one untimed warm-up round, then ``--rounds`` rounds. Within a round the two sides
of every figure run next to each other (core passes A then B, events A then B, strict A
then B, ...), so both see the same load, and the side that goes first alternates from
round to round (A B, then B A, ...), so that a drifting load cancels. Each figure's
ratio is taken per round, then the median with min and max over the rounds is reported.
The ratio is a slowdown, B over A for times and A over B for rates (``*_per_s``): above
1 means B is slower, and above ``--limit`` (1.3) is flagged.

``calib_us`` (``python -m timeit "sum(range(10000))"``, best of 5, microseconds; see
``bench/_common.py``) is taken at the start and at the end (their mean normalizes) and
between rounds; ``normalized`` holds each side's median figures as on a 100 us machine.

    python bench/compare_commits.py [--a d208c1a] [--b HEAD] [--rounds 3]
        [--phases passes,events] [--algorithms strict,greedy,backfill,easy]
        [--core-pass current|own] [--trace FILE] [--keep]

Takes ~1.5-3 minutes a round on a shared 2-core machine (a round is both sides). The
last line is one JSON object.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import calib_us, calibration, normalize  # type: ignore[import-not-found]

REPO = Path(__file__).resolve().parent.parent
TRACE = REPO.parent / "shared" / "traces" / "KTH-SP2-1996-2.1-cln.swf"
ALGORITHMS = ("strict", "greedy", "backfill", "easy")
PHASES = ("passes", "events")
#: Simulate results that differ between the default sides by design (22698d4).
DIFFER_BY_DESIGN = frozenset({"easy"})
#: Figures taken from core_pass's phases (dotted paths into their JSON).
PHASE_FIGURES: dict[str, tuple[str, ...]] = {
    "passes": (
        "full_pass_ms.nothing_fits.p50",
        "full_pass_ms.nothing_fits.p99",
        "full_pass_ms.fits.p50",
        "full_pass_ms.fits.p99",
        "cpu_ms.full_pass_nothing_fits.p50",
        "cpu_ms.full_pass_nothing_fits.p99",
        "cpu_ms.full_pass_fits.p50",
        "cpu_ms.full_pass_fits.p99",
        "decisions_per_s_nothing_fits",
        "decisions_per_s_fits",
    ),
    "events": (
        "incremental_event_ms.p50",
        "incremental_event_ms.p99",
        "incremental_event_ms.max",
        "incremental_enqueue_ms.p50",
        "incremental_enqueue_ms.p99",
        "incremental_completion_ms.p50",
        "incremental_completion_ms.p99",
        "cpu_ms.incremental_event.p50",
        "cpu_ms.incremental_event.p99",
        "cpu_ms.incremental_enqueue.p50",
        "cpu_ms.incremental_enqueue.p99",
        "cpu_ms.incremental_completion.p50",
        "cpu_ms.incremental_completion.p99",
    ),
}
#: What a simulate result's summary is reported by (when the sides may differ).
SUMMARY_KEYS = ("actions", "makespan", "mean_wait", "mean_bounded_slowdown")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


@dataclass
class Side:
    """One commit: its worktree, the ``PYTHONPATH`` that imports it as ``headway``, and
    where its simulate results go."""

    label: str
    rev: str
    sha: str
    tree: Path
    path_dir: Path
    out_dir: Path
    env: dict[str, str] = field(default_factory=dict)

    def describe(self) -> dict[str, str]:
        line = git("log", "-1", "--format=%h%x00%cI%x00%s", self.sha)
        short, date, subject = line.split("\0")
        return {"rev": self.rev, "sha": self.sha, "short": short, "date": date, "subject": subject}


def make_side(label: str, rev: str, tmp: Path) -> Side:
    sha = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    tree = tmp / label
    git("worktree", "add", "--detach", str(tree), sha)
    path_dir = tmp / f"path-{label}"
    path_dir.mkdir()
    (path_dir / "headway").symlink_to(tree, target_is_directory=True)
    out_dir = tmp / f"out-{label}"
    out_dir.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(path_dir)
    env.pop("PYTHONSTARTUP", None)
    return Side(label, rev, sha, tree, path_dir, out_dir, env)


def verify(side: Side, cwd: Path) -> dict[str, str]:
    """Where ``headway`` imports from on this side: inside its worktree, or fail."""
    code = (
        "import json, os, headway, headway.scheduler.core as c, headway.cli.simulate as s;"
        "print(json.dumps({'headway': headway.__file__,"
        " 'headway.scheduler.core': os.path.realpath(c.__file__),"
        " 'headway.cli.simulate': os.path.realpath(s.__file__)}))"
    )
    got: dict[str, str] = json.loads(
        subprocess.run(
            [sys.executable, "-c", code],
            env=side.env,
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    root = str(side.tree.resolve())
    for mod, f in got.items():
        if not os.path.realpath(f).startswith(root + os.sep):
            raise SystemExit(f"side {side.label}: {mod} imported from {f}, not from {root}")
    return got


def run(cmd: list[str], side: Side, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, env=side.env, cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(
            f"side {side.label} ({side.rev}): {' '.join(cmd)} failed ({proc.returncode}):\n"
            + proc.stderr[-4000:]
        )
    return proc


def core_phase(side: Side, phase: str, script: Path, cwd: Path) -> dict[str, Any]:
    """One core_pass phase in a process of its own; its JSON (the last line)."""
    proc = run([sys.executable, str(script), "--phase", phase], side, cwd)
    got: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return got


def headway_command() -> list[str]:
    """``headway`` as the console script runs it, under this environment's Python."""
    script = Path(sys.executable).with_name("headway")
    if script.exists():
        return [sys.executable, str(script)]
    return [sys.executable, "-c", "import sys; from headway.cli.main import main; sys.exit(main())"]


def simulate(side: Side, algorithm: str, trace: Path, cwd: Path) -> dict[str, Any]:
    """``headway simulate --swf TRACE --algorithm A -o FILE``: wall and CPU seconds, the
    result's digest and its summary."""
    out = side.out_dir / f"{algorithm}.json"
    cmd = [*headway_command(), "simulate", "--swf", str(trace), "--algorithm", algorithm]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    run([*cmd, "-o", str(out)], side, cwd)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    data = out.read_bytes()
    summary = json.loads(data).get("summary", {})
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "sha256": hashlib.sha256(data).hexdigest(),
        "summary": {k: summary.get(k) for k in SUMMARY_KEYS},
    }


def dig(doc: dict[str, Any], dotted: str) -> float | None:
    v: Any = doc
    for part in dotted.split("."):
        if not isinstance(v, dict) or part not in v:
            return None
        v = v[part]
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def slowdown(name: str, a: float, b: float) -> float | None:
    """How much slower B is than A on this figure: B/A for a time, A/B for a rate."""
    if "per_s" in name:
        return a / b if b else None
    return b / a if a else None


def spread(xs: list[float], nd: int = 3) -> dict[str, float]:
    return {
        "median": round(statistics.median(xs), nd),
        "min": round(min(xs), nd),
        "max": round(max(xs), nd),
    }


def fmt(x: float) -> str:
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.3g}" if abs(x) < 10 else f"{x:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--a", default="d208c1a", help="side A (before): a commit")
    ap.add_argument("--b", default="HEAD", help="side B (after): a commit")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (at least 3)")
    ap.add_argument("--phases", default=",".join(PHASES), help="core_pass phases ('' for none)")
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS), help="simulate algorithms")
    ap.add_argument("--core-pass", choices=("current", "own"), default="current")
    ap.add_argument("--trace", type=Path, default=TRACE)
    ap.add_argument("--limit", type=float, default=1.3, help="flag slowdowns above this")
    ap.add_argument("--keep", action="store_true", help="keep the worktrees under /tmp")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds: at least 3 (/work/shared/specs/benchmarks.md)")
    phases = [p for p in args.phases.split(",") if p]
    algorithms = [a for a in args.algorithms.split(",") if a]
    for p in phases:
        if p not in PHASES:
            ap.error(f"--phases: unknown phase {p!r}")
    for a in algorithms:
        if a not in ALGORITHMS:
            ap.error(f"--algorithms: unknown algorithm {a!r}")
    if algorithms and not args.trace.exists():
        ap.error(f"--trace: {args.trace} does not exist")

    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="headway-compare-", dir="/tmp"))
    cwd = tmp / "cwd"  # an empty directory: nothing there imports as ``headway``
    cwd.mkdir()
    sides: list[Side] = []
    try:
        sides = [make_side("a", args.a, tmp), make_side("b", args.b, tmp)]
        a, b = sides
        imported = {s.label: verify(s, cwd) for s in sides}
        for s in sides:
            log(f"side {s.label}: {s.rev} = {s.sha[:12]}, headway from {imported[s.label]}")
        scripts = {
            s.label: (s.tree if args.core_pass == "own" else REPO) / "bench" / "core_pass.py"
            for s in sides
        }
        calib_start = calib_us()
        log(f"calibration at start: {calib_start} us")
        # Every timed job: (kind, what).
        jobs = [("phase", p) for p in phases] + [("simulate", x) for x in algorithms]
        # raw[label][figure] = one value per timed round
        raw: dict[str, dict[str, list[float]]] = {"a": {}, "b": {}}
        digests: dict[str, dict[str, list[str]]] = {"a": {}, "b": {}}
        summaries: dict[str, dict[str, Any]] = {"a": {}, "b": {}}
        sizes: dict[str, Any] = {}
        calib_rounds: list[float] = []
        loads: list[float] = []
        for r in range(-1, args.rounds):
            timed = r >= 0
            order = [a, b] if r < 0 or r % 2 == 0 else [b, a]
            log(
                f"round {r if timed else 'warm-up'}: order {''.join(s.label.upper() for s in order)}"
                f", load {os.getloadavg()[0]:.2f}"
            )
            loads.append(round(os.getloadavg()[0], 2))
            for kind, what in jobs:
                for s in order:
                    if kind == "phase":
                        doc = core_phase(s, what, scripts[s.label], cwd)
                        for k in ("pending", "queues", "clusters", "shapes"):
                            if k in doc:
                                sizes[k] = doc[k]
                        figs = {f"core_pass.{f}": dig(doc, f) for f in PHASE_FIGURES[what]}
                    else:
                        sim = simulate(s, what, args.trace, cwd)
                        digests[s.label].setdefault(what, []).append(sim["sha256"])
                        summaries[s.label][what] = sim["summary"]
                        sizes["kth_jobs"] = sim["summary"].get("actions")
                        figs = {
                            f"simulate.{what}.wall_s": sim["wall_s"],
                            f"simulate.{what}.cpu_s": sim["cpu_s"],
                        }
                    if timed:
                        for name, v in figs.items():
                            if v is not None:
                                raw[s.label].setdefault(name, []).append(v)
                    brief = ", ".join(
                        f"{n.rsplit('.', 2)[-2] if n.startswith('simulate') else n[10:]} {fmt(v)}"
                        for n, v in figs.items()
                        if v is not None and ("p99" in n or n.endswith("_s"))
                    )
                    log(f"  {s.label.upper()} {what}: {brief}")
            if timed:
                calib_rounds.append(calib_us())
                log(f"  calibration after round {r}: {calib_rounds[-1]} us")
        calib = calibration(calib_start, calib_rounds[-1])
        calib["rounds"] = calib_rounds
    finally:
        for s in sides:
            if not args.keep:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(s.tree)],
                    capture_output=True,
                )
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
            subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], capture_output=True)

    figures: dict[str, Any] = {}
    over: list[str] = []
    for name, avals in raw["a"].items():
        bvals = raw["b"].get(name, [])
        pairs = [
            x
            for x in (slowdown(name, av, bv) for av, bv in zip(avals, bvals, strict=False))
            if x is not None
        ]
        if not pairs:
            continue
        sd = spread(pairs)
        flagged = sd["median"] > args.limit
        figures[name] = {
            "a": round(statistics.median(avals), 4),
            "b": round(statistics.median(bvals), 4),
            "slowdown": sd,
            "over_limit": flagged,
        }
        if flagged:
            over.append(name)
    identical: dict[str, Any] = {}
    for x in algorithms:
        da, db = digests["a"].get(x, []), digests["b"].get(x, [])
        identical[x] = {
            "identical": da == db,
            "expected_identical": x not in DIFFER_BY_DESIGN,
            "deterministic": len(set(da)) == 1 and len(set(db)) == 1,
        }
    unexpected = [x for x, v in identical.items() if v["identical"] != v["expected_identical"]]

    # The table.
    desc = {"a": a.describe(), "b": b.describe()}
    print(
        f"A = {desc['a']['short']} ({desc['a']['date']}), B = {desc['b']['short']}"
        f" ({desc['b']['date']}); {args.rounds} rounds after a warm-up; calib_us"
        f" {calib['start']} -> {calib['end']} (mean {calib['mean']}; rounds {calib_rounds})"
    )
    print(f"sizes: {sizes}")
    print(f"{'figure':48s} {'A':>10s} {'B':>10s} {'slowdown':>9s} {'min':>6s} {'max':>6s}")
    for name, f in figures.items():
        sd = f["slowdown"]
        mark = "  OVER" if f["over_limit"] else ""
        print(
            f"{name:48s} {fmt(f['a']):>10s} {fmt(f['b']):>10s} {sd['median']:9.3f}"
            f" {sd['min']:6.3f} {sd['max']:6.3f}{mark}"
        )
    for x, v in identical.items():
        note = "" if v["identical"] == v["expected_identical"] else "  UNEXPECTED"
        same = "identical" if v["identical"] else "differ"
        print(f"simulate {x}: results {same} between the sides{note}")
        if not v["identical"]:
            print(f"  A {summaries['a'].get(x)}\n  B {summaries['b'].get(x)}")
    print(f"over {args.limit}: {', '.join(over) if over else 'none'}")

    time_figures = {name: f for name, f in figures.items()}
    out: dict[str, Any] = {
        "a": desc["a"],
        "b": desc["b"],
        "core_pass_script": (
            "each side's own bench/core_pass.py"
            if args.core_pass == "own"
            else f"{REPO / 'bench' / 'core_pass.py'} (this checkout's) against each side's package"
        ),
        "imported_from": imported,
        "rounds": args.rounds,
        "warmup_rounds": 1,
        "order": "per figure A then B, the first side alternating by round (AB, BA, ...)",
        "phases": phases,
        "algorithms": algorithms,
        "trace": str(args.trace),
        **sizes,
        "calib_us": calib,
        "load_avg_1m": loads,
        "limit": args.limit,
        "slowdown": "B/A for times, A/B for rates (*_per_s): above 1 means B is slower",
        "figures": figures,
        "over_limit": over,
        "simulate_results": identical,
        "simulate_results_unexpected": unexpected,
        "simulate_summary": {
            x: {"a": summaries["a"].get(x), "b": summaries["b"].get(x)} for x in algorithms
        },
        "normalized": {
            side: normalize({name: f[side] for name, f in time_figures.items()}, calib["mean"])
            for side in ("a", "b")
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
