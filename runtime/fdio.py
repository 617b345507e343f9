"""Reading and writing a non-blocking descriptor (a terminal, a pipe) at one
scheduler pass per message.

``trio.lowlevel.FdStream`` yields before every read and tries the read
first: for a terminal that delivers one keystroke at a time, each read is a
pass that does nothing, a read that fails with EAGAIN, a wait, and the read
that succeeds. :class:`FdReader` waits first and reads once; only after a
read that filled its buffer (bulk output, where more is likely waiting) does
it try the read first, after a plain checkpoint. :func:`write_now` writes
what the descriptor takes at once, without yielding, so a sender whose next
step waits anyway saves the pass of a ``send_all``.

Both work on the descriptor of an ``FdStream`` that keeps owning it: closing
that stream wakes a waiting reader with ``trio.ClosedResourceError``
(``notify_closing``), as it wakes the stream's own readers.
"""

from __future__ import annotations

import errno
import os

import trio

__all__ = ["FdReader", "write_now"]

#: How long a reader of a descriptor epoll refuses sleeps when it had nothing.
_UNPOLLABLE_RETRY_S = 0.01


class FdReader:
    """``receive_some`` for a non-blocking descriptor; one task reads at a time.

    Args:
        fd: the descriptor (left open; its owner closes it).

    Errors as ``FdStream``'s: ``trio.ClosedResourceError`` once the descriptor
    is closed, ``trio.BrokenResourceError`` for any other failed read (a
    terminal's master reads EIO once no process holds its other end).
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        #: The last read filled the buffer: data is likely waiting, read first.
        self._full = False
        #: epoll refuses the descriptor (EPERM: ``/dev/null``, a device that
        #: never blocks): read first, and retry after a short sleep.
        self._unpollable = False

    async def _wait(self) -> None:
        if not self._unpollable:
            try:
                await trio.lowlevel.wait_readable(self._fd)
                return
            except PermissionError:
                self._unpollable = True
        await trio.sleep(_UNPOLLABLE_RETRY_S)

    async def receive_some(self, max_bytes: int) -> bytes:
        fd = self._fd
        if self._full or self._unpollable:
            await trio.lowlevel.checkpoint()
        else:
            await self._wait()
        while True:
            try:
                data = os.read(fd, max_bytes)
            except BlockingIOError:
                await self._wait()
                continue
            except OSError as exc:
                if exc.errno == errno.EBADF:
                    raise trio.ClosedResourceError("the descriptor was closed") from None
                raise trio.BrokenResourceError(f"reading failed: {exc}") from exc
            self._full = len(data) >= max_bytes
            return data


def write_now(fd: int, data: bytes | memoryview) -> int:
    """Write what ``fd`` takes now, without waiting or yielding.

    Returns:
        The bytes written (0 if the descriptor is full).

    Raises:
        trio.ClosedResourceError / trio.BrokenResourceError: as ``send_all``.
    """
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
    except OSError as exc:
        if exc.errno == errno.EBADF:
            raise trio.ClosedResourceError("the descriptor was closed") from None
        raise trio.BrokenResourceError(f"writing failed: {exc}") from exc
