"""Task environments and tasks: infrastructure declared next to the code that needs it.

    import headway

    env = headway.TaskEnvironment(name="pipeline", resources=headway.Resources(cpu=1))

    @env.task
    async def score(batch: list[int]) -> int:
        return sum(batch)

    run = headway.with_runcontext(queue="production").run(score, batch=[1, 2, 3])
    print(run.url, run.wait())

Every call of a task is an action: a Temporal workflow admitted by its queue's policy,
with its environment's demand. Its code runs on the cluster that admitted it, in a fresh
process (``python -m headway.sdk.run``, see :mod:`headway.sdk.run`), which imports the
task's module from its code root; a task awaiting another task submits a child action in
the same run (on the run's queue unless ``override(queue=...)`` says otherwise) and
waits for its result. Arguments and results travel as JSON, checked against the
function's annotations with pydantic (``TypeAdapter``): ints, floats, strings, lists,
dicts, dataclasses, pydantic models, datetimes, ... A value that cannot be written as
JSON is refused before anything is submitted.

Called outside any run (plain ``await score(batch)`` in a script), a task is just its
function, run in place.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import os
import re
import sys
import uuid
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    ParamSpec,
    TypeVar,
    cast,
    get_type_hints,
    overload,
)
from urllib.parse import quote

from headway.protocol import DemandRequest, SubmitRequest, Toleration, Volume
from headway.scheduler.resources import check_pod_count

from ._engine import ENGINE, LONG_POLL_S, Connection, reaching
from .client import (
    DEFAULT_UI_URL,
    UI_URL_ENV,
    Resources,
    SubmissionRejected,
    check_seconds,
    rejection,
)
from .kube import kube_options

if TYPE_CHECKING:
    from headway.workflows.action import ActionResult
    from temporalio.client import WorkflowHandle

__all__ = [
    "ClusteredTaskEnvironment",
    "HeadwayError",
    "RayEnvironment",
    "ReusePolicy",
    "Run",
    "RunContext",
    "SerializationError",
    "SparkEnvironment",
    "TaskCancelled",
    "TaskEnvironment",
    "TaskFailed",
    "TaskTemplate",
    "TaskTimedOut",
    "TorchRun",
    "init",
    "map",
    "run",
    "with_runcontext",
]

P = ParamSpec("P")
R = TypeVar("R")

#: The image a task's pods run when its environment names none (on Kubernetes it must
#: hold Headway and the task's code under its code root; the simulated backend runs the
#: worker's own interpreter).
DEFAULT_IMAGE = "python:3.11-slim"
#: The code root a task's module is imported from, when set (else derived from the
#: module's file: the directory its top-level package sits in).
CODE_ROOT_ENV = "HEADWAY_CODE_ROOT"
#: The largest JSON document of a task's arguments (they travel in its pod's command).
MAX_INPUTS_BYTES = 64 * 1024

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


# --- errors -----------------------------------------------------------------------------


class HeadwayError(Exception):
    """Base of the SDK's errors about actions (``SubmissionRejected`` is raised as is)."""


class SerializationError(HeadwayError, TypeError):
    """An argument or a result cannot be written as JSON (nothing was submitted)."""


class TaskFailed(HeadwayError):
    """An action ended ``failed``: its code raised (``error_type``, ``error_message``,
    ``remote_traceback``) or its pods did (``reason``: ``OOMKilled``, ``NodeLost``, ...)."""

    def __init__(
        self,
        action_id: str,
        reason: str,
        message: str,
        *,
        error_type: str | None = None,
        error_message: str | None = None,
        remote_traceback: str | None = None,
    ) -> None:
        self.action_id = action_id
        self.reason = reason
        self.message = message
        self.error_type = error_type
        self.error_message = error_message
        self.remote_traceback = remote_traceback
        super().__init__(f"action {action_id!r} failed ({reason}): {message}")


class TaskCancelled(HeadwayError):
    """An action ended ``cancelled`` (``headway cancel``, or its run was)."""

    def __init__(self, action_id: str) -> None:
        self.action_id = action_id
        super().__init__(f"action {action_id!r} was cancelled")


class TaskTimedOut(HeadwayError):
    """An action's workflow was timed out or terminated by hand: it ran no further."""

    def __init__(self, action_id: str, reason: str, message: str = "") -> None:
        self.action_id = action_id
        self.reason = reason
        super().__init__(f"action {action_id!r} ended {reason}{': ' + message if message else ''}")


# --- connection -------------------------------------------------------------------------

_CONNECTION: Connection | None = None


