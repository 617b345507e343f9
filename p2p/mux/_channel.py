"""Message channels of a mux: the application's side of one channel.

A :class:`Channel` holds the core's :class:`~p2p.mux._core.ChannelState` and
the parking lots its waiting tasks sleep in; the :class:`~p2p.mux.Mux` driver
wakes them when the core reports messages, credit or closes.

Messages reach the application one of two ways:

* pull (the default): the reader task wakes the task in :meth:`Channel.receive`,
  which takes the message (one scheduler pass per wake-up);
* push: after :meth:`Channel.set_message_handler`, the reader task calls the
  handler with each message as soon as it is parsed, with no task switch. The
  handler takes the message, so credit goes back to the peer at once: a pushed
  channel has no credit backpressure of its own, and the handler must bound what
  it keeps (the RPC layer does: calls in flight, stream item credit).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from p2p.mux._core import ChannelPhase, ChannelState
from p2p.mux._credit import SendWait
from p2p.mux._errors import ChannelBroken, ChannelClosed, MuxError, MuxUsageError
from p2p.mux._stream import ChannelStream

if TYPE_CHECKING:
    from p2p.mux._driver import Mux

__all__ = ["Channel", "ChannelStatistics", "MessageHandler"]

logger = logging.getLogger(__name__)

_READY = SendWait.NONE
_OPEN = ChannelPhase.OPEN

#: A push-delivery callback: called with each message, in the mux's reader task.
MessageHandler = Callable[[bytes], None]


@dataclass(frozen=True, slots=True)
class ChannelStatistics:
    """A snapshot of one channel's counters."""

    protocol: str
    id: bytes
    #: Message payload bytes and messages we sent / received.
    bytes_sent: int
    messages_sent: int
    bytes_received: int
    messages_received: int
    #: Credit we may still use before the peer grants more (a message costs
    #: ``len + 64``; the mux-wide budget may be the tighter limit).
    send_credit_bytes: int
    #: Messages received and not yet taken by ``receive()``, in credit bytes
    #: (``len + 64`` each; always <= window). ``MuxStatistics.buffered_bytes``
    #: sums them over the mux.
    buffered_bytes: int
    #: Our receive window.
    receive_window_bytes: int


