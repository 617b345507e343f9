"""The entry point's decisions, without I/O: which service a path goes to, what headers cross.

Routing (seeds/architecture.txt: "Caddy proxies /api to cosmicac-app-node,
/inference to cosmicac-proxy-inference, and /monitor to cosmicac-wrk-monitor.
Every other path serves the web interface"):

| path | service | path upstream |
| --- | --- | --- |
| ``/api``, ``/api/…`` | app-node | unchanged (app-node serves under ``/api``) |
| ``/inference``, ``/inference/…`` | proxy-inference | without ``/inference`` (``/`` if empty) |
| ``/monitor``, ``/monitor/…`` | wrk-monitor | without ``/monitor`` (``/`` if empty) |
| anything else | the web UI | unchanged (no UI set: the landing page, GET and HEAD only) |

A prefix matches whole segments only: ``/apis`` is not ``/api``. Paths are
matched on the raw bytes the client sent (percent-escapes kept as they are),
so ``/inference/v1/a%2Fb`` reaches the proxy as ``/v1/a%2Fb``. Caddy's
``handle_path`` does the same stripping (deploy/Caddyfile).

Headers, RFC 9110 §7.6.1: hop-by-hop headers (``Connection``, ``Keep-Alive``,
``TE``, ``Trailer``, ``Transfer-Encoding``, ``Upgrade``, ``Proxy-*``) and
every header the ``Connection`` header names are dropped in both directions;
each hop sets its own framing. ``Host`` is the upstream's own (the client's
goes in ``X-Forwarded-Host``). ``X-Forwarded-For`` is replaced, never appended
to: the entry point trusts no proxy in front of it, as Caddy does by default
(``trusted_proxies`` unset), so a client cannot forge its address. ``Expect``
is dropped: the server in front already answered ``100 Continue``. Upstream
``Date`` and ``Server`` are dropped because hypercorn adds its own, and the
RFC allows one of each.
"""

from __future__ import annotations

import enum
import html
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "HOP_BY_HOP",
    "Forward",
    "Service",
    "error_body",
    "landing_page",
    "request_headers",
    "response_headers",
    "route",
]

Headers = list[tuple[bytes, bytes]]


class Service(enum.StrEnum):
    """Where a request goes; the value is the label in logs, metrics and errors."""

    #: app-node's HTTP API.
    API = "api"
    #: proxy-inference's OpenAI-compatible API.
    INFERENCE = "inference"
    #: wrk-monitor.
    MONITOR = "monitor"
    #: The web UI (nodes/ui).
    UI = "ui"
    #: The page linking the API docs, where no web UI is configured.
    LANDING = "landing"


#: The daemon each service stands for, named in error messages.
DAEMONS = {Service.API: "app-node", Service.INFERENCE: "proxy-inference",
           Service.MONITOR: "wrk-monitor", Service.UI: "ui", Service.LANDING: "entry"}

#: (prefix, service, strip the prefix?) in matching order.
_PREFIXES: tuple[tuple[bytes, Service, bool], ...] = (
    (b"/api", Service.API, False),
    (b"/inference", Service.INFERENCE, True),
    (b"/monitor", Service.MONITOR, True),
)

#: RFC 9110 §7.6.1 and RFC 9112 (``Transfer-Encoding``); ``Proxy-*`` by prefix.
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"te", b"trailer",
                        b"transfer-encoding", b"upgrade"})
#: Replaced by our own values on the way up.
_FORWARDED = frozenset({b"host", b"expect", b"x-forwarded-for", b"x-forwarded-proto",
                        b"x-forwarded-host", b"x-forwarded-prefix"})
#: Set again by hypercorn on the way down.
_OURS_DOWN = frozenset({b"date", b"server"})


@dataclass(frozen=True)
class Forward:
    """Where one request goes: its service and the raw path (with query) for the upstream."""

    service: Service
    #: The raw path to ask the upstream for, after any prefix was stripped,
    #: with ``?query`` if the client sent one.
    target: bytes
    #: The prefix removed from the path (``b""`` for app-node).
    prefix: bytes


