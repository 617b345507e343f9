"""The hole-punch signalling messages, sent on channel ``holepunch/1`` of a relayed
connection (msgpack maps, checked here: every byte from the peer is hostile).

1. The session's initiator sends ``connect``: its NAT type, the port its punch
   sockets are bound to, and the hosts it may be reached on (its public address
   as the DHT saw it, its interfaces'). It times the answer.
2. The responder answers with its own ``connect``.
3. The initiator sends ``sync`` (punch now) or ``skip`` (with why: no punch can
   work); after ``sync`` it waits half the measured round trip and both start
   their simultaneous opens at about the same moment (DCUtR's timing).
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

import msgpack
from pydantic import BaseModel, Field, TypeAdapter, ValidationError, field_validator

from ..dht._nat import NatType
from ..errors import P2PError

__all__ = ["MAX_HOSTS", "Connect", "PunchMessageError", "Skip", "Sync", "decode", "encode"]

#: Hosts one side may list (its public address, a few interfaces).
MAX_HOSTS = 8
MAX_MESSAGE_BYTES = 1024


class PunchMessageError(P2PError):
    code = "BAD_PUNCH_MESSAGE"


class Connect(BaseModel, frozen=True):
    t: Literal["connect"] = "connect"
    nat: NatType
    port: int = Field(ge=1, le=65535)
    hosts: list[str] = Field(max_length=MAX_HOSTS)
    #: The UDP port this side punches from (its NAT keeps it if consistent); 0: none.
    udp_port: int = Field(default=0, ge=0, le=65535)

    @field_validator("hosts")
    @classmethod
    def _ip_addresses(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            ipaddress.ip_address(host)  # a ValueError names the bad one
        return hosts


class Sync(BaseModel, frozen=True):
    t: Literal["sync"] = "sync"


class Skip(BaseModel, frozen=True):
    t: Literal["skip"] = "skip"
    reason: str = Field(max_length=64)


_ANY = TypeAdapter(Annotated[Connect | Sync | Skip, Field(discriminator="t")])


def encode(message: Connect | Sync | Skip) -> bytes:
    return msgpack.packb(message.model_dump(mode="json"))


def decode(data: bytes) -> Connect | Sync | Skip:
    """Raises PunchMessageError for anything that is not one of the messages."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise PunchMessageError(f"a punch message of {len(data)} bytes is too long")
    try:
        raw = msgpack.unpackb(data, raw=False, strict_map_key=True)
        return _ANY.validate_python(raw)
    except (ValueError, TypeError, ValidationError, msgpack.UnpackException) as exc:
        raise PunchMessageError(f"not a punch message: {exc}") from exc
