"""The shell service: serves ``cosmicac-shell/1`` sessions to authorised keys.

The agent of a GPU Container Job adds a :class:`ShellService` to its swarm.
Who may open a shell is decided by the peer's Noise-proven key twice: the
service's firewall (:meth:`ShellService.allows`) refuses an unknown key before
the connection carries any channel, and each channel re-checks the key before
it reads a byte, so a key allowed on the connection for another reason (the
worker, a relay) still gets no shell.

Each session is one channel and one task; its process runs in a session of its
own (so a signal or a hang-up reaches the whole process group):

* ``pty``: a real PTY (the client's TERM and window size; RESIZE sets the size
  on the master, and the kernel sends SIGWINCH to the foreground group);
  stdout and stderr are the terminal's one stream;
* ``exec``: ``argv`` on three pipes, stdout and stderr kept apart.

Backpressure: a pump reads the next chunk from the PTY or a pipe only after the
channel accepted the last one, so a slow client slows the process (it blocks
on a full terminal or pipe), and nothing piles up here.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import signal
import struct
import subprocess
import termios
from collections.abc import Callable
from typing import TYPE_CHECKING

import trio

from p2p.host import Service
from p2p.mux import Channel, MuxError
from runtime.fdio import FdReader

from ._descendants import Descendants, session_preexec
from ._protocol import (
    MAX_DATA_BYTES,
    PROTOCOL,
    SIGNALS,
    Error,
    Exit,
    Open,
    RemoteProtocolError,
    Resize,
    Signal,
    Started,
    Stderr,
    Stdin,
    StdinEof,
    Stdout,
    decode_client,
    encode,
)

if TYPE_CHECKING:
    from p2p.connection import Connection

__all__ = ["ShellService"]

logger = logging.getLogger("agents.instance.shell")
#: The job's System log (a later issue ships it to wrk-monitor): one line per
#: session start and end, with ``extra={"job_id": ..., "source": "System"}``.
system_logger = logging.getLogger("cosmicac.agent.system")

#: After the process exits: how long the PTY or a pipe may stay quiet before the
#: session ends (a background job holding it would keep it open forever). Output
#: that is there drains at the client's pace, with no deadline.
_DRAIN_S = 2.0
#: STDIN frames (each at most 256 KiB) queued for a process that is not reading.
_INPUT_QUEUE_FRAMES = 4
#: One read of a PTY master (its line discipline buffers 4 KiB).
_PTY_READ_BYTES = 16 << 10
#: Output pipes grow to this (Linux's default pipe-max-size); see _grow_pipe.
_PIPE_BYTES = 1 << 20
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
#: After a hang-up: how long the process group has before SIGKILL.
_KILL_GRACE_S = 2.0


def _set_controlling_tty() -> None:  # pragma: no cover - runs in the child
    """In the child, after ``setsid()``: make the PTY (fd 0) its controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _start_tracked_terminal() -> None:  # pragma: no cover - runs in the child
    _set_controlling_tty()
    session_preexec()


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _grow_pipe(stream: trio.abc.Stream | None) -> None:
    """Let an output pipe hold :data:`_PIPE_BYTES`, so one read can fill a frame.

    A pipe holds 64 KiB by default: a process writing fast fills it between two
    of our reads, and each frame would carry at most 64 KiB. Best effort: an
    unprivileged process may not go past ``/proc/sys/fs/pipe-max-size``.
    """
    if isinstance(stream, trio.lowlevel.FdStream):
        with contextlib.suppress(OSError):
            fcntl.fcntl(stream.fileno(), _F_SETPIPE_SZ, _PIPE_BYTES)


def _exit_of(returncode: int) -> Exit:
    return Exit(signal=-returncode) if returncode < 0 else Exit(code=returncode)


