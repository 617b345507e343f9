"""Message channels of a mux: the application's side of one channel.

A :class:`Channel` holds the core's :class:`~p2p.mux._core.ChannelState` and
the parking lots its waiting tasks sleep in; the :class:`~p2p.mux.Mux` driver
wakes them when the core reports messages, credit or closes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from p2p.mux._core import ChannelPhase, ChannelState
from p2p.mux._errors import ChannelBroken, ChannelClosed, MuxError, MuxUsageError
from p2p.mux._stream import ChannelStream

if TYPE_CHECKING:
    from p2p.mux._driver import Mux

__all__ = ["Channel", "ChannelStatistics"]


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
    #: Bytes we may still send before the peer grants more.
    send_credit_bytes: int
    #: Bytes received and not yet taken by ``receive()`` (always <= window).
    buffered_bytes: int
    #: Our receive window.
    receive_window_bytes: int


class Channel(trio.abc.Channel[bytes]):
    """One message channel of a :class:`Mux`; made by ``open_channel``/``accept``.

    Messages keep their boundaries. Sends wait for the peer's credit; receives
    return credit as they consume. Several tasks may ``send`` at once (they are
    served in order); only one task may ``receive`` at a time.
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
        n = len(value)
        if n > core.max_send_bytes(st):
            raise MuxUsageError(
                f"message of {n} bytes exceeds the limit of {core.max_send_bytes(st)}",
                code="MESSAGE_TOO_LARGE",
            )
        if (
            self._send_waiting
            or st.send_credit < (n or 1)
            or core._out_bytes + mux._writing_bytes >= mux._max_out
        ):
            raise trio.WouldBlock
        core.send_message(st, value)
        mux._kick()

    async def send(self, value: bytes) -> None:
        """Send one message, waiting for credit and outgoing buffer space.

        Args:
            value: the message (bytes-like); at most :attr:`max_message_bytes`.

        Raises:
            MuxUsageError: ``MESSAGE_TOO_LARGE``.
            ChannelClosed: we closed the channel or called :meth:`send_eof`.
            ChannelBroken: the peer closed the channel or the mux ended.
        """
        await trio.lowlevel.checkpoint()
        if type(value) is not bytes:
            value = bytes(value)
        try:
            self.send_nowait(value)
            return
        except trio.WouldBlock:
            pass
        mux = self._mux
        core = mux._core
        st = self._st
        cost = len(value) or 1
        self._send_waiting += 1
        try:
            async with self._send_lock:
                while True:
                    err = self._send_error()
                    if err is not None:
                        raise err
                    if st.send_credit < cost:
                        await self._send_lot.park()
                    elif core._out_bytes + mux._writing_bytes >= mux._max_out:
                        await mux._space_lot.park()
                    else:
                        break
                core.send_message(st, value)
                mux._kick()
        finally:
            self._send_waiting -= 1

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
        msg = mux._core.receive_message(st)
        if msg is not None:
            if mux._core._out:
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
        try:
            while True:
                try:
                    msg = self.receive_nowait()
                except trio.WouldBlock:
                    await self._recv_lot.park()
                    continue
                except (trio.EndOfChannel, MuxError):
                    await trio.lowlevel.cancel_shielded_checkpoint()
                    raise
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
            st.inbox.clear()
            st.inbox_bytes = 0
        if st.phase is ChannelPhase.FREED or st.abandoned:
            mux._live.pop(st, None)
        self._wake()

    def as_stream(self) -> ChannelStream:
        """Wrap this channel as a byte stream (see :class:`ChannelStream`)."""
        return ChannelStream(self)
