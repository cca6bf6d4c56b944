"""The shipped Kubernetes manifests parse as real API objects and grant least privilege."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

MANIFEST = Path(__file__).resolve().parents[2] / "docker" / "k8s" / "cluster-worker.yaml"
DOCKER = MANIFEST.parents[1]

_MODELS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("apps/v1", "Deployment"): "V1Deployment",
}


def load() -> dict[str, list[Any]]:
    api = k8s.ApiClient()
    out: dict[str, list[Any]] = {}
    for doc in yaml.safe_load_all(MANIFEST.read_text()):
        model = _MODELS[(doc["apiVersion"], doc["kind"])]
        out.setdefault(doc["kind"], []).append(
            api.deserialize(json.dumps(doc), model, "application/json")
        )
    return out


def rules(role: Any) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for rule in role.rules:
        assert rule.api_groups == [""], "only core resources"
        assert not rule.resource_names and not rule.non_resource_urls
        for res in rule.resources:
            out.setdefault(res, set()).update(rule.verbs)
    return out


def test_manifest_objects_parse_and_wire_together():
    objs = load()
    assert set(objs) == {
        "Namespace",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
    }
    (dep,) = objs["Deployment"]
    (sa,) = objs["ServiceAccount"]
    ns = objs["Namespace"][0].metadata.name
    assert dep.metadata.namespace == sa.metadata.namespace == ns
    assert dep.spec.template.spec.service_account_name == sa.metadata.name
    (c,) = dep.spec.template.spec.containers
    args = [*(c.command or []), *c.args]
    assert args[:1] == ["headway"]
    assert args[args.index("worker") : args.index("worker") + 2] == ["worker", "cluster"]
    assert args[args.index("--backend") + 1] == "kubernetes"
    assert args[args.index("--name") + 1] == "$(CLUSTER)"
    env = {e.name for e in c.env}
    assert {"HEADWAY_TEMPORAL_ADDRESS", "HEADWAY_NAMESPACE", "HEADWAY_CLUSTER"} <= env
    # Dials out only: nothing to connect to.
    assert not c.ports
    assert c.security_context.allow_privilege_escalation is False
    for binding in objs["RoleBinding"] + objs["ClusterRoleBinding"]:
        (subject,) = binding.subjects
        assert (subject.kind, subject.name, subject.namespace) == (
            "ServiceAccount",
            sa.metadata.name,
            ns,
        )
    assert objs["RoleBinding"][0].role_ref.name == objs["Role"][0].metadata.name
    assert objs["ClusterRoleBinding"][0].role_ref.name == objs["ClusterRole"][0].metadata.name


def test_rbac_is_least_privilege():
    objs = load()
    (role,) = objs["Role"]
    (cluster_role,) = objs["ClusterRole"]
    assert rules(role) == {
        # patch: lifting a whole gang's scheduling gate, and a pod's finalizer.
        "pods": {"create", "get", "list", "watch", "patch", "delete"},
        "services": {"create", "get", "delete"},
    }
    # Cluster-wide it may only read: nodes, and pods for their requests.
    assert rules(cluster_role) == {"nodes": {"get", "list", "watch"}, "pods": {"list", "watch"}}
    every = [v for r in (role, cluster_role) for rule in r.rules for v in rule.verbs]
    assert "*" not in every


def test_docs_and_dockerfiles_name_the_configuration():
    readme = (DOCKER / "README.md").read_text()
    for var in ("HEADWAY_TEMPORAL_ADDRESS", "HEADWAY_NAMESPACE", "HEADWAY_CLUSTER"):
        assert var in readme
    worker = (DOCKER / "Dockerfile.cluster-worker").read_text()
    assert "worker cluster" in worker and "EXPOSE" not in worker.replace("No EXPOSE", "")
    assert "worker control-plane" in (DOCKER / "Dockerfile.control-plane").read_text().replace(
        '"worker", "control-plane"', "worker control-plane"
    )
