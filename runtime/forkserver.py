"""A fork server (zygote): a process that has imported a Python program once and
forks each run of it from there, so a start costs a ``fork()``, not an
interpreter's start and a second of imports.

Used twice: the ``local`` backend forks its agents from one (the worker starts
it: ``python -m runtime.forkserver``), and an inference agent forks its model
server from one (:func:`fork_server_process`: forked from the agent itself
before its trio loop starts, so it imports nothing more).

Two halves, one file:

- the zygote (:func:`serve`): a small separate process. It imports the modules
  it is told, checks it is still single-threaded, says ``ready`` and then
  answers spawn requests on the one socket it was given, forking a child per
  request. It never starts trio (nothing to inherit), holds no job's
  secret (a request carries a command line, an environment without secrets
  and its stdio; an agent reads its config, report token included, only
  after the fork, as its own user), reaps its children and reports each exit.
- the client (:class:`ForkServer`, trio): starts or adopts the zygote, sends
  requests, hands back a :class:`ForkedProcess` that waits and is signalled as
  a ``trio.Process`` is.

The protocol: one ``SOCK_SEQPACKET`` socketpair (message boundaries kept, file
descriptors passed), each message one JSON object of at most
:data:`MAX_MESSAGE` bytes::

    client -> zygote  {"op": "spawn", "id": N, "module": M, "argv": [...],
                       "env": {...}, "cwd": PATH|null, "uid": U|null,
                       "gid": G|null, "umask": MASK|null, "session": BOOL,
                       "stdio": [I, I, I], "function": NAME|null}
                      + 1 to 3 descriptors
    zygote -> client  {"op": "ready", "pid": P}                    once, first
                      {"op": "spawned", "id": N, "pid": P}
                      {"op": "refused", "id": N, "error": "..."}   nothing forked
                      {"op": "exited", "pid": P, "status": S}      S as Popen's returncode

Every request is checked before anything is done with it (:func:`parse_request`):
a malformed one is refused with a reason, never the end of the zygote; the
module must be one it preloaded.

``stdio`` says where the child's stdin, stdout and stderr come from: the index
of a passed descriptor, or -1 for ``/dev/null``. ``function``: call the
preloaded module's function of that name with the arguments (what it returns
is the exit status), rather than run the module's code again as ``__main__``
(which rebuilds every class it defines: 15 ms of the model server's start).

The child, between ``fork()`` and the program's first line (:func:`_become`):
default signal handlers, a session of its own (``setsid``) when asked, its
stdio, every other descriptor closed (the zygote's socket too), its command
line rewritten to the program's own (so ``ps``, and the ``local`` backend's
adoption after a worker restart, which matches ``--config FILE`` in
``/proc/PID/cmdline``, see what a spawned one shows), umask, then groups,
gid and uid dropped (checked; the child stays non-dumpable, see below), the
working folder and the environment replaced, and the module run as
``__main__``. It ends with ``os._exit``: it never returns into the zygote's loop.

What forked children share that spawned ones do not: the zygote's address-space
layout (ASLR is per zygote, not per agent) and its ``str`` hash seed
(``random`` is reseeded at fork by CPython itself). They would help an attacker
who already has a memory-corruption bug, or wants to flood dicts, in another
job's agent, not to read another job's data; and a child given another user
stays non-dumpable (Linux clears the flag as the uid changes; no ``execve``
sets it again), so the processes of its job's own user, its shells, cannot
ptrace it or read its memory to learn them. Nothing restarts a zygote: when it
is gone its users spawn as before and say so.
"""

from __future__ import annotations

import array
import atexit
import importlib
import importlib.util
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import traceback
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import trio

from .process import proc_stat, wait_gone

__all__ = [
    "MAX_MESSAGE",
    "ForkServer",
    "ForkServerError",
    "ForkedProcess",
    "SpawnRequest",
    "fork_server_process",
    "parse_request",
    "serve",
]

#: The largest message either side sends or takes (an agent's environment fits
#: many times over).
MAX_MESSAGE = 64 << 10
#: Bounds of a request's parts.
MAX_ARGS = 64
MAX_ENV = 256
MAX_TEXT = 8 << 10
#: Descriptors a request may pass (stdin, stdout, stderr).
MAX_FDS = 3
#: Room kept in the zygote's own command line for each child's (``/proc/PID/cmdline``
#: is the memory the kernel's execve laid out: a child can rewrite it, not grow it).
TITLE_ROOM = 4096
_MAX_ID = 2**53
_MAX_UID = 2**32 - 2


