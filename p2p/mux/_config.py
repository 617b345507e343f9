"""Configuration of the channel multiplexer."""

from __future__ import annotations

from dataclasses import dataclass

from p2p.mux._errors import MuxUsageError
from p2p.mux._frames import MESSAGE_OVERHEAD_BYTES

__all__ = [
    "DEFAULT_BUSY_POLL_S",
    "DEFAULT_INITIAL_WINDOW_BYTES",
    "DEFAULT_MAX_CHANNELS",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_PENDING_ACCEPTS",
    "DEFAULT_MAX_SEND_BUFFER_BYTES",
    "DEFAULT_RECEIVE_BUDGET_BYTES",
    "DEFAULT_RECEIVE_CHUNK_BYTES",
    "MuxConfig",
]

#: Per-channel receive window. HTTP/2 starts streams at 64 KiB and most servers
#: raise it to 1 MiB or more; yamux uses 256 KiB. 1 MiB lets one channel move
#: ~600 MB/s at a 1.5 ms round trip.
DEFAULT_INITIAL_WINDOW_BYTES = 1 << 20
#: Largest message a channel sends: half the default window (see
#: ``initial_window_bytes``). Protomux leaves this to the framing; hypercore
#: blocks (64 KiB) stay far below it.
DEFAULT_MAX_MESSAGE_BYTES = 512 << 10
#: Connection-level receive window: what one peer can make us buffer, over all
#: channels. HTTP/2 starts a connection at 64 KiB and implementations raise it to
#: a few MiB or more (gRPC grows it to the bandwidth-delay product). Four windows:
#: one channel at full speed is bound by its own window, not by the budget, and
#: two channels the application stops reading still leave room for the others.
DEFAULT_RECEIVE_BUDGET_BYTES = 4 << 20
#: Channel table bound per mux (live, opening and closing channels alike).
DEFAULT_MAX_CHANNELS = 1024
#: Incoming channels a listener holds before the application accepts them.
DEFAULT_MAX_PENDING_ACCEPTS = 64
#: Bytes the writer may hold before senders wait (see ``max_send_buffer_bytes``).
DEFAULT_MAX_SEND_BUFFER_BYTES = 4 << 20
#: Busy-poll window after each write: off. Polling halves a loopback round trip
#: but keeps a core busy while traffic flows (a token stream all day), so it is a
#: benchmark setting (``bench/rpc.py --busy-poll 0.0005``: a loopback RPC round
#: trip takes ~200 µs when both ends keep polling, so 500 µs catches most answers).
DEFAULT_BUSY_POLL_S = 0.0
#: ``max_bytes`` of each ``receive_some``; large reads let one read carry many frames.
DEFAULT_RECEIVE_CHUNK_BYTES = 256 << 10


@dataclass(frozen=True, slots=True)
class MuxConfig:
    """Limits and windows of one :class:`~p2p.mux.Mux`; validated when built.

    Raises:
        MuxUsageError: (code ``BAD_CONFIG``) if a field is out of range or the
            window cannot hold a maximum-size message.
    """

    initial_window_bytes: int = DEFAULT_INITIAL_WINDOW_BYTES
    """Bytes of messages the peer may send on each channel before we grant more
    (each message counts ``len + 64``); the per-channel receive buffer bound. The
    peer may send messages of up to half of it (a larger one ends the mux with
    ``MESSAGE_TOO_LARGE``). Must be >= 2 * ``max_message_bytes``: credit is
    returned once half the window (less 64) is consumed, so that much can sit
    unreported, and the rest must hold the largest message or its sender would
    wait forever. At least 256."""

    receive_budget_bytes: int = DEFAULT_RECEIVE_BUDGET_BYTES
    """Bytes the peer may make us buffer over all channels together (received,
    not yet taken by the application), whatever the number of channels: the
    connection-level window. Each buffered message counts ``len + 64`` bytes (the
    64 stand for its object overhead), so this bounds memory even for a flood of
    empty messages. Announced to the peer as mux credit and returned as the
    application consumes. Must be >= 2 * ``initial_window_bytes``: one channel
    whose application stops reading may then hold its whole window while every
    other channel can still get its largest message through. Each further
    unread channel may hold another window: size it as (channels you may leave
    unread + 2) windows."""

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    """Largest single message, in bytes, we send on a channel (further capped at
    half the peer's window). ``ChannelStream`` cuts its data at this size."""

    max_channels: int = DEFAULT_MAX_CHANNELS
    """Entries in the channel table (open, opening and closing). At the bound a
    remote open is rejected with ``TOO_MANY_CHANNELS`` and a local open raises
    :class:`MuxUsageError` with that code."""

    max_pending_accepts: int = DEFAULT_MAX_PENDING_ACCEPTS
    """Channels one listener queues before ``accept()`` takes them. At the bound
    further opens for that protocol are rejected with ``BACKLOG_FULL``."""

    max_send_buffer_bytes: int = DEFAULT_MAX_SEND_BUFFER_BYTES
    """Bytes of frames queued for the writer before channel senders wait. A send
    that would cross it waits until the writer has handed the batch to the stream
    (one message may overshoot it, so a message larger than the bound still goes).
    Control frames (credit, open, close) are not held back: they are small and
    bounded by the channel table."""

    receive_chunk_bytes: int = DEFAULT_RECEIVE_CHUNK_BYTES
    """``max_bytes`` passed to each ``receive_some`` of the reader task."""

    busy_poll_s: float = DEFAULT_BUSY_POLL_S
    """Seconds to keep polling for I/O after each write instead of sleeping in
    epoll (see ``_scheduling.py``): halves a loopback round trip at the cost of
    up to this much CPU per write that gets no quick answer. 0 (the default)
    disables it; a benchmark setting, not for daemons."""

    def __post_init__(self) -> None:
        for name in (
            "initial_window_bytes",
            "receive_budget_bytes",
            "max_message_bytes",
            "max_channels",
            "max_pending_accepts",
            "max_send_buffer_bytes",
            "receive_chunk_bytes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise MuxUsageError(f"{name} must be a positive int, got {value!r}",
                                    code="BAD_CONFIG")
        if self.initial_window_bytes < 2 * self.max_message_bytes:
            raise MuxUsageError(
                "initial_window_bytes must be >= 2 * max_message_bytes "
                f"({self.initial_window_bytes} < 2 * {self.max_message_bytes}), or a "
                "maximum-size message could wait forever for credit",
                code="BAD_CONFIG",
            )
        if self.initial_window_bytes < 4 * MESSAGE_OVERHEAD_BYTES:
            raise MuxUsageError(
                f"initial_window_bytes must be >= {4 * MESSAGE_OVERHEAD_BYTES}, got "
                f"{self.initial_window_bytes}",
                code="BAD_CONFIG",
            )
        if self.receive_budget_bytes < 2 * self.initial_window_bytes:
            raise MuxUsageError(
                "receive_budget_bytes must be >= 2 * initial_window_bytes "
                f"({self.receive_budget_bytes} < 2 * {self.initial_window_bytes}), or one "
                "channel the application does not read could block all the others",
                code="BAD_CONFIG",
            )
        if not 0 <= self.busy_poll_s <= 1:
            raise MuxUsageError(
                f"busy_poll_s must be between 0 and 1, got {self.busy_poll_s!r}", code="BAD_CONFIG"
            )
        if self.receive_budget_bytes >= 1 << 62:
            raise MuxUsageError("receive_budget_bytes too large", code="BAD_CONFIG")
