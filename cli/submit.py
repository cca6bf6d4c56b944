"""``headway submit`` (enqueue actions) and ``headway why`` (why is it where it is)."""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import TYPE_CHECKING, Any

import click
from headway.scheduler.resources import MAX_PODS
from headway.sdk.client import (
    DEFAULT_QUEUE,
    MAX_SECONDS,
    Action,
    RateLimited,
    Resources,
    SubmissionRejected,
    Task,
    rejection,
)
from headway.sdk.client import Client as HeadwayClient
from headway.sdk.kube import CLI_NAMES, kube_options

from ._common import check_id, check_name, for_tenant, settings, ui_url, with_client
from ._output import emit_structured, human_details, output_option, wall_times

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = ["submit", "why"]


def _plain(value: Any) -> Any:
    """A result as JSON-able data (dataclasses become dicts)."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return value


def _succeeded(result: Any) -> bool:
    data = _plain(result)
    if isinstance(data, dict):
        state = str(data.get("state") or data.get("status") or data.get("kind") or "")
        return state.lower() in ("succeeded", "success", "completed", "done")
    return True


#: The most copies one ``submit --count`` makes.
MAX_COUNT = 10_000


@click.command()
@click.option("--queue", default=DEFAULT_QUEUE, show_default=True, help="Queue to enqueue on.")
@click.option(
    "--run", default="", show_default=False, help="Run the action belongs to (default: its own)."
)
@click.option("--task", default="action", show_default=True, help="Task name (runtime history).")
@click.option("--cpu", default=None, help="CPU per pod, e.g. 2 or 500m (at most 10000).")
@click.option("--memory", default=None, help="Memory per pod, e.g. 8Gi (at most 256Ti).")
@click.option("--gpu", default=None, help='GPUs per pod: 8 (any type) or "H200:8" (1 to 1024).')
@click.option(
    "--ephemeral-storage", default=None, help="Ephemeral storage per pod (at most 256Ti)."
)
@click.option("--replicas", type=click.IntRange(1, MAX_PODS), default=None, help="Gang of N pods.")
@click.option(
    "--duration",
    type=click.FloatRange(0, MAX_SECONDS),
    default=None,
    help="Simulated run time (s, at most a year).",
)
@click.option(
    "--estimate",
    type=click.FloatRange(0, MAX_SECONDS),
    default=None,
    help="Declared runtime (s, at most a year).",
)
@click.option(
    "--id",
    "action_id",
    default=None,
    help="Action id (default: generated). An existing id with the same submission is "
    "answered with that action (exit 0); with a different one, an error.",
)
@click.option(
    "--count",
    type=click.IntRange(1, MAX_COUNT),
    default=1,
    show_default=True,
    help="Submit N copies (ids get -0, -1, ...).",
)
@click.option("--image", default="busybox", show_default=True, help="Container image.")
@click.option(
    "--command",
    "command",
    default=None,
    help="The container's command (its entrypoint), split like a shell would; the "
    "arguments after `--` are its args: --command python -- train.py --lr 3e-4.",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.option("--env", "env", multiple=True, help="NAME=VALUE in the container (repeat).")
@click.option(
    "--env-from-secret",
    "env_from_secrets",
    multiple=True,
    help="SECRET: every key of the Secret as a variable; SECRET:KEY: the variable KEY "
    "from that key (repeat).",
)
@click.option("--label", "labels", multiple=True, help="Pod label KEY=VALUE (repeat).")
@click.option(
    "--annotation", "annotations", multiple=True, help="Pod annotation KEY=VALUE (repeat)."
)
@click.option(
    "--toleration",
    "tolerations",
    multiple=True,
    help="KEY[=VALUE][:EFFECT], e.g. nvidia.com/gpu:NoSchedule; '*' tolerates every "
    "taint (repeat).",
)
@click.option(
    "--node-selector", "node_selector", multiple=True, help="Node label KEY=VALUE (repeat)."
)
@click.option("--priority-class", default=None, help="The pods' PriorityClass.")
@click.option("--service-account", default=None, help="The pods' ServiceAccount.")
@click.option(
    "--volume",
    "volumes",
    multiple=True,
    help="pvc:CLAIM:/path[:ro], configmap:NAME:/path, secret:NAME:/path or "
    "emptydir:/path (repeat).",
)
@click.option("--shm-size", default=None, help="Memory-backed /dev/shm of this size, e.g. 8Gi.")
@click.option(
    "--inject",
    default=None,
    type=click.Choice(["oom", "preempt", "node-lost", "image-pull", "fail"]),
    help="sim backend: inject a fault.",
)
@click.option("--tenant", default=None, help="Tenant (default: the group's --tenant).")
@click.option(
    "--wait", is_flag=True, help="Wait until every action is over; non-zero exit if one failed."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of text.")
@click.pass_context
def submit(
    ctx: click.Context,
    queue: str,
    run: str,
    task: str,
    cpu: str | None,
    memory: str | None,
    gpu: str | None,
    ephemeral_storage: str | None,
    replicas: int | None,
    duration: float | None,
    estimate: float | None,
    action_id: str | None,
    count: int,
    image: str,
    command: str | None,
    args: tuple[str, ...],
    env: tuple[str, ...],
    env_from_secrets: tuple[str, ...],
    labels: tuple[str, ...],
    annotations: tuple[str, ...],
    tolerations: tuple[str, ...],
    node_selector: tuple[str, ...],
    priority_class: str | None,
    service_account: str | None,
    volumes: tuple[str, ...],
    shm_size: str | None,
    inject: str | None,
    tenant: str | None,
    wait: bool,
    as_json: bool,
) -> None:
    """Enqueue an action (or COUNT copies) and print where to follow it.

    The answer comes with the call: "submitted ID to queue Q (waiting)" once the queue
    took it in, or a rejection on stderr with its reason, the limit behind it and what
    to change; a rejected action leaves nothing behind.

    Idempotent by --id, like `kubectl apply` of an unchanged object: an id that exists
    with the same submission starts nothing; it prints "exists ... (unchanged)" with
    the action's state (and its result if it ended) and exits 0. An id that exists with
    a different submission (queue, resources, ...) is an error naming the id and the
    fields that differ; nothing is changed. An id is never run twice: use a new one. An
    id that was rejected may be submitted again (a rate-limited one, after the wait).

    \b
    Exit codes:
      0  every action was taken in (with --wait: and succeeded)
      1  an error (an id exists with a different submission; with --wait, an action
         did not succeed; the server is unreachable)
      3  rejected by policy: the queue does not exist, is draining, or is at its depth;
         with --wait, also an action that waited past its queue's max_queued_time
      4  rate limited: the tenant's submit rate is exhausted; retry after the time said
    With --count, the other ids still go in; the code says the worst: 1, then 3, then 4.
    """
    cfg = settings(ctx)
    tenant = check_name(tenant, "--tenant") if tenant else cfg.tenant
    cfg = for_tenant(cfg, tenant)  # reached in its own namespace (tenant-namespaces)
    _check_names(queue, run, action_id, count)
    resources = _resources(cpu=cpu, memory=memory, gpu=gpu, ephemeral_storage=ephemeral_storage)
    with _value_error_as_usage():
        kube = kube_options(
            args=args,
            env=env,
            env_from_secrets=env_from_secrets,
            labels=labels,
            annotations=annotations,
            tolerations=tolerations,
            node_selector=node_selector,
            priority_class=priority_class,
            service_account=service_account,
            volumes=volumes,
            shm_size=shm_size,
            names=CLI_NAMES,
        )
    try:
        spec = Task(
            task,
            resources,
            replicas=replicas,
            duration=duration,
            estimate=estimate,
            image=image,
            command=_command(command),
            kube=kube,
        )
    except ValueError as exc:  # NaN passes click's ranges: "duration: nan must be ..."
        raise click.BadParameter(f"--{exc}") from None
    batch = _Batch(
        spec=spec,
        ids=_ids(action_id, task, count),
        queue=queue,
        run=run,
        inject=inject,
        tenant=tenant,
        ui_url=ui_url(cfg),
        wait=wait,
        as_json=as_json,
    )
    _exit(ctx, batch, ok=with_client(cfg, batch.go))


def _check_names(queue: str, run: str, action_id: str | None, count: int) -> None:
    """The names the submission carries, checked before anything is sent."""
    check_name(queue, "--queue")
    if run:
        check_id(run, "--run")
    if action_id:
        check_id(action_id, "--id")
        if count > 1 and len(action_id) + len(str(count - 1)) + 1 > 200:
            check_id(f"{action_id}-{count - 1}", "--id (with --count)")


def _ids(action_id: str | None, task: str, count: int) -> list[str | None]:
    """One id (None: generated), or COUNT ids derived from it (else from the task)."""
    if count == 1:
        return [action_id]
    return [f"{action_id or task}-{i}" for i in range(count)]


def _resources(
    *, cpu: str | None, memory: str | None, gpu: str | None, ephemeral_storage: str | None
) -> Resources:
    """The per-pod demand; a bad quantity is named by its flag."""
    try:
        return Resources(cpu=cpu, memory=memory, gpu=gpu, ephemeral_storage=ephemeral_storage)
    except ValueError as exc:
        raise click.BadParameter(f"--{str(exc).replace('_', '-')}") from None


@contextmanager
def _value_error_as_usage() -> Iterator[None]:
    """A bad Kubernetes option (``ValueError`` naming its flag) as a usage error."""
    try:
        yield
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


#: How long ``submit`` (without --wait) watches a new waiting action for its scheduler's
#: first verdict: the first pass comes within tens of milliseconds of the lease on a
#: healthy control plane; a slower one leaves the action reported as waiting.
FIRST_VERDICT_S = 1.5
#: How often it asks the scheduler whether it holds the action yet (then: accepted).
VERDICT_POLL_S = 0.05


@dataclass
class _Batch:
    """One ``submit`` call's ids, what became of each, and how to report them."""

    spec: Task
    ids: list[str | None]
    queue: str
    run: str
    inject: str | None
    tenant: str
    ui_url: str | None
    wait: bool
    as_json: bool
    rejected: list[SubmissionRejected] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)

    async def go(self, client: Client) -> bool:
        """Submit every id, then (with --wait) wait for each; False if one failed.

        Without --wait, a submission answered "waiting" is watched for up to
        ``FIRST_VERDICT_S`` (all at once): a rejection of the scheduler's first pass
        (``Unschedulable``: larger than any node the queue may use, or over its quota;
        ``UnknownQueue`` for a tenant whose scheduler is new) is reported as one at the
        door is, with its exit code, instead of "submitted"."""
        hw = HeadwayClient(client, tenant=self.tenant, ui_url=self.ui_url)
        actions = [a for one in self.ids if (a := await self._submit_one(hw, one)) is not None]
        if not self.wait:
            late = await asyncio.gather(*(self._first_verdict(client, a) for a in actions))
            for action, rejected in zip(actions, late, strict=True):
                if rejected is None:
                    _report(action, self.queue, as_json=self.as_json, waiting=False)
                else:
                    self.rejected.append(rejected)
                    _report_rejected(rejected, as_json=self.as_json)
            return True
        ok = True
        for action in actions:
            ok = await self._wait_one(action) and ok
        return ok

    async def _submit_one(self, hw: HeadwayClient, one: str | None) -> Action | None:
        """One id in: its action, or None when it conflicted or was rejected."""
        from headway.workflows.client import ActionConflictError

        try:
            action = await hw.submit(
                self.spec, queue=self.queue, run=self.run, id=one, inject=self.inject
            )
        except ActionConflictError as exc:
            # The other ids of a --count batch still go in; the exit code says
            # that one did not.
            self.conflicts.append(str(exc))
            if len(self.ids) > 1:
                click.echo(f"Error: {exc}", err=True)
            return None
        except SubmissionRejected as exc:
            self.rejected.append(exc)
            _report_rejected(exc, as_json=self.as_json)
            return None
        if self.wait:
            _report(action, self.queue, as_json=self.as_json, waiting=True)
        return action

    async def _first_verdict(self, client: Client, action: Action) -> SubmissionRejected | None:
        """The rejection of a new, waiting action by its scheduler's first pass, if it
        comes within ``FIRST_VERDICT_S``; None: accepted (the scheduler holds it in its
        window, asked every ``VERDICT_POLL_S``), or still undecided."""
        if not action.created or action.state != "waiting":
            return None
        ended = asyncio.ensure_future(action.result())
        taken = asyncio.ensure_future(self._in_window(client, action.id))
        try:
            done, _ = await asyncio.wait(
                {ended, taken}, timeout=FIRST_VERDICT_S, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for f in (ended, taken):
                f.cancel()
        if ended not in done or ended.cancelled() or ended.exception() is not None:
            return None
        result = ended.result()
        if getattr(result, "state", None) != "rejected":
            return None
        return rejection(
            self.tenant, action.id, self.queue, result.reason or "Rejected", result.message
        )

    async def _in_window(self, client: Client, action_id: str) -> None:
        """Return once the tenant's scheduler holds the action (waiting or running)."""
        from headway import protocol

        sched = client.get_workflow_handle(protocol.scheduler_workflow_id(self.tenant))
        while True:
            try:
                seen = await sched.query("why", action_id)
                if isinstance(seen, dict) and seen.get("state") is not None:
                    return
            except Exception:  # the scheduler starting, or mid continue-as-new: ask again
                pass
            await asyncio.sleep(VERDICT_POLL_S)

    async def _wait_one(self, action: Action) -> bool:
        """Wait for one action and print how it ended; False if it did not succeed.

        An action rejected while it waited is reported as a rejection (True here:
        its exit code comes from the rejections)."""
        result = await action.result()
        if getattr(result, "state", None) == "rejected":
            # Taken in, then rejected while it waited (its queue's max_queued_time):
            # the same answer as a rejection at the door, with its own exit code.
            late = rejection(
                self.tenant, action.id, self.queue, result.reason or "Rejected", result.message
            )
            self.rejected.append(late)
            _report_rejected(late, as_json=self.as_json)
            return True
        data = _plain(result)
        if self.as_json:
            click.echo(json.dumps({"id": action.id, "result": data}, default=str))
        else:
            click.echo(f"{action.id}: {_describe(data)}")
        return _succeeded(result)


def _exit(ctx: click.Context, batch: _Batch, *, ok: bool) -> None:
    """The exit code says the worst of the batch: a conflict, then policy, then rate."""
    rejected, conflicts, ids = batch.rejected, batch.conflicts, batch.ids
    if rejected and not conflicts:
        if len(ids) > 1:
            click.echo(f"{len(rejected)} of {len(ids)} submissions rejected (above)", err=True)
        # A rejection is an answer, not an error of the command: its own exit code.
        policy = [r for r in rejected if not isinstance(r, RateLimited)]
        ctx.exit((policy[0] if policy else rejected[0]).exit_code)
    if conflicts:
        if len(ids) == 1:
            raise click.ClickException(conflicts[0])
        raise click.ClickException(
            f"{len(conflicts)} of {len(ids)} ids exist with a different submission "
            "(above); those were left as they are"
        )
    if not ok:
        raise click.ClickException("an action did not succeed")


def _command(text: str | None) -> tuple[str, ...]:
    """``--command`` as the container's command (shell-like splitting)."""
    if text is None:
        return ()
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise click.UsageError(f"--command: {text!r} cannot be split ({exc})") from None
    if not words:
        raise click.UsageError(f"--command: {text!r} is empty")
    return tuple(words)


def _report(action: Action, queue: str, *, as_json: bool, waiting: bool) -> None:
    """One line per submission: new, or existing (unchanged) with its state."""
    ended = _plain(action.ended) if action.ended is not None else None
    if as_json:
        line: dict[str, Any] = {
            "id": action.id,
            "workflow_id": action.workflow_id,
            "queue": queue,
            "ui": action.ui_url,
            "created": action.created,
            "state": action.state,
        }
        if ended is not None:
            line["result"] = ended
        click.echo(json.dumps(line, default=str))
        return
    if action.created:
        where = f" on {action.cluster}" if action.cluster else ""
        click.echo(
            f"submitted {action.id} to queue {queue!r} ({action.state}{where}): {action.ui_url}"
        )
        return
    click.echo(
        f"exists {action.id} on queue {queue!r} (unchanged, {action.state}): {action.ui_url}"
    )
    if ended is not None and not waiting:  # with --wait the result line comes below
        click.echo(f"{action.id}: {_describe(ended)}")


def _report_rejected(exc: SubmissionRejected, *, as_json: bool) -> None:
    """A rejection on stderr: its reason, the limit behind it and what to change."""
    if as_json:
        line = {
            "id": exc.action_id,
            "queue": exc.queue,
            "created": False,
            "state": "rejected",
            "reason": exc.reason,
            "message": exc.detail,
            "retry_after": exc.retry_after,
            "hint": exc.hint,
        }
        click.echo(json.dumps(line, default=str), err=True)
        return
    click.echo(f"rejected {exc.action_id} ({exc.reason}): {exc.detail or exc.reason}", err=True)
    click.echo(f"  what to change: {exc.hint}", err=True)


def _describe(data: Any) -> str:
    if isinstance(data, dict):
        return ", ".join(f"{k}={v}" for k, v in data.items() if v not in (None, "", [], {}))
    return str(data)


@click.command()
@click.argument("action_id")
@click.option("--tenant", default=None, help="Tenant (default: the group's --tenant).")
@output_option
@click.pass_context
def why(ctx: click.Context, action_id: str, tenant: str | None, output: str) -> None:
    """Why ACTION_ID is where it is: its state, queue, cluster and the scheduler's reasons."""
    cfg = settings(ctx)
    hw_tenant = tenant or cfg.tenant
    cfg = for_tenant(cfg, hw_tenant)

    async def go(client: Client) -> Any:
        data = _plain(await HeadwayClient(client, tenant=hw_tenant).why(action_id))
        if isinstance(data, dict) and data.get("state") is None and not data.get("reason"):
            data = await _outside_the_window(client, hw_tenant, action_id, data)
        return data

    data = with_client(cfg, go)
    if emit_structured(data, output):
        return
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "unblock":
                click.echo("what would unblock it:")
                for line in value or ["(nothing: it is not blocked)"]:
                    click.echo(f"  - {wall_times(str(line))}")
            elif key == "details":
                click.echo(f"details: {json.dumps(human_details(value), default=str)}")
            else:
                click.echo(f"{key}: {value}")
    else:
        click.echo(str(data))


async def _outside_the_window(
    client: Client, tenant: str, action_id: str, data: dict[str, Any]
) -> dict[str, Any]:
    """``why`` of an action the scheduler does not hold: its own state and reason (ended,
    rejected, ...), or an error when there is no such action (a typo'd id is not an
    action with no reasons)."""
    from headway.workflows import client as hw

    try:
        own = await hw.action_details(client, tenant, action_id)
    except hw.ActionNotFoundError:
        raise click.ClickException(
            f"action {action_id!r} not found in tenant {tenant!r} (see `headway get actions`)"
        ) from None
    message = data["message"]
    if own.result is not None:  # ended: how, in its own words when it has them
        message = own.result.message or f"it ended {own.state}"
    return {**data, "state": own.state, "reason": own.reason, "message": message}
