"""A local Loki-compatible HTTP server for tests: push, query_range and ready.

No Loki can be installed here (no PyPI or Debian package), so the tests speak
to this server, which stores pushed streams in memory and answers as Loki's
HTTP API documents (shared/reference/kubevirt-cdi-vllm.md §6):

- ``POST /loki/api/v1/push``: ``Content-Type: application/json`` (anything
  else would be read as snappy protobuf by Loki and fail: 400 here),
  ``Content-Encoding: gzip`` allowed, body
  ``{"streams":[{"stream":{labels},"values":[["<ns string>","<line>"(,{meta})]]}]}``
  (``meta``, structured metadata, is kept and answered merged into the entry's
  stream labels, as Loki does without the ``categorize-labels`` flag);
  a timestamp that is not a string, or any malformed body, is a 400 with a
  plain-text message; success is 204.
- ``X-Scope-OrgID`` picks the tenant; without it, the tenant is ``fake``
  (Loki's tenant when ``auth_enabled: false``).
- ``GET /loki/api/v1/query_range``: ``query`` is a stream selector of
  ``label="value"`` matchers (Go string literals) and optional
  ``|= "text"`` line filters; ``start`` inclusive and ``end`` exclusive
  (ns; default the last hour); ``limit`` (default 100); ``direction``
  (``backward`` by default). The answer is
  ``{"status":"success","data":{"resultType":"streams","result":[...],"stats":{}}}``.
- ``GET /ready``: 200 ``ready``.

``fail_next(n, status)`` makes the next ``n`` pushes fail (nothing stored);
``pushes`` records every push received, failed or not.

For benchmarks (bench/monitor.py): ``arrivals=[]`` records, per accepted push,
the wall-clock time it was decoded and its entries' timestamps (the delay from
a record's ``time_ns`` to Loki); ``keep=False`` stores neither pushes nor
entries, so a long run costs no memory (``received`` still counts entries).
"""

from __future__ import annotations

import gzip
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from p2p.http import serve_asgi

DEFAULT_TENANT = "fake"

Labels = tuple[tuple[str, str], ...]


class LogQLError(ValueError):
    """The query is outside the subset this server parses (Loki answers 400)."""


_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
            "\\": "\\", '"': '"', "'": "'"}


def parse_go_string(text: str, pos: int) -> tuple[str, int]:
    """The Go double-quoted string literal at ``text[pos]``, and the index after it.

    Follows ``strconv.Unquote``: the single-character escapes, ``\\xNN``,
    ``\\uNNNN``, ``\\UNNNNNNNN`` and three-digit octal; a raw newline is an error.
    """
    if pos >= len(text) or text[pos] != '"':
        raise LogQLError(f"expected a string at {pos}")
    out: list[str] = []
    i = pos + 1
    while i < len(text):
        c = text[i]
        if c == '"':
            return "".join(out), i + 1
        if c == "\n":
            raise LogQLError("newline in string")
        if c != "\\":
            out.append(c)
            i += 1
            continue
        if i + 1 >= len(text):
            break
        e = text[i + 1]
        if e in _ESCAPES:
            out.append(_ESCAPES[e])
            i += 2
        elif e in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[e]
            digits = text[i + 2:i + 2 + width]
            if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise LogQLError(f"bad \\{e} escape at {i}")
            out.append(chr(int(digits, 16)))
            i += 2 + width
        elif e in "01234567":
            digits = text[i + 1:i + 4]
            if len(digits) != 3 or not all(d in "01234567" for d in digits):
                raise LogQLError(f"bad octal escape at {i}")
            out.append(chr(int(digits, 8)))
            i += 4
        else:
            raise LogQLError(f"unknown escape \\{e} at {i}")
    raise LogQLError("unterminated string")


_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\n":
        pos += 1
    return pos


