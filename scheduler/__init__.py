"""The scheduler core: pure, deterministic admission decisions over an in-memory snapshot.

No Temporal, Kubernetes, SQL or clock in here, and no I/O: a pass takes the state and
``now`` and returns decisions with reasons. The scheduler workflow and ``headway
simulate`` drive this same core.
"""

from __future__ import annotations

from .core import Admitted, NodeReport, PassError, Scheduler
from .model import (
    ActionSpec,
    Algorithm,
    ClusterSpec,
    DemandKind,
    EnvironmentSpec,
    NodeGroup,
    OrgLimits,
    Priority,
    QueueSpec,
    QueueStatus,
    RateLimit,
)
from .reasons import Reason, describe
from .resources import Pod, QuantityError, Quota, Usage, parse_cpu, parse_gpu, parse_memory
from .scenario import (
    Fleet,
    Scenario,
    ScenarioError,
    demand_from_request,
    load_scenario,
    parse_fleet,
)

__all__ = [
    "ActionSpec",
    "Admitted",
    "Algorithm",
    "ClusterSpec",
    "DemandKind",
    "EnvironmentSpec",
    "Fleet",
    "NodeGroup",
    "NodeReport",
    "OrgLimits",
    "PassError",
    "Pod",
    "Priority",
    "QuantityError",
    "QueueSpec",
    "QueueStatus",
    "Quota",
    "RateLimit",
    "Reason",
    "Scenario",
    "ScenarioError",
    "Scheduler",
    "Usage",
    "demand_from_request",
    "describe",
    "load_scenario",
    "parse_cpu",
    "parse_fleet",
    "parse_gpu",
    "parse_memory",
]
