"""Sans-IO state of the relay: reservations, pairings, their limits and counters.

Theory of operation
-------------------
A *reservation* is held by one key at a time (the Noise-authenticated key of a
``reserve`` call); a newer ``reserve`` by the same key replaces the older, and
items the older one had not delivered move to the newer. Each reservation has
a queue of *incoming* items (token, initiator) waiting to be streamed to its
holder, bounded by ``max_pairs_per_key``.

A *pairing* is made by ``pair``: one dialer, one reserved target and two fresh
random tokens, one per role. The dialer gets the initiator token in its reply;
the target gets the responder token on its reservation stream. Separate tokens
mean each side can only attach as itself: the dialer never learns the token
that attaches as the target, so it cannot take the target's place, and vice
versa (``WRONG_ROLE`` when a token is presented for the other role).

Pairing phases (one table, for the docs; see ``README.md``)::

    pair ──> WAITING ──attach(one role)──> HALF_ATTACHED ──attach(other)──> ACTIVE
                │                               │                            │
                └──────── pair_timeout ─────────┴──> DONE <──── finish ──────┘

Tokens are one-time: they leave the table when the pairing becomes ACTIVE or
DONE, so a reused, expired or invented token is ``UNKNOWN_TOKEN``. Every
pairing holds one slot of its dialer's and its target's ``max_pairs_per_key``,
one of its (dialer, target) route's ``max_pairs_per_dialer_target`` and one
of ``max_pairs`` from ``pair`` until DONE; waiting ones also hold a slot of
``max_pending_pairs``.

Fairness between dialers: the per-route bound is checked before the target's
per-key bound, so one dialer can take at most ``max_pairs_per_dialer_target``
of a target's ``max_pairs_per_key`` slots, and a dialer under both its own
bounds is refused only when the target's slots (or its undelivered items, or
the relay-wide tables) are full. ``pair`` checks, in this order::

    SELF_PAIR / NOT_RESERVED          the request itself
    TOO_MANY_PAIRS                    the dialer's own max_pairs_per_key
    TOO_MANY_PAIRS_TO_TARGET          the route's max_pairs_per_dialer_target
    TOO_MANY_PAIRS                    the target's max_pairs_per_key or its queue
    TOO_MANY_PAIRS                    max_pending_pairs / max_pairs, relay-wide

Keys cost nothing to make, so many dialers together can still fill a target's
``max_pairs_per_key``; the per-route bound stops one key, not a crowd.

All pairings share one timeout, so they expire in the
order they were made: :meth:`RelayState.expire` pops from the front of an
insertion-ordered table, and :meth:`RelayState.next_deadline` is its head.

Time is the caller's ``now`` (seconds on any monotonic clock); randomness comes
from the ``token_source`` given to the constructor. Nothing here blocks, logs
or touches a socket: the trio driver (``_server.py``) does.
"""

from __future__ import annotations

import secrets
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from p2p.keys import KEY_BYTES, format_key
from p2p.relay import RefusalCode, RelayRefused, Role

from ._config import RelayConfig

__all__ = [
    "Pairing",
    "PairingPhase",
    "RelayState",
    "RelayStatistics",
    "Reservation",
]


class PairingPhase(Enum):
    #: Tokens issued; neither side has attached.
    WAITING = "waiting"
    #: One side attached and waits for the other.
    HALF_ATTACHED = "half-attached"
    #: Both sides attached; the driver splices their sockets.
    ACTIVE = "active"
    #: Ended: spliced and closed, expired, or refused on attach.
    DONE = "done"


@dataclass(eq=False)
class Reservation:
    """One key's reservation; identity-compared (a key's next one is a new object)."""

    key: bytes
    #: (token, initiator) items not yet streamed to the holder.
    incoming: deque[tuple[bytes, bytes]] = field(default_factory=deque)
    #: A newer reservation by the same key took this one's place.
    replaced: bool = False


@dataclass(eq=False)
class Pairing:
    """One dialer-target pairing."""

    number: int
    initiator: bytes
    target: bytes
    tokens: dict[Role, bytes]
    expires_at: float
    phase: PairingPhase = PairingPhase.WAITING
    attached: set[Role] = field(default_factory=set)

    def __repr__(self) -> str:
        return (f"<Pairing #{self.number} {format_key(self.initiator)[:8]}->"
                f"{format_key(self.target)[:8]} {self.phase.value}>")


@dataclass(frozen=True)
class RelayStatistics:
    """A snapshot of the relay's counters (``server.stats``)."""

    reservations: int
    pending_pairs: int
    active_pairs: int
    #: Pairings that reached ACTIVE, since start.
    pairs_made: int
    #: Bytes forwarded, both directions, since start.
    bytes_relayed: int
    #: Refusals since start, by :class:`RefusalCode` value.
    refusals: Mapping[str, int]
    #: TCP connections being served (set by the driver).
    connections: int = 0


