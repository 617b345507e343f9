"""Admission: who gets a handshake slot and who gets a connection slot (sans-IO).

Theory of operation
-------------------
A daemon's slots are few (a swarm's default: 64 handshakes, 64 connections)
and a stranger's sockets and keys are cheap. Two tables, both pure (they take
``now`` and return decisions; :class:`~._host.PeerHost` acts on them):

* :class:`HandshakeSlots` — sockets still handshaking, grouped by source
  (:func:`address_group`: an IPv4 address, an IPv6 /64, *all* of loopback as
  one, since anyone on the host can bind 127.0.0.2, 127.0.0.3…). A newcomer is
  never turned away because another address is greedy: when its group holds
  ``max_per_group``, or every slot is taken, the **least advanced** handshake
  of its group (or of the group holding the most) is evicted instead. A
  handshake has *progressed* when its peer's first Noise message arrived
  whole and parsed (a stray byte is no progress: it costs nothing). The
  order: one that has not progressed for ``min_age_s`` (silent, or a byte);
  one that progressed past its ``grace_s``; one within its grace but
  ``min_age_s`` old (a real handshake on loopback or a LAN completes in
  milliseconds); last, one younger than ``min_age_s`` that has not
  progressed (perhaps a peer whose message 1 is not read yet). Within each,
  a silent one before one that sent bytes (so a connect flood does not evict
  a peer whose message 1 is waiting to be read), then the oldest first. A
  progressed handshake younger than ``min_age_s`` is never evicted; only
  when every candidate is one is the newcomer refused (``busy``). The
  attacker may send a valid-looking message 1 too (a random key behind the
  right header parses): at ``r`` sockets/s each of his then lives about
  ``max_per_group / r`` seconds (at least ``min_age_s``), and a real peer's
  handshake, one round trip after its message 1, fits in that.
* :class:`ConnectionSlots` — live connections. Keys a daemon is configured to
  serve (``reserved``: its racks, clients, pushers, workers… and the peers it
  dialled itself) may use every slot; **strangers** share
  ``max_total - reserve`` of them, at most ``max_per_group`` from one source
  group and ``max_per_key`` per key. When every slot is taken, a reserved
  newcomer evicts a stranger (the newest one of the group holding the most);
  a stranger finding the strangers' slots (or its address's) taken evicts the
  oldest stranger that has held one for ``evict_after_s``, so a client that
  holds on cannot keep a newcomer (a new job's agent, say, before its hello
  makes it a reserved peer: :meth:`ConnectionSlots.promote`) out for long.
  That wait is for **busy** strangers (ones that asked for something: opened
  a channel). An **idle** stranger goes first and at any age: a client that
  only holds slots, however fast it dials again, cannot keep a newcomer out
  (an age rule alone is a race the fastest re-dialler wins: every slot that
  comes of age is taken by its next dial before an agent's one dial), and it
  never evicts a new agent whose hello, sent at once, waits for its answer on
  a loaded machine. A client whose connections ask too is back to the
  oldest-first rule (SECURITY.md says what that leaves).
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count

__all__ = [
    "ConnectionDecision",
    "ConnectionSlots",
    "HandshakeDecision",
    "HandshakeSlots",
    "LogLimiter",
    "address_group",
]

#: Every loopback address is one source: a local user may bind any of 127/8.
LOOPBACK_GROUP = "loopback"
#: Streams with no address (in-memory pairs in tests, relayed attaches).
NO_ADDRESS_GROUP = "unknown"
#: The prefix of an IPv6 address that counts as one source (one subscriber's /64).
IPV6_GROUP_PREFIX = 64


def address_group(host: str | None) -> str:
    """The source an address counts against: an IPv4 address, an IPv6 /64,
    ``loopback`` for any loopback address (v4, v6 or v4-mapped), the text
    itself for a name that is not an IP address."""
    if host is None:
        return NO_ADDRESS_GROUP
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return LOOPBACK_GROUP
    if isinstance(ip, ipaddress.IPv4Address):
        return str(ip)
    return str(ipaddress.IPv6Network((ip, IPV6_GROUP_PREFIX), strict=False))


# -- handshakes ----------------------------------------------------------------


@dataclass
class _Handshake:
    group: str
    started: float
    heard: bool = False
    progressed: bool = False


@dataclass(frozen=True)
class HandshakeDecision:
    """What to do with a newcomer: ``ticket`` is its slot (None: refused,
    ``reason`` says why); ``evict`` is a handshake to end to make room."""

    ticket: int | None
    evict: int | None = None
    reason: str = ""


@dataclass
class HandshakeSlots:
    """Handshakes in flight, by source group; see the module's docstring."""

    max_total: int
    max_per_group: int
    grace_s: float = 1.0
    min_age_s: float = 0.25
    _entries: dict[int, _Handshake] = field(default_factory=dict)
    _per_group: Counter[str] = field(default_factory=Counter)
    _tickets: count = field(default_factory=count)

    def __len__(self) -> int:
        return len(self._entries)

    def count(self, group: str) -> int:
        return self._per_group[group]

    def arrive(self, group: str, now: float) -> HandshakeDecision:
        """A socket from ``group`` wants to handshake: admit it, evicting one
        if need be, or refuse it (``busy``)."""
        evict = None
        if self._per_group[group] >= self.max_per_group:
            evict = self._victim(now, only=group)
            if evict is None:
                return HandshakeDecision(None, reason="busy")
        elif len(self._entries) >= self.max_total:
            evict = self._victim(now, only=None)
            if evict is None:
                return HandshakeDecision(None, reason="busy")
        if evict is not None:
            self.leave(evict)
        ticket = next(self._tickets)
        self._entries[ticket] = _Handshake(group, now)
        self._per_group[group] += 1
        return HandshakeDecision(ticket, evict=evict)

    def hear(self, ticket: int) -> None:
        """The socket sent bytes (maybe not a whole message yet): among the
        handshakes that have not progressed, it goes after the silent ones."""
        entry = self._entries.get(ticket)
        if entry is not None:
            entry.heard = True

    def progress(self, ticket: int) -> bool:
        """The peer's first handshake message arrived whole and parsed (not
        merely a byte: that is free to send); True the first time."""
        entry = self._entries.get(ticket)
        if entry is None or entry.progressed:
            return False
        entry.progressed = True
        return True

    def leave(self, ticket: int) -> None:
        """The handshake ended (done, failed or evicted); idempotent."""
        entry = self._entries.pop(ticket, None)
        if entry is None:
            return
        self._per_group[entry.group] -= 1
        if not self._per_group[entry.group]:
            del self._per_group[entry.group]

    def _victim(self, now: float, *, only: str | None) -> int | None:
        """The least advanced evictable handshake: of ``only``'s group, or
        else of the group holding the most; within it, by :meth:`_tier`, a
        silent one before one that sent bytes, the oldest first. None if none
        may be evicted."""
        best: tuple[int, int, bool, float] | None = None
        victim = None
        for ticket, entry in self._entries.items():
            if only is not None and entry.group != only:
                continue
            tier = self._tier(entry, now)
            if tier is None:
                continue
            rank = (-self._per_group[entry.group], tier, entry.heard, entry.started)
            if best is None or rank < best:
                best, victim = rank, ticket
        return victim

    def _tier(self, entry: _Handshake, now: float) -> int | None:
        """How readily a handshake goes (lowest first; None: not at all)."""
        age = now - entry.started
        if not entry.progressed:
            # Silent or a stray byte for min_age_s: no real peer is that slow
            # to send 100 bytes. A younger one may be a peer whose message 1
            # is in flight (or not yet read): it goes last.
            return 0 if age >= self.min_age_s else 3
        if age >= self.grace_s:
            return 1  # a real peer finishes within a round trip or two
        if age >= self.min_age_s:
            return 2  # a message that parses is cheap too: the grace yields
        return None


