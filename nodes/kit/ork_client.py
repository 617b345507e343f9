"""A long-lived client of wrk-ork's ``cosmicac-ork/1`` for the daemons that call it.

app-node sends every job, replica, rack and node operation to wrk-ork over the
swarm through one :class:`OrkClient` (a :class:`~nodes.kit.peer_client.PeerClient`:
one connection kept open, calls wait for it up to their timeout, then
:class:`OrkUnavailable`). wrk-ork's own refusals keep their codes
(:class:`~p2p.rpc.RpcError`: ``NOT_FOUND``, ``INVALID_STATE``, ``BAD_REQUEST``,
``CONFLICT``, ``FORBIDDEN``...), so the caller maps them to its answer.
"""

from __future__ import annotations

from contracts.ork import PROTOCOL
from nodes.kit.peer_client import PeerClient

__all__ = ["DEFAULT_TIMEOUT_S", "OrkClient", "OrkUnavailable"]

#: A call's default bound: waiting for the connection plus wrk-ork's answer.
DEFAULT_TIMEOUT_S = 15.0


class OrkUnavailable(Exception):
    """wrk-ork could not be reached within the call's timeout."""


class OrkClient(PeerClient):
    """Calls wrk-ork over a connection kept open (see :class:`PeerClient`)."""

    peer = "wrk-ork"
    protocol = PROTOCOL
    unavailable = OrkUnavailable
    hint = "that it lists this daemon's key in its app_nodes"
    default_timeout_s = DEFAULT_TIMEOUT_S

    @property
    def ork(self) -> bytes:
        """wrk-ork's public key."""
        return self.key
