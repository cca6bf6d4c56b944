"""Headway's payload converter: same JSON as Temporal's default, both ways, every wire type."""

from __future__ import annotations

from typing import Any

import pytest
from headway import protocol
from headway.protocol import (
    ActionEvent,
    ActionEventKind,
    Admission,
    CapacityReport,
    DemandRequest,
    DispatchRequest,
    GangKind,
    KubeOptions,
    NodeCapacity,
    PodSpec,
    SecretEnv,
    SubmitRequest,
    Toleration,
    Volume,
)
from headway.workflows.shared import (
    AdmitItem,
    DispatchBatch,
    PutLeaseOutput,
    SchedulerInput,
)
from temporalio.converter import DataConverter

ADMISSION = Admission("a1", "c1", ["n1"], 12.5, ["Admitted"])
VALUES: list[tuple[str, Any]] = [
    (
        "dispatch-request-with-a-pod",
        DispatchRequest(
            "t",
            "a1",
            "wf",
            "c1",
            GangKind.REPLICAS,
            [PodSpec("worker", 0, 100, 2**30, gpu=1, gpu_type="H100", command=["x"])],
        ),
    ),
    (
        "dispatch-request-with-kubernetes-options",
        DispatchRequest(
            "t",
            "a1",
            "wf",
            "c1",
            GangKind.SINGLE,
            [PodSpec("main", 0, 100, 2**30)],
            node_hints=["n1"],
            queue="train",
            kube=KubeOptions(
                args=["x"],
                env={"A": "1"},
                env_from_secrets=[SecretEnv("s", "K"), SecretEnv("t")],
                labels={"team": "nlp"},
                tolerations=[Toleration("nvidia.com/gpu", effect="NoSchedule")],
                volumes=[Volume("pvc", "data", "/data", True)],
                shm_size=2**30,
            ),
        ),
    ),
    ("action-event-evicted", ActionEvent("a1", ActionEventKind.EVICTED, "c1")),
    ("action-event-with-enum", ActionEvent("a1", ActionEventKind.OOM_KILLED, "c1", exit_code=137)),
    ("capacity-unknown", CapacityReport("c1", None, ["a1"], 3)),
    ("capacity-known", CapacityReport("c1", [NodeCapacity("n1", 8000, 2**35, free_gpu=2)])),
    (
        "submit-request",
        SubmitRequest("a1", "q", DemandRequest(resources={"cpu": "1"}), "t", estimate_s=60.0),
    ),
    ("admission-nested-optional", PutLeaseOutput(True, ADMISSION)),
    ("dispatch-batch", DispatchBatch("t", [AdmitItem("wf", ADMISSION)], probe=[["a", "wf"]])),
    # A carried snapshot holds infinities (an open horizon) and nested lists.
    ("carried-snapshot", SchedulerInput("t", carried={"h": float("inf"), "q": [[1, 2.5]]})),
]


@pytest.mark.parametrize(("value"), [v for _, v in VALUES], ids=[i for i, _ in VALUES])
@pytest.mark.parametrize(
    ("writer", "reader"),
    [
        pytest.param(protocol.data_converter(), protocol.data_converter(), id="headway-both"),
        pytest.param(protocol.data_converter(), DataConverter.default, id="headway-to-default"),
        pytest.param(DataConverter.default, protocol.data_converter(), id="default-to-headway"),
    ],
)
def test_round_trip(value: Any, writer: DataConverter, reader: DataConverter) -> None:
    payloads = writer.payload_converter.to_payloads([value])
    assert payloads[0].metadata["encoding"] == b"json/plain"
    (back,) = reader.payload_converter.from_payloads(payloads, [type(value)])
    assert back == value


def test_bad_payload_names_the_field() -> None:
    pc = protocol.data_converter().payload_converter
    bad = DataConverter.default.payload_converter.to_payloads([{"action_id": "a", "kind": "Nope"}])
    with pytest.raises(Exception, match="kind"):
        pc.from_payloads(bad, [ActionEvent])
