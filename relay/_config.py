"""Configuration of the relay server; validated when built."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pydantic import PositiveFloat, PositiveInt, model_validator
from pydantic_settings import SettingsConfigDict

from p2p.connection import ConnectionConfig
from p2p.daemon import AddressList, DaemonSettings, Port, PublicKeyList
from p2p.errors import LocalProtocolError
from p2p.keys import KEY_BYTES

__all__ = ["DEFAULT_IDLE_TIMEOUT_S", "DEFAULT_MAX_PAIRS", "DEFAULT_MAX_PAIRS_PER_KEY",
           "DEFAULT_MAX_RESERVATIONS", "DEFAULT_PAIR_TIMEOUT_S", "DEFAULT_PORT", "RelayConfig",
           "RelaySettings"]

#: Upstream blind-relay-service's port, for the DHT (UDP) and relayed streams (TCP).
DEFAULT_PORT = 49737
#: A pairing whose two sides have not both attached by then is dropped (the
#: issue's default; hyperswarm gives a relayed connect about as long).
DEFAULT_PAIR_TIMEOUT_S = 15.0
#: A pair that moves no byte either way for this long is closed. Live pairs
#: carry the secret stream's keep-alives every 5 s, so only dead ones time out.
DEFAULT_IDLE_TIMEOUT_S = 120.0
#: Each reservation is one secret-stream connection with its mux and RPC
#: server: about 58 KB of relay RSS each (1,000 reservations took a relay from
#: 56 to 113 MB). 1,024 of them plus 1,000 idle pairs (~22 MB, bench/relay.py)
#: stay inside the 200 MB the upstream relay promises.
DEFAULT_MAX_RESERVATIONS = 1024
#: Pairings (waiting or spliced) one key may take part in at once, as dialer or
#: as target. A job agent behind a firewall rarely has more than a handful of
#: relayed peers (worker, proxy, a few shells).
DEFAULT_MAX_PAIRS_PER_KEY = 128
#: Pairings (waiting or spliced) one dialer may hold with one target at once.
#: Without it one dialer could take all of a target's ``max_pairs_per_key``
#: slots and lock every other dialer out for the pairing timeout, again and
#: again. A dialer needs one pairing per connection it makes to the
#: target, and reconnects after a failure while the old pairing may still be
#: waiting out its timeout: 8 leaves room for that and for a few parallel
#: connection attempts (hyperswarm keeps one connection per peer).
DEFAULT_MAX_PAIRS_PER_DIALER_TARGET = 8
#: Pairings issued but not yet fully attached, relay-wide.
DEFAULT_MAX_PENDING_PAIRS = 1024
#: Pairings waiting or spliced, relay-wide. A spliced pair is two sockets and
#: about 22 KB of relay RSS when idle (1,000 idle pairs: +22 MB, bench/relay.py).
#: With 1,024 reservations and 1,024 busy pairs (reads at the 16 KiB floor fill
#: the 32 MiB budget) the relay stays near 200 MB: see relay/README.md.
DEFAULT_MAX_PAIRS = 1024
#: TCP connections being served at once (control, attaching and spliced):
#: room for every reservation, every pair's two sockets, and some slack.
DEFAULT_MAX_CONNECTIONS = 4096
#: Seconds a new connection has to show its first bytes (and an attach to send
#: its whole 41-byte request).
DEFAULT_FIRST_BYTES_TIMEOUT_S = 10.0
#: Largest read per direction of a spliced pair. 256 KiB reads keep relayed
#: throughput near a direct connection's (fewer trips through trio per byte).
DEFAULT_MAX_CHUNK_BYTES = 256 * 1024
#: Smallest read size the buffer budget may shrink reads to.
DEFAULT_MIN_CHUNK_BYTES = 16 * 1024
#: Bytes all spliced pairs together may hold in flight; each direction's read
#: size is ``budget / (2 * active pairs)`` within [min, max] chunk, so memory
#: for relayed data stays ≤ max(budget, 2 * max_pairs * min_chunk) = 32 MiB
#: with the defaults. 32 MiB gives up to 64 busy pairs full-size reads; with
#: 100 pairs streaming the relay's RSS peaked at 110-120 MB (bench/relay.py).
DEFAULT_BUFFER_BUDGET_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class RelayConfig:
    """Limits and timeouts of one relay server.

    Raises:
        LocalProtocolError: (``BAD_CONFIG``) a field is out of range.
    """

    allow: frozenset[bytes] | None = None
    """Keys that may reserve; ``None`` lets any key reserve. Pairing is open to
    any authenticated key (it can only reach peers that chose to reserve)."""

    max_reservations: int = DEFAULT_MAX_RESERVATIONS
    """Reservations held at once. At the bound, ``reserve`` by a new key is
    refused (``TOO_MANY_RESERVATIONS``); a key that already holds one may replace it."""

    max_pairs_per_key: int = DEFAULT_MAX_PAIRS_PER_KEY
    """Pairings one key takes part in at once (waiting or spliced, as dialer or
    target), and undelivered items on its reservation stream. At the bound,
    ``pair`` is refused (``TOO_MANY_PAIRS``)."""

    max_pairs_per_dialer_target: int = DEFAULT_MAX_PAIRS_PER_DIALER_TARGET
    """Pairings one dialer holds with one target at once (waiting or spliced).
    At the bound, that dialer's ``pair`` with that target is refused
    (``TOO_MANY_PAIRS_TO_TARGET``); other dialers can still pair with the target
    until its ``max_pairs_per_key`` is reached. Takes effect only below
    ``max_pairs_per_key``."""

    max_pending_pairs: int = DEFAULT_MAX_PENDING_PAIRS
    """Pairings waiting for their attaches, relay-wide (``TOO_MANY_PAIRS`` beyond)."""

    max_pairs: int = DEFAULT_MAX_PAIRS
    """Pairings waiting or spliced, relay-wide (``TOO_MANY_PAIRS`` beyond)."""

    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """TCP connections served at once; a connection beyond it is closed unread."""

    pair_timeout_s: float = DEFAULT_PAIR_TIMEOUT_S
    """Seconds from ``pair`` until both sides must have attached; then the
    pairing is dropped and a side that attached is answered ``PAIR_TIMEOUT``."""

    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    """Seconds without a byte in either direction before a spliced pair is closed."""

    first_bytes_timeout_s: float = DEFAULT_FIRST_BYTES_TIMEOUT_S
    """Seconds a new connection has to tell what it is (and an attach to send
    its request) before it is closed."""

    max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES
    """Largest read per direction of a spliced pair (one chunk in flight each way)."""

    min_chunk_bytes: int = DEFAULT_MIN_CHUNK_BYTES
    """Smallest read size when many pairs share the buffer budget."""

    buffer_budget_bytes: int = DEFAULT_BUFFER_BUDGET_BYTES
    """Relayed bytes all pairs together may hold in flight (see ``chunk_bytes``)."""

    connection: ConnectionConfig = field(default_factory=ConnectionConfig)
    """Secret stream and mux settings of control connections."""

    def __post_init__(self) -> None:
        for name in ("max_reservations", "max_pairs_per_key", "max_pairs_per_dialer_target",
                     "max_pending_pairs",
                     "max_pairs", "max_connections", "max_chunk_bytes", "min_chunk_bytes",
                     "buffer_budget_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise LocalProtocolError(f"{name} must be a positive int, got {value!r}",
                                         code="BAD_CONFIG")
        for name in ("pair_timeout_s", "idle_timeout_s", "first_bytes_timeout_s"):
            if not getattr(self, name) > 0:
                raise LocalProtocolError(f"{name} must be positive", code="BAD_CONFIG")
        if self.min_chunk_bytes > self.max_chunk_bytes:
            raise LocalProtocolError("min_chunk_bytes must not exceed max_chunk_bytes",
                                     code="BAD_CONFIG")
        if self.allow is not None:
            if not isinstance(self.allow, frozenset):
                object.__setattr__(self, "allow", frozenset(self.allow))
            for key in self.allow:
                if not isinstance(key, bytes) or len(key) != KEY_BYTES:
                    raise LocalProtocolError(f"allow-list keys must be {KEY_BYTES} bytes",
                                             code="BAD_CONFIG")

    def chunk_bytes(self, active_pairs: int) -> int:
        """Read size per direction when ``active_pairs`` pairs are spliced."""
        share = self.buffer_budget_bytes // (2 * max(1, active_pairs))
        return max(self.min_chunk_bytes, min(self.max_chunk_bytes, share))


class RelaySettings(DaemonSettings):
    """The relay daemon's settings (``blind-relay``, ``cosmicac relay``).

    Read by :func:`p2p.daemon.load_settings`: a config file (``--config``),
    then ``COSMICAC_RELAY__<KEY>`` environment variables (``__`` for nested
    keys: ``COSMICAC_RELAY__METRICS__PORT``; lists as JSON arrays or
    comma-separated), then command-line options. The names from before the
    kit (``COSMICAC_RELAY_PORT``…, see :attr:`legacy_env`) still work, below
    the prefixed ones.
    """

    model_config = SettingsConfigDict(env_prefix="COSMICAC_RELAY__")

    legacy_env = {
        **DaemonSettings.legacy_env,
        "COSMICAC_RELAY_STORAGE": "storage",
        "COSMICAC_RELAY_HOST": "host",
        "COSMICAC_RELAY_PORT": "port",
        "COSMICAC_DHT_BOOTSTRAP": "bootstrap",
        "COSMICAC_RELAY_ALLOW": "allow",
        "COSMICAC_RELAY_MAX_RESERVATIONS": "max_reservations",
        "COSMICAC_RELAY_MAX_PAIRS_PER_KEY": "max_pairs_per_key",
        "COSMICAC_RELAY_MAX_PAIRS": "max_pairs",
        "COSMICAC_RELAY_PAIR_TIMEOUT": "pair_timeout_s",
        "COSMICAC_RELAY_IDLE_TIMEOUT": "idle_timeout_s",
        "COSMICAC_RELAY_METRICS_PORT": "metrics.port",
        "COSMICAC_RELAY_METRICS_HOST": "metrics.host",
    }

    #: Identity folder: the same folder always gives the same relay key.
    storage: Path = Path("corestore")
    #: Address to listen on (TCP and UDP).
    host: str = "0.0.0.0"
    #: TCP port for relayed streams and UDP port of the DHT node (0: one free for both).
    port: Port = DEFAULT_PORT
    #: DHT bootstrap nodes; none: a standalone DHT node others may bootstrap from.
    bootstrap: AddressList = ()
    #: Keys that may reserve; none: any key.
    allow: PublicKeyList = ()
    max_reservations: PositiveInt = DEFAULT_MAX_RESERVATIONS
    max_pairs_per_key: PositiveInt = DEFAULT_MAX_PAIRS_PER_KEY
    #: Pairings waiting or relaying, relay-wide.
    max_pairs: PositiveInt = DEFAULT_MAX_PAIRS
    #: Pairings waiting for their attaches; None: as many as ``max_pairs``.
    max_pending_pairs: PositiveInt | None = None
    max_connections: PositiveInt = DEFAULT_MAX_CONNECTIONS
    pair_timeout_s: PositiveFloat = DEFAULT_PAIR_TIMEOUT_S
    idle_timeout_s: PositiveFloat = DEFAULT_IDLE_TIMEOUT_S
    first_bytes_timeout_s: PositiveFloat = DEFAULT_FIRST_BYTES_TIMEOUT_S
    max_chunk_bytes: PositiveInt = DEFAULT_MAX_CHUNK_BYTES
    min_chunk_bytes: PositiveInt = DEFAULT_MIN_CHUNK_BYTES
    buffer_budget_bytes: PositiveInt = DEFAULT_BUFFER_BUDGET_BYTES

    @model_validator(mode="after")
    def _chunks_in_order(self) -> RelaySettings:
        if self.min_chunk_bytes > self.max_chunk_bytes:
            raise ValueError("min_chunk_bytes must not exceed max_chunk_bytes")
        return self

    def relay_config(self) -> RelayConfig:
        """The server's :class:`RelayConfig` (already valid: the model checked it)."""
        return RelayConfig(
            allow=frozenset(self.allow) if self.allow else None,
            max_reservations=self.max_reservations,
            max_pairs_per_key=self.max_pairs_per_key,
            max_pairs=self.max_pairs,
            max_pending_pairs=self.max_pending_pairs or self.max_pairs,
            max_connections=self.max_connections,
            pair_timeout_s=self.pair_timeout_s,
            idle_timeout_s=self.idle_timeout_s,
            first_bytes_timeout_s=self.first_bytes_timeout_s,
            max_chunk_bytes=self.max_chunk_bytes,
            min_chunk_bytes=self.min_chunk_bytes,
            buffer_budget_bytes=self.buffer_budget_bytes,
        )