def init(
    address: str | None = None,
    *,
    namespace: str | None = None,
    tenant: str | None = None,
) -> None:
    """Where runs are submitted: a Temporal ``address`` (``host:port``), ``namespace`` and
    Headway ``tenant``. Unset ones come from ``HEADWAY_TEMPORAL_ADDRESS``,
    ``HEADWAY_NAMESPACE``, ``HEADWAY_TENANT``, else ``localhost:7233`` / ``default``.
    Without a call, the environment variables (or defaults) are used.
    """
    global _CONNECTION
    for key, value in (("address", address), ("namespace", namespace), ("tenant", tenant)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"{key}: {value!r} must be a non-empty string")
    _CONNECTION = Connection.from_env(address=address, namespace=namespace, tenant=tenant)


def _connection() -> Connection:
    ctx = _CONTEXT.get()
    if ctx is not None:
        return ctx.connection
    return _CONNECTION or Connection.from_env()


# --- environments -----------------------------------------------------------------------


def _check_queue(queue: str | None, what: str = "queue") -> None:
    if queue is not None and (not isinstance(queue, str) or not _DNS1123.match(queue)):
        raise ValueError(
            f"{what}: {queue!r} is not a queue name (a DNS-1123 label: lower-case letters,"
            " digits and '-', at most 63)"
        )


@dataclass(frozen=True)
class TorchRun:
    """The torchrun runtime of a :class:`ClusteredTaskEnvironment`: each replica gets
    ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` and
    ``NPROC_PER_NODE``."""


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(value: Any, what: str) -> float:
    """A duration: seconds (a number), a ``timedelta``, or ``"90s"``, ``"5m"``, ``"1h"``."""
    if isinstance(value, timedelta):
        secs = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        secs = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        secs = float(m.group(1)) * _UNIT_S[m.group(2)]
    else:
        raise ValueError(
            f"{what}: {value!r} is not a duration (seconds, a timedelta, or e.g. '90s', '5m', '1h')"
        )
    if not secs >= 0 or secs == float("inf"):
        raise ValueError(f"{what}: {value!r} must be a finite duration, at least 0")
    return secs


def _whole(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what}: {value!r} must be a whole number, at least 1")
    return value


@dataclass(frozen=True)
class ReusePolicy:
    """A warm (reusable) environment: a pool of ``replicas`` pods, placed once by the
    first action that needs it and counted once against its queue's quota, each running
    up to ``concurrency`` actions at a time; more wait (``EnvironmentBusy``). It is torn
    down ``idle_ttl`` after its last action ended (seconds, a ``timedelta`` or ``"5m"``).

    Raises:
        ValueError: a field is not what it must be (named, with its value).
    """

    replicas: int = 1
    concurrency: int = 1
    idle_ttl: float | str | timedelta = 300.0

    def __post_init__(self) -> None:
        _whole(self.replicas, "ReusePolicy.replicas")
        check_pod_count(self.replicas, "ReusePolicy.replicas")
        _whole(self.concurrency, "ReusePolicy.concurrency")
        object.__setattr__(self, "idle_ttl", _seconds(self.idle_ttl, "ReusePolicy.idle_ttl"))

    @property
    def idle_ttl_s(self) -> float:
        """``idle_ttl`` in seconds."""
        return float(cast(float, self.idle_ttl))


