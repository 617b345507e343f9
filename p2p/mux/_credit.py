"""Flow control of the mux: channel windows and the mux-wide budget, in one place.

Theory of operation
-------------------
Like h2's ``windows.py``, this module owns every credit number of one mux; the
core (:class:`~p2p.mux._core.MuxCore`) calls it as frames come and go, and the
channel and the driver ask it whether a send may go now (:meth:`FlowControl.send_wait`)
instead of reading counters themselves. Nothing here encodes frames: a grant
due is returned as a number, and the core queues the CREDIT or MUX_CREDIT frame.

Two levels, as in HTTP/2 and QUIC:

* **Channel windows.** Each receiver announces a window in OPEN/ACCEPT; the
  sender keeps ``ChannelState.send_credit`` and the receiver a
  :class:`ReceiveWindow` (``ChannelState.recv``) of what the peer may still send.
* **The mux budget** (connection-level credit, HTTP/2's connection window,
  QUIC's MAX_DATA): what the peer may make us buffer over all channels. Each
  side's first frame grants it (MUX_CREDIT); the sender draws on it per message
  as on its channel credit, so credit goes to whichever channel has data and
  idle channels cost nothing.

A message costs ``len + MESSAGE_OVERHEAD_BYTES`` (64) of both: what holding it
costs the receiver beyond its bytes, so neither a window nor the budget can be
filled with empty messages for free. A message may be at most half the
receiver's window: credit comes back in batches of half a window less 64 bytes
(yamux and HTTP/2 implementations use the same "half the window" rule), so that
much may be consumed yet unreported while the inbox is empty, and the rest (half
a window plus 64) must still hold the largest message. The budget comes back per
eighth of the budget or half a window, whichever is less, so what sits
unreported never grows with the budget past what a channel's own batching
leaves.

Invariants: ``0 <= send_credit``; ``inbox_bytes <= window`` per channel;
``buffered <= receive_budget_bytes`` (the sum of the inboxes); and, with no
frame in flight, the peer's ``send_budget`` equals our ``budget.allowed``, and
``budget.allowed + buffered + budget.unreported == receive_budget_bytes``.
"""

from __future__ import annotations

from enum import Enum

from p2p.mux._config import MuxConfig
from p2p.mux._errors import MuxProtocolError
from p2p.mux._frames import MESSAGE_OVERHEAD_BYTES

__all__ = ["MESSAGE_OVERHEAD_BYTES", "FlowControl", "ReceiveWindow", "SendWait", "message_cost"]

#: Credit a peer may grant in all before we call it an overflow.
_MAX_CREDIT = 1 << 62


def message_cost(size: int) -> int:
    """Credit a message of ``size`` bytes costs, of its channel's and of the mux's."""
    return size + MESSAGE_OVERHEAD_BYTES


class SendWait(Enum):
    """Why a message cannot be sent now; what its sender waits for."""

    #: Channel credit, mux budget and buffer room all cover it: send it now.
    NONE = "none"
    #: The channel's credit is short: wait for the peer's CREDIT.
    CHANNEL_CREDIT = "channel_credit"
    #: The mux budget is short: wait for the peer's MUX_CREDIT.
    MUX_BUDGET = "mux_budget"
    #: ``max_send_buffer_bytes`` are queued or being written: wait for the writer.
    SEND_BUFFER = "send_buffer"


class ReceiveWindow:
    """What the peer may still send into one window, and the credit owed back.

    Args:
        size: the window granted at first.
        batch: grant consumed credit back once this much is owed.
    """

    __slots__ = ("allowed", "batch", "unreported")

    def __init__(self, size: int, batch: int) -> None:
        #: Bytes of credit the peer may still use.
        self.allowed = size
        #: Consumed but not yet granted back.
        self.unreported = 0
        self.batch = batch

    def take(self, cost: int) -> bool:
        """A message of ``cost`` arrived: use its credit. False if beyond the window."""
        if cost > self.allowed:
            return False
        self.allowed -= cost
        return True

    def release(self, cost: int) -> int:
        """``cost`` was consumed; return the grant due now (0: none yet)."""
        unreported = self.unreported + cost
        if unreported >= self.batch:
            self.allowed += unreported
            self.unreported = 0
            return unreported
        self.unreported = unreported
        return 0

    def hold(self, cost: int) -> None:
        """``cost`` was consumed but must not be granted back (the channel ends)."""
        self.unreported += cost


