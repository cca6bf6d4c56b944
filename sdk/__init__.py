"""Headway's Python SDK.

Task environments and tasks (``TaskEnvironment``, ``@env.task``, ``with_runcontext``, see
:mod:`headway.sdk.tasks`), also importable from ``headway`` itself; and the lower-level
``Client`` / ``Task`` that submit container actions (:mod:`headway.sdk.client`).
"""

from __future__ import annotations

from ._engine import ServerUnreachable
from .client import (
    Action,
    Client,
    QueueDraining,
    QueuedTooLong,
    QueueFull,
    RateLimited,
    Resources,
    Run,
    SubmissionRejected,
    Task,
    UnknownQueue,
)
from .kube import kube_options
from .tasks import (
    ClusteredTaskEnvironment,
    HeadwayError,
    RayEnvironment,
    ReusePolicy,
    RunContext,
    SerializationError,
    SparkEnvironment,
    TaskCancelled,
    TaskEnvironment,
    TaskFailed,
    TaskTemplate,
    TaskTimedOut,
    TorchRun,
    init,
    map,
    with_runcontext,
)

__all__ = [
    "Action",
    "Client",
    "ClusteredTaskEnvironment",
    "HeadwayError",
    "QueueDraining",
    "QueueFull",
    "QueuedTooLong",
    "RateLimited",
    "RayEnvironment",
    "Resources",
    "ReusePolicy",
    "Run",
    "RunContext",
    "SerializationError",
    "ServerUnreachable",
    "SparkEnvironment",
    "SubmissionRejected",
    "Task",
    "TaskCancelled",
    "TaskEnvironment",
    "TaskFailed",
    "TaskTemplate",
    "TaskTimedOut",
    "TorchRun",
    "UnknownQueue",
    "init",
    "kube_options",
    "map",
    "with_runcontext",
]
