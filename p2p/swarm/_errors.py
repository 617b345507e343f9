"""Errors raised by the swarm.

::

    P2PError                                     (p2p.errors)
    └── SwarmError                               base of everything p2p.swarm raises
        ├── PeerNotFound                         no record for the key on the DHT
        ├── PeerUnreachable                      every address and relay failed
        │                                        (.attempts names each one and why)
        ├── PeerRefused                          our firewall callback refused the key
        └── SwarmClosed                          the swarm is not running
"""

from __future__ import annotations

from p2p.errors import P2PError
from p2p.keys import format_key

__all__ = ["PeerNotFound", "PeerRefused", "PeerUnreachable", "SwarmClosed", "SwarmError"]


class SwarmError(P2PError):
    """Base of every error the swarm raises on purpose."""

    code = "SWARM_ERROR"


class PeerNotFound(SwarmError):
    """The DHT holds no record for the key (not announced, or expired)."""

    code = "NOT_FOUND"


class PeerUnreachable(SwarmError):
    """No announced address or relay led to the peer.

    ``attempts`` lists ``(how, reason)`` pairs, e.g. ``("10.0.0.3:4000",
    "timed out after 2 s")`` or ``("relay 3fa2…", "NOT_RESERVED")``.
    """

    code = "UNREACHABLE"

    def __init__(self, public_key: bytes, attempts: list[tuple[str, str]]) -> None:
        tried = "; ".join(f"{how}: {reason}" for how, reason in attempts) or "nothing to try"
        super().__init__(f"cannot reach peer {format_key(public_key)[:16]}… ({tried})")
        self.public_key = public_key
        self.attempts = attempts


class PeerRefused(SwarmError):
    """The swarm's firewall callback refused this peer."""

    code = "REFUSED"


class SwarmClosed(SwarmError):
    """The swarm is not running (start ``Swarm.run`` first, or it stopped)."""

    code = "CLOSED"
