"""Forwarding bytes between the two sockets of a pair, blindly.

Theory of operation
-------------------
One task per direction reads a chunk, hands it to the other socket with
``send_all`` and only then reads again, so each direction holds at most one
chunk: a reader that stops reading stalls its writer through TCP's own flow
control instead of growing our memory. Reads start at 64 KiB and grow to the
current chunk size (``max_read()``, which shrinks as more pairs share the
relay's buffer budget) while they come back full, as the secret stream's own
reads do (see ``p2p/noise/_config.py``: a read buffer of 128 KiB or more costs
an mmap() in glibc, worth it only for bulk traffic).

splice(2) (socket -> pipe -> socket, no copy through Python) was tried and
measured on this project's 2-CPU VM (bench/relay.py): the relay spent the same
CPU per GB (one wake-up per ~64 KiB arriving dominates, not the copies),
relayed throughput came out ~10% lower, and only the RSS with 100 streaming
pairs was lower (60 against 90-110 MB), at four more descriptors per pair. The
copying path is kept for being simpler and no slower.

End of stream is propagated as a half-close: EOF from one side becomes
``send_eof()`` (``shutdown(SHUT_WR)``) towards the other, and the other
direction goes on until it ends too. A broken socket in either direction ends
both. A watchdog ends the pair when no byte has moved either way for
``idle_timeout_s``; live pairs carry the end-to-end keep-alives (every 5 s),
so only dead or abandoned pairs reach it.

Nothing here parses the bytes: the relay sees only the peers' Noise frames.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

import trio

__all__ = ["SpliceEnd", "splice"]

#: First read size of a direction, and the size it falls back to after a read
#: that did not fill its buffer (below glibc's mmap threshold).
SMALL_READ_BYTES = 64 * 1024


class SpliceEnd(Enum):
    """Why a splice ended."""

    #: Both directions reached end of stream.
    CLOSED = "closed"
    #: A socket broke (reset, or closed while we wrote).
    BROKEN = "broken"
    #: No byte moved either way for the idle timeout.
    IDLE = "idle"


class _Splice:
    __slots__ = ("end", "last_activity", "open_directions", "scope")

    def __init__(self, scope: trio.CancelScope) -> None:
        self.scope = scope
        self.last_activity = trio.current_time()
        self.open_directions = 2
        self.end = SpliceEnd.CLOSED

    def stop(self, end: SpliceEnd) -> None:
        if not self.scope.cancel_called:
            self.end = end
            self.scope.cancel()


async def _pump(
    splice: _Splice,
    source: trio.abc.HalfCloseableStream,
    sink: trio.abc.HalfCloseableStream,
    direction: int,
    max_read: Callable[[], int],
    on_bytes: Callable[[int], None],
    observer: Callable[[int, bytes], None] | None,
) -> None:
    size = min(SMALL_READ_BYTES, max_read())
    try:
        while True:
            data = await source.receive_some(size)
            if not data:
                break
            splice.last_activity = trio.current_time()
            count = len(data)
            on_bytes(count)
            if observer is not None:
                observer(direction, data)
            await sink.send_all(data)
            limit = max_read()
            size = limit if count >= size else min(SMALL_READ_BYTES, limit)
        await sink.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        splice.stop(SpliceEnd.BROKEN)
        return
    splice.open_directions -= 1
    if splice.open_directions == 0:
        splice.stop(SpliceEnd.CLOSED)


async def _watchdog(splice: _Splice, idle_timeout_s: float) -> None:
    while True:
        deadline = splice.last_activity + idle_timeout_s
        if trio.current_time() >= deadline:
            splice.stop(SpliceEnd.IDLE)
            return
        await trio.sleep_until(deadline)


async def splice(
    initiator: trio.abc.HalfCloseableStream,
    responder: trio.abc.HalfCloseableStream,
    *,
    idle_timeout_s: float,
    max_read: Callable[[], int],
    on_bytes: Callable[[int], None],
    observer: Callable[[int, bytes], None] | None = None,
) -> SpliceEnd:
    """Forward bytes both ways until both directions end, one breaks, or idle.

    Args:
        initiator, responder: the two attached sockets (the caller closes them).
        idle_timeout_s: end the pair after this long without a byte either way.
        max_read: the current largest read per direction.
        on_bytes: called with the size of every chunk forwarded (counters).
        observer: if given, called with ``(direction, chunk)`` for every chunk
            (0 = initiator to responder, 1 = back); for tests that check what
            the relay could see.

    Returns:
        Why it ended.
    """
    async with trio.open_nursery() as nursery:
        state = _Splice(nursery.cancel_scope)
        nursery.start_soon(_pump, state, initiator, responder, 0, max_read, on_bytes, observer)
        nursery.start_soon(_pump, state, responder, initiator, 1, max_read, on_bytes, observer)
        nursery.start_soon(_watchdog, state, idle_timeout_s)
    return state.end
