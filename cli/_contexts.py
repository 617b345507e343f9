"""The CLI's contexts: several servers and accounts in one configuration.

A context is a name for a server and the session the CLI holds there, as
kubectl's kubeconfig contexts and gh's hosts are. They are kept in
``<config dir>/contexts.json`` (mode 0600: it holds bearer tokens), replaced
whole on every change (a reader sees the old file or the new one), under an
advisory lock so two commands changing it at once (two logins) do not lose
one of the changes::

    {"version": 1,
     "current": "prod",
     "contexts": {
       "prod": {"server": "https://cosmic.example.com", "email": "ada@example.com",
                "token": "...", "expires_at": 1765432100.0},
       "127.0.0.1:5173": {"server": "http://127.0.0.1:5173", "email": "ada@example.com",
                          "token": null, "expires_at": null}}}

``token`` and ``expires_at`` are null once logged out (the context, its server
and its account are kept, so ``login --context prod`` needs neither again).
Keys this version does not know are kept as they are when the file is
rewritten. The active team is not here: it is the server's (``PUT
/api/me/active-team``), per account.

Which context a command uses: ``--context NAME`` (anywhere before ``--``;
``cli.main`` turns it into ``$COSMICAC_CONTEXT``), else ``$COSMICAC_CONTEXT``,
else the file's ``current``. A name that is not in the file is a usage error
listing the known ones.

Before contexts, the CLI kept one session in ``<config dir>/session.json``.
Whenever a command reads the contexts and finds one there (kept by an older
cosmicac, or written by a script), the session is taken in as a login would
take it (:func:`login_name`: the first one becomes a context named after its
server's ``host:port``), made current, and ``session.json`` is removed once
``contexts.json`` is written; a ``session.json`` that cannot be read is left
where it is, untouched.

A file that cannot be parsed, or holds a field of the wrong type, is never
rewritten: every command that needs it stops with :class:`ContextsFileError`,
which names the file and what is wrong with it.

This module does no printing and knows nothing of typer: ``cli.session`` and
``cli.context`` turn its errors into the CLI's one-line errors and exit codes.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ._config import config_dir

__all__ = ["CONTEXTS_FILE", "ENV", "LEGACY_SESSION_FILE", "Context", "Contexts",
           "ContextsError", "ContextsFileError", "UnknownContext", "check_name", "choose",
           "contexts_path", "derive_name", "edit", "explicit_name", "login_name", "parse",
           "read", "selected_name"]

CONTEXTS_FILE = "contexts.json"
LEGACY_SESSION_FILE = "session.json"
#: The environment variable that names the context (``--context`` sets it).
ENV = "COSMICAC_CONTEXT"
_VERSION = 1
#: A name longer than this is surely a mistake (and makes every table unreadable).
MAX_NAME_CHARS = 200
_FIELDS = ("server", "email", "token", "expires_at")


class ContextsError(Exception):
    """Base of this module's errors: the message is one line for the user.

    ContextsError
    ├── ContextsFileError   contexts.json cannot be parsed, or is not a contexts file
    ├── UnknownContext      a name that is not in the file
    └── (itself)            a bad name, or a name already taken
    """


class ContextsFileError(ContextsError):
    """``contexts.json`` cannot be used; it is left as it is."""


class UnknownContext(ContextsError):
    """A context name that is not in the file (``known``: the names that are)."""

    def __init__(self, name: str, known: list[str], why: str = "") -> None:
        listed = ", ".join(repr(n) for n in known) if known else "none yet (cosmicac login)"
        super().__init__(f"no context named {name!r}{why}; known contexts: {listed}")
        self.name, self.known = name, known


@dataclass(frozen=True)
class Context:
    """A server and the session the CLI holds there (none after ``logout``)."""

    name: str
    server: str
    email: str | None = None
    token: str | None = None
    #: Unix time the token stops working (None with no token).
    expires_at: float | None = None
    #: Keys of a newer version, kept as they are.
    extra: Mapping[str, Any] = field(default_factory=dict)

    def has_session(self, now: float) -> bool:
        """Whether it holds a token that has not expired."""
        return bool(self.token) and (self.expires_at or 0) > now

    def logged_out(self) -> Context:
        return replace(self, token=None, expires_at=None)

    def to_json(self) -> dict[str, Any]:
        return {**self.extra, "server": self.server, "email": self.email,
                "token": self.token, "expires_at": self.expires_at}


@dataclass
class Contexts:
    """The whole file: the contexts by name and the current one's name."""

    contexts: dict[str, Context] = field(default_factory=dict)
    current: str | None = None
    #: Top-level keys of a newer version, kept as they are.
    extra: dict[str, Any] = field(default_factory=dict)

    def names(self) -> list[str]:
        return sorted(self.contexts)

    def get(self, name: str, why: str = "") -> Context:
        """The context ``name``. Raises UnknownContext."""
        found = self.contexts.get(name)
        if found is None:
            raise UnknownContext(name, self.names(), why)
        return found

    def put(self, context: Context) -> None:
        self.contexts[context.name] = context

    def rename(self, old: str, new: str) -> None:
        """Raises UnknownContext for ``old``, ContextsError for a bad or taken ``new``."""
        found = self.get(old)
        check_name(new)
        if new == old:
            return
        if new in self.contexts:
            raise ContextsError(f"a context named {new!r} exists already: delete or rename "
                                f"it first")
        del self.contexts[old]
        self.put(replace(found, name=new))
        if self.current == old:
            self.current = new

    def delete(self, name: str) -> Context:
        """Remove ``name`` (no longer current if it was). Raises UnknownContext."""
        found = self.get(name)
        del self.contexts[name]
        if self.current == name:
            self.current = None
        return found

    def to_json(self) -> str:
        return json.dumps({**self.extra, "version": _VERSION, "current": self.current,
                           "contexts": {name: self.contexts[name].to_json()
                                        for name in self.names()}}, indent=2) + "\n"


