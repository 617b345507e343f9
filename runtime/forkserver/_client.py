"""The fork server's users (trio): start or fork a zygote, ask it for processes and
watch them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import traceback
from collections.abc import Mapping, Sequence

import trio

from ..process import proc_stat, wait_gone
from ._protocol import (
    MAX_MESSAGE,
    TITLE_ROOM,
    ForkServerError,
    SpawnRequest,
    _fds,
    parse_reply,
)
from ._zygote import (
    _max_fd,
    serve,
)


class ForkedProcess:
    """A program the zygote forked: what its user needs of a ``trio.Process``
    (``pid``, ``returncode``, :meth:`poll`, :meth:`wait`, :meth:`send_signal`, and
    ``stdout``/``stderr`` when it asked for pipes).

    Its exit status comes from the zygote; if the zygote goes first, :meth:`wait`
    watches the pid itself (a pidfd, or ``/proc``) and the status is unknown (None).
    """

    def __init__(self, pid: int, poll_interval_s: float = 0.5) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.stdout: trio.abc.ReceiveStream | None = None
        self.stderr: trio.abc.ReceiveStream | None = None
        self._done = trio.Event()
        self._orphaned = trio.Event()
        self._poll_interval_s = poll_interval_s
        stat = proc_stat(pid)
        self._start_ticks = stat[1] if stat else None
        #: The zygote died before this process: its status is unknowable.
        self.status_unknown = False

    def poll(self) -> int | None:
        return self.returncode

    async def wait(self) -> int | None:
        async with trio.open_nursery() as nursery:
            async def orphaned() -> None:
                await self._orphaned.wait()
                await _wait_gone(self.pid, self._start_ticks, self._poll_interval_s)
                self.status_unknown = True
                self._done.set()

            nursery.start_soon(orphaned)
            await self._done.wait()
            nursery.cancel_scope.cancel()
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """Signal it while it runs (a no-op once its exit is known, so a reused pid
        is never signalled)."""
        if self.returncode is None and not self._done.is_set():
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _exited(self, status: int) -> None:
        self.returncode = status
        self._done.set()

    def _orphan(self) -> None:
        self._orphaned.set()


async def _wait_gone(pid: int, start_ticks: int | None, poll_interval_s: float) -> None:
    """Until ``pid`` (no longer anyone's child we hear of) has ended: its pidfd, or,
    without one, ``/proc`` (where it may be read)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):
        await wait_gone(pid, start_ticks, poll_interval_s)
        return
    try:
        stat = proc_stat(pid)  # after opening the pidfd: a reused pid is seen
        if stat is None or start_ticks is None or stat[1] == start_ticks:
            await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)


