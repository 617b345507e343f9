"""One HTTP request of the CLI, on the standard library.

``httpx.Client`` costs a command ~0.2 s of start-up (httpcore imports trio and
anyio); ``urllib`` ~20 ms, with the same environment proxies (``HTTP_PROXY``,
``HTTPS_PROXY``, ``NO_PROXY``). Connecting may take :data:`CONNECT_S`, the answer
``timeout`` (a server that is down is told within seconds, a slow answer is waited
for). Followers of event streams (``--wait``, ``--watch``, ``logs -f``) keep httpx.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

__all__ = ["CONNECT_S", "Answer", "Unreachable", "request"]

#: Seconds to connect (and, for https, to shake hands).
CONNECT_S = 5.0
#: Largest answer read (a listing of 500 jobs is a few hundred KiB).
MAX_ANSWER = 64 << 20


class Unreachable(Exception):
    """No answer: the connection failed, timed out or broke (the reason in ``str``)."""


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        """The body as JSON. Raises ValueError when it is not."""
        return json.loads(self.body)


class _QuickConnect:
    """A connection that connects within :data:`CONNECT_S` (or ``timeout`` if shorter:
    a shell's TAB waits a second in all), then waits ``timeout``."""

    timeout: float
    sock: Any

    def connect(self) -> None:
        wanted = self.timeout
        self.timeout = min(CONNECT_S, wanted)
        try:
            super().connect()  # type: ignore[misc]
        finally:
            self.timeout = wanted
        self.sock.settimeout(wanted)


class _Http(_QuickConnect, http.client.HTTPConnection):
    pass


class _Https(_QuickConnect, http.client.HTTPSConnection):
    pass


class _HttpHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_Http, req)


class _HttpsHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_Https, req, context=self._context)  # type: ignore[attr-defined]


_opener: urllib.request.OpenerDirector | None = None


def _open(request_: urllib.request.Request, timeout: float) -> Any:
    global _opener
    if _opener is None:
        _opener = urllib.request.build_opener(_HttpHandler, _HttpsHandler)
    return _opener.open(request_, timeout=timeout)


def request(method: str, url: str, *, headers: dict[str, str] | None = None,
            json_body: Any = None, params: dict[str, str] | None = None,
            timeout: float = 30.0) -> Answer:
    """``method url`` and its answer, whatever its status.

    Raises:
        Unreachable: no answer (refused, timed out, reset, a bad TLS handshake...).
    """
    if params:
        url += ("&" if "?" in url else "?") + urllib.parse.urlencode(params)
    data = None
    sent = {"accept": "application/json", **(headers or {})}
    if json_body is not None:
        data = json.dumps(json_body).encode()
        sent["content-type"] = "application/json"
    prepared = urllib.request.Request(url, data=data, headers=sent, method=method)
    try:
        try:
            with _open(prepared, timeout) as response:
                return Answer(response.status, response.reason or "", _read(response))
        except urllib.error.HTTPError as exc:  # an answer, not a failure to get one
            with exc:
                return Answer(exc.code, str(exc.reason or ""), _read(exc))
    except urllib.error.URLError as exc:
        raise Unreachable(str(exc.reason) or type(exc.reason).__name__) from None
    except (OSError, http.client.HTTPException) as exc:  # a timeout, a reset, a bad line
        raise Unreachable(str(exc) or type(exc).__name__) from None


def _read(response: Any) -> bytes:
    body = response.read(MAX_ANSWER + 1)
    if len(body) > MAX_ANSWER:
        raise http.client.HTTPException(f"an answer over {MAX_ANSWER >> 20} MiB")
    if getattr(response, "length", None):  # read(n) returns what came before the end
        raise http.client.IncompleteRead(body, response.length)
    return body