class TaskEnvironment:
    """Where a task's code runs: its resources (one pod), image, env vars and queue.

    Args:
        name: The environment's name (shown on its actions).
        resources: What one pod needs (``headway.Resources``).
        image: The pods' image (Kubernetes; it holds Headway and the code).
        env_vars: Extra environment of the task's process.
        queue: The queue its tasks go to when neither the call nor the run names one.
        secrets: Environment from Secrets on Kubernetes: ``"SECRET"`` (every key) or
            ``"SECRET:KEY"`` (the variable ``KEY``).
        labels, annotations: The pods' own (``{"team": "nlp"}``).
        tolerations: ``"KEY[=VALUE][:EFFECT]"`` strings (``"nvidia.com/gpu:NoSchedule"``)
            or ``headway.protocol.Toleration``.
        node_selector: Node labels the pods require.
        priority_class, service_account: The pods' PriorityClass and ServiceAccount.
        volumes: ``"pvc:CLAIM:/path[:ro]"``, ``"configmap:NAME:/path"``,
            ``"secret:NAME:/path"``, ``"emptydir:/path"``.
        shm_size: A memory-backed ``/dev/shm`` of that size (``"8Gi"``).

    Every value is checked here (ValueError naming the argument and the value).
        reusable: Keep the environment warm (:class:`ReusePolicy`): a pool of
            processes (pods) placed once, each running many actions' code in turn.
    """

    def __init__(
        self,
        name: str,
        resources: Resources | None = None,
        *,
        image: str = DEFAULT_IMAGE,
        env_vars: Mapping[str, str] | None = None,
        queue: str | None = None,
        secrets: Iterable[str] | str | None = None,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        tolerations: Iterable[str | Toleration] | str | None = None,
        node_selector: Mapping[str, str] | None = None,
        priority_class: str | None = None,
        service_account: str | None = None,
        volumes: Iterable[str | Volume] | str | None = None,
        shm_size: str | int | None = None,
        reusable: ReusePolicy | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"name: {name!r} must be a non-empty string")
        if resources is not None and not isinstance(resources, Resources):
            raise TypeError(f"resources: {resources!r} is not a headway.Resources")
        _check_queue(queue)
        if reusable is not None:
            if not isinstance(reusable, ReusePolicy):
                raise TypeError(f"reusable: {reusable!r} is not a headway.ReusePolicy")
            if not _ENV_NAME.match(name):
                raise ValueError(
                    f"name: {name!r} is not the name of a reusable environment (letters,"
                    " digits, '.', '_', '-', at most 200)"
                )
        self.name = name
        self.resources = resources or Resources(cpu=1, memory="1Gi")
        self.image = image
        self.env_vars = dict(env_vars or {})
        self.queue = queue
        #: The pods' Kubernetes options (None: none given).
        self.kube = kube_options(
            env_from_secrets=secrets,
            labels=labels,
            annotations=annotations,
            tolerations=tolerations,
            node_selector=node_selector,
            priority_class=priority_class,
            service_account=service_account,
            volumes=volumes,
            shm_size=shm_size,
        )
        self.reusable = reusable

    def demand(self) -> DemandRequest:
        """The demand of one action of this environment (the core computes the pods)."""
        return DemandRequest(resources=self.resources.to_dict())

    def process_env(self) -> dict[str, str]:
        """Environment variables the task's process gets."""
        return dict(self.env_vars)

    def environment_spec(self) -> dict[str, Any] | None:
        """The warm environment as the scheduler declares it (``EnvironmentSpec``
        notation), None for an environment that is not reusable."""
        if self.reusable is None:
            return None
        return {
            "name": self.name,
            "resources": self.resources.to_dict(),
            "replicas": self.reusable.replicas,
            "concurrency": self.reusable.concurrency,
            "idle_ttl": self.reusable.idle_ttl_s,
        }

    @overload
    def task(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> TaskTemplate[P, R]: ...

    @overload
    def task(
        self, fn: None = None, /, *, name: str | None = None, estimate: float | None = None
    ) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], TaskTemplate[P, R]]: ...

    def task(
        self,
        fn: Callable[P, Coroutine[Any, Any, R]] | None = None,
        /,
        *,
        name: str | None = None,
        estimate: float | None = None,
    ) -> Any:
        """Decorate an ``async def`` function as a task of this environment (``@env.task``
        or ``@env.task(estimate=60)``).

        Raises:
            TypeError: the function is not ``async def``, or not at a module's top level.
        """

        def wrap(f: Callable[P, Coroutine[Any, Any, R]]) -> TaskTemplate[P, R]:
            return TaskTemplate(f, self, name=name, estimate=estimate)

        if fn is None:
            return wrap
        return wrap(fn)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class ClusteredTaskEnvironment(TaskEnvironment):
    """A gang of ``replicas`` pods started whole (multi-node training); every replica runs
    the task's function, with its rank in ``RANK``; the result is rank 0's."""

    def __init__(
        self,
        name: str,
        resources: Resources | None = None,
        *,
        replicas: int,
        nproc_per_node: int = 1,
        runtime: TorchRun | None = None,
        image: str = DEFAULT_IMAGE,
        env_vars: Mapping[str, str] | None = None,
        queue: str | None = None,
        **kube: Any,
    ) -> None:
        check_pod_count(replicas, "replicas")
        if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int):
            raise ValueError(f"nproc_per_node: {nproc_per_node!r} must be a whole number")
        if nproc_per_node < 1:
            raise ValueError(f"nproc_per_node: {nproc_per_node!r} must be at least 1")
        super().__init__(name, resources, image=image, env_vars=env_vars, queue=queue, **kube)
        self.replicas = replicas
        self.nproc_per_node = nproc_per_node
        self.runtime = runtime or TorchRun()

    def demand(self) -> DemandRequest:
        return DemandRequest(resources=self.resources.to_dict(), replicas=self.replicas)

    def process_env(self) -> dict[str, str]:
        return {**self.env_vars, "NPROC_PER_NODE": str(self.nproc_per_node)}


