"""The shared database's Prometheus metrics, in a registry of its own."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["DatabaseMetrics"]


class DatabaseMetrics:
    def __init__(self, *, count_writers: Callable[[], int], count_entries: Callable[[], int],
                 count_waiting: Callable[[], int], count_peers: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        Gauge("crdt_writers", "Writers admitted and not removed",
              registry=self.registry).set_function(count_writers)
        Gauge("crdt_entries", "Entries stored across every writer's log",
              registry=self.registry).set_function(count_entries)
        Gauge("crdt_entries_waiting", "Entries held until their dependencies arrive",
              registry=self.registry).set_function(count_waiting)
        Gauge("crdt_replication_peers", "Peers we replicate with right now",
              registry=self.registry).set_function(count_peers)
        self.appended = Counter("crdt_entries_appended", "Entries this replica wrote",
                                registry=self.registry)
        self.append_batches = Counter(
            "crdt_append_batches", "Durable appends (one fsync each) of our own entries",
            registry=self.registry)
        self.ingested = Counter("crdt_entries_ingested",
                                "Entries received from peers, verified and stored",
                                registry=self.registry)
        self.refused = Counter(
            "crdt_entries_refused",
            "Entries refused: invalid payload, clock or dependency (code), or an unknown writer",
            ["code"], registry=self.registry)
        self.bad_peers = Counter(
            "crdt_bad_peers", "Peers disconnected for sending bad data, by error code", ["code"],
            registry=self.registry)
        self.rebuilds = Counter("crdt_view_rebuilds",
                                "Times the view was rebuilt from the logs", registry=self.registry)
        self.reads_refused = Counter(
            "crdt_reads_refused",
            "heads/fetch calls refused: the caller is neither a writer nor a configured reader",
            ["method"], registry=self.registry)
        self.admissions = Counter(
            "crdt_admission_requests", "Requests to be admitted as a writer, by outcome",
            ["outcome"], registry=self.registry)
        self.checkpoints = Counter(
            "crdt_checkpoints",
            "View checkpoints: made (this admin), served, installed, refused (by code)",
            ["outcome"], registry=self.registry)