# -- names --------------------------------------------------------------------------


def check_name(name: str) -> str:
    """``name`` if it can name a context. Raises ContextsError saying why not.

    A name is what a user types after ``--context`` and what a table shows: one
    printable word, no ``/`` (kubectl's names may hold one, but ours may one day be
    paths of per-context files) and no leading ``-`` (it would read as an option).
    """
    if not name:
        raise ContextsError("a context's name cannot be empty")
    if len(name) > MAX_NAME_CHARS:
        raise ContextsError(f"a context's name has at most {MAX_NAME_CHARS} characters, "
                            f"not {len(name)}")
    bad = next((ch for ch in name if not ch.isprintable() or ch.isspace() or ch in "/\\"),
               None)
    if bad is not None:
        raise ContextsError(f"a context's name cannot hold {bad!r}: {name!r}")
    if name.startswith("-"):
        raise ContextsError(f"a context's name cannot start with '-': {name!r}")
    return name


def derive_name(server: str) -> str:
    """The name a server's context gets by default: its ``host:port`` (``host`` alone
    for the scheme's own port), never the user and password a URL may carry; else
    ``default``."""
    from urllib.parse import urlsplit  # here: ~2 ms that only a login needs

    try:
        parts = urlsplit(server)
        host, port = parts.hostname, parts.port
    except ValueError:  # a port that is not a number
        return "default"
    if not host:
        return "default"
    host = f"[{host}]" if ":" in host else host
    name = host if port is None else f"{host}:{port}"
    try:
        return check_name(name)
    except ContextsError:
        return "default"


def login_name(contexts: Contexts, server: str, email: str, explicit: str | None,
               now: float) -> str:
    """The context a login as ``email`` on ``server`` goes into (created or updated).

    ``explicit`` (``--context`` or ``$COSMICAC_CONTEXT``) wins. Otherwise the
    login updates a context of that server that is this account's or holds no
    session (the current one first, then by name), so logging in again, or after
    ``logout``, reuses it; a new one is named after the server (``host:port``),
    or, when that name holds another account's session (a second account on the
    same server), ``EMAIL@host:port``; ``-2``, ``-3``... if that is taken too.
    """
    if explicit is not None:
        return check_name(explicit)

    def reusable(context: Context | None) -> bool:
        return context is not None and context.server == server and (
            context.email == email or not context.has_session(now))

    ordered = ([contexts.current] if contexts.current else []) + contexts.names()
    for name in ordered:
        found = contexts.contexts.get(name)
        if reusable(found) and (found.email == email or name == contexts.current):
            return name
    base = derive_name(server)
    if base not in contexts.contexts or reusable(contexts.contexts[base]):
        return base
    for name in (f"{email}@{base}", *(f"{email}@{base}-{n}" for n in range(2, 1000))):
        try:
            check_name(name)
        except ContextsError:  # an email with a character a name cannot hold
            break
        if name not in contexts.contexts or reusable(contexts.contexts[name]):
            return name
    number = 2
    while f"{base}-{number}" in contexts.contexts:
        number += 1
    return f"{base}-{number}"


# -- the file -----------------------------------------------------------------------


