"""Pure rendering: one replica → the Kubernetes objects that run it.

A multi-node replica first gets a core/v1 headless **Service**
``cac-<job>-r<replica>`` (:func:`render_service`): with each of its VMIs'
``spec.hostname`` (the VMI's name) and ``spec.subdomain`` (the Service's
name), the cluster DNS answers
``<vmi>.<service>.<namespace>.svc.<cluster_domain>`` with the VMI's pod
address: the name the other ranks reach Ray's head by (KubeVirt's "DNS
records" user guide; Kubernetes' "DNS for Services and Pods", pod hostname
and subdomain).

Then, per VMI of a replica (one per node share) three objects, in the order
they are applied:

1. a core/v1 **Secret** ``<vmi>-cloudinit`` holding the cloud-init NoCloud
   user data: a ``#cloud-config`` that writes the agent's config (JSON) to
   :data:`contracts.agent_config.AGENT_CONFIG_PATH` and starts the agent (on every
   boot: see :func:`cloud_init_user_data` for restarts). A Secret and
   not inline ``userData``: inline data is capped at 2,048 bytes by KubeVirt's
   create admitter and is readable by anyone who can read the VMI, and the
   config holds the replica's report token (reference §1.6). A multi-node
   VMI's config names the head by its DNS name and carries the overlay
   interface and InfiniBand HCAs for NCCL (:func:`cluster_agent_config`).
2. a CDI **DataVolume** ``<vmi>-root`` importing the root disk from the job's
   registry image (the disk under ``/disk`` in the image, reference §2).
3. a KubeVirt **VirtualMachineInstance** pinned to its node by hostname,
   booting from the DataVolume, claiming its GPUs by passthrough as one
   ``spec.domain.devices.gpus`` entry per GPU (virt-controller adds one unit
   of ``deviceName`` per entry to the launcher pod, reference §1.2), and, for
   a multi-node vLLM replica, the overlay network (Multus) and the
   InfiniBand HCA (``hostDevices``). An inference VMI whose model master
   names a hub token Secret gets it as a disk (serial ``cac-hub-token``);
   with ``model_cache_claim`` set, the shared cache PVC as a virtiofs file
   system; the user data mounts both before the agent starts
   (:func:`guest_mounts`).

The DataVolume and the VMI are created together: with wait-for-first-consumer
storage the import starts only once the VMI exists, and KubeVirt holds the
VMI (``Provisioning``) until the import is done.

Nothing here does I/O; the backend applies what this returns and
``cosmicac k8s render`` prints it.
"""

from __future__ import annotations

import base64
import ipaddress
from typing import Any

from contracts.agent_config import AgentConfig
from contracts.model import JobType
from nodes.k8s_worker.backend import (
    ReplicaUnit,
    VmiSpec,
    hub_token_secret,
    replica_unit,
    vmi_name,
)
from nodes.k8s_worker.cloud_init import (
    AGENT_UNIT,
    GUEST_HUB_TOKEN_FILE,
    GUEST_MODEL_CACHE,
    HUB_TOKEN_SERIAL,
    GuestMount,
    cloud_init_user_data,
    hub_token_mount,
    model_cache_mount,
)

from .settings import KubevirtSettings

__all__ = [
    "AGENT_UNIT",
    "LABEL_GENERATION",
    "LABEL_JOB",
    "LABEL_MANAGED_BY",
    "LABEL_NODE_RANK",
    "LABEL_REPLICA",
    "LABEL_VMI",
    "MANAGED_BY",
    "RAY_GCS_PORT",
    "cloud_init_user_data",
    "cluster_agent_config",
    "guest_mounts",
    "head_dns_name",
    "isolated_network_name",
    "render_datavolume",
    "render_replica",
    "render_secret",
    "render_service",
    "render_vmi",
    "replica_unit",
    "secret_name",
    "service_name",
]

#: Every object the worker creates carries this label; its watches select on it.
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "cosmicac"
LABEL_JOB = "cosmicac.io/job"
LABEL_REPLICA = "cosmicac.io/replica"
LABEL_NODE_RANK = "cosmicac.io/node-rank"
LABEL_GENERATION = "cosmicac.io/generation"
#: The VMI an object belongs to: how a DataVolume's events find their VMI.
LABEL_VMI = "cosmicac.io/vmi"