class RelayState:
    """Reservations and pairings of one relay, without I/O.

    Args:
        config: limits and the pairing timeout.
        token_source: ``n -> n random bytes``; a CSPRNG in production
            (tokens are bearer secrets), seeded bytes in tests.
    """

    def __init__(
        self,
        config: RelayConfig | None = None,
        *,
        token_source: Callable[[int], bytes] = secrets.token_bytes,
    ) -> None:
        self.config = config or RelayConfig()
        self._token_source = token_source
        self._reservations: dict[bytes, Reservation] = {}
        #: Waiting and half-attached pairings by number, oldest first (bounded
        #: by max_pending_pairs).
        self._pending: dict[int, Pairing] = {}
        #: Token -> (pairing, the role it attaches as); two per pending pairing.
        self._tokens: dict[bytes, tuple[Pairing, Role]] = {}
        #: Pairings (pending or active) each key takes part in (bounded per key
        #: by max_pairs_per_key; keys at 0 are removed).
        self._pairs_by_key: Counter[bytes] = Counter()
        #: Pairings (pending or active) per (dialer, target) route (bounded per
        #: route by max_pairs_per_dialer_target, in number by max_pairs; routes
        #: at 0 are removed).
        self._pairs_by_route: Counter[tuple[bytes, bytes]] = Counter()
        self._active = 0
        self._next_number = 1
        self.pairs_made = 0
        self.bytes_relayed = 0
        self.refusals: Counter[str] = Counter()

    # -- reservations ----------------------------------------------------------

    def reserve(self, key: bytes) -> tuple[Reservation, Reservation | None]:
        """Make ``key``'s reservation; return it and the one it replaced, if any.

        The caller must end the replaced one's stream (code ``REPLACED``).

        Raises:
            RelayRefused: ``NOT_ALLOWED``, ``TOO_MANY_RESERVATIONS``.
        """
        allow = self.config.allow
        if allow is not None and key not in allow:
            raise self._refuse(RefusalCode.NOT_ALLOWED,
                               f"key {format_key(key)[:12]} may not reserve on this relay")
        old = self._reservations.get(key)
        if old is None and len(self._reservations) >= self.config.max_reservations:
            raise self._refuse(RefusalCode.TOO_MANY_RESERVATIONS,
                               f"the relay holds {self.config.max_reservations} reservations")
        new = Reservation(key)
        if old is not None:
            old.replaced = True
            new.incoming, old.incoming = old.incoming, deque()
        self._reservations[key] = new
        return new, old

    def end_reservation(self, reservation: Reservation) -> None:
        """The reservation's stream ended; forget it unless already replaced."""
        if self._reservations.get(reservation.key) is reservation:
            del self._reservations[reservation.key]

    def reservation_for(self, key: bytes) -> Reservation | None:
        return self._reservations.get(key)

    # -- pairings --------------------------------------------------------------

    def request_pair(
        self, initiator: bytes, target: bytes, now: float
    ) -> tuple[Pairing, Reservation]:
        """Make a pairing of ``initiator`` with the reserved ``target``.

        Queues ``(responder token, initiator)`` on the target's reservation;
        the caller wakes its stream and answers the dialer with
        ``pairing.tokens[Role.INITIATOR]``.

        Raises:
            RelayRefused: ``SELF_PAIR``, ``NOT_RESERVED``, ``TOO_MANY_PAIRS``,
                ``TOO_MANY_PAIRS_TO_TARGET`` (see the module docstring for the order).
        """
        if len(target) != KEY_BYTES:
            raise self._refuse(RefusalCode.NOT_RESERVED, "target is not a public key")
        if target == initiator:
            raise self._refuse(RefusalCode.SELF_PAIR, "a peer cannot pair with itself")
        reservation = self._reservations.get(target)
        if reservation is None:
            raise self._refuse(RefusalCode.NOT_RESERVED,
                               f"peer {format_key(target)[:12]} holds no reservation on "
                               f"this relay")
        config = self.config
        per_key = config.max_pairs_per_key
        if self._pairs_by_key[initiator] >= per_key:
            raise self._refuse(RefusalCode.TOO_MANY_PAIRS,
                               f"the dialer is in {per_key} pairings already")
        per_route = config.max_pairs_per_dialer_target
        if self._pairs_by_route[initiator, target] >= per_route:
            raise self._refuse(RefusalCode.TOO_MANY_PAIRS_TO_TARGET,
                               f"the dialer holds {per_route} pairings with peer "
                               f"{format_key(target)[:12]} already")
        if self._pairs_by_key[target] >= per_key or len(reservation.incoming) >= per_key:
            raise self._refuse(RefusalCode.TOO_MANY_PAIRS,
                               f"peer {format_key(target)[:12]} is in {per_key} pairings already")
        if (len(self._pending) >= config.max_pending_pairs
                or len(self._pending) + self._active >= config.max_pairs):
            raise self._refuse(RefusalCode.TOO_MANY_PAIRS, "the relay is at its pairing limit")
        tokens = {Role.INITIATOR: self._new_token(), Role.RESPONDER: self._new_token()}
        pairing = Pairing(self._next_number, initiator, target, tokens,
                          expires_at=now + config.pair_timeout_s)
        self._next_number += 1
        self._pending[pairing.number] = pairing
        for role, token in tokens.items():
            self._tokens[token] = (pairing, role)
        self._pairs_by_key[initiator] += 1
        self._pairs_by_key[target] += 1
        self._pairs_by_route[initiator, target] += 1
        reservation.incoming.append((tokens[Role.RESPONDER], initiator))
        return pairing, reservation

    def _new_token(self) -> bytes:
        while True:
            token = self._token_source(KEY_BYTES)
            if token not in self._tokens:  # 2^-256 odds; cheap to rule out
                return token

    def attach(self, token: bytes, role: Role, now: float) -> Pairing:
        """One side attached with ``token`` as ``role``; return its pairing.

        When this completes the pairing (phase ACTIVE) the caller splices the
        two sides and calls :meth:`finish` when the splice ends; otherwise
        (HALF_ATTACHED) the side waits for the other or for :meth:`expire`.

        Raises:
            RelayRefused: ``UNKNOWN_TOKEN`` (unknown, expired or used),
                ``WRONG_ROLE``, ``ALREADY_ATTACHED``.
        """
        entry = self._tokens.get(token)
        if entry is None or entry[0].expires_at <= now:
            raise self._refuse(RefusalCode.UNKNOWN_TOKEN, "unknown, expired or used token")
        pairing, token_role = entry
        if token_role != role:
            raise self._refuse(RefusalCode.WRONG_ROLE,
                               f"the token was issued for the {token_role.name.lower()}")
        if role in pairing.attached:
            raise self._refuse(RefusalCode.ALREADY_ATTACHED,
                               f"the {role.name.lower()} is attached already")
        pairing.attached.add(role)
        if len(pairing.attached) == 1:
            pairing.phase = PairingPhase.HALF_ATTACHED
            return pairing
        pairing.phase = PairingPhase.ACTIVE
        self._forget_tokens(pairing)
        del self._pending[pairing.number]
        self._active += 1
        self.pairs_made += 1
        return pairing

    def finish(self, pairing: Pairing) -> None:
        """The splice of an ACTIVE pairing ended; free its slots."""
        if pairing.phase is not PairingPhase.ACTIVE:
            return
        pairing.phase = PairingPhase.DONE
        self._active -= 1
        self._release_keys(pairing)

    def expire(self, now: float) -> list[Pairing]:
        """Drop pending pairings whose timeout passed; return them (now DONE).

        The caller answers a side that attached (``PAIR_TIMEOUT``).
        """
        expired = []
        while self._pending:
            pairing = next(iter(self._pending.values()))
            if pairing.expires_at > now:
                break
            del self._pending[pairing.number]
            self._forget_tokens(pairing)
            pairing.phase = PairingPhase.DONE
            self._release_keys(pairing)
            expired.append(pairing)
        if expired:
            self.refusals[RefusalCode.PAIR_TIMEOUT] += len(expired)
        return expired

    def next_deadline(self) -> float | None:
        """When :meth:`expire` next has work, or None with nothing pending."""
        for pairing in self._pending.values():
            return pairing.expires_at
        return None

    def _forget_tokens(self, pairing: Pairing) -> None:
        for token in pairing.tokens.values():
            self._tokens.pop(token, None)

    def _release_keys(self, pairing: Pairing) -> None:
        for key in (pairing.initiator, pairing.target):
            self._pairs_by_key[key] -= 1
            if self._pairs_by_key[key] <= 0:
                del self._pairs_by_key[key]
        route = (pairing.initiator, pairing.target)
        self._pairs_by_route[route] -= 1
        if self._pairs_by_route[route] <= 0:
            del self._pairs_by_route[route]

    # -- counters --------------------------------------------------------------

    def _refuse(self, code: RefusalCode, message: str) -> RelayRefused:
        self.refusals[code] += 1
        return RelayRefused(message, code=code)

    def count_refusal(self, code: RefusalCode) -> None:
        """Count a refusal the driver made (bad attach, connection limit)."""
        self.refusals[code] += 1

    def pairs_of(self, key: bytes) -> int:
        """Pairings (pending or active) ``key`` takes part in."""
        return self._pairs_by_key[key]

    def pairs_between(self, initiator: bytes, target: bytes) -> int:
        """Pairings (pending or active) ``initiator`` holds with ``target``."""
        return self._pairs_by_route[initiator, target]

    @property
    def active_pairs(self) -> int:
        return self._active

    def statistics(self, *, connections: int = 0) -> RelayStatistics:
        return RelayStatistics(
            reservations=len(self._reservations),
            pending_pairs=len(self._pending),
            active_pairs=self._active,
            pairs_made=self.pairs_made,
            bytes_relayed=self.bytes_relayed,
            refusals=dict(self.refusals),
            connections=connections,
        )