def parse_query(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """``{a="x", b="y"} |= "t" ...`` -> (equality matchers, line-contains filters)."""
    pos = _skip_space(text, 0)
    if not text.startswith("{", pos):
        raise LogQLError("a log query starts with a stream selector")
    pos = _skip_space(text, pos + 1)
    matchers: list[tuple[str, str]] = []
    while not text.startswith("}", pos):
        if matchers:
            if not text.startswith(",", pos):
                raise LogQLError(f"expected , or }} at {pos}")
            pos = _skip_space(text, pos + 1)
        m = _NAME.match(text, pos)
        if m is None:
            raise LogQLError(f"expected a label name at {pos}")
        pos = _skip_space(text, m.end())
        if not text.startswith("=", pos) or text.startswith("=~", pos):
            raise LogQLError(f"only = matchers are supported (at {pos})")
        value, pos = parse_go_string(text, _skip_space(text, pos + 1))
        matchers.append((m.group(), value))
        pos = _skip_space(text, pos)
    if not matchers:
        raise LogQLError("queries require at least one matcher")
    pos = _skip_space(text, pos + 1)
    filters: list[str] = []
    while pos < len(text):
        if not text.startswith("|=", pos):
            raise LogQLError(f"only |= line filters are supported (at {pos})")
        value, pos = parse_go_string(text, _skip_space(text, pos + 2))
        filters.append(value)
        pos = _skip_space(text, pos)
    return matchers, filters


@dataclass
class Push:
    """One push as received: tenant, headers, decoded body (None if undecodable), answer."""

    tenant: str
    headers: dict[str, str]
    body: Any
    status: int


@dataclass
class LokiServer:
    """The in-memory store and the ASGI app over it."""

    #: tenant -> label set -> [(ts_ns, line, structured metadata)] in arrival order.
    streams: dict[str, dict[Labels, list[tuple[int, str, Labels]]]] = field(
        default_factory=dict)
    pushes: list[Push] = field(default_factory=list)
    url: str = ""
    #: None, or per accepted push: (time.time_ns() once decoded, its entries' ts_ns).
    arrivals: list[tuple[int, list[int]]] | None = None
    #: False: store no pushes and no entries (a benchmark's counter mode).
    keep: bool = True
    #: Entries accepted (2xx), in either mode.
    received: int = 0
    _fail: list[int] = field(default_factory=list)

    def fail_next(self, n: int, status: int = 500) -> None:
        """The next ``n`` pushes answer ``status`` and store nothing."""
        self._fail.extend([status] * n)

    def entries(self, tenant: str = DEFAULT_TENANT) -> list[tuple[Labels, int, str]]:
        """Every stored entry of ``tenant``."""
        return [(labels, ts, line) for labels, values in self.streams.get(tenant, {}).items()
                for ts, line, _ in values]

    def metadata(self, tenant: str = DEFAULT_TENANT) -> list[dict[str, str]]:
        """Every stored entry's structured metadata, in :meth:`entries`' order."""
        return [dict(meta) for values in self.streams.get(tenant, {}).values()
                for _, _, meta in values]

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/loki/api/v1/push", self._push, methods=["POST"]),
            Route("/loki/api/v1/query_range", self._query_range, methods=["GET"]),
            Route("/ready", lambda _: PlainTextResponse("ready"), methods=["GET"]),
        ])

    async def _push(self, request: Request) -> Response:
        tenant = request.headers.get("x-scope-orgid", DEFAULT_TENANT)
        push = Push(tenant, dict(request.headers), None, 204)
        if self.keep:
            self.pushes.append(push)
        raw = await request.body()
        if request.headers.get("content-encoding", "") == "gzip":
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError) as exc:
                return self._answer(push, 400, f"gzip: {exc}")
        if not request.headers.get("content-type", "").startswith("application/json"):
            return self._answer(push, 400, "snappy: corrupt input (not JSON)")
        try:
            body = json.loads(raw)
        except ValueError as exc:
            return self._answer(push, 400, f"loghttp.PushRequest: {exc}")
        if self.keep:
            push.body = body
        if self._fail:
            status = self._fail.pop(0)
            return self._answer(push, status, "injected failure")
        try:
            decoded = _decode_push(body)
        except ValueError as exc:
            return self._answer(push, 400, str(exc))
        if self.arrivals is not None:
            stamps = [ts for _, values in decoded for ts, _, _ in values]
            self.arrivals.append((time.time_ns(), stamps))
        self.received += sum(len(values) for _, values in decoded)
        if self.keep:
            store = self.streams.setdefault(tenant, {})
            for labels, values in decoded:
                store.setdefault(labels, []).extend(values)
        return self._answer(push, 204, "")

    @staticmethod
    def _answer(push: Push, status: int, message: str) -> Response:
        push.status = status
        if status == 204:
            return Response(status_code=204)
        return PlainTextResponse(message + "\n", status_code=status)

    async def _query_range(self, request: Request) -> Response:
        tenant = request.headers.get("x-scope-orgid", DEFAULT_TENANT)
        q = request.query_params
        try:
            matchers, filters = parse_query(q.get("query", ""))
            now = time.time_ns()
            start = int(q.get("start", now - 3600 * 10**9))
            end = int(q.get("end", now))
            limit = int(q.get("limit", 100))
            direction = q.get("direction", "backward")
            if direction not in ("forward", "backward"):
                raise ValueError(f"invalid direction {direction!r}")
        except ValueError as exc:
            return PlainTextResponse(f"parse error : {exc}\n", status_code=400)
        found: list[tuple[int, int, Labels, str]] = []  # (ts, arrival, labels, line)
        arrival = 0
        for labels, values in self.streams.get(tenant, {}).items():
            named = dict(labels)
            if any(named.get(k) != v for k, v in matchers):
                continue
            for ts, line, meta in values:
                arrival += 1
                if start <= ts < end and all(f in line for f in filters):
                    # Without the categorize-labels flag Loki answers an entry's
                    # structured metadata merged into its stream's labels.
                    merged = tuple(sorted({**named, **dict(meta)}.items())) if meta else labels
                    found.append((ts, arrival, merged, line))
        found.sort(key=lambda e: (e[0], e[1]), reverse=direction == "backward")
        result: dict[Labels, list[list[str]]] = {}
        for ts, _, labels, line in found[:limit]:
            result.setdefault(labels, []).append([str(ts), line])
        return JSONResponse({"status": "success", "data": {
            "resultType": "streams",
            "result": [{"stream": dict(labels), "values": values}
                       for labels, values in result.items()],
            "stats": {}}})


