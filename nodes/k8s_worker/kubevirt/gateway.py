"""An isolated job network and its WireGuard gateway: the objects, rendered.

A GPU Container Job created with ``isolated_network`` gets, beside its VMI:

1. a NetworkAttachmentDefinition ``cac-<job>-isolated``: ovs-cni on the
   overlay's bridge with a VLAN of the job's own (the network is the job's
   alone: other jobs' VLANs do not reach it), whereabouts addresses from
   ``isolated_subnet`` (its first address left to the gateway); the VMI joins
   it as its second interface;
2. a Secret ``cac-<job>-wireguard``: the gateway's ``wg setconf`` file (its key,
   port, and the team's members as peers, runtime/wireguard.py), replaced when
   the team's shell keys change; the gateway reads it again by itself;
3. a Pod ``cac-<job>-wireguard``: the gateway, on the pod network and on the
   job's network (``net1``), running :func:`runtime.wireguard.gateway_script`;
4. a Service ``cac-<job>-wireguard``: its UDP port, as a NodePort (members dial
   ``wireguard_endpoint:<node port>``) or a LoadBalancer.

The gateway's key is derived from the worker's own secret and the job id, so
nothing of it is stored and a restarted worker finds the same one.

Pure: nothing here does I/O.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
from collections.abc import Sequence
from typing import Any

import nacl.bindings

from contracts.gateway import GatewayView
from runtime.wireguard import (
    DEFAULT_PORT,
    GatewayPeer,
    assign_addresses,
    gateway_address,
    gateway_config,
    gateway_script,
    wg_key,
    wg_public_key_of,
)

from .render import LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY, isolated_network_name
from .settings import KubevirtSettings

__all__ = [
    "GATEWAY_INTERFACE",
    "LABEL_VLAN",
    "gateway_keys",
    "gateway_view",
    "isolated_names",
    "render_gateway",
    "render_isolated_nad",
]

#: The VLAN an isolated job's network took (on its NAD): how the backend finds
#: the ones in use.
LABEL_VLAN = "cosmicac.io/isolated-vlan"
#: The gateway's tunnel interface and its leg on the job's network (Multus names
#: the first extra network ``net1``).
GATEWAY_INTERFACE = "wg0"
_ISOLATED_INTERFACE = "net1"
_CONFIG_DIR = "/etc/cosmicac-wireguard"
_CONFIG_KEY = "wg0.conf"
_COMPONENT = "app.kubernetes.io/component"


def isolated_names(job_id: str) -> tuple[str, str]:
    """``(network, gateway)``: the NAD's name, and the gateway's Secret, Pod and
    Service name."""
    network = isolated_network_name(job_id)
    return network, network.removesuffix("-isolated") + "-wireguard"


def gateway_keys(seed: bytes, job_id: str) -> tuple[bytes, str]:
    """The gateway's X25519 private key (derived from the worker's ``seed`` and the
    job) and its public key as WireGuard writes it."""
    private = bytearray(hashlib.blake2b(job_id.encode(), key=seed[:64], digest_size=32,
                                        person=b"cac-wg-gateway").digest())
    private[0] &= 248  # X25519's clamping, as wg genkey does
    private[31] = (private[31] & 127) | 64
    public = nacl.bindings.crypto_scalarmult_base(bytes(private))
    return bytes(private), wg_key(public)


def _labels(job_id: str, component: str) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_JOB: job_id, _COMPONENT: component}


def _gateway_isolated_address(settings: KubevirtSettings) -> str:
    network = ipaddress.IPv4Network(settings.isolated_subnet)
    return f"{network.network_address + 1}/{network.prefixlen}"


def render_isolated_nad(job_id: str, vlan: int, settings: KubevirtSettings) -> dict[str, Any]:
    """The job's own network: a VLAN on the overlay's bridge."""
    name, _ = isolated_names(job_id)
    network = ipaddress.IPv4Network(settings.isolated_subnet)
    config = {
        "cniVersion": "0.4.0", "name": name, "type": "ovs", "bridge": settings.overlay_bridge,
        "vlan": vlan,
        # The same range for every job (each on its own VLAN): whereabouts keeps the
        # pools apart by network_name; the first address is the gateway's.
        "ipam": {"type": "whereabouts", "range": str(network), "network_name": name,
                 "exclude": [f"{network.network_address + 1}/32"]},
    }
    return {
        "apiVersion": "k8s.cni.cncf.io/v1",
        "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name, "namespace": settings.namespace,
                     "labels": {**_labels(job_id, "isolated-network"), LABEL_VLAN: str(vlan)}},
        "spec": {"config": json.dumps(config, sort_keys=True)},
    }


def gateway_secret(job_id: str, settings: KubevirtSettings, private_key: bytes,
                   members: Sequence[bytes]) -> dict[str, Any]:
    """The Secret holding the gateway's ``wg setconf`` file: each member at their
    tunnel address (the CLI keys of the team, as the agents' shell keys)."""
    _, name = isolated_names(job_id)
    addresses = assign_addresses(settings.tunnel_subnet, members)
    peers = [GatewayPeer(wg_public_key_of(key), address) for key, address in addresses.items()]
    config = gateway_config(private_key, DEFAULT_PORT, peers)
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
        "metadata": {"name": name, "namespace": settings.namespace,
                     "labels": _labels(job_id, "wireguard-gateway")},
        "data": {_CONFIG_KEY: base64.b64encode(config.encode()).decode("ascii")},
    }


