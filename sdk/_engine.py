"""The SDK's one event loop, its Temporal connections, and a clean interpreter exit.

Why a loop of its own. The Temporal client's RPCs are Rust futures on Tokio threads that
call back into Python (take the GIL) when they complete. A script that ends while one is
still in flight (a wait given up by a timeout, a task cancelled by ``asyncio.run`` on its
way out) has that callback race the interpreter's finalization: the process aborts with
``Fatal Python error: PyGILState_Release`` (exit 134) or hangs at exit, depending on who
wins (temporalio/sdk-python#300). So:

- every SDK call runs on one loop in a daemon thread, whichever entry point (sync or
  async) the user called, and the sync ones simply block on it;
- every RPC runs as a task of its own that nothing cancels (a caller that gives up only
  stops waiting for it), and is bounded in time: the only long poll, waiting for an
  action's result, is asked in rounds of :data:`LONG_POLL_S` seconds;
- at exit (``atexit``, while the interpreter is still whole) the loop cancels the
  callers' waits, lets every RPC in flight complete (at most one round), and only then
  stops; the exit then sleeps :data:`EXIT_GRACE_S`, leaving the GIL to the Rust thread
  that delivered the last result (it may have been switched out in the middle of its
  hold): by finalization no Rust thread is left in Python, nor any future to call back.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import threading
import time
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from headway.connection import ConnectionOptions, ConnectionSettingsError, explain_failure
from headway.connection import load as load_connection

if TYPE_CHECKING:
    import google.protobuf.message
    from temporalio.client import Client as TemporalClient
    from temporalio.service import ServiceClient, ServiceResponse
    from temporalio.service import _BridgeServiceClient as BridgeServiceClient

__all__ = ["ENGINE", "LONG_POLL_S", "Connection", "Engine", "ServerUnreachable", "reaching"]

T = TypeVar("T")

#: Seconds of one round of the long poll for an action's result (the longest an RPC in
#: flight can delay the interpreter's exit).
LONG_POLL_S = 3.0
#: How long the exit waits for RPCs in flight before giving up on a clean teardown.
EXIT_WAIT_S = 3 * LONG_POLL_S

#: How long the exit leaves the GIL to other threads once the loop stopped.
EXIT_GRACE_S = 0.2

ADDRESS_ENV = "HEADWAY_TEMPORAL_ADDRESS"
NAMESPACE_ENV = "HEADWAY_NAMESPACE"
TENANT_ENV = "HEADWAY_TENANT"
DEFAULT_ADDRESS = "localhost:7233"


@dataclass(frozen=True)
class Connection:
    """Where the SDK submits: a Temporal address and namespace, and the tenant; how
    (TLS, API key) is in ``options``, else read from the environment when connecting."""

    address: str
    namespace: str
    tenant: str
    options: ConnectionOptions | None = None

    @classmethod
    def from_env(cls, **given: str | None) -> Connection:
        """``given`` values, else ``HEADWAY_TEMPORAL_ADDRESS`` / ``HEADWAY_NAMESPACE`` /
        ``HEADWAY_TENANT`` (and the rest of ``headway.connection``'s settings: TLS, API
        key, config file, the tenant's namespace), else the defaults (``localhost:7233``,
        ``default``, ``default``).

        Raises:
            ConnectionSettingsError: a setting is wrong (named).
        """
        tenant = given.get("tenant") or os.environ.get(TENANT_ENV) or "default"
        opts = load_connection(
            address=given.get("address"), namespace=given.get("namespace")
        ).for_tenant(tenant)
        return cls(address=opts.address, namespace=opts.namespace, tenant=tenant, options=opts)

    def resolved(self) -> ConnectionOptions:
        """The options to connect with (``address`` and ``namespace`` as given here)."""
        base = self.options if self.options is not None else load_connection()
        return replace(base, address=self.address, namespace=self.namespace)


class ServerUnreachable(ConnectionError):
    """The Temporal server Headway runs on cannot be reached at the configured address."""


@contextlib.contextmanager
def reaching(address: str) -> Iterator[None]:
    """Around calls to a server the SDK connected to: one that cannot reach it any more
    (it stopped, or the network went; the Temporal client has retried it already)
    raises :class:`ServerUnreachable` naming the address, not the transport's
    ``RPCError`` and its traceback."""
    from temporalio.service import RPCError, RPCStatusCode

    try:
        yield
    except RPCError as err:
        if err.status != RPCStatusCode.UNAVAILABLE:
            raise
        raise ServerUnreachable(
            f"address: cannot reach Temporal at {address!r} any more ({err.message});"
            " is Headway still up?"
        ) from None


class Engine:
    """The SDK's loop thread and the clients connected on it (one per connection)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._clients: dict[ConnectionOptions, asyncio.Future[TemporalClient]] = {}
        self._calls: set[asyncio.Future[Any]] = set()
        self._rpcs: set[asyncio.Task[Any]] = set()
        self._closed = False

    # --- running coroutines -------------------------------------------------------------

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise RuntimeError("headway: the SDK is shut down (the interpreter is exiting)")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                thread = threading.Thread(target=serve, name="headway-sdk", daemon=True)
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
                atexit.register(self.shutdown)
            return self._loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coro`` on the SDK's loop; its future (cancelling it cancels the call)."""
        loop = self.loop()

        async def tracked() -> T:
            task = asyncio.current_task()
            assert task is not None
            self._calls.add(task)
            try:
                return await coro
            finally:
                self._calls.discard(task)

        return asyncio.run_coroutine_threadsafe(tracked(), loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the SDK's loop and block until it is done (sync entry points).

        Raises:
            TimeoutError: not done within ``timeout`` seconds (the call is cancelled).
        """
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("headway: a blocking SDK call inside the SDK's own loop")
        fut = self.submit(coro)
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"not done within {timeout:g} s") from None
        except KeyboardInterrupt:
            fut.cancel()
            raise

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the SDK's loop, awaited from any other loop."""
        if asyncio.get_running_loop() is self._loop:
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    # --- connections --------------------------------------------------------------------

    async def client(self, conn: Connection) -> TemporalClient:
        """The client for ``conn``, connected once (call on the SDK's loop)."""
        key = conn.resolved()
        fut = self._clients.get(key)
        if fut is None or (fut.done() and fut.exception() is not None):
            fut = asyncio.ensure_future(self._connect(conn))
            self._clients[key] = fut
        return await asyncio.shield(fut)

    async def _connect(self, conn: Connection) -> TemporalClient:
        from headway import protocol, telemetry
        from temporalio.client import Client as TemporalClient
        from temporalio.service import ServiceClient

        opts = conn.resolved()
        try:
            inner = await self._rpc(
                ServiceClient.connect(opts.connect_config())  # type: ignore[arg-type]
            )
        except Exception as exc:
            line = explain_failure(opts, exc)
            if not line.startswith("cannot reach Temporal"):
                # Credentials or TLS: retrying the same settings cannot help.
                raise ConnectionSettingsError(line) from None
            raise ServerUnreachable(
                f"address: cannot reach Temporal at {conn.address!r} ({str(exc).split(':')[0]});"
                f" is Headway up? Point the SDK at it with headway.init(address=...) or"
                f" {ADDRESS_ENV}"
            ) from None
        return TemporalClient(
            _TrackedServiceClient(inner, self),
            namespace=conn.namespace,
            interceptors=telemetry.interceptors(),
            data_converter=protocol.data_converter(),
        )

    async def _rpc(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await one RPC that nothing may cancel: a caller giving up stops waiting only."""
        task: asyncio.Task[T] = asyncio.ensure_future(coro)
        self._rpcs.add(task)
        task.add_done_callback(self._rpcs.discard)
        return await asyncio.shield(task)

    # --- exit ---------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Cancel the callers' waits, let every RPC in flight complete, stop the loop."""
        with self._lock:
            loop, thread, self._closed = self._loop, self._thread, True
        if loop is None or thread is None or not thread.is_alive():
            return

        async def drain() -> None:
            for call in list(self._calls):
                call.cancel()
            if self._calls:
                await asyncio.wait(list(self._calls), timeout=EXIT_WAIT_S)
            if self._rpcs:
                await asyncio.wait(list(self._rpcs), timeout=EXIT_WAIT_S)

        # A teardown that cannot finish still stops the loop.
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(drain(), loop).result(2 * EXIT_WAIT_S + 1)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        # The Rust thread that completed the last RPC scheduled its result on the loop
        # from inside its own hold of the GIL, and Python code there can be switched out
        # before that hold is released: give it the GIL back (sleeping releases it) so it
        # is out of Python before finalization starts.
        time.sleep(EXIT_GRACE_S)


class _TrackedServiceClient:
    """A Temporal service client whose every RPC runs through :meth:`Engine._rpc`."""

    def __new__(cls, inner: ServiceClient, engine: Engine) -> Any:
        from temporalio.service import ServiceClient

        class Tracked(ServiceClient):
            def __init__(self) -> None:
                super().__init__(inner.config)

            @property
            def worker_service_client(self) -> BridgeServiceClient:
                return inner.worker_service_client

            def update_rpc_metadata(self, metadata: Mapping[str, str | bytes]) -> None:
                inner.update_rpc_metadata(metadata)

            def update_api_key(self, api_key: str | None) -> None:
                inner.update_api_key(api_key)

            async def _rpc_call(
                self,
                rpc: str,
                req: google.protobuf.message.Message,
                resp_type: type[ServiceResponse],
                *,
                service: str,
                retry: bool,
                metadata: Mapping[str, str | bytes],
                timeout: timedelta | None,
            ) -> ServiceResponse:
                return await engine._rpc(
                    inner._rpc_call(
                        rpc,
                        req,
                        resp_type,
                        service=service,
                        retry=retry,
                        metadata=metadata,
                        timeout=timeout,
                    )
                )

        return Tracked()


#: The process's engine.
ENGINE = Engine()
