"""The Python SDK: submit actions to Headway queues and follow them.

hw = await Client.connect("localhost:7233")
train = Task("train", Resources(cpu=8, memory="64Gi", gpu="H100:8"), replicas=4)
score = Task("score", Resources(cpu=2, memory="4Gi"))

run = hw.with_runcontext(queue="gpu-h200-fast")        # pin the whole run to a queue
fast = await run.submit(score)                         # ... the fast path stays there
slow = await run.submit(train.override(queue="backfill-queue"))  # ... one task moves
print(await fast.result(), await slow.why())
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from headway import protocol
from headway.connection import ConnectionOptions, ConnectionSettingsError, explain_failure
from headway.connection import load as load_connection
from headway.protocol import DemandRequest, KubeOptions, SubmitRequest
from headway.scheduler.resources import check_pod_count, parse_demand

from ._engine import ADDRESS_ENV, ServerUnreachable, reaching

if TYPE_CHECKING:
    from headway.workflows.action import ActionResult
    from headway.workflows.client import ActionConflictError
    from temporalio.client import Client as TemporalClient
    from temporalio.client import WorkflowHandle

__all__ = [
    "Action",
    "ActionConflictError",
    "Client",
    "QueueDraining",
    "QueueFull",
    "QueuedTooLong",
    "RateLimited",
    "Resources",
    "Run",
    "SubmissionRejected",
    "Task",
    "UnknownQueue",
    "check_seconds",
    "rejection",
]


def __getattr__(name: str) -> Any:
    # ``ActionConflictError`` lives with the Temporal code that raises it; resolved on
    # first use so that importing the SDK (and ``headway --help``) stays free of Temporal.
    if name == "ActionConflictError":
        from headway.workflows.client import ActionConflictError

        return ActionConflictError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class SubmissionRejected(Exception):
    """A submission was refused at the door; nothing was left waiting or holding anything.

    One subclass per class of answer (catch this one for all of them):
    :class:`UnknownQueue`, :class:`QueueDraining`, :class:`QueueFull` (the queue's
    depth), :class:`RateLimited` (with ``retry_after``), and :class:`QueuedTooLong` (an
    accepted action's result, when it waited past its queue's ``max_queued_time``). A reason without a subclass of
    its own (e.g. ``InvalidDemand``) is raised as this class.

    Attributes:
        tenant, action_id, queue: what was submitted where.
        reason: the scheduler's reason (``QueueDepthExceeded``, ``RateLimited``, ...).
        detail: the facts behind it (the limit and its value).
        hint: what to change for the next submission to pass.
        exit_code: the CLI's exit code for this class (3: refused by a queue's or the
            tenant's policy; 4: rate limited, retry later).
    """

    exit_code = 3
    hint = "see the reason above"

    def __init__(
        self,
        tenant: str,
        action_id: str,
        queue: str,
        reason: str,
        detail: str = "",
        retry_after: float | None = None,
    ) -> None:
        self.tenant = tenant
        self.action_id = action_id
        self.queue = queue
        self.reason = reason
        self.detail = detail
        self.retry_after = retry_after
        self.hint = self._hint()
        super().__init__(
            f"action {action_id!r} rejected ({reason}): {detail or reason}; {self.hint}"
        )

    def _hint(self) -> str:
        return type(self).hint


class UnknownQueue(SubmissionRejected):
    """The queue does not exist (in this tenant)."""

    def _hint(self) -> str:
        return (
            f"create it (headway create queue {self.queue}) or submit to one of "
            "`headway get queues`"
        )


class QueueDraining(SubmissionRejected):
    """The queue is draining or drained: it takes no new work."""

    def _hint(self) -> str:
        return f"submit to another queue, or reopen it (headway resume queue {self.queue})"


class QueueFull(SubmissionRejected):
    """The queue holds its ``depth`` of actions (waiting + running, its backlog included)."""

    def _hint(self) -> str:
        return (
            "submit again once some of its actions have ended, or raise its depth "
            f"(headway update queue {self.queue} --depth N)"
        )


class RateLimited(SubmissionRejected):
    """The tenant's (or the queue's) submit rate is exhausted: retry after ``retry_after``
    seconds (None: not before the limit is changed). Resubmitting the same id is safe."""

    exit_code = 4

    def _hint(self) -> str:
        later = (
            f"retry after {_seconds(self.retry_after)} s (the same id may be resubmitted)"
            if self.retry_after is not None
            else "no retry passes until the limit is raised"
        )
        # The door's detail names the exhausted buckets: the tenant's, the queue's or both.
        raise_it = []
        if "the tenant's submit rate" in self.detail or not self.detail:
            raise_it.append("headway update org --submit-rate R --submit-burst B")
        if f"queue {self.queue!r}'s submit rate" in self.detail:
            raise_it.append(f"headway update queue {self.queue} --submit-rate R --submit-burst B")
        return f"{later}, or raise the limit ({'; '.join(raise_it)})"


class QueuedTooLong(SubmissionRejected):
    """Accepted, the action waited its queue's ``max_queued_time`` without starting and
    was rejected then (raised by the action's result, not by ``submit``)."""

    def _hint(self) -> str:
        return (
            "resubmit when the queue is shorter, or raise its limit "
            f"(headway update queue {self.queue} --max-queued-time D)"
        )


_REJECTIONS: dict[str, type[SubmissionRejected]] = {
    "UnknownQueue": UnknownQueue,
    "QueueDraining": QueueDraining,
    "QueueDepthExceeded": QueueFull,
    "RateLimited": RateLimited,
    "QueuedTooLong": QueuedTooLong,
}


def rejection(
    tenant: str,
    action_id: str,
    queue: str,
    reason: str,
    detail: str = "",
    retry_after: float | None = None,
) -> SubmissionRejected:
    """The exception of ``reason``'s class (``SubmissionRejected`` for any other)."""
    cls = _REJECTIONS.get(reason, SubmissionRejected)
    return cls(tenant, action_id, queue, reason, detail, retry_after)


def _seconds(v: float) -> str:
    """A wait as people read it: rounded up to a tenth (0.03 -> 0.1), whole from 10 on."""
    tenths = -(-v * 10 // 1) / 10
    return f"{tenths:g}" if tenths < 10 else str(int(-(-v // 1)))


#: Where the Temporal Web UI is, for the links the SDK and CLI print.
UI_URL_ENV = "HEADWAY_UI_URL"
DEFAULT_UI_URL = "http://localhost:8233"
#: The queue an action goes to when neither the call, the task nor the run names one.
DEFAULT_QUEUE = "default"


@dataclass(frozen=True)
class Resources:
    """What one pod needs, in Kubernetes notation: ``Resources(cpu="500m", memory="64Gi",
    gpu="H200:8")``. A bare GPU count (``gpu=2``) accepts any GPU type.

    Values are checked at construction with the scheduler core's parsers; a bad one raises
    ValueError naming the field and the value. One pod asks for at most 10,000 CPUs, 256Ti
    of memory and of ephemeral storage, and 1,024 GPUs (``headway.scheduler.resources``'s
    ``MAX_POD_*``); a typed GPU request asks for at least one (``"H100:0"`` is refused).
    """

    cpu: str | int | float | None = None
    memory: str | int | None = None
    gpu: str | int | None = None
    ephemeral_storage: str | int | None = None

    def __post_init__(self) -> None:
        parse_demand(
            cpu=self.cpu,
            memory=self.memory,
            gpu=self.gpu,
            ephemeral_storage=self.ephemeral_storage,
        )

    def to_dict(self) -> dict[str, str | int | float]:
        """The set fields, as the wire's ``DemandRequest.resources``."""
        out: dict[str, str | int | float] = {}
        for key in ("cpu", "memory", "gpu", "ephemeral_storage"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


#: The longest ``duration`` or ``estimate`` a task may declare: a year, in seconds.
MAX_SECONDS = 365 * 24 * 3600.0


def check_seconds(value: Any, field: str) -> float:
    """A declared time in seconds: a finite number from 0 to :data:`MAX_SECONDS`.

    Raises:
        ValueError: it is not (named, with its value).
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{field}: {value!r} is not a number of seconds")
    if not 0 <= value <= MAX_SECONDS:  # NaN fails both comparisons
        raise ValueError(
            f"{field}: {value!r} must be a finite number of seconds from 0 to"
            f" {MAX_SECONDS:.0f} (a year)"
        )
    return float(value)


@dataclass(frozen=True)
class Task:
    """A kind of action: its infrastructure and, optionally, the queue it goes to.

    ``replicas`` > 1 makes it a gang (clustered training: replicas x the container, all
    admitted at once on one cluster). ``duration`` is how long it runs on the simulated
    backend; ``estimate`` is the declared runtime backfill uses.
    """

    name: str
    resources: Resources = field(default_factory=Resources)
    replicas: int | None = None
    queue: str | None = None
    duration: float | None = None
    estimate: float | None = None
    image: str = "busybox"
    command: tuple[str, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Kubernetes options of its pods (args, env, labels, volumes, ...): build them with
    #: ``headway.sdk.kube_options(...)``, which checks every value.
    kube: KubeOptions | None = None

    def __post_init__(self) -> None:
        if self.replicas is not None:
            check_pod_count(self.replicas, "replicas")
        for key in ("duration", "estimate"):
            value = getattr(self, key)
            if value is not None:
                check_seconds(value, key)

    def override(self, **changes: Any) -> Task:
        """This task with some fields replaced, e.g. ``task.override(queue="backfill")``:
        re-routes one task without touching the run's queue."""
        return replace(self, **changes)


class Action:
    """A submitted action: its ids, where to see it, and how to wait for it.

    ``created`` is False when the id existed already with the same submission: this is
    that action, nothing new was started (``state`` is its state then, and ``ended`` how
    it ended, if it had). A new one's ``state`` is what the door answered: ``waiting``,
    or ``running`` (on ``cluster``) when it was admitted at once.
    """

    def __init__(
        self,
        client: Client,
        request: SubmitRequest,
        handle: WorkflowHandle[Any, Any],
        *,
        created: bool = True,
        state: str = "submitting",
        ended: ActionResult | None = None,
        cluster: str | None = None,
    ):
        self._client = client
        self.request = request
        self.handle = handle
        self.created = created
        self.state = state
        self.ended = ended
        self.cluster = cluster

    @property
    def id(self) -> str:
        return self.request.action_id

    @property
    def queue(self) -> str:
        return self.request.queue

    @property
    def workflow_id(self) -> str:
        return protocol.action_workflow_id(self.request.tenant, self.request.action_id)

    @property
    def ui_url(self) -> str:
        """This action's workflow in the Temporal Web UI."""
        return self._client.ui_link(self.workflow_id)

    async def result(self) -> Any:
        """Wait until the action is over and return its outcome."""
        from headway.workflows import client as hw

        with reaching(self._client.address):
            return await hw.wait_result(self.handle, action_id=self.id)

    async def why(self) -> Any:
        """Why the action is where it is: its state and the scheduler's reasons."""
        return await self._client.why(self.id)

    async def eta(self) -> dict[str, Any] | None:
        """While it waits: its place in its queue and when it will start (see
        :meth:`Client.eta`); None once it is not waiting."""
        return await self._client.eta(self.id)

    def __repr__(self) -> str:
        return f"Action(id={self.id!r}, queue={self.queue!r}, created={self.created!r})"


class Run:
    """A run context: actions submitted through it share a run id and a default queue."""

    def __init__(self, client: Client, *, queue: str | None, run: str) -> None:
        self._client = client
        self.queue = queue
        self.run = run

    async def submit(self, task: Task, *, id: str | None = None, **extra: Any) -> Action:
        """Submit ``task`` on the task's queue if it has one, else the run's queue."""
        return await self._client.submit(
            task, queue=task.queue or self.queue, run=self.run, id=id, **extra
        )


class Client:
    """A connection to Headway (a Temporal client plus the tenant it acts for)."""

    def __init__(
        self,
        temporal: TemporalClient,
        *,
        tenant: str = protocol.DEFAULT_TENANT,
        ui_url: str | None = None,
    ) -> None:
        self.temporal = temporal
        self.tenant = tenant
        self._ui_url = (ui_url or os.environ.get(UI_URL_ENV) or DEFAULT_UI_URL).rstrip("/")

    @property
    def address(self) -> str:
        """The server's address (host:port), for messages."""
        config = getattr(getattr(self.temporal, "service_client", None), "config", None)
        return str(getattr(config, "target_host", "") or "the configured address")

    @classmethod
    async def connect(
        cls,
        address: str | None = None,
        *,
        namespace: str | None = None,
        tenant: str = protocol.DEFAULT_TENANT,
        ui_url: str | None = None,
        tls: bool | None = None,
        tls_ca_path: str | None = None,
        tls_cert_path: str | None = None,
        tls_key_path: str | None = None,
        tls_server_name: str | None = None,
        api_key: str | None = None,
        config: str | None = None,
        profile: str | None = None,
        connection: ConnectionOptions | None = None,
    ) -> Client:
        """Connect to the Temporal server Headway runs on.

        Settings not given come from the environment and the config file as for the CLI
        (``headway.connection``: ``HEADWAY_TEMPORAL_ADDRESS``, ``HEADWAY_TEMPORAL_TLS_*``,
        ``HEADWAY_TEMPORAL_API_KEY``, ``HEADWAY_CONFIG``, ...); ``connection`` instead
        uses exactly those options. The tenant is reached in its namespace when the
        tenant-namespaces mapping names it.

        Raises:
            ConnectionSettingsError: a setting is wrong, or the server refused the
                credentials or the TLS handshake (one line naming what to fix).
            ServerUnreachable: nothing answers at the address (one line naming it).
        """
        if connection is None:
            connection = load_connection(
                address=address,
                namespace=namespace,
                tls=tls,
                tls_ca_path=tls_ca_path,
                tls_cert_path=tls_cert_path,
                tls_key_path=tls_key_path,
                tls_server_name=tls_server_name,
                api_key=api_key,
                config=config,
                profile=profile,
            )
        else:
            connection = replace(
                connection,
                address=address or connection.address,
                namespace=namespace or connection.namespace,
            )
        connection = connection.for_tenant(tenant)
        try:
            temporal = await connection.connect()
        except ConnectionSettingsError:
            raise
        except Exception as exc:
            line = explain_failure(connection, exc)
            if line.startswith("cannot reach Temporal"):
                # As the task API says it (``headway.ServerUnreachable``): retrying may help.
                raise ServerUnreachable(
                    f"address: {line}; is Headway up? Pass address=... or set {ADDRESS_ENV}"
                ) from None
            raise ConnectionSettingsError(line) from None
        return cls(temporal, tenant=tenant, ui_url=ui_url)

    def ui_link(self, workflow_id: str) -> str:
        """A workflow's page in the Temporal Web UI."""
        return f"{self._ui_url}/namespaces/{self.temporal.namespace}/workflows/{workflow_id}"

    def with_runcontext(self, *, queue: str | None = None, run: str | None = None) -> Run:
        """A run pinned to ``queue``: its tasks go there unless they override it."""
        return Run(self, queue=queue, run=run or f"run-{uuid.uuid4().hex[:8]}")

    def request(
        self,
        task: Task,
        *,
        queue: str | None = None,
        run: str = "",
        id: str | None = None,
        inject: str | None = None,
    ) -> SubmitRequest:
        """The wire request for ``task`` (what :meth:`submit` sends)."""
        resources = task.resources.to_dict()
        return SubmitRequest(
            action_id=id or f"{task.name}-{uuid.uuid4().hex[:8]}",
            queue=queue or task.queue or DEFAULT_QUEUE,
            demand=DemandRequest(resources=resources, replicas=task.replicas),
            tenant=self.tenant,
            run=run,
            task=task.name,
            estimate_s=task.estimate,
            image=task.image,
            command=list(task.command),
            duration_s=task.duration,
            inject=inject,
            labels=dict(task.labels),
            kube=task.kube,
        )

    async def submit(
        self,
        task: Task,
        *,
        queue: str | None = None,
        run: str = "",
        id: str | None = None,
        inject: str | None = None,
    ) -> Action:
        """Enqueue one action of ``task`` on ``queue`` (else the task's, else "default").

        The answer is synchronous: this returns once the queue's door took the action
        in (``state`` ``waiting``, or ``running`` if it was admitted at once), and raises
        if the door refused it.

        Idempotent by ``id``: submitting an id that exists with the same submission
        (queue, task, resources, run, image, ...) starts nothing and returns that action,
        running or ended, with ``created`` False; retrying a submission whose answer was
        lost is therefore safe. An id is never run twice: to run the same task again,
        give it a new id. An id whose submission was rejected may be submitted again
        (that is how a ``RateLimited`` one is retried).

        Raises:
            SubmissionRejected: refused at the door, nothing left behind; by class
                ``UnknownQueue``, ``QueueDraining``, ``QueueFull`` (depth),
                ``RateLimited`` (``retry_after`` seconds).
            ActionConflictError: the id exists with a different submission; the message
                names the id and every field that differs. Nothing was changed.
            ServerUnreachable: the server cannot be reached (any more).
        """
        from headway.workflows import client as hw

        req = self.request(task, queue=queue, run=run, id=id, inject=inject)
        with reaching(self.address):
            sub = await hw.submit_action(self.temporal, req)
        answer = sub.answer
        if answer is not None and not answer.accepted:
            raise rejection(
                req.tenant,
                req.action_id,
                req.queue,
                answer.reason or "Rejected",
                answer.message,
                answer.retry_after,
            )
        return Action(
            self,
            req,
            sub.handle,
            created=sub.created,
            state=sub.state,
            ended=sub.result,
            cluster=sub.answer.cluster if sub.answer is not None else None,
        )

    async def why(self, action_id: str) -> Any:
        """Why ``action_id`` is where it is."""
        from headway.workflows import client as hw

        with reaching(self.address):
            return await hw.why(self.temporal, self.tenant, action_id)

    async def eta(
        self, action_id: str, *, default_runtime: float = 3600.0
    ) -> dict[str, Any] | None:
        """A waiting action's place in its queue and forecast start: ``{"queue",
        "position", "of", "starts_in_s", "cluster"}`` (``position`` 1 is next;
        ``starts_in_s`` None when not within the forecast), the scheduler's state run
        forward on a copy with runtime estimates (``default_runtime`` where an action
        has none), as ``headway describe action`` shows it. None: not waiting."""
        from headway.workflows import client as hw

        with reaching(self.address):
            return await hw.start_estimate(self.temporal, self.tenant, action_id, default_runtime)
