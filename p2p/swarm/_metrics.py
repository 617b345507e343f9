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
        count_connections: Callable[[bool], int],
        count_reservations: Callable[[], int],
        live_bytes: Callable[[], Iterable[tuple[int, int]]],
    ) -> None:
        self.registry = CollectorRegistry()
        connections = Gauge(
            "swarm_connections", "Open connections", ["path"], registry=self.registry
        )
        connections.labels("direct").set_function(lambda: count_connections(False))
        connections.labels("relayed").set_function(lambda: count_connections(True))
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
        self.accepted = Counter(
            "swarm_connections_accepted", "Connections peers opened to us, by path", ["path"],
            registry=self.registry,
        )
        self.refused = Counter(
            "swarm_connections_refused",
            "Connections closed before use, by reason (firewall, duplicate, full, self)",
            ["reason"], registry=self.registry,
        )
        self.closed_bytes = {"sent": 0, "received": 0}
        self.registry.register(_BytesCollector(self.closed_bytes, live_bytes))
