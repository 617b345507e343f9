"""The worker's own metrics: replicas by state, its agents' log budget, its queue.

The daemon refreshes a :class:`~nodes.kit.metrics.Snapshot` from these every
few seconds (and adds the agents' figures, :mod:`.agent_metrics`); a scrape
reads only that.
"""

from __future__ import annotations

from nodes.kit.metrics import Family, Snapshot
from p2p.queue import DurableQueue

from .agents import AgentRegistry
from .worker import Worker

__all__ = ["worker_snapshot"]


def worker_snapshot(worker: Worker, queue: DurableQueue, registry: AgentRegistry) -> Snapshot:
    """What the worker's ``/metrics`` shows of its replicas, agents and queue (the
    daemon refreshes it every few seconds: plain values, safe on a scrape)."""
    queued = queue.statistics()
    isolated = getattr(worker.backend, "isolated", None)  # the local backend's
    extra = {} if isolated is None else {"worker_agents_isolated": Family(
        "1 when the local backend runs each agent (and its shells) as a user of its own; "
        "0: as the worker's user (see local.isolation)", float(isolated))}
    return Snapshot({**extra,
        "worker_replicas": Family("Replicas by the state last reported to wrk-ork",
                                  worker.statistics(), "state"),
        "worker_bad_operations": Family("Queue entries that were no operation (skipped)",
                                        worker.bad_operations, counter=True),
        "worker_agents": Family("Agents expected (one per VMI)", len(registry.table)),
        "worker_agent_log_records": Family("Log records taken from agents (within their "
                                           "rate limit)", registry.log_records, counter=True),
        "worker_agent_log_records_limited": Family(
            "Agents' log records dropped by the per-agent rate limit, by job",
            registry.limited_log_records, "job", counter=True),
        "worker_agent_bad_log_batches": Family("Agents' log batches refused as malformed",
                                               registry.bad_log_batches, counter=True),
        "worker_queue_unacked": Family("Reports wrk-ork has not applied yet", queued.pending),
        "worker_queue_applied": Family("Operations applied (queue position acked)",
                                       queued.acked),
        "worker_queue_connected": Family("1 while the queue replicates with wrk-ork",
                                         float(queued.connected)),
    })
