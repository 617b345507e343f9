"""A host's Prometheus metrics: connections accepted and refused, by reason."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["HostMetrics"]


class HostMetrics:
    """Counters of one host, named ``<prefix>_...`` in ``registry``.

    The swarm's host uses the prefix ``swarm`` (``swarm_connections_accepted``),
    a plain server ``peer``, the relay ``relay_peer``.
    """

    def __init__(
        self, *, prefix: str, count_connections: Callable[[], int],
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        Gauge(f"{prefix}_peer_connections", "Live peer connections",
              registry=self.registry).set_function(count_connections)
        self.accepted = Counter(
            f"{prefix}_connections_accepted", "Connections peers opened to us, by path",
            ["path"], registry=self.registry,
        )
        self.refused = Counter(
            f"{prefix}_connections_refused",
            "Connections closed before use, by reason (firewall, duplicate, full, self, "
            "handshake, busy, error)",
            ["reason"], registry=self.registry,
        )
        self.closed_bytes = {"sent": 0, "received": 0}
