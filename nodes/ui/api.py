"""The UI's client of app-node's public ``/api``: the same calls the CLI makes.

Every call carries the signed-in user's bearer token (or none, for sign-in and
sign-up). An answer other than success becomes :class:`ApiError` with the API's
code, message and field, which the pages show as they are (the API's messages
are written for people); a network failure is ``UNREACHABLE``.
"""

from __future__ import annotations

import http.cookiejar
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from nodes.kit.tls import client_tls
from runtime.sse import SseReader

__all__ = ["ApiClient", "ApiError", "open_http"]

#: Longest silence on one of the API's event streams before it counts as broken
#: (app-node sends a keep-alive every 15 s).
STREAM_SILENCE_S = 25.0


class ApiError(Exception):
    """An answer of the API other than success, or no answer."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None,
                 retry_after: str | None = None) -> None:
        super().__init__(message)
        #: The HTTP status (502 when app-node could not be reached).
        self.status = status
        self.code = code
        self.message = message
        #: The request field at fault (``name``, ``gpus``), if one is.
        self.field = field
        #: ``Retry-After`` of a 429, in seconds as the API sent it.
        self.retry_after = retry_after

    def readable(self) -> str:
        """The API's message for a form's summary, with when to try again after a 429."""
        text = self.message or self.code
        if self.status == 429 and self.retry_after:
            return f"{text} (try again in {self.retry_after} s)"
        return text


def open_http(api_url: str, timeout_s: float, *,
              limits: httpx.Limits | None = None) -> httpx.AsyncClient:
    """A client of app-node: no environment proxies, no cookie jar (one client serves
    every user; a ``Set-Cookie`` from the API is for no one here)."""
    jar = http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    return httpx.AsyncClient(base_url=f"{api_url}/api", trust_env=False, cookies=jar,
                             follow_redirects=False, timeout=timeout_s,
                             limits=limits or httpx.Limits(), verify=client_tls())


class ApiClient:
    """``/api`` as one user (``token``) or as nobody (None).

    Calls and event streams go through two clients: a stream holds its connection for
    as long as a page is open, and streams sharing the calls' pool would leave no
    connection for the calls (each page's snapshot among them) once a hundred pages
    were open.
    """

    def __init__(self, http: httpx.AsyncClient, streams: httpx.AsyncClient | None = None,
                 token: str | None = None, forwarded_for: str | None = None) -> None:
        self._http = http
        self._streams = streams or http
        self._token = token
        self._forwarded_for = forwarded_for

    def as_user(self, token: str, forwarded_for: str | None = None) -> ApiClient:
        """The API as the user of ``token``, for the browser at ``forwarded_for`` (the
        ``X-Forwarded-For`` chain app-node's rate limits and throttles read)."""
        return ApiClient(self._http, self._streams, token, forwarded_for)

    def for_browser(self, forwarded_for: str | None) -> ApiClient:
        """The API as nobody yet (sign-in, sign-up, an email's link), for that browser."""
        return ApiClient(self._http, self._streams, None, forwarded_for)

    def _headers(self) -> dict[str, str]:
        headers = {"authorization": f"Bearer {self._token}"} if self._token else {}
        if self._forwarded_for:
            headers["x-forwarded-for"] = self._forwarded_for
        return headers

    async def get(self, path: str, **params: Any) -> Any:
        return await self.call("GET", path, params={k: v for k, v in params.items()
                                                    if v is not None})

    async def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return await self.call("POST", path, json=body)

    @asynccontextmanager
    async def events(self, path: str, **params: Any
                     ) -> AsyncIterator[AsyncIterator[tuple[str, str]]]:
        """One of the API's event streams: ``(event, data)`` per event, ``("", "")``
        per keep-alive. :class:`ApiError` if it does not start."""
        headers = self._headers()
        timeout = httpx.Timeout(self._streams.timeout.connect, read=STREAM_SILENCE_S)
        try:
            async with self._streams.stream("GET", path, headers=headers, params=params,
                                         timeout=timeout) as response:
                if not response.is_success:
                    await response.aread()
                    _raise_for(response)
                yield _events_of(response)
        except httpx.TransportError as exc:
            raise ApiError(502, "UNREACHABLE", "app-node's event stream broke "
                           f"({type(exc).__name__})") from exc

    async def call(self, method: str, path: str, **options: Any) -> Any:
        """The JSON of a successful answer (None for 204); :class:`ApiError` otherwise."""
        headers = self._headers()
        try:
            response = await self._http.request(method, path, headers=headers, **options)
        except httpx.TransportError as exc:
            raise ApiError(502, "UNREACHABLE", "app-node did not answer "
                           f"({type(exc).__name__}); try again in a moment") from exc
        if response.status_code == 204:
            return None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.is_success:
            return body
        return _raise_for(response, body)


async def _events_of(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    reader = SseReader()
    async for line in response.aiter_lines():
        got = reader.line(line)
        if got is not None:
            yield got


def _raise_for(response: httpx.Response, body: Any = None) -> Any:
    if body is None:
        try:
            body = response.json()
        except ValueError:
            body = None
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        raise ApiError(response.status_code, "HTTP_ERROR",
                       f"app-node answered {response.status_code} without a message")
    field = error.get("field")
    raise ApiError(response.status_code, str(error.get("code", "HTTP_ERROR")),
                   str(error.get("message", "")),
                   field if isinstance(field, str) else None,
                   response.headers.get("retry-after"))
