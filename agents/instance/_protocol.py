"""Sans-IO frames of ``cosmicac-shell/1``: one shell session per mux channel.

A mux channel already keeps message boundaries and bounds message sizes, so a
frame is exactly one channel message: a msgpack array ``[kind, body]`` of at
most :data:`MAX_FRAME_BYTES`. Nothing here does I/O: :func:`encode` turns an
event into bytes, :func:`decode_client` / :func:`decode_server` turn bytes from
a peer into an event or raise :class:`RemoteProtocolError` (and nothing else,
whatever the bytes: the decoders are fuzzed), so the drivers in
:mod:`._server` and :mod:`._client` only move bytes and processes.
"""

from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass, field
from typing import Literal

import msgpack

__all__ = [
    "MAX_DATA_BYTES", "MAX_FRAME_BYTES", "PROTOCOL", "SIGNALS", "ClientEvent", "Error",
    "Exit", "Open", "RemoteProtocolError", "Resize", "ServerEvent", "ShellError", "Signal",
    "Started", "Stderr", "Stdin", "StdinEof", "Stdout", "decode_client", "decode_server",
    "encode",
]

#: The channel protocol (name and version) the shell service is served on.
PROTOCOL = "cosmicac-shell/1"
#: The largest data chunk in one STDIN/STDOUT/STDERR frame. 256 KiB: bulk output
#: costs per frame as well as per byte (bench/shell.py: 32 KiB frames spent more
#: CPU per byte than sshd); the mux's largest message is 512 KiB.
MAX_DATA_BYTES = 256 << 10
#: The largest frame either side sends or accepts (a data chunk and its header).
MAX_FRAME_BYTES = MAX_DATA_BYTES + (1 << 10)
#: Signals a client may send to the session's process group, by name.
SIGNALS = {name: getattr(_signal, f"SIG{name}") for name in
           ("INT", "TERM", "KILL", "HUP", "QUIT", "USR1", "USR2", "WINCH", "CONT", "STOP")}

_MAX_ARGS = 256
_MAX_ARG_CHARS = 4096
_MAX_ENV = 64
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_TERM = re.compile(r"[A-Za-z0-9.+_\-]{1,64}")

# Frame kinds: client→server below 16, server→client from 16.
_OPEN, _STDIN, _STDIN_EOF, _RESIZE, _SIGNAL = 1, 2, 3, 4, 5
_STARTED, _STDOUT, _STDERR, _EXIT, _ERROR = 16, 17, 18, 19, 20


