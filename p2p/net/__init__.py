"""Networks a swarm runs on: real sockets, or many hosts in memory.

A :class:`Network` opens and accepts byte streams and binds datagram
endpoints for one host. :class:`SocketNetwork` is the machine's real network
(trio sockets); :class:`MemoryInternet` holds many hosts in one process, each
a ``Network`` from ``internet.host("127.0.0.2")``, with latency, firewalls
and refused connects on trio's clock, so swarms, relays and replication run
under the autojump clock. See ``README.md`` in this folder.
"""

from p2p.lazy import lazy_names

from ._socket import SocketNetwork, SocketStreamListener
from ._types import Address, Network, StreamListener

#: The in-memory internet (tests, simulations) is imported on first use (PEP 562): a
#: process on real sockets (``cosmicac shell``) does not load it.
_LAZY = {
    **dict.fromkeys(("InternetStatistics", "MemoryHost", "MemoryInternet",
                     "MemoryStreamListener"), "._memory"),
    **dict.fromkeys(("DEFAULT_STREAM_BUFFER_BYTES", "MemoryStream", "memory_stream_pair"),
                    "._memory_stream"),
}


__getattr__ = lazy_names(__name__, _LAZY, globals())


__all__ = [
    "DEFAULT_STREAM_BUFFER_BYTES",
    "Address",
    "InternetStatistics",
    "MemoryHost",
    "MemoryInternet",
    "MemoryStream",
    "MemoryStreamListener",
    "Network",
    "SocketNetwork",
    "SocketStreamListener",
    "StreamListener",
    "memory_stream_pair",
]
