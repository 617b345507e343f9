"""A byte stream on top of a message channel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from p2p.mux._credit import SendWait
from p2p.mux._errors import ChannelClosed

if TYPE_CHECKING:
    from p2p.mux._driver import Channel

__all__ = ["ChannelStream"]


class ChannelStream(trio.abc.HalfCloseableStream):
    """:class:`trio.abc.HalfCloseableStream` over a mux :class:`Channel`.

    ``send_all`` cuts data into messages of at most the channel's message limit;
    ``receive_some`` returns bytes from the current message, keeping any rest for
    the next call. ``send_eof`` ends our direction; ``aclose`` closes the channel.

    Args:
        channel: the channel; the stream owns it from now on.
    """

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self._rest = b""
        self._rest_pos = 0
        self._sending = False
        self._receiving = False
        self._eof_sent = False

    def _enter_send(self) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._sending = True

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send all of ``data`` (waiting for credit as needed).

        Raises:
            trio.BusyResourceError: another task is sending.
            trio.ClosedResourceError: we closed the stream or sent EOF.
            trio.BrokenResourceError: the peer closed the channel or the mux ended.
        """
        self._enter_send()
        try:
            if self._eof_sent:
                await trio.lowlevel.checkpoint()
                raise ChannelClosed("send_eof() was called", code="CHANNEL_ENDED")
            ch = self.channel
            with memoryview(data) as view:
                view = view.cast("B")
                total = len(view)
                if total == 0:
                    await trio.lowlevel.checkpoint()
                    if ch._st.app_closed:
                        raise ChannelClosed("stream was closed", code="CHANNEL_CLOSED")
                    return
                limit = max(1, ch.max_message_bytes)
                pos = 0
                while pos < total:
                    await ch.send(bytes(view[pos : pos + limit]))
                    pos += limit
        finally:
            self._sending = False

    async def wait_send_all_might_not_block(self) -> None:
        """Wait until channel credit, mux budget and buffer room allow a send (or it ended)."""
        self._enter_send()
        try:
            ch = self.channel
            while True:
                if ch._st.app_closed or self._eof_sent:
                    await trio.lowlevel.checkpoint()
                    raise ChannelClosed("stream was closed", code="CHANNEL_CLOSED")
                if ch._send_error() is not None:
                    await trio.lowlevel.checkpoint()
                    return
                wait = ch._mux._core.send_wait(ch._st, 1, ch._mux._writing_bytes)
                if wait is SendWait.NONE:
                    await trio.lowlevel.checkpoint()
                    return
                await ch._wait_for(wait)
        finally:
            self._sending = False

    async def send_eof(self) -> None:
        """End our direction; the peer reads b"" after the data. Idempotent."""
        self._enter_send()
        try:
            self._eof_sent = True
            await self.channel.send_eof()
        finally:
            self._sending = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        """Return up to ``max_bytes`` bytes, or b"" once the peer ended its direction.

        Raises:
            trio.BusyResourceError: another task is receiving.
            trio.ClosedResourceError: we closed the stream.
            trio.BrokenResourceError: the mux ended.
        """
        if max_bytes is not None:
            if not isinstance(max_bytes, int):
                raise TypeError("max_bytes must be an int or None")
            if max_bytes < 1:
                raise ValueError("max_bytes must be >= 1")
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this stream")
        self._receiving = True
        try:
            if self.channel._st.app_closed:
                await trio.lowlevel.checkpoint()
                raise ChannelClosed("stream was closed", code="CHANNEL_CLOSED")
            if self._rest_pos >= len(self._rest):
                try:
                    self._rest = await self.channel.receive()
                except trio.EndOfChannel:
                    return b""
                self._rest_pos = 0
            else:
                await trio.lowlevel.checkpoint()
            rest, pos = self._rest, self._rest_pos
            if max_bytes is None or (pos == 0 and max_bytes >= len(rest)):
                self._rest, self._rest_pos = b"", 0
                return rest[pos:] if pos else rest
            end = pos + max_bytes
            self._rest_pos = end
            return rest[pos:end]
        finally:
            self._receiving = False

    async def aclose(self) -> None:
        """Close the stream (and its channel). Idempotent."""
        self._rest = b""
        self._rest_pos = 0
        await self.channel.aclose()
