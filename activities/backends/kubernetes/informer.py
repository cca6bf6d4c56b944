"""List-then-watch informers for the Kubernetes backend: one thread per kind of object
(list, then watch from the list's resourceVersion with bookmarks, relisting on 410
Gone and reconnecting with backoff), handing what it sees to the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger(__name__)


def _socket_of(resp: Any) -> socket.socket | None:
    """The socket a streaming response reads from.

    Usually its connection's; but when the server said it will close the connection,
    http.client hands the socket over to the response and the connection forgets it
    (``sock`` is None), so it is found under the response's file object instead.
    """
    if resp is None:
        return None
    conn = getattr(resp, "connection", None) or getattr(resp, "_connection", None)
    sock = getattr(conn, "sock", None)
    if isinstance(sock, socket.socket):
        return sock
    fp = getattr(getattr(resp, "_fp", None), "fp", None)  # http.client.HTTPResponse.fp
    raw = getattr(fp, "raw", None)  # socket.SocketIO
    sock = getattr(raw, "_sock", None)
    return sock if isinstance(sock, socket.socket) else None


@dataclass
class Informer:
    """List-then-watch of one kind of object, in a thread, feeding the event loop.

    ``list_fn`` is a ``CoreV1Api`` list method bound to its scope (namespace, selectors).
    Every change is delivered as ``deliver(type, obj)`` on the loop, ``type`` one of
    ADDED, MODIFIED, DELETED, or SYNC with ``obj={"items": [...]}`` after a (re)list.
    """

    name: str
    list_fn: Callable[..., Any]
    deliver: Callable[[str, dict[str, Any]], None]
    on_error: Callable[[ApiException | Exception], None] = lambda exc: None
    watch_timeout_s: int = 300
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 30.0
    request_timeout_s: float = 30.0
    resource_version: str | None = None
    relists: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _response: Any = None
    _thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the informer's thread; deliveries go through ``loop``."""
        self._loop = loop
        self._thread = threading.Thread(target=self._run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; interrupts a blocked watch by shutting its socket down.

        Closing the response from this thread would wait for the reader's buffer lock;
        shutting the socket down makes the blocked read return at once instead.
        """
        self._stop.set()
        sock = _socket_of(self._response)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    async def join(self) -> None:
        """Wait for the thread to end (after :meth:`stop`)."""
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5.0)

    def _emit(self, kind: str, obj: dict[str, Any]) -> None:
        if not self._stop.is_set():
            with contextlib.suppress(RuntimeError):  # loop already closed
                self._loop.call_soon_threadsafe(self.deliver, kind, obj)

    def _run(self) -> None:
        backoff = self.backoff_initial_s
        while not self._stop.is_set():
            try:
                if self.resource_version is None:
                    self._list()
                self._watch()
                backoff = self.backoff_initial_s
            except ApiException as exc:
                if exc.status == 410:
                    # Our resourceVersion was compacted away: start over from a list.
                    self.resource_version = None
                    continue
                if self._stop.is_set():
                    return
                log.warning("informer %s: %s %s", self.name, exc.status, exc.reason)
                self._emit_error(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.backoff_max_s)
            except Exception as exc:
                if self._stop.is_set():
                    return
                log.warning("informer %s: %s", self.name, exc)
                self._emit_error(exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.backoff_max_s)

    def _emit_error(self, exc: ApiException | Exception) -> None:
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self.on_error, exc)

    def _list(self) -> None:
        resp = self.list_fn(_preload_content=False, _request_timeout=self.request_timeout_s)
        body = json.loads(resp.data)
        self.resource_version = (body.get("metadata") or {}).get("resourceVersion") or None
        self.relists += 1
        self._emit("SYNC", {"items": body.get("items") or []})

    def _watch(self) -> None:
        resp = self.list_fn(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_s,
            _preload_content=False,
            # The server ends the watch after timeout_seconds; the read timeout is only a
            # backstop against a silently dead connection.
            _request_timeout=(self.request_timeout_s, self.watch_timeout_s + 30),
        )
        self._response = resp
        try:
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if self._stop.is_set():
                    return
                if not line:
                    continue
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    code = obj.get("code", 500)
                    raise ApiException(status=code, reason=obj.get("reason") or obj.get("message"))
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if rv:
                    self.resource_version = rv
                if kind == "BOOKMARK":
                    continue
                self._emit(kind, obj)
        finally:
            self._response = None
            with contextlib.suppress(Exception):
                resp.release_conn()
