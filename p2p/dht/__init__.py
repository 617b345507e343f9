"""The DHT: Kademlia over UDP with signed announce/lookup (DESIGN.md §3.4).

Built so far (all sans-IO but the transports): address-derived node ids
(:mod:`._contact`), the datagram codec (:mod:`._messages`), signed peer records
(:mod:`._records`), write tokens (:mod:`._tokens`), the bounded record store
(:mod:`._storage`), the routing table on the ``kademlia`` package
(:mod:`._routing`), the iterative lookup (:mod:`._lookup`), the node core that
serves and matches requests (:mod:`._node`), and UDP / in-memory transports
(:mod:`._transport`), and the trio driver: datagram I/O and awaitable
requests (:mod:`._endpoint`) under :class:`DhtNode` (:mod:`._driver`: announce,
lookup, find_peer), with :mod:`.testnet` to start whole networks in one process.
"""

from ._contact import Contact, canonical_address, node_id_for
from ._driver import DhtNode
from ._endpoint import DhtTimeout
from ._errors import DhtDecodeError, DhtError, DhtProtocolError, DhtUsageError, RecordRejected
from ._lookup import IterativeLookup, LookupConfig
from ._messages import Command, Request, Response, decode, encode
from ._metrics import dht_registry
from ._nat import NatType, classify_nat
from ._node import NodeConfig, NodeCore, Outgoing, ResponseReceived
from ._records import PeerRecord, record_topic_for_key, sign_record, verify_record
from ._routing import Routing, target_id
from ._storage import RecordStore
from ._tokens import TokenIssuer
from ._transport import LinkProfile, MemoryNetwork, MemoryTransport, UdpTransport

__all__ = [
    "Command",
    "Contact",
    "DhtDecodeError",
    "DhtError",
    "DhtNode",
    "DhtProtocolError",
    "DhtTimeout",
    "DhtUsageError",
    "IterativeLookup",
    "LinkProfile",
    "LookupConfig",
    "MemoryNetwork",
    "MemoryTransport",
    "NatType",
    "NodeConfig",
    "NodeCore",
    "Outgoing",
    "PeerRecord",
    "RecordRejected",
    "RecordStore",
    "Request",
    "Response",
    "ResponseReceived",
    "Routing",
    "TokenIssuer",
    "UdpTransport",
    "canonical_address",
    "classify_nat",
    "decode",
    "dht_registry",
    "encode",
    "node_id_for",
    "record_topic_for_key",
    "sign_record",
    "target_id",
    "verify_record",
]