def parse(data: bytes, where: Path | str = CONTEXTS_FILE) -> Contexts:
    """The contexts in ``data`` (a ``contexts.json``). Raises ContextsFileError
    naming ``where`` and the first thing wrong."""

    def bad(what: str) -> ContextsFileError:
        return ContextsFileError(f"{where} is not a contexts file ({what}); it was left "
                                 f"as it is: fix it, or move it away and log in again")

    try:
        document = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"not JSON: {exc}") from None
    except RecursionError:  # "[[[[..." deeper than the interpreter's stack
        raise bad("not JSON: nested too deep") from None
    if not isinstance(document, dict):
        raise bad("not a JSON object")
    version = document.get("version", _VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or version > _VERSION:
        raise bad(f"version {version!r}, this cosmicac reads version {_VERSION}: "
                  f"a newer cosmicac wrote it")
    current = document.get("current")
    if current is not None and not isinstance(current, str):
        raise bad("'current' is not a string")
    listed = document.get("contexts", {})
    if not isinstance(listed, dict):
        raise bad("'contexts' is not an object")
    contexts: dict[str, Context] = {}
    for name, entry in listed.items():
        try:
            check_name(name)
        except ContextsError as exc:
            raise bad(str(exc)) from None
        if not isinstance(entry, dict):
            raise bad(f"context {name!r} is not an object")
        server = entry.get("server")
        if not isinstance(server, str) or not server.startswith(("http://", "https://")):
            raise bad(f"context {name!r}: 'server' is not an http:// or https:// URL")
        for key in ("email", "token"):
            if entry.get(key) is not None and not isinstance(entry[key], str):
                raise bad(f"context {name!r}: {key!r} is not a string")
        expires_at = entry.get("expires_at")
        if expires_at is not None and (isinstance(expires_at, bool)
                                       or not isinstance(expires_at, int | float)
                                       or not math.isfinite(expires_at)):
            raise bad(f"context {name!r}: 'expires_at' is not a number")
        contexts[name] = Context(
            name, server, entry.get("email"), entry.get("token") or None,
            None if expires_at is None else float(expires_at),
            {k: v for k, v in entry.items() if k not in _FIELDS})
    extra = {k: v for k, v in document.items() if k not in ("version", "current", "contexts")}
    return Contexts(contexts, current, extra)


def contexts_path() -> Path:
    return config_dir(None) / CONTEXTS_FILE


#: What the root callback got from ``--context``/``$COSMICAC_CONTEXT`` for this
#: command (it runs before every command: a test's earlier command leaves nothing).
_chosen: str | None = None


def choose(name: str | None) -> None:
    """The root callback's ``--context`` (or ``$COSMICAC_CONTEXT``) for this command."""
    global _chosen
    _chosen = name or None


def explicit_name() -> str | None:
    """The context named by ``--context`` or ``$COSMICAC_CONTEXT``, if any."""
    return _chosen or os.environ.get(ENV) or None


def selected_name(contexts: Contexts) -> tuple[str | None, bool]:
    """``(name, explicit)``: the context commands use now (``--context``, else
    ``$COSMICAC_CONTEXT``, else the file's current one), and whether it was named
    explicitly (then a name not in the file is an error, not "not logged in")."""
    named = explicit_name()
    if named is not None:
        return named, True
    return contexts.current, False


def read() -> Contexts:
    """The contexts, as the file holds them (none when there is no file); an old
    ``session.json`` is moved into a context first. Raises ContextsFileError, or
    OSError when the file cannot be read at all (then it is not touched either)."""
    path = contexts_path()
    if _legacy_session() is not None:
        with edit() as contexts:  # under the lock: another command may be taking it too
            return contexts
    try:
        return parse(path.read_bytes(), path)
    except FileNotFoundError:
        return Contexts()


@contextmanager
def edit() -> Iterator[Contexts]:
    """Read, change and write the contexts under an exclusive lock (on
    ``.contexts.lock`` beside the file): the body changes the yielded Contexts; it is
    written atomically (0600) when the body returns, not when it raises. A
    ``session.json`` is taken in first. Raises ContextsFileError (nothing is
    written) or OSError."""
    import fcntl

    path = contexts_path()
    if not path.parent.is_dir():
        from p2p.files import private_folder

        private_folder(path.parent)
    lock = os.open(path.parent / f".{CONTEXTS_FILE}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            contexts = parse(path.read_bytes(), path)
        except FileNotFoundError:
            contexts = Contexts()
        legacy = _legacy_session()
        if legacy is not None:
            name = login_name(contexts, legacy.server, legacy.email or "", None, time.time())
            kept = contexts.contexts.get(name)
            contexts.put(replace(legacy, name=name, extra=kept.extra if kept else {}))
            contexts.current = name
        yield contexts
        from p2p.files import write_atomically

        write_atomically(path, contexts.to_json().encode(), mode=0o600)
        if legacy is not None:  # it lives on in contexts.json now
            (path.parent / LEGACY_SESSION_FILE).unlink(missing_ok=True)
    finally:
        os.close(lock)  # releases the lock


def _legacy_session() -> Context | None:
    """The session an older cosmicac kept in ``session.json``, as a context (named
    after its server until :func:`login_name` names it), or None (no file, or one
    that cannot be read: left alone)."""
    try:
        document = json.loads((config_dir(None) / LEGACY_SESSION_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict):
        return None
    server, token, email = (document.get(k) for k in ("server", "token", "email"))
    expires_at = document.get("expires_at")
    if not all(isinstance(v, str) for v in (server, token, email)) or isinstance(
            expires_at, bool) or not isinstance(expires_at, int | float) or \
            not server.startswith(("http://", "https://")):
        return None
    return Context(derive_name(server), server, email, token, float(expires_at))
