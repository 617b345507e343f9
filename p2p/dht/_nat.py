"""What kind of NAT a node sits behind, from where DHT nodes saw it (no I/O).

Every DHT answer says where its sender saw the request come from. One socket
asking several nodes at other addresses therefore learns how its NAT maps it:

========== ======================================================================
OPEN       every node saw our own interface address and port: no NAT between
CONSISTENT every node saw one public address and port (an endpoint-independent
           mapping, as Linux MASQUERADE and most home routers do): a peer that
           learns it can punch to it
RANDOM     nodes saw different ports (or addresses) for the same socket (an
           endpoint-dependent mapping, ``--random-fully``, as flannel and
           kube-router masquerade pods): only a CONSISTENT peer can punch to it,
           by spraying ports; two RANDOM peers stay on the relay
UNKNOWN    fewer than two nodes elsewhere than loopback answered
========== ======================================================================

This is hyperdht's classification (shared/reference/nat-traversal.md §1.2),
from the observations the node already collects for its own address
(``_node.py``'s votes), so it costs no packet.
"""

from __future__ import annotations

import enum
import ipaddress
from collections.abc import Iterable, Mapping

__all__ = ["NatType", "classify_nat"]

Address = tuple[str, int]


class NatType(enum.StrEnum):
    UNKNOWN = "unknown"
    OPEN = "open"
    CONSISTENT = "consistent"
    RANDOM = "random"


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def classify_nat(observations: Mapping[Address, Address], *, local_port: int,
                 local_hosts: Iterable[str]) -> NatType:
    """The NAT type ``observations`` (responder → where it saw us) show for a socket
    bound to ``local_port`` on a host with ``local_hosts``."""
    seen = [observed for responder, observed in observations.items()
            if not _loopback(responder[0])]
    if len({responder[0] for responder in observations if not _loopback(responder[0])}) < 2:
        return NatType.UNKNOWN
    if len(set(seen)) > 1:
        return NatType.RANDOM
    host, port = seen[0]
    if port == local_port and host in set(local_hosts):
        return NatType.OPEN
    return NatType.CONSISTENT
