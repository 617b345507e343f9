"""Topic swarms: find peers on the DHT, keep one connection to each, reach
firewalled peers through blind relays. See ``_swarm`` for how it works."""

from ._config import Firewall, SwarmConfig
from ._connection import SwarmConnection, is_local_address
from ._duplicates import keep_new_connection
from ._errors import PeerNotFound, PeerRefused, PeerUnreachable, SwarmClosed, SwarmError
from ._peers import BackoffPolicy, PeerState, PeerTable
from ._swarm import PeerChannelHandler, Swarm

__all__ = [
    "BackoffPolicy",
    "Firewall",
    "PeerChannelHandler",
    "PeerNotFound",
    "PeerRefused",
    "PeerState",
    "PeerTable",
    "PeerUnreachable",
    "Swarm",
    "SwarmClosed",
    "SwarmConfig",
    "SwarmConnection",
    "SwarmError",
    "is_local_address",
    "keep_new_connection",
]
