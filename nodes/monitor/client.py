"""A long-lived client of wrk-monitor's ``cosmicac-monitor/1`` for daemons that read logs.

app-node reads a job's logs from wrk-monitor over the swarm through one
:class:`MonitorClient` (a :class:`~nodes.peer_client.PeerClient`: one
connection kept open, calls wait for it up to their timeout, then
:class:`MonitorUnavailable`). wrk-monitor's refusals keep their codes
(:class:`~p2p.rpc.RpcError`: ``FORBIDDEN``, ``LAGGED``, ``TOO_MANY_FOLLOWERS``).
"""

from __future__ import annotations

from contracts.telemetry import PROTOCOL
from nodes.peer_client import PeerClient

__all__ = ["DEFAULT_TIMEOUT_S", "MonitorClient", "MonitorUnavailable"]

#: A call's default bound: waiting for the connection plus wrk-monitor's answer.
DEFAULT_TIMEOUT_S = 10.0


class MonitorUnavailable(Exception):
    """wrk-monitor could not be reached within the call's timeout."""


class MonitorClient(PeerClient):
    """Calls wrk-monitor over a connection kept open (see :class:`PeerClient`)."""

    peer = "wrk-monitor"
    protocol = PROTOCOL
    unavailable = MonitorUnavailable
    hint = "that it lists this daemon's key in its followers"
    default_timeout_s = DEFAULT_TIMEOUT_S

    @property
    def monitor(self) -> bytes:
        """wrk-monitor's public key."""
        return self.key
