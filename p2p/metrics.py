"""Prometheus metrics for daemons: one registry per component, one HTTP endpoint.

Every component builds its metrics in its own :class:`CollectorRegistry`
(never prometheus_client's global one, so several swarms or relays in one
test process do not collide). A process serves all of them on one endpoint:
:class:`ProcessMetrics` gathers the registries of its components (they may be
added while it runs) and :func:`serve_metrics` serves a registry as an ASGI
app on hypercorn's trio worker, as DESIGN.md §2 decides for HTTP services.

hypercorn is imported only when an endpoint is served, so that importing the
stack (``import p2p``, ``from crdt import Entry``) loads no HTTP server.
"""

from __future__ import annotations

import logging

import trio
from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from .http import ServerBindError, serve_asgi

__all__ = [
    "CollectorRegistry",
    "MetricsBindError",
    "ProcessMetrics",
    "combined_registry",
    "serve_metrics",
]

log = logging.getLogger(__name__)


class MetricsBindError(ServerBindError):
    """The metrics endpoint cannot listen on its address (busy port, bad host)."""

    what = "metrics"


class _Union(Collector):
    def __init__(self, registries: list[CollectorRegistry]) -> None:
        # Shared with ProcessMetrics, which may append while scrapes run.
        self._registries = registries

    def collect(self):
        for registry in tuple(self._registries):
            yield from registry.collect()


def combined_registry(*registries: CollectorRegistry) -> CollectorRegistry:
    """One registry showing every metric of ``registries`` (a daemon's components)."""
    combined = CollectorRegistry(auto_describe=False)
    combined.register(_Union(list(registries)))
    return combined


class ProcessMetrics:
    """The registries of one process's components, served as one.

    Components register theirs with :meth:`add` (also after the endpoint
    started); :attr:`registry` shows all of them.
    """

    def __init__(self, *registries: CollectorRegistry) -> None:
        self._registries: list[CollectorRegistry] = list(registries)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Union(self._registries))

    def add(self, *registries: CollectorRegistry) -> None:
        """Show ``registries`` on the process's endpoint too (each once)."""
        for registry in registries:
            if not any(registry is known for known in self._registries):
                self._registries.append(registry)

    def remove(self, registry: CollectorRegistry) -> None:
        """Stop showing ``registry`` (a component that stopped)."""
        self._registries[:] = [known for known in self._registries if known is not registry]


async def serve_metrics(
    registry: CollectorRegistry,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``registry`` at ``http://host:port/metrics`` until cancelled.

    Reports the bound ``(host, port)`` through ``task_status`` (port 0 picks a
    free one).

    Raises:
        MetricsBindError: the address cannot be bound (an ``OSError``).
    """
    from prometheus_client import make_asgi_app

    def listening(address: tuple[str, int]) -> None:
        log.info("metrics.listening url=http://%s:%d/metrics", *address)

    await serve_asgi(make_asgi_app(registry), host=host, port=port,
                     bind_error=MetricsBindError, on_listening=listening,
                     task_status=task_status)
