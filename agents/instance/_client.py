"""The client side of ``cosmicac-shell/1``: open a session on a connection.

``cosmicac shell`` (and the tests) call :func:`open_shell` on a connection to
a job's agent, then feed the session's input and read its output::

    async with await open_shell(connection, rows=40, cols=120) as session:
        await session.send_stdin(b"echo hi\\n")
        async for event in session:          # Stdout / Stderr until the process exits
            ...
        status = await session.wait_exit()   # Exit(code=..) or Exit(signal=..)
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import trio

from p2p.mux import Channel

from ._protocol import (
    MAX_DATA_BYTES,
    PROTOCOL,
    Error,
    Exit,
    Open,
    RemoteProtocolError,
    Resize,
    ShellError,
    Signal,
    Started,
    Stderr,
    Stdin,
    StdinEof,
    Stdout,
    decode_server,
    encode,
)

if TYPE_CHECKING:
    from p2p.connection import Connection

__all__ = ["ShellSession", "open_shell"]


async def open_shell(
    connection: Connection,
    *,
    argv: Sequence[str] | None = None,
    pty: bool | None = None,
    term: str = "xterm-256color",
    rows: int = 24,
    cols: int = 80,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
) -> ShellSession:
    """Open one shell session on ``connection`` (a channel of its own).

    Args:
        argv: the command; None runs the agent's shell.
        pty: run on a PTY; None means a PTY exactly when there is no ``argv``
            (``cosmicac shell`` vs ``cosmicac shell -- CMD ARGS``).
        term, rows, cols: the terminal (``pty`` mode).
        env: extra environment variables for the process.
        timeout_s: how long the agent may take to start the process.

    Raises:
        ShellError: the agent refused (``unauthorized``, ``busy``,
            ``spawn_failed``...) or did not answer in time (``timeout``).
        MuxError: the channel could not be opened (e.g. the connection was
            refused or ended).
    """
    mode = "pty" if (argv is None if pty is None else pty) else "exec"
    opened = Open(mode=mode, argv=None if argv is None else tuple(argv), term=term,
                  rows=rows, cols=cols, env=dict(env or {}))
    frame = encode(opened)  # a bad argument fails here, before the channel opens
    channel = await connection.open_channel(PROTOCOL, os.urandom(8))
    try:
        with trio.fail_after(timeout_s):
            await channel.send(frame)
            event = await _receive(channel)
    except trio.TooSlowError:
        channel.close_nowait()
        raise ShellError("timeout", f"no answer to OPEN in {timeout_s} s") from None
    except BaseException:
        channel.close_nowait()
        raise
    if isinstance(event, Error):
        channel.close_nowait()
        raise ShellError(event.code, event.message)
    if not isinstance(event, Started):
        channel.close_nowait()
        raise RemoteProtocolError(f"expected STARTED, got {type(event).__name__}")
    return ShellSession(channel, event.pid)


async def _receive(channel: Channel) -> Stdout | Stderr | Exit | Error | Started:
    try:
        return decode_server(await channel.receive())
    except trio.EndOfChannel:
        raise ShellError("hangup", "the agent ended the session without an exit status") from None


class ShellSession:
    """One running session: send input, iterate over its output, get its exit.

    Iterating yields :class:`Stdout` and :class:`Stderr` events (a PTY has only
    stdout) until the process exits; :meth:`wait_exit` then returns its
    :class:`Exit` (it discards output not yet read). Only one task may read.
    """

    def __init__(self, channel: Channel, pid: int) -> None:
        self.channel = channel
        #: The process id on the agent's side (for logs).
        self.pid = pid
        #: The exit status, once it arrived.
        self.exit: Exit | None = None

    async def send_stdin(self, data: bytes) -> None:
        """Send input (to the terminal, or the process's stdin); waits for credit."""
        # checkpoint=False: a caller's next step (reading more input) yields;
        # a yield here would cost a scheduler pass per keystroke.
        view = memoryview(data)
        for start in range(0, len(view), MAX_DATA_BYTES):
            await self.channel.send(encode(Stdin(bytes(view[start:start + MAX_DATA_BYTES]))),
                                    checkpoint=False)

    async def close_stdin(self) -> None:
        """End the input: closes a pipe, or types the terminal's EOF character."""
        await self.channel.send(encode(StdinEof()))

    async def resize(self, rows: int, cols: int) -> None:
        """Change the terminal's window size (the process gets SIGWINCH)."""
        await self.channel.send(encode(Resize(rows, cols)))

    async def signal(self, name: str) -> None:
        """Send a signal (``INT``, ``TERM``, ``HUP``...) to the session's process group."""
        await self.channel.send(encode(Signal(name)))

    async def receive(self) -> Stdout | Stderr | Exit:
        """The next event; :class:`Exit` is the last.

        Raises:
            ShellError: the agent reported an error or hung up.
            RemoteProtocolError: the agent sent an invalid frame.
        """
        if self.exit is not None:
            return self.exit
        event = await _receive(self.channel)
        if isinstance(event, Error):
            raise ShellError(event.code, event.message)
        if isinstance(event, Started):
            raise RemoteProtocolError("STARTED twice")
        if isinstance(event, Exit):
            self.exit = event
        return event

    def __aiter__(self) -> ShellSession:
        # An iterator, not an async generator: a loop may stop early (read until
        # a prompt) and go on later with nothing left to finalise.
        return self

    async def __anext__(self) -> Stdout | Stderr:
        event = await self.receive()
        if isinstance(event, Exit):
            raise StopAsyncIteration
        return event

    async def wait_exit(self) -> Exit:
        """Wait for the process to end; return how it ended."""
        while self.exit is None:
            await self.receive()
        return self.exit

    async def aclose(self) -> None:
        """Close the channel; a process still running is hung up on (SIGHUP)."""
        await self.channel.aclose()

    async def __aenter__(self) -> ShellSession:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

