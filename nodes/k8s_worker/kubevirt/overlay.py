"""The overlay tier's network attachment: what ``cosmicac k8s overlay`` renders.

A multi-node vLLM replica's VMIs join the overlay (seeds/architecture.txt:
"an OVS/VXLAN subcluster") as their second interface, through the Multus
NetworkAttachmentDefinition ``overlay_network`` names. This renders that
NAD from the worker's settings, for the operator to apply once:

- ``bridge`` binding: ovs-cni on the OVS bridge ``overlay_bridge`` that every
  GPU node has and that the nodes' VXLAN tunnels join (the bridge and its
  tunnels are the node's setup, as the GPU drivers are);
- ``sriov`` binding: the SR-IOV CNI on a VF of ``overlay_sriov_resource``
  (the NAD's ``k8s.v1.cni.cncf.io/resourceName`` annotation makes Multus
  claim one per attachment);

both with whereabouts IPAM over ``overlay_subnet``: one address per VMI,
cluster-wide, which KubeVirt hands the guest by DHCP on a bridge binding, and
which the agent gives Ray and NCCL (``overlay_interface``).

Pure: nothing here does I/O.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from .render import LABEL_MANAGED_BY, MANAGED_BY
from .settings import KubevirtSettings

__all__ = ["OverlayError", "overlay_nad_name", "render_overlay_nad"]

_RESOURCE_ANNOTATION = "k8s.v1.cni.cncf.io/resourceName"


class OverlayError(ValueError):
    """The settings do not say enough to render the overlay."""


def overlay_nad_name(settings: KubevirtSettings) -> tuple[str, str]:
    """``(namespace, name)`` of the overlay's NAD (``[ns/]name``; the jobs'
    namespace when none is given)."""
    if settings.overlay_network is None:
        raise OverlayError("overlay_network is not set: name the overlay's "
                           "NetworkAttachmentDefinition ([namespace/]name)")
    namespace, _, name = settings.overlay_network.rpartition("/")
    return namespace or settings.namespace, name


def render_overlay_nad(settings: KubevirtSettings) -> dict[str, Any]:
    """The overlay's NetworkAttachmentDefinition.

    Raises:
        OverlayError: no ``overlay_network``, a bad ``overlay_subnet``, or the
            ``sriov`` binding without ``overlay_sriov_resource``.
    """
    namespace, name = overlay_nad_name(settings)
    try:
        subnet = ipaddress.IPv4Network(settings.overlay_subnet)
    except ValueError as exc:
        raise OverlayError(f"overlay_subnet {settings.overlay_subnet!r}: {exc}") from None
    config: dict[str, Any] = {"cniVersion": "0.4.0", "name": name}
    metadata: dict[str, Any] = {"name": name, "namespace": namespace,
                                "labels": {LABEL_MANAGED_BY: MANAGED_BY}}
    if settings.overlay_binding == "sriov":
        if settings.overlay_sriov_resource is None:
            raise OverlayError("overlay_binding is sriov: set overlay_sriov_resource to the "
                               "VF resource (e.g. nvidia.com/cx7_vf)")
        config["type"] = "sriov"
        metadata["annotations"] = {_RESOURCE_ANNOTATION: settings.overlay_sriov_resource}
    else:
        config.update(type="ovs", bridge=settings.overlay_bridge)
    if settings.overlay_mtu is not None:
        config["mtu"] = settings.overlay_mtu
    config["ipam"] = {"type": "whereabouts", "range": str(subnet)}
    return {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": metadata,
        "spec": {"config": json.dumps(config, sort_keys=True)},
    }
