"""Per-peer bookkeeping of a swarm, without I/O: backoff, skipping, bounds.

:class:`PeerTable` remembers, for each remote key the swarm has heard of, the
newest record it saw, the topics that led to it and how its connection
attempts went. It decides when a peer may be dialled again:

* after a failure, wait ``base * 2**(failures - 1)`` seconds (capped), times a
  random factor in [0.5, 1.5) so that many swarms do not retry in step;
* after ``skip_after_failures`` failures in a row, skip the peer for
  ``skip_for_s`` (it is tried again afterwards, from a fresh count);
* a connection that lasted ``proven_after_s`` resets the count.

The table is bounded: beyond ``max_peers`` entries the least recently touched
peer that is neither connected nor being dialled is forgotten (upstream
long-running nodes leaked through unbounded per-attempt state).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from dataclasses import dataclass, field

from ..dht import PeerRecord

__all__ = ["BackoffPolicy", "PeerState", "PeerTable"]


@dataclass(frozen=True)
class BackoffPolicy:
    base_s: float = 1.0
    """First wait after a failure."""

    max_s: float = 60.0
    """Longest wait between two attempts while the peer is not skipped."""

    skip_after_failures: int = 5
    """Failures in a row before the peer is skipped for a while."""

    skip_for_s: float = 600.0
    """How long a failing peer is skipped (then tried again)."""

    proven_after_s: float = 15.0
    """A connection that lived this long resets the failure count."""


@dataclass
class PeerState:
    public_key: bytes
    record: PeerRecord | None = None
    topics: set[bytes] = field(default_factory=set)
    failures: int = 0
    next_attempt_at: float = 0.0
    connected_since: float | None = None
    dialling: bool = False
    last_error: str | None = None


class PeerTable:
    """The swarm's peers; ``now`` is any monotonic clock in seconds."""

    def __init__(
        self,
        *,
        policy: BackoffPolicy | None = None,
        max_peers: int = 4096,
        rng: random.Random | None = None,
    ) -> None:
        self.policy = policy or BackoffPolicy()
        self.max_peers = max_peers
        self._rng = rng or random.Random()
        self._peers: OrderedDict[bytes, PeerState] = OrderedDict()
        self.forgotten = 0

    def __len__(self) -> int:
        return len(self._peers)

    def __contains__(self, public_key: bytes) -> bool:
        return public_key in self._peers

    def get(self, public_key: bytes) -> PeerState | None:
        return self._peers.get(public_key)

    def touch(self, public_key: bytes) -> PeerState:
        """The peer's state, created if new; marks it recently used."""
        state = self._peers.get(public_key)
        if state is None:
            state = self._peers[public_key] = PeerState(public_key)
            self._evict()
        else:
            self._peers.move_to_end(public_key)
        return state

    def found(self, record: PeerRecord, topic: bytes | None) -> PeerState:
        """A record came from a lookup; keep the newest one per key."""
        state = self.touch(record.public_key)
        if state.record is None or record.seq >= state.record.seq:
            state.record = record
        if topic is not None:
            state.topics.add(topic)
        return state

    def may_dial(self, public_key: bytes, now: float) -> bool:
        state = self._peers.get(public_key)
        if state is None:
            return True
        return not state.dialling and state.connected_since is None and now >= state.next_attempt_at

    def dialling(self, public_key: bytes) -> None:
        self.touch(public_key).dialling = True

    def failed(self, public_key: bytes, now: float, reason: str) -> float:
        """Count a failed attempt; return the seconds until the next may start."""
        state = self.touch(public_key)
        state.dialling = False
        state.failures += 1
        state.last_error = reason
        policy = self.policy
        if state.failures >= policy.skip_after_failures:
            wait = policy.skip_for_s
            state.failures = 0  # after the pause, start again from short waits
        else:
            wait = min(policy.max_s, policy.base_s * 2 ** (state.failures - 1))
            wait *= 0.5 + self._rng.random()
        state.next_attempt_at = now + wait
        return wait

    def connected(self, public_key: bytes, now: float) -> None:
        state = self.touch(public_key)
        state.dialling = False
        state.connected_since = now
        state.last_error = None

    def disconnected(self, public_key: bytes, now: float) -> float:
        """The connection ended; return the seconds until a reconnect may start."""
        state = self.touch(public_key)
        since, state.connected_since = state.connected_since, None
        if since is not None and now - since >= self.policy.proven_after_s:
            state.failures = 0
            state.next_attempt_at = now
            return 0.0
        return self.failed(public_key, now, "disconnected soon after connecting")

    def forget_topic(self, topic: bytes) -> None:
        for state in self._peers.values():
            state.topics.discard(topic)

    def _evict(self) -> None:
        if len(self._peers) <= self.max_peers:
            return
        for key, state in self._peers.items():
            if not state.dialling and state.connected_since is None:
                del self._peers[key]
                self.forgotten += 1
                return
