"""The web UI's settings: ``COSMICAC_UI__<KEY>`` in the environment, or a config file."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from nodes.kit.forwarded import ProxyList
from nodes.kit.settings import UpstreamUrl
from p2p.daemon import DaemonSettings, Port

__all__ = ["API_URL", "UI_PORT", "UiSettings"]

#: Where the UI listens on one machine (the entry point forwards to it).
UI_PORT = 49753
#: app-node's HTTP API on one machine (its routes live under ``/api``).
API_URL = "http://127.0.0.1:49751"


class UiSettings(DaemonSettings):
    """Everything the UI reads at start."""

    model_config = SettingsConfigDict(env_prefix="COSMICAC_UI__")

    #: 127.0.0.1 by default: the entry point (or Caddy) is the user's door.
    host: str = "127.0.0.1"
    #: 0: any free port (tests).
    port: Port = UI_PORT
    #: app-node's public API, the UI's only upstream.
    api_url: UpstreamUrl = API_URL
    #: A signed-in browser's session ends after this long without a request
    #: (app-node's token may end sooner: the UI then asks to sign in again).
    idle_timeout_s: float = Field(default=8 * 3600, gt=0, le=30 * 86400)
    #: Sessions kept at once; beyond, the least recently used one ends.
    max_sessions: int = Field(default=10_000, ge=1, le=10_000_000)
    #: Live pages (one stream each, and one stream to app-node each) at once; beyond,
    #: a page's stream is refused (503) and the page retries. app-node serves 1,024
    #: streams by default.
    max_streams: int = Field(default=1000, ge=1, le=100_000)
    #: The door in front of the UI (the entry point, Caddy), whose X-Forwarded-For is
    #: believed and passed on to app-node (which must trust this UI's address in
    #: ``limits.trusted_proxies``), so app-node limits each browser, not the UI.
    trusted_proxies: ProxyList = ("127.0.0.1", "::1")
    #: Waiting for app-node before a page says it cannot reach it.
    api_timeout_s: float = Field(default=30.0, gt=0, le=600)
