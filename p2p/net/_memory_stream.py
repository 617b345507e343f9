"""In-memory byte streams with latency and a bounded buffer, on trio's clock.

A connection is two one-way :class:`_Pipe`\\ s, one per direction. A pipe is
a FIFO of ``(due, chunk)``: ``send_all`` stamps each chunk with
``now + latency_s`` and waits while ``capacity_bytes`` are unread (the
receiver's window, as a TCP send blocks on a full socket buffer); the reader
sleeps until the head chunk is due. Room frees the moment the reader takes
bytes, with no latency (an ACK that costs nothing: the one simplification
against TCP, which needs a round trip to open its window). End of stream
(``send_eof`` or ``aclose``) travels with the same latency behind the data.

Every wait is on trio's clock, so under the autojump clock nothing sleeps in
real time. Like trio's ``SocketStream`` and ``MemoryStream``, a stream
raises ``trio.BusyResourceError`` when two tasks send (or two receive) at
once, ``trio.ClosedResourceError`` after *we* closed it and
``trio.BrokenResourceError`` when the other side went away: it closed its
end (our sends break) or the connection was reset (:meth:`MemoryStream.abort`,
both directions break).
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable

import trio

__all__ = ["DEFAULT_STREAM_BUFFER_BYTES", "MemoryStream", "memory_stream_pair"]

#: Unread bytes one direction may hold before ``send_all`` waits. 256 KiB is
#: in the range of Linux's default TCP buffers (``tcp_wmem`` 16 KiB-4 MiB,
#: autotuned), large enough that the secret stream's 64 KiB frames flow.
DEFAULT_STREAM_BUFFER_BYTES = 256 * 1024
_DEFAULT_RECEIVE_BYTES = 64 * 1024


class _Pipe:
    """One direction of a connection: chunks in flight, end of stream, resets."""

    def __init__(self, latency_s: float, capacity_bytes: int) -> None:
        self.latency_s = latency_s
        self.capacity_bytes = capacity_bytes
        #: (due time, chunk), oldest first; bounded in bytes by capacity_bytes.
        self.chunks: deque[tuple[float, bytes]] = deque()
        self.buffered = 0
        #: When the end of stream reaches the reader (set once).
        self.eof_due: float | None = None
        #: The reader closed its end: writes break.
        self.reader_gone = False
        #: The connection was reset: both ends break.
        self.reset = False
        #: Woken on every change; waiters re-check their condition.
        self.changed = trio.lowlevel.ParkingLot()

    def _last_due(self) -> float:
        now = trio.current_time() + self.latency_s
        if self.chunks:
            now = max(now, self.chunks[-1][0])
        return now

    def push(self, chunk: bytes) -> None:
        self.chunks.append((self._last_due(), chunk))
        self.buffered += len(chunk)
        self.changed.unpark_all()

    def end(self) -> None:
        if self.eof_due is None:
            self.eof_due = self._last_due()
            self.changed.unpark_all()

    def take(self, max_bytes: int) -> bytes:
        """Due bytes, up to ``max_bytes`` (b"" when none are due yet)."""
        now = trio.current_time()
        parts = []
        wanted = max_bytes
        while wanted and self.chunks and self.chunks[0][0] <= now:
            due, chunk = self.chunks[0]
            if len(chunk) <= wanted:
                self.chunks.popleft()
                parts.append(chunk)
                wanted -= len(chunk)
            else:
                parts.append(chunk[:wanted])
                self.chunks[0] = (due, chunk[wanted:])
                wanted = 0
        data = b"".join(parts)
        if data:
            self.buffered -= len(data)
            self.changed.unpark_all()
        return data

    def next_due(self) -> float:
        """When the reader next has something (data or end); inf if nothing is coming."""
        if self.chunks:
            return self.chunks[0][0]
        if self.eof_due is not None:
            return self.eof_due
        return float("inf")

    def drop_reader(self) -> None:
        self.reader_gone = True
        self.chunks.clear()
        self.buffered = 0
        self.changed.unpark_all()

    def break_(self) -> None:
        self.reset = True
        self.chunks.clear()
        self.buffered = 0
        self.changed.unpark_all()


class MemoryStream(trio.abc.HalfCloseableStream):
    """One end of an in-memory connection. Build pairs with :func:`memory_stream_pair`.

    ``on_close`` (if given) runs once when this end is closed or reset, for
    the owner's bookkeeping (a host freeing an ephemeral port).
    """

    def __init__(
        self,
        outgoing: _Pipe,
        incoming: _Pipe,
        *,
        local_address: tuple[str, int] | None = None,
        remote_address: tuple[str, int] | None = None,
    ) -> None:
        self._out = outgoing
        self._in = incoming
        self.local_address = local_address
        self.remote_address = remote_address
        self._closed = False
        self._eof_sent = False
        self._sending = False
        self._receiving = False
        self.on_close: Callable[[], None] | None = None

    # -- send side -------------------------------------------------------------

    def _claim_send(self) -> None:
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._sending = True

    def _check_send(self) -> None:
        if self._closed or self._eof_sent:
            raise trio.ClosedResourceError("this stream is closed for sending")
        if self._out.reset or self._out.reader_gone:
            raise trio.BrokenResourceError("the other side closed or reset the connection")

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self._claim_send()
        try:
            await trio.lowlevel.checkpoint()
            self._check_send()
            view = memoryview(data).cast("B")
            pipe = self._out
            while view:
                room = pipe.capacity_bytes - pipe.buffered
                if room <= 0:
                    await pipe.changed.park()
                    self._check_send()
                    continue
                pipe.push(bytes(view[:room]))
                view = view[room:]
        finally:
            self._sending = False

    async def wait_send_all_might_not_block(self) -> None:
        self._claim_send()
        try:
            await trio.lowlevel.checkpoint()
            pipe = self._out
            while True:
                if self._closed or self._eof_sent:
                    raise trio.ClosedResourceError("this stream is closed for sending")
                if pipe.reset or pipe.reader_gone or pipe.buffered < pipe.capacity_bytes:
                    return
                await pipe.changed.park()
        finally:
            self._sending = False

    async def send_eof(self) -> None:
        self._claim_send()
        try:
            await trio.lowlevel.checkpoint()
            if self._closed:
                raise trio.ClosedResourceError("this stream is closed")
            self._eof_sent = True
            self._out.end()
        finally:
            self._sending = False

    # -- receive side ----------------------------------------------------------

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if max_bytes is None:
            max_bytes = _DEFAULT_RECEIVE_BYTES
        else:
            max_bytes = operator.index(max_bytes)
            if max_bytes < 1:
                raise ValueError("max_bytes must be >= 1")
        if self._receiving:
            raise trio.BusyResourceError("another task is receiving on this stream")
        self._receiving = True
        try:
            await trio.lowlevel.checkpoint()
            pipe = self._in
            while True:
                if self._closed:
                    raise trio.ClosedResourceError("this stream is closed")
                if pipe.reset:
                    raise trio.BrokenResourceError("the connection was reset")
                data = pipe.take(max_bytes)
                if data:
                    return data
                due = pipe.next_due()
                now = trio.current_time()
                if not pipe.chunks and pipe.eof_due is not None and due <= now:
                    return b""
                with trio.move_on_at(due):
                    await pipe.changed.park()
        finally:
            self._receiving = False

    # -- closing ---------------------------------------------------------------

    def _close_now(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._out.end()
        self._in.drop_reader()
        if self.on_close is not None:
            callback, self.on_close = self.on_close, None
            callback()

    async def aclose(self) -> None:
        """Close this end: the other side reads the end of stream, its sends break."""
        self._close_now()
        await trio.lowlevel.checkpoint()

    def abort(self) -> None:
        """Reset the connection (both ends break), as a crashed host's TCP does."""
        self._out.break_()
        self._in.break_()
        self._close_now()

    @property
    def closed(self) -> bool:
        return self._closed