class ShellService(Service):
    """Shell sessions for authorised keys, on ``cosmicac-shell/1``.

    Args:
        authorized: ``authorized(public_key)``: may this key open shells (for an
            agent: its :class:`~._access.ShellAccess`, the job's team's CLI keys as
            they are now). Asked on every connection and channel; after it starts
            refusing a key, call :meth:`close_unauthorized` to end its sessions.
        peers: other keys this host must still connect with (the worker, its
            relays); allowed on the connection, never given a shell.
        shell: what ``pty`` mode runs without ``argv`` ($SHELL, else /bin/sh).
        max_sessions: sessions at once; one more is refused (``busy``).
        open_timeout_s: how long a new channel may take to send OPEN.
        log: the operator's log (refusals, spawn failures, session start/end).
        job_id: the job this agent serves; named on every System log line.
        system_log: the job's System log: ``shell.session_started`` and
            ``shell.session_ended`` with the user's key, the mode, the command
            (exec), the exit status, the duration and the bytes each way.
        descendants: given (the agent process, which made itself a subreaper),
            every process a session starts stays its key's, and a key that loses
            access loses its background processes too (:meth:`watch_descendants`
            must run).
    """

    protocol = PROTOCOL

    def __init__(
        self,
        authorized: Callable[[bytes], bool],
        *,
        peers: Callable[[bytes], bool] = lambda key: False,
        shell: str | None = None,
        max_sessions: int = 32,
        open_timeout_s: float = 10.0,
        log: logging.Logger = logger,
        job_id: str | None = None,
        system_log: logging.Logger = system_logger,
        descendants: Descendants | None = None,
    ) -> None:
        self._authorized = authorized
        self._peers = peers
        self.shell = shell or os.environ.get("SHELL") or "/bin/sh"
        self.max_sessions = max_sessions
        self.open_timeout_s = open_timeout_s
        self._log = log
        self.job_id = job_id
        self._system_log = system_log
        #: Sessions running now.
        self.sessions = 0
        #: Sessions opened since the agent started (a figure of its heartbeat).
        self.sessions_total = 0
        #: Sessions closed because their key lost access (:meth:`close_unauthorized`).
        self.sessions_revoked = 0
        self._open: set[_Session] = set()
        self.descendants = descendants

    def allows(self, remote_public_key: bytes, how: str) -> bool:
        return bool(self._authorized(remote_public_key) or self._peers(remote_public_key))

    def close_unauthorized(self, reason: str) -> int:
        """Close every open session whose key ``authorized`` refuses now.

        Call it after the authorised set shrank (a member left the team). Each
        such session's client gets ERROR ``revoked`` with ``reason``, its
        process group is hung up, and the job's System log says
        ``shell.session_revoked``. New channels from those keys are refused by
        the check every channel makes.

        Returns:
            How many sessions are being closed (they end in their own tasks).
        """
        closing = [s for s in self._open
                   if s.revoked is None and not self._authorized(s.key)]
        for session in closing:
            session.revoke(reason)
        self.sessions_revoked += len(closing)
        self._end_refused_keys()
        return len(closing)

    def _end_refused_keys(self) -> None:
        if self.descendants is None:
            return
        for key in self.descendants.owners():
            if not self._authorized(key):
                self.descendants.end_key(key)

    async def watch_descendants(self, interval_s: float = 0.5) -> None:
        """Keep the record of who started which process current (runs until
        cancelled; does nothing without ``descendants``). What a key that lost
        access still runs, found late, is killed here."""
        if self.descendants is None:
            return
        while True:
            self.descendants.scan()
            self._end_refused_keys()
            await trio.sleep(interval_s)

    async def serve_channel(self, channel: Channel, connection: Connection) -> None:
        key = connection.remote_public_key
        label = key.hex()[:12]
        if not self._authorized(key):
            self._log.warning("shell.refused key=%s reason=unauthorized", label)
            await _send_error(channel, "unauthorized", "this key may not open shells here")
            return
        try:
            with trio.fail_after(self.open_timeout_s):
                opened = decode_client(await channel.receive())
        except (trio.TooSlowError, trio.EndOfChannel, MuxError, RemoteProtocolError) as exc:
            await _send_error(channel, "protocol", f"expected OPEN first ({type(exc).__name__})")
            return
        if not isinstance(opened, Open):
            await _send_error(channel, "protocol", "the first frame must be OPEN")
            return
        if not self._authorized(key):  # access may have been removed while we waited
            self._log.warning("shell.refused key=%s reason=revoked", label)
            await _send_error(channel, "unauthorized", "this key may not open shells here")
            return
        if self.sessions >= self.max_sessions:
            await _send_error(channel, "busy", f"{self.max_sessions} sessions already")
            return
        self.sessions += 1
        self.sessions_total += 1
        try:
            await _Session(self, channel, opened, key).run()
        finally:
            self.sessions -= 1


