"""A long-lived client of wrk-monitor's ``cosmicac-monitor/1`` for daemons that read logs.

app-node reads a job's logs from wrk-monitor over the swarm through one
:class:`MonitorClient` (a :class:`~nodes.kit.peer_client.PeerClient`: one
connection kept open, calls wait for it up to their timeout, then
:class:`MonitorUnavailable`). wrk-monitor's refusals keep their codes
(:class:`~p2p.rpc.RpcError`: ``FORBIDDEN``, ``LAGGED``, ``TOO_MANY_FOLLOWERS``).

Its channel has an id of its own (:data:`CHANNEL_ID`): app-node also ships its
own log records to the same wrk-monitor (``nodes/kit/telemetry.py``) on the same
connection, and a mux keeps one channel per (protocol, id).

Given ``observability`` (app-node's Loki and Prometheus URLs), it sends them
(``observability.set``) each time the connection comes up: at start, and again
after wrk-monitor restarts or the link drops, so wrk-monitor always holds
app-node's value. Given an empty one (app-node has none configured), it sends
``observability.clear`` instead, so what app-node sent before is forgotten and
wrk-monitor's own ``loki`` settings rule again; None (another daemon's client)
sends nothing. The first success is logged at INFO, repeats of the same value
at DEBUG; a failure (``FORBIDDEN``: app-node's key not among the followers) is
logged and tried again on the next connection, never fatal. A wrk-monitor older
than ``observability.clear`` answers ``UNKNOWN_METHOD``: logged with the
workaround (delete its ``observability.json``), the connection serves on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import trio

from contracts.monitor import (
    AGENTS_HEARD,
    HEALTH_JOBS,
    MAX_HEALTH_QUERY,
    OBSERVABILITY_CLEAR,
    OBSERVABILITY_SET,
    PROTOCOL,
    HealthQuery,
    JobHealth,
    Observability,
    ObservabilityClear,
    ObservabilityState,
)
from nodes.kit.peer_client import PeerClient
from p2p.rpc import Method, RpcClient, RpcError

__all__ = ["CHANNEL_ID", "DEFAULT_TIMEOUT_S", "HEALTH_TIMEOUT_S", "MonitorClient",
           "MonitorUnavailable"]

log = logging.getLogger(__name__)

#: The id of the reader's ``cosmicac-monitor/1`` channel (see the module doc).
CHANNEL_ID = b"reader"

#: A call's default bound: waiting for the connection plus wrk-monitor's answer.
DEFAULT_TIMEOUT_S = 10.0
#: ``job_health``'s bound: it decorates app-node's job routes, which must not
#: stall on wrk-monitor (an answer over the swarm takes a few milliseconds).
HEALTH_TIMEOUT_S = 0.5


class MonitorUnavailable(Exception):
    """wrk-monitor could not be reached within the call's timeout."""


class MonitorClient(PeerClient):
    """Calls wrk-monitor over a connection kept open (see :class:`PeerClient`)."""

    peer = "wrk-monitor"
    protocol = PROTOCOL
    unavailable = MonitorUnavailable
    hint = "that it lists this daemon's key in its followers"
    default_timeout_s = DEFAULT_TIMEOUT_S

    channel_id = CHANNEL_ID

    def __init__(self, *args: Any, observability: Observability | None = None,
                 **kw: Any) -> None:
        super().__init__(*args, **kw)
        #: What is sent on each connection: ``set`` it, or ``clear`` when it is
        #: empty (all None); None: nothing is sent.
        self.observability = observability
        #: wrk-monitor's answer to the latest send (None before the first success).
        self.observability_state: ObservabilityState | None = None
        self._sent: Observability | None = None

    async def on_connected(self, client: RpcClient) -> None:
        """Send ``observability`` to wrk-monitor (see the module doc)."""
        value = self.observability
        if value is None:
            return
        clear = value == Observability()
        try:
            if clear:
                state = await client.call(OBSERVABILITY_CLEAR, ObservabilityClear(),
                                          timeout_s=self.timeout_s)
            else:
                state = await client.call(OBSERVABILITY_SET, value, timeout_s=self.timeout_s)
        except RpcError as exc:
            if clear and exc.code == "UNKNOWN_METHOD":
                log.warning("monitor_client.observability_not_cleared (wrk-monitor is older "
                            "than observability.clear: it keeps what app-node sent before, "
                            "if anything; delete its <storage>/observability.json and "
                            "restart it, or upgrade it)")
                return
            log.warning("monitor_client.observability_refused code=%s message=%s (tried "
                        "again on the next connection; check %s)", exc.code, exc.message,
                        self.hint)
            return
        self.observability_state = state
        level = logging.DEBUG if self._sent == value else logging.INFO
        if clear:
            log.log(level, "monitor_client.observability_cleared loki=%s from=%s",
                    state.loki_url or "off", state.origin)
        else:
            shown = value.redacted()
            log.log(level, "monitor_client.observability_sent loki=%s tenant=%s prometheus=%s",
                    shown.loki_url or "off", shown.loki_tenant or "-",
                    shown.prometheus_url or "off")
        self._sent = value

    @property
    def monitor(self) -> bytes:
        """wrk-monitor's public key."""
        return self.key

    async def job_health(self, job_ids: Iterable[str], *,
                         timeout_s: float = HEALTH_TIMEOUT_S) -> dict[str, JobHealth]:
        """Each known job's model health (``health.jobs``), by job id.

        Never waits for a connection: while wrk-monitor is not connected it
        fails at once, so a caller that only decorates its answer with model
        health loses nothing but the health.

        Raises:
            MonitorUnavailable: not connected, or no answer within ``timeout_s``.
            RpcError: wrk-monitor refused (``FORBIDDEN``: not among its followers).
        """
        found = await self._per_job(HEALTH_JOBS, job_ids, timeout_s)
        return {job.job_id: job for job in found if job.health is not None}

    async def agents_heard(self, job_ids: Iterable[str], *,
                           timeout_s: float = HEALTH_TIMEOUT_S) -> dict[str, float]:
        """When each job's least recently heard agent last reported (wall clock), by
        job id, for the jobs some worker's report names (``agents.heard``); raises
        as :meth:`job_health`."""
        found = await self._per_job(AGENTS_HEARD, job_ids, timeout_s)
        return {job.job_id: job.heard_at for job in found if job.heard_at is not None}

    async def _per_job(self, method: Method, job_ids: Iterable[str], timeout_s: float
                       ) -> list[Any]:
        """``method``'s entries for ``job_ids``, asked in pages of MAX_HEALTH_QUERY."""
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return []
        if not self.connected:
            raise MonitorUnavailable("wrk-monitor is not connected now")
        out: list[Any] = []
        with trio.move_on_after(timeout_s) as scope:
            for start in range(0, len(ids), MAX_HEALTH_QUERY):
                chunk = tuple(ids[start:start + MAX_HEALTH_QUERY])
                result = await self.call(method, HealthQuery(job_ids=chunk),
                                         timeout_s=timeout_s)
                out.extend(result.jobs)
        if scope.cancelled_caught:
            raise MonitorUnavailable(f"wrk-monitor did not answer within {timeout_s} s")
        return out
