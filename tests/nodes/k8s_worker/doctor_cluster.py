"""A cluster ready for the kubevirt backend, in the API double: what ``cosmicac doctor`` passes.

The nodes are those of ``test_kubevirt_backend.py``'s ``double`` fixture (two
H100 nodes with an InfiniBand HCA each); :func:`ready_cluster` adds what the
operator installs: the KubeVirt CR (deployed, GPUs and the HCA permitted, the
``HostDevices`` gate on), the CDI CR, a default storage class and the
overlay's NetworkAttachmentDefinition. Tests take one away at a time.
"""

from __future__ import annotations

import json
import socket
from typing import Any

from .kube_double import KubeDouble
from .test_kubevirt_backend import NS, SETTINGS
from .units import H100

__all__ = [
    "CDI",
    "IB",
    "KUBEVIRT",
    "NAD",
    "SETTINGS",
    "STORAGE",
    "closed_port",
    "ready_cluster",
    "serve",
    "settings_file",
]

KUBEVIRT = ("kubevirt.io/v1", "kubevirts")
CDI = ("cdi.kubevirt.io/v1beta1", "cdis")
STORAGE = ("storage.k8s.io/v1", "storageclasses")
NAD = ("k8s.cni.cncf.io/v1", "network-attachment-definitions")
IB = "nvidia.com/mlx5_ib"


def ready_cluster() -> dict[str, tuple[tuple[str, str], dict[str, Any]]]:
    """name → ((api, plural), object) of everything a ready cluster has besides nodes."""
    return {
        "kubevirt": (KUBEVIRT, {
            "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
            "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": {"configuration": {
                "developerConfiguration": {"featureGates": ["HostDevices"]},
                "permittedHostDevices": {"pciHostDevices": [
                    {"pciVendorSelector": "10DE:2330", "resourceName": H100,
                     "externalResourceProvider": True},
                    {"pciVendorSelector": "15B3:101B", "resourceName": IB}]}}},
            "status": {"phase": "Deployed", "observedKubeVirtVersion": "v1.3.1"}}),
        "cdi": (CDI, {
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI", "metadata": {"name": "cdi"},
            "status": {"phase": "Deployed", "observedVersion": "v1.60.3"}}),
        "storage": (STORAGE, {
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": "ceph-rbd", "annotations": {
                "storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "rbd.csi.ceph.com", "volumeBindingMode": "WaitForFirstConsumer"}),
        "nad": (NAD, {
            "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": "vllm-overlay", "namespace": NS},
            "spec": {"config": json.dumps({"cniVersion": "0.4.0", "type": "ovs-cni",
                                           "bridge": "br-overlay"})}}),
    }


def serve(double: KubeDouble, objects: dict[str, tuple[tuple[str, str], dict[str, Any]]]
          ) -> None:
    """Store ``objects`` (as :func:`ready_cluster` returns them) in ``double``."""
    for (api, plural), obj in objects.values():
        double.put(api, plural, obj)


def settings_file(path: Any) -> Any:
    """The settings the backend's tests use, as a JSON file for ``--settings``."""
    path.write_text(json.dumps(SETTINGS.model_dump(
        include={"namespace", "overlay_network", "infiniband_resource"})))
    return path


def closed_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on (bound, then closed): connections
    there are refused, as to an API server that is down."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
