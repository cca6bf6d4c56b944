"""Headway: a queue-first control plane for AI and batch work on a fleet of Kubernetes clusters.

The SDK's names are importable from here (``headway.TaskEnvironment``, ``headway.Resources``,
``headway.with_runcontext``, ...); they are loaded on first use, so importing any other
part of Headway (the CLI, the workers) does not load the SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "ClusteredTaskEnvironment",
    "HeadwayError",
    "QueueDraining",
    "QueueFull",
    "QueuedTooLong",
    "RateLimited",
    "RayEnvironment",
    "Resources",
    "ReusePolicy",
    "RunContext",
    "SerializationError",
    "ServerUnreachable",
    "SparkEnvironment",
    "SubmissionRejected",
    "TaskCancelled",
    "TaskEnvironment",
    "TaskFailed",
    "TaskTemplate",
    "TaskTimedOut",
    "TorchRun",
    "UnknownQueue",
    "__version__",
    "init",
    "map",
    "run",
    "with_runcontext",
]

# The names loaded from headway.sdk on first use: every public name but the version.
_SDK = frozenset(__all__) - {"__version__"}

if TYPE_CHECKING:
    from headway.sdk import (
        ClusteredTaskEnvironment,
        HeadwayError,
        QueueDraining,
        QueuedTooLong,
        QueueFull,
        RateLimited,
        RayEnvironment,
        Resources,
        ReusePolicy,
        RunContext,
        SerializationError,
        ServerUnreachable,
        SparkEnvironment,
        SubmissionRejected,
        TaskCancelled,
        TaskEnvironment,
        TaskFailed,
        TaskTemplate,
        TaskTimedOut,
        TorchRun,
        UnknownQueue,
        init,
        map,
        with_runcontext,
    )
    from headway.sdk.tasks import run


def __getattr__(name: str) -> Any:
    if name in _SDK:
        # ``run`` is the function; ``headway.sdk.run`` is the tasks' entrypoint module.
        import headway.sdk
        import headway.sdk.tasks

        return getattr(headway.sdk.tasks if name == "run" else headway.sdk, name)
    raise AttributeError(f"module 'headway' has no attribute {name!r}")
