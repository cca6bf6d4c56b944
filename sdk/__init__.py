"""Headway's Python SDK: submit actions to queues, pin runs, override per task, wait.

See :mod:`headway.sdk.client` for an example.
"""

from __future__ import annotations

from .client import Action, Client, Resources, Run, Task

__all__ = ["Action", "Client", "Resources", "Run", "Task"]
