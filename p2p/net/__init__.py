"""Networks a swarm runs on: real sockets, or many hosts in memory.

A :class:`Network` opens and accepts byte streams and binds datagram
endpoints for one host. :class:`SocketNetwork` is the machine's real network
(trio sockets); :class:`MemoryInternet` holds many hosts in one process, each
a ``Network`` from ``internet.host("127.0.0.2")``, with latency, firewalls
and refused connects on trio's clock, so swarms, relays and replication run
under the autojump clock. See ``README.md`` in this folder.
"""

from ._memory import InternetStatistics, MemoryHost, MemoryInternet, MemoryStreamListener
from ._memory_stream import DEFAULT_STREAM_BUFFER_BYTES, MemoryStream, memory_stream_pair
from ._socket import SocketNetwork, SocketStreamListener
from ._types import Address, Network, StreamListener

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