def route(raw_path: bytes, query: bytes = b"") -> Forward:
    """The service for ``raw_path`` and the path to ask it for.

    Args:
        raw_path: the path as the client sent it (percent-escapes kept).
        query: the query string, without ``?``.

    Returns:
        A :class:`Forward`; its service is ``UI`` for the paths no API owns.
    """
    suffix = b"?" + query if query else b""
    for prefix, service, strip in _PREFIXES:
        if raw_path == prefix or raw_path.startswith(prefix + b"/"):
            if not strip:
                return Forward(service, raw_path + suffix, b"")
            rest = raw_path[len(prefix):] or b"/"
            return Forward(service, rest + suffix, prefix)
    return Forward(Service.UI, raw_path + suffix, b"")


def _connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
    """Header names listed in ``Connection`` (they are hop-by-hop too, RFC 9110 §7.6.1)."""
    named: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            named.update(token.strip().lower() for token in value.split(b",") if token.strip())
    return named


def _hop_by_hop(name: bytes, named: set[bytes]) -> bool:
    return name in HOP_BY_HOP or name in named or name.startswith(b"proxy-")


def request_headers(headers: Sequence[tuple[bytes, bytes]], *, client: str | None,
                    scheme: str, prefix: bytes = b"") -> Headers:
    """The headers to send upstream for a client's request.

    Args:
        headers: the client's headers (ASGI: lower-case names, in order, repeats kept).
        client: the client's address (``X-Forwarded-For``), None if unknown.
        scheme: ``http`` or ``https`` as the client used it (``X-Forwarded-Proto``).
        prefix: the path prefix that was stripped (``X-Forwarded-Prefix``), if any.

    Returns:
        The headers without hop-by-hop ones, with ``X-Forwarded-*`` set; no
        ``Host`` (the HTTP client sets the upstream's).
    """
    named = _connection_tokens(headers)
    host: bytes | None = None
    out: Headers = []
    for raw_name, value in headers:
        name = raw_name.lower()
        if name == b"host":
            host = value
        if _hop_by_hop(name, named) or name in _FORWARDED:
            continue
        out.append((name, value))
    if client:
        out.append((b"x-forwarded-for", client.encode("latin-1")))
    out.append((b"x-forwarded-proto", scheme.encode("latin-1")))
    if host is not None:
        out.append((b"x-forwarded-host", host))
    if prefix:
        out.append((b"x-forwarded-prefix", prefix))
    return out


def response_headers(headers: Sequence[tuple[bytes, bytes]]) -> Headers:
    """The upstream's response headers to pass to the client (hop-by-hop ones dropped)."""
    named = _connection_tokens(headers)
    return [(name.lower(), value) for name, value in headers
            if not _hop_by_hop(name.lower(), named) and name.lower() not in _OURS_DOWN]


def error_body(code: str, message: str, service: Service | None = None) -> bytes:
    """An error in OpenAI's shape (the ``openai`` package shows its message), plus the service.

    ``code`` is stable (callers branch on it); ``message`` says what to do.
    """
    error: dict[str, object] = {"message": message, "type": "entry_error", "param": None,
                                "code": code}
    if service is not None:
        error["service"] = service.value
    return json.dumps({"error": error}).encode()


_PAGE = """<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>CosmicAC</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{{font-family:system-ui,sans-serif;max-width:42rem;margin:3rem auto;
padding:0 1rem;line-height:1.5}}code{{background:#f2f2f2;padding:.1rem .3rem}}</style>
</head>
<body>
<h1>CosmicAC</h1>
<p>The web interface is not part of this deployment yet. Until it is:</p>
<ul>
<li><a href="/api/docs">API documentation</a> (app-node,
<a href="/api/openapi.json">OpenAPI schema</a>)</li>
<li>OpenAI-compatible inference: base URL <code>{base}</code>
(<a href="/inference/v1/models">models</a>, with an API key)</li>
<li>The command line: <code>cosmicac --server {origin} login</code></li>
</ul>
</body>
</html>
"""


def landing_page(host: bytes | None, scheme: str) -> bytes:
    """The page served on every path no upstream owns (GET and HEAD).

    Args:
        host: the client's ``Host`` header, for the URLs it shows (escaped).
        scheme: ``http`` or ``https``.
    """
    shown = host.decode("latin-1") if host else "localhost:5173"
    origin = f"{scheme}://{shown}"
    return _PAGE.format(base=html.escape(f"{origin}/inference/v1"),
                        origin=html.escape(origin)).encode()
