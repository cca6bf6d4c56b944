"""SQL tables of the lease store (SQLAlchemy 2 declarative models).

Two tables carry everything the shard schedulers need beyond their bounded in-memory
windows:

* ``headway_leases``: one row per submitted action that the scheduler has not yet
  released. ``status`` moves ``pending`` (only in SQL) -> ``claimed`` (loaded into the
  scheduler's window by the sync whose token is in ``claim``). ``done`` is set once, when
  the action ends (``finished``) or is cancelled (``cancelled``); ``done_claim`` is the
  token of the sync that handed that to the scheduler. Rows are deleted once the
  scheduler has durably consumed them.
* ``headway_shard_flags``: one boolean per (tenant, channel), channel being
  ``q:<queue>`` (new leases in that queue) or ``done`` (ends/cancellations). A submitter
  nudges the scheduler only when it flips a flag from false to true; the scheduler clears
  a flag in the same transaction in which it reads that channel. That is what turns a
  million submissions into a handful of signals.
* ``headway_admissions``: an admission handed to an action's workflow in-process (inside
  its first workflow task's local activity) instead of by signal. The row makes that
  hand-over durable: a retried first task reads it back. Deleted with the lease, once
  the scheduler has collected the action's end.
* ``headway_doors``: the door of each queue of a tenant (its status, depth, submit rate
  and token bucket), and one row per tenant (``queue`` "") with the tenant's submit rate
  and bucket. Written by the scheduler whenever a queue or the org limits change (the
  settings) and by ``put_lease`` (the buckets), which decides every submission against
  them in the transaction that writes its lease (``headway.scheduler.door``).

* ``headway_syncs``: what a scheduler sync answered besides its claims (the queues with
  leases left behind, whether ends are left behind), by the sync's token, kept while the
  workflow task that ran it may still be lost: its retry answers exactly the same, so
  the scheduler decides exactly as before.

* ``headway_tenants``, ``headway_configs``, ``headway_config_audit``: the tenant list,
  each tenant's queue and org configuration as its scheduler last applied it, and one
  audit row per change (who, when, from where, old -> new). Written by the scheduler
  with its door settings; read back by a scheduler that starts afresh
  (``headway.store.config``).

* ``headway_finished``: the record of what ran (issue #28): one row per action that
  ended after its lease was written (succeeded, failed, cancelled, or rejected by the
  scheduler), with its submit, admission and end times, queue, run, task, demand,
  cluster, reasons and outcome. Written once by the action's ``finish_lease`` (keyed by
  tenant and action id, so a retry writes nothing twice), kept for a retention period
  and read back by ``headway export workload`` and ``headway review``
  (``headway.store.history``).

The schema changes through migrations only (``headway.store.migrations``, Alembic): a
change here comes with a new revision there.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Float, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "AdmissionRow",
    "AuditRow",
    "Base",
    "ConfigRow",
    "DoorRow",
    "FinishedRow",
    "LeaseRow",
    "ShardFlag",
    "SyncRow",
    "TenantRow",
]

# SQLite only autoincrements an INTEGER PRIMARY KEY; PostgreSQL wants a 64-bit key for a
# table that may see billions of inserts over its life.
_ID = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    """Declarative base of the Headway store."""


class LeaseRow(Base):
    """One action's lease, from submission until the scheduler has released it."""

    __tablename__ = "headway_leases"
    __table_args__ = (
        UniqueConstraint("tenant", "action_id", name="uq_headway_leases_tenant_action"),
        # The refill scan: oldest pending leases of one queue of one tenant.
        Index("ix_headway_leases_pending", "tenant", "status", "queue", "id"),
        Index("ix_headway_leases_claim", "tenant", "claim"),
        Index("ix_headway_leases_done", "tenant", "done_claim"),
        # Ends (done set): a few rows among a backlog of pending ones, found by a seek
        # instead of a scan of the tenant's rows.
        Index("ix_headway_leases_ended", "tenant", "done"),
        # The door's count of what a queue holds (leases not ended), bounded by its depth.
        Index("ix_headway_leases_held", "tenant", "queue", "done"),
    )

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(200))
    action_id: Mapped[str] = mapped_column(String(400))
    queue: Mapped[str] = mapped_column(String(200))
    workflow_id: Mapped[str] = mapped_column(String(600))
    spec: Mapped[str] = mapped_column(Text)  # ActionSpec.to_dict() as JSON, without seq
    submitted_at: Mapped[float] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    claim: Mapped[str | None] = mapped_column(String(200), nullable=True)
    done: Mapped[str | None] = mapped_column(String(16), nullable=True)
    done_claim: Mapped[str | None] = mapped_column(String(200), nullable=True)


class ShardFlag(Base):
    """Has something arrived on this channel since the scheduler last read it?"""

    __tablename__ = "headway_shard_flags"

    tenant: Mapped[str] = mapped_column(String(200), primary_key=True)
    channel: Mapped[str] = mapped_column(String(210), primary_key=True)
    dirty: Mapped[bool] = mapped_column(Boolean, default=False)


class AdmissionRow(Base):
    """An admission delivered in-process to a waiting action (see ``record_admissions``)."""

    __tablename__ = "headway_admissions"

    tenant: Mapped[str] = mapped_column(String(200), primary_key=True)
    action_id: Mapped[str] = mapped_column(String(400), primary_key=True)
    admission: Mapped[str] = mapped_column(Text)  # protocol.Admission as JSON


