"""Request bodies of the model servers this package runs itself, read within bounds.

The local model server (:mod:`agents.inference.server`) and the Parakeet
server (:mod:`agents.inference.runtimes.parakeet_server`) listen on loopback
for their agent, but any local process can reach the port: each reads bodies
through :mod:`p2p.bodies`, at most ``limit`` bytes (the declared length checked
before reading), within :data:`BODY_TIMEOUT_S`, and at most
:data:`MAX_BODY_READS` bodies and :data:`MAX_BODY_BYTES_HELD` bytes at once
(:func:`install_budget` puts the app's :class:`~p2p.bodies.BodyBudget` in its
state). Refusals are :class:`OpenAIError` s: 413, 408, 503.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

import trio
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.formparsers import FormParser, MultiPartException, MultiPartParser
from starlette.requests import Request

from contracts.inference import MAX_BODY
from p2p.bodies import BodyBudget, BodyRefused, BodyTicket, read_body

from ._openai_errors import OpenAIError

__all__ = ["BODY_TIMEOUT_S", "MAX_BODY_BYTES_HELD", "MAX_BODY_READS", "install_budget",
           "read_bounded", "read_form_bounded"]

#: Request bodies being read at once, and their bytes held at once: the agent
#: sends at most a few bodies of ``MAX_BODY``; anything beyond is a 503.
MAX_BODY_READS = 64
MAX_BODY_BYTES_HELD = 8 * MAX_BODY
#: A body must arrive within this long (408 otherwise).
BODY_TIMEOUT_S = 60.0


def install_budget(app: Starlette) -> None:
    """Give ``app`` the budget its requests' bodies are read within."""
    app.state.bodies = BodyBudget(max_bytes=MAX_BODY_BYTES_HELD, max_reads=MAX_BODY_READS)


def _refused(exc: BodyRefused, too_large: OpenAIError | None) -> OpenAIError:
    if exc.status == 413 and too_large is not None:
        return too_large
    return OpenAIError(exc.status, str(exc))


def _open(request: Request, limit: int, too_large: OpenAIError | None) -> BodyTicket:
    declared = request.headers.get("content-length", "")
    try:
        return request.app.state.bodies.open(
            None, limit=limit, declared=int(declared) if declared.isdigit() else None)
    except BodyRefused as exc:
        raise _refused(exc, too_large) from None


async def read_bounded(request: Request, limit: int) -> bytes:
    """The request's whole body, at most ``limit`` bytes.

    Raises:
        OpenAIError: 413 past ``limit``, 503 past the budget, 408 too slow.
    """
    ticket = _open(request, limit, None)
    try:
        return await read_body(request.stream(), ticket, timeout_s=BODY_TIMEOUT_S)
    except BodyRefused as exc:
        raise _refused(exc, None) from None
    finally:
        ticket.close()


async def read_form_bounded(request: Request, limit: int, *, too_large: OpenAIError,
                            max_files: int = 1, max_fields: int = 32) -> FormData:
    """The request's form, as Starlette's ``request.form()`` reads it (multipart with
    files spooled, or urlencoded), within the bounds; the caller closes it
    (``await form.close()``).

    Raises:
        OpenAIError: ``too_large`` past ``limit``; 503, 408; 400 for a malformed body.
    """
    ticket = _open(request, limit, too_large)

    async def counted() -> AsyncGenerator[bytes, None]:
        async for chunk in request.stream():
            ticket.received_bytes(len(chunk))
            yield chunk
        ticket.finished_reading()

    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        with trio.fail_after(BODY_TIMEOUT_S):
            if kind == "multipart/form-data":
                return await MultiPartParser(request.headers, counted(), max_files=max_files,
                                             max_fields=max_fields).parse()
            if kind == "application/x-www-form-urlencoded":
                return await FormParser(request.headers, counted(),
                                        max_fields=max_fields).parse()
            return FormData()  # as Starlette's request.form() reads other types
    except MultiPartException as exc:
        raise OpenAIError(400, f"bad multipart body: {exc.message}") from None
    except BodyRefused as exc:
        raise _refused(exc, too_large) from None
    except trio.TooSlowError:
        raise OpenAIError(408, f"the body did not arrive within {BODY_TIMEOUT_S:g} s") from None
    finally:
        ticket.close()
