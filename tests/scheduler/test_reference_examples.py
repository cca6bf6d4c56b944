"""The worked examples and the stories, through both engines.

Each runs through ``simulate`` with every scheduling cycle decided by the reference too
(``scheduler/reference.py``) and compared, admissions and reasons (see
``test_reference_differential.check_cycle``): the two engines give the same result at
every step, so the same result. The checked run must also be byte-identical to an
unchecked one: checking reads the core's snapshot, and reading must change nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from headway.scheduler.scenario import Scenario, load_scenario
from headway.scheduler.simulator import load_swf, render_json, simulate

from .helpers import HERE, shared_or_copy
from .test_reference_differential import CheckedScheduler, checked

EXAMPLES = shared_or_copy("specs/examples", HERE / "examples")
STORIES = Path(__file__).resolve().parents[2] / "examples" / "stories"
YAML = sorted(EXAMPLES.glob("*.yaml")) + sorted(STORIES.glob("*.yaml"))
SWF = sorted(EXAMPLES.glob("*.swf"))
# How each SWF example runs (its expect file says so in words).
SWF_RUNS = {"31_easy_extra_busy_nodes_first": ("easy", "requested")}


def _both(sc: Scenario, skipped: int = 0) -> str:
    """The result, unchecked and checked (identical), and that cycles were checked."""
    plain = render_json(simulate(sc, skipped=skipped))
    before = CheckedScheduler.cycles
    with checked():
        both = render_json(simulate(sc, skipped=skipped))
    assert CheckedScheduler.cycles > before
    assert both == plain
    return both


def test_examples_are_found() -> None:
    assert len(YAML) >= 8 and SWF


@pytest.mark.parametrize("path", YAML, ids=[p.stem for p in YAML])
def test_yaml_example(path: Path) -> None:
    _both(load_scenario(path.read_text(), str(path)))


@pytest.mark.parametrize("path", SWF, ids=[p.stem for p in SWF])
def test_swf_example(path: Path) -> None:
    expect = json.loads((path.parent / (path.stem + ".expect.json")).read_text())
    algorithm, estimates = SWF_RUNS[path.stem]
    sc, skipped = load_swf(path.read_text(), algorithm, estimates, str(path))
    doc = json.loads(_both(sc, skipped))
    got = {a["id"]: a for a in doc["actions"]}
    for aid, want in expect["actions"].items():
        assert (got[aid]["start"], got[aid]["end"]) == (want["start"], want["end"]), aid
