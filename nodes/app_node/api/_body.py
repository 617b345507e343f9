"""Request bodies, bounded: size per route, how many are read at once, JSON depth.

Theory of operation. A route's body is read only through :meth:`BodyReader.read`
(``Ctx.body`` calls it), which keeps these invariants:

- a body is never larger in memory than its route's limit (``RouteSpec.max_body_bytes``,
  else ``BodyLimits.max_body_bytes``, 1 MiB: every route here takes a small JSON
  object). A ``Content-Length`` beyond it is refused with 413 before a byte is
  read; a chunked body is counted as it streams and refused the moment it passes
  the limit. nginx's ``client_max_body_size`` defaults to 1 MiB as well.
- at most ``max_bodies_in_flight`` bodies (64) are being read at once: the
  65th request is refused at once with 503 ``SERVER_BUSY`` and ``Retry-After``
  rather than queued (a queue of bodies is memory too). So app-node holds at
  most 64 MiB of bodies whatever arrives.
- a body must arrive within ``body_timeout_s`` (30 s; 408 ``BODY_TIMEOUT``):
  a client trickling a byte a second cannot hold a slot for ever.
- JSON is nested at most ``max_json_depth`` deep (64): deeper is 400
  ``JSON_TOO_DEEP``, checked on the bytes before the parser runs (Python's
  parser recurses, and a body nested 100,000 deep raised ``RecursionError``,
  a 500 with a traceback).

A refused body is never read further, so the answer says ``Connection: close``:
the connection cannot carry another request.
"""

from __future__ import annotations

from typing import Any

import trio
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import ClientDisconnect, Request

from p2p.bodies import JsonBodyError, loads_bounded

from .. import codes
from ._common import ApiError

__all__ = ["BodyLimits", "BodyReader", "parse_json"]

_MIB = 1024 * 1024


class BodyLimits(BaseModel):
    """How app-node reads request bodies (``http`` settings)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The largest body of a route that names no limit of its own (bytes).
    max_body_bytes: int = Field(default=_MIB, ge=1, le=1 << 31)
    #: Bodies read at once; beyond: 503 ``SERVER_BUSY`` with ``Retry-After``.
    max_bodies_in_flight: int = Field(default=64, ge=1, le=100_000)
    #: The longest a body may take to arrive (seconds; 408 ``BODY_TIMEOUT``).
    body_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    #: The deepest nesting of arrays and objects in a JSON body.
    max_json_depth: int = Field(default=64, ge=1, le=10_000)
    #: ``Retry-After`` of a ``SERVER_BUSY`` answer (seconds).
    retry_after_s: int = Field(default=1, ge=1, le=3600)


def _too_large(limit: int, length: int | None = None) -> ApiError:
    said = f" ({length} bytes)" if length is not None else ""
    return ApiError(codes.BODY_TOO_LARGE, f"the request body{said} is beyond this route's "
                    f"limit of {limit} bytes; send less", headers={"connection": "close"})


class BodyReader:
    """Reads request bodies within :class:`BodyLimits`; one per app."""

    def __init__(self, limits: BodyLimits) -> None:
        self.limits = limits
        self._slots = trio.Semaphore(limits.max_bodies_in_flight)
        self.refused_busy = 0

    @property
    def in_flight(self) -> int:
        return self.limits.max_bodies_in_flight - self._slots.value

    async def read(self, request: Request, limit: int | None = None) -> bytes:
        """The whole body, at most ``limit`` bytes (the default limit when None).

        Raises:
            ApiError: 413 ``BODY_TOO_LARGE``, 503 ``SERVER_BUSY``, 408
                ``BODY_TIMEOUT``, 400 ``BAD_CONTENT_LENGTH``.
        """
        limit = self.limits.max_body_bytes if limit is None else limit
        declared = request.headers.get("content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                raise ApiError(codes.BAD_CONTENT_LENGTH, "Content-Length is not a number",
                               headers={"connection": "close"}) from None
            if length > limit:
                raise _too_large(limit, length)
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            self.refused_busy += 1
            raise ApiError(codes.SERVER_BUSY, "app-node is reading as many request bodies "
                           "as it allows; retry shortly", headers={
                               "retry-after": str(self.limits.retry_after_s),
                               "connection": "close"}) from None
        try:
            chunks: list[bytes] = []
            total = 0
            with trio.move_on_after(self.limits.body_timeout_s) as scope:
                async for chunk in request.stream():
                    total += len(chunk)
                    if total > limit:
                        raise _too_large(limit)
                    chunks.append(chunk)
            if scope.cancelled_caught:
                raise ApiError(codes.BODY_TIMEOUT, f"the request body did not arrive within "
                               f"{self.limits.body_timeout_s:g} s",
                               headers={"connection": "close"})
        except ClientDisconnect:
            raise ApiError(codes.CLIENT_DISCONNECTED, "the client left before sending "
                           "its whole body") from None
        finally:
            self._slots.release()
        return b"".join(chunks)

    def parse(self, raw: bytes) -> Any:
        """``raw`` as JSON within ``max_json_depth`` (:func:`parse_json`)."""
        return parse_json(raw, self.limits.max_json_depth)


def parse_json(raw: bytes, max_depth: int) -> Any:
    """``raw`` parsed as JSON, refusing nesting deeper than ``max_depth`` before parsing
    (the stack's :func:`p2p.bodies.loads_bounded`, as the inference proxy's); an
    empty body is ``null``.

    Raises:
        ApiError: 400 ``JSON_TOO_DEEP``; 422 ``INVALID`` when it is not JSON.
    """
    try:
        return loads_bounded(raw or b"null", max_depth=max_depth)
    except JsonBodyError as exc:
        if exc.code == "json_too_deep":
            raise ApiError(codes.JSON_TOO_DEEP, f"the JSON body is nested deeper than "
                           f"{max_depth} levels; flatten it") from None
        raise ApiError(codes.INVALID, "the body is not JSON; send a JSON object") from None
