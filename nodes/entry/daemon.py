"""The entry point as a daemon: the user's door on ``127.0.0.1:5173``.

The one place where HTTP is proxied (as Caddy is, in seeds/architecture.txt):
everything between daemons goes over the swarm, but a user's browser, the
``cosmicac`` CLI and the ``openai`` package speak HTTP to one address. No
swarm, no identity, no state.

:func:`serve_entry` runs it in-process (tests, ``cosmicac up``);
:func:`start_entry` is ``cosmicac run entry`` on the daemon kit.
"""

from __future__ import annotations

import functools
import http.cookiejar
import logging
from contextlib import AsyncExitStack
from dataclasses import dataclass

import httpx
import trio

from nodes.kit.forwarded import TrustedProxies
from nodes.kit.peer import HttpBindError, serve_http
from nodes.kit.ready import print_ready
from nodes.kit.tls import client_tls
from p2p.daemon import Daemon, ProcessMetrics

from .app import EntryApp
from .metrics import EntryMetrics
from .routes import Service
from .settings import EntrySettings

__all__ = ["RunningEntry", "open_client", "serve_entry", "start_entry"]

log = logging.getLogger(__name__)


@dataclass
class RunningEntry:
    """An entry point serving in-process: where, and its app (for tests)."""

    #: The bound (host, port).
    address: tuple[str, int]
    app: EntryApp

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"


def open_client(settings: EntrySettings) -> httpx.AsyncClient:
    """One upstream's pooled client: keep-alive, no environment proxies, no cookie jar.

    ``trust_env=False``: an ``HTTP_PROXY`` in the daemon's environment must not
    send loopback traffic elsewhere. The jar refuses every cookie, because the
    client is shared by all users and a ``Set-Cookie`` is for the browser only.
    """
    jar = http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
    return httpx.AsyncClient(
        trust_env=False, cookies=jar, follow_redirects=False, verify=client_tls(),
        timeout=httpx.Timeout(connect=settings.connect_timeout_s,
                              read=settings.read_timeout_s,
                              write=settings.write_timeout_s,
                              pool=settings.pool_timeout_s),
        limits=httpx.Limits(max_connections=settings.max_connections,
                            max_keepalive_connections=settings.max_keepalive_connections,
                            keepalive_expiry=settings.keepalive_expiry_s))


def upstreams(settings: EntrySettings) -> dict[Service, str | None]:
    """The base URL of each proxied service (None: not configured)."""
    return {Service.API: settings.api_url, Service.INFERENCE: settings.inference_url,
            Service.MONITOR: settings.monitor_url, Service.UI: settings.ui_url}


async def serve_entry(settings: EntrySettings, *, metrics: ProcessMetrics | None = None,
                      task_status: trio.TaskStatus[RunningEntry] = trio.TASK_STATUS_IGNORED
                      ) -> None:
    """Serve the entry point until cancelled; report a :class:`RunningEntry` once listening.

    Args:
        settings: the daemon's settings.
        metrics: the process's endpoint, to which the entry point adds its registry.

    Raises:
        nodes.kit.peer.HttpBindError: the address cannot be bound (``cannot
            serve the entry point on H:P: …``), raised bare.
    """
    entry_metrics = EntryMetrics()
    if metrics is not None:
        metrics.add(entry_metrics.registry)
    bases = upstreams(settings)
    async with AsyncExitStack() as stack:
        clients = {service: await stack.enter_async_context(open_client(settings))
                   for service, base in bases.items() if base is not None}
        app = EntryApp(bases, clients, max_body_bytes=settings.max_body_bytes,
                       metrics=entry_metrics, large_body_bytes=settings.large_body_bytes,
                       max_large_bodies=settings.max_large_bodies,
                       busy_retry_after_s=settings.busy_retry_after_s,
                       trusted_proxies=TrustedProxies(settings.trusted_proxies))

        def listening(address: tuple[str, int]) -> None:
            log.info("entry.serving url=http://%s:%d api=%s inference=%s monitor=%s",
                     *address, settings.api_url, settings.inference_url,
                     settings.monitor_url or "off")

        failure: HttpBindError | None = None
        try:
            async with trio.open_nursery() as nursery:
                address = await nursery.start(functools.partial(
                    serve_http, app, settings, "the entry point", on_listening=listening))
                task_status.started(RunningEntry(address=address, app=app))
        except BaseExceptionGroup as group:
            failure = _bind_error(group)
            if failure is None:
                raise
    if failure is not None:  # raised outside every nursery: the caller sees it bare
        raise failure


def _bind_error(group: BaseExceptionGroup) -> HttpBindError | None:
    """The bind failure a group holds, if that is all it holds."""
    leaf: BaseException = group
    while isinstance(leaf, BaseExceptionGroup):
        if len(leaf.exceptions) != 1:
            return None
        leaf = leaf.exceptions[0]
    return leaf if isinstance(leaf, HttpBindError) else None


async def start_entry(daemon: Daemon[EntrySettings]) -> None:
    """``cosmicac run entry``: start in ``daemon.nursery``; return once serving."""
    settings = daemon.settings
    # A busy port is an HttpBindError, which run_daemon prints as one line.
    running: RunningEntry = await daemon.nursery.start(functools.partial(
        serve_entry, settings, metrics=daemon.metrics))
    print_ready("entry", addresses={"http": running.address},
                facts={"api": settings.api_url, "inference": settings.inference_url,
                       "monitor": settings.monitor_url or "off"},
                note=f"open {running.url}")
