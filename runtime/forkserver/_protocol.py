"""The fork server's messages (sans I/O): one JSON object per SEQPACKET message,
every field checked before anything is done with it."""

from __future__ import annotations

import array
import json
from collections.abc import Mapping
from dataclasses import dataclass

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


def _fds(*fds: int) -> bytes:
    """Descriptors as the ancillary data of one SCM_RIGHTS message."""
    return array.array("i", fds).tobytes()