def memory_stream_pair(
    *,
    latency_s: float = 0.0,
    reverse_latency_s: float | None = None,
    capacity_bytes: int = DEFAULT_STREAM_BUFFER_BYTES,
    left_address: tuple[str, int] | None = None,
    right_address: tuple[str, int] | None = None,
) -> tuple[MemoryStream, MemoryStream]:
    """A connected pair ``(left, right)`` of in-memory half-closeable streams.

    Args:
        latency_s: one-way delay of bytes from left to right, on trio's clock.
        reverse_latency_s: from right to left (default: ``latency_s``).
        capacity_bytes: unread bytes one direction holds before ``send_all`` waits.
        left_address, right_address: what each end reports as its
            ``local_address``; the other end reports it as ``remote_address``.

    Raises:
        ValueError: a negative latency or a capacity below 1.
    """
    back = latency_s if reverse_latency_s is None else reverse_latency_s
    if latency_s < 0 or back < 0:
        raise ValueError("latency must not be negative")
    if capacity_bytes < 1:
        raise ValueError("capacity_bytes must be at least 1")
    forward_pipe = _Pipe(latency_s, capacity_bytes)
    backward_pipe = _Pipe(back, capacity_bytes)
    left = MemoryStream(forward_pipe, backward_pipe, local_address=left_address,
                        remote_address=right_address)
    right = MemoryStream(backward_pipe, forward_pipe, local_address=right_address,
                         remote_address=left_address)
    return left, right