def render_gateway(job_id: str, settings: KubevirtSettings, private_key: bytes,
                   members: Sequence[bytes]) -> list[dict[str, Any]]:
    """The gateway's Secret, Service and Pod, in apply order."""
    network, name = isolated_names(job_id)
    labels = _labels(job_id, "wireguard-gateway")
    tunnel = ipaddress.IPv4Network(settings.tunnel_subnet)
    command = gateway_script(
        GATEWAY_INTERFACE, f"{_CONFIG_DIR}/{_CONFIG_KEY}",
        f"{gateway_address(settings.tunnel_subnet)}/{tunnel.prefixlen}",
        also=[(_ISOLATED_INTERFACE, _gateway_isolated_address(settings))])
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": settings.namespace, "labels": labels},
        "spec": {"type": settings.wireguard_service_type,
                 "selector": {LABEL_JOB: job_id, _COMPONENT: "wireguard-gateway"},
                 "ports": [{"name": "wireguard", "protocol": "UDP", "port": DEFAULT_PORT,
                            "targetPort": DEFAULT_PORT}]},
    }
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": settings.namespace, "labels": labels,
            "annotations": {"k8s.v1.cni.cncf.io/networks": json.dumps(
                [{"name": network, "namespace": settings.namespace,
                  "interface": _ISOLATED_INTERFACE}])},
        },
        "spec": {
            "restartPolicy": "Always",
            "automountServiceAccountToken": False,
            "containers": [{
                "name": "wireguard",
                "image": settings.wireguard_image,
                "command": command,
                "ports": [{"containerPort": DEFAULT_PORT, "protocol": "UDP"}],
                # Its own interfaces, routes and forwarding; /dev/net/tun for the
                # userspace WireGuard where the node kernel has none.
                "securityContext": {"capabilities": {"add": ["NET_ADMIN"], "drop": ["ALL"]}},
                "volumeMounts": [{"name": "config", "mountPath": _CONFIG_DIR, "readOnly": True},
                                 {"name": "tun", "mountPath": "/dev/net/tun"}],
                "resources": {"requests": {"cpu": "50m", "memory": "32Mi"},
                              "limits": {"memory": "128Mi"}},
            }],
            "volumes": [
                {"name": "config", "secret": {"secretName": name, "defaultMode": 0o400}},
                {"name": "tun", "hostPath": {"path": "/dev/net/tun", "type": "CharDevice"}},
            ],
        },
    }
    return [gateway_secret(job_id, settings, private_key, members), service, pod]


def gateway_view(settings: KubevirtSettings, public_key: str,
                 service: dict[str, Any]) -> GatewayView | None:
    """What members need, from the gateway's Service as the API server returned it;
    None while it has no address yet (a LoadBalancer being provisioned)."""
    spec = service.get("spec") or {}
    if settings.wireguard_service_type == "NodePort":
        ports = [p.get("nodePort") for p in spec.get("ports") or () if p.get("nodePort")]
        if not ports or settings.wireguard_endpoint is None:
            return None
        endpoint = f"{settings.wireguard_endpoint}:{ports[0]}"
    else:
        ingress = ((service.get("status") or {}).get("loadBalancer") or {}).get("ingress") or ()
        host = next((i.get("ip") or i.get("hostname") for i in ingress
                     if i.get("ip") or i.get("hostname")), None)
        if host is None:
            return None
        endpoint = f"{host}:{DEFAULT_PORT}"
    return GatewayView(public_key=public_key, endpoint=endpoint,
                       tunnel_subnet=settings.tunnel_subnet,
                       networks=(settings.isolated_subnet,))
