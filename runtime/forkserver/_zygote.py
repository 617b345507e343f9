"""The zygote: the process that has imported a program once, forks each run of
it, sets the child up and reaps it (no trio here; see the package doc)."""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import os
import selectors
import signal
import socket
import sys
import threading
import traceback
import types
from collections.abc import Sequence

from ._protocol import (
    MAX_FDS,
    MAX_MESSAGE,
    SpawnRequest,
    _encode,
    _loads,
    parse_request,
)


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