class RayEnvironment(TaskEnvironment):
    """A Ray cluster admitted whole: a head and worker groups ``[(replicas, Resources)]``.
    The task's function runs on the head."""

    def __init__(
        self,
        name: str,
        *,
        head: Resources,
        worker_groups: Iterable[tuple[int, Resources]] = (),
        image: str = DEFAULT_IMAGE,
        env_vars: Mapping[str, str] | None = None,
        queue: str | None = None,
        **kube: Any,
    ) -> None:
        super().__init__(name, head, image=image, env_vars=env_vars, queue=queue, **kube)
        self.worker_groups = list(worker_groups)
        for i, (n, r) in enumerate(self.worker_groups):
            if isinstance(n, bool) or not isinstance(n, int) or not isinstance(r, Resources):
                raise ValueError(
                    f"worker_groups[{i}]: {(n, r)!r} must be (replicas >= 0, Resources)"
                )
            check_pod_count(n, f"worker_groups[{i}] replicas", least=0)
        check_pod_count(1 + sum(n for n, _ in self.worker_groups), "pods (head + worker_groups)")

    def demand(self) -> DemandRequest:
        return DemandRequest(
            ray={
                "head": self.resources.to_dict(),
                "worker_groups": [
                    {"replicas": n, "resources": r.to_dict()} for n, r in self.worker_groups
                ],
            }
        )


class SparkEnvironment(TaskEnvironment):
    """A Spark application admitted whole: a driver and ``executors`` x ``executor``. The
    task's function runs on the driver."""

    def __init__(
        self,
        name: str,
        *,
        driver: Resources,
        executor: Resources,
        executors: int,
        image: str = DEFAULT_IMAGE,
        env_vars: Mapping[str, str] | None = None,
        queue: str | None = None,
        **kube: Any,
    ) -> None:
        check_pod_count(executors, "executors", least=0)
        check_pod_count(executors + 1, "pods (driver + executors)")
        if not isinstance(executor, Resources):
            raise TypeError(f"executor: {executor!r} is not a headway.Resources")
        super().__init__(name, driver, image=image, env_vars=env_vars, queue=queue, **kube)
        self.executor = executor
        self.executors = executors

    def demand(self) -> DemandRequest:
        return DemandRequest(
            spark={
                "driver": self.resources.to_dict(),
                "executor": self.executor.to_dict(),
                "executors": self.executors,
            }
        )


# --- JSON ---------------------------------------------------------------------------------


@functools.lru_cache(maxsize=512)
def _adapter(hint: Any) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(hint)


def to_json(value: Any, hint: Any, what: str) -> Any:
    """``value`` as a JSON value, per ``hint``.

    Raises:
        SerializationError: it cannot be written as JSON (``what`` names it).
    """
    try:
        out = _adapter(hint).dump_python(value, mode="json", warnings="error")
        json.dumps(out, allow_nan=False)
    except Exception as exc:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        want = getattr(hint, "__name__", None) or str(hint)
        raise SerializationError(
            f"{what}: {shown} ({type(value).__name__}) cannot be written as JSON as a {want}"
            f" (task arguments and results are JSON: numbers, strings, lists, dicts,"
            f" dataclasses, pydantic models): {str(exc).splitlines()[0]}"
        ) from None
    return out


def from_json(value: Any, hint: Any, what: str) -> Any:
    """A JSON value read back as ``hint``; SerializationError naming ``what`` if it is not one."""
    try:
        return _adapter(hint).validate_python(value)
    except Exception as exc:
        raise SerializationError(f"{what}: {value!r:.80} is not a {hint}: {exc}") from None


# --- tasks --------------------------------------------------------------------------------


def _module_and_root(fn: Callable[..., Any]) -> tuple[str, str]:
    """The importable module of ``fn`` and the code root it is imported from."""
    module = fn.__module__
    mod = sys.modules.get(module)
    file = getattr(mod, "__file__", None)
    if file is None:
        raise TypeError(
            f"@env.task: {fn.__qualname__!r} is defined in {module!r}, which has no file to"
            " import it from on the cluster (define tasks in a .py file)"
        )
    path = Path(file).resolve()
    if module == "__main__":
        spec = getattr(mod, "__spec__", None)
        module = spec.name if spec is not None and spec.name else path.stem
    parts = module.split(".")
    up = len(parts) if path.name != "__init__.py" else len(parts) + 1
    root = path
    for _ in range(up):
        root = root.parent
    return module, os.environ.get(CODE_ROOT_ENV) or str(root)


