"""Bad scenario input: a ``ScenarioError`` naming the file, line, field and value; and the
CLI exits non-zero with that message and writes no output file."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from headway.cli.simulate import simulate as simulate_cmd
from headway.scheduler.scenario import ScenarioError, load_scenario

BASE = [
    "clusters:",  # 1
    "  - name: c1",  # 2
    "    node_groups:",  # 3
    '      - {name: n, count: 1, shape: {cpu: 8, memory: 64Gi, gpu: "H200:8"}}',  # 4
    "queues:",  # 5
    "  - name: q",  # 6
    "    priority: high",  # 7
    "    clusters: [c1]",  # 8
    "workload:",  # 9
    "  - {id: a, queue: q, submit: 0, duration: 10, resources: {cpu: 1, memory: 1Gi}}",  # 10
    "  - {id: b, queue: q, submit: 1, duration: 10, resources: {cpu: 1, memory: 1Gi}}",  # 11
]


def text_with(
    line: int | None = None, content: str | None = None, extra: list[str] | None = None
) -> str:
    lines = list(BASE)
    if line is not None and content is not None:
        lines[line - 1] = content
    return "\n".join(lines + (extra or [])) + "\n"


def test_base_is_valid() -> None:
    sc = load_scenario(text_with(), "ok.yaml")
    assert [w.spec.id for w in sc.workload] == ["a", "b"]


# (id, line replaced, new content, expected line, field, value)
CASES = [
    (
        "unknown-field-in-workload-entry",
        10,
        "  - {id: a, queue: q, submit: 0, duration: 10, colour: red, resources: {cpu: 1}}",
        10,
        "workload[0].colour",
        "unknown field, value 'red'",
    ),
    (
        "missing-required-duration",
        11,
        "  - {id: b, queue: q, submit: 1, resources: {cpu: 1}}",
        11,
        "workload[1].duration",
        "missing",
    ),
    (
        "bad-memory-quantity-64Gx",
        4,
        "      - {name: n, count: 1, shape: {cpu: 8, memory: 64Gx}}",
        4,
        "clusters[0].node_groups[0].shape.memory",
        "64Gx",
    ),
    (
        "bad-cpu-quantity-in-resources",
        10,
        "  - {id: a, queue: q, submit: 0, duration: 10, resources: {cpu: lots}}",
        10,
        "workload[0].resources.cpu",
        "lots",
    ),
    (
        "bad-gpu-string",
        10,
        '  - {id: a, queue: q, submit: 0, duration: 10, resources: {gpu: "H200:x"}}',
        10,
        "workload[0].resources.gpu",
        "H200:x",
    ),
    ("bad-priority-urgent", 7, "    priority: urgent", 7, "queues[0].priority", "urgent"),
    ("bad-algorithm", 7, "    algorithm: fifo", 7, "queues[0].algorithm", "fifo"),
    (
        "duplicate-action-id",
        11,
        "  - {id: a, queue: q, submit: 1, duration: 10, resources: {cpu: 1}}",
        11,
        "workload[1].id",
        "'a'",
    ),
    (
        "unknown-queue",
        11,
        "  - {id: b, queue: nope, submit: 1, duration: 10, resources: {cpu: 1}}",
        11,
        "workload[1].queue",
        "nope",
    ),
    ("unknown-cluster-in-selector", 8, "    clusters: [c1, zz]", 8, "queues[0].clusters[1]", "zz"),
    (
        "both-resources-and-ray",
        10,
        "  - {id: a, queue: q, submit: 0, duration: 10, resources: {cpu: 1},"
        " ray: {head: {cpu: 1}}}",
        10,
        "workload[0]",
        "ray",
    ),
    (
        "negative-duration",
        10,
        "  - {id: a, queue: q, submit: 0, duration: -5, resources: {cpu: 1}}",
        10,
        "workload[0].duration",
        "-5",
    ),
    (
        "non-numeric-submit",
        10,
        "  - {id: a, queue: q, submit: soon, duration: 5, resources: {cpu: 1}}",
        10,
        "workload[0].submit",
        "soon",
    ),
    ("negative-knob", 7, "    depth: -1", 7, "queues[0].depth", "-1"),
    (
        "negative-queue-submit-rate",
        7,
        "    submit_rate: {per_second: -1, burst: 2}",
        7,
        "queues[0].submit_rate.per_second",
        "-1",
    ),
    (
        "max-queued-time-not-a-duration",
        7,
        "    max_queued_time: soon",
        7,
        "queues[0].max_queued_time",
        "'soon' is not a duration",
    ),
    (
        "negative-max-queued-time",
        7,
        "    max_queued_time: -5",
        7,
        "queues[0].max_queued_time",
        "-5",
    ),
    (
        "queue-submit-rate-without-its-burst",
        7,
        "    submit_rate: {per_second: 5}",
        7,
        "queues[0].submit_rate.burst",
        "missing",
    ),
    (
        "unknown-resource-key",
        10,
        "  - {id: a, queue: q, submit: 0, duration: 10, resources: {cpus: 1}}",
        10,
        "workload[0].resources.cpus",
        "unknown",
    ),
]


@pytest.mark.parametrize(
    ("line", "content", "exp_line", "field", "value"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_scenario_error_names_file_line_field_value(
    line: int, content: str, exp_line: int, field: str, value: str
) -> None:
    with pytest.raises(ScenarioError) as ei:
        load_scenario(text_with(line, content), "bad.yaml")
    msg = str(ei.value)
    assert msg.startswith(f"bad.yaml:{exp_line}:"), msg
    assert field in msg, msg
    assert value in msg, msg


# Block mappings: each key on a line of its own, below the key that opens the block. The
# error names the bad key's own line. (id, scenario text, line, field, value)
BLOCK = """\
clusters:
  - name: c1
    node_groups:
      - name: n
        count: 1
        shape:
          cpu: 8
          gpu: {gpu}
