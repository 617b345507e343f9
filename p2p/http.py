"""Serving an ASGI app: hypercorn's trio worker, or the lean server for the hot fronts.

The metrics endpoint (:mod:`p2p.metrics`) and the daemons' APIs serve on
hypercorn. proxy-inference's OpenAI API and the agents' model servers, where
the HTTP server's own cost per request is most of the request, serve with
``lean=True`` on :mod:`p2p.httpserver` (``httptools`` under trio: HTTP/1.1
only, no lifespan events; see its docs).

The socket is bound here, not by hypercorn: hypercorn leaves the socket of
a failed ``bind`` open (a ResourceWarning later, somewhere else), and
binding first gives the caller a plain ``OSError`` it can name.
hypercorn (or httptools) is imported only when something is served.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from typing import Any

import trio

__all__ = ["KEEP_ALIVE_S", "ServerBindError", "bound_socket", "join_address", "serve_asgi"]

#: Builds the error a failed bind raises: ``(host, port, os_error) -> OSError``.
BindError = Callable[[str, int, OSError], OSError]


def join_address(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ServerBindError(OSError):
    """A server cannot listen on its address (busy port, bad host).

    A plain :class:`OSError` (``errno``, ``strerror`` set) whose ``str`` is one
    line naming the address, raised bare rather than inside hypercorn's
    exception groups. Each server subclasses it to name what it serves
    (``what``); the class itself is a :data:`BindError` for :func:`serve_asgi`.
    """

    #: What the server serves, for the message ("the API", "metrics").
    what = "HTTP"

    def __init__(self, host: str, port: int, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.host = host
        self.port = port

    def __str__(self) -> str:
        return f"cannot serve {self.what} on {join_address(self.host, self.port)}: " \
               f"{self.strerror}"


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``(host, port)``, set up as hypercorn sets up its own."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _bind_error(group: BaseExceptionGroup) -> OSError | None:
    """The OSError behind a failed start, if that is all the group holds."""
    matched, rest = group.split(OSError)
    if matched is None or rest is not None:
        return None
    leaf: BaseException = matched
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    assert isinstance(leaf, OSError)
    return leaf


#: How long a served connection may idle between requests.
KEEP_ALIVE_S = 75.0


async def serve_asgi(
    app: Any,
    *,
    host: str,
    port: int,
    bind_error: BindError,
    on_listening: Callable[[tuple[str, int]], None] | None = None,
    lean: bool = False,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``http://host:port`` until cancelled.

    Reports the bound ``(host, port)`` through ``task_status`` (port 0 picks a
    free one), after calling ``on_listening`` with it. ``lean``: on
    :mod:`p2p.httpserver` instead of hypercorn.

    Raises:
        OSError: ``bind_error(host, port, cause)`` when the address cannot be
            bound (a port outside 0..65535 included), before anything is served.
    """
    if not 0 <= port <= 65535:
        raise bind_error(host, port, OSError(errno.EINVAL, "port must be 0..65535"))
    try:
        sock = bound_socket(host, port)
    except OSError as exc:
        raise bind_error(host, port, exc) from None
    if lean:
        await _serve_lean(app, sock, on_listening, task_status)
        return
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn adopts it and closes it when it stops
    config.accesslog = None
    config.errorlog = None  # our daemons log their own lines; hypercorn's would interleave
    config.graceful_timeout = 1.0
    # Idle keep-alive connections are kept longer than any client of ours keeps them
    # (the entry point 30 s, httpx 5 s): a server closing one first races the
    # client's next request on it, which then fails with a reset (hypercorn's own
    # default is 5 s, the same as httpx's pool).
    config.keep_alive_timeout = KEEP_ALIVE_S
    failure: OSError | None = None
    async with trio.open_nursery() as nursery:
        try:
            binds: list[str] = await nursery.start(serve, app, config)
        except OSError as exc:
            failure = bind_error(host, port, exc)
        except BaseExceptionGroup as group:
            cause = _bind_error(group)  # hypercorn starts inside its own nurseries
            if cause is None:
                raise
            failure = bind_error(host, port, cause)
        if failure is None:
            bound_host, _, bound_port = binds[0].removeprefix("http://").rpartition(":")
            address = (bound_host.strip("[]"), int(bound_port))
            if on_listening is not None:
                on_listening(address)
            task_status.started(address)
    if failure is not None:  # raised outside the nursery, which would wrap it in a group
        raise failure


async def _serve_lean(app: Any, sock: socket.socket,
                      on_listening: Callable[[tuple[str, int]], None] | None,
                      task_status: trio.TaskStatus[tuple[str, int]]) -> None:
    """``app`` on :mod:`p2p.httpserver`, listening on the bound ``sock``."""
    from p2p.httpserver import ServerConfig, serve_listener

    try:
        sock.listen(SOCKET_BACKLOG)
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    except BaseException:
        sock.close()
        raise
    address = sock.getsockname()[:2]
    async with listener, trio.open_nursery() as nursery:
        await nursery.start(serve_listener, listener, app,
                            ServerConfig(keep_alive_s=KEEP_ALIVE_S))
        if on_listening is not None:
            on_listening(address)
        task_status.started(address)


#: Connections the kernel queues for ``accept`` (hypercorn's default).
SOCKET_BACKLOG = 100