class ForkServerError(Exception):
    """The fork server is not there (not started, gone) or refused a request."""


# -- the protocol (sans I/O) -------------------------------------------------------------


@dataclass(frozen=True)
class SpawnRequest:
    """One checked spawn request."""

    id: int
    module: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None = None
    uid: int | None = None
    gid: int | None = None
    umask: int | None = None
    #: A session (and process group) of its own, or the zygote's.
    session: bool = True
    #: stdin, stdout, stderr: an index into the passed descriptors, -1: /dev/null.
    stdio: tuple[int, int, int] = (-1, 0, 0)
    #: The module's function to call with ``argv`` (None: run it as ``__main__``).
    function: str | None = None

    def encode(self) -> bytes:
        return _encode({"op": "spawn", "id": self.id, "module": self.module,
                        "argv": list(self.argv), "env": dict(self.env), "cwd": self.cwd,
                        "uid": self.uid, "gid": self.gid, "umask": self.umask,
                        "session": self.session, "stdio": list(self.stdio),
                        "function": self.function})


def _encode(message: Mapping) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise ForkServerError(f"message of {len(data)} bytes, more than {MAX_MESSAGE}")
    return data


def _text(value: object, what: str) -> str:
    if not isinstance(value, str) or (not value and what != "env value"):
        raise ValueError(f"{what} is not a non-empty string")
    if len(value) > MAX_TEXT or "\x00" in value:
        raise ValueError(f"{what} is too long or holds NUL")
    return value


def _id_number(value: object, what: str, top: int) -> int:
    if type(value) is not int or not 0 <= value <= top:
        raise ValueError(f"{what} is not an integer in 0..{top}")
    return value


def _optional_number(value: object, what: str, top: int) -> int | None:
    return None if value is None else _id_number(value, what, top)


def parse_request(data: bytes, modules: frozenset[str]) -> SpawnRequest:
    """The spawn request in ``data``, checked (any byte may be hostile).

    Raises:
        ValueError: not JSON, not a spawn, a field missing or out of bounds, a
            module not in ``modules``; the message says which.
    """
    if len(data) > MAX_MESSAGE:
        raise ValueError("request too large")
    doc = _loads(data, "request")
    if not isinstance(doc, dict) or doc.get("op") != "spawn":
        raise ValueError("not a spawn request")
    request_id = _id_number(doc.get("id"), "id", _MAX_ID)
    module = _text(doc.get("module"), "module")
    if module not in modules:
        raise ValueError(f"module {module!r} is not one this server preloaded")
    argv = doc.get("argv")
    if not isinstance(argv, list) or len(argv) > MAX_ARGS:
        raise ValueError(f"argv is not a list of at most {MAX_ARGS}")
    env = doc.get("env")
    if not isinstance(env, dict) or len(env) > MAX_ENV:
        raise ValueError(f"env is not an object of at most {MAX_ENV}")
    clean_env = {}
    for name, value in env.items():
        if "=" in _text(name, "env name"):
            raise ValueError("env name holds '='")
        clean_env[name] = _text(value, "env value")
    cwd = doc.get("cwd")
    uid = _optional_number(doc.get("uid"), "uid", _MAX_UID)
    gid = _optional_number(doc.get("gid"), "gid", _MAX_UID)
    if (uid is None) != (gid is None):
        raise ValueError("uid and gid go together")
    session = doc.get("session", True)
    if not isinstance(session, bool):
        raise ValueError("session is not true or false")
    function = doc.get("function")
    if function is not None and (not isinstance(function, str) or len(function) > 100
                                 or not function.isidentifier()):
        raise ValueError("function is not a name")
    stdio = doc.get("stdio", [-1, 0, 0])
    if (not isinstance(stdio, list) or len(stdio) != 3
            or any(type(index) is not int or not -1 <= index < MAX_FDS for index in stdio)):
        raise ValueError(f"stdio is not three indexes in -1..{MAX_FDS - 1}")
    return SpawnRequest(
        id=request_id, module=module, argv=tuple(_text(arg, "argument") for arg in argv),
        env=clean_env, cwd=None if cwd is None else _text(cwd, "cwd"), uid=uid, gid=gid,
        umask=_optional_number(doc.get("umask"), "umask", 0o777), session=session,
        stdio=(stdio[0], stdio[1], stdio[2]), function=function)


