"""Nothing lost, nothing twice, nothing stuck, under ``kill -9`` (issue #20).

The real Temporal dev server (on a SQLite file it is restarted on), the control-plane
worker and three simulated cluster workers, each a separate process. Several hundred
actions over three tightly capped queues, gangs included, while at least six faults
chosen from a seed kill the server, the control plane and cluster workers, some of them
during submission. Then the audit (``audit.py``) reads the pod log the backends append,
Temporal's histories, the scheduler and the store.

``HEADWAY_FAULT_SEED=N`` replays a run; the seed is printed either way.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .run import RunConfig, choose_seed, fault_run

pytestmark = [pytest.mark.faults, pytest.mark.integration]


def _explain(result_findings: list[object], limit: int = 40) -> str:
    lines = [str(f) for f in result_findings[:limit]]
    more = len(result_findings) - limit
    if more > 0:
        lines.append(f"... and {more} more (see report.json)")
    return "\n".join(lines)


# The whole run (start, ~35 s of submission, faults, recovery, audit) takes a few
# minutes on 2 cores; the bound only stops a wedged run from hanging CI.
@pytest.mark.timeout(600)
async def test_sim_fleet_survives_kill9_faults(tmp_path: Path) -> None:
    seed = choose_seed()
    result = await fault_run(RunConfig(seed=seed), tmp_path)
    figures = result.figures()
    assert figures["actions"] >= 300
    assert sum(figures["faults"].values()) >= 6
    assert result.findings == [], (
        f"fault run, seed {seed} (replay: HEADWAY_FAULT_SEED={seed}); {result.summary()}\n"
        f"{_explain(list(result.findings))}\nlogs: {tmp_path / 'logs'}"
    )
    assert result.report.ended_once == figures["actions"]
    assert result.recovery_s is not None
