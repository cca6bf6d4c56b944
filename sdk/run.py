"""The entrypoint of an SDK task's pod: ``python -m headway.sdk.run --module M --task F ...``.

It puts the code root on ``sys.path``, imports the task's module (as itself, never as
``__main__``: a script's ``if __name__ == "__main__":`` block does not run again),
decodes the JSON arguments against the function's annotations, runs the function, and
writes the outcome as one JSON document to ``$HEADWAY_OUTPUT_FILE`` (on Kubernetes the
container's termination message, ``/dev/termination-log``):
``{"ok": true, "output": VALUE}`` or ``{"ok": false, "error": {"type", "message",
"traceback"}}``. Exit code 0 when the function returned, 1 when it raised.

``python -m headway.sdk.run --serve`` is a warm environment's long-lived process (a
reusable environment's pool, :class:`headway.ReusePolicy`): it reads one request per
line on stdin, ``{"id", "argv", "output", "env"}`` (``argv`` the arguments above,
``output`` the outcome file, ``env`` the call's pod environment), runs each call's task as a task of its own loop (as many at a time as
it is sent: the pool's ``concurrency``), writes its outcome document as above and
answers ``{"id", "code"}`` on stdout, one line each; ``{"cancel": ID}`` stops a call.
The task code's own prints go to stderr (the pool's log). It exits when stdin closes
(its pool torn down, or its worker gone). ``--pull HOST:PORT`` is the same process as a
pod of a pool on Kubernetes: it takes its calls from its cluster worker over a connection
it opens (see :func:`pull`). A module is imported once per process.
Each call sees its own environment in ``os.environ`` (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, the action's ``--env`` variables, ... as a fresh process would), however
many calls run at once: see :class:`_CallEnviron`.

Tasks it awaits are submitted as child actions of this one, in its run, to the Temporal
server named by ``--address`` (``HEADWAY_TEMPORAL_ADDRESS`` in the pod wins, for a
cluster that reaches Temporal by another name than the submitter did).
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import functools
import importlib
import json
import os
import sys
import traceback
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

__all__ = ["main"]

#: Most of a traceback kept in the outcome document.
MAX_TRACEBACK = 8000
#: The largest outcome document (Temporal carries it in the action's result). A pod
#: says less in ``HEADWAY_OUTPUT_MAX_BYTES``: on Kubernetes the document is the
#: container's termination message, which the kubelet cuts at 4096 bytes.
MAX_OUTPUT_BYTES = 512 * 1024
LIMIT_ENV = "HEADWAY_OUTPUT_MAX_BYTES"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m headway.sdk.run")
    p.add_argument("--module", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--action", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--run-queue", default=None)
    p.add_argument("--address", required=True)
    p.add_argument("--namespace", default="default")
    p.add_argument("--tenant", default="default")
    p.add_argument("--env", action="append", default=[])
    # A reusable environment's pool (read by the cluster's backend, not here).
    p.add_argument("--pool", default=None)
    p.add_argument("--pool-replicas", type=int, default=1)
    p.add_argument("--pool-concurrency", type=int, default=1)
    p.add_argument("--pool-idle-ttl", type=float, default=0.0)
    p.add_argument("--inputs", required=True)
    return p.parse_args(argv)


def _run(args: argparse.Namespace) -> Any:
    task, inputs = _load(args)
    result = asyncio.run(task.func(**inputs))
    return task.encode_output(result)


def _load(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    """The task and its decoded arguments; the task context set (in the current
    context: a task of the pool's loop has its own)."""
    from headway.sdk._engine import ADDRESS_ENV, Connection
    from headway.sdk.tasks import _CONTEXT, TaskTemplate, _TaskContext

    for pair in args.env:
        key, _, value = pair.partition("=")
        os.environ.setdefault(key, value)
    if args.root not in sys.path:
        sys.path.insert(0, args.root)
    module = importlib.import_module(args.module)
    task = getattr(module, args.task, None)
    if not isinstance(task, TaskTemplate):
        raise LookupError(f"{args.module}.{args.task} is not a task (under {args.root})")
    inputs = task.decode_inputs(args.inputs)
    conn = Connection(
        address=os.environ.get(ADDRESS_ENV) or args.address,
        namespace=args.namespace,
        tenant=args.tenant,
    )
    _CONTEXT.set(_TaskContext(conn, args.run, args.run_queue, args.action))
    return task, inputs


def _failed(exc: BaseException) -> tuple[dict[str, Any], int]:
    """The outcome document of a call that raised ``exc`` (being handled), and its code."""
    if isinstance(exc, SystemExit) and exc.code in (0, None):
        return {"ok": True, "output": None}, 0
    traceback.print_exc()
    return {
        "ok": False,
        "error": {
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": traceback.format_exc()[-MAX_TRACEBACK:],
        },
    }, 1


def main(argv: list[str] | None = None) -> int:
    """Run one task call; write its outcome document; 0 if it returned, else 1.
    ``--serve``: run a warm environment's process until stdin closes."""
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["--serve"]:
        return serve()
    if given[:1] == ["--pull"]:
        return pull(given)
    args = _parse(argv)
    try:
        doc: dict[str, Any] = {"ok": True, "output": _run(args)}
        code = 0
    except BaseException as exc:  # everything the task raised is its outcome
        doc, code = _failed(exc)
    path = os.environ.get("HEADWAY_OUTPUT_FILE") or "/dev/termination-log"
    code = _write(doc, code, path)
    sys.stdout.flush()
    return code


def _write(doc: dict[str, Any], code: int, path: str) -> int:
    """Write the outcome document to ``path``, fitted to the limit (``_fit``: a too
    large result becomes a failure); returns the call's exit code."""
    text, code = _fit(doc, code, _limit())
    with open(path, "w") as fh:
        fh.write(text)
    return code


def _limit() -> int:
    try:
        given = int(os.environ.get(LIMIT_ENV) or MAX_OUTPUT_BYTES)
    except ValueError:
        return MAX_OUTPUT_BYTES
    return max(256, min(given, MAX_OUTPUT_BYTES))


def _fit(doc: dict[str, Any], code: int, limit: int) -> tuple[str, int]:
    """The outcome document within ``limit`` bytes: a failure keeps the end of its
    traceback that fits; a result too large becomes a clear failure naming its size."""
    text = json.dumps(doc, separators=(",", ":"))
    size = len(text.encode())
    if size <= limit:
        return text, code
    if not doc.get("ok"):
        err = dict(doc["error"])
        err["message"] = str(err.get("message", ""))[: limit // 4]
        tb = str(err.get("traceback", ""))
        while True:
            err["traceback"] = tb
            text = json.dumps({"ok": False, "error": err}, separators=(",", ":"))
            if len(text.encode()) <= limit or not tb:
                return text, code
            tb = tb[max(len(tb) // 4, 1) :]  # keep the end: where it raised
    where = " (the container's termination message)" if limit < MAX_OUTPUT_BYTES else ""
    failure = {
        "ok": False,
        "error": {
            "type": "SerializationError",
            "message": f"the result is {size} bytes of JSON, more than the {limit} this pod"
            f" can return{where}: return a reference, e.g. a URL, instead of the data",
            "traceback": "",
        },
    }
    return json.dumps(failure, separators=(",", ":")), 1


# --- a warm environment's process -------------------------------------------------------


#: The environment of the call running in this context (a pool process): its variables,
#: None for one it deleted. Each call is a task of its own, so each has its own.
_CALL_ENV: contextvars.ContextVar[dict[str, str | None] | None] = contextvars.ContextVar(
    "headway_call_env", default=None
)


class _CallEnviron(MutableMapping[str, str]):
    """``os.environ`` in a pool process: the running call's own variables over the
    process's. A pool process runs up to ``concurrency`` calls at once, each of its own
    action (its own ``RANK``, ``HEADWAY_ACTION_ID``, ``--env`` variables): one process-wide
    environment cannot hold them all, a context variable can. ``os.getenv`` reads it too;
    a subprocess the task starts inherits the process's environment, not the call's
    (pass ``env=dict(os.environ)`` to give it the call's)."""

    def __init__(self, base: MutableMapping[str, str]) -> None:
        self.base = base

    def __getitem__(self, key: str) -> str:
        own = _CALL_ENV.get()
        if own is not None and key in own:
            value = own[key]
            if value is None:
                raise KeyError(key)
            return value
        return self.base[key]

    def __setitem__(self, key: str, value: str) -> None:
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"str expected, not {type(key).__name__}, {type(value).__name__}")
        own = _CALL_ENV.get()
        if own is None:
            self.base[key] = value
        else:
            own[key] = value

    def __delitem__(self, key: str) -> None:
        own = _CALL_ENV.get()
        if own is None:
            del self.base[key]
            return
        self[key]  # KeyError when it is not set
        own[key] = None

    def __iter__(self) -> Iterator[str]:
        own = _CALL_ENV.get() or {}
        yield from (k for k, v in own.items() if v is not None)
        yield from (k for k in self.base if k not in own)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def copy(self) -> dict[str, str]:
        """A plain dict, as ``os.environ.copy()`` gives."""
        return dict(self)


def serve() -> int:
    """Serve calls sent on stdin until it closes (see the module's docstring)."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the task code's prints go to the log, never into the answers
    if not isinstance(os.environ, _CallEnviron):
        # Rebinding the module's name: os.getenv reads it, and so does the task code.
        setattr(os, "environ", _CallEnviron(os.environ))  # noqa: B010
    asyncio.run(_serve(answers))
    return 0


async def _serve(answers: Any) -> None:
    def answer(msg: dict[str, Any]) -> None:
        answers.write(json.dumps(msg) + "\n")
        answers.flush()

    await _calls(lambda: asyncio.to_thread(sys.stdin.readline), answer)


async def _calls(
    read: Callable[[], Awaitable[str]], answer: Callable[[dict[str, Any]], None]
) -> None:
    """Run the calls read one per line (``read``: "" at the end) and ``answer`` each."""
    calls: dict[str, asyncio.Task[None]] = {}
    while True:
        line = await read()
        if not line:
            break  # the pool is torn down (or its worker went): stop
        msg = json.loads(line)
        if "cancel" in msg:
            call = calls.get(str(msg["cancel"]))
            if call is not None:
                call.cancel()
            continue
        rid = str(msg["id"])
        env = {str(k): str(v) for k, v in (msg.get("env") or {}).items()}
        call = asyncio.create_task(_serve_one(rid, msg["argv"], msg.get("output"), env, answer))
        calls[rid] = call
        call.add_done_callback(functools.partial(_forget, calls, rid))
    for call in list(calls.values()):
        call.cancel()
    await asyncio.gather(*calls.values(), return_exceptions=True)


def _forget(calls: dict[str, asyncio.Task[None]], rid: str, _done: object) -> None:
    calls.pop(rid, None)


async def _serve_one(
    rid: str,
    argv: list[str],
    output: str | None,
    env: dict[str, str],
    answer: Callable[[dict[str, Any]], None],
) -> None:
    """One call in a pool process: as ``main`` does it, but on the pool's loop, with its
    pod's environment as its own (this task's context). Its outcome document goes to
    ``output``, or (None: a pod that pulls its calls) in its answer."""
    _CALL_ENV.set(dict[str, str | None](env))
    try:
        task, inputs = _load(_parse(argv))
        result = await task.func(**inputs)
        doc: dict[str, Any] = {"ok": True, "output": task.encode_output(result)}
        code = 0
    except asyncio.CancelledError:
        return  # its pod was deleted: nobody reads an outcome
    except BaseException as exc:  # everything the task raised is its outcome
        doc, code = _failed(exc)
    text, code = _fit(doc, code, _limit())
    if output is not None:
        with open(output, "w") as fh:
            fh.write(text)
    sys.stdout.flush()
    answer(
        {"id": rid, "code": code}
        if output is not None
        else {"id": rid, "code": code, "document": text}
    )


# --- a warm environment's pod on Kubernetes: it pulls its calls ---------------------------

#: The longest line of the pull protocol (a call's inputs, an answer's document).
LINE_LIMIT = 16 * 2**20


def pull(argv: list[str]) -> int:
    """``--pull HOST:PORT --pool-key KEY --pod NAME``: a pod of a reusable environment's
    pool on Kubernetes (:mod:`headway.activities.backends.kube_pool`). It connects to its
    cluster worker, says which pool it serves, and runs the calls it is handed over that
    connection, answering each with its outcome document, until the connection closes
    (its pool torn down, or its worker gone)."""
    p = argparse.ArgumentParser(prog="python -m headway.sdk.run --pull")
    p.add_argument("--pull", required=True, metavar="HOST:PORT")
    p.add_argument("--pool-key", required=True)
    p.add_argument("--pod", default="")
    args = p.parse_args(argv)
    host, _, port = args.pull.rpartition(":")
    if not isinstance(os.environ, _CallEnviron):
        setattr(os, "environ", _CallEnviron(os.environ))  # noqa: B010
    asyncio.run(_pull(host, int(port), args.pool_key, args.pod))
    return 0


async def _pull(host: str, port: int, key: str, pod: str) -> None:
    reader, writer = await asyncio.open_connection(host, port, limit=LINE_LIMIT)

    def answer(msg: dict[str, Any]) -> None:
        writer.write((json.dumps(msg) + "\n").encode())

    answer({"hello": key, "pod": pod, "pid": os.getpid()})

    async def read() -> str:
        try:
            return (await reader.readline()).decode()
        except ConnectionError:
            return ""

    try:
        await _calls(read, answer)
    finally:
        writer.close()


if __name__ == "__main__":
    sys.exit(main())
