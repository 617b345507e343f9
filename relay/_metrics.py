"""The relay's Prometheus metrics, read from the server's counters at scrape time.

The forwarder only bumps plain integers (``RelayState.bytes_relayed``); this
collector turns them into metric families when scraped, so a chunk costs no
metric-library call.

| metric | type | meaning |
| --- | --- | --- |
| ``blind_relay_reservations`` | gauge | reservations held |
| ``blind_relay_pending_pairs`` | gauge | pairings waiting for their attaches |
| ``blind_relay_active_pairs`` | gauge | pairs being spliced |
| ``blind_relay_connections`` | gauge | TCP connections being served |
| ``blind_relay_pairs_total`` | counter | pairs made (both sides attached) |
| ``blind_relay_relayed_bytes_total`` | counter | bytes forwarded, both directions |
| ``blind_relay_refusals_total{reason}`` | counter | refusals by ``RefusalCode`` (one |
|   |   | label per code, e.g. ``TOO_MANY_PAIRS_TO_TARGET``: a dialer at its |
|   |   | ``max_pairs_per_dialer_target``) |
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from p2p.relay import RefusalCode

if TYPE_CHECKING:
    from ._server import RelayServer

__all__ = ["RelayCollector", "relay_registry"]


class RelayCollector(Collector):
    """Exposes one :class:`RelayServer`'s statistics."""

    def __init__(self, server: RelayServer) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        stats = self._server.statistics()
        yield GaugeMetricFamily("blind_relay_reservations", "Reservations held.",
                                value=stats.reservations)
        yield GaugeMetricFamily("blind_relay_pending_pairs",
                                "Pairings waiting for both sides to attach.",
                                value=stats.pending_pairs)
        yield GaugeMetricFamily("blind_relay_active_pairs", "Pairs being forwarded.",
                                value=stats.active_pairs)
        yield GaugeMetricFamily("blind_relay_connections", "TCP connections being served.",
                                value=stats.connections)
        yield CounterMetricFamily("blind_relay_pairs", "Pairs made (both sides attached).",
                                  value=stats.pairs_made)
        yield CounterMetricFamily("blind_relay_relayed_bytes",
                                  "Bytes forwarded, both directions.",
                                  value=stats.bytes_relayed)
        refusals = CounterMetricFamily("blind_relay_refusals", "Refusals by reason.",
                                       labels=["reason"])
        for code in RefusalCode:
            refusals.add_metric([code.value], stats.refusals.get(code, 0))
        yield refusals


def relay_registry(server: RelayServer) -> CollectorRegistry:
    """A registry of its own holding ``server``'s metrics."""
    registry = CollectorRegistry()
    registry.register(RelayCollector(server))
    return registry
