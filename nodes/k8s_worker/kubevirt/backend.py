"""The ``kubevirt`` backend: apply rendered objects, watch them, report the rack.

Theory of operation
-------------------
Every Kubernetes call goes through the official (synchronous) ``kubernetes``
client in a worker thread (``trio.to_thread.run_sync``) under one
:class:`trio.CapacityLimiter`, and every :class:`ApiException` is translated
once, in :meth:`KubevirtBackend._call`, into a :class:`BackendError` whose
``retryable`` says whether the queue should deliver the operation again.
Idempotence (the queue delivers at least once) comes from the API's own
answers: 409 on create means the object exists (success), 404 on delete means
it is gone (success).

- **create**: a multi-node replica's headless Service first (its VMIs' DNS
  names), then per VMI, Secret (cloud-init user data), DataVolume and VMI,
  created together (with wait-for-first-consumer storage the import starts
  only once the VMI exists; KubeVirt holds the VMI until the disk is ready).
- **restart**: a bare VMI cannot be restarted, so: delete the VMIs, wait
  (polling, bounded by ``delete_timeout_s``) until each is gone, replace the
  Secret with the new generation's agent config, create the VMIs again. The
  DataVolume and the Service are kept (created only if they went missing).
- **delete**: VMI, DataVolume and Secret, then the Service; what is gone
  already is fine.
- **run**: two watches (VMIs and DataVolumes of the namespace, selected by
  the ``app.kubernetes.io/managed-by=cosmicac`` label), each a blocking
  ``Watch.stream`` in its own thread that hands events back to trio with
  ``trio.from_thread.run``; :class:`StatusTracker` turns them into
  :class:`VmiEvent`. A watch never passes a resourceVersion, so each (re)start
  begins with the API server's synthetic ``ADDED`` of every object: the
  current state, with nothing missed between watches, no 410 to handle.
- **capacity**: ``list_node``; a node's GPUs are the allocatable of the
  configured resource, or of the discovered one (keys under ``nvidia.com/``
  that are not "0").

The client is imported lazily: importing this module (and rendering) needs no
cluster and no client configuration.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import trio

from contracts.model import NodeInfo, RackReport
from nodes.k8s_worker.backend import BackendError, ReplicaUnit, VmiEvent, VmiPhase
from runtime.wireguard import WireGuardError

from .gateway import (
    LABEL_VLAN,
    gateway_keys,
    gateway_secret,
    gateway_view,
    isolated_names,
    render_gateway,
    render_isolated_nad,
)
from .render import (
    LABEL_JOB,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    render_replica,
    secret_name,
    service_name,
)
from .settings import KubevirtSettings
from .status import StatusTracker

__all__ = ["KubevirtBackend", "default_api_client", "discover_gpu_resource", "node_info"]

log = logging.getLogger(__name__)

#: (group, version, plural) of the custom resources this backend owns.
VMI = ("kubevirt.io", "v1", "virtualmachineinstances")
DATAVOLUME = ("cdi.kubevirt.io", "v1beta1", "datavolumes")
NAD = ("k8s.cni.cncf.io", "v1", "network-attachment-definitions")
_KINDS = {"VirtualMachineInstance": VMI, "DataVolume": DATAVOLUME,
          "NetworkAttachmentDefinition": NAD}

#: HTTP statuses after which the same call may succeed later.
_RETRYABLE = frozenset({408, 425, 429, 500, 502, 503, 504})
#: Longest pause between two attempts of a failing watch.
_MAX_WATCH_BACKOFF_S = 30.0


def _kube() -> Any:
    """The ``kubernetes`` package, imported on first use."""
    import kubernetes  # lazy on purpose: only this backend needs the client
    import kubernetes.watch

    return kubernetes


def _transport_errors() -> tuple[type[BaseException], ...]:
    """What a call raises when the API server cannot be reached or answers garbage."""
    import urllib3  # a dependency of the client, imported with it

    return (urllib3.exceptions.HTTPError, OSError)


def default_api_client(settings: KubevirtSettings) -> Any:
    """An ``ApiClient`` from the service account (``in_cluster``) or a kubeconfig.

    Raises:
        BackendError: (not retryable) no usable configuration.
    """
    kube = _kube()
    configuration = kube.client.Configuration()
    try:
        if settings.in_cluster:
            kube.config.load_incluster_config(client_configuration=configuration)
        else:
            kube.config.load_kube_config(config_file=settings.kubeconfig, context=settings.context,
                                         client_configuration=configuration)
    except (kube.config.ConfigException, OSError) as exc:
        raise BackendError(f"no Kubernetes configuration: {exc}", retryable=False) from exc
    return kube.client.ApiClient(configuration)


def _api_error(what: str, exc: Any) -> BackendError:
    """One ``ApiException`` as a :class:`BackendError` naming the call and the server's words."""
    status = int(exc.status or 0)
    detail = exc.reason or ""
    try:
        body = json.loads(exc.body or "")
        if isinstance(body, dict) and body.get("message"):
            detail = body["message"]
    except (TypeError, ValueError):
        pass
    return BackendError(f"{what}: HTTP {status} {detail}".rstrip(),
                        retryable=status == 0 or status in _RETRYABLE)


