"""Prometheus metrics of a platform daemon, read from a snapshot the daemon refreshes.

A daemon's state lives in objects that only its own tasks (or one worker
thread at a time) may touch; a scrape must not read them while a thread
writes. So each daemon refreshes a plain :class:`Snapshot` where it is safe
(after a change, on a tick) and the collector reads that: a scrape costs
nothing and never races.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["Family", "Snapshot", "snapshot_registry"]


@dataclass(frozen=True)
class Family:
    """One metric: a plain value, or values by one label."""

    help: str
    value: float | Mapping[str, float] = 0.0
    #: The label of a mapping's keys.
    label: str = ""
    counter: bool = False


@dataclass
class Snapshot:
    """What the next scrape shows: metric name (without ``_total``) → family."""

    families: dict[str, Family] = field(default_factory=dict)


class _Collector:
    def __init__(self, read: Callable[[], Snapshot]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        for name, family in self._read().families.items():
            kind = CounterMetricFamily if family.counter else GaugeMetricFamily
            if isinstance(family.value, Mapping):
                metric = kind(name, family.help, labels=[family.label])
                for label, value in sorted(family.value.items()):
                    metric.add_metric([label], value)
            else:
                metric = kind(name, family.help, value=family.value)
            yield metric


def snapshot_registry(read: Callable[[], Snapshot]) -> CollectorRegistry:
    """A registry whose every scrape shows ``read()``'s families."""
    registry = CollectorRegistry()
    registry.register(_Collector(read))
    return registry
