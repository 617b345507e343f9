"""Standard input and output as trio streams, for commands that pipe bytes.

Pipes, sockets and terminals are driven non-blocking with ``trio.lowlevel.FdStream``
(which restores the blocking flag when closed). Regular files cannot be polled
(epoll refuses them), so redirections like ``< file`` and ``> file`` are read
and written in a worker thread instead.
"""

from __future__ import annotations

import os
import stat
import sys

import trio

from runtime.fdio import FdReader, write_now

__all__ = ["StdinSource", "StdoutSink"]

_READ_BYTES = 256 * 1024


def _is_regular_file(fd: int) -> bool:
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False


class StdinSource:
    """Reads standard input; ``receive_some`` returns b"" at end of input."""

    def __init__(self, fd: int | None = None) -> None:
        fd = sys.stdin.fileno() if fd is None else fd
        self._file_fd: int | None = None
        self._stream: trio.lowlevel.FdStream | None = None
        self._reader: FdReader | None = None
        if _is_regular_file(fd):
            self._file_fd = fd
        else:
            self._stream = trio.lowlevel.FdStream(os.dup(fd))
            # Waits first: a keystroke costs one pass, not a yield, a failed
            # read and a wait (see runtime.fdio).
            self._reader = FdReader(self._stream.fileno())

    async def receive_some(self) -> bytes:
        if self._reader is not None:
            return await self._reader.receive_some(_READ_BYTES)
        return await trio.to_thread.run_sync(os.read, self._file_fd, _READ_BYTES)

    async def aclose(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()


class StdoutSink:
    """Writes standard output; ``aclose`` closes fd 1 so readers see EOF at once."""

    def __init__(self, fd: int | None = None) -> None:
        self._fd = sys.stdout.fileno() if fd is None else fd
        sys.stdout.flush()
        self._regular = _is_regular_file(self._fd)
        self._stream = None if self._regular else trio.lowlevel.FdStream(self._fd)
        self._closed = False

    async def send_all(self, data: bytes | bytearray) -> None:
        """Write ``data``; waits only while the reader of our output is full.

        What the descriptor takes at once is written without yielding (the
        caller's next receive yields anyway): an echoed keystroke costs no
        scheduler pass here.
        """
        if self._stream is not None:
            await trio.lowlevel.checkpoint_if_cancelled()
            written = write_now(self._stream.fileno(), data) if data else 0
            if written < len(data):
                await self._stream.send_all(memoryview(data)[written:])
            return
        view = memoryview(data)
        while view:
            written = await trio.to_thread.run_sync(os.write, self._fd, view)
            view = view[written:]

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._stream is not None:
            await self._stream.aclose()
        else:
            os.close(self._fd)
        # Keep fd 1 valid for the interpreter's own shutdown flush.
        devnull = os.open(os.devnull, os.O_WRONLY)
        if devnull != self._fd:
            os.dup2(devnull, self._fd)
            os.close(devnull)
