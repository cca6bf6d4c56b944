"""Configuration in SQL (``headway.store.config``): saved whole, loaded back, audited once
per change however often it is written, seeded only into a tenant never seen."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from headway.store import LeaseStore
from headway.store.config import ORG, QUEUE, ConfigStore

from .test_leases import PG

BACKENDS = ["sqlite", *(["postgresql"] if PG else [])]


@pytest.fixture(params=BACKENDS)
def config(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ConfigStore]:
    url = (
        f"sqlite:///{tmp_path / 'c.db'}"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    s = LeaseStore(url)
    try:
        yield ConfigStore(s)
    finally:
        s.close()


@pytest.fixture
def tenant(request: pytest.FixtureRequest) -> str:
    # Unique per test: the PostgreSQL database is shared between tests.
    return "t-" + str(abs(hash(request.node.nodeid)) % 10**9)


def change(token: str, old: object, new: object, change: str = "update") -> dict[str, object]:
    return {
        "kind": QUEUE,
        "name": "q",
        "change": change,
        "who": "ann@host",
        "source": "cli",
        "at": 100.0,
        "old": old,
        "new": new,
        "token": token,
    }


def test_save_replaces_the_configuration_and_load_reads_it_back(
    config: ConfigStore, tenant: str
) -> None:
    config.save(tenant, {"a": {"name": "a"}, "b": {"name": "b", "depth": 3}}, {"x": 1})
    assert config.load(tenant) == {
        "queues": [{"name": "a"}, {"name": "b", "depth": 3}],
        "org": {"x": 1},
        "clusters": [],
        "environments": [],
    }
    config.save(tenant, {"b": {"name": "b", "depth": 4}}, None)
    assert config.load(tenant) == {
        "queues": [{"name": "b", "depth": 4}],
        "org": None,
        "clusters": [],
        "environments": [],
    }
    assert tenant in config.tenants()


def test_the_cluster_registry_is_replaced_only_when_given(config: ConfigStore, tenant: str) -> None:
    a, b = {"name": "a", "node_groups": []}, {"name": "b", "node_groups": []}
    config.save(tenant, {}, None, clusters={"a": a, "b": b})
    assert config.load(tenant)["clusters"] == [a, b]
    # A scheduler run recorded before the registry sends no clusters: they stay.
    config.save(tenant, {"q": {"name": "q"}}, None)
    assert config.load(tenant)["clusters"] == [a, b]
    config.save(tenant, {"q": {"name": "q"}}, None, clusters={"b": b})
    assert config.load(tenant)["clusters"] == [b]
    assert config.load(tenant)["queues"] == [{"name": "q"}]


def test_declared_environments_are_replaced_only_when_given(
    config: ConfigStore, tenant: str
) -> None:
    a = {"name": "a", "resources": {"cpu": 1000}, "replicas": 2, "concurrency": 4, "idle_ttl": 60}
    b = {**a, "name": "b", "replicas": 1}
    config.save(tenant, {}, None, clusters={}, environments={"a": a, "b": b})
    assert config.load(tenant)["environments"] == [a, b]
    # A scheduler run recorded before environments were stored sends none: they stay,
    # whatever it says of the clusters.
    config.save(tenant, {"q": {"name": "q"}}, None, clusters={"c": {"name": "c"}})
    assert config.load(tenant)["environments"] == [a, b]
    changed = {**a, "replicas": 3}
    config.save(tenant, {"q": {"name": "q"}}, None, environments={"a": changed})
    stored = config.load(tenant)
    assert stored["environments"] == [changed]
    assert stored["clusters"] == [{"name": "c"}] and stored["queues"] == [{"name": "q"}]


def test_an_audit_row_is_written_once_per_token(config: ConfigStore, tenant: str) -> None:
    q1, q2 = {"name": "q", "depth": 1}, {"name": "q", "depth": 2}
    config.save(tenant, {"q": q1}, None, [change("r1:1", None, q1, "create")])
    config.save(
        tenant, {"q": q2}, None, [change("r1:1", None, q1, "create"), change("r1:2", q1, q2)]
    )
    config.save(tenant, {"q": q2}, None, [change("r1:2", q1, q2)])  # a retried write
    rows = config.history(tenant, QUEUE, "q")
    assert [(r["change"], r["old"], r["new"]) for r in rows] == [
        ("create", None, q1),
        ("update", q1, q2),
    ]
    assert rows[0]["who"] == "ann@host" and rows[0]["source"] == "cli" and rows[0]["at"] == 100.0
    assert config.history(tenant, ORG) == []
    assert [r["new"] for r in config.history(tenant, QUEUE, "q", limit=1)] == [q2]


def test_seed_fills_only_a_tenant_never_seen(config: ConfigStore, tenant: str) -> None:
    assert config.seed(tenant, [{"name": "default"}], who="worker", source="fleet")
    assert config.load(tenant)["queues"] == [{"name": "default"}]
    assert [r["source"] for r in config.history(tenant, QUEUE, "default")] == ["fleet"]
    config.save(tenant, {}, None)  # every queue deleted since: the tenant is still known
    assert not config.seed(tenant, [{"name": "default"}], who="worker", source="fleet")
    assert config.load(tenant)["queues"] == []
