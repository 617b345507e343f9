"""Sans-IO state machine of the channel multiplexer.

Theory of operation
-------------------
:class:`MuxCore` owns the channel table of one mux and never touches a socket,
clock or task. The driver feeds it received bytes (:meth:`MuxCore.receive_data`,
which returns events) and calls commands (:meth:`open`, :meth:`send_message`,
:meth:`receive_message`, :meth:`send_end`, :meth:`close` ...). Every command and
every received frame may queue frames to send; the driver collects them all at
once with :meth:`MuxCore.data_to_send`, which is how many small messages end up
in one ``send_all``.

Channel numbers: each side numbers its own channels (lowest free number first, so
varints stay one byte). Frames are addressed with the *receiver's* number, except
OPEN, which carries the sender's own number so the peer can answer.

Pairing (as in Protomux): a channel is named by (protocol, id). An incoming OPEN
is matched, in this order,

1. to our own unanswered OPEN of the same name: both sides pair, with no
   ACCEPT (each side's OPEN was sent before it saw the other's, so both pair);
2. to a listener for the protocol: we ACCEPT at once and queue the channel in the
   listener's backlog (data may arrive before ``accept()``, within the window);
3. otherwise it is REJECTed with ``UNKNOWN_PROTOCOL``.

A name in use on our side (opening, open or closing) refuses a second local open
(:class:`MuxUsageError` ``DUPLICATE_CHANNEL``) and a remote one (REJECT
``DUPLICATE_CHANNEL``).

Credit (channel windows and the mux-wide receive budget) is accounted in
``_credit.py`` (:class:`~p2p.mux._credit.FlowControl`, ``self.flow``), which
states the rules and invariants; this core calls it as frames come and go and
queues the CREDIT and MUX_CREDIT frames it says are due. A DATA frame beyond a
channel's window ends the mux with ``CREDIT_EXCEEDED``, beyond the budget with
``BUDGET_EXCEEDED``. The budget exists because per-channel windows bound what
one channel can hold, but a peer could open ``max_channels`` channels and fill
every window.

Why the receiver cannot do it alone: credit, once granted to a channel, cannot
be taken back, so a receiver-only scheme has to hand a slice of the budget to
each channel in advance, and slices given to channels that never send are lost
to the others (with atomic messages a channel needs a whole message's worth at
once, so slices cannot be made small). With a budget the *sender* draws on,
credit goes to whichever channel has data.

Closing: END half-closes one direction. CLOSE ends both; the CLOSE receiver
answers with its own CLOSE. A number is freed only once CLOSE went both ways, so
no late frame can reach a reused number. A local open that the application
abandons before the answer stays in the table; when the answer comes it is
closed (or freed, if rejected).

Limits: ``max_channels`` entries, ``max_pending_accepts`` per listener backlog.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum

from p2p.mux._config import MuxConfig
from p2p.mux._credit import FlowControl, ReceiveWindow, SendWait
from p2p.mux._errors import MuxProtocolError, MuxUsageError
from p2p.mux._frames import (
    MAX_CHANNEL_ID_BYTES,
    MAX_PROTOCOL_NAME_BYTES,
    MESSAGE_OVERHEAD_BYTES,
    Accept,
    Close,
    Credit,
    Data,
    End,
    Frame,
    FrameDecoder,
    MuxCredit,
    Open,
    Reject,
    RejectReason,
    data_header,
    encode_frame,
)

__all__ = [
    "BudgetReceived",
    "ChannelIncoming",
    "ChannelPaired",
    "ChannelPhase",
    "ChannelState",
    "CreditReceived",
    "MessageReceived",
    "MuxCore",
    "MuxEvent",
    "OpenRejected",
    "RemoteClosed",
    "RemoteEnded",
]

# Room for the header of a max-size DATA frame: type byte + channel varint, and
# for OPEN's window + name + id.
_HEADER_SLACK_BYTES = 32 + MAX_PROTOCOL_NAME_BYTES + MAX_CHANNEL_ID_BYTES


class ChannelPhase(Enum):
    """Where a channel is in its life."""

    #: We sent OPEN and wait for ACCEPT, REJECT or the peer's own OPEN.
    OPENING = "opening"
    #: Paired; messages may flow (subject to END/CLOSE flags).
    OPEN = "open"
    #: Gone from the table (rejected, or CLOSE went both ways).
    FREED = "freed"


class ChannelState:
    """The core's record of one channel. Drivers read it; only the core writes it."""

    __slots__ = (
        "abandoned",
        "app_closed",
        "bytes_received",
        "bytes_sent",
        "got_close",
        "id",
        "inbox",
        "inbox_bytes",
        "initiator",
        "local",
        "messages_received",
        "messages_sent",
        "phase",
        "protocol",
        "recv",
        "reject_reason",
        "remote",
        "remote_ended",
        "remote_window",
        "send_credit",
        "sent_close",
        "sent_end",
        "window",
    )

    def __init__(
        self, local: int, protocol: str, id: bytes, recv: ReceiveWindow, initiator: bool
    ) -> None:
        #: Our channel number; the peer addresses its frames with it.
        self.local = local
        #: The peer's channel number, once paired.
        self.remote: int | None = None
        self.protocol = protocol
        self.id = id
        self.initiator = initiator
        self.phase = ChannelPhase.OPENING
        #: Our receive window (bytes), announced in OPEN/ACCEPT.
        self.window = recv.allowed
        #: The peer's window as it announced it; caps our message size.
        self.remote_window = 0
        #: Bytes we may still send.
        self.send_credit = 0
        #: What the peer may still send us, and the credit we owe it back.
        self.recv = recv
        self.inbox: deque[bytes] = deque()
        self.inbox_bytes = 0
        self.sent_end = False
        self.remote_ended = False
        self.sent_close = False
        self.got_close = False
        #: The application closed (or abandoned) this channel.
        self.app_closed = False
        self.abandoned = False
        self.reject_reason: int | None = None
        self.bytes_sent = 0
        self.messages_sent = 0
        self.bytes_received = 0
        self.messages_received = 0

    def __repr__(self) -> str:
        return (
            f"<ChannelState {self.protocol!r} id={self.id.hex()} local={self.local} "
            f"remote={self.remote} {self.phase.value}>"
        )