async def _send_error(channel: Channel, code: str, message: str) -> None:
    try:
        with trio.move_on_after(5):
            await channel.send(encode(Error(code, message)))
    except (MuxError, trio.BrokenResourceError, trio.ClosedResourceError):
        pass


class _Session:
    """One running session: its process, its pumps and the client's input."""

    def __init__(self, service: ShellService, channel: Channel, opened: Open, key: bytes) -> None:
        self.service = service
        self.channel = channel
        self.opened = opened
        self.key = key
        self.label = key.hex()[:12]
        #: Input frames (and the end of input) queued for _stdin and not yet written.
        self._queued = 0
        #: Input written to the process, output sent to the client (for the System log).
        self.bytes_in = 0
        self.bytes_out = 0
        self.process: trio.Process | None = None
        self.master: trio.lowlevel.FdStream | None = None
        self.master_fd = -1
        #: The process has exited: reads that stay quiet for _DRAIN_S end.
        self._exited = False
        self._reads: set[trio.CancelScope] = set()
        #: The session's body; cancelled by :meth:`revoke`.
        self._scope = trio.CancelScope()
        #: Why the key lost access (:meth:`revoke`), or None.
        self.revoked: str | None = None

    def revoke(self, reason: str) -> None:
        """End the session: its key may no longer open shells here."""
        self.revoked = reason
        self._scope.cancel()

    def _argv_env(self) -> tuple[list[str], dict[str, str]]:
        opened = self.opened
        argv = list(opened.argv) if opened.argv is not None else [self.service.shell]
        env = {**os.environ, **opened.env}
        if opened.mode == "pty":
            env["TERM"] = opened.term  # the size is the terminal's (LINES would pin it)
        return argv, env

    async def _spawn(self) -> trio.Process:
        argv, env = self._argv_env()
        tracked = self.service.descendants is not None
        if self.opened.mode == "exec":
            process = await trio.lowlevel.open_process(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, start_new_session=True, preexec_fn=session_preexec if tracked else None)
            for stream in (process.stdout, process.stderr):
                _grow_pipe(stream)
            return process
        master, slave = os.openpty()
        try:
            _set_size(slave, self.opened.rows, self.opened.cols)
            process = await trio.lowlevel.open_process(
                argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                start_new_session=True,
                preexec_fn=_start_tracked_terminal if tracked else _set_controlling_tty)
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)  # the child holds it; EIO on the master once it is gone
        self.master_fd = master
        self.master = trio.lowlevel.FdStream(master)
        return process

    async def run(self) -> None:
        service, opened = self.service, self.opened
        service._open.add(self)  # from here a revoke reaches it (its scope stays cancelled)
        spawning = (service.descendants.spawning() if service.descendants is not None
                    else contextlib.nullcontext())
        with spawning:  # the new process is named ours before any scan names it
            try:
                self.process = await self._spawn()
            except OSError as exc:
                service._open.discard(self)
                await _send_error(self.channel, "spawn_failed", f"{exc.strerror or exc}")
                service._log.info("shell.session_failed key=%s mode=%s error=%s",
                                  self.label, opened.mode, exc)
                return
            process = self.process
            if service.descendants is not None:
                service.descendants.started(process.pid, self.key)
        service._log.info("shell.session_started key=%s mode=%s pid=%d argv=%s",
                          self.label, opened.mode, process.pid,
                          "-" if opened.argv is None else opened.argv[0])
        started_at = trio.current_time()
        self._system("shell.session_started", pid=process.pid)
        exit_: Exit | None = None
        try:
            with self._scope:
                await self.channel.send(encode(Started(process.pid)))
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._input, nursery.cancel_scope)
                    async with trio.open_nursery() as outputs:
                        if self.master is not None:
                            outputs.start_soon(self._pump, self.master, Stdout)
                        else:
                            outputs.start_soon(self._pump, process.stdout, Stdout)
                            outputs.start_soon(self._pump, process.stderr, Stderr)
                        await process.wait()
                        # Output still in flight drains at the client's pace; a
                        # background job that keeps the terminal or a pipe open but
                        # quiet does not hold the session.
                        self._exited = True
                        for scope in self._reads:
                            scope.deadline = trio.current_time() + _DRAIN_S
                    exit_ = _exit_of(process.returncode)
                    await self.channel.send(encode(exit_))
                    nursery.cancel_scope.cancel()
        except (MuxError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client is gone: hang up below
        finally:
            service._open.discard(self)
            with trio.CancelScope(shield=True):
                if self.revoked is not None and exit_ is None:
                    self._system("shell.session_revoked", pid=process.pid, reason=self.revoked)
                    await _send_error(self.channel, "revoked", self.revoked)
                await self._hang_up()
            if service.descendants is not None:
                service.descendants.ended(process.pid)
            service._log.info(
                "shell.session_ended key=%s mode=%s pid=%d exit=%s", self.label, opened.mode,
                process.pid, "hangup" if exit_ is None else
                (exit_.code if exit_.code is not None else f"signal {exit_.signal}"))
            self._system(
                "shell.session_ended", pid=process.pid,
                exit_code=None if exit_ is None else exit_.code,
                exit_signal=None if exit_ is None else exit_.signal,
                hangup=exit_ is None,
                duration_s=round(trio.current_time() - started_at, 3),
                bytes_in=self.bytes_in, bytes_out=self.bytes_out)

    def _system(self, event: str, **fields: object) -> None:
        """One line of the job's System log: readable text, and every field in
        ``extra`` (``job_id``, ``source``, ``event``...) for the JSON shipper."""
        opened = self.opened
        fields = {"user_key": self.key.hex(), "mode": opened.mode,
                  "argv": None if opened.mode == "pty" and opened.argv is None
                  else list(opened.argv or ()), **fields}
        text = " ".join(f"{name}={_text(value)}" for name, value in fields.items()
                        if name != "hangup" and not (name == "argv" and value is None))
        self.service._system_log.info(
            "%s %s", event, text,
            extra={"job_id": self.service.job_id, "source": "System", "event": event,
                   **fields})

    async def _pump(self, source: trio.abc.ReceiveStream | None, kind: type) -> None:
        """Move output to the channel, one chunk after the channel took the last."""
        if source is None:
            return
        # A terminal hands over at most its 4 KiB line buffer per read; asking
        # for 256 KiB would allocate (and, above glibc's mmap threshold, map and
        # unmap) that much for every echoed keystroke.
        size = _PTY_READ_BYTES if source is self.master else MAX_DATA_BYTES
        # A terminal or pipe: wait first and read once (runtime.fdio), a pass
        # per chunk instead of two and a failed read.
        receive_some = (FdReader(source.fileno()).receive_some
                        if isinstance(source, trio.lowlevel.FdStream) else source.receive_some)
        while True:
            with trio.CancelScope() as scope:
                if self._exited:
                    scope.deadline = trio.current_time() + _DRAIN_S
                self._reads.add(scope)
                try:
                    data = await receive_some(size)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return  # a PTY master reads EIO once the terminal has no process left
                finally:
                    self._reads.discard(scope)
            if scope.cancelled_caught or not data:
                return
            # No yield after a write that went out at once: the next read yields.
            await self.channel.send(encode(kind(data)), checkpoint=False)
            self.bytes_out += len(data)

    async def _input(self, session_scope: trio.CancelScope) -> None:
        """Apply the client's frames; the client ending its side hangs up.

        Input goes through a queue of a few frames to :meth:`_stdin`, so a
        RESIZE or SIGNAL is applied at once even while the process is not
        reading its input; once the queue is full, this stops reading the
        channel (the client's sends wait for credit).
        """
        process = self.process
        assert process is not None
        to_stdin, from_input = trio.open_memory_channel[bytes | None](_INPUT_QUEUE_FRAMES)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._stdin, from_input)
            async with to_stdin:
                while True:
                    try:
                        event = decode_client(await self.channel.receive())
                    except RemoteProtocolError as exc:
                        await _send_error(self.channel, "protocol", exc.message)
                        break
                    except (trio.EndOfChannel, MuxError):
                        break
                    match event:
                        case Stdin(data=data):
                            data = self._write_now(data)
                            if data:
                                self._queued += 1
                                await to_stdin.send(data)
                        case StdinEof():
                            self._queued += 1
                            await to_stdin.send(None)
                        case Resize(rows=rows, cols=cols):
                            if self.master is not None:
                                _set_size(self.master_fd, rows, cols)  # the kernel sends SIGWINCH
                        case Signal(name=name):
                            _kill_group(process, SIGNALS[name])
                        case Open():
                            await _send_error(self.channel, "protocol", "OPEN twice")
                            break
            session_scope.cancel()

    async def _stdin(self, queue: trio.MemoryReceiveChannel[bytes | None]) -> None:
        """Write queued input to the process; None is the end of input."""
        process = self.process
        assert process is not None
        async for data in queue:
            if data is not None:
                await self._write(data)
                self.bytes_in += len(data)
            elif self.master is not None:
                await self._write(b"\x04")  # the terminal's EOF character
            elif process.stdin is not None:
                await process.stdin.aclose()
            self._queued -= 1

    def _write_now(self, data: bytes) -> bytes:
        """Write what the process takes at once, when nothing waits before it.

        A keystroke then reaches the terminal from the task that decoded it,
        without a hand-off to :meth:`_stdin` (one scheduler pass less on every
        round trip); what the process does not take now is returned, to be
        queued in order.
        """
        if self._queued:
            return data  # earlier input still waits: keep the order
        sink = self.master if self.master is not None else self.process.stdin  # type: ignore[union-attr]
        if not isinstance(sink, trio.lowlevel.FdStream):
            return data
        try:
            written = os.write(sink.fileno(), data)
        except BlockingIOError:
            return data
        except OSError:
            return data  # closed or broken: _write reports it the usual way
        self.bytes_in += written
        return data[written:]

    async def _write(self, data: bytes) -> None:
        sink = self.master if self.master is not None else self.process.stdin  # type: ignore[union-attr]
        if sink is None:
            return
        try:
            await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the process closed its input; later output still flows

    async def _hang_up(self) -> None:
        """End the process group (SIGHUP, then SIGKILL) and free the terminal."""
        process = self.process
        if process is not None and process.returncode is None:
            _kill_group(process, signal.SIGHUP)
            with trio.move_on_after(_KILL_GRACE_S):
                await process.wait()
            if process.returncode is None:
                _kill_group(process, signal.SIGKILL)
                with trio.move_on_after(_KILL_GRACE_S):
                    await process.wait()
        if self.master is not None:
            await self.master.aclose()
        if process is not None:
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    await stream.aclose()


def _text(value: object) -> str:
    """A field's value on a text line: words as they are, anything else as JSON."""
    if isinstance(value, str) and value and " " not in value and "=" not in value:
        return value
    return json.dumps(value)


def _kill_group(process: trio.Process, signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except OSError as exc:
        if exc.errno != errno.ESRCH:
            raise
