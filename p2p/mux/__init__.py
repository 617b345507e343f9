"""Protomux-like channels over one byte stream, with per-channel credit backpressure.

See ``README.md`` in this folder for the wire format.
"""

from p2p.mux._channel import Channel, ChannelStatistics, MessageHandler
from p2p.mux._config import MuxConfig
from p2p.mux._core import ChannelPhase, ChannelState, MuxCore
from p2p.mux._driver import Mux, MuxStatistics
from p2p.mux._errors import (
    ChannelBroken,
    ChannelClosed,
    ChannelRejected,
    MuxError,
    MuxProtocolError,
    MuxUsageError,
)
from p2p.mux._frames import RejectReason
from p2p.mux._listener import ChannelListener
from p2p.mux._stream import ChannelStream

__all__ = [
    "Channel",
    "ChannelBroken",
    "ChannelClosed",
    "ChannelListener",
    "ChannelPhase",
    "ChannelRejected",
    "ChannelState",
    "ChannelStatistics",
    "ChannelStream",
    "MessageHandler",
    "Mux",
    "MuxConfig",
    "MuxCore",
    "MuxError",
    "MuxProtocolError",
    "MuxStatistics",
    "MuxUsageError",
    "RejectReason",
]