class ForkServer:
    """The client's end of a zygote (see the module doc): :meth:`run` starts one as
    a program of its own; :meth:`adopt` serves one :func:`fork_server_process` forked.

    Args:
        python: the interpreter the zygote (and so every child) runs on.
        preload: modules imported once in the zygote; requests may run only these.
        env: the zygote's own environment (what an interpreter reads at start:
            ``PYTHON*``, locale); no secrets.
        poll_interval_s: how often a child is checked once the zygote is gone,
            where there is no pidfd.
    """

    def __init__(self, python: str, preload: Sequence[str], env: Mapping[str, str], *,
                 poll_interval_s: float = 0.5) -> None:
        self.python = python
        self.preload = tuple(preload)
        self.env = dict(env)
        self.poll_interval_s = poll_interval_s
        self.pid: int | None = None
        #: Why it is not usable (None while it is, or before it started).
        self.problem: str | None = None
        self._sock: trio.socket.SocketType | None = None
        self._ready = trio.Event()
        self._next_id = 1
        self._waiting: dict[int, tuple[trio.Event, list]] = {}
        self._processes: dict[int, ForkedProcess] = {}
        self._send_lock = trio.Lock()

    @property
    def usable(self) -> bool:
        return self._ready.is_set() and self.problem is None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Start the zygote and serve its replies until cancelled or it ends; it is
        started (not yet ready) when this reports started. Never raises for the
        zygote's failures: :attr:`problem` says them. Cancelled, it kills the
        zygote (not its children: they have lives of their own)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = await trio.lowlevel.open_process(
                [self.python, "-m", "runtime.forkserver", str(theirs.fileno()),
                 ",".join(self.preload), "." * TITLE_ROOM],
                stdin=subprocess.DEVNULL, env=self.env, pass_fds=(theirs.fileno(),),
                start_new_session=True)
        except OSError as exc:
            ours.close()
            self._fail(f"cannot start the fork server: {exc.strerror or exc}")
            task_status.started()
            return
        finally:
            theirs.close()
        self.pid = process.pid
        task_status.started()
        await self._serve(ours, process)

    async def adopt(self, sock: socket.socket, pid: int, *,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the zygote ``pid`` (our child, from :func:`fork_server_process`) on
        ``sock`` until cancelled or it ends; cancelled, it kills it."""
        self.pid = pid
        task_status.started()
        await self._serve(sock, None)

    async def _serve(self, sock: socket.socket, process: trio.Process | None) -> None:
        self._sock = trio.socket.from_stdlib_socket(sock)
        try:
            await self._read(process)
        finally:
            # Its children's exits are no longer heard of: their waits watch them
            # themselves from now on (a stop in progress waits on one).
            self._fail(f"the fork server (pid {self.pid}) is stopped")
            with trio.CancelScope(shield=True):
                self._sock.close()
                if process is not None and process.returncode is None:
                    process.kill()  # imports or waits; its children are not its group
                    await process.wait()
                elif process is None and self.pid is not None:
                    _reap_now(self.pid)

    async def wait_ready(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until the zygote has imported; is it usable?"""
        with trio.move_on_after(timeout_s):
            await self._ready.wait()
        return self.usable

    async def _read(self, process: trio.Process | None) -> None:
        assert self._sock is not None
        why = "closed its socket"
        try:
            while True:
                data = await self._sock.recv(MAX_MESSAGE + 1)
                if not data:
                    break
                try:
                    reply = parse_reply(data)
                except ValueError as exc:
                    why = f"sent a bad message ({exc})"
                    break
                self._dispatch(reply)
        except OSError as exc:
            why = f"socket error: {exc.strerror or exc}"
        code = None
        if process is not None:
            with trio.move_on_after(1.0):
                await process.wait()
            code = process.returncode
        self._fail(f"the fork server (pid {self.pid}) {why}"
                   + (f", exit status {code}" if code is not None else ""))

    def _dispatch(self, reply: dict) -> None:
        op = reply["op"]
        if op == "ready":
            self._ready.set()
        elif op == "exited":
            process = self._processes.pop(reply["pid"], None)
            if process is not None:
                process._exited(reply["status"])
        elif op == "refused" and reply["id"] == 0 and not self._ready.is_set():
            self._fail(f"the fork server refused to serve: {reply['error']}")
        else:
            slot = self._waiting.pop(reply["id"], None)
            if slot is None:
                return
            if op == "spawned":
                process = ForkedProcess(reply["pid"], self.poll_interval_s)
                self._processes[process.pid] = process
                slot[1].append(process)
            else:
                slot[1].append(ForkServerError(reply["error"]))
            slot[0].set()

    def _fail(self, why: str) -> None:
        if self.problem is None:
            self.problem = why
        self._ready.set()
        for event, slot in self._waiting.values():
            slot.append(ForkServerError(why))
            event.set()
        self._waiting.clear()
        for process in self._processes.values():
            process._orphan()
        self._processes.clear()

    async def spawn(self, module: str, argv: Sequence[str], *, fds: Sequence[int],
                    stdio: tuple[int, int, int] = (-1, 0, 0), env: Mapping[str, str],
                    cwd: str | None = None, user: tuple[int, int] | None = None,
                    umask: int | None = None, session: bool = True,
                    function: str | None = None) -> ForkedProcess:
        """Fork ``python -m module argv...`` from the zygote (``function``: call
        ``module.function(argv)`` in the child instead); ``fds`` are passed to it
        and ``stdio`` says which becomes its stdin, stdout, stderr (-1:
        ``/dev/null``). The caller keeps (and closes) ``fds``.

        Raises:
            ForkServerError: the zygote is not usable, or refused (the reason).
        """
        if not self.usable or self._sock is None:
            raise ForkServerError(self.problem or "the fork server is not ready")
        request_id = self._next_id
        self._next_id += 1
        request = SpawnRequest(id=request_id, module=module, argv=tuple(argv), env=env,
                               cwd=cwd, uid=user[0] if user else None,
                               gid=user[1] if user else None, umask=umask, session=session,
                               stdio=stdio, function=function)
        data = request.encode()
        event, slot = trio.Event(), []
        self._waiting[request_id] = (event, slot)
        try:
            async with self._send_lock:
                await self._sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                   _fds(*fds))])
        except OSError as exc:
            self._waiting.pop(request_id, None)
            self._fail(f"cannot reach the fork server: {exc.strerror or exc}")
            raise ForkServerError(self.problem or "gone") from None
        await event.wait()
        result = slot[0]
        if isinstance(result, ForkServerError):
            raise result
        return result


def _reap_now(pid: int) -> None:
    """Kill and reap our child zygote ``pid`` (it holds nothing worth a goodbye)."""
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def fork_server_process(preload: Sequence[str]) -> tuple[socket.socket, int]:
    """Fork a zygote from this very process (its imports are the zygote's for free)
    and return (our end of its socket, its pid); it imports ``preload`` (what is
    not imported yet) and serves. Call only while single-threaded and before any
    trio loop runs (the caller checks: :class:`ForkServerError` otherwise). The
    zygote stays in our session and process group, so what stops our group stops
    it and what it forks.

    Raises:
        ForkServerError: threads are running, or the fork failed.
    """
    if threading.active_count() != 1:
        raise ForkServerError(f"{threading.active_count()} threads run: not forking")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        pid = os.fork()
    except OSError as exc:
        ours.close()
        theirs.close()
        raise ForkServerError(f"fork: {exc.strerror}") from None
    if pid == 0:
        code = 1
        try:
            ours.close()
            keep = theirs.detach()
            os.closerange(3, keep)  # nothing of the parent's but its stdio
            os.closerange(keep + 1, _max_fd())
            code = serve(keep, preload)
        except BaseException:  # nothing may return into the parent's code
            traceback.print_exc()
        finally:
            os._exit(code)
    theirs.close()
    return ours, pid