# -- connections ---------------------------------------------------------------


def _always(handle: object) -> bool:
    return True


@dataclass
class _Held:
    key: bytes
    group: str
    reserved: bool
    since: float


@dataclass(frozen=True)
class ConnectionDecision:
    """``ok``: take the slot; else ``reason`` (``full``, ``address_full``,
    ``key_full``). ``evict``: a stranger's connection to end first."""

    ok: bool
    reason: str = ""
    evict: object | None = None


@dataclass
class ConnectionSlots:
    """Live connections, split into reserved peers and strangers; see the
    module's docstring. Handles are whatever the owner tracks (connections)."""

    max_total: int
    reserve: int = 0
    max_per_group: int | None = None
    max_per_key: int | None = None
    evict_after_s: float = 10.0
    _held: dict[object, _Held] = field(default_factory=dict)
    _strangers: int = 0
    _stranger_groups: Counter[str] = field(default_factory=Counter)
    _keys: Counter[bytes] = field(default_factory=Counter)

    def __len__(self) -> int:
        return len(self._held)

    @property
    def strangers(self) -> int:
        return self._strangers

    def decide(self, key: bytes, group: str, *, reserved: bool, now: float,
               busy: Callable[[object], bool] = _always) -> ConnectionDecision:
        """May ``key`` from ``group`` take a slot now? A reserved peer evicts
        the newest stranger of the group holding the most if every slot is
        taken; a stranger evicts the oldest stranger connected for at least
        ``evict_after_s`` (of its own group if that is the limit it hit), so
        one client holding on cannot keep a newcomer out for long. Either
        way an idle stranger (``busy`` says no: it asked for nothing) goes
        first, a stranger's newcomer evicting one at any age. Without
        ``busy`` every stranger counts as busy."""
        if reserved:
            if len(self._held) < self.max_total:
                return ConnectionDecision(True)
            victim = self._stranger_victim(newest=True, group=None, now=now, busy=busy)
            if victim is None:
                return ConnectionDecision(False, "full")
            return ConnectionDecision(True, evict=victim)
        if self.max_per_key is not None and self._keys[key] >= self.max_per_key:
            return ConnectionDecision(False, "key_full")
        if (len(self._held) >= self.max_total
                or self._strangers >= self.max_total - self.reserve):
            reason, only = "full", None
        elif (self.max_per_group is not None and group != NO_ADDRESS_GROUP
                and self._stranger_groups[group] >= self.max_per_group):
            reason, only = "address_full", group
        else:
            return ConnectionDecision(True)
        victim = self._stranger_victim(newest=False, group=only, now=now, busy=busy)
        if victim is None:
            return ConnectionDecision(False, reason)
        return ConnectionDecision(True, evict=victim)

    def strangers_held(self) -> list[tuple[object, bytes]]:
        """``(handle, key)`` of every stranger's connection."""
        return [(handle, held.key) for handle, held in self._held.items() if not held.reserved]

    def promote(self, handle: object) -> None:
        """A stranger proved to be a reserved peer (e.g. an agent's hello
        bound its key): it no longer counts against the strangers' limits."""
        held = self._held.get(handle)
        if held is None or held.reserved:
            return
        self._strangers -= 1
        self._stranger_groups[held.group] -= 1
        if not self._stranger_groups[held.group]:
            del self._stranger_groups[held.group]
        held.reserved = True

    def take(self, handle: object, key: bytes, group: str, *, reserved: bool,
             now: float) -> None:
        """Record ``handle`` in a slot (after a decision said ok, or to replace
        a duplicate of the same key)."""
        self.release(handle)
        self._held[handle] = _Held(key, group, reserved, now)
        self._keys[key] += 1
        if not reserved:
            self._strangers += 1
            self._stranger_groups[group] += 1

    def release(self, handle: object) -> None:
        """Free ``handle``'s slot; idempotent."""
        held = self._held.pop(handle, None)
        if held is None:
            return
        self._keys[held.key] -= 1
        if not self._keys[held.key]:
            del self._keys[held.key]
        if not held.reserved:
            self._strangers -= 1
            self._stranger_groups[held.group] -= 1
            if not self._stranger_groups[held.group]:
                del self._stranger_groups[held.group]

    def is_reserved(self, handle: object) -> bool | None:
        held = self._held.get(handle)
        return None if held is None else held.reserved

    def _stranger_victim(self, *, newest: bool, group: str | None, now: float,
                         busy: Callable[[object], bool]) -> object | None:
        """A stranger to evict: of ``group``, or of the group holding the most
        strangers; an idle one before a busy one; then the newest one (for a
        reserved peer), or the oldest one (for another stranger: an idle one
        at any age, a busy one connected for at least ``evict_after_s``)."""
        best: tuple[bool, int, float] | None = None
        victim = None
        for handle, held in self._held.items():
            if held.reserved or (group is not None and held.group != group):
                continue
            idle = not busy(handle)
            if newest:
                rank = (idle, self._stranger_groups[held.group], held.since)
            elif idle or now - held.since >= self.evict_after_s:
                rank = (idle, self._stranger_groups[held.group], -held.since)
            else:
                continue
            if best is None or rank > best:
                best, victim = rank, handle
        return victim


# -- logging -------------------------------------------------------------------


@dataclass
class LogLimiter:
    """At most one log line per reason per ``interval_s``: a flood costs a
    counter, not a disk. :meth:`admit` says whether to log now and how many
    lines of that reason were held back since the last one."""

    interval_s: float = 10.0
    _last: dict[str, float] = field(default_factory=dict)
    _held: Counter[str] = field(default_factory=Counter)

    def admit(self, reason: str, now: float) -> int | None:
        """None: do not log; else the number of lines suppressed before this one."""
        last = self._last.get(reason)
        if last is not None and now - last < self.interval_s:
            self._held[reason] += 1
            return None
        self._last[reason] = now
        return self._held.pop(reason, 0)