class FlowControl:
    """Every credit number of one mux (see the module docstring).

    Args:
        config: windows, budget and the send buffer bound.
    """

    def __init__(self, config: MuxConfig) -> None:
        self.window = config.initial_window_bytes
        #: Largest message the peer may send us: half our window.
        self.max_receive_message = self.window >> 1
        self._channel_batch = self.max_receive_message - MESSAGE_OVERHEAD_BYTES
        budget = config.receive_budget_bytes
        #: The mux budget we grant the peer.
        self.budget = ReceiveWindow(budget, min(budget >> 3, self.max_receive_message))
        #: Bytes held in channel inboxes, as charged against the budget.
        self.buffered = 0
        self.buffered_peak = 0
        #: Connection-level credit the peer granted us (0 until its first frame).
        self.send_budget = 0
        self._max_outgoing = config.max_send_buffer_bytes

    def receive_window(self) -> ReceiveWindow:
        """A new channel's receive window (announced in OPEN/ACCEPT)."""
        return ReceiveWindow(self.window, self._channel_batch)

    # -- sending ---------------------------------------------------------------

    def send_wait(self, send_credit: int, size: int, outgoing_bytes: int) -> SendWait:
        """What a message of ``size`` on a channel with ``send_credit`` waits for.

        Args:
            send_credit: the channel's credit (``ChannelState.send_credit``).
            size: the message's length.
            outgoing_bytes: bytes queued for, or being written by, the writer.
        """
        cost = size + MESSAGE_OVERHEAD_BYTES
        if send_credit < cost:
            return SendWait.CHANNEL_CREDIT
        if self.send_budget < cost:
            return SendWait.MUX_BUDGET
        if outgoing_bytes >= self._max_outgoing:
            return SendWait.SEND_BUFFER
        return SendWait.NONE

    def can_send(self, send_credit: int, size: int) -> bool:
        """Whether channel credit and the mux budget both cover a message of ``size``."""
        cost = size + MESSAGE_OVERHEAD_BYTES
        return send_credit >= cost and self.send_budget >= cost

    def spend(self, cost: int) -> None:
        """A message of ``cost`` is queued: draw it from the budget (the caller
        draws the channel's credit)."""
        self.send_budget -= cost

    def grant_budget(self, amount: int) -> None:
        """The peer sent MUX_CREDIT.

        Raises:
            MuxProtocolError: ``CREDIT_OVERFLOW``.
        """
        if self.send_budget + amount >= _MAX_CREDIT:
            raise MuxProtocolError("mux credit overflow", code="CREDIT_OVERFLOW")
        self.send_budget += amount

    @staticmethod
    def granted(send_credit: int, amount: int, channel: int) -> int:
        """The peer sent CREDIT for ``channel``; return its new send credit.

        Raises:
            MuxProtocolError: ``CREDIT_OVERFLOW``.
        """
        if send_credit + amount >= _MAX_CREDIT:
            raise MuxProtocolError(f"credit overflow on {channel}", code="CREDIT_OVERFLOW")
        return send_credit + amount

    # -- receiving -------------------------------------------------------------

    def receive(self, window: ReceiveWindow, cost: int, channel: int) -> None:
        """A DATA frame of ``cost`` arrived on a channel with receive ``window``.

        Raises:
            MuxProtocolError: ``CREDIT_EXCEEDED`` (beyond the channel's window) or
                ``BUDGET_EXCEEDED`` (beyond the mux budget); the mux must end.
        """
        if cost > window.allowed:
            raise MuxProtocolError(
                f"peer sent {cost} bytes on channel {channel} with {window.allowed} "
                "bytes of credit",
                code="CREDIT_EXCEEDED",
            )
        budget = self.budget
        if cost > budget.allowed:
            raise MuxProtocolError(
                f"peer sent {cost} bytes on channel {channel} with {budget.allowed} "
                "bytes of mux credit",
                code="BUDGET_EXCEEDED",
            )
        budget.allowed -= cost
        window.allowed -= cost

    def buffer(self, cost: int) -> None:
        """A received message of ``cost`` is held in an inbox."""
        buffered = self.buffered + cost
        self.buffered = buffered
        if buffered > self.buffered_peak:
            self.buffered_peak = buffered

    def release(self, cost: int) -> int:
        """A message of ``cost`` left the inboxes (consumed or discarded).

        Returns:
            MUX_CREDIT due now (0: none yet).
        """
        self.buffered -= cost
        budget = self.budget  # ReceiveWindow.release, inlined: once per message
        unreported = budget.unreported + cost
        if unreported >= budget.batch:
            budget.allowed += unreported
            budget.unreported = 0
            return unreported
        budget.unreported = unreported
        return 0
