"""The Kubernetes backend itself (see the package docstring): pods created and adopted
by name, deleted with Headway's finalizer lifted, informer deliveries turned into
events, and the capacity report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from headway.protocol import (
    TERMINAL_EVENTS,
    ActionEvent,
    CapacityReport,
    DispatchRequest,
    NodeCapacity,
    PodSpec,
    action_workflow_id,
)
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from ..base import (
    ACTION_ANNOTATION,
    ACTION_LABEL,
    TENANT_LABEL,
    WORKFLOW_ANNOTATION,
    ChangeSignal,
    EventHub,
    HeadwayPods,
    PodLog,
    PodRecord,
    label_value,
    service_name,
)
from .capacity import node_capacity, requests_by_node
from .deletion import read_pod, remove_pod, wait_gone
from .informer import Informer
from .pods import (
    DEFAULT_GPU_NODE_LABEL,
    build_pods,
    build_service,
    gpu_short_name,
    needs_service,
    pod_names,
)
from .pooled import PooledCalls, pooled_shape
from .status import (
    _FINISHED_PHASES,
    _IMAGE_PULL_FATAL,
    _K,
    _action_of,
    _dispatch_of,
    _image_pull_reason,
    _key,
    _owner_of,
    _requests_spec,
    _task_failure,
    _tenant_of,
    _uid,
    task_output,
    translate_pod,
)

log = logging.getLogger(__name__)

_NOTHING = (0, 0, 0, 0)
#: How long a pod this worker created counts as pending room before the informers show
#: it (it normally shows within a second; one deleted unseen is forgotten after this).
UNSEEN_TTL_S = 60.0


class KubernetesBackend:
    """A real cluster, through the kube API.

    Args:
        name: The cluster's name as the control plane knows it.
        namespace: Namespace the pods run in (and the only one watched). None: the
            request's namespace, watching all namespaces.
        kubeconfig: Kubeconfig file; default in-cluster config, else ``~/.kube/config``.
        context: Kubeconfig context.
        api_client: A ready ``kubernetes.client.ApiClient`` (overrides the two above).
        gpu_node_label: Node label carrying the GPU type (``nvidia.com/gpu.product`` is
            what NVIDIA's GPU feature discovery sets).
        watch_timeout_s: Server-side watch timeout; watches are renewed after it.
        sync_timeout_s: How long ``create_pods`` waits for the first pod list, so an
            adopted gang's current state is known.
        pod_log: The pod log file; None reads ``$HEADWAY_POD_LOG`` (unset: no log).
        stale_timeout_s: How long to wait for a stale pod (another dispatch's, same
            name) to be gone before creating this dispatch's.
        gpu_names: Short GPU name -> node-label value (``{"H100":
            "NVIDIA-H100-80GB-HBM3"}``): pods asking for ``H100`` select the label value,
            and nodes report their GPUs under the short name.
        queue_namespaces: Queue -> the namespace its pods run in (others: ``namespace``).
        delete_grace_s: Grace period of Headway's pod deletions (cancel, cleanup): the
            container gets SIGTERM and this long before SIGKILL.
        image_pull_grace_s: How long a pod may keep failing to pull its image
            (``ErrImagePull``/``ImagePullBackOff``) before the action fails
            ``ImagePullFailed``; an invalid image name fails at once.
        pool_listen: ``HOST:PORT`` the pods of reusable environments' pools dial (the
            worker listens at PORT on every interface; 0: a free one); None: this
            worker's ``$POD_IP`` (else its host's address) and a free port. On a real
            cluster the pool pods must reach it: a Service in front of the worker, or
            its pod IP (see ``headway.activities.backends.kubernetes.pooled``).
        pool_connect_timeout_s: How long a pooled action waits while no pod of its pool
            is connected (unschedulable, image not pulled) before it fails.
    """

    def __init__(
        self,
        name: str,
        *,
        namespace: str | None = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        api_client: k8s.ApiClient | None = None,
        gpu_node_label: str = DEFAULT_GPU_NODE_LABEL,
        watch_timeout_s: int = 300,
        sync_timeout_s: float = 30.0,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 30.0,
        clock: Callable[[], float] = time.time,
        pod_log: str | None = None,
        stale_timeout_s: float = 30.0,
        gpu_names: Mapping[str, str] | None = None,
        queue_namespaces: Mapping[str, str] | None = None,
        delete_grace_s: int = 30,
        image_pull_grace_s: float = 120.0,
        pool_listen: str | None = None,
        pool_connect_timeout_s: float = 300.0,
    ) -> None:
        self.name = name
        self.gpu_names = dict(gpu_names or {})
        self.queue_namespaces = dict(queue_namespaces or {})
        self.delete_grace_s = delete_grace_s
        self.image_pull_grace_s = image_pull_grace_s
        # Pods failing to pull their image: since when, and the timer that looks again.
        self._pull_failing_since: dict[tuple[str, str], float] = {}
        self._pull_timers: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._incarnation = ""
        self.stale_timeout_s = stale_timeout_s
        self._pod_log = PodLog.from_env(name, pod_log)
        self.namespace = namespace
        # Where pods are looked for: every namespace once a queue runs elsewhere.
        self._scope: str | None = (
            namespace
            if namespace is not None and set(self.queue_namespaces.values()) <= {namespace}
            else None
        )
        self.gpu_node_label = gpu_node_label
        self.watch_timeout_s = watch_timeout_s
        self.sync_timeout_s = sync_timeout_s
        self.clock = clock
        self._backoff = (backoff_initial_s, backoff_max_s)
        self._api_client = api_client
        self._kubeconfig = kubeconfig
        self._context = context
        self._api: k8s.CoreV1Api | None = None
        self._hub = EventHub()
        # Actions of reusable environments: calls in their pools (no pod of their own).
        self.pooled = PooledCalls(
            name,
            self._pool_api_client,
            self._hub,
            clock,
            default_namespace=namespace,
            listen=pool_listen,
            connect_timeout_s=pool_connect_timeout_s,
        )
        self._changes = ChangeSignal()
        self._sequence = 0
        # Headway's pods (label-selected), every pod's requests, and the nodes.
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._all_pods: dict[tuple[str, str], dict[str, Any]] = {}
        self._nodes: dict[str, dict[str, Any]] = {}
        self._nodes_known = False
        self._gone_nodes: set[str] = set()
        self._all_pods_known = False
        self._last: dict[tuple[str, str], ActionEvent] = {}
        # (tenant, action) Headway is deleting the pods of ("" tenant: every tenant's).
        self._deleting: set[tuple[str, str]] = set()
        # Pods replaced by a newer dispatch's pod of the same name: never reported.
        self._stale_uids: set[str] = set()
        self._pods_synced = asyncio.Event()
        self.informers: dict[str, Informer] = {}
        # Pods this worker created that the informers have not shown yet: (created at,
        # requests), so two dispatches checked one after the other do not both count
        # the same free room.
        self._unseen: dict[tuple[str, str], tuple[float, PodSpec]] = {}

    @property
    def incarnation(self) -> str:
        """The worker process running this backend (stamped on pod-log lines)."""
        return self._incarnation

    @incarnation.setter
    def incarnation(self, value: str) -> None:
        self._incarnation = value
        if self._pod_log is not None:
            self._pod_log.incarnation = value

    # --- lifecycle ----------------------------------------------------------------------

    def _make_api(self) -> k8s.CoreV1Api:
        if self._api_client is None:
            if self._kubeconfig is None and self._context is None:
                try:
                    k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
                except k8s_config.ConfigException:
                    k8s_config.load_kube_config()  # type: ignore[no-untyped-call]
                self._api_client = k8s.ApiClient()
            else:
                self._api_client = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
                    config_file=self._kubeconfig, context=self._context
                )
            # Who wrote what, in the API server's audit log: this process.
            self._api_client.user_agent = f"headway-cluster-worker/{os.getpid()}"
        return k8s.CoreV1Api(self._api_client)

    def _pool_api_client(self) -> k8s.ApiClient:
        self.api  # noqa: B018  (builds the client)
        assert self._api_client is not None
        return self._api_client

    @property
    def api(self) -> k8s.CoreV1Api:
        """The CoreV1 API (built on first use)."""
        if self._api is None:
            self._api = self._make_api()
        return self._api

    async def start(self) -> None:
        """Start the pod, all-pods and node informers."""
        if self._pod_log is not None:
            await asyncio.to_thread(self._pod_log.open)
        api = await asyncio.to_thread(lambda: self.api)
        loop = asyncio.get_running_loop()
        selector = ACTION_LABEL
        if self._scope is None:

            def pods_fn(**kw: Any) -> Any:
                return api.list_pod_for_all_namespaces(label_selector=selector, **kw)
        else:
            ns = self._scope

            def pods_fn(**kw: Any) -> Any:
                return api.list_namespaced_pod(ns, label_selector=selector, **kw)

        def all_pods_fn(**kw: Any) -> Any:
            return api.list_pod_for_all_namespaces(
                field_selector="status.phase!=Succeeded,status.phase!=Failed", **kw
            )

        initial, cap = self._backoff
        common: dict[str, Any] = {
            "watch_timeout_s": self.watch_timeout_s,
            "backoff_initial_s": initial,
            "backoff_max_s": cap,
        }
        self.informers = {
            "pods": Informer("pods", pods_fn, self._on_pod, **common),
            "all-pods": Informer(
                "all-pods", all_pods_fn, self._on_any_pod, self._on_all_pods_error, **common
            ),
            "nodes": Informer(
                "nodes", api.list_node, self._on_node, self._on_nodes_error, **common
            ),
        }
        for informer in self.informers.values():
            informer.start(loop)

    async def close(self) -> None:
        """Stop the informers, tear the pools down and close the API client."""
        with contextlib.suppress(Exception):
            await self.pooled.close()
        for informer in self.informers.values():
            informer.stop()
        for timer in self._pull_timers.values():
            timer.cancel()
        self._pull_timers.clear()
        for informer in self.informers.values():
            await informer.join()
        if self._api_client is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._api_client.close)
        if self._pod_log is not None:
            self._pod_log.close()

    # --- pods ---------------------------------------------------------------------------

    def _ns(self, requested: str) -> str:
        return self.namespace or requested or "default"

    def namespace_of(self, req: DispatchRequest) -> str:
        """Where the action's pods run: its queue's namespace, else the worker's."""
        return self.queue_namespaces.get(req.queue) or self._ns(req.namespace)

    async def create_pods(
        self, req: DispatchRequest, *, dispatch: str = "", adopt_only: bool = False
    ) -> list[str]:
        """Create the gang (and its headless Service); 409 Conflict adopts the existing.

        A pod that exists under another ``dispatch`` is stale: it is deleted and this
        dispatch's created. With ``adopt_only`` nothing is sent to the API server.
        """
        ns = self.namespace_of(req)
        self._deleting.discard((req.tenant, req.action_id))
        if pooled_shape(req) is not None:
            # A reusable environment's action: a call in its pool, no pod of its own.
            return [self.pooled.start(req, ns, dispatch, adopt_only=adopt_only)]
        legacy = await self._begun_before_tenants(req, ns, dispatch, adopt_only)
        names = pod_names(req, legacy)
        if not adopt_only:
            if needs_service(req):
                await self._create(
                    lambda body: self.api.create_namespaced_service(ns, _any(body)),
                    build_service(req, ns, legacy),
                )
            bodies = build_pods(
                req,
                ns,
                self.gpu_node_label,
                dispatch=dispatch,
                gpu_names=self.gpu_names,
                constrain=self._hints_known(req),
                legacy=legacy,
            )
            for spec, body in zip(req.pods, bodies, strict=True):
                await self._create_pod(ns, body, spec, dispatch)
            if len(names) > 1:
                await self._release_gang(ns, names)
        elif len(names) > 1:
            await self._complete_held_gang(req, ns, names, dispatch, legacy)
        # Adoption relies on the informer's picture: make sure it has been listed once.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._pods_synced.wait(), self.sync_timeout_s)
        return names

    async def _begun_before_tenants(
        self, req: DispatchRequest, ns: str, dispatch: str, adopt_only: bool
    ) -> bool:
        """Whether this dispatch's pods exist under the names a worker gave them before
        tenants were part of names (its predecessor, since upgraded, created them): they
        keep those names, and are adopted, never created a second time under the new.

        A retry (``adopt_only``) asks the API server; a first attempt, the informer's
        picture (it creates only what is missing anyway), where another dispatch's pod
        of such a name is stale, as a pod of the same name would be: it is removed.
        """
        legacy = set(pod_names(req, legacy=True))
        if adopt_only:
            found = [
                p
                for p in await self._list_action_pods(req.action_id, ns, req.tenant)
                if p["metadata"]["name"] in legacy
            ]
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._pods_synced.wait(), self.sync_timeout_s)
            found = [
                pod
                for name in sorted(legacy)
                if (pod := self._pods.get((ns, name))) is not None
                and _action_of(pod) == req.action_id
                and _tenant_of(pod) in ("", req.tenant)
            ]
        ours = [p for p in found if not dispatch or _dispatch_of(p) in ("", dispatch)]
        if not adopt_only:
            for stale in (p for p in found if p not in ours):
                name = stale["metadata"]["name"]
                log.warning("pod %s is of an earlier dispatch, not %s: removing", name, dispatch)
                self._stale_uids.add(_uid(stale))
                self._last.pop((ns, name), None)
                with contextlib.suppress(ApiException):
                    await remove_pod(self.api, ns, stale)
                await wait_gone(self.api, ns, name, self.stale_timeout_s)
        if ours:
            log.info(
                "%s: adopting pods named before tenants were part of names: %s",
                req.action_id,
                ", ".join(sorted(p["metadata"]["name"] for p in ours)),
            )
        return bool(ours)

    def _hints_known(self, req: DispatchRequest) -> bool:
        """Whether the admission's node hints are nodes of this cluster: an admission
        made while its capacity was unknown names the fleet file's placeholders (and a
        node may have gone since), which no pod could ever be bound to."""
        unknown = [n for n in req.node_hints if n not in self._nodes]
        if unknown:
            log.info(
                "%s: the admission's nodes %s are not nodes of %s: pods not constrained",
                req.action_id,
                ", ".join(unknown),
                self.name,
            )
        return not unknown

    async def _create_pod(
        self, ns: str, body: dict[str, Any], spec: PodSpec, dispatch: str
    ) -> None:
        name = body["metadata"]["name"]
        action = body["metadata"]["annotations"][ACTION_ANNOTATION]

        def note(event: str) -> None:
            if self._pod_log is not None:
                self._pod_log.append(
                    event,
                    t=self.clock(),
                    action=action,
                    pod=name,
                    node=None,
                    spec=spec,
                    dispatch=dispatch,
                )

        for _ in range(2):
            # The intent first: a kill between the call and the "created" line must not
            # leave a pod the log never heard of.
            note("creating")
            try:
                await asyncio.to_thread(self.api.create_namespaced_pod, ns, _any(body))
            except ApiException as exc:
                if exc.status != 409:
                    raise
            else:
                note("created")
                # Room it takes until the informer shows it (the arbiter's next check).
                if (ns, name) not in self._pods:
                    self._unseen[(ns, name)] = (self.clock(), spec)
                return
            existing = await read_pod(self.api, ns, name)
            theirs = _dispatch_of(existing) if existing is not None else ""
            if existing is not None and not (dispatch and theirs and theirs != dispatch):
                log.info("adopting existing Pod %s", name)
                return
            if existing is not None:
                # Left by an earlier dispatch of the action, which is over: not ours to
                # adopt. Replace it, and let nothing it reports (its old outcome, its
                # deletion) pass for the new pod of the same name.
                self._stale_uids.add(_uid(existing))
                self._last.pop((ns, name), None)
                log.warning(
                    "pod %s belongs to dispatch %s, not %s: replacing", name, theirs, dispatch
                )
                with contextlib.suppress(ApiException):
                    await remove_pod(self.api, ns, existing)
                await wait_gone(self.api, ns, name, self.stale_timeout_s)
        raise RuntimeError(f"pod {ns}/{name}: a stale pod of another dispatch keeps coming back")

    async def _release_gang(self, ns: str, names: Sequence[str]) -> None:
        """Lift the gang's scheduling gate (``GANG_GATE``) from each of its pods."""
        for name in names:
            await asyncio.to_thread(
                self.api.patch_namespaced_pod, name, ns, {"spec": {"schedulingGates": None}}
            )

    async def _complete_held_gang(
        self, req: DispatchRequest, ns: str, names: list[str], dispatch: str, legacy: bool
    ) -> None:
        """An earlier attempt's gang still held by its gate (that attempt died creating
        it, or releasing it). Wholly held: nothing of it ran, so what is missing is
        created, then the gang released. Partly released: it was whole when its release
        began, so the rest is released (a member missing now went after that: lost)."""
        pods = {
            p["metadata"]["name"]: p
            for p in await self._list_action_pods(req.action_id, ns, req.tenant)
            if _dispatch_of(p) == dispatch
        }
        held = [n for n, p in pods.items() if (p.get("spec") or {}).get("schedulingGates")]
        if not held:
            return
        if len(held) < len(pods):
            await self._release_gang(ns, held)
            return
        missing = [n for n in names if n not in pods]
        if missing:
            log.warning(
                "%s: completing the gang an earlier attempt began (still held): %s",
                req.action_id,
                ", ".join(missing),
            )
        bodies = build_pods(
            req,
            ns,
            self.gpu_node_label,
            dispatch=dispatch,
            gpu_names=self.gpu_names,
            constrain=self._hints_known(req),
            legacy=legacy,
        )
        for spec, body in zip(req.pods, bodies, strict=True):
            if body["metadata"]["name"] in missing:
                await self._create_pod(ns, body, spec, dispatch)
        await self._release_gang(ns, names)

    @staticmethod
    async def _create(fn: Callable[[dict[str, Any]], Any], body: dict[str, Any]) -> None:
        try:
            await asyncio.to_thread(fn, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            log.info("adopting existing %s %s", body["kind"], body["metadata"]["name"])

    async def delete_pods(
        self, action_id: str, namespace: str = "default", *, tenant: str = ""
    ) -> int:
        """Delete the action's pods and Service (404s are fine: idempotent).

        Every pod is tried even when one delete fails; the first failure is raised after
        (the caller retries, and finds only what is left).
        """
        # A queue's own namespace is taken as given; any other is the worker's.
        ns = namespace if namespace in self.queue_namespaces.values() else self._ns(namespace)
        self._deleting.add((tenant, action_id))
        cancelled = await self.pooled.cancel(action_id, tenant)
        items = await self._list_action_pods(action_id, ns if self._scope else None, tenant)
        deleted = cancelled
        failure: ApiException | None = None
        spaces = {ns}
        # The tenant's Service, and whichever its pods name (a gang begun before tenants
        # were part of names has the Service named for the action alone).
        services = {service_name(action_id, tenant)}
        for pod in items:
            pod_ns = (pod.get("metadata") or {}).get("namespace") or ns
            spaces.add(pod_ns)
            subdomain = (pod.get("spec") or {}).get("subdomain")
            if subdomain:
                services.add(str(subdomain))
            try:
                await remove_pod(self.api, pod_ns, pod, grace_s=self.delete_grace_s)
                deleted += 1
            except ApiException as exc:
                if exc.status != 404:
                    failure = failure or exc
        for space in sorted(spaces):
            for service in sorted(services):
                try:
                    await asyncio.to_thread(self.api.delete_namespaced_service, service, space)
                except ApiException as exc:
                    if exc.status != 404:
                        failure = failure or exc
        if failure is not None:
            raise failure
        return deleted

    async def _list_action_pods(
        self, action_id: str, ns: str | None, tenant: str = ""
    ) -> list[dict[str, Any]]:
        """The action's pods as the API server has them now (not the informer's copy):
        ``tenant``'s only when given (every tenant's of that id when empty)."""
        selector = f"{ACTION_LABEL}={label_value(action_id)}"
        if tenant:
            selector += f",{TENANT_LABEL}={label_value(tenant)}"
        if ns is None:
            resp: Any = await asyncio.to_thread(
                self.api.list_pod_for_all_namespaces,
                label_selector=selector,
                _preload_content=False,
            )
        else:
            resp = await asyncio.to_thread(
                self.api.list_namespaced_pod, ns, label_selector=selector, _preload_content=False
            )
        items = json.loads(resp.data).get("items") or []
        # A label value shared by two ids after sanitizing: the annotation tells them apart.
        return [p for p in items if _action_of(p) == action_id]

    async def dispatch_record(self, action_id: str, dispatch: str) -> dict[str, PodRecord]:
        """The pods of ``dispatch`` that exist now, with their node and outcome.

        The API server keeps no trace of a deleted pod, so this is what is left: a
        retried attempt adds what its predecessor's heartbeats recorded.
        """
        out: dict[str, PodRecord] = self.pooled.records(action_id, dispatch)
        for pod in await self._list_action_pods(action_id, self._scope):
            if _dispatch_of(pod) != dispatch:
                continue
            name = pod["metadata"]["name"]
            state = translate_pod(pod, node_gone=self._node_gone(pod))
            outcome = state[0] if state is not None and state[0] in TERMINAL_EVENTS else None
            out[name] = PodRecord(name, (pod.get("spec") or {}).get("nodeName"), outcome)
        return out

    async def live_pods(self, action_id: str, dispatch: str = "") -> dict[str, str | None]:
        """The action's pods that exist (name -> node), from a LIST; ``dispatch``'s only
        when given (pods created before dispatches were recorded count as its own). A pod
        marked for deletion is not live: it is kept only as the record of its end."""
        return {
            pod["metadata"]["name"]: (pod.get("spec") or {}).get("nodeName")
            for pod in await self._list_action_pods(action_id, self._scope)
            if (not dispatch or _dispatch_of(pod) in ("", dispatch))
            and not pod["metadata"].get("deletionTimestamp")
        } | self.pooled.live(action_id, dispatch)

    async def node_exists(self, node: str) -> bool | None:
        """Whether the API server has the node (a GET); None when it cannot be read."""
        try:
            await asyncio.to_thread(self.api.read_node, node, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return False
            log.info("reading node %s: %s %s", node, exc.status, exc.reason)
            return None
        return True

    async def headway_pods(self) -> list[HeadwayPods]:
        """Every action with Headway pods, from the informer's picture once it is listed.

        The workflow id comes from the pod's annotation; for pods created before it was
        recorded it is derived from the tenant label, and marked inexact.
        """
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._pods_synced.wait(), self.sync_timeout_s)
        found: dict[tuple[str, str], HeadwayPods] = {}
        for (ns, _), pod in self._pods.items():
            key = _owner_of(pod)
            if key is None or key in found:
                continue
            tenant, action = key
            meta = pod.get("metadata") or {}
            workflow = (meta.get("annotations") or {}).get(WORKFLOW_ANNOTATION)
            if workflow:
                found[key] = HeadwayPods(action, str(workflow), ns, tenant=tenant)
            else:
                found[key] = HeadwayPods(
                    action, action_workflow_id(tenant, action), ns, exact=False, tenant=tenant
                )
        return [found[k] for k in sorted(found, key=lambda k: (k[1], k[0]))]

    def _being_deleted(self, pod: dict[str, Any]) -> bool:
        """Whether Headway is deleting the pods of the pod's action (of its tenant)."""
        tenant, action = _tenant_of(pod), _action_of(pod)
        return action is not None and bool({(tenant, action), ("", action)} & self._deleting)

    def forget(self, action_id: str, *, tenant: str = "") -> None:
        """Nothing to forget: the API server is the record."""

    # --- events -------------------------------------------------------------------------

    def subscribe(self) -> contextlib.AbstractContextManager[asyncio.Queue[ActionEvent]]:
        """A queue of every event published while the context is open."""
        return self._hub.subscribe()

    def events(self) -> AsyncIterator[ActionEvent]:
        """Every event, for all actions, from now on."""
        return self._hub.stream()

    async def current_events(self, action_id: str) -> list[ActionEvent]:
        """The latest event of each of the action's pods, from the informer's picture."""
        return [
            e for e in self._last.values() if e.action_id == action_id
        ] + self.pooled.current_events(action_id)

    def _report(self, key: tuple[str, str], pod: dict[str, Any], *, node_gone: bool) -> None:
        action = _action_of(pod)
        if action is None or _uid(pod) in self._stale_uids:
            return
        if self._being_deleted(pod) and (pod.get("metadata") or {}).get("deletionTimestamp"):
            return  # Headway's own deletion (an ended or cancelled action): nothing to say
        state = translate_pod(pod, node_gone=node_gone)
        if state is None:
            return
        kind, code, message = state
        if kind is _K.IMAGE_PULL_FAILED:
            waited = self._image_pull_waited(key, pod)
            if waited is None:
                return  # still within its grace: the kubelet keeps trying
            if waited:
                message = f"{message} (still failing after {waited:g} s)"
        else:
            self._image_pull_ok(key)
        output = task_output(pod) if kind in (_K.SUCCEEDED, _K.FAILED) else None
        if kind is _K.FAILED and output is not None:
            message = _task_failure(output) or message
        last = self._last.get(key)
        if last is not None and (
            last.kind in TERMINAL_EVENTS or (last.kind, last.message) == (kind, message)
        ):
            return
        event = ActionEvent(
            action_id=action,
            kind=kind,
            cluster=self.name,
            pod=key[1],
            node=(pod.get("spec") or {}).get("nodeName"),
            exit_code=code,
            message=message,
            observed_at=self.clock(),
            output=output,
        )
        self._last[key] = event
        self._hub.publish(event)

    def _image_pull_waited(self, key: tuple[str, str], pod: dict[str, Any]) -> float | None:
        """How long the pod has failed to pull its image once that is past its grace
        (0: a failure that waiting cannot fix); None while it is within the grace, with
        a timer set to look again when it ends (the kubelet may say nothing new)."""
        if _image_pull_reason(pod) in _IMAGE_PULL_FATAL:
            return 0.0
        now = self.clock()
        since = self._pull_failing_since.setdefault(key, now)
        left = since + self.image_pull_grace_s - now
        if left <= 0:
            return round(now - since, 1)
        if key not in self._pull_timers:
            loop = asyncio.get_running_loop()
            self._pull_timers[key] = loop.call_later(left + 0.05, self._look_again, key)
        return None

    def _image_pull_ok(self, key: tuple[str, str]) -> None:
        self._pull_failing_since.pop(key, None)
        timer = self._pull_timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def _look_again(self, key: tuple[str, str]) -> None:
        self._pull_timers.pop(key, None)
        pod = self._pods.get(key)
        if pod is not None:
            self._report(key, pod, node_gone=self._node_gone(pod))

    def _node_gone(self, pod: dict[str, Any]) -> bool:
        # Only a node we saw go counts: the node informer may simply not have caught up
        # with a node that was just added.
        node = (pod.get("spec") or {}).get("nodeName")
        return bool(node) and node in self._gone_nodes

    def _on_pod(self, kind: str, obj: dict[str, Any]) -> None:
        # Seen now (or gone): its room is counted from what the informers say.
        if kind == "SYNC":
            for p in obj["items"]:
                self._unseen.pop(_key(p), None)
        else:
            self._unseen.pop(_key(obj), None)
        if kind == "SYNC":
            fresh = {_key(p): p for p in obj["items"]}
            for key in set(self._pods) - set(fresh):
                gone = self._pods.pop(key)
                self._audit(key, gone, deleted=True)
                self._pod_gone(key, gone)
            for key, pod in fresh.items():
                self._pods[key] = pod
                self._report(key, pod, node_gone=self._node_gone(pod))
                self._audit(key, pod)
            if not self._pods_synced.is_set():
                self._audit_vanished({name for _, name in fresh})
            self._pods_synced.set()
        elif kind == "DELETED":
            key = _key(obj)
            self._pods.pop(key, None)
            self._report(key, obj, node_gone=self._node_gone(obj))
            self._audit(key, obj, deleted=True)
            self._pod_gone(key, obj)
        else:
            key = _key(obj)
            self._pods[key] = obj
            self._report(key, obj, node_gone=self._node_gone(obj))
            self._audit(key, obj)
        self._changes.bump()

    def _audit_vanished(self, listed: set[str]) -> None:
        """At the first list: pods an earlier incarnation logged and nobody saw end, that
        are gone now (deleted while no worker watched, e.g. with their node), end now."""
        if self._pod_log is None:
            return
        self._pod_log.end_vanished(self.clock(), lambda _dispatch, pod: pod in listed)

    def _audit(self, key: tuple[str, str], pod: dict[str, Any], *, deleted: bool = False) -> None:
        """Pod-log lines for what the informer saw: bound to a node, and ended (finished,
        or deleted). Each is written once per dispatch and pod, across incarnations."""
        if self._pod_log is None:
            return
        action = _action_of(pod)
        if action is None:
            return
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        dispatch = _dispatch_of(pod)
        now = self.clock()
        common: dict[str, Any] = {
            "action": action,
            "pod": key[1],
            "node": node,
            "spec": _requests_spec(pod),
            "dispatch": dispatch,
        }
        if node:
            self._pod_log.append("bound", t=now, **common)
        if deleted or phase in _FINISHED_PHASES:
            last = self._last.get(key)
            if last is not None and last.kind in TERMINAL_EVENTS:
                outcome = str(last.kind)
            else:
                state = translate_pod(pod)
                terminal = state is not None and state[0] in TERMINAL_EVENTS
                outcome = str(state[0]) if state is not None and terminal else "Deleted"
            self._pod_log.append("ended", t=now, outcome=outcome, **common)

    def _pod_gone(self, key: tuple[str, str], pod: dict[str, Any]) -> None:
        if _uid(pod) in self._stale_uids:
            self._stale_uids.discard(_uid(pod))
            return
        action = _action_of(pod)
        last = self._last.get(key)
        if (
            action is not None
            and not self._being_deleted(pod)
            and (last is None or last.kind not in TERMINAL_EVENTS)
        ):
            # Deleted under a live action by someone else: the pod is not coming back.
            gone = self._node_gone(pod)
            event = ActionEvent(
                action_id=action,
                kind=_K.NODE_LOST if gone else _K.FAILED,
                cluster=self.name,
                pod=key[1],
                node=(pod.get("spec") or {}).get("nodeName"),
                message="node lost" if gone else "pod was deleted",
                observed_at=self.clock(),
            )
            self._hub.publish(event)
        self._last.pop(key, None)
        self._image_pull_ok(key)

    def _on_any_pod(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "SYNC":
            self._all_pods = {_key(p): p for p in obj["items"]}
            self._all_pods_known = True
        elif kind == "DELETED":
            self._all_pods.pop(_key(obj), None)
        else:
            self._all_pods[_key(obj)] = obj
        self._changes.bump()

    def _on_all_pods_error(self, exc: ApiException | Exception) -> None:
        if isinstance(exc, ApiException) and exc.status in (401, 403):
            self._all_pods_known = False
            self._changes.bump()

    def _on_node(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "SYNC":
            fresh = {(n.get("metadata") or {}).get("name", ""): n for n in obj["items"]}
            gone = set(self._nodes) - set(fresh)
            self._nodes = fresh
            self._nodes_known = True
        elif kind == "DELETED":
            name = (obj.get("metadata") or {}).get("name", "")
            self._nodes.pop(name, None)
            gone = {name}
        else:
            self._nodes[(obj.get("metadata") or {}).get("name", "")] = obj
            gone = set()
        self._gone_nodes -= set(self._nodes)
        self._gone_nodes |= gone
        for key, pod in self._pods.items():
            if (pod.get("spec") or {}).get("nodeName") in gone:
                self._report(key, pod, node_gone=True)
        self._changes.bump()

    def _on_nodes_error(self, exc: ApiException | Exception) -> None:
        if isinstance(exc, ApiException) and exc.status in (401, 403, 404):
            # Not allowed to read nodes: capacity is unknown, which means open.
            self._nodes_known = False
            self._changes.bump()

    # --- capacity -----------------------------------------------------------------------

    def gpu_type_of(self, labels: Mapping[str, str]) -> str | None:
        """The GPU type a node with these labels reports (its short name by the
        worker's GPU name map, so the scheduler's ``H100:8`` matches)."""
        return gpu_short_name(labels.get(self.gpu_node_label), self.gpu_names)

    def free_nodes(
        self, tolerations: Sequence[Mapping[str, Any]] = ()
    ) -> tuple[list[NodeCapacity], list[PodSpec]] | None:
        """The live view for the arbiter: per node, what is free for a pod with
        ``tolerations`` (every pod on the cluster counted, any tenant's or none), and
        the requests of Headway's pods that are created but not bound yet (they take
        room first). None while nodes or pods cannot be read (capacity unknown)."""
        if not (self._nodes_known and self._all_pods_known):
            return None
        # The headway informer may be ahead of the all-pods one: count each pod once,
        # from the freshest copy.
        pods = {**self._all_pods, **self._pods}
        used, pending = requests_by_node(pods, self._pods)
        horizon = self.clock() - UNSEEN_TTL_S
        for key, (at, spec) in list(self._unseen.items()):
            if key in pods or at < horizon:
                del self._unseen[key]
            else:
                pending.append(spec)
        nodes = [
            node_capacity(n, used.get(name, _NOTHING), tolerations, self.gpu_type_of)
            for name, n in sorted(self._nodes.items())
        ]
        return nodes, pending

    async def live_view(
        self, req: DispatchRequest
    ) -> tuple[list[NodeCapacity], list[PodSpec]] | None:
        """``free_nodes`` for the request's pods (the tolerations they are created with).

        None for a reusable environment's action: it creates no pod (its call runs in its
        pool, whose room the scheduler counts once); a pool whose pods find no room fails
        its calls after the pools' connect timeout instead.
        """
        if pooled_shape(req) is not None:
            return None
        bodies = build_pods(
            req,
            self.namespace_of(req),
            self.gpu_node_label,
            gpu_names=self.gpu_names,
            constrain=self._hints_known(req),
        )
        tolerations = (bodies[0].get("spec") or {}).get("tolerations") or [] if bodies else []
        return self.free_nodes(tolerations)

    async def capacity(self) -> CapacityReport:
        """Per node: allocatable, and free = allocatable - requests of non-terminal pods
        (nothing on a node that takes no new pods: cordoned, NotReady, or with a
        ``NoSchedule``/``NoExecute`` taint Headway's pods do not tolerate).

        ``nodes`` is None while nodes or pods cannot be read (not yet listed, or RBAC
        forbids it): unknown means open.
        """
        self._sequence += 1
        now = self.clock()
        view = self.free_nodes()
        if view is None:
            return CapacityReport(self.name, None, [], self._sequence, now)
        nodes, _ = view
        live: dict[tuple[str, str], bool] = {}
        for pod in self._pods.values():
            action = _action_of(pod)
            phase = (pod.get("status") or {}).get("phase")
            if action is None or phase in _FINISHED_PHASES:
                continue
            bound = bool((pod.get("spec") or {}).get("nodeName"))
            # (The label holds the tenant as a label value: tenant names are valid ones.)
            tenant = ((pod.get("metadata") or {}).get("labels") or {}).get(TENANT_LABEL, "")
            key = (action, str(tenant))
            live[key] = live.get(key, True) and bound
        reflected = sorted(k for k, ok in live.items() if ok)
        return CapacityReport(
            self.name,
            nodes,
            [a for a, _ in reflected],
            self._sequence,
            now,
            reflected_tenants=[t for _, t in reflected],
        )

    async def wait_capacity_change(self, since: int) -> int:
        """Block until an informer delivered something after version ``since``."""
        return await self._changes.wait(since)


def _any(body: dict[str, Any]) -> Any:
    # The client serializes plain dicts as they are; its stubs only name the models.
    return body
