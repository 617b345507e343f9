"""A swarm's relay reservations, and the peers that reach us through relays.

With ``relays`` configured, the swarm keeps a reservation with each relay
(reconnecting with a doubling, jittered backoff, e.g. after the relay
restarts) and lists their keys in its records. A relay tells us when a dialler
wants us: we check the firewall, attach to the pairing and run the handshake
as responder through the relay; the peer must prove the key the relay named.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

import trio

from ..connection import Address
from ..errors import P2PError
from ..host import HostError
from ..keys import format_key
from ..noise import SecretStream
from ._dialer import reason
from ._errors import SwarmError

if TYPE_CHECKING:
    from ..relay import Incoming
    from ._swarm import Swarm

__all__ = ["Reservations"]

log = logging.getLogger(__name__)

#: After this many failed tries in a row, a lost reservation is logged as a
#: warning (an operator must look: wrong key, relay down, blocked port).
WARN_AFTER_FAILURES = 3


class Reservations:
    """The reservations one swarm holds with its relays."""

    def __init__(self, swarm: Swarm) -> None:
        self._swarm = swarm
        #: Relay keys holding a reservation for us right now.
        self.reserved: set[bytes] = set()
        #: Set (and replaced) whenever ``reserved`` changes.
        self.changed = trio.Event()

    async def keep(self, relay_key: bytes) -> None:
        """Hold a reservation with one relay for as long as the swarm runs."""
        # The relay's client (its RPC, pydantic) is imported here, by a swarm that
        # reserves: one with no relays (``cosmicac shell``) never loads it.
        from ..relay import keep_reservation

        swarm = self._swarm
        delay = 1.0
        failures = 0
        label = format_key(relay_key)[:12]
        while True:
            try:
                relay = await swarm.connect(relay_key)
                if relay.relayed or relay.remote_address is None:
                    raise SwarmError("relay reachable only through a relay",
                                     code="RELAY_UNREACHABLE")
                on_incoming = functools.partial(self._on_incoming, relay_key,
                                                relay.remote_address)
                async with trio.open_nursery() as nursery:
                    await nursery.start(functools.partial(keep_reservation, relay, on_incoming))
                    self._set(relay_key, True)
                    log.info("swarm.reserved relay=%s address=%s:%d", label,
                             *relay.remote_address)
                    delay = 1.0
                    failures = 0
            except* (P2PError, OSError) as group:  # the reservation runs in a nursery
                failures += 1
                level = logging.WARNING if failures >= WARN_AFTER_FAILURES else logging.INFO
                log.log(level, "swarm.reservation_lost relay=%s tries=%d reason=%s", label,
                        failures, reason(group.exceptions[0]))
            finally:
                self._set(relay_key, False)
            await trio.sleep(delay * (0.5 + swarm.rng.random()))
            delay = min(2 * delay, swarm.config.reservation_retry_max_s)

    def _set(self, relay_key: bytes, held: bool) -> None:
        if (relay_key in self.reserved) == held:
            return
        if held:
            self.reserved.add(relay_key)
        else:
            self.reserved.discard(relay_key)
        changed, self.changed = self.changed, trio.Event()
        changed.set()

    def _on_incoming(self, relay_key: bytes, relay_address: Address, incoming: Incoming) -> None:
        self._swarm._running_nursery().start_soon(self._accept, relay_key, relay_address,
                                                  incoming)

    async def _accept(self, relay_key: bytes, relay_address: Address,
                      incoming: Incoming) -> None:
        from ..relay import Role, attach  # (see keep: loaded by then)

        swarm = self._swarm
        peer = format_key(incoming.initiator)[:12]
        if not swarm.host.allows(incoming.initiator, "relayed"):
            swarm.host.metrics.refused.labels("firewall").inc()
            log.info("swarm.refused peer=%s via=relay reason=firewall", peer)
            return
        timeout = swarm.config.relay_timeout_s
        try:
            with trio.fail_after(timeout):
                raw = await attach(relay_address, incoming.token, role=Role.RESPONDER,
                                   timeout_s=timeout, network=swarm.network)
                try:
                    stream = await SecretStream.responder(raw, swarm.keypair,
                                                          config=swarm.config.connection.stream)
                except BaseException:
                    await trio.aclose_forcefully(raw)
                    raise
        except (P2PError, OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            swarm.host.metrics.refused.labels("handshake").inc()
            log.info("swarm.relayed_accept_failed peer=%s reason=%s", peer, reason(exc))
            return
        except Exception as exc:  # the peer's bytes must never reach the nursery
            swarm.host.metrics.refused.labels("handshake").inc()
            log.info("swarm.relayed_accept_failed peer=%s reason=%r", peer, exc)
            return
        if stream.remote_public_key != incoming.initiator:
            # The relay named one peer and another arrived: not who we agreed to meet.
            log.warning("swarm.relayed_key_mismatch expected=%s", peer)
            await stream.aclose()
            return
        swarm.host.metrics.accepted.labels("relayed").inc()
        try:
            await swarm.host.serve_connection(stream, relay_address, relay_key=relay_key)
        except HostError:  # pragma: no cover - serve_connection reports, not raises
            pass