# -- events (what the peer did), nouns ------------------------------------------


@dataclass(slots=True)
class ChannelPaired:
    """Our open of ``channel`` was answered (ACCEPT or a symmetric OPEN)."""

    channel: ChannelState


@dataclass(slots=True)
class OpenRejected:
    """Our open of ``channel`` was refused; ``channel.reject_reason`` says why."""

    channel: ChannelState


@dataclass(slots=True)
class ChannelIncoming:
    """A listener backlog for ``protocol`` gained a channel."""

    protocol: str


@dataclass(slots=True)
class MessageReceived:
    """``channel``'s inbox went from empty to non-empty."""

    channel: ChannelState


@dataclass(slots=True)
class CreditReceived:
    """The peer granted ``channel`` more send credit."""

    channel: ChannelState


@dataclass(slots=True)
class RemoteEnded:
    """The peer half-closed its direction of ``channel``."""

    channel: ChannelState


@dataclass(slots=True)
class RemoteClosed:
    """The peer closed ``channel``."""

    channel: ChannelState


@dataclass(slots=True)
class BudgetReceived:
    """The peer granted more connection-level send credit (``MuxCore.send_budget``)."""


_BUDGET_RECEIVED = BudgetReceived()

MuxEvent = (
    BudgetReceived
    | ChannelPaired
    | OpenRejected
    | ChannelIncoming
    | MessageReceived
    | CreditReceived
    | RemoteEnded
    | RemoteClosed
)


