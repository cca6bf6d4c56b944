"""A capacity report as each tenant of a shared cluster gets it (``protocol.report_for``)."""

from __future__ import annotations

import pytest
from headway.protocol import CapacityReport, report_for


def report(actions: list[str], tenants: list[str]) -> CapacityReport:
    return CapacityReport("c", [], actions, 7, 1.0, reflected_tenants=tenants)


@pytest.mark.parametrize(
    ("actions", "tenants", "tenant", "want"),
    [
        pytest.param(["x"], ["a"], "a", ["x"], id="its-own-action-is-reflected"),
        pytest.param(["x"], ["a"], "b", [], id="another-tenants-same-id-is-not"),
        pytest.param(["x", "x"], ["a", "b"], "b", ["x"], id="one-id-in-two-tenants"),
        pytest.param(["old"], [""], "b", ["old"], id="a-pod-of-no-known-tenant-counts-for-all"),
        pytest.param(["x"], [], "b", ["x"], id="a-backend-that-names-no-tenants"),
    ],
)
def test_each_tenant_is_told_only_its_own_reflected_actions(
    actions: list[str], tenants: list[str], tenant: str, want: list[str]
) -> None:
    got = report_for(report(actions, tenants), tenant)
    assert got.reflected_actions == want
    assert got.reflected_tenants == []
    assert (got.cluster, got.nodes, got.sequence) == ("c", [], 7)  # the same capacity
