"""A DHT node's Prometheus metrics, read from its counters at scrape time.

| metric | type | meaning |
| --- | --- | --- |
| ``dht_requests_served_total`` | counter | requests answered |
| ``dht_bad_datagrams_total`` | counter | datagrams that did not decode (dropped) |
| ``dht_ignored_responses_total`` | counter | late, unsolicited, spoofed or id-mismatched answers |
| ``dht_invalid_tokens_total`` | counter | ANNOUNCE/UNANNOUNCE refused for their token |
| ``dht_records_refused_total`` | counter | records refused (signature, expiry, store full ...) |
| ``dht_announces_refused_total{code}`` | counter | ANNOUNCE/UNANNOUNCE errors by code |
| ``dht_request_timeouts_total`` | counter | our requests that got no answer |
| ``dht_probes_sent_total`` | counter | reachability probes sent for others |
| ``dht_probes_refused_total`` | counter | probes the rate limit refused |
| ``dht_datagrams_total{direction}`` | counter | datagrams sent and received |
| ``dht_pending_requests`` | gauge | our requests in flight |
| ``dht_contacts`` | gauge | routing-table size |
| ``dht_records`` | gauge | records stored |
| ``dht_reachable`` | gauge | 1 once a probe proved us reachable |
| ``dht_persistent`` | gauge | 1 while others may store us |

``code`` is the error the request was answered with: ``SOURCE_FULL``,
``KEY_FULL``, ``TOPIC_OWNED``, ``STORE_FULL``, ``SEQ_TOO_LOW``,
``INVALID_TOKEN``, ``BAD_SIGNATURE`` ... (a fixed set, so the label is bounded).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from ._driver import DhtNode

__all__ = ["DhtCollector", "dht_registry"]

_COUNTERS = (
    ("dht_requests_served", "Requests answered.", "requests_served"),
    ("dht_bad_datagrams", "Datagrams that did not decode.", "bad_datagrams"),
    ("dht_ignored_responses", "Late, unsolicited, spoofed or mismatched answers.",
     "ignored_responses"),
    ("dht_invalid_tokens", "Announces refused for their write token.", "invalid_tokens"),
    ("dht_records_refused", "Records refused.", "records_refused"),
    ("dht_request_timeouts", "Our requests that got no answer.", "timeouts"),
    ("dht_probes_sent", "Reachability probes sent for others.", "probes_sent"),
    ("dht_probes_refused", "Reachability probes refused by the rate limit.", "probes_refused"),
)
_GAUGES = (
    ("dht_pending_requests", "Our requests in flight.", "pending"),
    ("dht_contacts", "Contacts in the routing table.", "contacts"),
    ("dht_records", "Records stored.", "records"),
)


class DhtCollector(Collector):
    """Exposes one :class:`DhtNode`'s statistics."""

    def __init__(self, node: DhtNode) -> None:
        self._node = node

    def collect(self) -> Iterator[Metric]:
        stats = self._node.core.statistics()
        for name, help_text, field in _COUNTERS:
            yield CounterMetricFamily(name, help_text, value=getattr(stats, field))
        for name, help_text, field in _GAUGES:
            yield GaugeMetricFamily(name, help_text, value=getattr(stats, field))
        yield GaugeMetricFamily("dht_reachable", "1 once a probe proved us reachable.",
                                value=int(stats.reachable))
        yield GaugeMetricFamily("dht_persistent", "1 while others may store us.",
                                value=int(self._node.persistent))
        refused = CounterMetricFamily(
            "dht_announces_refused", "Announces and unannounces refused, by error code.",
            labels=["code"])
        for code, count in stats.refused_by_code:
            refused.add_metric([code], count)
        yield refused
        transport = getattr(self._node.transport, "stats", None)
        if transport is not None:
            datagrams = CounterMetricFamily("dht_datagrams", "Datagrams by direction.",
                                            labels=["direction"])
            datagrams.add_metric(["sent"], transport.sent)
            datagrams.add_metric(["received"], transport.received)
            yield datagrams


def dht_registry(node: DhtNode) -> CollectorRegistry:
    """A registry of its own holding ``node``'s metrics."""
    registry = CollectorRegistry()
    registry.register(DhtCollector(node))
    return registry
