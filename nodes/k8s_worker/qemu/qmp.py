"""The QEMU Machine Protocol, the little of it the backend uses: one command per call.

QMP is JSON objects, one per line, over the VM's unix socket: a greeting, then
``qmp_capabilities``, then commands, each answered by ``return`` or ``error``;
asynchronous ``event`` objects may come in between and are skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

__all__ = ["QmpError", "qmp_command", "reachable_path"]

#: A reply longer than this is no reply of the commands used here.
_MAX_LINE = 1 << 20


class QmpError(Exception):
    """The VM's QMP socket refused, closed, timed out or answered with an error."""


async def _lines(stream: trio.SocketStream):
    buffer = b""
    while True:
        while b"\n" not in buffer:
            chunk = await stream.receive_some(65536)
            if not chunk:
                raise QmpError("QEMU closed the QMP socket")
            buffer += chunk
            if len(buffer) > _MAX_LINE:
                raise QmpError("QMP reply too long")
        line, buffer = buffer.split(b"\n", 1)
        if line.strip():
            try:
                message = json.loads(line)
            except ValueError as exc:
                raise QmpError(f"QMP sent no JSON: {line[:80]!r}") from exc
            if not isinstance(message, dict):
                raise QmpError(f"QMP sent no object: {line[:80]!r}")
            yield message


async def _reply(lines) -> Any:
    async for message in lines:
        if "return" in message:
            return message["return"]
        if "error" in message:
            error = message["error"]
            raise QmpError(f"{error.get('class', 'Error')}: {error.get('desc', '')}"
                           if isinstance(error, dict) else str(error))
        # an event ({"event": …}) or the greeting: not our answer
    raise QmpError("QEMU closed the QMP socket")


#: A unix socket's path must fit in sockaddr_un (108 bytes with its NUL).
_MAX_SOCKET_PATH = 100


@contextlib.contextmanager
def reachable_path(socket: Path) -> Iterator[str]:
    """A path to ``socket`` short enough to connect to: itself, or, when it is too
    long (a deep storage folder), the same file through an open descriptor of its
    folder (``/proc/self/fd/N/name``)."""
    if len(os.fsencode(socket)) <= _MAX_SOCKET_PATH:
        yield str(socket)
        return
    folder = os.open(socket.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{folder}/{socket.name}"
    finally:
        os.close(folder)


async def qmp_command(socket: Path, command: str, *, timeout_s: float = 5.0) -> Any:
    """Run ``command`` on the VM whose QMP socket is ``socket``; its ``return``."""
    try:
        with trio.fail_after(timeout_s), reachable_path(socket) as path:
            stream = await trio.open_unix_socket(path)
            async with stream:
                lines = _lines(stream)
                greeting = await anext(lines)
                if "QMP" not in greeting:
                    raise QmpError(f"no QMP greeting: {str(greeting)[:80]}")
                await stream.send_all(b'{"execute": "qmp_capabilities"}\n')
                await _reply(lines)
                await stream.send_all(json.dumps({"execute": command}).encode() + b"\n")
                return await _reply(lines)
    except trio.TooSlowError as exc:
        raise QmpError(f"QMP {command} did not answer in {timeout_s:g} s") from exc
    except OSError as exc:
        raise QmpError(f"QMP socket {socket}: {exc.strerror or exc}") from exc
