"""Errors raised by the DHT.

::

    P2PError                                        (p2p.errors)
    └── DhtError                                    base of everything p2p.dht raises
        ├── DhtUsageError (LocalProtocolError)      we misused the API
        │   │                                       (.code: BAD_TOPIC, BAD_RECORD_FIELDS,
        │   │                                        BAD_ADDRESS, BAD_SECRET, ...)
        │   └── DhtMessageTooLarge                  a message would not fit one datagram
        └── DhtProtocolError (RemoteProtocolError)  a remote sent something that breaks
            │                                       the protocol
            ├── DhtDecodeError                      bytes or a msgpack value that does not
            │                                       decode (.code: DECODE_ERROR, BAD_RECORD)
            └── RecordRejected                      a well-formed peer record that must not
                                                    be believed (.code: BAD_SIGNATURE,
                                                    EXPIRED, EXPIRES_TOO_FAR, BAD_RECORD)

Codes are stable strings that may cross the wire; callers branch on ``code``,
never on the message text. A node that meets a :class:`DhtProtocolError` drops
the datagram or record, counts it and keeps serving (STYLE.md, "Errors").
"""

from __future__ import annotations

from p2p.errors import LocalProtocolError, P2PError, RemoteProtocolError

__all__ = [
    "DhtDecodeError",
    "DhtError",
    "DhtProtocolError",
    "DhtUsageError",
    "RecordRejected",
]


class DhtError(P2PError):
    """Base of every error the DHT raises on purpose."""

    code = "DHT_ERROR"


class DhtUsageError(DhtError, LocalProtocolError):
    """The local program called the DHT API with arguments it cannot accept."""

    code = "DHT_USAGE_ERROR"


class DhtProtocolError(DhtError, RemoteProtocolError):
    """A remote node or announcer sent something that breaks the DHT protocol."""

    code = "DHT_PROTOCOL_ERROR"


class DhtDecodeError(DhtProtocolError):
    """A datagram, message or record could not be decoded (malformed input)."""

    code = "DECODE_ERROR"


class RecordRejected(DhtProtocolError):
    """A decoded peer record failed verification.

    ``code`` is ``BAD_SIGNATURE``, ``EXPIRED``, ``EXPIRES_TOO_FAR`` or ``BAD_RECORD``.
    """

    code = "RECORD_REJECTED"


class DhtMessageTooLarge(DhtUsageError):
    """A DHT message would not fit in one datagram (``MAX_DATAGRAM_BYTES``).

    A local bug: callers cap what they put in a reply first (``fit_records``).
    """

    code = "MESSAGE_TOO_LARGE"


__all__.append("DhtMessageTooLarge")
