"""Request bodies an HTTP server reads: bounded in size, in how many at once, and in depth.

Three limits, for any server that reads whole bodies into memory:

- **size and time**: a body is at most ``limit`` bytes (413 as soon as the
  declared ``Content-Length`` or the bytes received pass it, before the rest
  is read) and must arrive within ``timeout_s`` (408): a client trickling a
  body holds nothing for long.
- **how many at once**: :class:`BodyBudget` (I/O-free) counts the bodies
  being read and the bytes of bodies held (until the request is answered),
  in all and per owner (an API key, say). Past an owner's share the answer is
  429 ``too_many_bodies``, so one client cannot take the room of all the
  others; past the total, 503 ``server_busy``. A declared length is
  reserved before the first byte is read. Both are answers a client retries.
- **depth**: :func:`loads_bounded` is ``json.loads`` with the nesting of
  arrays and objects bounded. ``json.loads`` recurses once per level: a body
  of 100,000 ``[`` raises ``RecursionError`` (not ``ValueError``), which a
  server turns into a 500 and a logged traceback. The depth is measured first,
  without recursion (in time linear in the body per level, about as long as
  ``json.loads`` takes); past ``max_depth`` the error's code is
  ``json_too_deep``, and any other bytes that are not JSON give
  ``invalid_json``. The value is the one ``json.loads(data)`` gives for the
  same bytes (the same encoding detection, the last of duplicate keys,
  ``NaN`` accepted), so a gateway reading a body with it and a server reading
  it with ``json.loads`` see the same document.

:func:`read_body` is the trio driver: chunks in, the whole body out, with a
:class:`BodyTicket` from the budget that the caller closes when the request
is done (the body's bytes stay counted until then).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterable, Hashable
from typing import Any

import trio

__all__ = [
    "MAX_JSON_DEPTH",
    "BodyBudget",
    "BodyRefused",
    "BodyTicket",
    "JsonBodyError",
    "json_depth",
    "loads_bounded",
    "read_body",
]

#: Deepest nesting of arrays and objects taken in a request body. OpenAI's
#: bodies nest a few levels (messages, content parts); a tool's JSON schema
#: adds two levels per nested object: 64 leaves room for thirty.
MAX_JSON_DEPTH = 64


class BodyRefused(Exception):
    """A body not read (or not read further): the HTTP ``status`` and a stable ``code``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class BodyBudget:
    """Bodies being read, and bytes of bodies held, at once: in all and per owner.

    Args:
        max_bytes: bytes of bodies held at once, all owners together.
        max_reads: bodies being read at once (not yet received whole).
        owner_bytes, owner_reads: the same for one owner (None: no share).
    """

    def __init__(self, *, max_bytes: int, max_reads: int, owner_bytes: int | None = None,
                 owner_reads: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.max_reads = max_reads
        self.owner_bytes = owner_bytes
        self.owner_reads = owner_reads
        #: Bytes held and bodies being read now, in all.
        self.held = 0
        self.reading = 0
        #: Per owner: [bytes held, bodies being read]; owners at zero are forgotten.
        self._owners: dict[Hashable, list[int]] = {}
        #: Bodies refused so far, by code.
        self.refused: dict[str, int] = {}

    def _refuse(self, status: int, code: str, message: str) -> BodyRefused:
        self.refused[code] = self.refused.get(code, 0) + 1
        return BodyRefused(status, code, message)

    def open(self, owner: Hashable, *, limit: int, declared: int | None = None) -> BodyTicket:
        """Start reading one body of at most ``limit`` bytes (``declared``: its
        ``Content-Length``, reserved at once).

        Raises:
            BodyRefused: 413 ``request_too_large`` (``declared`` over ``limit``),
                503 ``server_busy``, 429 ``too_many_bodies``.
        """
        if declared is not None and declared > limit:
            raise self._refuse(413, "request_too_large",
                               f"The body is larger than {limit} bytes.")
        mine = self._owners.get(owner)
        if self.owner_reads is not None and mine is not None and mine[1] >= self.owner_reads:
            raise self._refuse(429, "too_many_bodies", "Too many of your request bodies are "
                                                       "being received at once; wait for "
                                                       "some to finish.")
        if self.reading >= self.max_reads:
            raise self._refuse(503, "server_busy", "Too many request bodies are being "
                                                   "received at once; try again shortly.")
        if mine is None:
            mine = self._owners[owner] = [0, 0]
        mine[1] += 1
        self.reading += 1
        ticket = BodyTicket(self, owner, limit)
        if declared:
            try:
                ticket.grow(declared)
            except BodyRefused:
                ticket.close()
                raise
        return ticket

    def _take(self, owner: Hashable, size: int) -> None:
        mine = self._owners[owner]
        if self.owner_bytes is not None and mine[0] + size > self.owner_bytes:
            raise self._refuse(429, "too_many_bodies", "Your requests in progress hold too "
                                                       "many bytes of bodies; wait for some "
                                                       "to finish.")
        if self.held + size > self.max_bytes:
            raise self._refuse(503, "server_busy", "Too many request bytes are held at "
                                                   "once; try again shortly.")
        mine[0] += size
        self.held += size

    def _give_back(self, owner: Hashable, size: int, *, reading: bool) -> None:
        mine = self._owners[owner]
        mine[0] -= size
        self.held -= size
        if reading:
            mine[1] -= 1
            self.reading -= 1
        if mine == [0, 0]:
            del self._owners[owner]


class BodyTicket:
    """One body's share of a :class:`BodyBudget`; :meth:`close` gives it all back."""

    def __init__(self, budget: BodyBudget, owner: Hashable, limit: int) -> None:
        self._budget = budget
        self._owner = owner
        self.limit = limit
        #: Bytes reserved (the declared length, or what arrived if more).
        self.reserved = 0
        #: Bytes received.
        self.received = 0
        self.reading = True
        self.closed = False

    def grow(self, size: int) -> None:
        """Reserve room for ``size`` more bytes of the body than are reserved.

        Raises:
            BodyRefused: 413 past ``limit``; 503 or 429 past the budget.
        """
        if self.reserved + size > self.limit:
            raise self._budget._refuse(413, "request_too_large",
                                       f"The body is larger than {self.limit} bytes.")
        self._budget._take(self._owner, size)
        self.reserved += size

    def received_bytes(self, size: int) -> None:
        """``size`` more bytes arrived: reserve what the declared length did not cover."""
        self.received += size
        if self.received > self.reserved:
            self.grow(self.received - self.reserved)

    def finished_reading(self) -> None:
        """The body is whole: its read slot is free; its bytes stay held until :meth:`close`."""
        if self.reading and not self.closed:
            self.reading = False
            self._budget._give_back(self._owner, 0, reading=True)

    def close(self) -> None:
        """The request is done: everything given back (idempotent)."""
        if not self.closed:
            self.closed = True
            if self.reserved or self.reading:
                self._budget._give_back(self._owner, self.reserved, reading=self.reading)
            self.reading = False


async def read_body(chunks: AsyncIterable[bytes], ticket: BodyTicket, *,
                    timeout_s: float) -> bytes:
    """The whole body from ``chunks``, counted on ``ticket``, within ``timeout_s``.

    The ticket stays open (its bytes held): the caller closes it when the
    request is done.

    Raises:
        BodyRefused: 413, 503, 429 (from the ticket), 408 ``body_timeout``.
    """
    parts: list[bytes] = []
    with trio.move_on_after(timeout_s) as scope:
        async for chunk in chunks:
            if chunk:
                ticket.received_bytes(len(chunk))
                parts.append(chunk)
    if scope.cancelled_caught:
        raise ticket._budget._refuse(408, "body_timeout",
                                     f"The body did not arrive within {timeout_s:g} s.")
    ticket.finished_reading()
    return b"".join(parts)


class JsonBodyError(ValueError):
    """A body that is not JSON, or nested too deeply; ``code`` is stable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_PARENS = bytes.maketrans(b"[]{}", b"()()")
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))


def json_depth(data: bytes | str, *, cap: int | None = None) -> int:
    """How deep the arrays and objects of a JSON text nest (0: a scalar), counted
    up to ``cap + 1`` at most.

    Exact for valid JSON (escapes and strings are removed first, and UTF-8
    never has an ASCII byte inside a longer character); for other text some
    number, at least the brackets left open (``json.loads`` refuses it anyway).
    Linear per level: the innermost pairs are removed, all at once, once per level.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    brackets = _STRING.sub(b"", _ESCAPE.sub(b"", raw)).translate(_PARENS, _NOT_BRACKETS)
    depth = 0
    while brackets and (cap is None or depth <= cap):
        fewer = brackets.replace(b"()", b"")
        if len(fewer) == len(brackets):
            # Unbalanced, not JSON: count what is left open as nesting, so that
            # an endless "[[[[" is too deep rather than a RecursionError.
            return depth + brackets.count(b"(")
        brackets, depth = fewer, depth + 1
    return depth


def loads_bounded(data: bytes | str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads(data)``, refusing bodies nested deeper than ``max_depth``.

    Raises:
        JsonBodyError: ``json_too_deep``, or ``invalid_json`` for bytes that
            are not JSON (bad syntax, bad UTF-8/16/32, an integer of more than
            4300 digits).
    """
    try:
        if isinstance(data, str):
            text, utf8 = data, None
        else:
            encoding = json.detect_encoding(data)
            text = data.decode(encoding, "surrogatepass")
            utf8 = data if encoding == "utf-8" else None
    except UnicodeDecodeError as exc:
        raise JsonBodyError("invalid_json", f"The body is not valid JSON: {exc}") from None
    # The depth is at most the number of openers: most bodies stop here.
    if (text.count("[") + text.count("{") > max_depth
            and json_depth(text if utf8 is None else utf8, cap=max_depth) > max_depth):
        raise JsonBodyError("json_too_deep", f"The body's JSON nests more than "
                                                 f"{max_depth} levels deep.")
    try:
        return json.loads(text)
    except RecursionError:  # only if max_depth is set beyond the interpreter's limit
        raise JsonBodyError("json_too_deep", "The body's JSON nests too deeply.") from None
    except ValueError as exc:
        raise JsonBodyError("invalid_json", f"The body is not valid JSON: {exc}") from None
