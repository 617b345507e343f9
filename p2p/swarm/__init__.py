"""Topic swarms: find peers on the DHT, keep one connection to each, reach
firewalled peers through blind relays, serve services. See ``_swarm`` for how
it works."""

from ..connection import Connection, is_local_address
from ..host import ChannelService, RpcService, Service, keep_new_connection
from ._config import Firewall, SwarmConfig
from ._errors import PeerNotFound, PeerRefused, PeerUnreachable, SwarmClosed, SwarmError
from ._peers import BackoffPolicy, PeerState, PeerTable
from ._swarm import Swarm
from ._upkeep import UpkeepPolicy, stay_connected

__all__ = [
    "BackoffPolicy",
    "ChannelService",
    "Connection",
    "Firewall",
    "PeerNotFound",
    "PeerRefused",
    "PeerState",
    "PeerTable",
    "PeerUnreachable",
    "RpcService",
    "Service",
    "Swarm",
    "SwarmClosed",
    "SwarmConfig",
    "SwarmError",
    "UpkeepPolicy",
    "is_local_address",
    "keep_new_connection",
    "stay_connected",
]
