"""Configuration in SQL: each tenant's queues and org limits, and who changed them.

The scheduler workflow owns a tenant's configuration while it runs; it writes it here
with its door settings after every change (``save``: the whole configuration, replaced,
and an audit row per change), and reads it back when it starts afresh (``load``), so a
scheduler started again (terminated, reset, or on a Temporal server that lost its data)
has the queues and limits it had. A control plane starting up starts the scheduler of
every tenant listed here (``tenants``), and seeds an empty database with its fleet
file's queues (``seed``).

Audit rows carry who made the change, from where (``cli``, ``cli --edit``, ``sdk``,
``fleet``), when (the scheduler's clock when it applied it), and the old and new value
(``QueueSpec.to_dict()`` / ``OrgLimits.to_dict()``; None for a create or a delete). Each
has a token unique per tenant (its scheduler run and change number): written twice, it
is one row.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Table, delete, select, update

from .leases import LeaseStore
from .models import AuditRow, ConfigRow, TenantRow

__all__ = ["CLUSTER", "ENVIRONMENT", "ORG", "QUEUE", "ConfigStore"]

QUEUE = "queue"
ORG = "org"
#: The tenant's fleet (the cluster registry): ``ClusterSpec.to_dict()`` per cluster.
CLUSTER = "cluster"
#: The tenant's reusable environments as declared (``EnvironmentSpec.to_dict()``, by the
#: SDK at its first submit): a fresh scheduler knows them without their declaring again.
ENVIRONMENT = "environment"


class ConfigStore:
    """Configuration and audit rows, in the database (and transactions) of a lease store."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store

    # --- written by the scheduler ---------------------------------------------------

    def save(
        self,
        tenant: str,
        queues: Mapping[str, Mapping[str, Any]],
        org: Mapping[str, Any] | None,
        audit: Sequence[Mapping[str, Any]] = (),
        now: float | None = None,
        clusters: Mapping[str, Mapping[str, Any]] | None = None,
        environments: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Replace the tenant's configuration with ``queues`` (by name) and ``org``, and
        ``clusters`` and ``environments`` (by name) when given (None: those stored stay
        as they are: a scheduler run recorded before they were stored sends none), and
        add the ``audit`` rows not written before (by token), in one transaction."""
        at = time.time() if now is None else now
        specs = {(QUEUE, n): json.dumps(dict(q), sort_keys=True) for n, q in queues.items()}
        if org is not None:
            specs[(ORG, "")] = json.dumps(dict(org), sort_keys=True)
        for n, c in (clusters or {}).items():
            specs[(CLUSTER, n)] = json.dumps(dict(c), sort_keys=True)
        for n, e in (environments or {}).items():
            specs[(ENVIRONMENT, n)] = json.dumps(dict(e), sort_keys=True)
        kept = {
            k for k, given in ((CLUSTER, clusters), (ENVIRONMENT, environments)) if given is None
        }
        table = cast(Table, ConfigRow.__table__)
        with self.store._tx() as conn:
            self.store._insert_ignore(conn, TenantRow, {"tenant": tenant, "created_at": at})
            mine = ConfigRow.tenant == tenant
            have = {
                (r[0], r[1]): r[2]
                for r in conn.execute(
                    select(ConfigRow.kind, ConfigRow.name, ConfigRow.spec).where(mine)
                )
            }
            have = {k: v for k, v in have.items() if k[0] not in kept}
            for kind, name in sorted(set(have) - set(specs)):
                conn.execute(
                    delete(ConfigRow).where(
                        mine & (ConfigRow.kind == kind) & (ConfigRow.name == name)
                    )
                )
            for (kind, name), spec in sorted(specs.items()):
                if (kind, name) not in have:
                    self.store._insert_ignore(
                        conn,
                        ConfigRow,
                        {
                            "tenant": tenant,
                            "kind": kind,
                            "name": name,
                            "spec": spec,
                            "updated_at": at,
                        },
                    )
                elif have[(kind, name)] != spec:
                    conn.execute(
                        update(table)
                        .where(
                            (table.c.tenant == tenant)
                            & (table.c.kind == kind)
                            & (table.c.name == name)
                        )
                        .values(spec=spec, updated_at=at)
                    )
            for row in audit:
                self.store._insert_ignore(conn, AuditRow, _audit_values(tenant, row))

    def seed(
        self,
        tenant: str,
        queues: Sequence[Mapping[str, Any]],
        *,
        who: str,
        source: str,
        now: float | None = None,
    ) -> bool:
        """Give a tenant the database has never seen these queues (one audit row each,
        a create); False, and nothing written, if the tenant is known already."""
        at = time.time() if now is None else now
        with self.store._tx() as conn:
            known = conn.execute(select(TenantRow.tenant).where(TenantRow.tenant == tenant))
            if known.first() is not None:
                return False
        audit = [
            {
                "kind": QUEUE,
                "name": q["name"],
                "change": "create",
                "who": who,
                "source": source,
                "at": at,
                "old": None,
                "new": dict(q),
                "token": f"seed:{q['name']}",
            }
            for q in queues
        ]
        self.save(tenant, {q["name"]: q for q in queues}, None, audit, now=at)
        return True

    # --- read ----------------------------------------------------------------------

    def load(self, tenant: str) -> dict[str, Any]:
        """The tenant's configuration: ``{"queues": [spec, ...], "org": spec or None,
        "clusters": [spec, ...], "environments": [spec, ...]}``."""
        with self.store._tx() as conn:
            rows = conn.execute(
                select(ConfigRow.kind, ConfigRow.name, ConfigRow.spec)
                .where(ConfigRow.tenant == tenant)
                .order_by(ConfigRow.kind, ConfigRow.name)
            ).all()
        queues = [json.loads(r[2]) for r in rows if r[0] == QUEUE]
        org = next((json.loads(r[2]) for r in rows if r[0] == ORG), None)
        clusters = [json.loads(r[2]) for r in rows if r[0] == CLUSTER]
        environments = [json.loads(r[2]) for r in rows if r[0] == ENVIRONMENT]
        return {"queues": queues, "org": org, "clusters": clusters, "environments": environments}

    def tenants(self) -> list[str]:
        """Every tenant that has configuration, by name."""
        with self.store._tx() as conn:
            return [r[0] for r in conn.execute(select(TenantRow.tenant).order_by(TenantRow.tenant))]

    def history(
        self, tenant: str, kind: str, name: str = "", limit: int = 50
    ) -> list[dict[str, Any]]:
        """The latest ``limit`` changes of one queue (or of the org limits), oldest first."""
        with self.store._tx() as conn:
            rows = conn.execute(
                select(
                    AuditRow.id,
                    AuditRow.change,
                    AuditRow.who,
                    AuditRow.source,
                    AuditRow.at,
                    AuditRow.old,
                    AuditRow.new,
                )
                .where(
                    (AuditRow.tenant == tenant) & (AuditRow.kind == kind) & (AuditRow.name == name)
                )
                .order_by(AuditRow.id.desc())
                .limit(limit)
            ).all()
        return [
            {
                "change": r[1],
                "who": r[2],
                "source": r[3],
                "at": r[4],
                "old": None if r[5] is None else json.loads(r[5]),
                "new": None if r[6] is None else json.loads(r[6]),
            }
            for r in reversed(rows)
        ]


def _audit_values(tenant: str, row: Mapping[str, Any]) -> dict[str, Any]:
    def js(v: Any) -> str | None:
        return None if v is None else json.dumps(v, sort_keys=True)

    return {
        "tenant": tenant,
        "kind": str(row["kind"]),
        "name": str(row.get("name") or ""),
        "change": str(row["change"]),
        "who": str(row.get("who") or "unknown")[:200],
        "source": str(row.get("source") or "unknown")[:32],
        "at": float(row["at"]),
        "old": js(row.get("old")),
        "new": js(row.get("new")),
        "token": str(row["token"])[:200],
    }