class TaskTemplate(Generic[P, R]):
    """A task: an ``async def`` function with its environment. Await a call of it in
    another task to run it as a child action; ``override(queue=...)`` re-routes one call."""

    def __init__(
        self,
        func: Callable[P, Coroutine[Any, Any, R]],
        env: TaskEnvironment,
        *,
        name: str | None = None,
        estimate: float | None = None,
        queue: str | None = None,
    ) -> None:
        target = inspect.unwrap(func)
        if not inspect.iscoroutinefunction(target):
            raise TypeError(
                f"@env.task: {getattr(func, '__qualname__', func)!r} is not an async function;"
                " define it with `async def`"
            )
        if "<locals>" in func.__qualname__:
            raise TypeError(
                f"@env.task: {func.__qualname__!r} is not at a module's top level (the"
                " cluster imports it by module and name)"
            )
        if estimate is not None:
            check_seconds(estimate, "estimate")
        _check_queue(queue)
        self.func = func
        self.env = env
        self.name = name or func.__name__
        self.estimate = estimate
        self.queue = queue
        self.signature = inspect.signature(func)
        self.module, self.root = _module_and_root(func)
        functools.update_wrapper(self, func)

    def override(
        self, *, queue: str | None = None, estimate: float | None = None
    ) -> TaskTemplate[P, R]:
        """This task with another ``queue`` (or runtime ``estimate``) for the calls made
        through the returned object; the task itself is unchanged."""
        _check_queue(queue, "override(queue)")
        clone = cast("TaskTemplate[P, R]", object.__new__(TaskTemplate))
        clone.__dict__.update(self.__dict__)
        clone.queue = queue if queue is not None else self.queue
        clone.estimate = estimate if estimate is not None else self.estimate
        return clone

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        ctx = _CONTEXT.get()
        if ctx is None:
            return self.func(*args, **kwargs)
        inputs = self.encode_inputs(args, kwargs)
        return self._child(ctx, inputs)

    async def _child(self, ctx: _TaskContext, inputs: str) -> R:
        run = Run(ctx.connection, ctx.run, ctx.run_queue)
        action = await ENGINE.run_async(run._submit(self, inputs, parent=ctx.action_id))
        return cast(R, await action.result())

    # -- inputs and outputs --

    def encode_inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The call's arguments as one JSON document (by parameter name).

        Raises:
            TypeError: they do not fit the function's parameters.
            SerializationError: one cannot be written as JSON (named).
        """
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"task {self.name!r}: {exc}") from None
        bound.apply_defaults()
        hints = _hints(self.func)
        doc = {
            name: to_json(value, hints.get(name, Any), f"argument {name!r} of task {self.name!r}")
            for name, value in bound.arguments.items()
        }
        text = json.dumps(doc, separators=(",", ":"))
        if len(text.encode()) > MAX_INPUTS_BYTES:
            raise SerializationError(
                f"arguments of task {self.name!r}: {len(text.encode())} bytes of JSON, more than"
                f" {MAX_INPUTS_BYTES} (pass a reference, e.g. a URL, instead of the data)"
            )
        return text

    def decode_inputs(self, text: str) -> dict[str, Any]:
        hints = _hints(self.func)
        doc = json.loads(text)
        return {
            name: from_json(value, hints.get(name, Any), f"argument {name!r} of task {self.name!r}")
            for name, value in doc.items()
        }

    def encode_output(self, value: Any) -> Any:
        return to_json(value, _hints(self.func).get("return", Any), f"result of task {self.name!r}")

    def decode_output(self, value: Any) -> R:
        hint = _hints(self.func).get("return", Any)
        return cast(R, from_json(value, hint, f"result of task {self.name!r}"))

    def __repr__(self) -> str:
        return f"TaskTemplate({self.module}.{self.name}, env={self.env.name!r})"


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return get_type_hints(fn)
    except Exception:
        return {}


# --- the task process's context -------------------------------------------------------


@dataclass(frozen=True)
class _TaskContext:
    connection: Connection
    run: str
    run_queue: str | None
    action_id: str


_CONTEXT: contextvars.ContextVar[_TaskContext | None] = contextvars.ContextVar(
    "headway_task_context", default=None
)


# --- runs ---------------------------------------------------------------------------------


def _ui_base() -> str:
    return (os.environ.get(UI_URL_ENV) or DEFAULT_UI_URL).rstrip("/")


class Action:
    """One submitted task call: its id, its workflow's link, and its result."""

    def __init__(
        self,
        task: TaskTemplate[Any, Any],
        req: SubmitRequest,
        handle: WorkflowHandle[Any, Any],
        ns: str,
    ) -> None:
        self.task = task
        self.request = req
        self.handle = handle
        self.namespace = ns

    @property
    def id(self) -> str:
        return self.request.action_id

    @property
    def url(self) -> str:
        return f"{_ui_base()}/namespaces/{self.namespace}/workflows/{self.handle.id}"

    async def outcome(self) -> ActionResult:
        """How the action ended (waits in rounds of ``LONG_POLL_S``; on the SDK's loop).
        The round that sees it end reads its result: the history is fetched once, not
        again to read the result (with many actions in flight, half the server's reads)."""
        from headway.workflows import client as hw
        from temporalio.service import RPCError, RPCStatusCode

        while True:
            try:
                return await hw.wait_result(
                    self.handle, action_id=self.id, rpc_timeout=timedelta(seconds=LONG_POLL_S)
                )
            except RPCError as err:
                # The round's own deadline (a loaded client reports it as CANCELLED,
                # "Timeout expired"): ask again.
                if err.status == RPCStatusCode.DEADLINE_EXCEEDED or (
                    err.status == RPCStatusCode.CANCELLED and "Timeout expired" in str(err)
                ):
                    continue
                if err.status in (RPCStatusCode.RESOURCE_EXHAUSTED, RPCStatusCode.UNAVAILABLE):
                    # "Workflow is busy", or the server briefly away: under load it sheds
                    # reads (seen with 1,000 children of one task); ask again shortly.
                    await asyncio.sleep(0.5)
                    continue
                raise

    async def result(self) -> Any:
        """The task's return value, or its typed failure."""
        res = await ENGINE.run_async(self.outcome())
        return self.task.decode_output(_value_of(res, self.request))