def _decode_push(body: Any) -> list[tuple[Labels, list[tuple[int, str, Labels]]]]:
    """The push body's streams, validated as Loki validates them (ValueError -> 400)."""
    if not isinstance(body, dict) or not isinstance(body.get("streams"), list):
        raise ValueError("body must be an object with a streams array")
    out = []
    for stream in body["streams"]:
        labels = stream.get("stream") if isinstance(stream, dict) else None
        values = stream.get("values") if isinstance(stream, dict) else None
        if (not isinstance(labels, dict) or not labels
                or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())):
            raise ValueError("stream labels must be a non-empty string map")
        if not isinstance(values, list):
            raise ValueError("values must be an array")
        decoded = []
        for value in values:
            if not isinstance(value, list) or len(value) not in (2, 3):
                raise ValueError("each value is [timestamp, line(, metadata)]")
            ts, line = value[0], value[1]
            if not isinstance(ts, str) or not ts.isdigit():
                raise ValueError(f"timestamp must be a string of unix nanoseconds: {ts!r}")
            if not isinstance(line, str):
                raise ValueError("line must be a string")
            meta = value[2] if len(value) == 3 else {}
            if not isinstance(meta, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
                raise ValueError("structured metadata must be a string map")
            decoded.append((int(ts), line, tuple(sorted(meta.items()))))
        out.append((tuple(sorted(labels.items())), decoded))
    return out


async def start_loki(nursery: trio.Nursery, server: LokiServer | None = None) -> LokiServer:
    """``server`` (a new :class:`LokiServer` by default) listening on ``127.0.0.1``
    (a free port), until the nursery ends."""
    server = server if server is not None else LokiServer()
    host, port = await nursery.start(lambda task_status: serve_asgi(
        server.app(), host="127.0.0.1", port=0, bind_error=lambda h, p, c: c,
        task_status=task_status))
    server.url = f"http://{host}:{port}"
    return server
