"""A durable queue between two peers over the swarm (the HyperMQ analogue).

Each end publishes into its own signed log (``p2p.log``) and consumes a
verified copy of the peer's; delivery is at-least-once, in log order, acked
by position. See README.md for the design and the wire format.
"""

from ._config import QueueConfig
from ._errors import (
    BadQueueMessage,
    PayloadTooLarge,
    PublishFailed,
    QueueClosed,
    QueueError,
    QueueInUse,
)
from ._inbox import Delivery
from ._messages import PROTOCOL, head_namespace
from ._queue import DurableQueue, QueueStatistics
from ._service import QueueService

__all__ = [
    "PROTOCOL",
    "BadQueueMessage",
    "Delivery",
    "DurableQueue",
    "PayloadTooLarge",
    "PublishFailed",
    "QueueClosed",
    "QueueConfig",
    "QueueError",
    "QueueInUse",
    "QueueService",
    "QueueStatistics",
    "head_namespace",
]