#: Names of the VMI's disks and volumes (local to the VMI spec).
_ROOT = "root"
_CLOUD_INIT = "cloudinit"
_POD_NET = "default"
_OVERLAY_NET = "overlay"
_ISOLATED_NET = "isolated"
_HUB_TOKEN = "hub-token"
_MODEL_CACHE = "model-cache"  # also its virtiofs tag: KubeVirt tags by the volume's name

#: Ray's GCS port on a multi-node replica's head: the port the vLLM adapter's
#: ``ray start --head --port`` uses (``DEFAULT_RAY_PORT`` of
#: agents/inference/runtimes/_plan.py, Ray's own default; a test keeps them
#: equal, as nodes may not import agents).
RAY_GCS_PORT = 6379
#: The label KubeVirt puts on every virt-launcher pod (``kubevirt.io=virt-launcher``).
_LAUNCHER_LABEL = ("kubevirt.io", "virt-launcher")

Manifest = dict[str, Any]


def secret_name(vmi: str) -> str:
    """The cloud-init Secret of VMI ``vmi``; replaced on restart, deleted with it."""
    return f"{vmi}-cloudinit"


def isolated_network_name(job_id: str) -> str:
    """The NetworkAttachmentDefinition of an isolated job's own network (gateway.py)."""
    return vmi_name(job_id, 0, 0).removesuffix("-r0-n0") + "-isolated"


def service_name(unit: ReplicaUnit) -> str:
    """The headless Service of a multi-node replica: its VMIs' names without the rank.

    ``cac-<job>-r<replica>``: a DNS-1035 label (a letter first, ≤ 63
    characters), as a Service's name must be; stable across restarts.
    """
    return vmi_name(unit.job_id, unit.replica, 0).removesuffix("-n0")


def head_dns_name(unit: ReplicaUnit, settings: KubevirtSettings) -> str:
    """The fully qualified name of the replica's rank-0 VMI, where Ray's head listens.

    ``<vmi>.<service>.<namespace>.svc.<cluster_domain>``: the pod hostname and
    subdomain record the cluster DNS serves for a pod whose subdomain is a
    headless Service selecting it.
    """
    head = next(vmi for vmi in unit.vmis if vmi.node_rank == 0)
    return f"{head.name}.{service_name(unit)}.{settings.namespace}.svc.{settings.cluster_domain}"


def _is_multi_node(unit: ReplicaUnit) -> bool:
    return any(vmi.multi_node for vmi in unit.vmis)


def _replica_labels(unit: ReplicaUnit) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_JOB: unit.job_id,
            LABEL_REPLICA: str(unit.replica)}


def _labels(unit: ReplicaUnit, vmi: VmiSpec) -> dict[str, str]:
    return {**_replica_labels(unit), LABEL_NODE_RANK: str(vmi.node_rank), LABEL_VMI: vmi.name}


def cluster_agent_config(unit: ReplicaUnit, vmi: VmiSpec,
                         settings: KubevirtSettings) -> AgentConfig:
    """``vmi``'s agent config as this cluster needs it.

    A multi-node VMI's config gets the head's DNS name (:func:`head_dns_name`;
    ``replica_unit`` leaves a bare VMI name there, which resolves nowhere on a
    cluster, while the local and qemu backends keep their own), and the
    overlay interface and InfiniBand HCAs NCCL is to use. An inference VMI's
    config names where the hub token Secret and the model cache are mounted
    (:func:`guest_mounts`). Otherwise the config is unchanged.

    Raises:
        pydantic.ValidationError: (a ``ValueError``) the result is not a valid config.
    """
    changes: dict[str, Any] = {}
    if vmi.multi_node:
        changes.update(head_address=head_dns_name(unit, settings),
                       overlay_interface=settings.overlay_interface,
                       ib_hca=settings.infiniband_hca)
    if hub_token_secret(unit.spec) is not None:
        changes["hub_token_file"] = GUEST_HUB_TOKEN_FILE
    if _uses_model_cache(unit, settings):
        changes["model_cache_dir"] = GUEST_MODEL_CACHE
    if not changes:
        return vmi.agent
    return AgentConfig.model_validate({**vmi.agent.model_dump(), **changes})


def _uses_model_cache(unit: ReplicaUnit, settings: KubevirtSettings) -> bool:
    return settings.model_cache_claim is not None and unit.spec.type is JobType.INFERENCE