class ShellError(Exception):
    """A session failed; ``code`` says how (``unauthorized``, ``protocol``,
    ``spawn_failed``, ``busy``, ``timeout``...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class RemoteProtocolError(ShellError):
    """The peer sent a frame that is not valid ``cosmicac-shell/1``."""

    def __init__(self, message: str) -> None:
        super().__init__("protocol", message)


# -- client → server -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Open:
    """Start the session: a shell on a PTY, or ``argv`` on pipes (``exec``)."""

    mode: Literal["pty", "exec"]
    #: The command; None runs the service's shell (``pty`` mode only).
    argv: tuple[str, ...] | None = None
    term: str = "xterm-256color"
    rows: int = 24
    cols: int = 80
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Stdin:
    data: bytes


@dataclass(frozen=True, slots=True)
class StdinEof:
    pass


@dataclass(frozen=True, slots=True)
class Resize:
    rows: int
    cols: int


@dataclass(frozen=True, slots=True)
class Signal:
    name: str


# -- server → client -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    pid: int


@dataclass(frozen=True, slots=True)
class Stdout:
    data: bytes


@dataclass(frozen=True, slots=True)
class Stderr:
    data: bytes


@dataclass(frozen=True, slots=True)
class Exit:
    """How the process ended: an exit ``code``, or the ``signal`` that killed it."""

    code: int | None = None
    signal: int | None = None


@dataclass(frozen=True, slots=True)
class Error:
    code: str
    message: str


ClientEvent = Open | Stdin | StdinEof | Resize | Signal
ServerEvent = Started | Stdout | Stderr | Exit | Error


def encode(event: ClientEvent | ServerEvent) -> bytes:
    """One frame for ``event``."""
    match event:
        case Open():
            body: object = {"mode": event.mode,
                            "argv": None if event.argv is None else list(event.argv),
                            "term": event.term, "rows": event.rows, "cols": event.cols,
                            "env": dict(event.env)}
            kind = _OPEN
        case Stdin(data=data):
            kind, body = _STDIN, bytes(data)
        case StdinEof():
            kind, body = _STDIN_EOF, None
        case Resize(rows=rows, cols=cols):
            kind, body = _RESIZE, [rows, cols]
        case Signal(name=name):
            kind, body = _SIGNAL, name
        case Started(pid=pid):
            kind, body = _STARTED, {"pid": pid}
        case Stdout(data=data):
            kind, body = _STDOUT, bytes(data)
        case Stderr(data=data):
            kind, body = _STDERR, bytes(data)
        case Exit(code=code, signal=sig):
            kind, body = _EXIT, {"code": code, "signal": sig}
        case Error(code=code, message=message):
            kind, body = _ERROR, {"code": code, "message": message[:1024]}
        case _:
            raise TypeError(f"not a shell event: {event!r}")
    frame = msgpack.packb([kind, body], use_bin_type=True)
    if len(frame) > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    return frame


def _unpack(frame: bytes) -> tuple[int, object]:
    if len(frame) > MAX_FRAME_BYTES:
        raise RemoteProtocolError(f"frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        value = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises many types on garbage
        raise RemoteProtocolError(f"not msgpack: {type(exc).__name__}") from None
    if (not isinstance(value, list) or len(value) != 2 or type(value[0]) is not int):
        raise RemoteProtocolError("a frame is [kind, body]")
    return value[0], value[1]


def _int(value: object, what: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise RemoteProtocolError(f"{what} must be an integer in [{low}, {high}]")
    return value


def _str(value: object, what: str, limit: int) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise RemoteProtocolError(f"{what} must be a string of at most {limit} characters")
    return value


def _bytes(value: object, what: str) -> bytes:
    if not isinstance(value, bytes) or len(value) > MAX_DATA_BYTES:
        raise RemoteProtocolError(f"{what} must be at most {MAX_DATA_BYTES} bytes")
    return value


def _map(value: object, what: str, keys: set[str]) -> dict:
    if not isinstance(value, dict) or set(value) != keys:
        raise RemoteProtocolError(f"{what} must be a map of {sorted(keys)}")
    return value


def _decode_open(body: object) -> Open:
    body = _map(body, "OPEN", {"mode", "argv", "term", "rows", "cols", "env"})
    mode = body["mode"]
    if mode not in ("pty", "exec"):
        raise RemoteProtocolError("OPEN mode must be 'pty' or 'exec'")
    argv = body["argv"]
    if argv is not None:
        if (not isinstance(argv, list) or not 1 <= len(argv) <= _MAX_ARGS
                or not all(isinstance(a, str) and len(a) <= _MAX_ARG_CHARS and "\0" not in a
                           for a in argv)):
            raise RemoteProtocolError(f"OPEN argv must be 1..{_MAX_ARGS} strings without NUL")
        argv = tuple(argv)
    elif mode == "exec":
        raise RemoteProtocolError("OPEN exec needs argv")
    term = _str(body["term"], "OPEN term", 64)
    if not _TERM.fullmatch(term):
        raise RemoteProtocolError("OPEN term has characters a terminal name has not")
    env = body["env"]
    if (not isinstance(env, dict) or len(env) > _MAX_ENV
            or not all(isinstance(k, str) and _ENV_NAME.fullmatch(k) and isinstance(v, str)
                       and len(v) <= _MAX_ARG_CHARS and "\0" not in v for k, v in env.items())):
        raise RemoteProtocolError(f"OPEN env must map at most {_MAX_ENV} names to strings")
    return Open(mode=mode, argv=argv, term=term, rows=_int(body["rows"], "rows", 1, 4096),
                cols=_int(body["cols"], "cols", 1, 4096), env=env)


def decode_client(frame: bytes) -> ClientEvent:
    """A frame from a client, as an event.

    Raises:
        RemoteProtocolError: the frame is not a valid client frame.
    """
    kind, body = _unpack(frame)
    if kind == _OPEN:
        return _decode_open(body)
    if kind == _STDIN:
        return Stdin(_bytes(body, "STDIN"))
    if kind == _STDIN_EOF:
        if body is not None:
            raise RemoteProtocolError("STDIN_EOF has no body")
        return StdinEof()
    if kind == _RESIZE:
        if not isinstance(body, list) or len(body) != 2:
            raise RemoteProtocolError("RESIZE is [rows, cols]")
        return Resize(_int(body[0], "rows", 1, 4096), _int(body[1], "cols", 1, 4096))
    if kind == _SIGNAL:
        if not isinstance(body, str) or body not in SIGNALS:
            raise RemoteProtocolError(f"SIGNAL must be one of {sorted(SIGNALS)}")
        return Signal(body)
    raise RemoteProtocolError(f"unknown client frame kind {kind}")


def decode_server(frame: bytes) -> ServerEvent:
    """A frame from a server, as an event.

    Raises:
        RemoteProtocolError: the frame is not a valid server frame.
    """
    kind, body = _unpack(frame)
    if kind == _STARTED:
        return Started(_int(_map(body, "STARTED", {"pid"})["pid"], "pid", 0, 2**31))
    if kind == _STDOUT:
        return Stdout(_bytes(body, "STDOUT"))
    if kind == _STDERR:
        return Stderr(_bytes(body, "STDERR"))
    if kind == _EXIT:
        body = _map(body, "EXIT", {"code", "signal"})
        code, sig = body["code"], body["signal"]
        if (code is None) == (sig is None):
            raise RemoteProtocolError("EXIT has exactly one of code and signal")
        return Exit(code=None if code is None else _int(code, "code", -(2**31), 2**31),
                    signal=None if sig is None else _int(sig, "signal", 1, 255))
    if kind == _ERROR:
        body = _map(body, "ERROR", {"code", "message"})
        return Error(_str(body["code"], "ERROR code", 64),
                     _str(body["message"], "ERROR message", 1024))
    raise RemoteProtocolError(f"unknown server frame kind {kind}")
