"""A Kubernetes cluster worker's configuration file (``headway worker cluster --config``).

What the cluster needs beyond its name and fleet entry, in one YAML mapping (the shipped
Deployment mounts it from a ConfigMap, ``docker/k8s/cluster-worker.yaml``)::

    namespace: headway                  # where pods run (default: --pod-namespace, else
                                        # the worker's own)
    queue_namespaces: {train: ml}       # a queue's pods run in its own namespace
    gpu_node_label: nvidia.com/gpu.product
    gpu_names: {H100: NVIDIA-H100-80GB-HBM3}   # short name -> node-label value
    delete_grace_seconds: 30            # SIGTERM, then this long before SIGKILL
    image_pull_grace_seconds: 120       # ErrImagePull/ImagePullBackOff tolerated so long

Every field is optional. :func:`load_kube_config` returns the Kubernetes backend's
keyword arguments, or raises ValueError naming the file, the field and the value.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

__all__ = ["load_kube_config", "parse_kube_config"]

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
_FIELDS = (
    "namespace",
    "queue_namespaces",
    "gpu_node_label",
    "gpu_names",
    "delete_grace_seconds",
    "image_pull_grace_seconds",
)


def _bad(where: str, field: str, value: Any, why: str) -> ValueError:
    return ValueError(f"{where}: {field}: {value!r} {why}")


def _mapping(where: str, field: str, value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise _bad(where, field, value, "must map names to names (strings)")
    return dict(value)


def _seconds(where: str, field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise _bad(where, field, value, "must be a number of seconds, at least 0")
    return float(value)


def parse_kube_config(data: Any, where: str = "cluster config") -> dict[str, Any]:
    """The backend's keyword arguments from the file's mapping (see the module)."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{where}: {data!r} is not a mapping of the fields {', '.join(_FIELDS)}")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise _bad(
            where, unknown[0], data[unknown[0]], f"is no field (one of {', '.join(_FIELDS)})"
        )
    out: dict[str, Any] = {}
    if "namespace" in data:
        ns = data["namespace"]
        if not isinstance(ns, str) or not _DNS1123.match(ns):
            raise _bad(where, "namespace", ns, "is not a namespace name (a DNS-1123 label)")
        out["namespace"] = ns
    if "queue_namespaces" in data:
        spaces = _mapping(where, "queue_namespaces", data["queue_namespaces"])
        for queue, ns in spaces.items():
            if not _DNS1123.match(queue) or not _DNS1123.match(ns):
                raise _bad(
                    where,
                    "queue_namespaces",
                    f"{queue}: {ns}",
                    "maps no queue to a namespace (both DNS-1123 labels)",
                )
        out["queue_namespaces"] = spaces
    if "gpu_node_label" in data:
        label = data["gpu_node_label"]
        if not isinstance(label, str) or not _LABEL_KEY.match(label):
            raise _bad(where, "gpu_node_label", label, "is not a label key")
        out["gpu_node_label"] = label
    if "gpu_names" in data:
        names = _mapping(where, "gpu_names", data["gpu_names"])
        seen: dict[str, str] = {}
        for short, value in names.items():
            if not _LABEL_VALUE.match(short) or not _LABEL_VALUE.match(value):
                raise _bad(
                    where, "gpu_names", f"{short}: {value}", "maps no GPU name to a label value"
                )
            if value in seen:
                raise _bad(
                    where,
                    "gpu_names",
                    f"{short}: {value}",
                    f"maps a label value {seen[value]!r} maps too (a node reports one name)",
                )
            seen[value] = short
        out["gpu_names"] = names
    if "delete_grace_seconds" in data:
        grace = _seconds(where, "delete_grace_seconds", data["delete_grace_seconds"])
        out["delete_grace_s"] = int(grace)
    if "image_pull_grace_seconds" in data:
        out["image_pull_grace_s"] = _seconds(
            where, "image_pull_grace_seconds", data["image_pull_grace_seconds"]
        )
    return out


def load_kube_config(path: str | Path) -> dict[str, Any]:
    """Read and check the file at ``path`` (see :func:`parse_kube_config`)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ValueError(f"--config: cannot read {str(p)!r}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{p}: not YAML: {' '.join(str(exc).split())}") from None
    return parse_kube_config(data, str(p))
