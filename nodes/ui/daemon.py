"""The web UI as a daemon: ``cosmicac run ui``, or in-process (tests, ``cosmicac up``).

No swarm and no identity: its one upstream is app-node's public ``/api``. Its
state is the signed-in sessions, in memory.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import httpx
import trio

from nodes.kit.forwarded import TrustedProxies
from nodes.kit.peer import serve_http
from nodes.kit.ready import print_ready
from p2p.daemon import Daemon

from .api import open_http
from .app import UiApp
from .sessions import SessionStore
from .settings import UiSettings

__all__ = ["RunningUi", "serve_ui", "start_ui"]

log = logging.getLogger(__name__)


@dataclass
class RunningUi:
    """The UI serving in-process: where, and its app (for tests)."""

    address: tuple[str, int]
    app: UiApp

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"


async def serve_ui(settings: UiSettings,
                   task_status: trio.TaskStatus[RunningUi] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve the UI until cancelled; report a :class:`RunningUi` once listening.

    Raises:
        nodes.kit.peer.HttpBindError: the address cannot be bound.
    """
    sessions = SessionStore(idle_timeout_s=settings.idle_timeout_s,
                            max_sessions=settings.max_sessions)
    # Each live page holds one stream to app-node: those get a pool of their own,
    # sized for max_streams, so calls always find a connection.
    stream_limits = httpx.Limits(max_connections=settings.max_streams,
                                 max_keepalive_connections=0)
    async with open_http(settings.api_url, settings.api_timeout_s) as http, \
            open_http(settings.api_url, settings.api_timeout_s,
                      limits=stream_limits) as streams:
        app = UiApp(http, sessions, streams=streams, max_streams=settings.max_streams,
                    trusted_proxies=TrustedProxies(settings.trusted_proxies))

        def listening(address: tuple[str, int]) -> None:
            log.info("ui.serving url=http://%s:%d api=%s", *address, settings.api_url)

        async with trio.open_nursery() as nursery:
            address = await nursery.start(functools.partial(
                serve_http, app, settings, "the web UI", on_listening=listening))
            nursery.start_soon(_expire_sessions, app, settings.idle_timeout_s)
            task_status.started(RunningUi(address=address, app=app))


async def _expire_sessions(app: UiApp, idle_timeout_s: float) -> None:
    """End idle sessions now and then, so a closed tab's token is not kept forever
    (on the app's own clock, the one sessions are touched on)."""
    while True:
        await trio.sleep(min(idle_timeout_s, 300.0))
        ended = app.sessions.expire(app.clock())
        if ended:
            log.info("ui.sessions_expired count=%d left=%d", ended, len(app.sessions))


async def start_ui(daemon: Daemon[UiSettings]) -> None:
    """``cosmicac run ui``: start in ``daemon.nursery``; return once serving."""
    settings = daemon.settings
    running: RunningUi = await daemon.nursery.start(functools.partial(serve_ui, settings))
    print_ready("ui", addresses={"http": running.address}, facts={"api": settings.api_url},
                note=f"open {running.url} (or the entry point, which forwards to it)")