def guest_mounts(unit: ReplicaUnit, settings: KubevirtSettings) -> list[GuestMount]:
    """What the guest mounts before its agent starts: the hub token Secret's
    disk (by its serial) and the model cache (virtiofs), when the job has them."""
    mounts = []
    if hub_token_secret(unit.spec) is not None:
        mounts.append(hub_token_mount())
    if _uses_model_cache(unit, settings):
        mounts.append(model_cache_mount())
    return mounts


def _metadata(name: str, unit: ReplicaUnit, vmi: VmiSpec,
              settings: KubevirtSettings) -> dict[str, Any]:
    return {"name": name, "namespace": settings.namespace, "labels": _labels(unit, vmi)}


def render_secret(unit: ReplicaUnit, vmi: VmiSpec, settings: KubevirtSettings) -> Manifest:
    """The Secret holding ``vmi``'s cloud-init user data (key ``userdata``).

    KubeVirt reads the key ``userdata`` or ``userData`` (pkg/cloud-init).
    """
    agent = cluster_agent_config(unit, vmi, settings)
    routes = []
    if unit.spec.isolated_network:
        # Members' packets come from the tunnel: back to them through the gateway.
        gateway = ipaddress.IPv4Network(settings.isolated_subnet).network_address + 1
        routes.append((settings.tunnel_subnet, str(gateway)))
    data = cloud_init_user_data(agent, settings.agent_executable,
                                guest_mounts(unit, settings), routes).encode()
    metadata = _metadata(secret_name(vmi.name), unit, vmi, settings)
    metadata["labels"][LABEL_GENERATION] = str(unit.generation)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "data": {"userdata": base64.b64encode(data).decode("ascii")},
    }


def render_service(unit: ReplicaUnit, settings: KubevirtSettings) -> Manifest:
    """The headless Service that gives a multi-node replica's VMIs DNS names.

    ``clusterIP: None``: no virtual IP, the DNS answers with the pods'
    addresses. ``publishNotReadyAddresses``: the names exist before the pods
    are Ready (a VMI without a readiness probe is Ready once it runs; the
    other ranks look the head up while it boots). The selector is the
    replica's labels, which KubeVirt copies from the VMI to its virt-launcher
    pod, plus the launcher's own label, so that no other pod of the replica
    (a CDI importer) is an endpoint. The port is Ray's GCS: only a name for
    the endpoints, a headless Service forwards nothing.
    """
    selector = {**_replica_labels(unit), _LAUNCHER_LABEL[0]: _LAUNCHER_LABEL[1]}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service_name(unit), "namespace": settings.namespace,
                     "labels": _replica_labels(unit)},
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector,
            "ports": [{"name": "ray-gcs", "port": RAY_GCS_PORT, "targetPort": RAY_GCS_PORT,
                       "protocol": "TCP"}],
        },
    }


def render_datavolume(unit: ReplicaUnit, vmi: VmiSpec, settings: KubevirtSettings) -> Manifest:
    """The DataVolume importing ``vmi``'s root disk from the job's registry image."""
    registry: dict[str, Any] = {"url": unit.spec.image, "pullMethod": settings.pull_method}
    if settings.registry_secret is not None:
        registry["secretRef"] = settings.registry_secret
    if settings.registry_cert_configmap is not None:
        registry["certConfigMap"] = settings.registry_cert_configmap
    storage: dict[str, Any] = {"resources": {"requests": {"storage": settings.disk_size}}}
    if settings.storage_class is not None:
        storage["storageClassName"] = settings.storage_class
    if settings.access_modes:
        storage["accessModes"] = list(settings.access_modes)
    if settings.volume_mode is not None:
        storage["volumeMode"] = settings.volume_mode
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": _metadata(vmi.disk, unit, vmi, settings),
        "spec": {"source": {"registry": registry}, "storage": storage},
    }


