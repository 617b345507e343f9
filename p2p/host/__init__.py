"""The host: one accept path, one connection per peer, services on every connection.

A daemon is one peer that hosts several services on one set of connections.
The swarm, the plain TCP server, the relay daemon and ``beam`` all accept and
own connections through a :class:`PeerHost`; see ``_host`` for how it works.
"""

from ._admission import ConnectionSlots, HandshakeSlots, address_group
from ._duplicates import keep_new_connection
from ._errors import HostError
from ._host import Firewall, HostConfig, PeerHost, Reserved, StreamListener, serve_channels
from ._metrics import HostMetrics
from ._server import serve_tcp
from ._service import ChannelHandler, ChannelService, PeerChannelHandler, RpcService, Service

__all__ = [
    "ChannelHandler",
    "ChannelService",
    "ConnectionSlots",
    "Firewall",
    "HandshakeSlots",
    "HostConfig",
    "HostError",
    "HostMetrics",
    "PeerChannelHandler",
    "PeerHost",
    "Reserved",
    "RpcService",
    "Service",
    "StreamListener",
    "address_group",
    "keep_new_connection",
    "serve_channels",
    "serve_tcp",
]