def _loads(data: bytes, what: str) -> object:
    """JSON, or ValueError (nesting deep enough to exhaust the stack included)."""
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ValueError(f"{what} is not JSON") from None


def parse_reply(data: bytes) -> dict:
    """A zygote's message, checked for shape.

    Raises:
        ValueError: not one of the messages the module doc lists.
    """
    doc = _loads(data, "reply")
    if not isinstance(doc, dict):
        raise ValueError("reply is not an object")
    op = doc.get("op")
    if op == "ready":
        _id_number(doc.get("pid"), "pid", 2**31)
    elif op == "spawned":
        _id_number(doc.get("id"), "id", _MAX_ID)
        _id_number(doc.get("pid"), "pid", 2**31)
    elif op == "refused":
        _id_number(doc.get("id"), "id", _MAX_ID)
        doc["error"] = str(doc.get("error"))[:500]
    elif op == "exited":
        _id_number(doc.get("pid"), "pid", 2**31)
        status = doc.get("status")
        if type(status) is not int or not -256 < status < 256:
            raise ValueError("status is not an exit status")
    else:
        raise ValueError(f"unknown op {op!r}")
    return doc


# -- the zygote ----------------------------------------------------------------------------


def serve(fd: int, preload: Sequence[str]) -> int:
    """The zygote's loop on socket ``fd`` (see the module doc); returns its exit
    status once the worker's end closes."""
    sock = socket.socket(fileno=fd)
    for name in preload:
        importlib.import_module(name)
    if threading.active_count() != 1:
        # A thread started by an import: forking would copy its locks mid-use.
        sock.send(_encode({"op": "refused", "id": 0,
                           "error": f"{threading.active_count()} threads after imports"}))
        return 1
    modules = frozenset(preload)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    os.set_blocking(wake_read, False)
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker's terminal's Ctrl-C is its own
    sock.send(_encode({"op": "ready", "pid": os.getpid()}))
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    while True:
        try:
            _reap(sock)
        except OSError:
            return 0  # the client is gone
        for key, _ in selector.select():
            if key.fileobj is wake_read:
                try:
                    os.read(wake_read, 4096)
                except BlockingIOError:
                    pass
                continue
            try:
                data, fds, flags, _ = socket.recv_fds(sock, MAX_MESSAGE + 1, MAX_FDS)
            except InterruptedError:
                continue
            if not data:
                # The worker gone (its end closed): nothing more to serve. Its agents
                # are not ours to stop; they outlive a worker restart.
                return 0
            try:
                _handle(sock, data, fds, flags, modules)
            except OSError:
                return 0  # our answer cannot go out: the client is gone
            finally:
                for extra in fds:
                    os.close(extra)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(_encode({"op": "exited", "pid": pid,
                           "status": os.waitstatus_to_exitcode(status)}))


def _handle(sock: socket.socket, data: bytes, fds: list[int], flags: int,
            modules: frozenset[str]) -> None:
    try:
        try:
            request_id = _loads(data, "request").get("id", 0)  # for the refusal
            request_id = request_id if type(request_id) is int else 0
        except (ValueError, AttributeError):
            request_id = 0
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ValueError("request or its descriptors truncated")
        request = parse_request(data, modules)
        if not fds or max(request.stdio) >= len(fds):
            raise ValueError(f"stdio {list(request.stdio)} names descriptors not passed "
                             f"({len(fds)} were)")
    except ValueError as exc:
        sock.send(_encode({"op": "refused", "id": request_id, "error": str(exc)}))
        return
    try:
        pid = os.fork()
    except OSError as exc:
        sock.send(_encode({"op": "refused", "id": request.id,
                           "error": f"fork: {exc.strerror}"}))
        return
    if pid == 0:
        _child(request, fds)
    sock.send(_encode({"op": "spawned", "id": request.id, "pid": pid}))


def _child(request: SpawnRequest, fds: Sequence[int]) -> None:
    """After fork, in the child: become the program and run it; never returns."""
    code = 127
    try:
        _become(request, fds)
        code = _run(request)
    except BaseException as exc:  # nothing may return into the zygote's loop
        try:
            os.write(2, f"forkserver: cannot start {request.module}: {exc!r}\n".encode())
        except OSError:
            pass
    finally:
        os._exit(code)