def render_vmi(unit: ReplicaUnit, vmi: VmiSpec, settings: KubevirtSettings, *,
               gpu_resource: str) -> Manifest:
    """The VirtualMachineInstance of ``vmi`` on its node.

    Args:
        gpu_resource: the device-plugin resource of the node's GPUs
            (``nvidia.com/GH100_H100_SXM5_80GB``).

    Raises:
        ValueError: a multi-node VMI but no overlay network or InfiniBand
            resource configured (placement should not have placed it here).
    """
    disks: list[dict[str, Any]] = [
        {"name": _ROOT, "disk": {"bus": "virtio"}, "bootOrder": 1},
        {"name": _CLOUD_INIT, "disk": {"bus": "virtio"}},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": _ROOT, "dataVolume": {"name": vmi.disk}},
        {"name": _CLOUD_INIT, "cloudInitNoCloud": {"secretRef": {"name": secret_name(vmi.name)}}},
    ]
    token_secret = hub_token_secret(unit.spec)
    if token_secret is not None:
        # KubeVirt presents a Secret volume as an ISO disk of one file per key;
        # the serial names it in the guest (/dev/disk/by-id/virtio-<serial>).
        disks.append({"name": _HUB_TOKEN, "serial": HUB_TOKEN_SERIAL, "disk": {"bus": "virtio"}})
        volumes.append({"name": _HUB_TOKEN, "secret": {"secretName": token_secret}})
    if _uses_model_cache(unit, settings):
        volumes.append({"name": _MODEL_CACHE,
                        "persistentVolumeClaim": {"claimName": settings.model_cache_claim}})
    interfaces: list[dict[str, Any]] = [{"name": _POD_NET, "masquerade": {}}]
    networks: list[dict[str, Any]] = [{"name": _POD_NET, "pod": {}}]
    devices: dict[str, Any] = {
        "disks": disks,
        "interfaces": interfaces,
        # One entry per whole GPU: KubeVirt requests one unit of deviceName per entry.
        "gpus": [{"name": f"gpu{i}", "deviceName": gpu_resource} for i in range(vmi.gpus)],
    }
    if _uses_model_cache(unit, settings):
        devices["filesystems"] = [{"name": _MODEL_CACHE, "virtiofs": {}}]
    if unit.spec.isolated_network:
        interfaces.append({"name": _ISOLATED_NET, "bridge": {}})
        networks.append({"name": _ISOLATED_NET, "multus": {
            "networkName": f"{settings.namespace}/{isolated_network_name(unit.job_id)}"}})
    if vmi.multi_node:
        if settings.overlay_network is None or settings.infiniband_resource is None:
            raise ValueError(f"VMI {vmi.name} is part of a multi-node replica, but the worker "
                             "has no overlay_network and infiniband_resource configured")
        interfaces.append({"name": _OVERLAY_NET, settings.overlay_binding: {}})
        networks.append({"name": _OVERLAY_NET,
                         "multus": {"networkName": settings.overlay_network}})
        devices["hostDevices"] = [{"name": f"ib{i}", "deviceName": settings.infiniband_resource}
                                  for i in range(settings.infiniband_devices)]
    metadata = _metadata(vmi.name, unit, vmi, settings)
    metadata["labels"][LABEL_GENERATION] = str(unit.generation)
    spec: dict[str, Any] = {
        "nodeSelector": {"kubernetes.io/hostname": vmi.node},
        "hostname": vmi.name,
        "evictionStrategy": settings.eviction_strategy,
        "terminationGracePeriodSeconds": settings.termination_grace_period_s,
        "domain": {
            "cpu": {"cores": settings.vmi_cpu_cores(vmi.gpus)},
            "memory": {"guest": settings.vmi_memory(vmi.gpus)},
            "devices": devices,
        },
        "networks": networks,
        "volumes": volumes,
    }
    if vmi.multi_node:
        # hostname + subdomain + the headless Service = a DNS name for this VMI.
        spec["subdomain"] = service_name(unit)
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": metadata,
        "spec": spec,
    }


def render_replica(unit: ReplicaUnit, settings: KubevirtSettings, *,
                   gpu_resources: dict[str, str]) -> list[Manifest]:
    """Every object of ``unit`` in apply order: a multi-node replica's Service,
    then per VMI its Secret, DataVolume and VMI.

    The Service comes first so that the VMIs' names resolve from their first boot.

    Args:
        gpu_resources: node name → that node's GPU resource name.

    Raises:
        ValueError: a VMI's node has no known GPU resource, or a multi-node
            VMI on a worker without overlay network and InfiniBand.
    """
    manifests: list[Manifest] = []
    if _is_multi_node(unit):
        manifests.append(render_service(unit, settings))
    for vmi in unit.vmis:
        resource = gpu_resources.get(vmi.node)
        if resource is None:
            raise ValueError(f"node {vmi.node} has no known GPU resource")
        manifests.append(render_secret(unit, vmi, settings))
        manifests.append(render_datavolume(unit, vmi, settings))
        manifests.append(render_vmi(unit, vmi, settings, gpu_resource=resource))
    return manifests
