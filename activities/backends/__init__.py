"""Cluster backends: how a cluster worker reaches its cluster (simulated or Kubernetes)."""

from __future__ import annotations

from .base import (
    ACTION_ANNOTATION,
    ACTION_LABEL,
    ROLE_LABEL,
    TENANT_LABEL,
    ChangeSignal,
    ClusterBackend,
    EventHub,
    label_value,
    pod_name,
    sanitize_dns1123,
)
from .sim import SimBackend

__all__ = [
    "ACTION_ANNOTATION",
    "ACTION_LABEL",
    "ROLE_LABEL",
    "TENANT_LABEL",
    "ChangeSignal",
    "ClusterBackend",
    "EventHub",
    "SimBackend",
    "label_value",
    "pod_name",
    "sanitize_dns1123",
]
