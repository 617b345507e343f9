"""Errors raised by the channel multiplexer.

::

    P2PError                                   (p2p.errors)
    └── MuxError                               base of everything p2p.mux raises
        ├── MuxUsageError (LocalProtocolError) we misused the API
        │   │                                  (.code: DUPLICATE_CHANNEL, MESSAGE_TOO_LARGE,
        │   │                                   BAD_PROTOCOL_NAME, BAD_CHANNEL_ID)
        ├── MuxProtocolError (RemoteProtocolError)
        │                                      the peer broke the framing or the credit rules
        │                                      (.code: BAD_VARINT, UNKNOWN_FRAME_TYPE,
        │                                       FRAME_TOO_LARGE, BAD_FRAME, UNKNOWN_CHANNEL,
        │                                       CREDIT_EXCEEDED, MESSAGE_TOO_LARGE, ...)
        ├── ChannelRejected                    the peer refused our open
        │                                      (.code: UNKNOWN_PROTOCOL, TOO_MANY_CHANNELS,
        │                                       BACKLOG_FULL, DUPLICATE_CHANNEL)
        ├── ChannelClosed (trio.ClosedResourceError)
        │                                      *we* closed the channel or the mux
        └── ChannelBroken (ConnectionBroken, trio.BrokenResourceError)
                                               the peer or the network ended it
                                               (.code: REMOTE_CLOSED, STREAM_BROKEN, the
                                                code of the protocol error, ...)

Trio's meanings are kept: *Closed* means we closed it, *Broken* means the peer or
the network did.
"""

from __future__ import annotations

import trio

from p2p.errors import ConnectionBroken, LocalProtocolError, P2PError, RemoteProtocolError

__all__ = [
    "ChannelBroken",
    "ChannelClosed",
    "ChannelRejected",
    "MuxError",
    "MuxProtocolError",
    "MuxUsageError",
]


class MuxError(P2PError):
    """Base of every error :mod:`p2p.mux` raises on purpose."""

    code = "MUX_ERROR"


class MuxUsageError(MuxError, LocalProtocolError):
    """The local program used the mux API in a way the protocol forbids."""

    code = "MUX_USAGE_ERROR"


class MuxProtocolError(MuxError, RemoteProtocolError):
    """The peer sent bytes that break the mux protocol; the mux ends.

    ``code`` names the violation, e.g. ``CREDIT_EXCEEDED`` or ``BAD_VARINT``.
    """

    code = "MUX_PROTOCOL_ERROR"


class ChannelRejected(MuxError):
    """The peer answered our open with a reject frame.

    ``code`` is the peer's reason: ``UNKNOWN_PROTOCOL``, ``TOO_MANY_CHANNELS``,
    ``BACKLOG_FULL`` or ``DUPLICATE_CHANNEL``.
    """

    code = "CHANNEL_REJECTED"


class ChannelClosed(MuxError, trio.ClosedResourceError):
    """The channel (or its whole mux) was closed by this side."""

    code = "CHANNEL_CLOSED"


class ChannelBroken(MuxError, ConnectionBroken):
    """The peer closed the channel, or the mux under it ended."""

    code = "CHANNEL_BROKEN"