def _value_of(res: ActionResult, req: SubmitRequest) -> Any:
    doc: dict[str, Any] = {}
    if res.output:
        try:
            loaded = json.loads(res.output)
            doc = loaded if isinstance(loaded, dict) else {}
        except ValueError:
            doc = {}
    if res.state == "succeeded":
        return doc.get("output")
    if res.state == "cancelled":
        raise TaskCancelled(res.action_id)
    if res.state == "rejected":
        raise rejection(req.tenant, req.action_id, req.queue, res.reason or "Rejected", res.message)
    if res.reason in ("TimedOut", "Terminated"):
        raise TaskTimedOut(res.action_id, res.reason, res.message)
    err = doc.get("error") if isinstance(doc.get("error"), dict) else {}
    assert isinstance(err, dict)
    raise TaskFailed(
        res.action_id,
        res.reason or "Failed",
        res.message or res.reason or "failed",
        error_type=err.get("type"),
        error_message=err.get("message"),
        remote_traceback=err.get("traceback"),
    )


#: Reusable environments this process declared, by connection and name: their shape.
_DECLARED: dict[tuple[Connection, str], str] = {}
_DECLARING = asyncio.Lock()


async def _declare(client: Any, conn: Connection, env: TaskEnvironment) -> None:
    """Declare ``env``'s warm environment to the tenant's scheduler, once per process and
    shape (the scheduler's answer is idempotent; this spares an update per action).

    Raises:
        ValueError: the scheduler refused it (another shape of it is in use), named.
    """
    spec = env.environment_spec()
    assert spec is not None
    key, shape = (conn, env.name), json.dumps(spec, sort_keys=True)
    if _DECLARED.get(key) == shape:
        return
    from headway.workflows import client as hw
    from temporalio.client import WorkflowUpdateFailedError

    async with _DECLARING:
        if _DECLARED.get(key) == shape:
            return
        try:
            await hw.declare_environment(client, conn.tenant, spec)
        except WorkflowUpdateFailedError as err:
            cause = err.cause if err.cause is not None else err
            raise ValueError(f"reusable: {getattr(cause, 'message', None) or cause}") from None
        _DECLARED[key] = shape


