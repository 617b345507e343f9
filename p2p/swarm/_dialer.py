"""A swarm's dialling: one dial per key, addresses first, then relays; reconnects.

* ``connect(key)`` returns the existing connection, waits for the dial in
  flight, or dials the newest record the DHT has for the key.
* Dialling a record tries its addresses (all at once, ``direct_timeout_s``
  each; the first handshake wins), then its relays one by one: ask the relay
  for a pairing, attach to it, run the end-to-end handshake through it. The
  error names every address and relay tried and why each failed.
* The firewall runs before a dial (``how`` is ``connect``, ``reconnect`` or
  ``topic:<hex>``).
* A connection that ends is redialled after a backoff if its peer belongs to a
  topic we look up (:class:`~._peers.PeerTable` decides when).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from ..connection import Address, Connection, closed_handshake_pause, worth_another_socket
from ..dht import DhtError, PeerRecord
from ..errors import HandshakeError, P2PError
from ..host import HostError
from ..keys import format_key
from ..noise import SecretStream
from ._errors import PeerNotFound, PeerRefused, PeerUnreachable, SwarmError

if TYPE_CHECKING:
    from ._swarm import Swarm

__all__ = ["Dialer", "Target", "reason"]

log = logging.getLogger(__name__)

#: Addresses of one record tried at once; a record may list more.
MAX_ADDRESSES_PER_DIAL = 8


@dataclass(frozen=True)
class Target:
    """Where a peer may be reached: direct addresses, then relays."""

    addresses: tuple[Address, ...]
    relays: tuple[bytes, ...]
    #: Read from a signed record (filtered and ordered for our network), not
    #: given by a caller (tried as given).
    from_record: bool = False

    @classmethod
    def of(cls, record: PeerRecord) -> Target:
        return cls(record.addresses, record.relays, from_record=True)


@dataclass
class _Attempt:
    done: trio.Event = field(default_factory=trio.Event)
    result: Connection | None = None
    error: SwarmError | None = None


class Dialer:
    """The dials and reconnects of one swarm."""

    def __init__(self, swarm: Swarm) -> None:
        self._swarm = swarm
        self._dials: dict[bytes, _Attempt] = {}
        self._reconnects: set[bytes] = set()
        self._slots = trio.Semaphore(swarm.config.max_parallel_dials)

    def should_dial(self, key: bytes) -> bool:
        """A lookup found ``key``: dial it (or join the dial in flight)?"""
        return self._swarm.peers.may_dial(key, trio.current_time()) or key in self._dials

    async def connect(self, key: bytes, addresses: Iterable[Address] | None,
                      relays: Iterable[bytes] | None = None) -> Connection:
        swarm = self._swarm
        existing = swarm.connections.get(key)
        if existing is not None:
            await trio.lowlevel.checkpoint()
            return existing
        if addresses is not None or relays is not None:
            target = Target(tuple(addresses or ()), tuple(relays or ()))
        else:
            known = swarm.known_addresses(key)
            if known:
                try:
                    return await self.dial(key, Target(known, ()), "connect")
                except PeerRefused:
                    raise
                except SwarmError as exc:
                    if swarm.dht is None:
                        raise
                    log.info("swarm.known_address_failed peer=%s code=%s: asking the DHT",
                             format_key(key)[:12], exc.code)
            try:
                target = Target.of(await self.find(key))
            except PeerNotFound as exc:
                return await self._through_our_relays(key, exc)
        return await self.dial(key, target, "connect")

    async def _through_our_relays(self, key: bytes, not_found: PeerNotFound) -> Connection:
        """A peer the DHT does not know (or a DHT we cannot reach) may still hold a
        reservation on our deployment's relays: a job VM on a network that reaches
        only the relay box announces nowhere else. Try them before giving up."""
        relays = tuple(r for r in self._swarm.config.relays if r != key)
        if not relays:
            raise not_found
        log.info("swarm.trying_our_relays peer=%s code=%s relays=%d", format_key(key)[:12],
                 not_found.code, len(relays))
        try:
            return await self.dial(key, Target((), relays), "connect")
        except PeerRefused:
            raise
        except SwarmError as exc:
            raise PeerNotFound(f"{not_found}; not through our relays either ({exc})",
                               code=not_found.code) from exc

    async def find(self, public_key: bytes) -> PeerRecord:
        swarm = self._swarm
        assert swarm.dht is not None
        record = None
        try:
            record = await swarm.dht.find_peer(public_key)
        except DhtError as exc:
            log.info("swarm.find_failed peer=%s code=%s", format_key(public_key)[:12], exc.code)
        if record is None:
            state = swarm.peers.get(public_key)
            if state is not None and state.record is not None:
                return state.record  # the last one we saw is better than nothing
            if len(swarm.dht.core.routing) == 0:
                tried = ", ".join(f"{h}:{p}" for h, p in swarm.dht.bootstrap_addresses) \
                    or "none configured"
                raise PeerNotFound(f"cannot look up peer {format_key(public_key)[:16]}…: no "
                                   f"DHT node answered (bootstrap: {tried})",
                                   code="DHT_UNREACHABLE")
            raise PeerNotFound(f"no record for peer {format_key(public_key)[:16]}… on the DHT")
        swarm.peers.found(record, None)
        return record

    async def dial_quietly(self, key: bytes, record: PeerRecord, how: str,
                           topic: bytes | None) -> None:
        try:
            connection = await self.dial(key, Target.of(record), how)
        except SwarmError as exc:
            log.info("swarm.dial_failed peer=%s code=%s reason=%s", format_key(key)[:12],
                     exc.code, exc)
            return
        if topic is not None:
            connection.add_topics([topic])

    async def dial(self, key: bytes, target: Target, how: str) -> Connection:
        swarm = self._swarm
        if key == swarm.public_key:
            raise PeerRefused("refusing to connect to ourselves", code="SELF")
        existing = swarm.connections.get(key)
        if existing is not None:
            return existing
        attempt = self._dials.get(key)
        if attempt is not None:  # one dial per key: wait for the one in flight
            await attempt.done.wait()
            if attempt.result is not None:
                return attempt.result
            assert attempt.error is not None
            raise attempt.error
        attempt = self._dials[key] = _Attempt()
        swarm.peers.dialling(key)
        try:
            if not swarm.host.allows(key, how):
                swarm.host.metrics.refused.labels("firewall").inc()
                raise PeerRefused(f"the firewall refused peer {format_key(key)[:16]}…")
            if len(swarm.connections) >= swarm.config.max_connections:
                raise SwarmError(f"at the limit of {swarm.config.max_connections} connections",
                                 code="TOO_MANY_CONNECTIONS")
            async with self._slots:
                connection = await self._dial_target(key, target)
            attempt.result = connection
            return connection
        except SwarmError as exc:
            attempt.error = exc
            swarm.metrics.failures.labels(exc.code).inc()
            wait = swarm.peers.failed(key, trio.current_time(), exc.code)
            log.debug("swarm.dial_failed peer=%s code=%s retry_in=%.1f", format_key(key)[:12],
                      exc.code, wait)
            raise
        finally:
            del self._dials[key]
            if attempt.result is None and attempt.error is None:
                state = swarm.peers.get(key)
                if state is not None:
                    state.dialling = False  # cancelled: no verdict on the peer
            attempt.done.set()

    async def _dial_target(self, key: bytes, target: Target) -> Connection:
        swarm = self._swarm
        failures: list[tuple[str, str]] = []
        if target.addresses:
            swarm.metrics.attempts.labels("direct").inc()
            addresses = (swarm.order_addresses(target.addresses) if target.from_record
                         else list(target.addresses))
            found = await self._dial_direct(key, addresses, failures)
            if found is not None:
                return found
        for relay_key in target.relays:
            if relay_key in (key, swarm.public_key):
                continue
            swarm.metrics.attempts.labels("relayed").inc()
            label = f"relay {format_key(relay_key)[:12]}"
            try:
                with trio.fail_after(swarm.config.relay_timeout_s):
                    return await self._dial_via_relay(key, relay_key)
            except trio.TooSlowError:
                failures.append((label, f"timed out after {swarm.config.relay_timeout_s} s"))
            except (P2PError, OSError) as exc:
                failures.append((label, reason(exc)))
        raise PeerUnreachable(key, failures)

    async def _dial_direct(
        self, key: bytes, addresses: Iterable[Address], failures: list[tuple[str, str]]
    ) -> Connection | None:
        """Connect to every address at once; handshake only on the first socket
        that connects (the others are closed before a word is said), and if that
        handshake fails, race the addresses that are left.

        Racing whole handshakes would let two finish: the peer would then hold
        two connections we initiated, keep the newer, and might drop the one we
        kept. Only one handshake at a time keeps both sides on one connection.
        """
        swarm = self._swarm
        timeout = swarm.config.direct_timeout_s
        remaining = list(addresses)[:MAX_ADDRESSES_PER_DIAL]
        retries = 0  # new sockets after a close mid-handshake (worth_another_socket)
        # Bounded: each round removes an address or spends one of a few retries.
        while remaining:
            connected = await self._first_to_connect(remaining, failures, timeout)
            if connected is None:
                return None
            raw, address = connected
            try:
                with trio.fail_after(timeout):
                    stream = await SecretStream.initiator(
                        raw, swarm.keypair, key, config=swarm.config.connection.stream)
            except trio.TooSlowError:
                await trio.aclose_forcefully(raw)
                remaining.remove(address)
                failures.append((_label(address), f"handshake timed out after {timeout} s"))
                continue
            except (OSError, HandshakeError, trio.BrokenResourceError) as exc:
                await trio.aclose_forcefully(raw)
                if (worth_another_socket(exc)
                        and retries < swarm.config.connection.closed_handshake_retries):
                    await trio.sleep(closed_handshake_pause(retries))
                    retries += 1
                    continue
                remaining.remove(address)
                failures.append((_label(address), reason(exc)))
                continue
            return await self._adopt(stream, address, None)
        return None

    async def _first_to_connect(
        self, addresses: list[Address], failures: list[tuple[str, str]], each_s: float,
    ) -> tuple[trio.abc.HalfCloseableStream, Address] | None:
        """The first of ``addresses`` whose stream connects; the rest are
        cancelled (or closed, if they connected too); each failure is noted."""
        network = self._swarm.network
        won: list[tuple[trio.abc.HalfCloseableStream, Address]] = []

        async def try_one(address: Address, cancel_rest: trio.CancelScope) -> None:
            try:
                with trio.fail_after(each_s):
                    raw = await network.open_stream(address)
            except trio.TooSlowError:
                failures.append((_label(address), f"timed out after {each_s} s"))
                addresses_failed.append(address)
                return
            except OSError as exc:
                failures.append((_label(address), reason(exc)))
                addresses_failed.append(address)
                return
            if won:  # another address won the race meanwhile
                await trio.aclose_forcefully(raw)
                return
            won.append((raw, address))
            cancel_rest.cancel()

        addresses_failed: list[Address] = []
        async with trio.open_nursery() as nursery:
            for address in addresses:
                nursery.start_soon(try_one, address, nursery.cancel_scope)
        for address in addresses_failed:
            addresses.remove(address)
        return won[0] if won else None

    async def _dial_via_relay(self, key: bytes, relay_key: bytes) -> Connection:
        swarm = self._swarm
        relay = await swarm.connect(relay_key)
        if relay.relayed or relay.remote_address is None:
            raise SwarmError("the relay itself is only reachable through a relay",
                             code="RELAY_UNREACHABLE")
        # The relay's client (its RPC, pydantic) is imported by the first relayed
        # dial: a swarm that dials addresses only (``cosmicac shell --address``)
        # never loads it.
        from ..relay import Role, attach, request_pair

        ticket = await request_pair(relay, key)
        raw = await attach(relay.remote_address, ticket.token, role=Role.INITIATOR,
                           timeout_s=ticket.timeout_s, network=swarm.network)
        try:
            stream = await SecretStream.initiator(raw, swarm.keypair, key,
                                                  config=swarm.config.connection.stream)
        except BaseException:
            await trio.aclose_forcefully(raw)
            raise
        return await self._adopt(stream, relay.remote_address, relay_key)

    async def _adopt(self, stream: SecretStream, address: Address,
                     relay_key: bytes | None) -> Connection:
        try:
            return await self._swarm.host.adopt(stream, address, relay_key=relay_key)
        except HostError as exc:
            raise SwarmError(str(exc), code=exc.code) from exc

    # -- reconnects ------------------------------------------------------------

    def maybe_reconnect(self, key: bytes, wait: float) -> None:
        """Redial a peer of a topic we look up, after ``wait`` seconds."""
        swarm = self._swarm
        state = swarm.peers.get(key)
        nursery = swarm._nursery
        if (state is None or not (state.topics & swarm.topics.client_topics())
                or key in self._reconnects or nursery is None):
            return
        self._reconnects.add(key)
        nursery.start_soon(self._reconnect, key, wait)

    async def _reconnect(self, key: bytes, wait: float) -> None:
        swarm = self._swarm
        try:
            await trio.sleep(wait)
            if key in swarm.connections or key in self._dials:
                return
            state = swarm.peers.get(key)
            topics = state.topics if state else set()
            if not topics & swarm.topics.client_topics():
                return
            try:
                # The peer may be back on a new port: look for its newest record.
                target = Target.of(await self.find(key))
                connection = await self.dial(key, target, "reconnect")
            except SwarmError as exc:
                log.info("swarm.reconnect_failed peer=%s code=%s", format_key(key)[:12],
                         exc.code)
                state = swarm.peers.get(key)
                if state is not None:
                    self._reconnects.discard(key)
                    self.maybe_reconnect(key, max(0.0, state.next_attempt_at
                                                  - trio.current_time()))
                return
            connection.add_topics(topics)
        finally:
            self._reconnects.discard(key)


def _label(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def reason(exc: BaseException) -> str:
    """One line saying why an attempt failed."""
    if isinstance(exc, P2PError):
        return f"{exc.code}: {exc}"
    if isinstance(exc, OSError):
        causes = getattr(exc.__cause__, "exceptions", None) or [exc]
        first = causes[0]
        if isinstance(first, ConnectionRefusedError):
            return "connection refused"
        return getattr(first, "strerror", None) or str(first) or type(first).__name__
    return str(exc) or type(exc).__name__