def discover_gpu_resource(allocatable: dict[str, str]) -> str | None:
    """The node's GPU resource: the ``nvidia.com/`` key with the most units, if any.

    Two GPU models in one node are unusual; the larger pool wins (ties by
    name, so the choice is stable) and the other is not offered.
    """
    pools = [(int(value), key) for key, value in allocatable.items()
             if key.startswith("nvidia.com/") and str(value).isdigit() and int(value) > 0]
    if not pools:
        return None
    return max(pools, key=lambda pool: (pool[0], [-ord(c) for c in pool[1]]))[1]


def _units_of(allocatable: dict[str, str], resource: str | None) -> int:
    """Whole units of an extended resource (a decimal count; anything else is 0)."""
    raw = allocatable.get(resource, "0") if resource is not None else "0"
    return int(raw) if raw.isdigit() else 0


def node_info(node: dict[str, Any], settings: KubevirtSettings) -> NodeInfo:
    """One ``Node`` object (as JSON) → the rack's view of it."""
    status = node.get("status") or {}
    allocatable = {str(k): str(v) for k, v in (status.get("allocatable") or {}).items()}
    resource = settings.gpu_resource or discover_gpu_resource(allocatable)
    gpus = _units_of(allocatable, resource)
    infiniband = _units_of(allocatable, settings.infiniband_resource) > 0
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or () if isinstance(c, dict))
    cordoned = bool((node.get("spec") or {}).get("unschedulable"))
    return NodeInfo(name=node["metadata"]["name"], gpus=min(gpus, 1024),
                    gpu_resource=resource if gpus else None, infiniband=infiniband,
                    schedulable=ready and not cordoned)