class Run:
    """A run: actions submitted together (the main action and every child it awaits).

    ``url`` is the Temporal Web UI listing the run's actions; ``action`` is the main one.
    """

    def __init__(self, connection: Connection, name: str, queue: str | None) -> None:
        self.connection = connection
        self.name = name
        self.queue = queue
        self.action: Action | None = None

    @property
    def url(self) -> str:
        query = quote(f'HeadwayRun="{self.name}"', safe="")
        return f"{_ui_base()}/namespaces/{self.connection.namespace}/workflows?query={query}"

    async def _submit(
        self,
        task: TaskTemplate[Any, Any],
        inputs: str,
        *,
        parent: str | None = None,
        action_id: str | None = None,
    ) -> Action:
        """Submit one call of ``task`` in this run (on the SDK's loop); ``action_id``
        names it (a refused one may be submitted again under the same id)."""

        conn = self.connection
        queue = task.queue or task.env.queue or self.queue or "default"
        action_id = action_id or (
            f"{self.name}-{task.name}"
            if parent is None
            else f"{self.name}-{task.name}-{uuid.uuid4().hex[:6]}"
        )
        command = [
            "python",
            "-m",
            "headway.sdk.run",
            "--module",
            task.module,
            "--task",
            task.func.__name__,
            "--root",
            task.root,
            "--action",
            action_id,
            "--run",
            self.name,
            "--address",
            conn.address,
            "--namespace",
            conn.namespace,
            "--tenant",
            conn.tenant,
            "--inputs",
            inputs,
        ]
        if self.queue:
            command[-2:-2] = ["--run-queue", self.queue]
        env = task.env.process_env()
        for key, value in sorted(env.items()):
            command[-2:-2] = ["--env", f"{key}={value}"]
        pool = task.env.reusable
        if pool is not None:
            # The cluster runs the call in the environment's pool of long-lived
            # processes (see headway.sdk.run --serve) rather than a fresh one.
            command[-2:-2] = [
                "--pool",
                task.env.name,
                "--pool-replicas",
                str(pool.replicas),
                "--pool-concurrency",
                str(pool.concurrency),
                "--pool-idle-ttl",
                f"{pool.idle_ttl_s:g}",
            ]
        req = SubmitRequest(
            action_id=action_id,
            queue=queue,
            demand=task.env.demand(),
            tenant=conn.tenant,
            run=self.name,
            task=f"{task.env.name}.{task.name}",
            estimate_s=task.estimate,
            image=task.env.image,
            command=command,
            labels={"headway.io/parent": parent} if parent else {},
            kube=task.env.kube,
            environment=task.env.name if pool is not None else None,
        )
        client = await ENGINE.client(conn)
        from headway.workflows import client as hw

        with reaching(conn.address):
            if pool is not None:
                await _declare(client, conn, task.env)
            sub = await hw.submit_action(client, req)  # (it retries transient answers itself)
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
        return Action(task, req, sub.handle, conn.namespace)

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the run's main action ends; its result, or its typed error.

        Raises:
            TaskFailed, TaskCancelled, TaskTimedOut, SubmissionRejected: how it ended.
            TimeoutError: not over within ``timeout`` seconds (it goes on running).
        """
        action = self._main()
        return action.task.decode_output(
            _value_of(ENGINE.run(action.outcome(), timeout), action.request)
        )

    async def result(self) -> Any:
        """``wait()`` for async code."""
        return await self._main().result()

    def cancel(self) -> int:
        """Cancel every action of the run still in flight (the main one and its
        children); their pods are deleted. Returns how many were asked to stop;
        ``wait()`` then raises ``TaskCancelled``."""
        return ENGINE.run(self._cancel())

    async def cancel_async(self) -> int:
        """:meth:`cancel` for async code."""
        return await ENGINE.run_async(self._cancel())

    async def _cancel(self) -> int:
        from headway.workflows import client as hw

        client = await ENGINE.client(self.connection)
        tenant = self.connection.tenant
        ids = {self._main().id}
        with reaching(self.connection.address):
            rows = await hw.list_actions(client, tenant, run=self.name, in_flight=True, limit=None)
        ids.update(r.action_id for r in rows)
        done = await asyncio.gather(
            *(hw.cancel_action(client, tenant, i, wait=False) for i in sorted(ids)),
            return_exceptions=True,
        )
        return sum(1 for d in done if not isinstance(d, BaseException) and d.requested)

    def _main(self) -> Action:
        if self.action is None:
            raise RuntimeError(f"run {self.name!r} has no action")
        return self.action

    def __repr__(self) -> str:
        return f"Run(name={self.name!r}, queue={self.queue!r})"


class RunContext:
    """How a run is submitted: its queue (every action's unless one overrides it) and
    name. From :func:`with_runcontext`."""

    def __init__(self, *, queue: str | None = None, name: str | None = None) -> None:
        _check_queue(queue)
        if name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,150}", name):
            raise ValueError(
                f"name: {name!r} is not a run name (letters, digits, '.', '_', '-', at most 151)"
            )
        self.queue = queue
        self.name = name

    def run(self, task: TaskTemplate[P, R], *args: P.args, **kwargs: P.kwargs) -> Run:
        """Submit ``task(*args, **kwargs)`` as a new run; returns once its queue's door took
        the main action in.

        Raises:
            TypeError: ``task`` is not a task, or the arguments do not fit it.
            SerializationError: an argument cannot be written as JSON (nothing submitted).
            SubmissionRejected: the door refused it (``UnknownQueue``, ``QueueFull``, ...).
        """
        run_, coro = self._prepare(task, args, kwargs)
        run_.action = ENGINE.run(coro)
        return run_

    async def run_async(self, task: TaskTemplate[P, R], *args: P.args, **kwargs: P.kwargs) -> Run:
        """:meth:`run` for async code."""
        run_, coro = self._prepare(task, args, kwargs)
        run_.action = await ENGINE.run_async(coro)
        return run_

    def _prepare(
        self, task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[Run, Coroutine[Any, Any, Action]]:
        if not isinstance(task, TaskTemplate):
            raise TypeError(f"task: {task!r} is not a task (decorate it with @env.task)")
        inputs = task.encode_inputs(args, kwargs)
        ctx = _CONTEXT.get()
        conn = ctx.connection if ctx is not None else _connection()
        name = self.name or f"r{uuid.uuid4().hex[:10]}"
        run_ = Run(conn, name, self.queue)
        return run_, run_._submit(task, inputs)


def with_runcontext(*, queue: str | None = None, name: str | None = None) -> RunContext:
    """A run context: ``with_runcontext(queue="production").run(main, batch=[1, 2, 3])``."""
    return RunContext(queue=queue, name=name)


def run(task: TaskTemplate[P, R], *args: P.args, **kwargs: P.kwargs) -> Run:
    """Submit ``task(*args, **kwargs)`` as a new run on the default queue."""
    return RunContext().run(task, *args, **kwargs)


class _Window:
    """How many of ``map``'s calls may be in flight (submitted, not ended): at most
    ``most``; a queue at its depth shrinks it to what the queue took of ours, so the
    calls that wait are not submitted (and refused) again and again but go in as ours
    end; it grows by one again after a window's worth of calls ended without a refusal
    (additive increase, as TCP's congestion window)."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.cap = most
        self.inflight = 0
        self.calm = 0
        self.cond = asyncio.Condition()

    async def enter(self) -> None:
        async with self.cond:
            await self.cond.wait_for(lambda: self.inflight < self.cap)
            self.inflight += 1

    async def leave(self) -> None:
        async with self.cond:
            self.inflight -= 1
            self.calm += 1
            if self.calm >= self.cap:
                self.cap, self.calm = min(self.most, self.cap + 1), 0
            self.cond.notify_all()

    async def refused(self, full: bool) -> bool:
        """One call was refused; True when it must pause before it tries again (none of
        ours is in flight to make room)."""
        async with self.cond:
            self.inflight -= 1
            if full:
                self.cap, self.calm = max(1, self.inflight), 0
            self.cond.notify_all()
            return self.inflight == 0


async def map(
    task: TaskTemplate[Any, R],
    inputs: Iterable[Any],
    *,
    concurrency: int = 64,
    return_exceptions: bool = False,
) -> list[R | BaseException]:
    """Call ``task`` once per item of ``inputs`` (one positional argument each) and
    gather the results in order. Inside a task, each call is a child action of it.

    Every argument is serialized before the first submission (a bad one submits
    nothing). At most ``concurrency`` calls are in flight (submitted, not ended).
    Backpressure, not errors: a submission refused as ``QueueFull`` (the queue's depth)
    is submitted again once one of this map's calls ended (the window shrinks to what
    the queue took, and grows back as calls end without refusals), one refused as
    ``RateLimited`` after the time the door names; any other refusal raises.
    """
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency: {concurrency!r} must be a whole number, at least 1")
    items = list(inputs)
    ctx = _CONTEXT.get()
    if ctx is None:
        gate = asyncio.Semaphore(concurrency)

        async def local(item: Any) -> R:
            async with gate:
                return await task(item)

        return list(
            await asyncio.gather(*(local(i) for i in items), return_exceptions=return_exceptions)
        )
    encoded = [task.encode_inputs((item,), {}) for item in items]
    run_ = Run(ctx.connection, ctx.run, ctx.run_queue)

    async def one(inputs_: str, window: _Window) -> R:
        while True:
            await window.enter()
            try:
                # A new id per try: a refused one is a rejected action that holds
                # nothing (submitting its id again races its workflow's close).
                action = await run_._submit(task, inputs_, parent=ctx.action_id)
                break
            except SubmissionRejected as exc:
                if exc.reason not in ("RateLimited", "QueueDepthExceeded"):
                    await window.leave()
                    raise
                pause = await window.refused(exc.reason == "QueueDepthExceeded")
                # Full: a slot frees when one of ours ends (``enter`` waits for it);
                # with none of ours in flight, or rate limited, after the door's time.
                if pause or exc.reason == "RateLimited":
                    await asyncio.sleep(exc.retry_after or 1.0)
            except BaseException:
                await window.leave()
                raise
        try:
            res = await action.outcome()
        finally:
            await window.leave()
        return task.decode_output(_value_of(res, action.request))

    async def all_() -> list[R | BaseException]:
        window = _Window(concurrency)
        return list(
            await asyncio.gather(
                *(one(i, window) for i in encoded), return_exceptions=return_exceptions
            )
        )

    return await ENGINE.run_async(all_())