def _violation(code: str, message: str) -> MuxProtocolError:
    return MuxProtocolError(message, code=code)


class MuxCore:
    """Channel table, pairing and credit accounting for one mux (no I/O).

    Args:
        config: limits and windows.

    After any command or :meth:`receive_data`, the caller should collect
    :meth:`data_to_send` and write it to the stream.
    """

    def __init__(self, config: MuxConfig | None = None) -> None:
        self.config = config or MuxConfig()
        #: Every credit number of this mux (see ``_credit.py``).
        self.flow = FlowControl(self.config)
        # Messages may be up to half our window (see _credit.py).
        self._max_recv_message = self.flow.max_receive_message
        self._decoder = FrameDecoder(self._max_recv_message + _HEADER_SLACK_BYTES)
        self._table: dict[int, ChannelState] = {}
        self._by_key: dict[tuple[str, bytes], ChannelState] = {}
        self._free: list[int] = []
        self._next_local = 0
        self._backlogs: dict[str, deque[ChannelState]] = {}
        self._out: list[bytes] = []
        #: Bytes queued for the writer and not yet collected (drivers read it;
        #: only the core writes it).
        self.outgoing_bytes = 0
        #: Set once the peer broke the protocol; the core refuses further input.
        self.failed: MuxProtocolError | None = None
        #: Channels the peer has asked to open (answered or refused): whether
        #: it ever asked for anything, for admission's idle-first eviction.
        self.peer_opens = 0
        self._queue(MuxCredit(self.config.receive_budget_bytes))

    # -- output ----------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """Take every queued frame, joined into one buffer (possibly empty)."""
        out = self._out
        if not out:
            return b""
        self._out = []
        self.outgoing_bytes = 0
        return out[0] if len(out) == 1 else b"".join(out)

    def _queue(self, frame: Frame) -> None:
        data = encode_frame(frame)
        self._out.append(data)
        self.outgoing_bytes += len(data)

    # -- receive budget --------------------------------------------------------

    @property
    def buffered_bytes(self) -> int:
        """Bytes held in channel inboxes, as charged against the receive budget
        (``len + MESSAGE_OVERHEAD_BYTES`` per message); at most
        ``receive_budget_bytes``."""
        return self.flow.buffered

    @property
    def buffered_bytes_peak(self) -> int:
        """The most :attr:`buffered_bytes` has been."""
        return self.flow.buffered_peak

    @property
    def send_budget(self) -> int:
        """Connection-level credit left from the peer: a message costs
        ``len + MESSAGE_OVERHEAD_BYTES`` of it."""
        return self.flow.send_budget

    def can_send(self, st: ChannelState, size: int) -> bool:
        """Whether channel and connection credit both cover a message of ``size``."""
        return self.flow.can_send(st.send_credit, size)

    def send_wait(self, st: ChannelState, size: int, writing_bytes: int = 0) -> SendWait:
        """What a message of ``size`` on ``st`` must wait for (``SendWait.NONE``: nothing).

        Args:
            writing_bytes: bytes the driver is writing now (they count against
                ``max_send_buffer_bytes`` with what is queued here).
        """
        return self.flow.send_wait(st.send_credit, size, self.outgoing_bytes + writing_bytes)

    def _release(self, amount: int) -> None:
        """``amount`` budget bytes left our buffers: grant them back when due."""
        grant = self.flow.release(amount)
        if grant:
            self._queue(MuxCredit(grant))

    def drop_inbox(self, st: ChannelState) -> None:
        """Discard ``st``'s unread messages, giving their budget back."""
        if st.inbox:
            self._release(st.inbox_bytes)
            st.inbox.clear()
        st.inbox_bytes = 0

    # -- table -----------------------------------------------------------------

    @property
    def channel_count(self) -> int:
        """Entries in the channel table."""
        return len(self._table)

    def channels(self) -> list[ChannelState]:
        """Every channel in the table (a copy)."""
        return list(self._table.values())

    def _allocate(self, protocol: str, id: bytes, initiator: bool) -> ChannelState:
        local = self._free.pop() if self._free else self._next_local
        if local == self._next_local:
            self._next_local += 1
        st = ChannelState(local, protocol, id, self.flow.receive_window(), initiator)
        self._table[local] = st
        self._by_key[(protocol, id)] = st
        return st

    def _free_channel(self, st: ChannelState) -> None:
        if st.phase is ChannelPhase.FREED:
            return
        st.phase = ChannelPhase.FREED
        del self._table[st.local]
        key = (st.protocol, st.id)
        if self._by_key.get(key) is st:
            del self._by_key[key]
        self._free.append(st.local)

    # -- commands --------------------------------------------------------------

    def open(self, protocol: str, id: bytes = b"") -> ChannelState:
        """Queue an OPEN for (protocol, id).

        Returns:
            The new channel, in phase OPENING; a :class:`ChannelPaired` or
            :class:`OpenRejected` event follows from :meth:`receive_data`.

        Raises:
            MuxUsageError: ``DUPLICATE_CHANNEL`` if the name is in use,
                ``TOO_MANY_CHANNELS`` at the table bound, ``BAD_PROTOCOL_NAME`` /
                ``BAD_CHANNEL_ID`` if they do not fit the frame.
        """
        if not isinstance(protocol, str) or not protocol:
            raise MuxUsageError("protocol must be a non-empty str", code="BAD_PROTOCOL_NAME")
        if len(protocol.encode("utf-8")) > MAX_PROTOCOL_NAME_BYTES:
            raise MuxUsageError("protocol name too long", code="BAD_PROTOCOL_NAME")
        id = bytes(id)
        if len(id) > MAX_CHANNEL_ID_BYTES:
            raise MuxUsageError(
                f"channel id longer than {MAX_CHANNEL_ID_BYTES} bytes", code="BAD_CHANNEL_ID"
            )
        if (protocol, id) in self._by_key:
            raise MuxUsageError(
                f"channel {protocol!r} id={id.hex()} is already open on this mux",
                code="DUPLICATE_CHANNEL",
            )
        if len(self._table) >= self.config.max_channels:
            raise MuxUsageError("channel table is full", code="TOO_MANY_CHANNELS")
        st = self._allocate(protocol, id, initiator=True)
        self._queue(Open(st.local, protocol, id, st.window))
        return st

    def listen(self, protocol: str) -> None:
        """Accept incoming opens for ``protocol`` into a backlog."""
        self._backlogs.setdefault(protocol, deque())

    def unlisten(self, protocol: str) -> None:
        """Stop accepting ``protocol``; channels still in its backlog are closed."""
        backlog = self._backlogs.pop(protocol, None)
        for st in backlog or ():
            self.close(st)

    def accept_nowait(self, protocol: str) -> ChannelState | None:
        """Take the oldest channel from ``protocol``'s backlog, or None."""
        backlog = self._backlogs.get(protocol)
        if backlog:
            return backlog.popleft()
        return None

    def max_send_bytes(self, st: ChannelState) -> int:
        """The largest message ``st`` may send."""
        return min(self.config.max_message_bytes, st.remote_window >> 1)

    def send_message(self, st: ChannelState, payload: bytes) -> None:
        """Queue one message on an open channel.

        The caller must first check :meth:`can_send` (channel credit and the
        peer's connection-level budget).

        Raises:
            MuxUsageError: ``NO_CREDIT``, ``MESSAGE_TOO_LARGE``, ``NOT_OPEN`` or
                ``ENDED`` when the call breaks those rules.
        """
        n = len(payload)
        cost = n + MESSAGE_OVERHEAD_BYTES
        if st.phase is not ChannelPhase.OPEN or st.sent_close:
            raise MuxUsageError("channel is not open", code="NOT_OPEN")
        if st.sent_end:
            raise MuxUsageError("channel direction already ended", code="ENDED")
        if n > self.config.max_message_bytes or n > st.remote_window >> 1:
            raise MuxUsageError(
                f"message of {n} bytes exceeds the limit of {self.max_send_bytes(st)}",
                code="MESSAGE_TOO_LARGE",
            )
        flow = self.flow
        if cost > st.send_credit or cost > flow.send_budget:
            raise MuxUsageError("not enough send credit", code="NO_CREDIT")
        st.send_credit -= cost
        flow.send_budget -= cost
        st.bytes_sent += n
        st.messages_sent += 1
        header = data_header(st.remote, n)  # type: ignore[arg-type]
        out = self._out
        out.append(header)
        out.append(payload)
        self.outgoing_bytes += len(header) + n

    def receive_message(self, st: ChannelState) -> bytes | None:
        """Take the oldest message from ``st``'s inbox, returning credit as due.

        Returns:
            The message, or None if the inbox is empty.
        """
        if not st.inbox:
            return None
        msg = st.inbox.popleft()
        cost = len(msg) + MESSAGE_OVERHEAD_BYTES
        st.inbox_bytes -= cost
        # Batched grants (see _credit.py): a CREDIT per half window consumed,
        # none once the peer can send no more on the channel.
        if st.remote_ended or st.got_close or st.sent_close:
            st.recv.hold(cost)
        else:
            grant = st.recv.release(cost)
            if grant:
                self._queue(Credit(st.remote, grant))  # type: ignore[arg-type]
        grant = self.flow.release(cost)
        if grant:
            self._queue(MuxCredit(grant))
        return msg

    def send_end(self, st: ChannelState) -> None:
        """Queue END: we send no more messages on ``st``. Idempotent."""
        if st.sent_end or st.sent_close or st.phase is not ChannelPhase.OPEN:
            st.sent_end = True
            return
        st.sent_end = True
        self._queue(End(st.remote))  # type: ignore[arg-type]

    def close(self, st: ChannelState) -> None:
        """Close ``st`` for good (idempotent); its inbox is dropped.

        An OPENING channel is abandoned: it is closed when the answer arrives.
        """
        st.app_closed = True
        self.drop_inbox(st)
        if st.phase is ChannelPhase.OPENING:
            st.abandoned = True
            return
        if st.phase is ChannelPhase.OPEN and not st.sent_close:
            st.sent_close = True
            self._queue(Close(st.remote))  # type: ignore[arg-type]
            if st.got_close:
                self._free_channel(st)

    # -- input -----------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[MuxEvent]:
        """Process bytes from the stream.

        Returns:
            The events they caused, in order. Frames to send may also be queued
            (ACCEPT, REJECT, CLOSE answers).

        Raises:
            MuxProtocolError: the peer broke the protocol. The core is failed:
                the caller must end the mux.
        """
        if self.failed is not None:
            raise self.failed
        try:
            frames = self._decoder.feed(data)
            events: list[MuxEvent] = []
            table = self._table
            max_msg = self._max_recv_message
            flow = self.flow
            for f in frames:
                if type(f) is Data:
                    st = table.get(f.channel)
                    if st is None or st.phase is not ChannelPhase.OPEN:
                        raise _violation("UNKNOWN_CHANNEL", f"DATA for channel {f.channel}")
                    if st.remote_ended or st.got_close:
                        raise _violation("DATA_AFTER_END", f"DATA after END on {f.channel}")
                    n = len(f.payload)
                    if n > max_msg:
                        raise _violation("MESSAGE_TOO_LARGE", f"message of {n} bytes")
                    cost = n + MESSAGE_OVERHEAD_BYTES
                    flow.receive(st.recv, cost, f.channel)
                    st.bytes_received += n
                    st.messages_received += 1
                    if st.app_closed:
                        # discarded (the peer will see our CLOSE): the budget
                        # goes back at once
                        flow.buffered += cost
                        self._release(cost)
                        continue
                    if not st.inbox:
                        events.append(MessageReceived(st))
                    st.inbox.append(f.payload)
                    st.inbox_bytes += cost
                    flow.buffer(cost)
                else:
                    self._control(f, events)
            return events
        except MuxProtocolError as exc:
            self.failed = exc
            raise

    def _control(self, f: Frame, events: list[MuxEvent]) -> None:
        if type(f) is Open:
            self._on_open(f, events)
            return
        if type(f) is MuxCredit:
            self.flow.grant_budget(f.amount)
            events.append(_BUDGET_RECEIVED)
            return
        st = self._table.get(f.channel)
        if st is None:
            raise _violation("UNKNOWN_CHANNEL", f"{type(f).__name__} for channel {f.channel}")
        if type(f) is Accept:
            if st.phase is not ChannelPhase.OPENING:
                raise _violation("UNEXPECTED_ACCEPT", f"ACCEPT for channel {f.channel}")
            self._pair(st, f.remote_channel, f.window, events)
        elif type(f) is Reject:
            if st.phase is not ChannelPhase.OPENING:
                raise _violation("UNEXPECTED_REJECT", f"REJECT for channel {f.channel}")
            st.reject_reason = f.reason
            self._free_channel(st)
            if not st.abandoned:
                events.append(OpenRejected(st))
        elif st.phase is not ChannelPhase.OPEN or st.got_close:
            raise _violation("UNKNOWN_CHANNEL", f"{type(f).__name__} for channel {f.channel}")
        elif type(f) is Credit:
            st.send_credit = self.flow.granted(st.send_credit, f.amount, f.channel)
            if not st.sent_close:
                events.append(CreditReceived(st))
        elif type(f) is End:
            if not st.remote_ended:
                st.remote_ended = True
                events.append(RemoteEnded(st))
        elif type(f) is Close:
            st.got_close = True
            if not st.sent_close:
                st.sent_close = True
                self._queue(Close(st.remote))  # type: ignore[arg-type]
            self._free_channel(st)
            events.append(RemoteClosed(st))

    def _pair(self, st: ChannelState, remote: int, window: int, events: list[MuxEvent]) -> None:
        st.remote = remote
        st.remote_window = window
        st.send_credit = window
        st.phase = ChannelPhase.OPEN
        if st.abandoned:
            st.sent_close = True
            self._queue(Close(remote))
        else:
            events.append(ChannelPaired(st))

    def _on_open(self, f: Open, events: list[MuxEvent]) -> None:
        self.peer_opens += 1
        key = (f.protocol, f.id)
        st = self._by_key.get(key)
        if st is not None:
            if st.phase is ChannelPhase.OPENING and st.initiator:
                self._pair(st, f.channel, f.window, events)  # (1) symmetric open
            else:
                self._queue(Reject(f.channel, RejectReason.DUPLICATE_CHANNEL))
            return
        backlog = self._backlogs.get(f.protocol)
        if backlog is None:
            self._queue(Reject(f.channel, RejectReason.UNKNOWN_PROTOCOL))  # (3)
            return
        # (2) a listener: bounded by the table and the backlog; at either bound
        # the open is refused and the peer sees why.
        if len(self._table) >= self.config.max_channels:
            self._queue(Reject(f.channel, RejectReason.TOO_MANY_CHANNELS))
            return
        if len(backlog) >= self.config.max_pending_accepts:
            self._queue(Reject(f.channel, RejectReason.BACKLOG_FULL))
            return
        st = self._allocate(f.protocol, f.id, initiator=False)
        st.remote = f.channel
        st.remote_window = f.window
        st.send_credit = f.window
        st.phase = ChannelPhase.OPEN
        self._queue(Accept(f.channel, st.local, st.window))
        backlog.append(st)
        events.append(ChannelIncoming(f.protocol))
