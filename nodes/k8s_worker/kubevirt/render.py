"""Pure rendering: one replica → the Kubernetes objects that run it.

Per VMI of a replica (one per node share) three objects, in the order they
are applied:

1. a core/v1 **Secret** ``<vmi>-cloudinit`` holding the cloud-init NoCloud
   user data: a ``#cloud-config`` that writes the agent's config (JSON) to
   :data:`contracts.agent_config.AGENT_CONFIG_PATH` and starts the agent (on every
   boot: see :func:`cloud_init_user_data` for restarts). A Secret and
   not inline ``userData``: inline data is capped at 2,048 bytes by KubeVirt's
   create admitter and is readable by anyone who can read the VMI, and the
   config holds the replica's report token (reference §1.6).
2. a CDI **DataVolume** ``<vmi>-root`` importing the root disk from the job's
   registry image (the disk under ``/disk`` in the image, reference §2).
3. a KubeVirt **VirtualMachineInstance** pinned to its node by hostname,
   booting from the DataVolume, claiming its GPUs by passthrough as one
   ``spec.domain.devices.gpus`` entry per GPU (virt-controller adds one unit
   of ``deviceName`` per entry to the launcher pod, reference §1.2), and, for
   a multi-node vLLM replica, the overlay network (Multus) and the
   InfiniBand HCA (``hostDevices``).

The DataVolume and the VMI are created together: with wait-for-first-consumer
storage the import starts only once the VMI exists, and KubeVirt holds the
VMI (``Provisioning``) until the import is done.

Nothing here does I/O; the backend applies what this returns and
``cosmicac k8s render`` prints it.
"""

from __future__ import annotations

import base64
from typing import Any

from nodes.k8s_worker.backend import ReplicaUnit, VmiSpec, replica_unit
from nodes.k8s_worker.cloud_init import AGENT_UNIT, cloud_init_user_data

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
    "cloud_init_user_data",
    "render_datavolume",
    "render_replica",
    "render_secret",
    "render_vmi",
    "replica_unit",
    "secret_name",
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

Manifest = dict[str, Any]


def secret_name(vmi: str) -> str:
    """The cloud-init Secret of VMI ``vmi``; replaced on restart, deleted with it."""
    return f"{vmi}-cloudinit"


def _labels(unit: ReplicaUnit, vmi: VmiSpec) -> dict[str, str]:
    return {
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_JOB: unit.job_id,
        LABEL_REPLICA: str(unit.replica),
        LABEL_NODE_RANK: str(vmi.node_rank),
        LABEL_VMI: vmi.name,
    }


def _metadata(name: str, unit: ReplicaUnit, vmi: VmiSpec,
              settings: KubevirtSettings) -> dict[str, Any]:
    return {"name": name, "namespace": settings.namespace, "labels": _labels(unit, vmi)}


def render_secret(unit: ReplicaUnit, vmi: VmiSpec, settings: KubevirtSettings) -> Manifest:
    """The Secret holding ``vmi``'s cloud-init user data (key ``userdata``).

    KubeVirt reads the key ``userdata`` or ``userData`` (pkg/cloud-init).
    """
    data = cloud_init_user_data(vmi.agent, settings.agent_executable).encode()
    metadata = _metadata(secret_name(vmi.name), unit, vmi, settings)
    metadata["labels"][LABEL_GENERATION] = str(unit.generation)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": metadata,
        "type": "Opaque",
        "data": {"userdata": base64.b64encode(data).decode("ascii")},
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
    interfaces: list[dict[str, Any]] = [{"name": _POD_NET, "masquerade": {}}]
    networks: list[dict[str, Any]] = [{"name": _POD_NET, "pod": {}}]
    devices: dict[str, Any] = {
        "disks": disks,
        "interfaces": interfaces,
        # One entry per whole GPU: KubeVirt requests one unit of deviceName per entry.
        "gpus": [{"name": f"gpu{i}", "deviceName": gpu_resource} for i in range(vmi.gpus)],
    }
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
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": metadata,
        "spec": {
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
        },
    }


def render_replica(unit: ReplicaUnit, settings: KubevirtSettings, *,
                   gpu_resources: dict[str, str]) -> list[Manifest]:
    """Every object of ``unit``: per VMI its Secret, DataVolume and VMI, in apply order.

    Args:
        gpu_resources: node name → that node's GPU resource name.

    Raises:
        ValueError: a VMI's node has no known GPU resource, or a multi-node
            VMI on a worker without overlay network and InfiniBand.
    """
    manifests: list[Manifest] = []
    for vmi in unit.vmis:
        resource = gpu_resources.get(vmi.node)
        if resource is None:
            raise ValueError(f"node {vmi.node} has no known GPU resource")
        manifests.append(render_secret(unit, vmi, settings))
        manifests.append(render_datavolume(unit, vmi, settings))
        manifests.append(render_vmi(unit, vmi, settings, gpu_resource=resource))
    return manifests
