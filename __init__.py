"""Headway: a queue-first control plane for AI and batch work on a fleet of Kubernetes clusters."""

__version__ = "0.1.0"