queues:
  - name: q
    max_resources:
      cpu: 2
      memory: {memory}
workload:
  - id: a
    queue: q
    submit: 0
    duration: 10
    resources:
      cpu: 1
      {key}: 1Gi
"""
GOOD = {"gpu": '"H200:8"', "memory": "4Gi", "key": "memory"}
BLOCK_CASES = [
    ("bad-gpu-in-a-block-node-shape", {"gpu": '"H200:x"'}, 8, "shape.gpu", "H200:x"),
    ("bad-memory-in-a-block-quota", {"memory": "lots"}, 13, "max_resources.memory", "lots"),
    ("misspelt-key-in-block-resources", {"key": "memroy"}, 21, "resources.memroy", "unknown"),
]


@pytest.mark.parametrize(
    ("changes", "exp_line", "field", "value"),
    [pytest.param(*c[1:], id=c[0]) for c in BLOCK_CASES],
)
def test_an_error_inside_a_block_mapping_names_the_keys_own_line(
    changes: dict[str, str], exp_line: int, field: str, value: str
) -> None:
    text = BLOCK.format(**{**GOOD, **changes})
    with pytest.raises(ScenarioError) as ei:
        load_scenario(text, "bad.yaml")
    msg = str(ei.value)
    assert msg.startswith(f"bad.yaml:{exp_line}:"), msg
    assert field in msg and value in msg, msg


def test_block_scenario_is_valid_as_given() -> None:
    sc = load_scenario(BLOCK.format(**GOOD), "ok.yaml")
    assert [w.spec.id for w in sc.workload] == ["a"]


def test_unknown_top_level_field() -> None:
    with pytest.raises(ScenarioError) as ei:
        load_scenario(text_with(extra=["colour: red"]), "bad.yaml")
    msg = str(ei.value)
    assert "bad.yaml:12" in msg and "colour" in msg, msg


def test_missing_top_level_workload() -> None:
    with pytest.raises(ScenarioError) as ei:
        load_scenario("\n".join(BASE[:8]) + "\n", "bad.yaml")
    assert "bad.yaml" in str(ei.value) and "workload" in str(ei.value)


def test_event_naming_unknown_cluster() -> None:
    with pytest.raises(ScenarioError) as ei:
        load_scenario(text_with(extra=["events:", "  - {at: 5, cluster_down: zz}"]), "bad.yaml")
    msg = str(ei.value)
    assert "bad.yaml:13" in msg and "events[0].cluster_down" in msg and "zz" in msg, msg


def test_update_queue_bad_priority_in_event() -> None:
    with pytest.raises(ScenarioError) as ei:
        load_scenario(
            text_with(extra=["events:", "  - {at: 5, update_queue: {name: q, priority: urgent}}"]),
            "bad.yaml",
        )
    msg = str(ei.value)
    assert "bad.yaml:13" in msg and "priority" in msg and "urgent" in msg, msg


def test_yaml_syntax_error_names_file_and_line() -> None:
    with pytest.raises(ScenarioError) as ei:
        load_scenario(text_with(10, "  - {id: a, queue: q"), "bad.yaml")
    assert str(ei.value).startswith("bad.yaml:"), str(ei.value)


# --------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize(
    ("line", "content", "exp_line", "field", "value"),
    [
        pytest.param(*c[1:], id=c[0])
        for c in CASES
        if c[0]
        in {
            "bad-memory-quantity-64Gx",
            "unknown-queue",
            "both-resources-and-ray",
            "bad-priority-urgent",
        }
    ],
)
def test_cli_exits_nonzero_with_the_message_and_writes_nothing(
    tmp_path: Path, line: int, content: str, exp_line: int, field: str, value: str
) -> None:
    src = tmp_path / "bad.yaml"
    src.write_text(text_with(line, content))
    out = tmp_path / "result.json"
    res = CliRunner().invoke(simulate_cmd, [str(src), "-o", str(out)])
    assert res.exit_code != 0
    text = res.output + (res.stderr or "")
    assert f"{src}:{exp_line}:" in text, text
    assert field in text and value in text, text
    assert not out.exists()


def test_cli_writes_result_for_a_good_scenario(tmp_path: Path) -> None:
    src = tmp_path / "ok.yaml"
    src.write_text(text_with())
    out = tmp_path / "result.json"
    res = CliRunner().invoke(simulate_cmd, [str(src), "-o", str(out), "--seed", "7"])
    assert res.exit_code == 0, res.output
    first = out.read_text()
    assert '"id": "a"' in first
    res2 = CliRunner().invoke(simulate_cmd, [str(src), "-o", str(out), "--seed", "7"])
    assert res2.exit_code == 0
    assert out.read_text() == first  # same input and seed: byte-identical


def test_cli_missing_file_exits_nonzero(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    res = CliRunner().invoke(simulate_cmd, [str(tmp_path / "nope.yaml"), "-o", str(out)])
    assert res.exit_code != 0
    assert not out.exists()
