"""Errors raised by the RPC layer.

::

    P2PError                                         (p2p.errors)
    └── RpcError                                     an error answer; crosses the wire as
        │                                            {code, message, data}
        │                                            (.code: UNKNOWN_METHOD, INVALID_PARAMS,
        │                                             INTERNAL, BUSY, or a handler's own code)
        ├── RpcTimeout                               TIMEOUT: no answer within timeout_s
        ├── RpcChannelClosed (ConnectionBroken,      CHANNEL_CLOSED: the channel ended with
        │                     trio.BrokenResourceError)  the call in flight
        ├── RpcUsageError (LocalProtocolError)       we misused the API (BAD_PARAMS_TYPE, ...)
        └── RpcProtocolError (RemoteProtocolError)   the peer sent a message that breaks the
                                                     protocol (DECODE_ERROR, BAD_MESSAGE,
                                                     STREAM_CREDIT_EXCEEDED, INVALID_RESULT)

Callers branch on ``code``, never on the message text.
"""

from __future__ import annotations

from typing import Any

from p2p.errors import ConnectionBroken, LocalProtocolError, P2PError, RemoteProtocolError

__all__ = [
    "RpcChannelClosed",
    "RpcError",
    "RpcProtocolError",
    "RpcTimeout",
    "RpcUsageError",
]


class RpcError(P2PError):
    """An RPC failed with a stable ``code``; handlers raise it to answer with an error.

    Args:
        code: stable machine-readable code, e.g. ``NOT_FOUND``.
        message: human-readable text (never branch on it).
        data: optional msgpack-able detail sent along.
    """

    code = "RPC_ERROR"

    def __init__(self, code: str, message: str = "", data: Any = None) -> None:
        super().__init__(message or code, code=code)
        self.data = data

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code!r}, {self.message!r})"


class RpcTimeout(RpcError):
    """No answer arrived within the call's ``timeout_s``; the server was told to stop."""

    code = "TIMEOUT"


class RpcChannelClosed(RpcError, ConnectionBroken):
    """The RPC channel ended (closed or broken) while the call was in flight."""

    code = "CHANNEL_CLOSED"


class RpcUsageError(RpcError, LocalProtocolError):
    """The local program used the RPC API wrongly."""

    code = "RPC_USAGE_ERROR"


class RpcProtocolError(RpcError, RemoteProtocolError):
    """The peer sent an RPC message that breaks the protocol."""

    code = "RPC_PROTOCOL_ERROR"