def _become(request: SpawnRequest, fds: Sequence[int]) -> None:
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if request.session:
        os.setsid()
    # Out of the way of 0..2 first: a passed descriptor may be one of them.
    moved = [os.dup(fd) if fd >= 0 else -1 for fd in fds]
    null = os.open(os.devnull, os.O_RDWR)
    for target, index in enumerate(request.stdio):
        os.dup2(null if index < 0 else moved[index], target)
    os.closerange(3, _max_fd())  # passed ones, the socket, the wake pipe: nothing inherited
    _set_cmdline([sys.executable, "-m", request.module, *request.argv])
    if request.umask is not None:
        os.umask(request.umask)
    if request.uid is not None and request.gid is not None:
        os.setgroups([])
        os.setresgid(request.gid, request.gid, request.gid)
        os.setresuid(request.uid, request.uid, request.uid)
        if (os.getresuid() != (request.uid,) * 3 or os.getresgid() != (request.gid,) * 3
                or os.getgroups()):
            raise PermissionError("could not become the agent's user")
        # Linux made us non-dumpable as the uid changed, and we leave it so (an
        # execve would have undone it): no process of the job's own user (its
        # shells) may ptrace us or read our memory, where the zygote's hash
        # secret and address layout, shared with other jobs' agents, are.
    if request.cwd is not None:
        os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update(request.env)
    sys.dont_write_bytecode = bool(request.env.get("PYTHONDONTWRITEBYTECODE"))


def _run(request: SpawnRequest) -> int:
    """Call the (preloaded) module's ``function`` with the arguments, or run the
    module as ``__main__``, as ``python -m`` does: a fresh module object executing
    its code (runpy would warn that it is imported)."""
    spec = importlib.util.find_spec(request.module)
    if spec is None or spec.loader is None or not hasattr(spec.loader, "get_code"):
        raise ImportError(f"no module {request.module}")
    sys.argv = [spec.origin or sys.executable, *request.argv]
    try:
        if request.function is not None:
            returned = getattr(sys.modules[request.module], request.function)(
                list(request.argv))
            code = returned if isinstance(returned, int) else 0
        else:
            code_object = spec.loader.get_code(request.module)
            main = types.ModuleType("__main__")
            main.__dict__.update(__file__=spec.origin, __spec__=spec, __loader__=spec.loader,
                                 __package__=spec.parent, __cached__=spec.cached,
                                 __builtins__=__builtins__)
            sys.modules["__main__"] = main
            exec(code_object, main.__dict__)
            code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # as the interpreter does: print it, exit 1
        traceback.print_exc()
        code = 1
    # What an interpreter's exit does before ours (os._exit): the exit functions
    # the program registered (logging's flush among them), then the streams.
    try:
        atexit._run_exitfuncs()
    except BaseException:  # an exit function's failure is printed, as Python does
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code


def _max_fd() -> int:
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (OSError, ValueError):
        return 65536


def _set_cmdline(argv: Sequence[str]) -> None:
    """Rewrite this process's ``/proc/self/cmdline`` to ``argv`` (cut to the room the
    zygote's own command line left, NUL-padded), through ``/proc/self/mem``. Best
    effort: where ``/proc`` is closed to us it stays the zygote's."""
    try:
        _write_cmdline(argv)
    except (OSError, ValueError, IndexError):
        pass


def _write_cmdline(argv: Sequence[str]) -> None:
    with open("/proc/self/stat", "rb") as file:
        fields = file.read().rsplit(b")", 1)[1].split()
    # Fields 48 and 49 of proc(5) (arg_start, arg_end); index 0 here is field 3.
    start, end = int(fields[45]), int(fields[46])
    room = end - start
    if room < 2:
        return
    data = b"\x00".join(arg.encode() for arg in argv)[:room - 1]
    data += b"\x00" * (room - len(data))
    fd = os.open("/proc/self/mem", os.O_WRONLY)
    try:
        os.pwrite(fd, data, start)
    finally:
        os.close(fd)


def _main(argv: Sequence[str]) -> int:
    """``python -m runtime.forkserver FD MODULE,... ROOM``."""
    if len(argv) < 2:
        print("usage: _forkserver FD MODULE[,MODULE...] [ROOM]", file=sys.stderr)
        return 2
    return serve(int(argv[0]), [name for name in argv[1].split(",") if name])


# -- the client (trio) -----------------------------------------------------------------


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


def _fds(*fds: int) -> bytes:
    return array.array("i", fds).tobytes()


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
