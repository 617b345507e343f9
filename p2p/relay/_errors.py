"""Errors raised by the blind relay's client side (and the relay's refusal codes).

::

    P2PError                                        (p2p.errors)
    └── RelayError                                  base of everything p2p.relay raises
        ├── RelayRefused                            the relay said no (.code below)
        ├── RelayUnavailable (ConnectionBroken,     the relay cannot be reached, or the
        │                     trio.BrokenResourceError)  control connection / attach socket
        │                                           ended (.code: RELAY_UNREACHABLE,
        │                                           RELAY_CLOSED, RESERVATION_ENDED)
        ├── RelayTimeout                            TIMEOUT: no answer in time (local)
        ├── RelayProtocolError (RemoteProtocolError)
        │                                           the relay sent something the protocol
        │                                           does not allow (BAD_STATUS, BAD_ITEM)
        └── RelayKeyMismatch (HandshakeError)       KEY_MISMATCH: the peer that came through
                                                    the relay is not the one announced

Refusal codes (:class:`RefusalCode`) are stable strings that cross the wire:
as the RPC error code of ``reserve``/``pair``, or as the name of the attach
status byte. Callers branch on ``code``, never on the message.
"""

from __future__ import annotations

from enum import StrEnum

from ..errors import ConnectionBroken, HandshakeError, P2PError, RemoteProtocolError

__all__ = [
    "RefusalCode",
    "RelayError",
    "RelayKeyMismatch",
    "RelayProtocolError",
    "RelayRefused",
    "RelayTimeout",
    "RelayUnavailable",
]


class RefusalCode(StrEnum):
    """Why the relay refused; the metric label ``reason`` takes the same values."""

    #: ``reserve``: the allow-list does not name the caller's key.
    NOT_ALLOWED = "NOT_ALLOWED"
    #: ``reserve``: the relay holds ``max_reservations`` already.
    TOO_MANY_RESERVATIONS = "TOO_MANY_RESERVATIONS"
    #: ``reserve``: a newer reservation by the same key replaced this one.
    REPLACED = "REPLACED"
    #: ``pair``: the target holds no reservation on this relay.
    NOT_RESERVED = "NOT_RESERVED"
    #: ``pair``: the caller or the target is in ``max_pairs_per_key`` pairings,
    #: or the relay holds ``max_pending_pairs`` / ``max_active_pairs``.
    TOO_MANY_PAIRS = "TOO_MANY_PAIRS"
    #: ``pair``: the caller holds ``max_pairs_per_dialer_target`` pairings with
    #: this target already (other dialers may still pair with it).
    TOO_MANY_PAIRS_TO_TARGET = "TOO_MANY_PAIRS_TO_TARGET"
    #: ``pair``: the target is the caller itself.
    SELF_PAIR = "SELF_PAIR"
    #: attach: the token is unknown, expired or already used.
    UNKNOWN_TOKEN = "UNKNOWN_TOKEN"
    #: attach: the token was issued for the other role.
    WRONG_ROLE = "WRONG_ROLE"
    #: attach: this role of this pairing is already attached.
    ALREADY_ATTACHED = "ALREADY_ATTACHED"
    #: attach: the other side did not attach within the pairing timeout.
    PAIR_TIMEOUT = "PAIR_TIMEOUT"
    #: attach: the request after the magic is malformed (unknown role).
    BAD_ATTACH = "BAD_ATTACH"
    #: the relay is at ``max_connections`` (the connection is closed unread).
    TOO_MANY_CONNECTIONS = "TOO_MANY_CONNECTIONS"


class RelayError(P2PError):
    """Base of every error :mod:`p2p.relay` raises on purpose."""

    code = "RELAY_ERROR"


class RelayRefused(RelayError):
    """The relay refused a reservation, a pairing or an attach; ``code`` says why.

    ``code`` is a :class:`RefusalCode` value, or an RPC-level code
    (``INVALID_PARAMS``, ``BUSY``, ``UNKNOWN_METHOD``, ``UNKNOWN_PROTOCOL``)
    when the relay answered below the relay protocol.
    """

    code = "RELAY_REFUSED"


class RelayUnavailable(RelayError, ConnectionBroken):
    """The relay could not be reached, or the connection to it ended."""

    code = "RELAY_UNAVAILABLE"


class RelayTimeout(RelayError):
    """The relay did not answer in time (connect, pair or attach)."""

    code = "TIMEOUT"


class RelayProtocolError(RelayError, RemoteProtocolError):
    """The relay answered with something the protocol does not allow."""

    code = "RELAY_PROTOCOL_ERROR"


class RelayKeyMismatch(RelayError, HandshakeError):
    """The peer that arrived through the relay proved a key other than the expected one.

    ``expected`` and ``actual`` hold both keys.
    """

    code = "KEY_MISMATCH"
