"""The entry point's settings: ``COSMICAC_ENTRY__<KEY>`` in the environment, or a config file.

The entry point keeps no state, so ``storage`` stays None (nothing is locked)
unless an operator gives one. The three upstreams are plain HTTP base URLs;
the monitor's is optional until wrk-monitor exists.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field
from pydantic_settings import SettingsConfigDict

from nodes.kit.forwarded import ProxyList
from nodes.kit.settings import UpstreamUrl, parse_upstream_url
from p2p.daemon import DaemonSettings, Port

__all__ = [
    "API_URL",
    "ENTRY_PORT",
    "INFERENCE_URL",
    "EntrySettings",
    "UpstreamUrl",
    "parse_upstream_url",
]

#: The user's door, as in seeds/architecture.txt ("caddy … on port 5173").
ENTRY_PORT = 5173
#: app-node's HTTP API on one machine (its routes live under ``/api``).
API_URL = "http://127.0.0.1:49751"
#: proxy-inference's OpenAI-compatible front (nodes/proxy_inference/settings.py HTTP_PORT).
INFERENCE_URL = "http://127.0.0.1:49750"


def _optional_url(value: Any) -> Any:
    if isinstance(value, str) and not value.strip():
        return None  # COSMICAC_ENTRY__MONITOR_URL= turns the route off
    return parse_upstream_url(value)


class EntrySettings(DaemonSettings):
    """Everything the entry point reads at start."""

    model_config = SettingsConfigDict(env_prefix="COSMICAC_ENTRY__")

    #: Where the user's door listens. 127.0.0.1 by default: put it on a
    #: public address only behind TLS (deploy/Caddyfile does that job in production).
    host: str = "127.0.0.1"
    #: 0: any free port (tests).
    port: Port = ENTRY_PORT
    #: app-node's HTTP API; ``/api/...`` is forwarded with its prefix (app-node
    #: serves under ``/api``).
    api_url: UpstreamUrl = API_URL
    #: proxy-inference; ``/inference/...`` is forwarded without the prefix, so
    #: the OpenAI base URL is ``<entry>/inference/v1``.
    inference_url: UpstreamUrl = INFERENCE_URL
    #: wrk-monitor; ``/monitor/...`` is forwarded without the prefix. None:
    #: ``/monitor`` answers 503 ``SERVICE_NOT_CONFIGURED``.
    monitor_url: Annotated[str | None, BeforeValidator(_optional_url)] = None
    #: The web UI (``cosmicac run ui``); every other path is forwarded to it as it
    #: is. None: those paths get a page that links the API docs.
    ui_url: Annotated[str | None, BeforeValidator(_optional_url)] = None
    #: A request body beyond this is refused with 413 (checked against
    #: Content-Length first, then counted while streaming). 32 MiB: above
    #: the 25 MiB audio upload OpenAI and vLLM accept, plus form overhead.
    #: Caddy sets no limit by default; nginx sets 1 MiB.
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=0, le=1 << 40)
    #: A body of more than this (declared, or chunked with no length) is *large*:
    #: at most ``max_large_bodies`` are streamed upstream at once; beyond, 503
    #: ``SERVER_BUSY`` with ``Retry-After``. Chat requests stay below it, so
    #: uploads cannot crowd out inference.
    large_body_bytes: int = Field(default=1024 * 1024, ge=0, le=1 << 40)
    max_large_bodies: int = Field(default=16, ge=1, le=100_000)
    #: ``Retry-After`` of a ``SERVER_BUSY`` answer (seconds).
    busy_retry_after_s: int = Field(default=1, ge=1, le=3600)
    #: Proxies in front of the entry point whose ``X-Forwarded-For`` is kept
    #: (IP addresses or CIDRs; a load balancer). Empty: the header a client sends
    #: is dropped and replaced by the client's address, so no one can pose as another.
    trusted_proxies: ProxyList = ()
    #: Opening a connection to an upstream (504 after it).
    connect_timeout_s: float = Field(default=5.0, gt=0, le=600)
    #: Longest silence while reading an upstream's answer, between any two
    #: chunks (504 before the status line, a cut response after it). Long:
    #: a CPU model may think for minutes before a non-streamed answer.
    read_timeout_s: float = Field(default=600.0, gt=0, le=86400)
    #: Longest stall while writing a request body to an upstream.
    write_timeout_s: float = Field(default=60.0, gt=0, le=86400)
    #: Waiting for a free pooled connection once ``max_connections`` are busy (504).
    pool_timeout_s: float = Field(default=10.0, gt=0, le=600)
    #: Connections per upstream (each service has its own pool, so a flood of
    #: streams to one cannot starve the others).
    max_connections: int = Field(default=512, ge=1, le=100_000)
    #: Idle keep-alive connections kept per upstream, and for how long (below our
    #: servers' 75 s, p2p.http.KEEP_ALIVE_S: the server must not close one first).
    max_keepalive_connections: int = Field(default=64, ge=0, le=100_000)
    keepalive_expiry_s: float = Field(default=30.0, gt=0, le=3600)
