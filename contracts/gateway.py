"""An isolated job network's WireGuard gateway, as the worker reports it and members use it.

A GPU Container Job created with ``isolated_network`` runs on a network of its
own (the overlay tier, seeds/architecture.txt); its team's members reach it
through one WireGuard gateway the worker runs beside it. The worker reports
the gateway with its replica (``ReplicaReport.gateway``), wrk-ork keeps it in
its view (``ReplicaView.gateway``), and app-node hands it, with the member's
own tunnel address, to ``cosmicac jobs wireguard`` (runtime/wireguard.py
writes the member's config).
"""

from __future__ import annotations

import ipaddress

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["WG_KEY_PATTERN", "GatewayView"]

#: A WireGuard public key as ``wg`` writes it: base64 of 32 bytes.
WG_KEY_PATTERN = r"^[A-Za-z0-9+/]{42}[AEIMQUYcgkosw048]=$"


class GatewayView(BaseModel):
    """Where members dial the gateway, its key, and what lies behind it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    public_key: str = Field(pattern=WG_KEY_PATTERN)
    #: ``host:port`` members send their WireGuard packets to.
    endpoint: str = Field(min_length=3, max_length=261,
                          pattern=r"^[A-Za-z0-9.\-:\[\]]+:[0-9]{1,5}$")
    #: The tunnel's subnet: the gateway is its first host, each member has a /32.
    tunnel_subnet: str = Field(max_length=18)
    #: The job's networks members route through the gateway.
    networks: tuple[str, ...] = Field(min_length=1, max_length=8)

    @field_validator("tunnel_subnet")
    @classmethod
    def _subnet(cls, value: str) -> str:
        ipaddress.IPv4Network(value)  # ValueError: not a network
        return value

    @field_validator("networks")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for network in value:
            ipaddress.ip_network(network)
        return value