class Channel(trio.abc.Channel[bytes]):
    """One message channel of a :class:`Mux`; made by ``open_channel``/``accept``.

    Messages keep their boundaries. Sends wait for the peer's credit; receives
    return credit as they consume. Several tasks may ``send`` at once (they are
    served in order); only one task may ``receive`` at a time. Messages may
    instead be pushed to a callback (:meth:`set_message_handler`).
    """

    def __init__(self, mux: Mux, state: ChannelState) -> None:
        self._mux = mux
        self._st = state
        self._recv_lot = trio.lowlevel.ParkingLot()
        self._send_lot = trio.lowlevel.ParkingLot()
        self._send_lock = trio.StrictFIFOLock()
        self._send_waiting = 0
        self._receiving = False
        self._opened = trio.Event()
        self._open_error: MuxError | None = None
        self._on_message: MessageHandler | None = None

    def __repr__(self) -> str:
        return f"<Channel {self._st.protocol!r} id={self._st.id.hex()} local={self._st.local}>"

    @property
    def protocol(self) -> str:
        """The protocol name the channel was opened with."""
        return self._st.protocol

    @property
    def id(self) -> bytes:
        """The channel id (``b""`` if none was given)."""
        return self._st.id

    @property
    def max_message_bytes(self) -> int:
        """The largest message :meth:`send` accepts (ours and the peer's limit)."""
        return self._mux._core.max_send_bytes(self._st)

    def statistics(self) -> ChannelStatistics:
        """Return a snapshot of this channel's counters."""
        st = self._st
        return ChannelStatistics(
            protocol=st.protocol,
            id=st.id,
            bytes_sent=st.bytes_sent,
            messages_sent=st.messages_sent,
            bytes_received=st.bytes_received,
            messages_received=st.messages_received,
            send_credit_bytes=st.send_credit,
            buffered_bytes=st.inbox_bytes,
            receive_window_bytes=st.window,
        )

    def _wake(self) -> None:
        self._recv_lot.unpark_all()
        self._send_lot.unpark_all()

    def _send_error(self) -> BaseException | None:
        st = self._st
        if st.app_closed:
            return ChannelClosed("channel was closed", code="CHANNEL_CLOSED")
        if st.sent_end:
            return ChannelClosed("send_eof() was called on this channel", code="CHANNEL_ENDED")
        mux = self._mux
        if mux._reason is not None:
            return mux._broken_error()
        if st.got_close or st.phase is not ChannelPhase.OPEN:
            return ChannelBroken("the peer closed the channel", code="REMOTE_CLOSED")
        return None

    def _check_size(self, value: bytes) -> None:
        limit = self._mux._core.max_send_bytes(self._st)
        if len(value) > limit:
            raise MuxUsageError(
                f"message of {len(value)} bytes exceeds the limit of {limit}",
                code="MESSAGE_TOO_LARGE",
            )

    def set_message_handler(self, handler: MessageHandler | None) -> None:
        """Deliver messages by calling ``handler(message)`` instead of via :meth:`receive`.

        The handler runs synchronously in the mux's reader task, once per
        message and in order, as soon as the message is parsed (messages already
        buffered are handed to it now, before this returns). It must not block
        and should be quick: the reader parses nothing else meanwhile. Each
        message's credit goes back to the peer as the handler gets it, so the
        handler must bound what it keeps. If it raises, the error is logged and
        the channel is closed (the mux stays up).

        While a handler is set, :meth:`receive` returns no messages: it waits
        until the peer ends or closes the channel or the mux ends, and raises as
        usual (``trio.EndOfChannel``, :class:`ChannelBroken`, ...), so a task can
        use it to wait for the end. ``None`` goes back to pull delivery.

        Args:
            handler: the callback, or None.
        """
        self._on_message = handler
        if handler is not None:
            self._push(None)
        else:
            self._recv_lot.unpark_all()

    def _push(self, limit: int | None) -> bool:
        """Hand buffered messages to the handler: all, or at most ``limit``.

        Called by the reader task (and by :meth:`set_message_handler`).
        ``receive_message`` returns credit as due.

        Returns:
            True if messages are left for a later call (``limit`` reached).
        """
        st = self._st
        core = self._mux._core
        while True:
            handler = self._on_message
            if handler is None:
                if st.inbox:
                    self._recv_lot.unpark_all()  # back to pull delivery
                return False
            if limit is not None:
                if limit <= 0:
                    return bool(st.inbox)
                limit -= 1
            msg = core.receive_message(st)
            if msg is None:
                if core.outgoing_bytes:
                    self._mux._kick()  # a CREDIT frame (the reader task kicks too)
                if st.remote_ended or st.got_close:
                    self._recv_lot.unpark_all()  # receive() can now raise the end
                return False
            try:
                handler(msg)
            except Exception:
                logger.exception("mux.message_handler_failed channel=%r", self)
                self._on_message = None
                self.close_nowait()
                return False

    def send_nowait(self, value: bytes) -> None:
        """Send one message if credit and buffer room allow it right now.

        Raises:
            trio.WouldBlock: no credit or buffer room now, or earlier sends are
                still waiting (order is kept); use :meth:`send`.
            MuxUsageError, ChannelClosed, ChannelBroken: as :meth:`send`.
        """
        if type(value) is not bytes:
            value = bytes(value)
        mux = self._mux
        core = mux._core
        st = self._st
        err = self._send_error()
        if err is not None:
            raise err
        self._check_size(value)
        if (
            self._send_waiting
            or core.flow.send_wait(
                st.send_credit, len(value), core.outgoing_bytes + mux._writing_bytes
            ) is not _READY
        ):
            raise trio.WouldBlock
        core.send_message(st, value)
        mux._kick()

    async def send(self, value: bytes, *, checkpoint: bool = True, more: bool = False) -> None:
        """Send one message, waiting for credit and outgoing buffer space.

        When nothing is being written and ``more`` is not given, the message is
        written to the stream from this task at once (no hand-off to the writer
        task); otherwise it is queued for the writer, which sends all queued
        frames in one write.

        Args:
            value: the message (bytes-like); at most :attr:`max_message_bytes`.
            checkpoint: if False and the message could be queued at once, return
                without yielding to the scheduler (cancellation is still checked
                on entry). For callers that reach a checkpoint right after
                anyway (e.g. to wait for a reply); saves a scheduler pass.
            more: a hint, like ``MSG_MORE``: other messages are about to be
                sent (by this or other tasks), so leave this one to the writer
                task, which sends them all in one write, rather than writing it
                from this task now.

        Raises:
            MuxUsageError: ``MESSAGE_TOO_LARGE``.
            ChannelClosed: we closed the channel or called :meth:`send_eof`.
            ChannelBroken: the peer closed the channel or the mux ended (also
                if this send was cancelled part-way through writing: that ends
                the mux, code ``SEND_CANCELLED``).
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if type(value) is not bytes:
            value = bytes(value)
        mux = self._mux
        core = mux._core
        st = self._st
        size = len(value)
        if (
            not self._send_waiting
            and st.phase is _OPEN
            and not (st.app_closed or st.sent_end or st.got_close)
            and mux._reason is None
            and core.flow.send_wait(
                st.send_credit, size, core.outgoing_bytes + mux._writing_bytes
            ) is _READY
        ):
            core.send_message(st, value)  # raises MESSAGE_TOO_LARGE itself
            # mux._send_queued, inlined (once per message).
            rest = mux._send_fast(more)
            if rest is None:
                if checkpoint:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return
            await mux._write_inline(rest or None)
            return
        self._send_waiting += 1
        try:
            async with self._send_lock:
                while True:
                    err = self._send_error()
                    if err is not None:
                        raise err
                    self._check_size(value)
                    wait = core.send_wait(st, size, mux._writing_bytes)
                    if wait is _READY:
                        break
                    await self._wait_for(wait)
                core.send_message(st, value)
        finally:
            self._send_waiting -= 1
        await mux._send_queued(checkpoint=False, more=more)  # we waited: already a checkpoint

    async def _wait_for(self, wait: SendWait) -> None:
        """Park until what ``wait`` names may have changed (then check again)."""
        if wait is SendWait.CHANNEL_CREDIT:
            await self._send_lot.park()
        elif wait is SendWait.MUX_BUDGET:
            await self._wait_budget()
        else:
            await self._mux._space_lot.park()

    async def _wait_budget(self) -> None:
        """Park until the peer grants mux credit (or anything else wakes the lot).

        The channel stays listed until the next MUX_CREDIT even if this task is
        cancelled: another task of the channel may still wait, and a spurious
        wake-up only makes it check again.
        """
        mux = self._mux
        mux._budget_waits += 1
        mux._budget_waiters[self] = None
        await self._send_lot.park()

    def receive_nowait(self) -> bytes:
        """Take a message if one is buffered.

        Raises:
            trio.WouldBlock: nothing buffered yet.
            trio.EndOfChannel: the peer ended its direction and all was read.
            ChannelClosed: we closed the channel.
            ChannelBroken: the mux ended and all that arrived was read.
        """
        st = self._st
        if st.app_closed:
            raise ChannelClosed("channel was closed", code="CHANNEL_CLOSED")
        mux = self._mux
        if self._on_message is not None and st.inbox and mux._reason is None:
            raise trio.WouldBlock  # the reader task is still pushing these
        msg = mux._core.receive_message(st)
        if msg is not None:
            if mux._core.outgoing_bytes:
                mux._kick()
            return msg
        if st.remote_ended or st.got_close:
            raise trio.EndOfChannel
        if mux._reason is not None:
            raise mux._broken_error()
        raise trio.WouldBlock

    async def receive(self) -> bytes:
        """Wait for the next message.

        Returns:
            The message, exactly as sent.

        Raises:
            trio.EndOfChannel: the peer ended its direction (or closed the
                channel) and every message was read.
            ChannelClosed: we closed the channel.
            ChannelBroken: the mux ended and every message was read.
            trio.BusyResourceError: another task is receiving.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._receiving:
            raise trio.BusyResourceError("another task is already receiving on this channel")
        self._receiving = True
        waited = False  # parking is a schedule point: no second one after it
        try:
            while True:
                try:
                    msg = self.receive_nowait()
                except trio.WouldBlock:
                    await self._recv_lot.park()
                    waited = True
                    continue
                except (trio.EndOfChannel, MuxError):
                    if not waited:
                        await trio.lowlevel.cancel_shielded_checkpoint()
                    raise
                if not waited:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return msg
        finally:
            self._receiving = False

    async def send_eof(self) -> None:
        """End our direction: the peer's ``receive`` raises EndOfChannel after the rest.

        Idempotent. Messages already sent are still delivered.

        Raises:
            ChannelClosed: we closed the channel.
            ChannelBroken: the mux ended.
        """
        await trio.lowlevel.checkpoint()
        st = self._st
        if st.app_closed:
            raise ChannelClosed("channel was closed", code="CHANNEL_CLOSED")
        if st.sent_end:
            return
        if self._mux._reason is not None:
            raise self._mux._broken_error()
        self._mux._core.send_end(st)
        self._mux._kick()
        self._send_lot.unpark_all()

    async def aclose(self) -> None:
        """Close the channel both ways; buffered messages are dropped. Idempotent."""
        self.close_nowait()
        await trio.lowlevel.checkpoint()

    def close_nowait(self) -> None:
        """Close the channel without waiting (see :meth:`aclose`)."""
        st = self._st
        if st.app_closed:
            return
        mux = self._mux
        if mux._reason is None:
            mux._core.close(st)
            mux._kick()
        else:
            st.app_closed = True
            mux._core.drop_inbox(st)
        mux._budget_waiters.pop(self, None)
        if st.phase is ChannelPhase.FREED or st.abandoned:
            mux._live.pop(st, None)
        self._wake()

    def as_stream(self) -> ChannelStream:
        """Wrap this channel as a byte stream (see :class:`ChannelStream`)."""
        return ChannelStream(self)