class DoorRow(Base):
    """The door of one queue of a tenant, or (``queue`` "") of the tenant itself.

    Settings (pushed by the tenant's scheduler): ``status`` and ``depth`` of a queue, and
    the submit rate (``rate`` per second, ``burst``) of the queue or of the tenant (None:
    unlimited). State (kept by ``put_lease``): the token bucket, ``tokens`` as of
    ``token_time`` (None: never drawn from, full). A tenant without its "" row has no
    door yet: its scheduler has not pushed its settings, and submissions pass.
    """

    __tablename__ = "headway_doors"

    tenant: Mapped[str] = mapped_column(String(200), primary_key=True)
    queue: Mapped[str] = mapped_column(String(200), primary_key=True)
    status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    depth: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    rate: Mapped[float | None] = mapped_column(Float, nullable=True)
    burst: Mapped[float | None] = mapped_column(Float, nullable=True)
    tokens: Mapped[float | None] = mapped_column(Float, nullable=True)
    token_time: Mapped[float] = mapped_column(Float, default=0.0)


class SyncRow(Base):
    """A scheduler sync's answer besides its claims (see ``LeaseStore.sync``)."""

    __tablename__ = "headway_syncs"

    tenant: Mapped[str] = mapped_column(String(200), primary_key=True)
    token: Mapped[str] = mapped_column(String(200), primary_key=True)
    more: Mapped[str] = mapped_column(Text)  # the queues with leases left behind, JSON
    more_done: Mapped[bool] = mapped_column(Boolean, default=False)


class TenantRow(Base):
    """A tenant (shard) that has configuration: a control plane starting up starts its
    scheduler, which reloads the configuration."""

    __tablename__ = "headway_tenants"

    tenant: Mapped[str] = mapped_column(String(200), primary_key=True)
    created_at: Mapped[float] = mapped_column(Float)


class ConfigRow(Base):
    """One queue (``kind`` "queue", ``name`` the queue), the org limits (``kind``
    "org", ``name`` ""), a registered cluster (``kind`` "cluster") or a declared reusable
    environment (``kind`` "environment") of a tenant, as its scheduler last applied them."""

    __tablename__ = "headway_configs"

    tenant: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    spec: Mapped[str] = mapped_column(Text)  # QueueSpec / OrgLimits .to_dict() as JSON
    updated_at: Mapped[float] = mapped_column(Float)


class AuditRow(Base):
    """One configuration change: who made it, when, from where, and old -> new.

    ``token`` names the change in its scheduler run, so writing it again (a retried
    workflow task) adds no second row.
    """

    __tablename__ = "headway_config_audit"
    __table_args__ = (
        UniqueConstraint("tenant", "token", name="uq_headway_config_audit_token"),
        Index("ix_headway_config_audit_name", "tenant", "kind", "name", "id"),
    )

    id: Mapped[int] = mapped_column(_ID, primary_key=True, autoincrement=True)
    tenant: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(200))
    change: Mapped[str] = mapped_column(String(16))  # create | update | delete | set
    who: Mapped[str] = mapped_column(String(200))
    source: Mapped[str] = mapped_column(String(32))  # cli | cli --edit | sdk | fleet | ...
    at: Mapped[float] = mapped_column(Float)
    old: Mapped[str | None] = mapped_column(Text, nullable=True)
    new: Mapped[str | None] = mapped_column(Text, nullable=True)
    token: Mapped[str] = mapped_column(String(200))


class FinishedRow(Base):
    """One finished action, as it ran (see ``headway.store.history``).

    Times are the action workflow's clock (seconds since the epoch): ``submitted_at``
    when its lease was written (the scheduler's submit time), ``admitted_at`` when its
    admission reached it (None: it never ran), ``ended_at`` when it released its
    reservation. ``demand`` is the request as declared (scenario notation), ``pods`` the
    demand per pod as the core computed it (``Pod.to_dict()`` each).
    """

    __tablename__ = "headway_finished"
    __table_args__ = (
        # The window scans of export and review, and retention's delete, by end time.
        Index("ix_headway_finished_ended", "tenant", "ended_at"),
        Index("ix_headway_finished_age", "ended_at"),
    )

    tenant: Mapped[str] = mapped_column(String(200), primary_key=True)
    action_id: Mapped[str] = mapped_column(String(400), primary_key=True)
    queue: Mapped[str] = mapped_column(String(200))
    run: Mapped[str] = mapped_column(String(400))
    task: Mapped[str] = mapped_column(String(400))
    cluster: Mapped[str | None] = mapped_column(String(200), nullable=True)
    submitted_at: Mapped[float] = mapped_column(Float)
    admitted_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float] = mapped_column(Float)
    outcome: Mapped[str] = mapped_column(String(16))  # succeeded|failed|cancelled|rejected
    reason: Mapped[str] = mapped_column(String(200))  # e.g. Succeeded, OOMKilled
    reasons: Mapped[str] = mapped_column(Text)  # JSON list: what it waited for
    kind: Mapped[str] = mapped_column(String(16))  # single | replicas | ray | spark
    pod_count: Mapped[int] = mapped_column(Integer)
    pods: Mapped[str] = mapped_column(Text)  # JSON list of Pod.to_dict()
    demand: Mapped[str] = mapped_column(Text)  # JSON: the declared DemandRequest
    estimate: Mapped[float | None] = mapped_column(Float, nullable=True)
    environment: Mapped[str | None] = mapped_column(String(200), nullable=True)
