"""The ``kubevirt`` backend's settings: where, with what storage, what network.

The worker's daemon settings embed this model as ``kubevirt:`` (nested env
keys with ``__``, e.g. ``K8S_WORKER__kubevirt__namespace``). Every field
that shapes a rendered object is here, so ``cosmicac k8s render`` and the
running worker render the same manifests from the same file.

Defaults follow reference/kubevirt-cdi-vllm.md: GPUs as
``spec.domain.devices.gpus`` (no feature gate), the InfiniBand HCA as a
``hostDevices`` entry (needs the cluster's ``HostDevices`` gate), storage from
the StorageProfile unless a class is named.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from contracts.agent_config import IB_HCA_MAX_CHARS, IB_HCA_PATTERN, IFNAME_PATTERN

__all__ = ["QUANTITY_PATTERN", "KubevirtSettings"]

#: A Kubernetes resource quantity as written by people ("100Gi", "500G", "4").
QUANTITY_PATTERN = re.compile(r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
#: ``<domain>/<name>`` of an extended resource (``nvidia.com/GH100_H100_SXM5_80GB``).
_RESOURCE = r"^[A-Za-z0-9][A-Za-z0-9.\-]*/[A-Za-z0-9][A-Za-z0-9_.\-]*$"
#: A NetworkAttachmentDefinition reference: ``name`` or ``namespace/name``.
_NAD = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
#: A DNS subdomain (the cluster's DNS domain, ``cluster.local``).
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class KubevirtSettings(BaseModel):
    """How the ``kubevirt`` backend talks to its cluster and what it renders."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # -- the API server ---------------------------------------------------
    #: Namespace of every object the worker creates (VMI, DataVolume, Secret).
    namespace: str = Field(default="cosmicac", max_length=63, pattern=_DNS_LABEL)
    #: Use the pod's service account (the worker runs inside the cluster).
    in_cluster: bool = False
    #: A kubeconfig file; None means ``$KUBECONFIG`` or ``~/.kube/config``.
    kubeconfig: str | None = None
    #: The kubeconfig context; None means its current context.
    context: str | None = None
    #: Kubernetes calls in flight at once (each holds a worker thread).
    api_concurrency: int = Field(default=4, ge=1, le=64)
    #: Client-side timeout of one non-watch call.
    request_timeout_s: float = Field(default=30.0, gt=0, le=600)
    #: Server-side end of one watch; the backend then watches again.
    watch_timeout_s: int = Field(default=300, ge=1, le=3600)
    #: How long a restart waits for the old VMI to be gone before failing.
    delete_timeout_s: float = Field(default=600.0, gt=0, le=7200)
    #: How often a restart asks whether the old VMI is gone yet.
    poll_interval_s: float = Field(default=2.0, gt=0, le=60)

    # -- GPUs ---------------------------------------------------------------
    #: The device-plugin resource GPUs are claimed by; None discovers it from
    #: the nodes' allocatable (keys under ``nvidia.com/`` that are not "0").
    gpu_resource: str | None = Field(default=None, pattern=_RESOURCE)

    # -- root disk (CDI DataVolume) ---------------------------------------------
    #: StorageClass of the root disk; None takes the cluster's default.
    storage_class: str | None = Field(default=None, max_length=253)
    #: Root disk size (a Kubernetes quantity).
    disk_size: str = "100Gi"
    access_modes: tuple[Literal["ReadWriteOnce", "ReadWriteMany", "ReadOnlyMany",
                                "ReadWriteOncePod"], ...] = ()
    volume_mode: Literal["Filesystem", "Block"] | None = None
    #: ``pod`` (CDI's importer pod) or ``node`` (the node's container runtime
    #: and its pull secrets).
    pull_method: Literal["pod", "node"] = "pod"
    #: Secret in ``namespace`` holding registry credentials (``accessKeyId``/
    #: ``secretKey``), for private registries.
    registry_secret: str | None = Field(default=None, max_length=253)
    #: ConfigMap in ``namespace`` with the registry's CA certificates.
    registry_cert_configmap: str | None = Field(default=None, max_length=253)

    # -- inference jobs' model weights ------------------------------------------
    #: A PersistentVolumeClaim in ``namespace`` (ReadWriteMany: every inference
    #: VMI mounts it at once, through virtiofs) where model servers keep the
    #: weights they download (``HF_HOME``), so that a restart or a new replica
    #: does not download them again; None: each VMI downloads to its own disk.
    model_cache_claim: str | None = Field(default=None, max_length=253,
                                          pattern=r"^[a-z0-9]([a-z0-9\-.]*[a-z0-9])?$")

    # -- size of a VMI -------------------------------------------------------
    #: vCPUs per GPU held (a VMI of 8 GPUs gets 8 times this), unless ``cpu_cores``.
    cpu_cores_per_gpu: int = Field(default=8, ge=1, le=256)
    #: Guest memory per GPU held, in GiB, unless ``memory_gib``.
    memory_gib_per_gpu: int = Field(default=64, ge=1, le=4096)
    #: Fixed vCPUs per VMI whatever its GPUs.
    cpu_cores: int | None = Field(default=None, ge=1, le=1024)
    #: Fixed guest memory per VMI, in GiB.
    memory_gib: int | None = Field(default=None, ge=1, le=65536)
    #: A VMI with PCI host devices cannot live-migrate (its LiveMigratable
    #: condition says ``HostDeviceNotLiveMigratable``); ``None`` lets a drain
    #: stop it rather than block on a migration that cannot happen.
    eviction_strategy: Literal["None", "LiveMigrate", "LiveMigrateIfPossible",
                               "External"] = "None"
    termination_grace_period_s: int = Field(default=30, ge=0, le=3600)

    # -- multi-node vLLM replicas ------------------------------------------------
    #: The Multus NetworkAttachmentDefinition (``[ns/]name``) of the overlay
    #: multi-node replicas join; None: multi-node replicas cannot be placed.
    overlay_network: str | None = Field(default=None, pattern=_NAD)
    #: How the overlay attaches: ``bridge`` (OVS/VXLAN, ovs-cni) or ``sriov``
    #: (an SR-IOV VF network).
    overlay_binding: Literal["bridge", "sriov"] = "bridge"
    #: What ``cosmicac k8s overlay`` renders the overlay's NAD with: the OVS
    #: bridge on every GPU node that the nodes' VXLAN tunnels join (``bridge``
    #: binding), or the SR-IOV VF resource (``sriov``); the overlay's address
    #: range (whereabouts IPAM, cluster-wide); its MTU (None: the bridge's).
    overlay_bridge: str = Field(default="br-overlay", pattern=IFNAME_PATTERN)
    overlay_sriov_resource: str | None = Field(default=None, pattern=_RESOURCE)
    overlay_subnet: str = Field(default="10.90.0.0/16", pattern=r"^[0-9.]+/[0-9]{1,2}$")
    overlay_mtu: int | None = Field(default=None, ge=1280, le=9216)
    #: The InfiniBand HCA resource passed through as a host device to each VMI
    #: of a multi-node replica (needs the ``HostDevices`` feature gate).
    infiniband_resource: str | None = Field(default=None, pattern=_RESOURCE)
    #: HCAs per VMI of a multi-node replica.
    infiniband_devices: int = Field(default=1, ge=1, le=16)
    #: The overlay's network interface as the guest names it, handed to the
    #: agent for ``NCCL_SOCKET_IFNAME`` (and Gloo's, TensorPipe's), so that
    #: NCCL's bootstrap does not take the pod network. ``eth1``: the second
    #: NIC of a guest booted with ``net.ifnames=0`` (KubeVirt lists the pod
    #: network first); an image with predictable names calls it ``enp…s0``.
    overlay_interface: str = Field(default="eth1", pattern=IFNAME_PATTERN)
    #: The HCAs NCCL uses (``NCCL_IB_HCA``: a comma-separated list of
    #: ``name[:port]``, a prefix unless led by ``=``; ``^`` excludes).
    #: ``mlx5``: every ConnectX HCA, NCCL's usual choice on such nodes.
    infiniband_hca: str = Field(default="mlx5", max_length=IB_HCA_MAX_CHARS,
                                pattern=IB_HCA_PATTERN)
    #: The cluster's DNS domain (the kubelet's ``clusterDomain``): the head of a
    #: multi-node replica is ``<vmi>.<service>.<namespace>.svc.<cluster_domain>``.
    cluster_domain: str = Field(default="cluster.local", max_length=200,
                                pattern=_DNS_SUBDOMAIN)

    # -- isolated job networks (the overlay tier's WireGuard gateway) -----------------
    #: The address members' WireGuard reaches the gateways at: a node's public
    #: address (``NodePort`` Services) or a load balancer's. None: this worker
    #: offers no isolated networks (wrk-ork places none here).
    wireguard_endpoint: str | None = Field(default=None, max_length=253,
                                           pattern=r"^[A-Za-z0-9.\-:]+$")
    #: How the gateway's UDP port is exposed.
    wireguard_service_type: Literal["NodePort", "LoadBalancer"] = "NodePort"
    #: The gateway pod's image: ``sh``, ``ip``, ``wg`` and ``wireguard-go`` (or a
    #: node kernel with WireGuard), e.g. built FROM debian with wireguard-tools
    #: and wireguard-go.
    wireguard_image: str = Field(default="registry.local/cosmicac/wireguard-gateway:1",
                                 max_length=512)
    #: Each isolated job's network (the same range for every job: each is a VLAN
    #: of its own on ``overlay_bridge``); its first address is the gateway's.
    isolated_subnet: str = Field(default="10.88.0.0/24", pattern=r"^[0-9.]+/[0-9]{1,2}$")
    #: The tunnel's subnet: the gateway is its first host, members get a /32 each.
    tunnel_subnet: str = Field(default="10.250.0.0/24", pattern=r"^[0-9.]+/[0-9]{1,2}$")
    #: The VLAN ids isolated jobs take on ``overlay_bridge`` (first, last).
    isolated_vlans: tuple[int, int] = (2000, 2999)

    # -- the agent ---------------------------------------------------------------
    #: The ``cosmicac`` executable inside the image.
    agent_executable: str = Field(default="cosmicac", min_length=1, max_length=200,
                                  pattern=r"^[A-Za-z0-9_./\-]+$")

    @field_validator("isolated_vlans")
    @classmethod
    def _vlans(cls, value: tuple[int, int]) -> tuple[int, int]:
        first, last = value
        if not 1 <= first <= last <= 4094:
            raise ValueError(f"{value} is not a range of VLAN ids (1-4094, first <= last)")
        return value

    @field_validator("disk_size")
    @classmethod
    def _quantity(cls, value: str) -> str:
        if not QUANTITY_PATTERN.match(value):
            raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 100Gi)")
        return value

    def vmi_cpu_cores(self, gpus: int) -> int:
        """vCPUs of a VMI holding ``gpus`` GPUs."""
        if self.cpu_cores is not None:
            return self.cpu_cores
        return max(1, gpus) * self.cpu_cores_per_gpu

    def vmi_memory(self, gpus: int) -> str:
        """Guest memory of a VMI holding ``gpus`` GPUs, as a quantity."""
        gib = self.memory_gib
        if gib is None:
            gib = max(1, gpus) * self.memory_gib_per_gpu
        return f"{gib}Gi"
