"""``headway submit`` (enqueue actions) and ``headway why`` (why is it where it is)."""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, is_dataclass
from typing import TYPE_CHECKING, Any

import click
from headway.sdk.client import (
    DEFAULT_QUEUE,
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


@click.command()
@click.option("--queue", default=DEFAULT_QUEUE, show_default=True, help="Queue to enqueue on.")
@click.option(
    "--run", default="", show_default=False, help="Run the action belongs to (default: its own)."
)
@click.option("--task", default="action", show_default=True, help="Task name (runtime history).")
@click.option("--cpu", default=None, help="CPU per pod, e.g. 2 or 500m.")
@click.option("--memory", default=None, help="Memory per pod, e.g. 8Gi.")
@click.option("--gpu", default=None, help='GPUs per pod: 8 (any type) or "H200:8".')
@click.option("--ephemeral-storage", default=None, help="Ephemeral storage per pod.")
@click.option("--replicas", type=click.IntRange(min=1), default=None, help="Gang of N pods.")
@click.option(
    "--duration", type=click.FloatRange(min=0), default=None, help="Simulated run time (s)."
)
@click.option(
    "--estimate", type=click.FloatRange(min=0), default=None, help="Declared runtime (s)."
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
    type=click.IntRange(min=1),
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
    check_name(queue, "--queue")
    if run:
        check_id(run, "--run")
    if action_id:
        check_id(action_id, "--id")
        if count > 1 and len(action_id) + len(str(count - 1)) + 1 > 200:
            check_id(f"{action_id}-{count - 1}", "--id (with --count)")
    try:
        resources = Resources(cpu=cpu, memory=memory, gpu=gpu, ephemeral_storage=ephemeral_storage)
    except ValueError as exc:
        raise click.BadParameter(f"--{str(exc).replace('_', '-')}") from None
    try:
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
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
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
    ids = [action_id] if count == 1 else [f"{action_id or task}-{i}" for i in range(count)]

    rejected: list[SubmissionRejected] = []

    async def go(client: Client) -> tuple[bool, list[str]]:
        from headway.workflows.client import ActionConflictError

        hw = HeadwayClient(client, tenant=tenant, ui_url=ui_url(cfg))
        actions: list[Action] = []
        conflicts: list[str] = []
        for one in ids:
            try:
                action = await hw.submit(spec, queue=queue, run=run, id=one, inject=inject)
            except ActionConflictError as exc:
                # The other ids of a --count batch still go in; the exit code says
                # that one did not.
                conflicts.append(str(exc))
                if len(ids) > 1:
                    click.echo(f"Error: {exc}", err=True)
                continue
            except SubmissionRejected as exc:
                rejected.append(exc)
                _report_rejected(exc, as_json=as_json)
                continue
            actions.append(action)
            _report(action, queue, as_json=as_json, waiting=wait)
        if not wait:
            return True, conflicts
        ok = True
        for action in actions:
            result = await action.result()
            if getattr(result, "state", None) == "rejected":
                # Taken in, then rejected while it waited (its queue's max_queued_time):
                # the same answer as a rejection at the door, with its own exit code.
                late = rejection(
                    tenant, action.id, queue, result.reason or "Rejected", result.message
                )
                rejected.append(late)
                _report_rejected(late, as_json=as_json)
                continue
            ok = ok and _succeeded(result)
            data = _plain(result)
            if as_json:
                click.echo(json.dumps({"id": action.id, "result": data}, default=str))
            else:
                click.echo(f"{action.id}: {_describe(data)}")
        return ok, conflicts

    ok, conflicts = with_client(cfg, go)
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
        return await HeadwayClient(client, tenant=hw_tenant).why(action_id)

    data = _plain(with_client(cfg, go))
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
