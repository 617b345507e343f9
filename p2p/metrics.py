"""Prometheus metrics for daemons: one registry per component, one HTTP endpoint.

Every daemon builds its metrics in its own :class:`CollectorRegistry` (never
prometheus_client's global one, so several swarms or relays in one test
process do not collide) and serves it with :func:`serve_metrics`, an ASGI app
on hypercorn's trio worker, as DESIGN.md §2 decides for HTTP services.
"""

from __future__ import annotations

import logging

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from prometheus_client import CollectorRegistry, make_asgi_app
from prometheus_client.registry import Collector

__all__ = ["CollectorRegistry", "combined_registry", "serve_metrics"]

log = logging.getLogger(__name__)


class _Union(Collector):
    def __init__(self, registries: tuple[CollectorRegistry, ...]) -> None:
        self._registries = registries

    def collect(self):
        for registry in self._registries:
            yield from registry.collect()


def combined_registry(*registries: CollectorRegistry) -> CollectorRegistry:
    """One registry showing every metric of ``registries`` (a daemon's components)."""
    combined = CollectorRegistry(auto_describe=False)
    combined.register(_Union(registries))
    return combined


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
        OSError: the address cannot be bound.
    """
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = None  # our daemons log their own lines; hypercorn's would interleave
    config.graceful_timeout = 1.0
    app = make_asgi_app(registry)
    async with trio.open_nursery() as nursery:
        binds: list[str] = await nursery.start(serve, app, config)
        bound_host, _, bound_port = binds[0].removeprefix("http://").rpartition(":")
        address = (bound_host.strip("[]"), int(bound_port))
        log.info("metrics.listening url=http://%s:%d/metrics", *address)
        task_status.started(address)
