"""An interpreter that used the SDK exits cleanly, every time, however its waits ended.

The failure this guards against (issue #25): a Temporal RPC still in flight when the
script ends (a wait given up by a timeout) completes on a Rust thread that calls back
into Python while the interpreter finalizes: ``Fatal Python error: PyGILState_Release``
(exit 134), or a hang, in about one run in ten.
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import pytest
from headway.cli._stack import Stack

from .conftest import run_program

pytestmark = pytest.mark.integration

SCRIPT = """\
import sys
import headway

env = headway.TaskEnvironment(name="short", resources=headway.Resources(cpu="100m"))

@env.task
async def echo(n: int) -> int:
    return n

if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    run = headway.with_runcontext(queue="default").run(echo, n=n)
    if n % 2:
        try:  # give up at once: the result's long poll is in flight at exit
            run.wait(timeout=0.05)
        except TimeoutError:
            print("gave up")
    else:
        print(run.wait())
"""

RUNS, LANES = 50, 5


def test_fifty_runs_of_a_short_sdk_script_all_exit_0(stack: Stack, tmp_path: Path):
    """50 runs, in 5 lanes of 10 consecutive runs each (so the suite stays short)."""

    def lane(k: int) -> list[tuple[int, int, str]]:
        out = []
        for i in range(RUNS // LANES):
            n = k * (RUNS // LANES) + i
            d = tmp_path / f"run-{n}"
            d.mkdir()
            p = run_program(stack, d, SCRIPT.replace("else 0", f"else {n}"), timeout=60)
            out.append((n, p.returncode, p.stdout + p.stderr))
        return out

    with concurrent.futures.ThreadPoolExecutor(LANES) as pool:
        results = [r for rs in pool.map(lane, range(LANES)) for r in rs]
    bad = [(n, code, text[-500:]) for n, code, text in results if code != 0]
    assert not bad, bad
    assert len(results) == RUNS
    for n, _, text in results:
        assert text.strip() == ("gave up" if n % 2 else str(n)), (n, text)
