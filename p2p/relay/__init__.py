"""The blind relay's protocol and client side (DESIGN.md §3.6).

A firewalled peer keeps a reservation with a relay; a dialer asks the relay to
pair them; both attach raw TCP connections and the relay forwards bytes
blindly while the end-to-end secret-stream handshake runs through it. The
relay server itself lives in the top-level ``relay`` package.

See ``README.md`` in this folder for the wire format.
"""

from p2p.lazy import lazy_names

from ._attach import (
    ATTACH_MAGIC,
    ATTACH_REQUEST_BYTES,
    AttachRequest,
    AttachStatus,
    FirstBytes,
    Role,
    classify,
    decode_attach_request,
    encode_attach_request,
    status_for,
)
from ._errors import (
    RefusalCode,
    RelayError,
    RelayKeyMismatch,
    RelayProtocolError,
    RelayRefused,
    RelayTimeout,
    RelayUnavailable,
)

#: The client side and the RPC messages (pydantic models), imported on first use
#: (PEP 562): a swarm that never meets a relay (``cosmicac shell --address``)
#: does not load the RPC layer and pydantic.
_LAZY = {
    **dict.fromkeys(("DEFAULT_ATTACH_TIMEOUT_S", "Incoming", "PairTicket", "accept_via_relay",
                     "attach", "attach_stream", "dial_via_relay", "keep_reservation",
                     "request_pair"), "._client"),
    **dict.fromkeys(("PAIR", "PROTOCOL", "RESERVE", "PairParams", "PairReply",
                     "ReservationItem", "ReserveParams"), "._messages"),
}


__getattr__ = lazy_names(__name__, _LAZY, globals())


__all__ = [
    "ATTACH_MAGIC",
    "ATTACH_REQUEST_BYTES",
    "DEFAULT_ATTACH_TIMEOUT_S",
    "PAIR",
    "PROTOCOL",
    "RESERVE",
    "AttachRequest",
    "AttachStatus",
    "FirstBytes",
    "Incoming",
    "PairParams",
    "PairReply",
    "PairTicket",
    "RefusalCode",
    "RelayError",
    "RelayKeyMismatch",
    "RelayProtocolError",
    "RelayRefused",
    "RelayTimeout",
    "RelayUnavailable",
    "ReservationItem",
    "ReserveParams",
    "Role",
    "accept_via_relay",
    "attach",
    "attach_stream",
    "classify",
    "decode_attach_request",
    "dial_via_relay",
    "encode_attach_request",
    "keep_reservation",
    "request_pair",
    "status_for",
]
