"""The swarm's Prometheus metrics, in a registry of its own."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

__all__ = ["SwarmMetrics"]


class _BytesCollector(Collector):
    """Bytes sent and received: closed connections' totals plus the live ones'."""

    def __init__(self, closed: dict[str, int], live: Callable[[], Iterable[tuple[int, int]]]):
        self._closed = closed
        self._live = live

    def collect(self):
        sent, received = self._closed["sent"], self._closed["received"]
        for live_sent, live_received in self._live():
            sent += live_sent
            received += live_received
        family = CounterMetricFamily(
            "swarm_bytes", "Payload bytes over swarm connections", labels=["direction"]
        )
        family.add_metric(["sent"], sent)
        family.add_metric(["received"], received)
        yield family


class SwarmMetrics:
    def __init__(
        self,
        *,
        count_connections: Callable[[str], int],
        count_reservations: Callable[[], int],
    ) -> None:
        self.registry = CollectorRegistry()
        connections = Gauge(
            "swarm_connections", "Open connections", ["path"], registry=self.registry
        )
        for path in ("direct", "punched_tcp", "punched_udp", "relayed"):
            connections.labels(path).set_function(lambda path=path: count_connections(path))
        Gauge(
            "swarm_relay_reservations", "Relays holding a reservation for us",
            registry=self.registry,
        ).set_function(count_reservations)
        self.attempts = Counter(
            "swarm_connection_attempts", "Connection attempts by path", ["path"],
            registry=self.registry,
        )
        self.failures = Counter(
            "swarm_connection_failures", "Failed dials, by error code", ["code"],
            registry=self.registry,
        )
        # Connections accepted and refused are the host's (swarm_connections_accepted,
        # swarm_connections_refused), in this same registry.

    def count_bytes(self, closed: dict[str, int],
                    live: Callable[[], Iterable[tuple[int, int]]]) -> None:
        """Export ``swarm_bytes``: closed connections' totals plus the live ones'."""
        self.registry.register(_BytesCollector(closed, live))
