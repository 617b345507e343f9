"""The exception tree of the P2P stack.

Every error the stack raises on purpose derives from :class:`P2PError`::

    P2PError
    ├── LocalProtocolError          we used an API wrongly (a bug in the caller)
    ├── RemoteProtocolError         the peer sent bytes that break the protocol
    │                               (.code says what; the driver closes the link)
    ├── KeyFormatError (ValueError) a key or topic written wrongly by a person
    ├── IdentityError               an identity file that cannot be read or trusted
    ├── HandshakeError              the Noise handshake failed (.code: KEY_MISMATCH, ...)
    └── ConnectionBroken            the peer or the network ended a connection
        │                           (also a trio.BrokenResourceError; .code says why)
        └── IdleTimeout             nothing arrived within the idle timeout

Errors that cross the wire carry a stable string ``code``; callers branch on the
code, never on the message. Subpackages (``p2p.mux``, ``p2p.rpc``) add their own
leaves under these branches.
"""

from __future__ import annotations

import trio

__all__ = [
    "ConnectionBroken",
    "HandshakeError",
    "IdentityError",
    "IdleTimeout",
    "KeyFormatError",
    "LocalProtocolError",
    "P2PError",
    "RemoteProtocolError",
]


class P2PError(Exception):
    """Base of every error the P2P stack raises on purpose."""

    #: Stable machine-readable code; subclasses and instances refine it.
    code: str = "P2P_ERROR"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class LocalProtocolError(P2PError):
    """The local program used an API in a way the protocol forbids."""

    code = "LOCAL_PROTOCOL_ERROR"


class RemoteProtocolError(P2PError):
    """The remote peer sent something that breaks the protocol.

    ``code`` names the violation (``DECRYPT_FAILED``, ``FRAME_TOO_LARGE``,
    ``TRUNCATED``, ``DECODE_ERROR`` ...). The driver's answer to this error is
    always to end the connection; nothing the peer sent after it is trusted.
    """

    code = "REMOTE_PROTOCOL_ERROR"


class KeyFormatError(P2PError, ValueError):
    """A public key, secret or topic was written in a form we cannot parse."""

    code = "BAD_KEY_FORMAT"


class IdentityError(P2PError):
    """An identity file is missing parts, corrupt or unreadable."""

    code = "BAD_IDENTITY"


class HandshakeError(P2PError):
    """The secret-stream handshake did not complete.

    Codes: ``KEY_MISMATCH`` (the remote proved a different key than the one the
    dialer expected; ``expected`` and ``actual`` hold both), ``BAD_PROOF``,
    ``BAD_PAYLOAD``, ``BAD_MESSAGE``, ``TIMEOUT``, ``CLOSED``.
    """

    code = "HANDSHAKE_FAILED"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        expected: bytes | None = None,
        actual: bytes | None = None,
    ) -> None:
        super().__init__(message, code=code)
        self.expected = expected
        self.actual = actual


class ConnectionBroken(P2PError, trio.BrokenResourceError):
    """The connection ended because of the peer or the network.

    Also a :class:`trio.BrokenResourceError`, so generic trio code treats it as
    one. ``code`` tells why (``REMOTE_CLOSED``, ``DECRYPT_FAILED``, ``IDLE_TIMEOUT``
    ...); the original exception, if any, is chained as ``__cause__``.
    """

    code = "CONNECTION_BROKEN"


class IdleTimeout(ConnectionBroken):
    """Nothing, not even a keep-alive, arrived within the idle timeout."""

    code = "IDLE_TIMEOUT"
