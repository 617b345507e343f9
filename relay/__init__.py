"""The blind relay server daemon (DESIGN.md §3.6).

Forwards bytes between a firewalled peer and its dialers without holding a
key that could read them. The protocol's messages and client side live in
:mod:`p2p.relay`; this package is the server: the sans-IO pairing state
(:mod:`._pairing`), the forwarder (:mod:`._splice`), the trio driver
(:class:`RelayServer`), metrics and the daemon entry :func:`run_relay`.

See ``README.md`` in this folder for operator usage.
"""

from ._config import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_PAIRS,
    DEFAULT_MAX_PAIRS_PER_KEY,
    DEFAULT_MAX_RESERVATIONS,
    DEFAULT_PAIR_TIMEOUT_S,
    DEFAULT_PORT,
    RelayConfig,
    RelaySettings,
)
from ._daemon import RelayAddresses, bind_relay_sockets, run_relay
from ._metrics import RelayCollector, relay_registry
from ._pairing import Pairing, PairingPhase, RelayState, RelayStatistics, Reservation
from ._server import RelayServer
from ._splice import SpliceEnd, splice

__all__ = [
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_PAIRS",
    "DEFAULT_MAX_PAIRS_PER_KEY",
    "DEFAULT_MAX_RESERVATIONS",
    "DEFAULT_PAIR_TIMEOUT_S",
    "DEFAULT_PORT",
    "Pairing",
    "PairingPhase",
    "RelayAddresses",
    "RelayCollector",
    "RelayConfig",
    "RelayServer",
    "RelaySettings",
    "RelayState",
    "RelayStatistics",
    "Reservation",
    "SpliceEnd",
    "bind_relay_sockets",
    "relay_registry",
    "run_relay",
    "splice",
]