class KubevirtBackend:
    """Runs replicas as KubeVirt VMIs booting from CDI DataVolumes.

    Args:
        settings: namespace, storage, network and sizing (:class:`KubevirtSettings`).
        api_client_factory: returns a ``kubernetes.client.ApiClient``; called
            once, in a thread, on first use. Default: :func:`default_api_client`
            from ``settings``. Tests pass one pointing at an API double.
        gateway_seed: the worker's secret the isolated networks' gateway keys are
            derived from; None (or no ``wireguard_endpoint``): no isolated networks.
    """

    name = "kubevirt"

    def __init__(self, settings: KubevirtSettings,
                 api_client_factory: Callable[[], Any] | None = None, *,
                 gateway_seed: bytes | None = None) -> None:
        self._settings = settings
        self._gateway_seed = gateway_seed
        #: One VLAN choice at a time: two creates must not take the same one.
        self._vlan_lock = trio.Lock()
        self._factory = api_client_factory or (lambda: default_api_client(settings))
        self._client: Any = None
        self._connect_lock = trio.Lock()
        self._limiter = trio.CapacityLimiter(settings.api_concurrency)
        self._tracker = StatusTracker()
        self._events: trio.MemorySendChannel[VmiEvent] | None = None
        #: (job_id, replica) → the unit last created, restarted or adopted.
        self._units: dict[tuple[str, int], ReplicaUnit] = {}
        #: node name → its GPU resource, from the last capacity() call.
        self._gpu_resources: dict[str, str] = {}

    # -- plumbing ----------------------------------------------------------------
    async def _apis(self) -> tuple[Any, Any]:
        """(CustomObjectsApi, CoreV1Api), building the client on first use."""
        async with self._connect_lock:
            if self._client is None:
                self._client = await trio.to_thread.run_sync(self._factory)
        kube = _kube()
        return kube.client.CustomObjectsApi(self._client), kube.client.CoreV1Api(self._client)

    async def _call(self, what: str, fn: Callable[..., Any], *args: Any,
                    absent_ok: bool = False, exists_ok: bool = False, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` in a thread; errors become :class:`BackendError`.

        Returns None instead of raising for 404 when ``absent_ok`` and for
        409 when ``exists_ok``.
        """
        kube = _kube()
        timeout = self._settings.request_timeout_s

        def call() -> Any:
            return fn(*args, _request_timeout=timeout, **kwargs)

        try:
            return await trio.to_thread.run_sync(call, limiter=self._limiter)
        except kube.client.exceptions.ApiException as exc:
            if (exc.status == 404 and absent_ok) or (exc.status == 409 and exists_ok):
                return None
            raise _api_error(what, exc) from exc
        except _transport_errors() as exc:
            # Timeouts, refused connections, protocol errors: the cluster may come back.
            raise BackendError(f"{what}: {exc}", retryable=True) from exc

    async def _apply(self, manifest: dict[str, Any], *, replace_secret: bool = False) -> None:
        custom, core = await self._apis()
        ns = self._settings.namespace
        name = manifest["metadata"]["name"]
        kind = manifest["kind"]
        if kind == "Secret":
            if replace_secret:
                done = await self._call(f"replace Secret {name}", core.replace_namespaced_secret,
                                        name, ns, manifest, absent_ok=True)
                if done is not None:
                    return
            await self._call(f"create Secret {name}", core.create_namespaced_secret, ns,
                             manifest, exists_ok=True)
            return
        if kind == "Service":
            # Never replaced: its name and selector follow from the replica alone.
            await self._call(f"create Service {name}", core.create_namespaced_service, ns,
                             manifest, exists_ok=True)
            return
        if kind == "Pod":
            await self._call(f"create Pod {name}", core.create_namespaced_pod, ns, manifest,
                             exists_ok=True)
            return
        group, version, plural = _KINDS[kind]
        await self._call(f"create {kind} {name}", custom.create_namespaced_custom_object,
                         group, version, ns, plural, manifest, exists_ok=True)

    async def _resources_for(self, unit: ReplicaUnit) -> dict[str, str]:
        nodes = {vmi.node for vmi in unit.vmis}
        if self._settings.gpu_resource is not None:
            return dict.fromkeys(nodes, self._settings.gpu_resource)
        if not nodes <= self._gpu_resources.keys():
            await self.capacity()
        missing = sorted(nodes - self._gpu_resources.keys())
        if missing:
            raise BackendError(f"job {unit.job_id} replica {unit.replica}: node(s) "
                               f"{', '.join(missing)} not in the cluster or without GPUs",
                               retryable=False)
        return {node: self._gpu_resources[node] for node in nodes}

    async def _render(self, unit: ReplicaUnit) -> list[dict[str, Any]]:
        resources = await self._resources_for(unit)
        try:
            return render_replica(unit, self._settings, gpu_resources=resources)
        except ValueError as exc:
            raise BackendError(str(exc), retryable=False) from exc

    async def _delete_custom(self, kind: str, name: str) -> None:
        custom, _ = await self._apis()
        group, version, plural = _KINDS[kind]
        await self._call(f"delete {kind} {name}", custom.delete_namespaced_custom_object,
                         group, version, self._settings.namespace, plural, name, absent_ok=True)

    async def _wait_gone(self, name: str) -> None:
        """Poll until VMI ``name`` no longer exists (its finalizers ran)."""
        custom, _ = await self._apis()
        group, version, plural = VMI
        with trio.move_on_after(self._settings.delete_timeout_s):
            while True:
                found = await self._call(f"get VirtualMachineInstance {name}",
                                         custom.get_namespaced_custom_object, group, version,
                                         self._settings.namespace, plural, name, absent_ok=True)
                if found is None:
                    return
                await trio.sleep(self._settings.poll_interval_s)
        raise BackendError(f"VMI {name} still exists {self._settings.delete_timeout_s:g} s "
                           "after its delete", retryable=True)

    # -- the Backend protocol -------------------------------------------------------
    def adopt(self, units: Sequence[ReplicaUnit]) -> None:
        """Remember replicas that exist; the watches report their current state."""
        for unit in units:
            self._units[(unit.job_id, unit.replica)] = unit

    async def capacity(self) -> RackReport:
        """The cluster's nodes: GPUs (allocatable), InfiniBand, schedulable."""
        _, core = await self._apis()
        response = await self._call("list nodes", core.list_node, _preload_content=False)
        try:
            items = json.loads(response.data)["items"]
            nodes = tuple(node_info(item, self._settings) for item in items)
        except (ValueError, KeyError, TypeError) as exc:
            raise BackendError(f"list nodes: unexpected answer: {exc}", retryable=True) from exc
        self._gpu_resources = {n.name: n.gpu_resource for n in nodes if n.gpu_resource}
        return RackReport(nodes=nodes, overlay_network=self._settings.overlay_network is not None,
                          isolated_networks=self.offers_isolated_networks)

    @property
    def offers_isolated_networks(self) -> bool:
        return self._gateway_seed is not None and self._settings.wireguard_endpoint is not None

    async def create(self, unit: ReplicaUnit) -> None:
        """Create a multi-node replica's Service, then each VMI's Secret, DataVolume
        and VMI; existing objects are kept.

        Raises:
            BackendError: a call failed (``retryable`` says whether to try again).
        """
        manifests = await self._render(unit)
        self._units[(unit.job_id, unit.replica)] = unit
        if unit.spec.isolated_network:
            await self._isolated_network(unit)  # the VMI's network exists before it
        for manifest in manifests:
            await self._apply(manifest)

    async def restart(self, unit: ReplicaUnit) -> None:
        """Delete the VMIs, wait until gone, renew the Secrets, recreate; keep the
        disks and the Service."""
        manifests = await self._render(unit)
        self._units[(unit.job_id, unit.replica)] = unit
        for vmi in unit.vmis:
            await self._delete_custom("VirtualMachineInstance", vmi.name)
        for vmi in unit.vmis:
            await self._wait_gone(vmi.name)
        if unit.spec.isolated_network:
            await self._isolated_network(unit)  # kept; made again if it went
        for manifest in manifests:
            await self._apply(manifest, replace_secret=True)

    async def delete(self, unit: ReplicaUnit) -> None:
        """Delete each VMI, its DataVolume and its Secret, then a multi-node
        replica's Service; absent ones are fine."""
        _, core = await self._apis()
        for vmi in unit.vmis:
            await self._delete_custom("VirtualMachineInstance", vmi.name)
            await self._delete_custom("DataVolume", vmi.disk)
            await self._call(f"delete Secret {secret_name(vmi.name)}",
                             core.delete_namespaced_secret, secret_name(vmi.name),
                             self._settings.namespace, absent_ok=True)
        if any(vmi.multi_node for vmi in unit.vmis):
            # Last: a VMI still terminating keeps its name until it is gone.
            await self._call(f"delete Service {service_name(unit)}",
                             core.delete_namespaced_service, service_name(unit),
                             self._settings.namespace, absent_ok=True)
        if unit.spec.isolated_network:
            network, gateway = isolated_names(unit.job_id)
            ns = self._settings.namespace
            for what, fn in (("Pod", core.delete_namespaced_pod),
                             ("Service", core.delete_namespaced_service),
                             ("Secret", core.delete_namespaced_secret)):
                await self._call(f"delete {what} {gateway}", fn, gateway, ns, absent_ok=True)
            await self._delete_custom("NetworkAttachmentDefinition", network)
        self._units.pop((unit.job_id, unit.replica), None)

    # -- isolated networks ------------------------------------------------------------
    def _gateway_key(self, job_id: str) -> tuple[bytes, str]:
        if not self.offers_isolated_networks:
            raise BackendError(f"job {job_id} asks for an isolated network, and this worker "
                               "offers none (set kubevirt.wireguard_endpoint)", retryable=False)
        assert self._gateway_seed is not None
        return gateway_keys(self._gateway_seed, job_id)

    async def _isolated_network(self, unit: ReplicaUnit) -> None:
        """The job's own network (a VLAN of its own), its gateway's Secret, Service
        and Pod; then the gateway's address and key, as an event for the worker."""
        private, public = self._gateway_key(unit.job_id)
        vlan = await self._vlan_for(unit.job_id)
        await self._apply(render_isolated_nad(unit.job_id, vlan, self._settings))
        members = [bytes.fromhex(key) for key in unit.vmis[0].agent.authorized_keys]
        try:
            objects = render_gateway(unit.job_id, self._settings, private, members)
        except WireGuardError as exc:
            raise BackendError(f"job {unit.job_id}: {exc}", retryable=False) from exc
        for manifest in objects:
            await self._apply(manifest, replace_secret=True)
        await self._say_gateway(unit, public)

    async def _say_gateway(self, unit: ReplicaUnit, public_key: str) -> None:
        _, core = await self._apis()
        _, name = isolated_names(unit.job_id)
        response = await self._call(f"get Service {name}", core.read_namespaced_service,
                                    name, self._settings.namespace, _preload_content=False)
        try:
            view = gateway_view(self._settings, public_key, json.loads(response.data))
        except (ValueError, TypeError) as exc:
            raise BackendError(f"get Service {name}: unexpected answer: {exc}") from exc
        if view is None:
            log.info("kubevirt.gateway_waiting job=%s service=%s: no address yet",
                     unit.job_id, name)
            return
        if self._events is not None:
            first = unit.vmis[0]
            await self._events.send(VmiEvent(
                first.name, VmiPhase.UNKNOWN, f"WireGuard gateway at {view.endpoint}",
                generation=unit.generation, gateway=view))

    async def _vlan_for(self, job_id: str) -> int:
        """The job's VLAN: the one its network has, else the lowest free one."""
        custom, _ = await self._apis()
        group, version, plural = NAD
        async with self._vlan_lock:
            response = await self._call(
                "list NetworkAttachmentDefinitions", custom.list_namespaced_custom_object,
                group, version, self._settings.namespace, plural,
                label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}")
            taken: dict[int, str] = {}
            for item in (response or {}).get("items") or ():
                labels = (item.get("metadata") or {}).get("labels") or {}
                if str(labels.get(LABEL_VLAN, "")).isdigit():
                    taken[int(labels[LABEL_VLAN])] = labels.get(LABEL_JOB, "")
            for vlan, owner in taken.items():
                if owner == job_id:
                    return vlan
            first, last = self._settings.isolated_vlans
            for vlan in range(first, last + 1):
                if vlan not in taken:
                    return vlan
        raise BackendError(f"no free VLAN for job {job_id}'s isolated network: "
                           f"{first}-{last} are all taken (kubevirt.isolated_vlans)")

    async def set_gateway_peers(self, job_id: str, members: Sequence[bytes]) -> None:
        """The team's members changed: the gateway's file names the new set (the
        gateway reads it again by itself)."""
        private, _ = self._gateway_key(job_id)
        try:
            secret = gateway_secret(job_id, self._settings, private, members)
        except WireGuardError as exc:
            raise BackendError(f"job {job_id}: {exc}", retryable=False) from exc
        await self._apply(secret, replace_secret=True)

    async def run(self, events: trio.MemorySendChannel[VmiEvent], *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch VMIs and DataVolumes; send a :class:`VmiEvent` per change until cancelled."""
        self._events = events
        await self._apis()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._watch, VMI)
            nursery.start_soon(self._watch, DATAVOLUME)
            task_status.started()

    # -- watching ---------------------------------------------------------------------
    async def _watch(self, resource: tuple[str, str, str]) -> None:
        """Watch one resource forever: re-watch when the server ends it, back off on errors."""
        failures = 0
        while True:
            try:
                await trio.to_thread.run_sync(self._stream, resource, abandon_on_cancel=True)
                failures = 0
            except BackendError as exc:
                failures += 1
                delay = min(_MAX_WATCH_BACKOFF_S, 0.5 * 2 ** min(failures, 8))
                log.warning("watch of %s failed (%s); again in %.1f s", resource[2], exc, delay)
                await trio.sleep(delay)

    def _stream(self, resource: tuple[str, str, str]) -> None:
        """In a thread: one watch, each event handed to :meth:`_deliver` in trio."""
        kube = _kube()
        group, version, plural = resource
        custom = kube.client.CustomObjectsApi(self._client)
        watch = kube.watch.Watch()
        timeout = self._settings.watch_timeout_s
        try:
            stream = watch.stream(custom.list_namespaced_custom_object, group, version,
                                  self._settings.namespace, plural,
                                  label_selector=f"{LABEL_MANAGED_BY}={MANAGED_BY}",
                                  timeout_seconds=timeout, _request_timeout=timeout + 30)
            for event in stream:
                try:
                    trio.from_thread.run(self._deliver, plural, event["type"], event["raw_object"])
                except (trio.Cancelled, trio.RunFinishedError):
                    return  # run() was cancelled; this thread was abandoned
        except kube.client.exceptions.ApiException as exc:
            raise _api_error(f"watch {plural}", exc) from exc
        except (*_transport_errors(), ValueError) as exc:  # ValueError: a bad event line
            raise BackendError(f"watch {plural}: {exc}", retryable=True) from exc
        finally:
            watch.stop()

    async def _deliver(self, plural: str, kind: str, obj: dict[str, Any]) -> None:
        if not isinstance(obj, dict):
            return
        if plural == VMI[2]:
            event = self._tracker.on_vmi(kind, obj)
        else:
            event = self._tracker.on_datavolume(kind, obj)
        if event is not None and self._events is not None:
            await self._events.send(event)
