"""The exception tree of ``p2p.queue``::

    QueueError (P2PError)
    ├── QueueInUse                   another process has the queue's directory open
    ├── QueueClosed                  the queue was closed (aclose) while waiting
    ├── PayloadTooLarge (ValueError) a payload or key over the configured limit
    ├── PublishFailed                the append under a publish failed (.__cause__: why)
    └── BadQueueMessage              the peer broke the protocol (.code says how);
        (also RemoteProtocolError)   the channel is ended, the process goes on

Callers branch on ``code``, never on the message.
"""

from __future__ import annotations

from p2p.errors import P2PError, RemoteProtocolError

__all__ = ["BadQueueMessage", "PayloadTooLarge", "PublishFailed", "QueueClosed", "QueueError",
           "QueueInUse"]


class QueueError(P2PError):
    """Base of every error ``p2p.queue`` raises on purpose."""

    code = "QUEUE_ERROR"


class QueueInUse(QueueError):
    """The queue's directory is open in another handle or process."""

    code = "QUEUE_IN_USE"


class QueueClosed(QueueError):
    """The queue was closed; nothing more is published, delivered or acked."""

    code = "QUEUE_CLOSED"


class PayloadTooLarge(QueueError, ValueError):
    """A key or payload larger than :class:`QueueConfig` allows; nothing was written."""

    code = "PAYLOAD_TOO_LARGE"


class PublishFailed(QueueError):
    """The group append that carried this publish failed; it was not published.

    Every publish waiting on that append fails with it (their positions were
    not taken); ``__cause__`` is the I/O error.
    """

    code = "PUBLISH_FAILED"


class BadQueueMessage(QueueError, RemoteProtocolError):
    """The peer sent a message that breaks ``cosmicac-mq/1`` (``code``:
    ``DECODE_ERROR``, ``BAD_TYPE``, ``GAP``, ``RUN_TOO_LARGE``, ``BAD_ENTRY``,
    ``BAD_CHAIN``, ``BAD_SIGNATURE``, ``BAD_LENGTH``, ``ACK_AHEAD``). Nothing it
    carried was stored; the channel is ended."""

    code = "BAD_QUEUE_MESSAGE"
