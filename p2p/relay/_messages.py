"""The relay's control protocol: two RPC methods on channel ``blind-relay/1``.

Carried by :mod:`p2p.rpc` over an ordinary secret-stream connection to the
relay, so the relay knows each caller's key from the Noise handshake. Field
encodings (msgpack): keys and tokens are ``bin 32``, ``timeout_s`` a float.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field, model_validator

from ..keys import KEY_BYTES
from ..rpc import Method, StreamMethod

__all__ = [
    "PAIR",
    "PROTOCOL",
    "RESERVE",
    "PairParams",
    "PairReply",
    "ReservationItem",
    "ReserveParams",
]

#: The mux channel protocol name of the control protocol.
PROTOCOL = "blind-relay/1"

#: 32 bytes, and only bytes (msgpack bin): a str is refused, not encoded.
Bytes32 = Annotated[bytes, Field(strict=True, min_length=KEY_BYTES, max_length=KEY_BYTES)]


class ReserveParams(BaseModel):
    """``reserve`` takes an empty map; the caller is known from its Noise key."""


class ReservationItem(BaseModel):
    """One item of the ``reserve`` stream.

    The first item has ``token`` and ``initiator`` nil: the relay accepted the
    reservation. Each later item names one dialer that asked to be paired with
    the reserved peer and the token the peer attaches with.
    """

    token: Bytes32 | None = None
    initiator: Bytes32 | None = None

    @model_validator(mode="after")
    def _both_or_neither(self) -> ReservationItem:
        if (self.token is None) != (self.initiator is None):
            raise ValueError("token and initiator come together")
        return self


class PairParams(BaseModel):
    """``pair``: the reserved peer to reach."""

    target: Bytes32


class PairReply(BaseModel):
    """``pair``'s answer: the caller's attach token and how long it is good for."""

    token: Bytes32
    timeout_s: float = Field(gt=0)


RESERVE = StreamMethod("reserve", params=ReserveParams, item=ReservationItem)
PAIR = Method("pair", params=PairParams, result=PairReply)
