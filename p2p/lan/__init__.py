"""LAN discovery: signed beacons on a multicast group, so peers of one LAN find each
other with no DHT reachable (``SwarmConfig.lan``). ``_beacon`` is the sans-IO core
(the wire format, :class:`LanBook`); ``_discovery`` its trio driver."""

from ._beacon import (
    ANNOUNCE,
    MAX_ADDRESSES,
    MAX_BEACON_BYTES,
    QUERY,
    Beacon,
    BeaconError,
    LanBook,
    decode_beacon,
    encode_beacon,
)
from ._discovery import DEFAULT_GROUP, LanConfig, LanDiscovery

__all__ = ["ANNOUNCE", "DEFAULT_GROUP", "MAX_ADDRESSES", "MAX_BEACON_BYTES", "QUERY", "Beacon",
           "BeaconError", "LanBook", "LanConfig", "LanDiscovery", "decode_beacon",
           "encode_beacon"]
